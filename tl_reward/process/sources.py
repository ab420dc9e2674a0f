"""Which step a step's reward is read from: the prompt, each step so far, or the tag itself.

Every head's direct contribution at step ``k``'s tag is ``sum_j A[t_k, j] v_j W_O`` (direct
reward attribution per source position). Grouping the source positions -- the prompt
(everything before the reply), step ``j`` (after step ``j - 1``'s tag up to and including step
``j``'s) -- splits step ``k``'s linear reward exactly:

    ``r_k = prompt + sum_{j <= k} S_kj + local + b``

where ``local`` is what embeddings, MLPs and attention biases write at the tag itself and ``b``
the head's bias. The split follows the last attention hop: a position read by a head may itself
hold what an earlier layer read from elsewhere (patching answers that: :func:`step_propagation`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from jaxtyping import Float

from tl_reward.analysis.attribution import direct_reward_attribution
from tl_reward.model.readout import resolve_objectives
from tl_reward.model.steps import StepRow, StepSpec, step_spans
from tl_reward.results import ShortRepr


class StepsBySource:
    """A ``[N, S]`` table of selected steps (``rows``) by source group (``sources``) in
    :attr:`values`, NaN where a source comes after the row's step: the long table, one input's
    matrix and its heatmap, as :class:`StepSources` and
    :class:`~tl_reward.process.knockout.StepKnockout` show them."""

    rows: list[StepRow]
    sources: list[str]
    objective: str
    #: what a value is (the long table's column) and the heatmap's axis labels and title
    _value = "contribution"
    _axis = "read from"
    _title = "Where each step's reward is read from"

    @property
    def values(self) -> Float[torch.Tensor, "n sources"]:
        raise NotImplementedError

    def to_dataframe(self) -> pd.DataFrame:
        """Long table: input, step, source, value (NaN sources left out)."""
        out = [(r.item, r.step, name, float(v)) for i, r in enumerate(self.rows)
               for name, v in zip(self.sources, self.values[i], strict=True)
               if not torch.isnan(v)]
        return pd.DataFrame(out, columns=["input", "step", "source", self._value])

    def matrix(self, item: int = 0) -> pd.DataFrame:
        """Steps of input ``item`` (rows) by source (columns)."""
        idx = [i for i, r in enumerate(self.rows) if r.item == item]
        return pd.DataFrame(self.values[idx].numpy(), columns=self.sources,
                            index=[f"step {self.rows[i].step}" for i in idx])

    def plot(self, item: int = 0) -> Any:
        """Heatmap of :meth:`matrix`."""
        import plotly.express as px

        m = self.matrix(item)
        lim = float(m.abs().max().max()) or 1.0
        return px.imshow(m, color_continuous_scale="RdBu", zmin=-lim, zmax=lim, aspect="auto",
                         labels={"x": self._axis, "y": "reward of", "color": self._value},
                         title=f"{self._title} ({self.objective})")


@dataclass(repr=False)
class StepSources(StepsBySource, ShortRepr):
    """Each selected step's linear reward split by where it is read from.

    Attributes:
        rows: the (input, step) of each row.
        sources: ``["prompt", "step 0", ..., "local", "bias"]``.
        objective: the objective decomposed.
        parts: ``[N, S]`` each source's part (NaN for a step after the row's own).
        reward: ``[N]`` the step's linear reward; each row of ``parts`` sums to it.
    """

    rows: list[StepRow]
    sources: list[str]
    objective: str
    parts: Float[torch.Tensor, "n sources"]
    reward: Float[torch.Tensor, " n"]

    @property
    def values(self) -> Float[torch.Tensor, "n sources"]:
        return self.parts

    def total(self) -> Float[torch.Tensor, " n"]:
        """Each row's parts summed (NaN skipped): equals :attr:`reward`."""
        return self.parts.nan_to_num(0.0).sum(1)

    def own_step(self) -> Float[torch.Tensor, " n"]:
        """``[N]`` what each step's reward reads from the step itself (its tokens and tag)."""
        return torch.stack([self.parts[i, 1 + r.step] for i, r in enumerate(self.rows)])


def step_sources(model: Any, inputs: Any, step: StepSpec = "all",
                 objective: int | str | None = None, batch_size: int = 8) -> StepSources:
    """Split each selected step's linear reward by source step (see the module doc), from one
    direct reward attribution per source position."""
    obj = resolve_objectives(model, objective)[0]
    dra = direct_reward_attribution(model, inputs, objectives=obj, per_position=True,
                                    batch_size=batch_size, step=step)
    encoded, rows = model.encode_steps(inputs, step)
    assert rows is not None and dra.read_at is not None and dra.head_positions is not None
    n_steps = max(len(e.read_at) for e in encoded)
    sources = ["prompt", *(f"step {j}" for j in range(n_steps)), "local", "bias"]
    values = torch.full((len(rows), len(sources)), float("nan"), dtype=dra.reward.dtype)
    for i, e in enumerate(encoded):
        per_pos = dra.head_positions[i][..., 0].sum((0, 1))
        for g, (lo, hi) in enumerate(step_spans(e)):  # the prompt, then each step
            values[i, g] = per_pos[lo:hi].sum()
        values[i, -2] = (dra.embed[i, :, 0].sum() + dra.attn_bias[i, :, 0].sum()
                         + dra.mlp[i, :, 0].sum())
        values[i, -1] = dra.bias[i, 0]
    return StepSources(rows, sources, obj, values, dra.reward[:, 0])
