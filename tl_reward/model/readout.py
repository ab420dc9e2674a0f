"""The reward readout at the pooled token: frozen final-norm scale, objective directions, bias.

Every objective is linear in the normed final residual at the pooled position ``t*``:
``r_k(x) = w_k . N(h_L) + b_k`` with ``N(h) = h / s`` (RMSNorm) or ``(h - mean h) / s``
(LayerNorm); for ArmoRM's ``"score"`` the direction is the prompt-dependent ``w_eff(x)``.
Centring ``h`` is the same as centring ``w`` (``w . (h - mean h) = (w - mean w) . h``), so a
:class:`Readout` stores centred directions for LayerNorm models and projects any vector ``o``
written into the residual stream as ``w_k . o / s``: the frozen-scale convention under which
component contributions add up to the reward exactly.

This is the one readout every analysis uses (rewards, DRA, lens, patching, attribution patching,
direct-path, SAE splices): the pooled position comes from the model's pooling rule
(:meth:`HookedRewardModel.pool_positions`), never from "the last position", and everything is
computed in float32 (float64 for a float64 model) whatever the weights' dtype, as
TransformerLens computes its norm scales.

The reward is what the model's own ``ln_final`` and head record. Applying the norm afresh is a
shortcut taken only while nothing is attached to them (:func:`readout_attachment`); with a hook
or a replaced module there, :func:`read_rewards` runs the modules themselves, and the
decompositions (:func:`reward_readout`), whose frozen-scale identity no longer holds, refuse.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int

from tl_reward import tl_backend
from tl_reward.errors import TLRewardError, UnknownObjectiveError
from tl_reward.results import ShortRepr

ObjectiveSpec = int | str | Sequence[int | str] | None


def accumulation_dtype(model: object) -> torch.dtype:
    """The dtype readouts, effects and attributions are accumulated in: float64 for a float64
    model, float32 otherwise (bfloat16 keeps ~3 significant digits: 2^-8 relative per rounding)."""
    dtype = model.cfg.dtype  # type: ignore[attr-defined]
    return torch.float64 if dtype == torch.float64 else torch.float32


def readout_attachment(model: object) -> str | None:
    """What makes the model's final norm or head differ from the afresh readout: the first
    hook or replaced module in ``ln_final``, ``unembed`` or ``reward_head``, or a global
    module hook (:func:`~tl_reward.tl_backend.attachments`); ``None`` when stock."""
    found = tl_backend.attachments(model, only=("ln_final", "unembed", "reward_head"))
    return found[0] if found else None


def is_layernorm(model: object) -> bool:
    """True when the model's norms centre their input (LayerNorm), False for RMSNorm."""
    return str(model.cfg.normalization_type).startswith("LN")  # type: ignore[attr-defined]


def norm_scale(
    model: object, h: Float[torch.Tensor, "... d_model"]
) -> Float[torch.Tensor, "... 1"]:
    """The final norm's scale ``s`` for residual vectors ``h`` (as ``ln_final.hook_scale``),
    computed in float32 at least, as TransformerLens does."""
    h = h.to(torch.promote_types(h.dtype, torch.float32))
    if is_layernorm(model):
        h = h - h.mean(-1, keepdim=True)
    return (h.pow(2).mean(-1, keepdim=True) + model.cfg.eps).sqrt()  # type: ignore[attr-defined]


def normalise(
    model: object, h: Float[torch.Tensor, "... d_model"]
) -> Float[torch.Tensor, "... d_model"]:
    """Apply the final norm afresh (gain already folded into ``W_U``), in float32 at least."""
    h = h.to(torch.promote_types(h.dtype, torch.float32))
    centred = h - h.mean(-1, keepdim=True) if is_layernorm(model) else h
    return centred / norm_scale(model, h)


def default_objectives(model: object) -> list[str]:
    """The objectives analyses report by default: the single reward for K = 1; otherwise the
    combined ``"score"`` when the head has one, followed by every objective."""
    names = list(model.objectives)  # type: ignore[attr-defined]
    if len(names) == 1:
        return names
    return (["score"] if model.reward_head.has_score else []) + names  # type: ignore[attr-defined]


