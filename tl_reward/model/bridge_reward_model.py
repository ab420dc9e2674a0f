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
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from transformer_lens.model_bridge.generalized_components import NormalizationBridge

from tl_reward.errors import TLRewardError, UnsupportedArchitectureError
from tl_reward.model.heads import ArmoRMHead, LinearRewardHead, RewardHead, objective_names_of
from tl_reward.model.pooling import check_rule
from tl_reward.model.protocol import RewardModelMixin
from tl_reward.model.readout import accumulation_dtype, normalise
from tl_reward.tl_backend.bridge import (
    REWARD_ADAPTERS,
    RewardBridge,
    build_reward_bridge,
    head_classifier,
)

if TYPE_CHECKING:
    from tl_reward.architectures.registry import Architecture

#: Custom heads the bridge loads as HF's sequence classifier of their body (:func:`custom_head`).
HEAD_BRIDGES = ("LlamaForRewardModelWithGating", "LlamaForRewardModelWithGating31",
                "INFORMForSequenceClassification", "InternLM2ForRewardModel",
                "Qwen2ForProcessRewardModel")


def custom_head(hf_model: Any, lm_head_rows: Sequence[int] | None,
                objective_names: Sequence[str] | None
                ) -> tuple[Any, Architecture, Callable[[torch.Tensor], RewardHead]]:
    """``(classifier, architecture, build)`` of a custom-head reward model
    (:data:`HEAD_BRIDGES`, or a causal LM's ``lm_head_rows``): HF's sequence classifier of its
    body (:func:`~tl_reward.tl_backend.bridge.head_classifier`; InternLM2's re-laid as HF's
    Llama, ``Architecture.bridge_body``) whose ``score`` is the layer HookedRewardModel makes
    ``W_U`` (INF-ORM: its head module on HF's own layers), its registered architecture (the
    pooling rule, the suffix ids), and ``build(gain)``, the reward head as HookedRewardModel
    builds it."""
    from tl_reward.architectures import architecture_of
    from tl_reward.architectures.lm_head import (
        causal_lm_architecture,
        lm_head_rows_layer,
        row_objectives,
    )

    if lm_head_rows is not None:
        arch = causal_lm_architecture(hf_model)
        layer = lm_head_rows_layer(hf_model, lm_head_rows)
        default = row_objectives(lm_head_rows)
    else:
        arch = architecture_of(hf_model)
        layer, default = arch.head(hf_model), arch.objective_names
    k = int(layer.weight.shape[0])
    names = objective_names_of(hf_model.config, k, objective_names or default)
    score: torch.nn.Module = layer
    if isinstance(getattr(hf_model, "score", None), torch.nn.Sequential):  # INF-ORM's, a PRM's
        from tl_reward.architectures.inform import mlp_layers
        from tl_reward.model.mlp_head import MLPRewardHead

        score = MLPRewardHead(names, *mlp_layers(hf_model))  # HF's own layers, gain unfolded

    def build(gain: torch.Tensor) -> RewardHead:
        return (LinearRewardHead(names) if arch.reward_head is None
                else arch.reward_head(hf_model, gain, names))

    body = hf_model if arch.bridge_body is None else arch.bridge_body(hf_model)
    return head_classifier(body, score, k), arch, build


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
        pooling: str | None = None,
        objective_names: Sequence[str] | None = None,
        lm_head_rows: Sequence[int] | None = None,
        step_tag: str | None = None,
        head_weights: Sequence[float] | None = None,
        **hf_kwargs: Any,
    ) -> BridgeRewardModel:
        """Wrap an HF sequence-classification reward model (a hub name, a local directory, an
        in-memory ``hf_model``, or a built-in name: the demo RMs ``tl-reward/smollm2-135m-hh``
        and ``tl-reward/smollm2-135m-multi`` and the demo PRM ``tl-reward/smollm2-135m-prm``,
        loaded offline as ``HookedRewardModel`` loads them, with the PRM's step tag) without
        converting its weights. ``device`` and ``dtype`` move and cast the HF model first; the
        bridge itself never does. ``lm_head_rows`` reads those rows of a causal LM's head;
        ArmoRM, QRM, INF-ORM, InternLM2 (whose sequences end in its reward token, the pooled
        one) and Qwen2.5-Math-PRM (its MLP head read at each step's tag) load through
        :func:`custom_head`.
        ``step_tag`` and ``head_weights`` as for HookedRewardModel (a process reward model)."""
        import transformers

        if hf_model is None:
            from tl_reward.model.loading import BUILTIN_MODELS, builtin_options

            if name_or_path is None:
                raise ValueError("pass name_or_path or hf_model")
            if name_or_path in BUILTIN_MODELS:  # the demo RMs, offline, as HookedRewardModel
                hf_model, builtin_tokenizer = BUILTIN_MODELS[name_or_path](dtype)
                tokenizer = tokenizer or builtin_tokenizer
                options = builtin_options(name_or_path, step_tag=step_tag,
                                          head_weights=head_weights)
                step_tag, head_weights = options["step_tag"], options["head_weights"]
            else:  # Qwen2.5-Math-PRM's custom code loads as AutoModel (reward_auto_class)
                from tl_reward.model.loading import reward_auto_class

                trust = bool(hf_kwargs.get("trust_remote_code", False))
                config = transformers.AutoConfig.from_pretrained(name_or_path,
                                                                 trust_remote_code=trust)
                auto = reward_auto_class(config, lm_head_rows, name_or_path, trust)
                hf_model = auto.from_pretrained(name_or_path, **hf_kwargs)
        if tokenizer is None:
            tokenizer = transformers.AutoTokenizer.from_pretrained(
                name_or_path or hf_model.config._name_or_path,
                trust_remote_code=hf_kwargs.get("trust_remote_code", False))
        arch = type(hf_model).__name__
        if lm_head_rows is None and arch.endswith(("ForCausalLM", "LMHeadModel")):
            raise UnsupportedArchitectureError(
                f"{arch} is a causal LM: pass lm_head_rows=[<token ids>] to read those rows of "
                "its LM head as the reward")
        custom = lm_head_rows is not None or arch in HEAD_BRIDGES
        if not custom and arch not in REWARD_ADAPTERS:
            raise UnsupportedArchitectureError(
                f"no reward bridge for {arch}; supported: {sorted(REWARD_ADAPTERS)}. Load it "
                "with HookedRewardModel.from_pretrained (TransformerLens 3), or register a "
                "reward adapter (tl_reward.tl_backend.bridge.reward_adapter) under this "
                "class name")
        hf_model = hf_model.to(device=device, dtype=dtype).eval()
        suffix: tuple[int, ...] = ()
        registered = None
        if custom:
            config = hf_model.config
            hf_model, registered, build = custom_head(hf_model, lm_head_rows, objective_names)
            arch, pooling = type(hf_model).__name__, pooling or registered.pooling
            suffix = registered.suffix(config)
        model = build_reward_bridge(hf_model, arch)
        model.__class__ = cls
        # norms after the sublayers (Gemma-2's, OLMo-2's), as HookedTransformer's config flags
        # Gemma-2's (the bridge's leaves it False) for code reading the config; the
        # decompositions read post_norms
        model.cfg.use_normalization_before_and_after = model.post_norms is not None
        model.cfg.model_name = name_or_path or str(  # as HookedRewardModel names it
            getattr(hf_model.config, "name_or_path", "") or arch)
        names = objective_names_of(hf_model.config, hf_model.config.num_labels, objective_names)
        model.reward_head = (build(model.norm_affine(model.ln_final)[0]) if custom
                             else LinearRewardHead(names)).to(model.cfg.device, hf_model.dtype)
        model.pooling = check_rule(pooling or "hf")
        model.suffix_ids = suffix
        pad = hf_model.config.pad_token_id
        model.pad_token_id = tokenizer.pad_token_id if pad is None else pad
        model.tokenizer = tokenizer
        adds_bos = len(tokenizer.encode("")) > 0
        model.cfg.tokenizer_prepends_bos = model.cfg.default_prepend_bos = adds_bos
        model.use_steps(step_tag or (registered.step_tag if registered else None), head_weights)
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

    @property
    def post_norms(self) -> tuple[str, str] | None:
        """The norms after attention and after the MLP, read off the bridge's block layout:
        the modules whose output ``hook_attn_out`` and ``hook_mlp_out`` are (Gemma-2's
        ``ln1_post``/``ln2_post``, OLMo-2's ``ln1``/``ln2``), else ``None``."""
        block = self.blocks[0]
        found = []
        for hook in ("hook_attn_out", "hook_mlp_out"):
            where = block.hook_aliases.get(hook)
            name = where.removesuffix(".hook_out") if isinstance(where, str) else ""
            found.append(name if isinstance(getattr(block, name, None), NormalizationBridge)
                         else None)
        if found == [None, None]:
            return None
        if None in found:
            raise TLRewardError(
                f"{self.cfg.architecture} normalises only one of its attention and MLP outputs "
                f"({found}): the decompositions (DRA, the lens's split, direct-path patching) "
                "do not handle it; use activation patching (tl_reward.analysis.patching)")
        return found[0], found[1]

    @torch.no_grad()
    def value_bias(self, layer: int) -> torch.Tensor:
        """HF's ``b_V`` plus the bias of the norm before attention through ``W_V``
        (``[kv_heads, d_head]``; OLMo-2 has no norm there: TransformerLens 3.9 maps its
        ``ln1`` to the norm after attention, 4.3 has none): what HookedTransformer's processing
        folds into ``b_O``."""
        block = self.blocks[layer]
        attn = block.attn
        b = torch.zeros(attn.W_V.shape[::2], device=attn.W_V.device)
        if hasattr(block, "ln1") and "ln1" not in (self.post_norms or ()):  # a norm before
            _, beta = self.norm_affine(block.ln1)
            b = torch.einsum("d,hde->he", beta, attn.W_V.detach().float())
        return b if attn.b_V is None else b + attn.b_V.detach().float()

    @property
    def folded_head(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(W [d_model, K], b [K])`` in float32: HF's head with its final norm's gain and
        bias (:meth:`norm_affine`) folded in (NaN for an MLP head, as HookedRewardModel's)."""
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
        read_at: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """``(rewards [b, K], score [b] or None, gating [b, K] or None)``: ``unembed.hook_out``
        of the forward at the pooled token, in float32 (float64 for a float64 model); a gate
        (ArmoRM, QRM) reads the final residual the same forward records, normed afresh as
        HookedRewardModel reads it. ``read_at = (rows, positions)``: row ``rows[i]`` at
        ``positions[i]`` instead (a PRM's steps, one output per pair)."""
        seen: dict[str, torch.Tensor] = {}

        def grab(name: str) -> Callable[[torch.Tensor, Any], None]:
            return lambda act, hook: seen.__setitem__(name, act)

        head, device, acc = self.reward_head, self.cfg.device, accumulation_dtype(self)
        names = ["unembed.hook_out"] + [f"blocks.{self.cfg.n_layers - 1}.hook_resid_post"] * (
            head.reads_states)
        tokens, attention_mask = tokens.to(device), attention_mask.to(device)
        self.run_with_hooks(tokens, attention_mask=attention_mask, return_type=None,
                            fwd_hooks=[(n, grab(n)) for n in names])
        out, states = seen[names[0]], seen.get(names[-1]) if head.reads_states else None
        if read_at is None:
            pos = self.pool_positions(tokens, attention_mask, pooling).to(device)
        else:
            rows_at, pos = (t.to(device) for t in read_at)
            out, tokens = out[rows_at], tokens[rows_at]
            states = None if states is None else states[rows_at]
        rows = torch.arange(tokens.shape[0], device=device)
        rewards = out[rows, pos].to(acc)
        normed = rewards[:, None] if states is None else normalise(self, states)
        c = head.combination(normed, tokens)
        gating = head.gate(normed[rows, head.gating_positions(tokens)]) if isinstance(
            head, ArmoRMHead) else None
        return rewards, None if c is None else (rewards * c.to(acc)).sum(-1), gating
