"""Proxy against gold over a run: where the gold score stops rising while the reward model's
keeps rising, and how early a mechanistic signal saw it coming.

Per step, the mean proxy reward (the record's ``reward``) and the mean gold score (``gold``: a
grader's, recorded or computed by ``grader=``) over units (a prompt's completions averaged, as
in :mod:`tl_reward.rl.gain`), each with the package's interval of a mean (the sign-flip test
inverted, :func:`~tl_reward.stats.paired.summarise_mean`; none below 6 units). The x-axis is
the policy's KL from its reference policy when known: a ``kl`` column of the record (its mean
per step), the record's ``logratio`` column (:class:`~tl_reward.rl.trl.PolicyLogRatio`: its
mean over units per step, the Monte-Carlo KL of whole completions, with the same interval), a
mapping step -> KL, or TRL's ``trainer.state.log_history`` (its ``kl``, a per-token KL, logged
at global step ``s + 1`` is measured on the completions recorded at step ``s``; TRL logs it
only with ``beta > 0``). Without one, the x-axis is the step index, and the curve says so.

**Peak step**: the first step ``p`` after which gold never rises: no later step's gold is above
its level at ``p`` by the one-sided Welch test (unequal variances; two steps are independent
samples), Holm over the later steps at family-wise ``alpha``, and gold's change from it to the
last step is not a significant rise (its Welch interval reaches 0, the interval reported after
the peak). On gold that never rises the peak is the first step with probability at least
``1 - alpha - (1 - confidence) / 2`` (scanning the later steps without correction moved it
later on 14-22 % of simulated flat runs); on gold that never stops rising, the peak is the last
step. The proxy's and gold's change from the peak to the last step (Welch
intervals) give two verdicts: ``overoptimised``, the proxy kept rising after gold stopped (its
interval above 0, gold's reaching 0), and ``gold_fell``, gold fell (its interval below 0: Gao
et al.'s signature). ``gold_fell`` is calibrated against gold that keeps rising;
``overoptimised`` rests on gold's rise not being seen, so where gold keeps rising too slowly for
its noise it fires (``experiments/goodhart_null.py`` measures both). Given the smallest gold
gain that matters, ``min_gold_gain`` (in gold's units), a third verdict, ``gold_stalled``: the
proxy rose after the peak and gold's change after it is shown below that gain (its interval's
high end below ``min_gold_gain``, a one-sided test at ``(1 - confidence) / 2``), calibrated
against gold that goes on rising by at least that much; ``gold_fell`` is its case
``min_gold_gain = 0``.

**The proxy's first rise** and the **signal step** of a component (e.g. ``"L2.H0"``): the first
step at which the proxy's change since the first step, or the component's part of the reward
change since it (:func:`~tl_reward.rl.gain.reward_gain`), is above 0 by the one-sided Welch test
with a family-wise error rate of ``alpha`` over all the steps (Holm;
:meth:`~tl_reward.rl.gain.RewardGain.alarm`): a calibrated verdict, not the first step whose
descriptive interval lies above 0 (which on a long run fires on most null runs). The **lead
time** is the signal step minus the peak step: negative when the component's gain showed before
gold stopped rising.

Example:
    >>> curve = goodhart_curve(record, kl=trainer.state.log_history, component="L2.H0")
    >>> curve.sentence()
    >>> curve.plot()
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from tl_reward.errors import TLRewardError, check_choice
from tl_reward.results import ShortRepr
from tl_reward.rl.gain import MIN_UNITS, RewardGain, _bars, _units, _welch, reward_gain
from tl_reward.rl.record import LOGRATIO, Grader, RunRecord, RunRecordError, decoded
from tl_reward.stats.multiplicity import holm

__all__ = ["GoodhartCurve", "after_peak", "after_peak_verdicts", "goodhart_curve",
           "gold_stalled_verdict", "kl_from_log_history", "peak_step"]

#: The x-axis label with a KL, and without one.
KL_LABEL = "KL from the reference policy"
#: The x-axis label with the KL of whole completions from the record's ``logratio``.
SEQUENCE_KL_LABEL = f"{KL_LABEL} (per completion: the mean log-ratio)"
STEP_LABEL = "step (the record holds no KL from the reference policy)"


@dataclass(repr=False)
class GoodhartCurve(ShortRepr):
    """Mean proxy reward and gold score per step, the gold peak and a component's lead time
    (see the module doc).

    Attributes:
        steps: the S steps; x: ``[S]`` the x-axis (the KL, or the step); x_label: which.
        x_ci_low, x_ci_high: ``[S]`` the KL's sign-flip interval when it is the record's
            ``logratio`` (NaN below 6 units), else None.
        proxy, proxy_ci_low, proxy_ci_high: ``[S]`` mean proxy reward per step and its
            sign-flip interval (NaN below 6 units); gold, gold_ci_low, gold_ci_high: the same
            of the gold score.
        peak_step: where gold stops rising.
        proxy_rise_step: the first step whose proxy is above the first step's, family-wise
            at ``alpha`` over the steps (one-sided Welch tests, Holm; -1: none).
        proxy_after_peak, gold_after_peak: the change from the peak to the last step;
            ``*_ci``: its Welch interval ``[low, high]`` (NaN at the last step).
        component: the component whose lead time is measured (``""``: none).
        signal_step: the first step its gain is above 0, family-wise at ``alpha`` over the
            steps (``RewardGain.alarm``; -1: never, or no component).
        lead_time: ``signal_step - peak_step`` (NaN when there is no signal step).
        n_units: ``[S]`` units per step; unit: ``"prompt"`` or ``"completion"``.
        confidence: the intervals' level; method: how the numbers were made.
        alpha: the family-wise error rate of the proxy's rise and the signal step.
        min_gold_gain: the smallest gold gain that matters, when given (``gold_stalled``).
    """

    steps: list[int]
    x: np.ndarray
    x_label: str
    proxy: np.ndarray
    proxy_ci_low: np.ndarray
    proxy_ci_high: np.ndarray
    gold: np.ndarray
    gold_ci_low: np.ndarray
    gold_ci_high: np.ndarray
    peak_step: int
    proxy_rise_step: int
    proxy_after_peak: float
    proxy_after_peak_ci: list[float]
    gold_after_peak: float
    gold_after_peak_ci: list[float]
    component: str = ""
    signal_step: int = -1
    lead_time: float = float("nan")
    n_units: np.ndarray | None = None
    unit: str = "prompt"
    confidence: float = 0.95
    method: str = ""
    x_ci_low: np.ndarray | None = None
    x_ci_high: np.ndarray | None = None
    alpha: float = 0.05
    min_gold_gain: float | None = None

    @property
    def has_kl(self) -> bool:
        """Whether the x-axis is the KL (else the step)."""
        return self.x_label.startswith(KL_LABEL)

    @property
    def overoptimised(self) -> bool:
        """Whether the proxy kept rising after gold's peak (its change's interval above 0)
        while gold did not (its interval reaches 0): see the module doc for what it is
        calibrated against, and what it is not."""
        return after_peak_verdicts(self.proxy_after_peak_ci, self.gold_after_peak_ci)[0]

    @property
    def gold_fell(self) -> bool:
        """Whether gold fell after its peak while the proxy rose (both changes' intervals
        exclude 0): the over-optimisation of Gao et al., calibrated against gold that rises."""
        return after_peak_verdicts(self.proxy_after_peak_ci, self.gold_after_peak_ci)[1]

    @property
    def gold_stalled(self) -> bool | None:
        """Whether the proxy rose after gold's peak while gold's change after it is shown below
        ``min_gold_gain`` (None when no gain was stated): see the module doc."""
        if self.min_gold_gain is None:
            return None
        return gold_stalled_verdict(self.proxy_after_peak_ci, self.gold_after_peak_ci,
                                    self.min_gold_gain)

    def _at(self, step: int) -> str:
        i = self.steps.index(step)
        return f"step {step}" + (f", KL {self.x[i]:.3g}" if self.has_kl else "")

    def sentence(self) -> str:
        """``"gold stops rising at step 12, KL 0.031; after it the proxy changes +2.90 [+2.10,
        +3.70] and gold -0.10 [-0.50, +0.30]; the proxy first rises at step 8; L2.H0's gain is
        above 0 from step 8 (lead time -4 steps)"``."""
        lo, hi = self.proxy_after_peak_ci
        glo, ghi = self.gold_after_peak_ci
        out = f"gold stops rising at {self._at(self.peak_step)}"
        if self.peak_step != self.steps[-1]:
            out += (f"; after it the proxy changes {self.proxy_after_peak:+.2f} [{lo:+.2f}, "
                    f"{hi:+.2f}] and gold {self.gold_after_peak:+.2f} [{glo:+.2f}, {ghi:+.2f}]")
        else:
            out += " (the last step: gold never stops rising)"
        if self.gold_stalled is not None:
            out += (f"; gold's gain after the peak is {'' if self.gold_stalled else 'not '}"
                    f"shown below {self.min_gold_gain:g}")
        out += (f"; the proxy first rises at step {self.proxy_rise_step}"
                if self.proxy_rise_step >= 0 else "; the proxy never rises")
        if self.component:
            out += (f"; {self.component}'s gain is above 0 from step {self.signal_step} (lead "
                    f"time {self.lead_time:+.0f} steps)" if self.signal_step >= 0 else
                    f"; {self.component}'s gain is never above 0")
        return out

    def headline(self) -> dict[str, Any]:
        """The sentence, whether the proxy kept rising after gold's peak, whether gold fell
        after it, and (with ``min_gold_gain``) whether its gain there is shown below that."""
        out = {"sentence": self.sentence(), "overoptimised": self.overoptimised,
               "gold_fell": self.gold_fell}
        return out if self.min_gold_gain is None else {**out, "gold_stalled": self.gold_stalled}

    def to_dataframe(self) -> pd.DataFrame:
        """One row per step: step, x (and interval, when it has one), proxy (and interval),
        gold (and interval), peak."""
        xci = {} if self.x_ci_low is None else {"x_ci_low": self.x_ci_low,
                                                 "x_ci_high": self.x_ci_high}
        return pd.DataFrame({
            "step": self.steps, "x": self.x, **xci, "proxy": self.proxy,
            "proxy_ci_low": self.proxy_ci_low, "proxy_ci_high": self.proxy_ci_high,
            "gold": self.gold, "gold_ci_low": self.gold_ci_low,
            "gold_ci_high": self.gold_ci_high,
            "peak": [s == self.peak_step for s in self.steps]})

    def plot(self) -> Any:
        """Proxy (left axis) and gold (right axis) against the KL or the step, intervals as
        error bars (none where a step has too few units), the gold peak and the component's
        signal step marked."""
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        fig = make_subplots(specs=[[{"secondary_y": True}]])
        x = list(self.x)
        x_bars = None if self.x_ci_low is None else \
            _bars(self.x, self.x_ci_low, self.x_ci_high, "rgba(90,90,90,0.35)")
        for name, y, lo, hi, colour, right in (
                ("proxy reward", self.proxy, self.proxy_ci_low, self.proxy_ci_high,
                 "31,119,180", False),
                ("gold score", self.gold, self.gold_ci_low, self.gold_ci_high, "214,39,40",
                 True)):
            fig.add_trace(go.Scatter(x=x, y=y, name=name, mode="lines+markers",
                                     marker={"size": 4}, line={"color": f"rgb({colour})"},
                                     error_y=_bars(y, lo, hi, f"rgba({colour},0.35)"),
                                     error_x=x_bars,
                                     customdata=self.steps,
                                     hovertemplate="step %{customdata}: %{y:.3f}"),
                          secondary_y=right)
        peak_x = float(self.x[self.steps.index(self.peak_step)])
        fig.add_vline(x=peak_x, line_dash="dash", line_color="rgb(214,39,40)",
                      annotation_text=f"gold peak (step {self.peak_step})")
        if self.component and self.signal_step >= 0:
            fig.add_vline(x=float(self.x[self.steps.index(self.signal_step)]), line_dash="dot",
                          line_color="black", annotation_position="bottom right",
                          annotation_text=f"{self.component} gain > 0 (step {self.signal_step})")
        fig.update_layout(title="Proxy against gold", xaxis_title=self.x_label)
        fig.update_yaxes(title_text="mean proxy reward", secondary_y=False)
        fig.update_yaxes(title_text="mean gold score", secondary_y=True)
        return fig


