"""Where a policy's reward gain comes from: the change of the mean reward, split exactly over
the reward model's components.

Each completion's reward is a sum of direct contributions at the pooled token (embeddings,
attention heads, attention biases, MLPs, the head's bias;
:func:`~tl_reward.analysis.attribution.direct_reward_attribution`), so the mean reward of a
step is the sum of the components' means, and the change of the mean reward between two steps
is the sum of the components' changes, exactly. A component whose share of the gain is large is
one the policy learned to drive: a planted trigger head, a length or formatting feature.

Units: the completions of one prompt share it (GRPO samples several per prompt), so they are
not independent evidence; by default each prompt is a unit (its completions averaged), and a
step's mean is the mean over its prompts (the mean over completions when every prompt has as
many, as in GRPO). Each change gets Welch's interval (``scipy.stats.ttest_ind``, unequal
variances) over the two steps' units: the two steps are independent samples, so no paired
interval applies, and the package reports no percentile-bootstrap interval
(docs/statistics.md). Its simulated coverage is in docs/rl.md (below nominal when the two
steps' distributions differ in skew, e.g. a component that turns on).

Example:
    >>> gain = reward_gain(RunRecord.open("runs/grpo"))
    >>> gain.sentence()  # 'reward +2.10 since step 0, of which +1.70 through L2.H0 (at step 40)'
    >>> gain.plot()
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats
from tqdm.auto import tqdm

from tl_reward.errors import TLRewardError, check_choice
from tl_reward.results import ShortRepr
from tl_reward.rl.record import (
    COMPONENT_PREFIX,
    RunRecord,
    RunRecordError,
    decoded,
    reward_input,
)

__all__ = ["MIN_UNITS", "RewardGain", "direct_parts", "reward_gain"]

#: Fewest units per step for an interval (Welch's needs a variance on each side).
MIN_UNITS = 2


@dataclass(repr=False)
class RewardGain(ShortRepr):
    """The change of the mean reward from step ``since[i]`` to step ``steps[i]``, split over
    the reward model's components.

    Attributes:
        steps: the S later steps; since: each one's reference step.
        components: the C component names (``head_bias`` last).
        change: ``[S, C]`` each component's change of its mean contribution; rows sum to
            the DRA mean reward change.
        ci_low, ci_high: ``[S, C]`` Welch intervals of ``change`` (NaN where none: a
            constant component, fewer than ``MIN_UNITS`` units).
        mean: ``[S, C]`` each component's mean contribution at the later step.
        reward_change: ``[S]`` the change of the mean recorded reward; reward_ci_low,
            reward_ci_high: its interval.
        mean_reward: ``[S]`` the mean recorded reward at the later step.
        n_units: ``[S, 2]`` units (prompts, or completions) at the later and reference step.
        unit: ``"prompt"`` or ``"completion"``; confidence: the intervals' level.
        method: how the intervals were made.
    """

    steps: list[int]
    since: list[int]
    components: list[str]
    change: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    mean: np.ndarray
    reward_change: np.ndarray
    reward_ci_low: np.ndarray
    reward_ci_high: np.ndarray
    mean_reward: np.ndarray
    n_units: np.ndarray
    unit: str = "prompt"
    confidence: float = 0.95
    method: str = ""

    def _row(self, step: int | None) -> int:
        if not self.steps:
            raise TLRewardError("this gain compares no steps")
        if step is None:
            return len(self.steps) - 1
        if step not in self.steps:
            raise TLRewardError(f"step {step} is not among the compared steps {self.steps}")
        return self.steps.index(step)

    @property
    def residual(self) -> np.ndarray:
        """``[S]`` recorded reward change minus the sum of the parts (float rounding only)."""
        return self.reward_change - self.change.sum(1)

    def headline(self) -> dict[str, Any]:
        """The last step's reward change and its largest part."""
        if not self.steps:
            return {}
        return {"sentence": self.sentence(), "max |residual|": float(np.abs(self.residual).max())}

    def top(self, k: int = 5, step: int | None = None) -> pd.DataFrame:
        """The ``k`` components with the largest change (in the reward change's direction
        first) at ``step`` (default the last), with intervals and share of the change."""
        i = self._row(step)
        sign = 1.0 if self.reward_change[i] >= 0 else -1.0
        order = np.argsort(-sign * self.change[i], kind="stable")[:k]
        total = self.reward_change[i]
        return pd.DataFrame({
            "component": [self.components[j] for j in order],
            "change": self.change[i, order], "ci_low": self.ci_low[i, order],
            "ci_high": self.ci_high[i, order],
            "share": self.change[i, order] / total if total != 0 else np.nan})

    def sentence(self, step: int | None = None) -> str:
        """``"reward +2.10 since step 0, of which +1.70 through L2.H0 (at step 40)"`` for
        ``step`` (default the last): the change and its largest part in the same direction."""
        i = self._row(step)
        top = self.top(1, self.steps[i]).iloc[0]
        return (f"reward {self.reward_change[i]:+.2f} since step {self.since[i]}, of which "
                f"{top.change:+.2f} through {top.component} (at step {self.steps[i]})")

    def to_dataframe(self) -> pd.DataFrame:
        """Long table: step, since, component, change, ci_low, ci_high, mean, reward_change."""
        s, c = len(self.steps), len(self.components)
        return pd.DataFrame({
            "step": np.repeat(self.steps, c), "since": np.repeat(self.since, c),
            "component": self.components * s, "change": self.change.ravel(),
            "ci_low": self.ci_low.ravel(), "ci_high": self.ci_high.ravel(),
            "mean": self.mean.ravel(), "reward_change": np.repeat(self.reward_change, c)})

    def plot(self, k: int = 5) -> Any:
        """Stacked areas of the ``k`` components with the largest change over the steps (the
        rest summed as ``other``), and the reward change as a line."""
        import plotly.graph_objects as go

        keep = np.argsort(-np.abs(self.change).max(0), kind="stable")[:k]
        rest = np.setdiff1d(np.arange(len(self.components)), keep)
        fig = go.Figure()
        series = [(self.components[j], self.change[:, j]) for j in keep]
        if len(rest):
            series.append(("other", self.change[:, rest].sum(1)))
        for name, y in series:
            fig.add_trace(go.Scatter(x=self.steps, y=y, name=name, mode="lines",
                                     stackgroup="parts"))
        fig.add_trace(go.Scatter(x=self.steps, y=self.reward_change, name="reward change",
                                 mode="lines+markers", line={"color": "black", "dash": "dot"}))
        fig.update_layout(title="Where the reward gain comes from", xaxis_title="step",
                          yaxis_title="change of mean reward since the reference step")
        return fig


