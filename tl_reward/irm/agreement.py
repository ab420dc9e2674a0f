"""How far an implicit reward agrees with an explicit one: on pairs, and (the one
:func:`~tl_reward.stats.agreement.rank_agreement`) on a corpus or on tokens."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tl_reward.results import ShortRepr
from tl_reward.stats.agreement import RankAgreement, rank_agreement
from tl_reward.stats.estimate import Estimate
from tl_reward.stats.paired import share_interval
from tl_reward.stats.ranks import paired_arrays

__all__ = ["PairAgreement", "RankAgreement", "pair_agreement", "rank_agreement"]


@dataclass(repr=False)
class PairAgreement(ShortRepr):
    """Share of preference pairs on which the implicit reward prefers the explicit reward's
    choice (ties count one half), with its Clopper-Pearson CI over pairs.

    Attributes:
        agreement: the share as an :class:`Estimate`; margins: ``[n]`` implicit margins.
    """

    agreement: Estimate
    margins: np.ndarray = field(repr=False)

    @property
    def share(self) -> float:
        """The share of pairs (``agreement.value``)."""
        return self.agreement.value

    def __str__(self) -> str:
        return str(self.agreement)

    def to_dataframe(self) -> pd.DataFrame:
        """One row per pair: the implicit margin (chosen minus rejected) and agreement."""
        return pd.DataFrame({"implicit_margin": self.margins,
                             "agrees": np.sign(self.margins) > 0})

    def plot(self) -> Any:
        """Histogram of the implicit margins (plotly)."""
        import plotly.express as px

        return px.histogram(x=self.margins, nbins=30, title=f"Implicit margin on pairs the "
                            f"explicit reward orders; agreement {self}",
                            labels={"x": "r_imp(chosen) - r_imp(rejected)"})


def pair_agreement(chosen: np.ndarray, rejected: np.ndarray, confidence: float = 0.95
                   ) -> PairAgreement:
    """Agreement of implicit rewards with pairs ordered by an explicit reward (chosen first):
    the share of pairs ordered the same way (ties count half) with its exact binomial interval
    (:func:`~tl_reward.stats.paired.share_interval`)."""
    c, r = paired_arrays(chosen, rejected, 2, "reward")
    m = c - r
    score = np.where(m > 0, 1.0, np.where(m < 0, 0.0, 0.5))
    lo, hi = share_interval(int((m > 0).sum()), int((m == 0).sum()), int(m.size), confidence)
    return PairAgreement(Estimate(float(score.mean()), lo, hi, n=int(m.size),
                                  method="exact binomial (Clopper-Pearson), ties half",
                                  confidence=confidence), m)