def kl_from_log_history(history: Sequence[Mapping[str, Any]] | str | Path) -> dict[int, float]:
    """``{record step: KL}`` from TRL's ``trainer.state.log_history`` (or a
    ``trainer_state.json`` holding it): TRL logs at global step ``s + 1`` the KL measured on
    the completions the reward function scored (and recorded) at step ``s``."""
    if isinstance(history, str | Path):
        state = json.loads(Path(history).read_text())
        history = state["log_history"] if isinstance(state, dict) else state
    out = {int(e["step"]) - 1: float(e["kl"]) for e in history
           if "kl" in e and e.get("kl") is not None and "step" in e}
    if not out:
        raise TLRewardError("the log history holds no 'kl' entry: TRL logs the KL from the "
                            "reference policy only with beta > 0 (GRPOConfig(beta=...))")
    return out


def peak_step(steps: Sequence[int], units: Sequence[np.ndarray], alpha: float = 0.05,
              confidence: float = 0.95) -> int:
    """The first step after which the per-unit values ``units[i]`` (of ``steps[i]``) never
    rise: no later step's mean is above its by the one-sided Welch test
    (``scipy.stats.ttest_ind_from_stats``, unequal variances; none below ``MIN_UNITS``
    units), Holm over the later steps at family-wise ``alpha``, and the last step's Welch
    interval (at ``confidence``) over it reaches down to 0, so the change after the peak is
    never a significant rise. On values that never rise the first step is the peak with
    probability at least ``1 - alpha - (1 - confidence) / 2``; see the module doc."""
    n = np.array([len(u) for u in units], dtype=np.float64)
    mean = np.array([np.mean(u) if len(u) else np.nan for u in units])
    sd = np.array([np.std(u, ddof=1) if len(u) > 1 else np.nan for u in units])
    enough = n >= MIN_UNITS
    for i, s in enumerate(steps[:-1]):
        if not enough[i]:
            continue
        with np.errstate(invalid="ignore", divide="ignore"):
            p = stats.ttest_ind_from_stats(mean[i + 1:], sd[i + 1:], n[i + 1:], mean[i],
                                           sd[i], n[i], equal_var=False,
                                           alternative="greater").pvalue
        p = np.where(enough[i + 1:], p, np.nan)
        if not holm(p, alpha)[0].any() and not p[-1] < (1 - confidence) / 2:
            return int(s)
    return int(steps[-1])


