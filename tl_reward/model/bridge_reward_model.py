"""``BridgeRewardModel``: a reward model on TransformerLens's ``TransformerBridge``.

The bridge runs HF's own forward (its numerics, any architecture TransformerLens has an adapter
for), with the reward head as its unembed (:mod:`tl_reward.tl_backend.bridge`). Sequences are
built, pooled and scored by the same methods as :class:`HookedRewardModel`
(:class:`~tl_reward.model.protocol.RewardModelMixin`); the reward is ``unembed.hook_out`` at the
pooled token, as the forward records it, read in float32.

Example:
    >>> model = BridgeRewardModel.from_pretrained("Skywork/Skywork-Reward-V2-Llama-3.1-8B")
    >>> model.rewards([("Is the sky blue?", "Yes, on a clear day.")]).score
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

from tl_reward.errors import UnsupportedArchitectureError
from tl_reward.model.heads import LinearRewardHead
from tl_reward.model.pooling import check_rule
from tl_reward.model.protocol import RewardModelMixin
from tl_reward.model.readout import accumulation_dtype
from tl_reward.tl_backend.bridge import REWARD_ADAPTERS, RewardBridge, build_reward_bridge

#: HF class -> the custom reward head a reward bridge does not map (its unembed is one linear
#: layer read at the pooled token); HookedRewardModel loads each of them.
CUSTOM_HEADS = {
    "LlamaForRewardModelWithGating": "ArmoRM's gating head (objectives combined by a gate)",
    "LlamaForRewardModelWithGating31": "QRM's quantile heads and gating",
    "INFORMForSequenceClassification": "INF-ORM's two-layer MLP head",
    "InternLM2ForRewardModel": "InternLM2's reward token (v_head at an appended token)",
}


def refuse_custom_head(head: str) -> UnsupportedArchitectureError:
    """The error for a reward head the bridge does not support, naming it and the fix."""
    return UnsupportedArchitectureError(
        f"{head} is not supported on the TransformerBridge: a reward bridge reads one linear "
        "head at the pooled token. Load this model with HookedRewardModel.from_pretrained "
        "(TransformerLens 3), which supports it")


class BridgeRewardModel(RewardModelMixin, RewardBridge):
    """A :class:`~tl_reward.tl_backend.bridge.RewardBridge` with the reward-model methods.
    Build it with :meth:`from_pretrained`."""

    starts_at_layer = False

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | None = None,
        hf_model: Any = None,
        tokenizer: Any = None,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        pooling: str = "hf",
        objective_names: Sequence[str] | None = None,
        lm_head_rows: Sequence[int] | None = None,
        **hf_kwargs: Any,
    ) -> BridgeRewardModel:
        """Wrap an HF sequence-classification reward model (a hub name, a local directory or
        an in-memory ``hf_model``) without converting its weights. ``device`` and ``dtype``
        move and cast the HF model first; the bridge itself never does. The custom heads
        (:data:`CUSTOM_HEADS`) and ``lm_head_rows`` refuse, naming HookedRewardModel."""
        import transformers

        if lm_head_rows is not None or (
                hf_model is not None and type(hf_model).__name__.endswith("ForCausalLM")):
            raise refuse_custom_head("LM-head rows as the reward (a causal LM, lm_head_rows=)")
        if hf_model is None:
            if name_or_path is None:
                raise ValueError("pass name_or_path or hf_model")
            hf_model = transformers.AutoModelForSequenceClassification.from_pretrained(
                name_or_path, **hf_kwargs)
        if tokenizer is None:
            tokenizer = transformers.AutoTokenizer.from_pretrained(
                name_or_path or hf_model.config._name_or_path)
        arch = type(hf_model).__name__
        if arch in CUSTOM_HEADS:
            raise refuse_custom_head(CUSTOM_HEADS[arch])
        if arch not in REWARD_ADAPTERS:
            raise UnsupportedArchitectureError(
                f"no reward bridge for {arch}; supported: {sorted(REWARD_ADAPTERS)}. Load it "
                "with HookedRewardModel.from_pretrained (TransformerLens 3), or register a "
                "reward adapter (tl_reward.tl_backend.bridge.reward_adapter) under this "
                "class name")
        hf_model = hf_model.to(device=device, dtype=dtype).eval()
        model = build_reward_bridge(hf_model, arch)
        model.__class__ = cls
        # Gemma-2's sandwich norms, as HookedTransformer's config says (the bridge's leaves it
        # False, and the decompositions would skip the post-norms' scale)
        model.cfg.use_normalization_before_and_after = hasattr(model.blocks[0], "ln1_post")
        model.cfg.model_name = name_or_path or str(  # as HookedRewardModel names it
            getattr(hf_model.config, "name_or_path", "") or arch)
        k = int(hf_model.config.num_labels)
        names = list(objective_names) if objective_names is not None else (
            ["reward"] if k == 1 else [f"objective_{i}" for i in range(k)])
        model.reward_head = LinearRewardHead(names)
        model.pooling = check_rule(pooling)
        pad = hf_model.config.pad_token_id
        model.pad_token_id = tokenizer.pad_token_id if pad is None else pad
        model.tokenizer = tokenizer
        adds_bos = len(tokenizer.encode("")) > 0
        model.cfg.tokenizer_prepends_bos = model.cfg.default_prepend_bos = adds_bos
        return model  # type: ignore[return-value]

    @torch.no_grad()
    def norm_affine(self, norm: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``(gain, beta)`` in float32 of one of HF's norm modules (as wrapped by the bridge),
        read off a float32 copy (Gemma's ``1 + w`` included) as ``norm(x) = N(x) g + beta``:
        at ``0`` (``beta``) and at an ``x`` of mean 0 with no zero entry
        (``N(x) = x / sqrt(mean(x^2) + eps)``)."""
        norm = copy.deepcopy(norm.original_component).float()
        d = self.cfg.d_model
        x = torch.ones(d, device=self.cfg.device)
        x[1::2] = -1.0
        if d % 2:
            x[-3:] = torch.tensor([-1.0, -1.0, 2.0])
        beta = norm(torch.zeros_like(x)[None])[0]
        return (norm(x[None])[0] - beta) * (x.pow(2).mean() + self.cfg.eps).sqrt() / x, beta

    def norm_gain(self, norm: Any) -> torch.Tensor:
        """The gain of one of the model's norms (:meth:`norm_affine`; the raw ``w`` a bridge
        shows is Gemma's ``w``, not its ``1 + w``)."""
        return self.norm_affine(norm)[0]

    @torch.no_grad()
    def value_bias(self, layer: int) -> torch.Tensor:
        """HF's ``b_V`` plus the first norm's bias through ``W_V`` (``[kv_heads, d_head]``): what
        HookedTransformer's processing folds into ``b_O``."""
        attn = self.blocks[layer].attn
        _, beta = self.norm_affine(self.blocks[layer].ln1)
        b = torch.einsum("d,hde->he", beta, attn.W_V.detach().float())
        return b if attn.b_V is None else b + attn.b_V.detach().float()

    @property
    def folded_head(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(W [d_model, K], b [K])`` in float32: HF's head with its final norm's gain and
        bias (:meth:`norm_affine`) folded in."""
        gain, beta = self.norm_affine(self.ln_final)
        w_u, b_u = self.unembed.W_U.detach().float(), self.unembed.b_U
        b_u = torch.zeros(w_u.shape[1], device=w_u.device) if b_u is None else b_u.float()
        return gain[:, None] * w_u, b_u.detach() + beta @ w_u

    def final_residual(self, tokens: torch.Tensor, attention_mask: torch.Tensor
                       ) -> torch.Tensor:
        """The last block's ``hook_resid_post`` of a padded batch, as HF's forward computes it
        (differentiable; the bridge cannot stop early, so the head runs too), read where the
        final norm takes it in (``ln_final.hook_in``: after an SAE spliced in at that hook)."""
        seen: dict[str, torch.Tensor] = {}

        def grab(act: torch.Tensor, hook: Any) -> None:
            seen["resid"] = act

        with self.hooks(fwd_hooks=[("ln_final.hook_in", grab)]):
            self(tokens, attention_mask=attention_mask, return_type=None)
        return seen["resid"]

    @torch.no_grad()
    def pooled_outputs(
        self, tokens: torch.Tensor, attention_mask: torch.Tensor, pooling: str | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, None]:
        """``(rewards [b, K], score [b] or None, None)``: ``unembed.hook_out`` of the forward at
        the pooled token, in float32 (float64 for a float64 model)."""
        seen: dict[str, torch.Tensor] = {}

        def grab(act: torch.Tensor, hook: Any) -> None:
            seen["out"] = act

        device = self.cfg.device
        tokens, attention_mask = tokens.to(device), attention_mask.to(device)
        self.run_with_hooks(tokens, attention_mask=attention_mask, return_type=None,
                            fwd_hooks=[("unembed.hook_out", grab)])
        pos = self.pool_positions(tokens, attention_mask, pooling).to(device)
        rows = torch.arange(tokens.shape[0], device=device)
        rewards = seen["out"][rows, pos].to(accumulation_dtype(self))
        c = self.reward_head.combination(rewards[:, None], tokens)
        return rewards, None if c is None else (rewards * c.to(rewards.dtype)).sum(-1), None
