"""``HookedSAERewardModel``: a reward model on SAELens's ``HookedSAETransformer``.

The class inherits from both :class:`~tl_reward.model.hooked_reward_model.HookedRewardModel`
(reward head, pooling, inputs, ``return_type="reward"``/``"score"``) and SAELens's
``HookedSAETransformer`` (``add_sae``, ``reset_saes``, ``saes()``, ``run_with_saes``,
``run_with_cache_with_saes``, ``use_error_term``). The method resolution order is
``HookedSAERewardModel -> HookedRewardModel -> HookedSAETransformer -> HookedTransformer``:
our ``forward`` pools the head outputs and SAELens's ``forward`` (its special-token masks) runs
underneath it, so an attached SAE sees every position of the batch.

With ``use_error_term=True`` an attached SAE adds its reconstruction error back, so rewards
equal the plain model's; with it off, the SAE's reconstruction replaces the activation.

Example:
    >>> model = HookedSAERewardModel.from_pretrained("tl-reward/smollm2-135m-hh")
    >>> sae = SAE.load_from_disk("my_sae")          # hook_name in sae.cfg.metadata
    >>> batch = model.make_batch([("Hi?", "Hello!")])
    >>> model.run_with_saes(batch.tokens, attention_mask=batch.attention_mask,
    ...                     saes=[sae], use_error_term=True, return_type="reward")
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from typing import Any

import torch

from tl_reward.errors import SAEError, require_sae_lens

require_sae_lens()  # a clear refusal where SAELens cannot be imported (TransformerLens 4)

from sae_lens import SAE, HookedSAETransformer  # noqa: E402

from tl_reward.model.hooked_reward_model import HookedRewardModel  # noqa: E402

_BLOCK = re.compile(r"^blocks\.(\d+)\.(.+)$")


class SAEHookError(SAEError):
    """An SAE that does not fit this model: not a SAELens SAE, no or unknown hook, wrong width."""


def hook_width(cfg: Any, hook: str, reshape: str = "none") -> int | None:
    """The last-axis width of ``hook``'s activation as an SAE reads it: ``d_mlp`` inside the
    MLP (``mlp.hook_pre``, ``hook_pre_linear``, ``hook_post``), ``d_head`` per head at the
    attention's q/k/v/z hooks (times the heads with ``reshape="hook_z"``), 1 for norm scales,
    None for attention scores and patterns (no fixed width), else ``d_model``."""
    leaf = hook.rsplit(".", 1)[-1]
    kv = cfg.n_key_value_heads or cfg.n_heads
    heads = {"hook_q": cfg.n_heads, "hook_rot_q": cfg.n_heads, "hook_z": cfg.n_heads,
             "hook_k": kv, "hook_rot_k": kv, "hook_v": kv}
    if ".mlp." in hook and leaf in ("hook_pre", "hook_pre_linear", "hook_post"):
        return int(cfg.d_mlp)
    if ".attn." in hook and leaf in heads:
        return cfg.d_head * (heads[leaf] if reshape == "hook_z" else 1)
    if leaf in ("hook_attn_scores", "hook_pattern"):
        return None
    return 1 if leaf == "hook_scale" else int(cfg.d_model)


def hook_hint(hook: str, names: Iterable[str]) -> str:
    """What to write instead of the unknown ``hook``: the closest of the model's hook ``names``
    (difflib) and the nearest forms they take, each block hook with its layer range
    (``blocks.{0..L-1}.hook_resid_post``)."""
    names = list(names)
    layers: dict[str, list[int]] = {}
    for name in names:
        m = _BLOCK.match(name)
        layers.setdefault(m[2] if m else name, []).extend([int(m[1])] if m else [])

    def form(leaf: str) -> str:
        at = sorted(set(layers[leaf]))
        if not at:
            return leaf
        span = (f"{at[0]}..{at[-1]}" if at == list(range(at[0], at[-1] + 1))
                else ",".join(map(str, at)))
        return f"blocks.{{{span}}}.{leaf}"

    m = _BLOCK.match(hook)
    leaf = m[2] if m else hook
    close = difflib.get_close_matches(hook, names, n=3, cutoff=0.0)
    forms = difflib.get_close_matches(leaf, list(layers), n=3, cutoff=0.0)
    return (f"the closest hooks here are {', '.join(close)}; hooks here have forms such as "
            f"{', '.join(map(form, forms))}")


class HookedSAERewardModel(HookedRewardModel, HookedSAETransformer):
    """A :class:`HookedRewardModel` that accepts SAELens SAEs. Build it with
    :meth:`from_pretrained` (same arguments as ``HookedRewardModel.from_pretrained``)."""

    @classmethod
    def from_reward_model(cls, model: HookedRewardModel) -> HookedSAERewardModel:
        """The same reward model as a :class:`HookedSAERewardModel`, sharing its weights (no
        copy, no re-conversion from HF): parameters are assigned, not cloned."""
        if isinstance(model, cls):
            return model
        new = cls(model.cfg, model.tokenizer, move_to_device=False,
                  reward_head=model.reward_head, pooling=model.pooling,
                  pad_token_id=model.pad_token_id)
        new.load_state_dict(model.state_dict(keep_vars=True), assign=True)
        new.suffix_ids = model.suffix_ids
        new.input_format = model.input_format  # a PRM's steps, a judge's template
        new.eval()
        return new

    def get_sae_hook_name(self, sae: SAE[Any], internal: str = "hook_sae_acts_post") -> str:
        """The name of ``sae``'s ``internal`` hook once attached (as SAELens's
        ``SAETransformerBridge`` names it on a bridge): ``{hook_name}.{internal}``."""
        return f"{sae.cfg.metadata.hook_name}.{internal}"

    def check_sae(self, sae: SAE[Any]) -> str:
        """The hook name ``sae`` reads, after checking it exists here and that widths match, and
        after moving ``sae`` (in place) onto the model (see :meth:`place_sae`).

        SAELens's ``add_sae`` only logs a warning and skips an SAE whose hook is missing; an
        analysis must not silently run without it.
        """
        if not isinstance(sae, SAE):
            raise SAEHookError(
                f"expected a SAELens SAE (sae_lens.SAE), got {type(sae).__name__}; load one with "
                "SAE.load_from_disk(path) or train one with tl_reward.sae.train_topk_sae"
            )
        hook = sae.cfg.metadata.hook_name
        if not hook:
            raise SAEHookError(
                "the SAE's cfg.metadata.hook_name is empty; set it to the hook it was trained "
                "on, e.g. sae.cfg.metadata.hook_name = 'blocks.3.hook_resid_post'"
            )
        if hook not in self.hook_dict and hook not in getattr(self, "_acts_to_saes", {}):
            raise SAEHookError(
                f"the SAE reads {hook!r}, which is not a hook of this model "
                f"({self.cfg.n_layers} layers); {hook_hint(hook, self.hook_dict)}; set "
                "sae.cfg.metadata.hook_name to the hook the SAE was trained on, or use an SAE "
                "trained on this model"
            )
        width = hook_width(self.cfg, hook, sae.cfg.reshape_activations)
        if width is not None and sae.cfg.d_in != width:
            raise SAEHookError(
                f"the SAE's d_in is {sae.cfg.d_in} but {hook!r} is {width} wide here (d_model "
                f"{self.cfg.d_model}, d_mlp {self.cfg.d_mlp}, {self.cfg.n_heads} heads of "
                f"{self.cfg.d_head}): the SAE belongs to another model or another hook; use one "
                "trained on this hook of this model"
            )
        HookedSAERewardModel.place_sae(self, sae)  # self may be a bridge (sae.splice.check_sae)
        return hook

    def place_sae(self, sae: SAE[Any]) -> SAE[Any]:
        """Move ``sae`` (in place) to the model's device, in at least the model's precision.

        ``SAE.load_from_disk`` and SAELens's trainer default to the CPU while
        ``from_pretrained`` puts the model on CUDA when it can; every SAE path (``add_sae``, the
        SAE analyses) calls this first. The SAE keeps its dtype when that is wider than the
        model's (a float32 SAE on a bfloat16 model encodes in float32; SAELens casts its input
        and output), and is widened otherwise (a bfloat16 SAE on a float32 model).
        """
        device = torch.device(self.cfg.device)
        params = list(sae.parameters())
        if any(p.is_meta for p in params):
            raise SAEHookError(
                "the SAE's weights are on the meta device (never loaded), so it cannot be moved "
                f"to the model's device {device}; load it with SAE.load_from_disk(path, "
                f"device={str(device)!r})"
            )
        dtype = torch.promote_types(sae.dtype, self.cfg.dtype)
        here = params[0].device if params else device
        if here != device and not (here.type == device.type and device.index is None):
            sae.to(device=device)
        if sae.dtype != dtype:
            sae.to(dtype=dtype)
        return sae

    def add_sae(
        self,
        sae: SAE[Any],
        use_error_term: bool | None = None,
        exclude_special_tokens: bool | list[int] = False,
    ) -> None:
        """Attach ``sae`` at its hook (see SAELens); raises :class:`SAEHookError` instead of
        skipping an SAE whose hook does not exist."""
        self.check_sae(sae)
        super().add_sae(sae, use_error_term=use_error_term,
                        exclude_special_tokens=exclude_special_tokens)
