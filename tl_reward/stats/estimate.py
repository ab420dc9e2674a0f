"""The one result vocabulary: every number an analysis reports is an :class:`Estimate`."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from tl_reward.results import result_type


@result_type
@dataclass(frozen=True)
class Estimate:
    """A reported number: ``value``, its ``confidence`` interval and test ``p_value`` (NaN when
    none), ``n`` resampling units (items, pairs, words) and the ``method`` of both."""

    value: float
    ci_low: float = math.nan
    ci_high: float = math.nan
    p_value: float = math.nan
    n: int = 0
    method: str = ""
    confidence: float = 0.95

    def __str__(self) -> str:
        ci = "" if math.isnan(self.ci_low) else f" [{self.ci_low:+.3f}, {self.ci_high:+.3f}]"
        p = "" if math.isnan(self.p_value) else f"p = {self.p_value:.3g}, "
        return f"{self.value:+.3f}{ci} ({p}n = {self.n})"

    def to_dict(self, prefix: str = "") -> dict[str, Any]:
        """The fields as a flat dict (``prefix`` before each key), for a dataframe row."""
        return {f"{prefix}{k}": v for k, v in asdict(self).items()}
