"""The policy's implicit reward over a run, against the reward model's.

A policy tuned against a reward with a KL penalty ``beta`` has, at its optimum,
``pi(y|x) = pi_ref(y|x) exp(r(x, y) / beta) / Z(x)``: its implicit reward ``beta * [log pi(y|x)
- log pi_ref(y|x)]`` (:mod:`tl_reward.irm.implicit`) is the reward up to a constant of the
prompt, ``-beta log Z(x)``. How far the policy's implicit reward agrees with the reward model's
shows how much of the reward model the policy has taken in so far. Both come from the record:
the reward model's ``reward`` and each completion's ``logratio`` (recorded during training by
:class:`~tl_reward.rl.trl.PolicyLogRatio`, on the policy's own samples at that step), so no
checkpoint is loaded. A run recorded without it gets it from saved checkpoints
(:func:`~tl_reward.rl.trl.checkpoint_logratios`, on the completion ids the record kept).

Per step: the mean implicit reward over units (a prompt's completions averaged, as in
:mod:`tl_reward.rl.gain`) with the sign-flip interval of a mean (none below 6 units); it is
``beta`` times the Monte-Carlo KL of whole completions from the reference policy.

Agreement, per window of consecutive steps: both rewards are centred within each group of a
step's completions of one prompt (removing the prompt's constant, which the identity leaves
free and GRPO's group-relative advantage ignores), then compared by
:func:`~tl_reward.stats.agreement.rank_agreement` (Spearman's rho and Kendall's tau-b), each
group one unit: rho's interval is the jackknife Fisher-z interval leaving out one group at a
time (from 10 groups), tau-b's variance sums each group's items (from 8 groups). A step of
GRPO holds few distinct prompts, so a single step rarely has an interval: pool steps
(``window``).

Example:
    >>> imp = implicit_reward_over_training(record, window=10)
    >>> imp.sentence()
    >>> imp.plot()
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tl_reward.errors import TLRewardError, check_choice
from tl_reward.results import ShortRepr
from tl_reward.rl.gain import _bars, _units
from tl_reward.rl.record import LOGRATIO, RunRecord, RunRecordError
from tl_reward.stats.agreement import RankAgreement, rank_agreement

__all__ = ["ImplicitRewardOverTraining", "implicit_reward_over_training"]


@dataclass(repr=False)
class ImplicitRewardOverTraining(ShortRepr):
    """The policy's implicit reward per step and its agreement with the reward model's per
    window of steps (see the module doc).

    Attributes:
        steps: the S steps; implicit: ``[S]`` mean implicit reward over units;
            implicit_ci_low, implicit_ci_high: its sign-flip interval (NaN below 6 units);
            reward: ``[S]`` the mean recorded reward over units.
        windows: each window's steps; agreement: each window's :class:`RankAgreement` of the
            centred implicit reward (``x``) and the centred reward (``y``).
        rows: one row per completion used: step, row, prompt, group (its window-wide group
            label), implicit_reward (``beta * logratio``), reward, and both centred within
            the group.
        beta: the implicit reward's scale; unit: ``"prompt"`` or ``"completion"`` (the
            per-step means'); confidence: the intervals' level; method: how.
    """

    steps: list[int]
    implicit: np.ndarray
    implicit_ci_low: np.ndarray
    implicit_ci_high: np.ndarray
    reward: np.ndarray
    windows: list[list[int]]
    agreement: list[RankAgreement]
    rows: pd.DataFrame = field(repr=False)
    beta: float = 1.0
    unit: str = "prompt"
    confidence: float = 0.95
    method: str = ""

    def window(self, step: int | None = None) -> int:
        """The index of the window holding ``step`` (default the last window)."""
        if step is None:
            return len(self.windows) - 1
        for i, w in enumerate(self.windows):
            if step in w:
                return i
        raise TLRewardError(f"step {step} is not among the steps {self.steps}")

    def sentence(self, step: int | None = None) -> str:
        """``"at steps 50-59 the implicit reward agrees with the reward model's within
        prompts: Spearman +0.41 [+0.20, +0.58] (48 groups); mean implicit reward +0.00 at step
        0, +0.35 at step 59"`` for the window of ``step`` (default the last)."""
        i = self.window(step)
        w, rho = self.windows[i], self.agreement[i].spearman_rho
        ci = "" if math.isnan(rho.ci_low) else f" [{rho.ci_low:+.2f}, {rho.ci_high:+.2f}]"
        span = f"step {w[0]}" if len(w) == 1 else f"steps {w[0]}-{w[-1]}"
        return (f"at {span} the implicit reward agrees with the reward model's within prompts: "
                f"Spearman {rho.value:+.2f}{ci} ({rho.n} groups); mean implicit reward "
                f"{self.implicit[0]:+.2f} at step {self.steps[0]}, {self.implicit[-1]:+.2f} at "
                f"step {self.steps[-1]}")

    def headline(self) -> dict[str, Any]:
        """The last window's sentence."""
        return {"sentence": self.sentence()} if self.steps else {}

    def to_dataframe(self) -> pd.DataFrame:
        """One row per step: step, implicit (and interval), reward, window, and the window's
        Spearman rho and Kendall tau-b (and intervals) and groups."""
        out = []
        for i, s in enumerate(self.steps):
            a = self.agreement[self.window(s)]
            out.append({"step": s, "implicit": self.implicit[i],
                        "implicit_ci_low": self.implicit_ci_low[i],
                        "implicit_ci_high": self.implicit_ci_high[i], "reward": self.reward[i],
                        "window": self.window(s),
                        **{f"{m}{k}": getattr(a, m).to_dict()[v] for m in
                           ("spearman_rho", "kendall_tau_b") for k, v in
                           (("", "value"), ("_ci_low", "ci_low"), ("_ci_high", "ci_high"))},
                        "groups": a.spearman_rho.n})
        return pd.DataFrame(out)

    def plot(self) -> Any:
        """The mean implicit reward per step (top) and each window's Spearman rho of the
        centred rewards (bottom, at the window's last step), intervals as error bars."""
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                            subplot_titles=("mean implicit reward", "agreement with the reward "
                                            "model within prompts (Spearman)"))
        fig.add_trace(go.Scatter(x=self.steps, y=self.implicit, mode="lines+markers",
                                 name="implicit reward", marker={"size": 4},
                                 error_y=_bars(self.implicit, self.implicit_ci_low,
                                               self.implicit_ci_high, "rgba(31,119,180,0.35)")),
                      row=1, col=1)
        rho = [a.spearman_rho for a in self.agreement]
        y = np.array([r.value for r in rho])
        fig.add_trace(go.Scatter(x=[w[-1] for w in self.windows], y=y, mode="lines+markers",
                                 name="Spearman rho", line={"color": "rgb(214,39,40)"},
                                 error_y=_bars(y, np.array([r.ci_low for r in rho]),
                                               np.array([r.ci_high for r in rho]),
                                               "rgba(214,39,40,0.35)")), row=2, col=1)
        fig.add_hline(y=0, line_dash="dot", line_color="grey", row=2, col=1)
        fig.update_layout(title="The policy's implicit reward against the reward model's",
                          showlegend=False)
        fig.update_xaxes(title_text="step", row=2, col=1)
        return fig