def resolve_objectives(model: object, objectives: ObjectiveSpec) -> list[str]:
    """Objective names from ``None`` (defaults), one name or index, or a list of them."""
    if objectives is None:
        return default_objectives(model)
    items = [objectives] if isinstance(objectives, (str, int)) else list(objectives)
    if not items:
        raise UnknownObjectiveError("objectives is empty; pass None for the defaults")
    return [o if o == "score" else model.objectives[model.objective_index(o)]  # type: ignore[attr-defined]
            for o in items]


@dataclass(repr=False)
class Readout(ShortRepr):
    """How the reward is read from the final residual of a batch.

    Attributes:
        positions: pooled position ``t*`` of each row.
        scale: the final norm's scale at ``t*`` (frozen in every decomposition).
        directions: ``[batch, n_obj, d_model]`` objective directions (centred for LayerNorm).
        bias: ``[batch, n_obj]`` the head's bias per objective.
        objectives: the objective names.
        reward: ``[batch, n_obj]`` the model's rewards, ``directions . h_L / scale + bias``.
    """

    positions: Int[torch.Tensor, " batch"]
    scale: Float[torch.Tensor, " batch"]
    directions: Float[torch.Tensor, "batch n_obj d_model"]
    bias: Float[torch.Tensor, "batch n_obj"]
    objectives: list[str]
    reward: Float[torch.Tensor, "batch n_obj"]

    def project(self, x: Float[torch.Tensor, "batch *rest d_model"]) -> torch.Tensor:
        """``w_k . x / s`` for vectors written into the residual: ``[batch, *rest, n_obj]``."""
        flat = x.reshape(x.shape[0], -1, x.shape[-1]).to(self.directions.dtype)
        out = torch.einsum("bnd,bkd->bnk", flat, self.directions) / self.scale[:, None, None]
        return out.reshape(*x.shape[:-1], self.directions.shape[1])


def reward_readout(
    model: object,
    resid_final: Float[torch.Tensor, "batch pos d_model"],
    tokens: Int[torch.Tensor, "batch pos"],
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    objectives: ObjectiveSpec = None,
    positions: Int[torch.Tensor, " batch"] | None = None,
) -> Readout:
    """The :class:`Readout` of a batch from its final residual stream (``hook_resid_post`` of
    the last block), at the pooled token of the model's rule; differentiable in
    ``resid_final`` (the norm scale and, for ArmoRM, the gate included)."""
    attached = readout_attachment(model)
    if attached is not None:
        raise TLRewardError(
            f"{attached} changes how this model reads its reward, so the frozen-scale "
            "decomposition of the reward (direct attribution, lens, direct-path and SAE "
            "attribution) no longer adds up to it; remove it (model.reset_hooks()) or use "
            "activation patching, which reads the reward through the hooked forward")
    names = resolve_objectives(model, objectives)
    if positions is None:
        positions = model.pool_positions(tokens, attention_mask)  # type: ignore[attr-defined]
    acc = accumulation_dtype(model)
    resid_final = resid_final.to(acc)
    normed = normalise(model, resid_final)
    rows = torch.arange(tokens.shape[0], device=resid_final.device)
    positions = positions.to(resid_final.device)
    h = resid_final[rows, positions]
    scale = norm_scale(model, h)[:, 0]
    ws, bs = zip(*(model.reward_direction(name, normed, tokens, positions)  # type: ignore[attr-defined]
                   for name in names), strict=True)
    directions = torch.stack([w.to(acc) for w in ws], 1)
    if is_layernorm(model):
        directions = directions - directions.mean(-1, keepdim=True)
    bias = torch.stack([b.to(acc) for b in bs], 1)
    reward = torch.einsum("bd,bkd->bk", h, directions) / scale[:, None] + bias
    return Readout(positions, scale, directions, bias, names, reward)


