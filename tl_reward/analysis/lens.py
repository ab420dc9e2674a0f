"""Reward lens: the reward read from the residual stream after every layer.

``r_l = w . N(h_l) + b`` at the pooled token ``t*``, for ``l = 0`` (embeddings) to ``L`` (the
final residual), per objective. Two scale conventions:

* ``frozen``: divide by the *final* layer's norm scale ``s_L`` (centring for LayerNorm). The
  lens is then linear in ``h_l``, its last value is the reward, and consecutive differences
  are exactly each block's direct contribution: a decomposition of the reward.
* ``recompute``: apply the final norm afresh to ``h_l`` (the logit-lens convention). Earlier
  layers have smaller norms, so this rescales them; only the last value is the reward.

For ArmoRM's ``"score"`` the direction is ``w_eff(x)`` of the full run (the gate reads the
final layer), held fixed across layers. For an MLP head (INF-ORM) the direction is the head's
linearisation at the final layer's pooled input, ``w_eff(x_L) = W1^T D(x_L) w2``: on an
intermediate layer both conventions read ``h_l`` through the *final* layer's ReLU pattern. The
third convention ``head`` (nonlinear heads only) runs the whole head on ``N(h_l)`` instead,
recomputing its pattern at every layer; like ``recompute`` only its last value is the reward.

On preference pairs, the differential lens ``D_l = r_l(chosen) - r_l(rejected)``, its
increments, and the crystallisation layer: the first ``l`` whose ``D_l`` reaches ``fraction``
of ``D_L`` with the same sign.

Example:
    >>> lens = reward_lens(model, [("Is the sky blue?", "Yes.")])
    >>> lens.values["frozen"][0, -1]   # == the reward
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from jaxtyping import Float

from tl_reward.data.pairs import as_pair_batch
from tl_reward.model.heads import objective_slot
from tl_reward.model.inputs import cached_batches
from tl_reward.model.readout import ObjectiveSpec, accumulation_dtype, normalise, reward_readout
from tl_reward.model.steps import StepRow, StepSpec
from tl_reward.results import PairSides, ShortRepr

CONVENTIONS = ("frozen", "recompute")


@dataclass(repr=False)
class PooledResiduals(ShortRepr):
    """The residual stream at the pooled token after every layer, with the reward readout.

    Attributes:
        resid: ``[N, L + 1, d_model]`` (index 0: embeddings; index l: after block l - 1).
        scale: ``[N]`` final norm scale; ``directions``: ``[N, n_obj, d_model]``;
        bias, reward: ``[N, n_obj]``; objectives: names.
    """

    resid: Float[torch.Tensor, "n layer1 d_model"]
    scale: Float[torch.Tensor, " n"]
    directions: Float[torch.Tensor, "n n_obj d_model"]
    bias: Float[torch.Tensor, "n n_obj"]
    reward: Float[torch.Tensor, "n n_obj"]
    objectives: list[str]


@torch.no_grad()
def pooled_residuals(
    model: Any, inputs: Any, objectives: ObjectiveSpec = None, batch_size: int = 8,
    progress: bool | None = None, step: StepSpec | None = None,
) -> PooledResiduals:
    """Collect :class:`PooledResiduals` for ``inputs`` (anything ``model.make_batch`` takes;
    ``step``: a process reward model's steps, one row per selected (input, step))."""
    encoded = model.encode_steps(inputs, step)[0]
    n_layers = model.cfg.n_layers
    names = [f"blocks.{i}.hook_resid_pre" for i in range(n_layers)]
    names.append(f"blocks.{n_layers - 1}.hook_resid_post")
    keep = set(names)
    parts = []
    for batch, cache in cached_batches(model, encoded, batch_size, keep, "reward lens", progress):
        ro = reward_readout(model, cache[names[-1]], batch.tokens, batch.attention_mask,
                            objectives)
        rows = torch.arange(batch.tokens.shape[0], device=batch.tokens.device)
        resid = torch.stack([cache[n][rows, ro.positions] for n in names], 1)
        parts.append((resid, ro))
    acc = accumulation_dtype(model)
    return PooledResiduals(
        torch.cat([p[0].to(acc).cpu() for p in parts]),
        *(torch.cat([getattr(p[1], k).to(acc).cpu() for p in parts])
          for k in ("scale", "directions", "bias", "reward")), parts[0][1].objectives)


@dataclass(repr=False)
class RewardLens(ShortRepr):
    """Lens values of N inputs.

    Attributes:
        values: convention -> ``[N, L + 1, n_obj]`` (layer 0 = embeddings).
        reward: ``[N, n_obj]`` the model's rewards (equal to the last lens value).
        objectives: names; ``layer_names``: ``["embed", "L0", ..., "L{L-1}"]`` (after block).
        steps: a process reward model's (input, step) of each row (``step=``), else None.
    """

    values: dict[str, Float[torch.Tensor, "n layer1 n_obj"]]
    reward: Float[torch.Tensor, "n n_obj"]
    objectives: list[str]
    layer_names: list[str]
    steps: list[StepRow] | None = None

    def _obj(self, objective: int | str) -> int:
        return objective_slot(self.objectives, objective)

    def increments(self, convention: str = "frozen") -> Float[torch.Tensor, "n layer n_obj"]:
        """What each block adds to the lens (``frozen``: its exact direct contribution)."""
        return self.values[convention].diff(dim=1)

    def to_dataframe(self) -> pd.DataFrame:
        """Long table: input, objective, layer, frozen and recompute values."""
        f, r = self.values["frozen"], self.values["recompute"]
        rows = [(i, obj, li, name, float(f[i, li, k]), float(r[i, li, k]))
                for i in range(f.shape[0]) for k, obj in enumerate(self.objectives)
                for li, name in enumerate(self.layer_names)]
        return pd.DataFrame(rows, columns=["input", "objective", "layer", "layer_name", "frozen",
                                           "recompute"])

    def plot(self, objective: int | str = 0) -> Any:
        """Lens curves per input, both conventions."""
        from tl_reward.viz.lens import lens_figure

        k = self._obj(objective)
        return lens_figure({c: v[..., k] for c, v in self.values.items()}, self.layer_names,
                           title=f"Reward lens ({self.objectives[k]})")


def lens_from_residuals(model: Any, pooled: PooledResiduals) -> RewardLens:
    """Both lens conventions from collected residuals."""
    w = pooled.directions
    frozen = torch.einsum("nld,nkd->nlk", pooled.resid, w) / pooled.scale[:, None, None]
    rec = torch.einsum("nld,nkd->nlk", normalise(model, pooled.resid), w)
    bias = pooled.bias[:, None]
    names = ["embed"] + [f"L{i}" for i in range(pooled.resid.shape[1] - 1)]
    values = {"frozen": frozen + bias, "recompute": rec + bias}
    if getattr(model.reward_head, "nonlinear", False):
        values["head"] = _recomputed_head(model, pooled)
    return RewardLens(values, pooled.reward, pooled.objectives, names)


@torch.no_grad()
def _recomputed_head(model: Any, pooled: PooledResiduals) -> Float[torch.Tensor, "n layer1 n_obj"]:
    """The whole (nonlinear) head on ``N(h_l)`` at every layer, per objective."""
    head = model.reward_head
    device = model.cfg.device
    n = pooled.resid.shape[0]
    out = head.outputs(normalise(model, pooled.resid.to(device))).float()  # [n, L + 1, K]
    probe_t = torch.zeros(n, 1, dtype=torch.long, device=device)
    probe_x = torch.zeros(n, 1, model.cfg.d_model, device=device)
    c = torch.stack([head.objective_weights(name, probe_x, probe_t).float()
                     for name in pooled.objectives], 1)  # [n, n_obj, K]
    return torch.einsum("nlk,nok->nlo", out, c).cpu()


def reward_lens(
    model: Any, inputs: Any, objectives: ObjectiveSpec = None, batch_size: int = 8,
    progress: bool | None = None, step: StepSpec | None = None,
) -> RewardLens:
    """The reward lens of ``inputs`` in both scale conventions (``step``: a process reward
    model's steps, one row per selected (input, step), named in ``.steps``)."""
    lens = lens_from_residuals(model, pooled_residuals(model, inputs, objectives, batch_size,
                                                       progress, step))
    if step is not None:
        lens.steps = model.at_steps(inputs, step)[1]
    return lens


@dataclass(repr=False)
class PairLens(PairSides, ShortRepr):
    """Reward lens of the chosen and rejected replies of N pairs."""

    chosen: RewardLens
    rejected: RewardLens

    def headline(self) -> dict[str, Any]:
        """The final margin ``D_L`` per pair and objective, and the crystallisation layer."""
        return {"margin": self.differential()[:, -1],
                "crystallisation_layer": self.crystallisation_layer()}

    def differential(self, convention: str = "frozen") -> Float[torch.Tensor, "n layer1 n_obj"]:
        """``D_l = r_l(chosen) - r_l(rejected)``; its last layer is the reward margin."""
        return self.chosen.values[convention] - self.rejected.values[convention]

    def increments(self, convention: str = "frozen") -> Float[torch.Tensor, "n layer n_obj"]:
        """``D_{l+1} - D_l``: what each block adds to the margin."""
        return self.differential(convention).diff(dim=1)

    def crystallisation_layer(self, fraction: float = 0.5, convention: str = "frozen"
                              ) -> torch.Tensor:
        """``[N, n_obj]`` index (into ``layer_names``) of the first layer whose ``D_l`` reaches
        ``fraction`` of the final margin with its sign; -1 when the margin is 0."""
        d = self.differential(convention)
        final = d[:, -1:]
        reached = (d * final.sign()) >= fraction * final.abs()
        first = reached.float().argmax(1)
        return torch.where(final[:, 0] == 0, torch.full_like(first, -1), first).long()

    def to_dataframe(self, convention: str = "frozen") -> pd.DataFrame:
        """Long table: pair, objective, layer, D_l and the crystallisation layer."""
        d = self.differential(convention)
        cryst = self.crystallisation_layer(convention=convention)
        names = self.chosen.layer_names
        rows = [(i, obj, li, names[li], float(d[i, li, k]), names[int(cryst[i, k])])
                for i in range(d.shape[0]) for k, obj in enumerate(self.objectives)
                for li in range(d.shape[1])]
        return pd.DataFrame(rows, columns=["pair", "objective", "layer", "layer_name",
                                           "differential", "crystallisation_layer"])

    def plot(self, objective: int | str = 0, convention: str = "frozen") -> Any:
        """The differential lens per pair, crystallisation layers marked."""
        from tl_reward.viz.lens import differential_figure

        k = self.chosen._obj(objective)
        return differential_figure(self.differential(convention)[..., k],
                                   self.crystallisation_layer(convention=convention)[:, k],
                                   self.chosen.layer_names,
                                   title=f"Differential reward lens ({self.objectives[k]}, "
                                         f"{convention})")


def differential_lens(
    model: Any, pairs: Any, objectives: ObjectiveSpec = None, batch_size: int = 8,
    progress: bool | None = None,
    step: StepSpec | None = None,
) -> PairLens:
    """The reward lens of both replies of each preference pair."""
    batch = as_pair_batch(model, pairs, step)
    chosen = [torch.tensor(p.chosen_ids) for p in batch]
    rejected = [torch.tensor(p.rejected_ids) for p in batch]
    return PairLens(reward_lens(model, chosen, objectives, batch_size, progress),
                    reward_lens(model, rejected, objectives, batch_size, progress))


__all__ = ["CONVENTIONS", "PairLens", "PooledResiduals", "RewardLens", "differential_lens",
           "lens_from_residuals", "pooled_residuals", "reward_lens"]