def after_peak(per: Sequence[np.ndarray], peak: int, confidence: float = 0.95
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(change, low, high)``, each ``[K]``: the change of each column of the per-unit values
    ``per[i]`` (``[n_i, K]``, one entry per step) from step index ``peak`` to the last, and its
    Welch interval (NaN when the peak is the last step)."""
    change = per[-1].mean(0) - per[peak].mean(0)
    if peak >= len(per) - 1:
        nan = np.full(per[-1].shape[1], np.nan)
        return change, nan, nan.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        lo, hi = _welch(per[-1], per[peak], confidence)[:2]
    return change, lo, hi


def after_peak_verdicts(proxy_ci: Sequence[float], gold_ci: Sequence[float]
                        ) -> tuple[bool, bool]:
    """``(overoptimised, gold_fell)`` from the after-peak intervals ``[low, high]`` of the
    proxy and of gold: the proxy rose (its low end above 0) while gold did not (its low end
    at or below 0); the proxy rose and gold fell (its high end below 0)."""
    rose = bool(proxy_ci[0] > 0)
    return rose and bool(gold_ci[0] <= 0), gold_stalled_verdict(proxy_ci, gold_ci, 0.0)


def gold_stalled_verdict(proxy_ci: Sequence[float], gold_ci: Sequence[float],
                         min_gold_gain: float) -> bool:
    """Whether the proxy rose after the peak (its interval's low end above 0) while gold's
    change after it is shown below ``min_gold_gain`` (its interval's high end below it)."""
    return bool(proxy_ci[0] > 0) and bool(gold_ci[1] < min_gold_gain)


def _kl_axis(record: RunRecord, steps: list[int], frames: list[pd.DataFrame],
             kl: Any, unit: str = "prompt", confidence: float = 0.95
             ) -> tuple[np.ndarray, str, str, np.ndarray | None]:
    """The x-axis, its label, where it came from, and its ``[2, S]`` interval (or None)."""
    from tl_reward.stats.paired import summarise_mean

    if kl is None and all("kl" in f for f in frames):
        return (np.array([f["kl"].astype(np.float64).mean() for f in frames]), KL_LABEL,
                "the record's kl column (mean per step)", None)
    if kl is None and all(LOGRATIO in f for f in frames):
        est = [summarise_mean(_units(f, f[[LOGRATIO]].to_numpy(np.float64), unit)[:, 0],
                              confidence, exact_max_n=12) for f in frames]
        return (np.array([e.value for e in est]), SEQUENCE_KL_LABEL,
                f"the record's {LOGRATIO} column (mean over {unit}s per step: the Monte-Carlo "
                "KL of whole completions, with the sign-flip interval)",
                np.array([[e.ci_low for e in est], [e.ci_high for e in est]]))
    if kl is None:
        return (np.array(steps, dtype=np.float64), STEP_LABEL, "the step index (no KL known)",
                None)
    if not isinstance(kl, Mapping):
        kl = kl_from_log_history(kl)
    missing = [s for s in steps if s not in kl]
    if missing:
        raise RunRecordError(f"no KL for steps {missing[:8]}{' ...' if len(missing) > 8 else ''}"
                             f" of the run record in {record.folder}; pass one for each step")
    return (np.array([float(kl[s]) for s in steps]), KL_LABEL,
            "the KL given (TRL's log at step s + 1 for record step s)", None)


def goodhart_curve(record: RunRecord, kl: Any = None, component: str | None = None,
                   gain: RewardGain | None = None, grader: Grader | None = None,
                   steps: Sequence[int] | None = None, unit: str = "prompt",
                   confidence: float = 0.95, model: Any = None, alpha: float = 0.05,
                   min_gold_gain: float | None = None) -> GoodhartCurve:
    """Proxy against gold over the run, the gold peak and ``component``'s lead time (see the
    module doc).

    Args:
        record: the run, with ``gold`` recorded (or pass ``grader``).
        kl: the x-axis: None (the record's ``kl`` column, else its ``logratio`` column, else
            the step), a mapping step -> KL, or TRL's ``trainer.state.log_history`` (a list,
            or a trainer_state.json path).
        component: a component name (``"L2.H0"``) whose lead time to measure.
        gain: the run's :func:`~tl_reward.rl.gain.reward_gain` since step 0 (computed when
            ``component`` is given and this is not; ``model`` decomposes steps recorded
            without their decomposition).
        grader: ``grader(prompts, completions) -> scores``, for steps without ``gold``.
        steps: the steps (default every recorded one).
        unit: ``"prompt"`` (a prompt's completions averaged: one unit) or ``"completion"``.
        confidence: the intervals' level.
        alpha: the family-wise error rate of the proxy's first rise and the signal step.
        min_gold_gain: the smallest gain of the gold score that matters, in its units
            (``gold_stalled``); must be finite and at least 0.
    """
    from tl_reward.stats.paired import summarise_mean

    if min_gold_gain is not None and not (np.isfinite(min_gold_gain) and min_gold_gain >= 0):
        raise TLRewardError(f"min_gold_gain={min_gold_gain!r}: give the smallest gain of the "
                            "gold score that matters, a finite number >= 0 in gold's units")
    check_choice(unit, ("prompt", "completion"), "unit")
    have = record.steps()
    steps = sorted(steps) if steps is not None else have
    if not steps:
        raise RunRecordError(f"the run record in {record.folder} holds no step yet")
    frames = []
    for s in steps:
        df = record.scored(s)
        if "gold" not in df:
            if grader is None:
                raise RunRecordError(
                    f"step {s} of the run record in {record.folder} holds no gold score; "
                    "record with RunRecord(..., grader=...) or pass grader= to score it")
            pairs = decoded(df)
            df["gold"] = np.asarray(grader([p for p, _ in pairs], [c for _, c in pairs]),
                                    dtype=np.float64)
        frames.append(df)
    x, x_label, x_from, x_ci = _kl_axis(record, steps, frames, kl, unit, confidence)
    per = [_units(f, f[["reward", "gold"]].to_numpy(np.float64), unit) for f in frames]
    stats_ = {k: np.full((len(steps), 3), np.nan) for k in ("proxy", "gold")}
    for i, u in enumerate(per):
        for j, k in enumerate(("proxy", "gold")):
            est = summarise_mean(u[:, j], confidence, exact_max_n=12)
            stats_[k][i] = est.value, est.ci_low, est.ci_high
    peak = peak_step(steps, [u[:, 1] for u in per], alpha, confidence)
    after, lo, hi = after_peak(per, steps.index(peak), confidence)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        rise_p = np.array([_welch(u[:, :1], per[0][:, :1], confidence)[2][0] for u in per[1:]])
    rise = [s for s, r in zip(steps[1:], holm(rise_p, alpha)[0], strict=True) if r]
    signal, lead = -1, float("nan")
    if component is not None:
        if gain is None:
            gain = reward_gain(record, since=steps[0], steps=steps[1:], model=model, unit=unit,
                               confidence=confidence, progress=False)
        alarm = gain.alarm(alpha, component)
        if alarm.fired:
            signal, lead = alarm.step, float(alarm.step - peak)
    method = (f"mean over {unit}s per step with the sign-flip interval (summarise_mean; none "
              f"below 6 {unit}s); x-axis: {x_from}; peak: the first step after which no later "
              "step's gold is above it by the one-sided Welch test (unequal variances, none below "
              f"{MIN_UNITS} {unit}s), Holm over the later steps at family-wise alpha {alpha:g}, "
              "and the last step's Welch interval over it reaching 0; "
              "after the peak: Welch interval of "
              "the last step minus the peak; the proxy's rise: the first step above the first "
              "by the one-sided Welch test, Holm over the steps at family-wise alpha "
              f"{alpha:g}"
              + ("; signal: the first step the component's part of the reward change since "
                 f"step {steps[0]} is above 0 by the same rule (RewardGain.alarm)"
                 if component is not None else "")
              + (f"; gold_stalled: the proxy's after-peak interval above 0 and gold's below "
                 f"{min_gold_gain:g}" if min_gold_gain is not None else ""))
    return GoodhartCurve(
        list(steps), x, x_label, *stats_["proxy"].T, *stats_["gold"].T, peak,
        int(rise[0]) if rise else -1,
        float(after[0]), [float(lo[0]), float(hi[0])], float(after[1]),
        [float(lo[1]), float(hi[1])], component or "", signal, lead,
        np.array([len(u) for u in per], dtype=np.int64), unit, confidence, method,
        *((None, None) if x_ci is None else x_ci), alpha,
        None if min_gold_gain is None else float(min_gold_gain))
