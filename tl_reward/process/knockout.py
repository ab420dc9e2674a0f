"""How much of a step's reward depends on each earlier step: attention knockout.

For step ``k`` and a source group ``g`` (the prompt, a step ``j < k``: its tokens and tag, or
step ``k`` itself: its tokens before the tag that reads the reward),
every attention edge from a position after ``g`` to a position in ``g`` is cut, in every layer
and head (the scores set to ``-inf`` before the softmax, as Geva et al.'s attention knockout).
Nothing after ``g`` can then read ``g`` by any path, so

    ``K_kg = r_k(g knocked out) - r_k``

is the total effect of ``g``'s content on step ``k``'s linear reward, read through the model's
own forward (:func:`step_sources` is the exact split of the last hop; this is the intervention).
A position's own group keeps attending to itself, so no softmax row is ever empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float

from tl_reward.errors import TLRewardError
from tl_reward.model.readout import resolve_objectives
from tl_reward.model.steps import StepRow, StepSpec, step_spans
from tl_reward.process.sources import StepsBySource
from tl_reward.results import ShortRepr


@dataclass(repr=False)
class StepKnockout(StepsBySource, ShortRepr):
    """Each selected step's reward change with each source group knocked out.

    Attributes:
        rows: the (input, step) of each row.
        sources: ``["prompt", "step 0", ...]``.
        objective: the objective read.
        effect: ``[N, S]`` ``r_k(knocked out) - r_k`` (NaN for a step after the row's own).
        reward: ``[N]`` the step's linear reward, nothing knocked out.
    """

    rows: list[StepRow]
    sources: list[str]
    objective: str
    effect: Float[torch.Tensor, "n sources"]
    reward: Float[torch.Tensor, " n"]
    _value = "effect"
    _axis = "knocked out"
    _title = "Step reward change with each source knocked out"

    @property
    def values(self) -> Float[torch.Tensor, "n sources"]:
        return self.effect


@torch.no_grad()
def step_knockout(model: Any, inputs: Any, step: StepSpec = "all",
                  objective: int | str | None = None) -> StepKnockout:
    """Knock out each source group of each selected step (module doc); one batched forward
    per step row (its groups stacked). HookedRewardModel only (it edits the attention scores)."""
    if not getattr(model, "starts_at_layer", False):
        raise TLRewardError("step_knockout edits TransformerLens's attention scores; load the "
                            "model as a HookedRewardModel")
    obj = resolve_objectives(model, objective)[0]
    encoded, rows = model.encode_steps(inputs, step)
    assert rows is not None
    n_src = 1 + max(len(e.read_at) for e in encoded)
    sources = ["prompt", *(f"step {j}" for j in range(n_src - 1))]
    effect = torch.full((len(rows), n_src), float("nan"), dtype=torch.float64)
    reward = torch.zeros(len(rows), dtype=torch.float64)
    device = model.cfg.device
    for i, e in enumerate(encoded):
        groups = step_spans(e)
        groups[-1] = (groups[-1][0], groups[-1][1] - 1)  # the step's own tokens, not its tag
        n = len(e.ids)
        keep = torch.ones(len(groups) + 1, n, n, dtype=torch.bool, device=device)
        pos = torch.arange(n, device=device)
        for g, (lo, hi) in enumerate(groups, start=1):  # row 0: nothing knocked out
            keep[g] &= ~((pos[:, None] >= hi) & (pos[None, :] >= lo) & (pos[None, :] < hi))

        def cut(scores: torch.Tensor, hook: Any, keep: torch.Tensor = keep) -> torch.Tensor:
            return scores.masked_fill(~keep[:, None], float("-inf"))

        tokens = torch.tensor([e.ids], device=device).expand(len(groups) + 1, -1)
        hooks = [(f"blocks.{layer}.attn.hook_attn_scores", cut)
                 for layer in range(model.cfg.n_layers)]
        kind = "score" if obj == "score" else "reward"
        out = model.run_with_hooks(tokens, return_type=kind, fwd_hooks=hooks)
        vals = out if kind == "score" else out[:, model.objective_index(obj)]
        vals = vals.double().cpu()
        reward[i] = vals[0]
        empty = torch.tensor([hi <= lo for lo, hi in groups])
        effect[i, : len(groups)] = torch.where(empty, 0.0, vals[1:] - vals[0])
    return StepKnockout(rows, sources, obj, effect, reward)