def _beta(record: RunRecord, beta: float | None) -> tuple[float, str]:
    """The implicit reward's scale and where it came from."""
    if beta is not None:
        if not beta > 0:
            raise TLRewardError(f"beta must be positive, got {beta}")
        return float(beta), f"beta {beta:g} (given)"
    given = record.identity.settings.get("beta")
    if isinstance(given, int | float) and given > 0:
        return float(given), f"beta {given:g} (the run's settings)"
    return 1.0, "beta 1 (the run has no KL penalty in its settings: the log-ratio itself)"


def implicit_reward_over_training(record: RunRecord, beta: float | None = None,
                                  steps: Sequence[int] | None = None, window: int = 10,
                                  unit: str = "prompt", confidence: float = 0.95,
                                  logratio: Mapping[int, Sequence[float]] | None = None
                                  ) -> ImplicitRewardOverTraining:
    """The policy's implicit reward ``beta * logratio`` on its own samples per step, and its
    agreement with the recorded reward per window of steps (see the module doc).

    Args:
        record: the run, recorded with ``RewardModelFunction(..., logratio=PolicyLogRatio(...))``.
        beta: the implicit reward's scale (default: the run's settings' ``beta`` when positive,
            else 1); the agreement does not depend on it.
        steps: the steps (default every recorded one).
        window: consecutive steps pooled per agreement (the last window may be shorter).
        unit: the per-step means' unit: ``"prompt"`` (a prompt's completions averaged) or
            ``"completion"``.
        confidence: the intervals' level.
        logratio: ``{step: one log-ratio per recorded row}`` for a run recorded without them
            (:func:`~tl_reward.rl.trl.checkpoint_logratios` makes it from saved
            checkpoints); used where given (default steps: its keys), the record's
            ``logratio`` column elsewhere.
    """
    from tl_reward.stats.paired import summarise_mean

    check_choice(unit, ("prompt", "completion"), "unit")
    if window < 1:
        raise TLRewardError(f"window must be at least 1 step, got {window}")
    b, b_from = _beta(record, beta)
    given = dict(logratio or {})
    steps = sorted(steps) if steps is not None else sorted(given) or record.steps()
    if not steps:
        raise RunRecordError(f"the run record in {record.folder} holds no step yet")
    frames = []
    for s in steps:
        df = record.scored(s)
        if s in given:
            values, rows = np.asarray(given[s], dtype=np.float64), len(record.read(s))
            if values.shape != (rows,):
                raise RunRecordError(f"logratio[{s}] holds {values.size} values for the "
                                     f"{rows} rows of step {s}; pass one per row")
            df = df.assign(**{LOGRATIO: values[df["row"].to_numpy()]})
        elif LOGRATIO not in df:
            raise RunRecordError(
                f"step {s} of the run record in {record.folder} holds no {LOGRATIO} column; "
                "record the run with RewardModelFunction(..., logratio=PolicyLogRatio(policy, "
                "reference, tokenizer)), or pass logratio=checkpoint_logratios(record, "
                "checkpoints, reference, tokenizer)")
        df = df[np.isfinite(df[LOGRATIO].to_numpy(np.float64))].reset_index(drop=True)
        df = df.assign(implicit_reward=b * df[LOGRATIO].astype(np.float64),
                       group=[f"{s}:{p}" for p in df["prompt"]])
        for col in ("implicit_reward", "reward"):
            df[f"{col}_centred"] = df[col] - df.groupby("group")[col].transform("mean")
        frames.append(df)
    est = [summarise_mean(_units(f, f[["implicit_reward"]].to_numpy(np.float64), unit)[:, 0],
                          confidence, exact_max_n=12) for f in frames]
    mean_reward = [float(_units(f, f[["reward"]].to_numpy(np.float64), unit).mean())
                   for f in frames]
    windows = [steps[i:i + window] for i in range(0, len(steps), window)]
    rows = pd.concat(frames, ignore_index=True)
    agreement = []
    for w in windows:
        part = rows[rows["step"].isin(w)]
        part = part[part.groupby("group")["group"].transform("size") > 1]  # centred to 0
        agreement.append(rank_agreement(
            part["implicit_reward_centred"].to_numpy(), part["reward_centred"].to_numpy(),
            ("implicit reward (centred)", "reward model (centred)"), confidence,
            units=part["group"].to_numpy(), unit="prompt group"))
    source = ("the recorded log-ratio" if not given else "the log-ratio given for steps "
              f"{sorted(given)} (from checkpoints), the recorded one elsewhere")
    method = (f"implicit reward {b_from} x {source}; per step, mean over {unit}s "
              "with the sign-flip interval (summarise_mean; none below 6); per window of "
              f"{window} steps, both rewards centred within each step's prompt group (groups of "
              "one left out), then rank_agreement with each group a unit (rho: jackknife "
              "Fisher-z over groups, from 10; tau-b: cluster U-statistic variance, from 8)")
    return ImplicitRewardOverTraining(
        list(steps), np.array([e.value for e in est]), np.array([e.ci_low for e in est]),
        np.array([e.ci_high for e in est]), np.array(mean_reward), windows, agreement,
        rows[["step", "row", "prompt", "group", "implicit_reward", "reward",
              "implicit_reward_centred", "reward_centred"]], b, unit, confidence, method)
