"""The one result vocabulary: every number an analysis reports is an :class:`Estimate`."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Estimate:
    """A reported number with its uncertainty.

    Attributes:
        value: the point estimate.
        ci_low, ci_high: the ``confidence`` interval (NaN when none was computed).
        p_value: the test's p-value (NaN when there is no test).
        n: the number of resampling units (items, pairs, words) it rests on.
        method: how the interval and p-value were computed, e.g. ``"percentile bootstrap over
            pairs; exact sign-flip"``.
        confidence: the interval's level.
    """

    value: float
    ci_low: float = math.nan
    ci_high: float = math.nan
    p_value: float = math.nan
    n: int = 0
    method: str = ""
    confidence: float = 0.95

    @property
    def mean(self) -> float:
        """``value`` (the name :func:`~tl_reward.stats.resampling.summarise_mean` used)."""
        return self.value

    def __str__(self) -> str:
        ci = "" if math.isnan(self.ci_low) else f" [{self.ci_low:+.3f}, {self.ci_high:+.3f}]"
        p = "" if math.isnan(self.p_value) else f"p = {self.p_value:.3g}, "
        return f"{self.value:+.3f}{ci} ({p}n = {self.n})"

    def to_dict(self, prefix: str = "") -> dict[str, Any]:
        """The fields as a flat dict (``prefix`` before each key), for a dataframe row."""
        return {f"{prefix}{k}": v for k, v in asdict(self).items()}
