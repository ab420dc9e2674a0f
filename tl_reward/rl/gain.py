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

The per-step intervals are descriptive: each is one test, and a run tests every step (and every
component), so reading "the first step whose interval lies above 0" as a verdict raises a false
alarm on most runs where nothing changed. :meth:`RewardGain.alarm` is the calibrated verdict:
the first step whose change is above 0 by the one-sided Welch test with a family-wise error rate
of ``alpha`` over every step (and component) tested (Holm, :func:`~tl_reward.stats.
multiplicity.holm`); its false-alarm rate on real null runs is in docs/rl.md.

Example:
    >>> gain = reward_gain(RunRecord.open("runs/grpo"))
    >>> gain.sentence()  # 'reward +2.10 since step 0, of which +1.70 through L2.H0 (at step 40)'
    >>> gain.alarm(component="all").sentence()  # which component, from which step
    >>> gain.plot()
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
from tl_reward.stats.multiplicity import holm

__all__ = ["ALL", "MIN_UNITS", "Alarm", "RewardGain", "direct_parts", "gain_from_units",
           "reward_gain"]

#: Fewest units per step for an interval (Welch's needs a variance on each side).
MIN_UNITS = 2
#: ``RewardGain.alarm(component=ALL)``: scan every component, one family of steps x components.
ALL = "all"


@dataclass(repr=False)
class Alarm(ShortRepr):
    """The first step whose change since its reference step is above 0 by the one-sided Welch
    test, with a family-wise error rate of ``alpha`` over every test of the family (Holm).

    Attributes:
        target: what was tested: ``"reward"`` (the reward change), a component's name, or
            ``"all"`` (every component, one family).
        step: the first step with a rejected test (-1: none); since: its reference step.
        components: what was rejected at ``step``, the largest change first (``["reward"]``
            for the reward change; empty when none).
        change: the change of the first of them (NaN: none); ci: its Welch interval.
        p_value: its one-sided Welch p-value; p_adjusted: Holm's adjusted one.
        alpha: the family-wise error rate; n_tests: the tests in the family (those with a
            p-value); method: how.
    """

    target: str
    step: int
    since: int
    components: list[str]
    change: float
    ci: list[float]
    p_value: float
    p_adjusted: float
    alpha: float
    n_tests: int
    method: str = ""

    @property
    def fired(self) -> bool:
        """Whether any test of the family was rejected."""
        return self.step >= 0

    @property
    def component(self) -> str:
        """The first of :attr:`components` (``""``: none)."""
        return self.components[0] if self.components else ""

    def sentence(self) -> str:
        """``"L2.H0's change since step 0 is above 0 from step 20: +0.60 [+0.12, +1.09],
        Holm-adjusted p 0.012 (59 tests, family-wise alpha 0.05)"``."""
        what = ("the reward" if self.target == "reward" else
                self.component if self.target == ALL else self.target)
        tail = f"({self.n_tests} tests, family-wise alpha {self.alpha:g})"
        if not self.fired:
            return ("no component's change is above 0 at any step" if self.target == ALL else
                    f"{what}'s change is above 0 at no step") + f" {tail}"
        lo, hi = self.ci
        return (f"{what}'s change since step {self.since} is above 0 from step {self.step}: "
                f"{self.change:+.2f} [{lo:+.2f}, {hi:+.2f}], Holm-adjusted p "
                f"{self.p_adjusted:.3g} {tail}")

    def headline(self) -> dict[str, Any]:
        """The sentence."""
        return {"sentence": self.sentence()}


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
        p_value: ``[S, C]`` the one-sided Welch p-value of each change being above 0 (NaN
            where there is no interval); reward_p_value: ``[S]`` the reward change's. The
            verdict that reads them: :meth:`alarm`.
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
    p_value: np.ndarray | None = None
    reward_p_value: np.ndarray | None = None

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

    def alarm(self, alpha: float = 0.05, component: str | None = None) -> Alarm:
        """The calibrated verdict: the first step whose change is above 0 by the one-sided
        Welch test, with a family-wise error rate of ``alpha`` over every step tested (Holm).

        Args:
            alpha: the family-wise error rate: on a run where nothing changes, the chance of
                any alarm is at most ``alpha`` (up to the Welch test's own calibration).
            component: None (the reward change), a component's name (its change), or
                :data:`ALL` (``"all"``: every component at every step, one family; the alarm
                names the components rejected at the first step, the largest change first:
                a tiny change can be the most significant).
        """
        if self.p_value is None or self.reward_p_value is None:
            raise TLRewardError("this gain holds no p-values (saved by an older version); "
                                "recompute it with reward_gain")
        if component is None:
            target, names = "reward", ["reward"]
            p, change = self.reward_p_value[:, None], self.reward_change[:, None]
            lo, hi = self.reward_ci_low[:, None], self.reward_ci_high[:, None]
        elif component == ALL:
            target, names, p, change = ALL, self.components, self.p_value, self.change
            lo, hi = self.ci_low, self.ci_high
        elif component in self.components:
            j = self.components.index(component)
            target, names, p, change = component, [component], self.p_value[:, j:j + 1], \
                self.change[:, j:j + 1]
            lo, hi = self.ci_low[:, j:j + 1], self.ci_high[:, j:j + 1]
        else:
            raise TLRewardError(f"no component {component!r} in the gain's components "
                                f"({', '.join(self.components[:6])}, ...)")
        rejected, adjusted = holm(p, alpha)
        n = int(np.isfinite(p).sum())
        method = (f"one-sided Welch test (scipy.stats.ttest_ind, unequal variances, "
                  f"alternative='greater') of each change since the reference step, Holm's "
                  f"step-down (tl_reward.stats.multiplicity.holm) over {n} tests: "
                  + ("every step x component" if target == ALL else "every step"))
        rows = np.flatnonzero(rejected.any(1))
        if not len(rows):
            return Alarm(target, -1, -1, [], float("nan"), [float("nan")] * 2, float("nan"),
                         float("nan"), alpha, n, method)
        i = int(rows[0])
        cols = np.flatnonzero(rejected[i])
        cols = cols[np.lexsort((p[i, cols], -change[i, cols]))]
        k = int(cols[0])
        return Alarm(target, self.steps[i], self.since[i], [names[c] for c in cols],
                     float(change[i, k]), [float(lo[i, k]), float(hi[i, k])], float(p[i, k]),
                     float(adjusted[i, k]), alpha, n, method)

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


