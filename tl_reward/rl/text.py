"""What the policy's text changed over a run, and how much of the reward gain each change
explains.

Each completion is measured along text properties (:data:`PROPERTIES`: length in tokens and
characters, list items, markdown markers, and counts of the probe suite's hedges, flattery,
agreement and padding phrases from :mod:`tl_reward.audit.perturbations`, and of refusal
phrases), plus any ``str -> float`` you pass. Per step: each property's mean over units (a
prompt's completions averaged: one unit, as in :mod:`tl_reward.rl.gain`) with the package's
interval of a mean (the sign-flip test inverted, :func:`~tl_reward.stats.paired.
summarise_mean`; none below 6 units), and its change since the reference step with Welch's
interval (the two steps are independent samples, as in :func:`~tl_reward.rl.gain.
reward_gain`).

How much of the reward gain each property explains: the per-completion reward is regressed on
the properties pooled over the steps (OLS with an intercept, ``statsmodels``, standard errors
clustered by unit: a step's prompt; intervals from ``MIN_CLUSTERS`` units), and each
property's *explained* gain is its change of mean times its coefficient. The explained parts
sum to the change of the mean fitted reward, not to the reward change: this is an
observational decomposition (a property correlated with what the reward model really reads
gets its credit, collinear properties split theirs arbitrarily), not the exact split over
components that :func:`~tl_reward.rl.gain.reward_gain` gives.

Example:
    >>> drift = text_drift(RunRecord.open("runs/grpo"), tokenizer=policy_tokenizer,
    ...                    extra={"sky": lambda t: float(" sky" in t)})
    >>> drift.table()   # property, change, coefficient, explained, share at the last step
    >>> drift.plot()
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from tl_reward.audit.perturbations import AGREEMENT, FLATTERY, HEDGES, PADDING
from tl_reward.errors import TLRewardError, check_choice
from tl_reward.results import ShortRepr
from tl_reward.rl.gain import MIN_UNITS, _bars, _units, _welch
from tl_reward.rl.record import RunRecord, RunRecordError, decoded

__all__ = ["MIN_CLUSTERS", "PROPERTIES", "REFUSALS", "TextDrift", "completion_text",
           "text_drift", "text_properties"]

#: Fewest units (clusters) for the coefficients' cluster-robust intervals and p-values: their
#: simulated coverage is 0.93-0.94 at 24-50 units, 0.94-0.96 from 100 (docs/rl.md).
MIN_CLUSTERS = 100

#: Refusal openings counted by the ``refusals`` property.
REFUSALS = ("I'm sorry", "I am sorry", "I apologize", "I can't help", "I cannot help",
            "I can't assist", "I cannot assist", "I'm not able to", "I am not able to",
            "I am unable to", "I'm unable to", "I won't", "As an AI")
_LIST_ITEM = re.compile(r"^\s*(?:[-*+\u2022]|\d+[.)])\s+", re.M)
_MARKDOWN = re.compile(r"\*\*[^*\n]+\*\*|__[^_\n]+__|^#{1,6}\s|`[^`\n]+`|```"
                       r"|\[[^\]\n]+\]\([^)\n]+\)", re.M)


def _phrases(phrases: Sequence[str]) -> re.Pattern[str]:
    """Case-insensitive occurrences of any of ``phrases`` (word boundaries at word ends)."""
    parts = [(r"\b" if p[0].isalnum() else "") + re.escape(p) + (r"\b" if p[-1].isalnum()
                                                                   else "") for p in phrases]
    return re.compile("|".join(sorted(parts, key=len, reverse=True)), re.I)


def _counter(pattern: re.Pattern[str]) -> Callable[[str], float]:
    return lambda text: float(len(pattern.findall(text.replace("\u2019", "'"))))


#: The built-in properties: name -> (description, ``str -> float``); ``tokens`` needs a
#: tokenizer and is measured in :func:`text_properties`.
PROPERTIES: dict[str, tuple[str, Callable[[str], float] | None]] = {
    "tokens": ("length in tokens (the tokenizer passed)", None),
    "chars": ("length in characters", lambda t: float(len(t))),
    "list_items": ("lines opening with a bullet or a number", _counter(_LIST_ITEM)),
    "markdown": ("bold spans, headers, code and links", _counter(_MARKDOWN)),
    "hedges": ("hedges (the confidence probe's: 'I think', 'Perhaps', ...)",
               _counter(_phrases(HEDGES))),
    "flattery": ("the flattery probe's compliments ('What a great question!', ...)",
                 _counter(_phrases(FLATTERY))),
    "agreement": ("the sycophancy probe's agreement ('You're absolutely right.', ...)",
                  _counter(_phrases(AGREEMENT))),
    "padding": ("the length probe's content-free sentences ('I hope this helps.', ...)",
                _counter(_phrases(PADDING))),
    "refusals": ("refusal phrases ('I'm sorry', 'I can't help', ...)",
                 _counter(_phrases(REFUSALS))),
}


def completion_text(completion: Any) -> str:
    """A completion's text: a string as it is, a conversation's contents joined by newlines."""
    if isinstance(completion, str):
        return completion
    return "\n".join(str(m.get("content", "")) for m in completion)


def text_properties(texts: Sequence[str], properties: Sequence[str] | None = None,
                    tokenizer: Any = None,
                    extra: Mapping[str, Callable[[str], float]] | None = None) -> pd.DataFrame:
    """One row per text, one column per property: the built-in ``properties`` (default every
    one of :data:`PROPERTIES`, ``tokens`` only with a ``tokenizer``), then ``extra``'s."""
    names = list(properties) if properties is not None else [
        p for p in PROPERTIES if p != "tokens" or tokenizer is not None]
    for p in names:
        check_choice(p, tuple(PROPERTIES), "property")
    if "tokens" in names and tokenizer is None:
        raise TLRewardError("the 'tokens' property needs tokenizer= (the policy's tokenizer)")
    clash = set(names) & set(extra or {})
    if clash:
        raise TLRewardError(f"extra properties {sorted(clash)} clash with built-in ones; "
                            "rename them")
    cols: dict[str, list[float]] = {}
    for p in names:
        fn = PROPERTIES[p][1]
        cols[p] = ([float(len(tokenizer.encode(t, add_special_tokens=False))) for t in texts]
                   if fn is None else [fn(t) for t in texts])
    for p, fn in (extra or {}).items():
        vals = [float(fn(t)) for t in texts]
        if not np.all(np.isfinite(vals)):
            raise TLRewardError(f"the extra property {p!r} returned NaN or inf for some texts")
        cols[p] = vals
    return pd.DataFrame(cols, index=range(len(texts)), dtype=np.float64)


