"""Direct reward attribution (DRA): the reward as an exact sum of what each component wrote.

At the pooled position ``t*`` the final residual ``h_L`` is a sum of component outputs ``o_c``
(embeddings, every attention head plus each layer's attention bias, every MLP neuron plus its
bias). With the final norm's scale ``s`` frozen at its value in the run (and ``o_c`` centred
for LayerNorm models), each component's contribution is ``a_c = w . o_c / s`` and
``sum_c a_c + b = r(x)`` exactly, per objective (ArmoRM's ``"score"`` uses ``w_eff(x)``).

A head's output at ``t*`` is ``sum_j A[t*, j] v_j W_O``: a contribution per source position,
giving token-level reward maps per head and, summed over heads and layers, for the whole input.
Unlike raw projections onto the head weight (the published reward-lens), these add up.

Example:
    >>> dra = direct_reward_attribution(model, [("Is the sky blue?", "Yes.")])
    >>> dra.to_dataframe(level="sublayer").head()
    >>> dra.total()  # equals model.rewards(...).rewards
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from jaxtyping import Float, Int

from tl_reward.analysis.components import (
    final_components,
    head_position_projections,
    neuron_projections,
    pooled_run,
    stack_components,
)
from tl_reward.data.pairs import PairBatch, as_pair_batch
from tl_reward.model.heads import objective_slot
from tl_reward.model.inputs import input_batches
from tl_reward.model.readout import ObjectiveSpec, accumulation_dtype, reward_readout
from tl_reward.model.steps import StepRow, StepSpec
from tl_reward.results import PairSides, ShortRepr


@dataclass(repr=False)
class DirectAttribution(ShortRepr):
    """DRA of N inputs (all tensors on CPU, last axis = objective).

    Attributes:
        objectives: the objective names.
        embed: ``[N, E, n_obj]`` embedding terms (named by ``embed_names``).
        heads: ``[N, layer, head, n_obj]`` every attention head.
        attn_bias: ``[N, layer, n_obj]`` every attention layer's output bias.
        mlp: ``[N, layer, n_obj]`` every MLP (bias included).
        bias: ``[N, n_obj]`` the head's own bias ``b``.
        reward: ``[N, n_obj]`` the model's reward, equal to :meth:`total`.
        neurons: ``[N, layer, d_mlp, n_obj]`` per neuron (``mlp_bias`` holds the rest), or None.
        mlp_bias: ``[N, layer, n_obj]`` each MLP's output bias, or None.
        head_positions: per input ``[layer, head, pos, n_obj]``: each head's contribution split
            over the source positions it attends to, or None.
        tokens: per input, its token strings; ``positions``: ``[N]`` the pooled position.
        steps: a process reward model's (input, step) of each row (``step=``), else None.
        read_at: per row, its steps' tag positions (a PRM's step prefixes), else None.
    """

    objectives: list[str]
    embed: Float[torch.Tensor, "n E n_obj"]
    heads: Float[torch.Tensor, "n layer head n_obj"]
    attn_bias: Float[torch.Tensor, "n layer n_obj"]
    mlp: Float[torch.Tensor, "n layer n_obj"]
    bias: Float[torch.Tensor, "n n_obj"]
    reward: Float[torch.Tensor, "n n_obj"]
    positions: Int[torch.Tensor, " n"]
    tokens: list[list[str]]
    embed_names: list[str] = field(default_factory=lambda: ["embed"])
    neurons: Float[torch.Tensor, "n layer d_mlp n_obj"] | None = None
    mlp_bias: Float[torch.Tensor, "n layer n_obj"] | None = None
    head_positions: list[Float[torch.Tensor, "layer head pos n_obj"]] | None = None
    steps: list[StepRow] | None = None
    read_at: list[tuple[int, ...]] | None = None

    def __len__(self) -> int:
        return self.reward.shape[0]

    def _obj(self, objective: int | str) -> int:
        return objective_slot(self.objectives, objective)

    @property
    def attn(self) -> Float[torch.Tensor, "n layer n_obj"]:
        """Each attention layer's contribution (heads plus bias)."""
        return self.heads.sum(2) + self.attn_bias

    def total(self) -> Float[torch.Tensor, "n n_obj"]:
        """Sum of every component plus the bias: equals ``reward`` (the decomposition check)."""
        return self.embed.sum(1) + self.attn.sum(1) + self.mlp.sum(1) + self.bias

    def components(self, level: str = "sublayer") -> tuple[torch.Tensor, list[str]]:
        """``([N, C, n_obj], names)`` at ``level`` ``"sublayer"`` (embeddings, each attention
        layer and MLP), ``"head"`` (embeddings, each head, attention bias, MLP) or ``"neuron"``
        (as ``"head"`` with each MLP split into its neurons and output bias; needs
        ``neurons=True``)."""
        return stack_components(self, level)

    def token_map(self, index: int = 0, objective: int | str = 0) -> pd.DataFrame:
        """Per source token of input ``index``: the summed direct contribution of every head
        attending from ``t*`` to it. ``rest`` (the last row) holds embeddings, MLPs and biases
        at ``t*``; the column sums to the reward."""
        if self.head_positions is None:
            raise ValueError("run direct_reward_attribution(..., per_position=True) for maps")
        k = self._obj(objective)
        per_tok = self.head_positions[index][..., k].sum((0, 1))
        rest = float(self.reward[index, k] - per_tok.sum())
        toks = self.tokens[index][: per_tok.shape[0]]
        df = pd.DataFrame({"position": range(len(toks)), "token": toks,
                           "contribution": per_tok.tolist()})
        tail = pd.DataFrame({"position": [-1], "token": ["<rest at t*>"], "contribution": [rest]})
        return pd.concat([df, tail], ignore_index=True)

    def top_components(self, k: int = 10, index: int = 0, objective: int | str = 0,
                       level: str = "head") -> pd.DataFrame:
        """The ``k`` components of input ``index`` with the largest absolute contribution."""
        vals, names = self.components(level)
        v = vals[index, :, self._obj(objective)]
        order = v.abs().argsort(descending=True)[:k]
        return pd.DataFrame({"component": [names[i] for i in order],
                             "contribution": v[order].tolist()})

    def to_dataframe(self, level: str = "head") -> pd.DataFrame:
        """Long table: input, objective, component, contribution."""
        vals, names = self.components(level)
        rows = [(i, obj, name, float(v)) for i in range(vals.shape[0])
                for k, obj in enumerate(self.objectives)
                for name, v in [*zip(names, vals[i, :, k], strict=True),
                                ("head_bias", self.bias[i, k])]]
        return pd.DataFrame(rows, columns=["input", "objective", "component", "contribution"])

    def plot(self, index: int | None = None, objective: int | str = 0) -> Any:
        """Layer x head heatmap of contributions (mean over inputs when ``index`` is None)."""
        from tl_reward.viz.attribution import head_heatmap

        k = self._obj(objective)
        vals = self.heads[..., k].mean(0) if index is None else self.heads[index, ..., k]
        title = f"Direct reward attribution per head ({self.objectives[k]})"
        return head_heatmap(vals, title=title)