def _welch(a: np.ndarray, b: np.ndarray, confidence: float
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per column: the Welch interval of ``mean(a) - mean(b)`` and the one-sided p-value of
    ``mean(a) > mean(b)`` (NaN below ``MIN_UNITS``, or for a constant column)."""
    if min(len(a), len(b)) < MIN_UNITS:
        nan = np.full(a.shape[1], np.nan)
        return nan, nan.copy(), nan.copy()
    with np.errstate(invalid="ignore", divide="ignore"):
        ci = stats.ttest_ind(a, b, axis=0, equal_var=False).confidence_interval(confidence)
        p = stats.ttest_ind(a, b, axis=0, equal_var=False, alternative="greater").pvalue
    return (np.asarray(ci.low, dtype=np.float64), np.asarray(ci.high, dtype=np.float64),
            np.asarray(p, dtype=np.float64))


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
    return gain_from_units({s: cache[s][:2] for s in needed}, names, pairs, unit, confidence)


def gain_from_units(units: Mapping[int, tuple[np.ndarray, np.ndarray]], names: Sequence[str],
                    pairs: Sequence[tuple[int, int]], unit: str = "prompt",
                    confidence: float = 0.95) -> RewardGain:
    """The :class:`RewardGain` of ``pairs`` ``(later step, reference step)`` from per-unit
    values: ``units[step] = (rewards [U] or [U, 1], parts [U, C])`` (columns as ``names``);
    :func:`reward_gain` reads them from a record."""
    rows = []
    for later_step, ref in pairs:
        (r1, p1), (r0, p0) = [(np.asarray(r, np.float64).reshape(-1, 1),
                               np.asarray(q, np.float64)) for r, q in (units[later_step],
                                                                       units[ref])]
        lo, hi, pv = _welch(p1, p0, confidence)
        rlo, rhi, rpv = _welch(r1, r0, confidence)
        rows.append((p1.mean(0) - p0.mean(0), lo, hi, p1.mean(0), float(r1.mean() - r0.mean()),
                     float(rlo[0]), float(rhi[0]), float(r1.mean()), (len(r1), len(r0)), pv,
                     float(rpv[0])))
    c = len(names)

    def stack(j: int) -> np.ndarray:
        return np.stack([r[j] for r in rows]) if rows else np.zeros((0, c))

    def vec(j: int) -> np.ndarray:
        return np.array([r[j] for r in rows], dtype=np.float64)

    method = (f"mean over {unit}s; Welch interval (scipy.stats.ttest_ind, unequal variances) "
              f"over each step's {unit}s, none below {MIN_UNITS} per step; p_value: the "
              "one-sided Welch test of each change above 0 (uncorrected; RewardGain.alarm "
              "corrects it)")
    return RewardGain([p[0] for p in pairs], [p[1] for p in pairs], list(names), stack(0),
                      stack(1), stack(2), stack(3), vec(4), vec(5), vec(6), vec(7),
                      np.array([r[8] for r in rows], dtype=np.int64).reshape(-1, 2), unit,
                      confidence, method, stack(9), vec(10))


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