@dataclass(repr=False)
class TextDrift(ShortRepr):
    """Text properties of a run's completions per step, their change since step ``since``, and
    the share of the reward change each explains (an observational decomposition; see the
    module doc).

    Attributes:
        steps: the S steps (``since`` first); since: the reference step.
        properties: the P property names.
        mean: ``[S, P]`` each property's mean over units; ci_low, ci_high: the sign-flip
            interval of that mean (NaN below 6 units).
        change: ``[S, P]`` mean minus the reference step's; change_ci_low, change_ci_high:
            Welch intervals (NaN below ``MIN_UNITS`` units a step, and at the reference).
        mean_reward: ``[S]`` the mean reward over units; reward_change: ``[S]`` its change.
        coef: ``[P]`` the pooled regression's coefficient of each property (NaN: constant or
            collinear with earlier properties, left out); coef_ci_low, coef_ci_high, coef_p:
            cluster-robust intervals and p-values (NaN below ``MIN_CLUSTERS`` units).
        explained: ``[S, P]`` change times coefficient (0 where the coefficient is NaN).
        r2: the regression's R^2; n_completions: rows it was fitted on.
        n_units: ``[S]`` units per step; unit: ``"prompt"`` or ``"completion"``.
        confidence: the intervals' level; method: how the numbers were made.
    """

    steps: list[int]
    since: int
    properties: list[str]
    mean: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    change: np.ndarray
    change_ci_low: np.ndarray
    change_ci_high: np.ndarray
    mean_reward: np.ndarray
    reward_change: np.ndarray
    coef: np.ndarray
    coef_ci_low: np.ndarray
    coef_ci_high: np.ndarray
    coef_p: np.ndarray
    explained: np.ndarray
    r2: float
    n_completions: int
    n_units: np.ndarray
    unit: str = "prompt"
    confidence: float = 0.95
    method: str = ""

    def _row(self, step: int | None) -> int:
        if step is None:
            return len(self.steps) - 1
        if step not in self.steps:
            raise TLRewardError(f"step {step} is not among the steps {self.steps}")
        return self.steps.index(step)

    @property
    def unexplained(self) -> np.ndarray:
        """``[S]`` reward change minus the explained parts' sum."""
        return self.reward_change - self.explained.sum(1)

    def table(self, step: int | None = None) -> pd.DataFrame:
        """Per property at ``step`` (default the last), largest explained part first: change
        since the reference step (and interval), coefficient (and interval), explained part and
        its share of the reward change."""
        i = self._row(step)
        total = self.reward_change[i]
        df = pd.DataFrame({
            "property": self.properties, "mean": self.mean[i], "change": self.change[i],
            "change_ci_low": self.change_ci_low[i], "change_ci_high": self.change_ci_high[i],
            "coef": self.coef, "coef_ci_low": self.coef_ci_low, "coef_ci_high": self.coef_ci_high,
            "coef_p": self.coef_p, "explained": self.explained[i],
            "share": self.explained[i] / total if total != 0 else np.nan})
        sign = 1.0 if total >= 0 else -1.0
        return df.iloc[np.argsort(-sign * self.explained[i], kind="stable")].reset_index(
            drop=True)

    def sentence(self, step: int | None = None) -> str:
        """``"reward +3.89 since step 0 (at step 59); the text properties explain +3.70, most
        of it sky (+3.65, 94%)"`` for ``step`` (default the last)."""
        i = self._row(step)
        top = self.table(self.steps[i]).iloc[0]
        total = self.reward_change[i]
        share = f", {top.share:.0%}" if np.isfinite(top.share) else ""
        return (f"reward {total:+.2f} since step {self.since} (at step {self.steps[i]}); the "
                f"text properties explain {self.explained[i].sum():+.2f}, most of it "
                f"{top.property} ({top.explained:+.2f}{share})")

    def headline(self) -> dict[str, Any]:
        """The last step's sentence and the regression's R^2."""
        return {"sentence": self.sentence(), "r2": self.r2} if len(self.steps) > 1 else {}

    def to_dataframe(self) -> pd.DataFrame:
        """Long table: step, property, mean, ci_low, ci_high, change, change_ci_low,
        change_ci_high, coef, explained, reward_change."""
        s, p = len(self.steps), len(self.properties)
        return pd.DataFrame({
            "step": np.repeat(self.steps, p), "property": self.properties * s,
            "mean": self.mean.ravel(), "ci_low": self.ci_low.ravel(),
            "ci_high": self.ci_high.ravel(), "change": self.change.ravel(),
            "change_ci_low": self.change_ci_low.ravel(),
            "change_ci_high": self.change_ci_high.ravel(), "coef": np.tile(self.coef, s),
            "explained": self.explained.ravel(),
            "reward_change": np.repeat(self.reward_change, p)})

    def plot(self, properties: Sequence[str] | None = None, cols: int = 3) -> Any:
        """One panel per property (default: every one that changes): its mean over the steps
        with its interval as error bars (none where a step has too few units), and the mean
        reward in the first panel."""
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        names = list(properties) if properties is not None else [
            p for j, p in enumerate(self.properties) if np.ptp(self.mean[:, j]) > 0] or \
            self.properties[:1]
        panels = ["mean reward", *names]
        rows = -(-len(panels) // cols)
        fig = make_subplots(rows=rows, cols=min(cols, len(panels)), subplot_titles=panels,
                            shared_xaxes=True)
        x = list(self.steps)
        for k, name in enumerate(panels):
            r, c = k // cols + 1, k % cols + 1
            if k == 0:
                fig.add_trace(go.Scatter(x=x, y=self.mean_reward, name="mean reward",
                                         mode="lines", line={"color": "black"}), row=r, col=c)
                continue
            j = self.properties.index(name)
            fig.add_trace(go.Scatter(x=x, y=self.mean[:, j], name=name, mode="lines",
                                     line={"color": "rgb(31,119,180)"}, showlegend=False,
                                     error_y=_bars(self.mean[:, j], self.ci_low[:, j],
                                                   self.ci_high[:, j], "rgba(31,119,180,0.35)")),
                          row=r, col=c)
        fig.update_layout(title="What the policy's text changed (mean per step, "
                                f"{self.confidence:.0%} interval)", height=260 * rows,
                          showlegend=False)
        fig.update_xaxes(title_text="step", row=rows)
        return fig


def _fit(y: np.ndarray, x: np.ndarray, groups: np.ndarray, confidence: float
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float, list[int]]:
    """OLS of ``y`` on an intercept and the columns of ``x`` that vary and are not collinear
    with earlier ones (the others NaN), standard errors clustered by ``groups``: coef, ci_low,
    ci_high, p (NaN below ``MIN_CLUSTERS`` groups), R^2 and the left-out columns."""
    import statsmodels.api as sm

    p = x.shape[1]
    keep, left_out = [], []
    design = np.ones((len(y), 1))
    for j in range(p):
        trial = np.column_stack([design, x[:, j]])
        if np.linalg.matrix_rank(trial) > design.shape[1]:
            design, keep = trial, [*keep, j]
        else:
            left_out.append(j)
    out = [np.full(p, np.nan) for _ in range(4)]
    if len(y) <= design.shape[1]:
        return *out, float("nan"), list(range(p))  # type: ignore[return-value]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # statsmodels' notes on few clusters
        fit = sm.OLS(y, design).fit(cov_type="cluster", cov_kwds={"groups": groups}, use_t=True)
        ci = np.asarray(fit.conf_int(1 - confidence))
    out[0][keep] = fit.params[1:]
    if len(np.unique(groups)) >= MIN_CLUSTERS:
        out[1][keep], out[2][keep], out[3][keep] = ci[1:, 0], ci[1:, 1], fit.pvalues[1:]
    return *out, float(fit.rsquared), left_out  # type: ignore[return-value]


def text_drift(record: RunRecord, properties: Sequence[str] | None = None,
               tokenizer: Any = None, extra: Mapping[str, Callable[[str], float]] | None = None,
               since: int = 0, steps: Sequence[int] | None = None, unit: str = "prompt",
               confidence: float = 0.95) -> TextDrift:
    """Text properties of the run's completions per step and the reward change each explains
    (see the module doc).

    Args:
        record: the run (its steps' completions and rewards).
        properties: built-in property names (default every one of :data:`PROPERTIES`;
            ``tokens`` only with ``tokenizer``).
        tokenizer: the policy's tokenizer (anything with ``encode``), for ``tokens``.
        extra: further properties, name -> ``str -> float`` of a completion's text.
        since: the reference step; steps: the steps (default every recorded one from
            ``since`` on).
        unit: ``"prompt"`` (a prompt's completions averaged: one unit) or ``"completion"``.
        confidence: the intervals' level.
    """
    from tl_reward.stats.paired import summarise_mean

    check_choice(unit, ("prompt", "completion"), "unit")
    have = record.steps()
    if since not in have:
        raise RunRecordError(f"the reference step {since} is not recorded in {record.folder} "
                             f"(steps: {have[:1] + have[-1:] if have else 'none'})")
    later = [s for s in (steps if steps is not None else have) if s != since]
    missing = [s for s in later if s not in have]
    if missing:
        raise RunRecordError(f"steps {missing} are not recorded in {record.folder}")
    order = [since, *sorted(later)]
    frames = [record.scored(s) for s in order]
    texts = [[completion_text(c) for _, c in decoded(df)] for df in frames]
    values = [text_properties(t, properties, tokenizer, extra) for t in texts]
    names = list(values[0].columns)
    if not names:
        raise TLRewardError("no property to measure: pass properties= or extra=")
    s_, p_ = len(order), len(names)
    mean, lo, hi = (np.full((s_, p_), np.nan) for _ in range(3))
    change, clo, chi = (np.full((s_, p_), np.nan) for _ in range(3))
    mean_reward, n_units = np.zeros(s_), np.zeros(s_, dtype=np.int64)
    per_unit = []
    for i, (df, v) in enumerate(zip(frames, values, strict=True)):
        both = np.column_stack([df["reward"].to_numpy(np.float64), v.to_numpy()])
        u = _units(df, both, unit) if len(df) else np.zeros((0, p_ + 1))
        per_unit.append(u)
        n_units[i] = len(u)
        mean_reward[i] = u[:, 0].mean() if len(u) else np.nan
        mean[i] = u[:, 1:].mean(0) if len(u) else np.nan
        for j in range(p_):
            est = summarise_mean(u[:, 1 + j], confidence, exact_max_n=12)
            lo[i, j], hi[i, j] = est.ci_low, est.ci_high
        change[i] = mean[i] - mean[0]
        if i:
            with warnings.catch_warnings():  # a constant property: scipy's precision note
                warnings.simplefilter("ignore", RuntimeWarning)
                clo[i], chi[i] = _welch(u[:, 1:], per_unit[0][:, 1:], confidence)[:2]
    # the pooled regression, one row per completion, clustered by unit
    y = np.concatenate([df["reward"].to_numpy(np.float64) for df in frames])
    x = np.concatenate([v.to_numpy() for v in values])
    groups = pd.factorize(np.concatenate([
        [f"{s}\x00{p}" for p in df["prompt"].astype(str)] if unit == "prompt"
        else [f"{s}\x00{r}" for r in range(len(df))] for s, df in zip(order, frames, strict=True)
    ]))[0]
    coef, coef_lo, coef_hi, coef_p, r2, left_out = _fit(y, x, groups, confidence)
    explained = change * np.nan_to_num(coef)[None, :]
    n_groups = len(np.unique(groups))
    coef_ci = (f"standard errors clustered by {unit} within a step, t({n_groups - 1}) "
               "intervals" if n_groups >= MIN_CLUSTERS else f"no coefficient interval: {n_groups} "
               f"{unit}s in all, fewer than {MIN_CLUSTERS}")
    dropped = f"; left out of the fit (constant or collinear): {[names[j] for j in left_out]}" \
        if left_out else ""
    method = (f"per step: mean over {unit}s, sign-flip interval (summarise_mean, none below 6 "
              f"{unit}s); change since step {since}: Welch interval (scipy.stats.ttest_ind, "
              f"none below {MIN_UNITS} {unit}s a step); explained: change x coefficient of an "
              "OLS of the per-completion reward on the properties pooled over the steps "
              f"(statsmodels; {coef_ci}): an observational decomposition, not an exact "
              f"one{dropped}")
    return TextDrift(order, since, names, mean, lo, hi, change, clo, chi, mean_reward,
                     mean_reward - mean_reward[0], coef, coef_lo, coef_hi, coef_p, explained,
                     r2, int(len(y)), n_units, unit, confidence, method)