@torch.no_grad()
def _attribute_batch(
    model: Any, tokens: torch.Tensor, mask: torch.Tensor, objectives: ObjectiveSpec,
    neurons: bool, per_position: bool,
) -> dict[str, Any]:
    positions = model.pool_positions(tokens, mask)
    cache = pooled_run(model, tokens, mask, positions, per_position, neurons)
    resid = cache.full[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"]
    ro = reward_readout(model, resid, tokens, mask, objectives, positions)
    comps = final_components(model, cache, ro.positions)
    out: dict[str, Any] = {k: ro.project(getattr(comps, k))
                           for k in ("embed", "heads", "attn_bias", "mlp")}
    out.update(readout=ro, embed_names=comps.embed_names, bias=ro.bias, reward=ro.reward)
    scaled = ro.directions / ro.scale[:, None, None]
    if neurons:
        out["neurons"], out["mlp_bias"] = neuron_projections(model, cache, ro.positions, scaled)
    if per_position:
        out["head_positions"] = head_position_projections(model, cache, ro.positions, scaled)
    return out


def direct_reward_attribution(
    model: Any,
    inputs: Any,
    objectives: ObjectiveSpec = None,
    neurons: bool = False,
    per_position: bool = False,
    batch_size: int = 8,
    progress: bool | None = None,
    step: StepSpec | None = None,
) -> DirectAttribution:
    """Exact direct reward attribution of ``inputs`` (anything ``model.make_batch`` accepts).

    Args:
        objectives: ``None`` (the defaults: the reward, or ``"score"`` and every objective),
            a name or index, or a list.
        neurons: also split every MLP into neurons (``[N, layer, d_mlp, n_obj]``).
        per_position: also split every head over source positions (token maps).
        batch_size: inputs per forward pass.
        step: a process reward model's steps (an index, a list, ``"all"``, ``"last"``): one
            row per selected (input, step), the reward read at that step's tag.
    """
    encoded, step_rows = model.encode_steps(inputs, step)
    parts: list[dict[str, Any]] = []
    for batch in input_batches(model, encoded, batch_size, "attribution", progress):
        part = _attribute_batch(model, batch.tokens, batch.attention_mask, objectives, neurons,
                                per_position)
        part["lengths"] = batch.lengths.tolist()
        parts.append(part)

    acc = accumulation_dtype(model)

    def cat(key: str) -> torch.Tensor:
        return torch.cat([p[key].to(acc).cpu() for p in parts])

    tokens = [model.tokenizer.convert_ids_to_tokens(e.ids) if model.tokenizer is not None
              else [str(t) for t in e.ids] for e in encoded]
    head_positions = [p["head_positions"][i, :, :, :n].to(acc).cpu() for p in parts
                      for i, n in enumerate(p["lengths"])] if per_position else None
    terms = ("embed", "heads", "attn_bias", "mlp", "bias", "reward")  # the fields in order
    return DirectAttribution(
        parts[0]["readout"].objectives, *(cat(k) for k in terms),
        torch.cat([p["readout"].positions.cpu() for p in parts]), tokens, parts[0]["embed_names"],
        cat("neurons") if neurons else None, cat("mlp_bias") if neurons else None, head_positions,
        step_rows, [e.read_at for e in encoded] if any(e.read_at for e in encoded) else None)


@dataclass(repr=False)
class PairAttribution(PairSides, ShortRepr):
    """DRA of the chosen and rejected reply of N preference pairs, and their difference."""

    chosen: DirectAttribution
    rejected: DirectAttribution

    def difference(self, level: str = "sublayer") -> tuple[torch.Tensor, list[str]]:
        """``([N, C, n_obj], names)``: ``a_c(chosen) - a_c(rejected)`` per component; with the
        head-bias difference they sum to the reward margin."""
        c, names = self.chosen.components(level)
        r, _ = self.rejected.components(level)
        return c - r, names

    def headline(self) -> dict[str, Any]:
        """The reward margin per pair and objective."""
        return {"margin": self.margin}

    def to_dataframe(self, level: str = "sublayer") -> pd.DataFrame:
        """Long table: pair, objective, component, chosen, rejected and difference."""
        c, names = self.chosen.components(level)
        r, _ = self.rejected.components(level)
        rows = [(i, obj, name, float(c[i, j, k]), float(r[i, j, k]), float(c[i, j, k] - r[i, j, k]))
                for i in range(c.shape[0]) for k, obj in enumerate(self.objectives)
                for j, name in enumerate(names)]
        return pd.DataFrame(rows, columns=["pair", "objective", "component", "chosen",
                                           "rejected", "difference"])

    def plot(self, index: int | None = None, objective: int | str = 0) -> Any:
        """Layer x head heatmap of the chosen-minus-rejected contributions."""
        from tl_reward.viz.attribution import head_heatmap

        k = self.chosen._obj(objective)
        d = self.chosen.heads[..., k] - self.rejected.heads[..., k]
        vals = d.mean(0) if index is None else d[index]
        return head_heatmap(vals, title=f"DRA difference, chosen - rejected ({self.objectives[k]})")


def differential_attribution(
    model: Any, pairs: Any, objectives: ObjectiveSpec = None, neurons: bool = False,
    per_position: bool = False, batch_size: int = 8, progress: bool | None = None,
    step: StepSpec | None = None,
) -> PairAttribution:
    """DRA of both replies of each preference pair (``PreferencePair`` list or a
    :class:`~tl_reward.data.pairs.PairBatch`)."""
    batch: PairBatch = as_pair_batch(model, pairs, step)
    kw = dict(objectives=objectives, neurons=neurons, per_position=per_position,
              batch_size=batch_size, progress=progress)
    return PairAttribution(
        direct_reward_attribution(model, [torch.tensor(p.chosen_ids) for p in batch], **kw),
        direct_reward_attribution(model, [torch.tensor(p.rejected_ids) for p in batch], **kw))