def read_rewards(
    model: object,
    resid_final: Float[torch.Tensor, "batch pos d_model"],
    tokens: Int[torch.Tensor, "batch pos"],
    positions: Int[torch.Tensor, " batch"],
    normed: Float[torch.Tensor, "batch pos d_model"] | None = None,
) -> tuple[Float[torch.Tensor, "batch K"], Float[torch.Tensor, " batch"] | None]:
    """``(rewards [batch, K], score [batch] or None)`` at ``positions``: what the model's own
    ``ln_final`` and head record, accumulated in float32 (float64 for a float64 model).

    While nothing is attached to the norm or head (:func:`readout_attachment`), the norm is
    applied afresh in float32 (no rounding to the weights' dtype) and an MLP head is read
    through its exact linearisation. Otherwise ``normed`` (the forward's own ``ln_final``
    output, computed here when not given) is read through the head's hooked modules
    (``unembed``, or the MLP head's ``hook_pre``/``hook_post``), as the forward does.
    ``resid_final`` may hold only the pooled rows (``[batch, 1, d_model]``, ``positions`` 0)
    unless the head's combination reads the states (ArmoRM's gate).
    """
    acc = accumulation_dtype(model)
    head = model.reward_head  # type: ignore[attr-defined]
    rows = torch.arange(resid_final.shape[0], device=resid_final.device)
    positions = positions.to(resid_final.device)
    if normed is None and readout_attachment(model) is not None:
        normed = model.ln_final(resid_final)  # type: ignore[attr-defined]
    if normed is None:
        x = normalise(model, resid_final[rows, positions].to(acc))
        if head.nonlinear:
            w, b = head.linearise(x)
            rewards = torch.einsum("bkd,bd->bk", w.to(acc), x) + b.to(acc)
        else:
            w_u, b_u = model.folded_head  # type: ignore[attr-defined]
            rewards = x @ w_u.to(acc) + b_u.to(acc)
    else:
        x = normed[rows, positions].to(acc)
        unembed = model.unembed  # type: ignore[attr-defined]
        if head.nonlinear:
            rewards = head.outputs(normed[rows, positions]).to(acc)
        elif any(m._forward_hooks or m._forward_pre_hooks for m in unembed.modules()):
            rewards = unembed(normed[rows, positions][:, None])[:, 0].to(acc)
        else:  # the same product in float32
            rewards = x @ unembed.W_U.to(acc) + unembed.b_U.to(acc)
    if not head.has_score:
        return rewards, None
    if not head.reads_states:
        states = x[:, None]
    else:
        states = normalise(model, resid_final) if normed is None else normed.to(acc)
    c = head.combination(states, tokens).to(acc)
    return rewards, (rewards * c).sum(-1)


def objective_at_pooled(
    model: object,
    resid_final: Float[torch.Tensor, "batch pos d_model"],
    tokens: Int[torch.Tensor, "batch pos"],
    attention_mask: Int[torch.Tensor, "batch pos"] | None,
    objectives: ObjectiveSpec,
) -> Float[torch.Tensor, "batch n_obj"]:
    """The objectives of each row at the pooled token, as :func:`read_rewards` reads them
    (the model's own hooked norm and head when anything is attached; differentiable)."""
    names = resolve_objectives(model, objectives)
    positions = model.pool_positions(tokens, attention_mask)  # type: ignore[attr-defined]
    rewards, score = read_rewards(model, resid_final, tokens, positions)
    return torch.stack([score if n == "score" else rewards[:, model.objective_index(n)]  # type: ignore[attr-defined]
                        for n in names], 1)


def normalised_effect(
    value: torch.Tensor, delta: float, what: str = "effects"
) -> torch.Tensor:
    """``value / delta`` for effects normalised by a clean margin; NaN (with a warning naming
    the likely cause) when the margin is exactly 0."""
    if delta == 0.0:
        warnings.warn(
            f"the clean reward margin is exactly 0, so normalised {what} are undefined (NaN); "
            "the raw patched values are still reported. With a pooling rule that reads the "
            "reward inside the shared prompt (e.g. pooling='legacy' when the pad token closes "
            "every turn) both replies score the same",
            RuntimeWarning, stacklevel=3,
        )
        return torch.full_like(value, float("nan"))
    return value / delta
