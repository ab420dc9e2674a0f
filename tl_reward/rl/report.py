"""One offline HTML page about an RL run: the reward and where its gain comes from, what the
policy's text changed, when the record holds gold scores, the Goodhart curve, and, when it
holds the policy's log-ratio, the policy's implicit reward against the reward model's.

The gain split comes from the record's ``dra:*`` columns (recorded with
``RewardModelFunction(..., decompose=True)``), so no model is needed; a record without them
needs ``model=`` (the reward model it was scored with) to decompose its steps afresh.

Example:
    >>> write_run_report(RunRecord.open("runs/grpo"), "run.html",
    ...                  kl=trainer.state.log_history, tokenizer=policy_tokenizer)
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tl_reward.rl.gain import RewardGain, reward_gain
from tl_reward.rl.goodhart import GoodhartCurve, goodhart_curve
from tl_reward.rl.implicit import ImplicitRewardOverTraining, implicit_reward_over_training
from tl_reward.rl.record import COMPONENT_PREFIX, LOGRATIO, RunRecord
from tl_reward.rl.text import TextDrift, text_drift

__all__ = ["RunReport", "run_report", "write_run_report"]


class RunReport:
    """The analyses of one run a report shows.

    Attributes:
        record: the run; gain: its reward gain since the first step (``None``: fewer than
            two steps); drift: its text drift (``None``: fewer than two steps); curve: its
            Goodhart curve (``None``: no gold scores); implicit: the policy's implicit reward
            over training (``None``: no ``logratio`` column).
    """

    def __init__(self, record: RunRecord, gain: RewardGain | None, drift: TextDrift | None,
                 curve: GoodhartCurve | None,
                 implicit: ImplicitRewardOverTraining | None = None) -> None:
        self.record, self.gain, self.drift, self.curve = record, gain, drift, curve
        self.implicit = implicit

    def __repr__(self) -> str:
        return (f"RunReport({str(self.record.folder)!r}, gain={self.gain is not None}, "
                f"drift={self.drift is not None}, curve={self.curve is not None}, "
                f"implicit={self.implicit is not None})")

    def parts(self) -> list[Any]:
        """The page's parts (HTML strings, figures, tables), in order."""
        rec, steps = self.record, self.record.steps()
        settings = ", ".join(f"{k}={v}" for k, v in rec.identity.settings.items()
                             if not isinstance(v, list | dict))
        out: list[Any] = [
            f"<p>Run record <code>{html.escape(str(rec.folder))}</code>: reward model "
            f"<code>{html.escape(rec.identity.model_name)}</code>, {len(steps)} steps "
            f"({steps[0]} to {steps[-1]}); {html.escape(settings)}.</p>"]
        if self.gain is not None:
            out += ["<h2>Reward and where its gain comes from</h2>",
                    f"<p>{html.escape(self.gain.sentence())}. Each completion's reward is the "
                    "sum of its components' direct contributions, so the change of the mean "
                    "reward splits exactly over them.</p>", self.gain.plot(),
                    self.gain.top(8).round(4)]
        if self.drift is not None:
            out += ["<h2>What the policy's text changed</h2>",
                    f"<p>{html.escape(self.drift.sentence())}. Explained: each property's "
                    "change times its coefficient in a regression of the reward on the "
                    "properties (an observational decomposition, not an exact one; R<sup>2</sup>"
                    f" {self.drift.r2:.2f}).</p>", self.drift.plot(),
                    self.drift.table().round(4)]
        if self.curve is not None:
            out += ["<h2>Proxy against gold</h2>",
                    f"<p>{html.escape(self.curve.sentence())}.</p>", self.curve.plot()]
        if self.implicit is not None:
            out += ["<h2>The policy's implicit reward</h2>",
                    f"<p>{html.escape(self.implicit.sentence())}. The implicit reward is beta "
                    "times the policy's log-ratio to its reference on its own samples, recorded "
                    "during training.</p>", self.implicit.plot()]
        methods = [f"{name}: {r.method}" for name, r in (
            ("Gain", self.gain), ("Text", self.drift), ("Goodhart", self.curve),
            ("Implicit reward", self.implicit)) if r is not None]
        if self.curve is None:
            methods.append("Goodhart: no curve, the record holds no gold scores")
        out.append(f"<p><small>Methods. {html.escape('. '.join(methods))}.</small></p>")
        return out


def run_report(record: RunRecord, model: Any = None, kl: Any = None,
               component: str | None = None, tokenizer: Any = None,
               extra: Mapping[str, Callable[[str], float]] | None = None,
               min_gold_gain: float | None = None) -> RunReport:
    """The gain split, the text drift, (with gold) the Goodhart curve and (with ``logratio``)
    the implicit reward over training of ``record``.

    Args:
        record: the run.
        model: the reward model, for steps recorded without their decomposition.
        kl: the Goodhart curve's x-axis (see :func:`~tl_reward.rl.goodhart.goodhart_curve`).
        component: the component whose lead time to measure (default: the one carrying the
            most of the gain at the last step).
        tokenizer: the policy's tokenizer, for the ``tokens`` property; extra: further text
            properties.
        min_gold_gain: the smallest gold gain that matters, for the curve's ``gold_stalled``.
    """
    steps = record.steps()
    first = record.read(steps[0]) if steps else None
    gain = drift = curve = None
    if len(steps) > 1:
        gain = reward_gain(record, since=steps[0], model=model, progress=False)
        drift = text_drift(record, tokenizer=tokenizer, extra=extra, since=steps[0])
    if first is not None and "gold" in first:
        if component is None and gain is not None:
            component = str(gain.top(1).iloc[0].component)
        curve = goodhart_curve(record, kl=kl, component=component if gain else None, gain=gain,
                               min_gold_gain=min_gold_gain)
    implicit = implicit_reward_over_training(record) \
        if first is not None and LOGRATIO in first else None
    return RunReport(record, gain, drift, curve, implicit)


def has_decomposition(record: RunRecord) -> bool:
    """Whether every step of ``record`` holds its components' contributions."""
    return all(any(c.startswith(COMPONENT_PREFIX) for c in record.read(s).columns)
               for s in record.steps())


def write_run_report(record: RunRecord, path: str | Path, offline: bool = True,
                     **kwargs: Any) -> Path:
    """Write ``record``'s run report (:func:`run_report`'s keywords) to ``path`` as one HTML
    file (offline: plotly embedded); returns the path."""
    from tl_reward.viz.html import save_html

    report = run_report(record, **kwargs)
    return save_html(path, *report.parts(), title=f"RL run: {record.folder.name}",
                     offline=offline)
