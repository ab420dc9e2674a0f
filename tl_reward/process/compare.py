"""Do two step graders agree? Two PRMs, or a PRM against a judge or an outcome RM.

Each model reads every step of the same solutions: a process reward model at each step's tag
(:meth:`~tl_reward.model.protocol.RewardModelMixin.rewards`), any other model (a judge, an
outcome RM) on the solution cut after that step, ``(question, steps[0..k] joined by blank
lines)``. Agreement is the rank agreement of the two step rewards
(:func:`~tl_reward.stats.agreement.rank_agreement`, solutions as the units: steps of one
solution are not independent), the share of steps both call right or both call wrong (a
linear reward above 0), and the share of solutions whose first step called wrong is the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from tl_reward.data.solutions import STEP_BREAK, split_steps
from tl_reward.errors import TLRewardError
from tl_reward.model.steps import StepRow
from tl_reward.results import ShortRepr
from tl_reward.stats.agreement import RankAgreement, rank_agreement
from tl_reward.stats.estimate import Estimate
from tl_reward.stats.paired import share_interval


@dataclass(repr=False)
class StepComparison(ShortRepr):
    """Two models' rewards at every step of the same solutions.

    Attributes:
        rows: the (solution, step) of each row.
        a, b: ``[N]`` each model's linear step reward (its ``objective``).
        names: the two models' labels.
        ranks: rank agreement of ``a`` and ``b`` (solutions as units).
        verdicts: the share of steps both call right (> 0) or both wrong, with its exact
            binomial interval.
        first_error: the share of solutions whose first step called wrong (or none) is the
            same for both.
    """

    rows: list[StepRow]
    a: np.ndarray
    b: np.ndarray
    names: tuple[str, str]
    ranks: RankAgreement
    verdicts: Estimate
    first_error: Estimate

    def headline(self) -> dict[str, Any]:
        return {"spearman_rho": self.ranks.spearman_rho.value,
                "verdicts_agree": self.verdicts.value, "first_error_agrees": self.first_error.value}

    def to_dataframe(self) -> pd.DataFrame:
        """One row per (solution, step): both rewards and both verdicts."""
        a, b = self.names
        return pd.DataFrame({"solution": [r.item for r in self.rows],
                             "step": [r.step for r in self.rows], a: self.a, b: self.b,
                             f"{a}_right": self.a > 0, f"{b}_right": self.b > 0})

    def plot(self) -> Any:
        """Scatter of the two step rewards, coloured by step."""
        import plotly.express as px

        df = self.to_dataframe()
        a, b = self.names
        return px.scatter(df, x=a, y=b, color="step", hover_data=["solution"],
                          title=f"Step rewards: {a} against {b} (Spearman rho "
                                f"{self.ranks.spearman_rho.value:+.2f})")


def _step_values(model: Any, solutions: list[Any], objective: str
                 ) -> tuple[list[StepRow], np.ndarray]:
    """Every step's reward of every solution, as ``model`` reads steps (module doc)."""
    if model.step_format is not None:
        res = model.rewards(solutions, step="all")
        return res.rows, res.values(objective).double().numpy()
    rows, items = [], []
    for i, (q, reply) in enumerate(solutions):
        steps = reply if isinstance(reply, list) else split_steps(reply)
        for k in range(len(steps)):
            rows.append(StepRow(i, k))
            items.append((q, STEP_BREAK.join(steps[: k + 1])))
    return rows, model.rewards(items).values(objective).double().numpy()


def _first_wrong(rows: list[StepRow], v: np.ndarray) -> dict[int, int]:
    out: dict[int, int] = {}
    for r, x in zip(rows, v, strict=True):
        out.setdefault(r.item, -1)
        if x <= 0 and out[r.item] == -1:
            out[r.item] = r.step
    return out


def compare_steps(model_a: Any, model_b: Any, solutions: Any, names: tuple[str, str] = ("a", "b"),
                  objective: str = "score", confidence: float = 0.95) -> StepComparison:
    """Compare two models' rewards at every step of ``solutions`` (``(question, [steps])`` or
    ``(question, reply)`` pairs; see the module doc)."""
    sols = [solutions] if isinstance(solutions, tuple) else list(solutions)
    if not all(isinstance(s, tuple) and len(s) == 2 for s in sols):
        raise TLRewardError("compare_steps takes (question, [steps]) or (question, reply) "
                            "solutions")
    rows_a, a = _step_values(model_a, sols, objective)
    rows_b, b = _step_values(model_b, sols, objective)
    if rows_a != rows_b:
        raise TLRewardError("the two models cut the solutions into different steps; pass "
                            "(question, [steps]) solutions so both read the same steps")
    units = [r.item for r in rows_a]
    ranks = rank_agreement(a, b, names, confidence, units=units, unit="solution")
    same = int(((a > 0) == (b > 0)).sum())
    lo, hi = share_interval(same, 0, len(a), confidence)
    verdicts = Estimate(same / len(a), lo, hi, n=len(a),
                        method="exact binomial (Clopper-Pearson) interval over steps",
                        confidence=confidence)
    fa, fb = _first_wrong(rows_a, a), _first_wrong(rows_b, b)
    agree = sum(fa[i] == fb[i] for i in fa)
    lo, hi = share_interval(agree, 0, len(fa), confidence)
    first = Estimate(agree / len(fa), lo, hi, n=len(fa),
                     method="exact binomial (Clopper-Pearson) interval over solutions",
                     confidence=confidence)
    return StepComparison(rows_a, a, b, names, ranks, verdicts, first)