def direct_parts(model: Any, items: Sequence[Any], objective: int | str = "score",
                 level: str = "head", batch_size: int = 8) -> tuple[np.ndarray, list[str]]:
    """``([N, C + 1], names)``: each item's direct contribution of every component at
    ``level`` and of the head's bias (``head_bias``, last) to reward ``objective``; a row sums
    to the item's reward."""
    from tl_reward.analysis.attribution import direct_reward_attribution

    dra = direct_reward_attribution(model, list(items), objectives=objective,
                                    batch_size=batch_size, progress=False)
    vals, names = dra.components(level)
    return (np.concatenate([vals[..., 0].double().numpy(), dra.bias[:, :1].double().numpy()],
                           axis=1), [*names, "head_bias"])


def _units(df: pd.DataFrame, values: np.ndarray, unit: str) -> np.ndarray:
    """``values`` ([N, K], rows of ``df``) averaged per unit: per prompt, or as they are."""
    if unit == "completion":
        return values
    codes = pd.factorize(df["prompt"].astype(str))[0]
    sums = np.zeros((codes.max() + 1, values.shape[1]))
    np.add.at(sums, codes, values)
    return sums / np.bincount(codes)[:, None]


def _welch(a: np.ndarray, b: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Welch intervals of ``mean(a) - mean(b)`` per column (NaN below ``MIN_UNITS``)."""
    if min(len(a), len(b)) < MIN_UNITS:
        nan = np.full(a.shape[1], np.nan)
        return nan, nan.copy()
    with np.errstate(invalid="ignore", divide="ignore"):
        ci = stats.ttest_ind(a, b, axis=0, equal_var=False).confidence_interval(confidence)
    return np.asarray(ci.low, dtype=np.float64), np.asarray(ci.high, dtype=np.float64)


def _bars(y: np.ndarray, lo: np.ndarray, hi: np.ndarray, colour: str) -> dict[str, Any]:
    """Plotly error bars from ``[lo, hi]`` around ``y`` (none where NaN)."""
    return {"type": "data", "symmetric": False, "array": hi - y, "arrayminus": y - lo,
            "color": colour, "thickness": 1, "width": 0}


def reward_gain(record: RunRecord, since: int | str = 0, steps: Sequence[int] | None = None,
                model: Any = None, unit: str = "prompt", objective: int | str = "score",
                level: str = "head",
                confidence: float = 0.95, batch_size: int = 8, progress: bool | None = None
                ) -> RewardGain:
    """The change of the mean reward from a reference step to each later one, split over the
    components (see the module doc).

    Args:
        record: the run (its steps' rewards, and their decompositions when recorded).
        since: the reference step (default 0), or ``"previous"`` (each step against the one
            before it).
        steps: the later steps (default every recorded step after the reference).
        model: the reward model, to decompose steps recorded without ``decompose=True``
            (checked against the record's fingerprint); unused when they hold one.
        unit: ``"prompt"`` (a prompt's completions averaged: one unit) or ``"completion"``.
        objective: the reward ``model`` decomposes (as the record's reward function read it).
        level: the components' level when ``model`` decomposes (``"head"``, ``"sublayer"``).
        confidence: the intervals' level.
    """
    check_choice(unit, ("prompt", "completion"), "unit")
    have = record.steps()
    if not have:
        raise RunRecordError(f"the run record in {record.folder} holds no step yet")
    if since == "previous":
        later = list(steps) if steps is not None else have[1:]
        pairs = [(s, have[have.index(s) - 1]) for s in later if s in have and s != have[0]]
        if len(pairs) != len(later):
            raise RunRecordError(f"since='previous' needs each step recorded after another; "
                                 f"got {later}, recorded {have}")
    elif isinstance(since, int) and not isinstance(since, bool):
        if since not in have:
            raise RunRecordError(f"the reference step {since} is not recorded in "
                                 f"{record.folder} (steps: {have[0]} to {have[-1]})")
        later = list(steps) if steps is not None else [s for s in have if s > since]
        pairs = [(s, since) for s in later]
    else:
        raise TLRewardError(f"since must be a step or 'previous', got {since!r}")
    if model is not None:
        record.check_model(model)
    cache: dict[int, tuple[np.ndarray, np.ndarray, list[str]]] = {}
    needed = sorted({s for p in pairs for s in p})
    for s in tqdm(needed, disable=not (progress if progress is not None else len(needed) > 8),
                  desc="reward gain", unit="step"):
        cache[s] = _step_parts(record, s, model, unit, objective, level, batch_size)
    names = cache[needed[0]][2] if needed else []
    for s in needed:
        if cache[s][2] != names:
            raise RunRecordError(f"step {s} is decomposed into other components than step "
                                 f"{needed[0]}; record every step at one level")
    rows = []
    for later_step, ref in pairs:
        (r1, p1, _), (r0, p0, _) = cache[later_step], cache[ref]
        lo, hi = _welch(p1, p0, confidence)
        rlo, rhi = _welch(r1, r0, confidence)
        rows.append((p1.mean(0) - p0.mean(0), lo, hi, p1.mean(0), float(r1.mean() - r0.mean()),
                     float(rlo[0]), float(rhi[0]), float(r1.mean()), (len(r1), len(r0))))
    c = len(names)

    def stack(j: int) -> np.ndarray:
        return np.stack([r[j] for r in rows]) if rows else np.zeros((0, c))

    def vec(j: int) -> np.ndarray:
        return np.array([r[j] for r in rows], dtype=np.float64)

    method = (f"mean over {unit}s; Welch interval (scipy.stats.ttest_ind, unequal variances) "
              f"over each step's {unit}s, none below {MIN_UNITS} per step")
    return RewardGain([p[0] for p in pairs], [p[1] for p in pairs], list(names), stack(0),
                      stack(1), stack(2), stack(3), vec(4), vec(5), vec(6), vec(7),
                      np.array([r[8] for r in rows], dtype=np.int64).reshape(-1, 2), unit,
                      confidence, method)


def _step_parts(record: RunRecord, step: int, model: Any, unit: str, objective: int | str,
                level: str, batch_size: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """``(rewards [U, 1], parts [U, C], names)`` of ``step``'s scored rows, per unit."""
    df = record.scored(step)
    if df.empty:
        raise RunRecordError(f"step {step} has no scored completion (all empty)")
    cols = [c for c in df.columns if c.startswith(COMPONENT_PREFIX)]
    if cols:
        parts, names = df[cols].to_numpy(np.float64), [c[len(COMPONENT_PREFIX):] for c in cols]
    elif model is not None:
        items = [reward_input(p, c) for p, c in decoded(df)]
        parts, names = direct_parts(model, items, objective, level, batch_size)
    else:
        raise RunRecordError(f"step {step} of the run record in {record.folder} holds no "
                             "decomposition; pass model= (the reward model it was scored with) "
                             "to compute it, or record with RewardModelFunction(..., "
                             "decompose=True)")
    rewards = df[["reward"]].to_numpy(np.float64)
    return _units(df, rewards, unit), _units(df, parts, unit), names
