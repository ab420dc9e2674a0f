"""Causal language models for implicit rewards: HF models, and their TransformerLens copies."""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Float
from transformer_lens.utilities import apply_softcap

from tl_reward import tl_backend
from tl_reward.architectures.lm_head import sequence_classification_name
from tl_reward.architectures.registry import get_architecture
from tl_reward.errors import UnsupportedArchitectureError


def is_hooked(model: Any) -> bool:
    """True for a TransformerLens ``HookedTransformer`` (it has ``cfg`` and ``blocks``)."""
    return hasattr(model, "cfg") and hasattr(model, "blocks")


def model_device(model: Any) -> torch.device:
    """The device of a TransformerLens or HF model's weights."""
    if is_hooked(model):
        return torch.device(model.cfg.device)
    return next(model.parameters()).device


def vocab_size(model: Any) -> int:
    """The output vocabulary of a TransformerLens or HF causal LM."""
    return int(model.cfg.d_vocab_out if is_hooked(model) else model.config.vocab_size)


def hooked_causal_lm(hf_model: Any, tokenizer: Any = None, device: str | None = None,
                     dtype: torch.dtype | None = None) -> Any:
    """A ``HookedTransformer`` with the weights of an HF causal LM (``*ForCausalLM``,
    ``*LMHeadModel``) whose logits equal HF's.

    The body converter comes from the reward-model registry entry of the same family
    (``LlamaForCausalLM`` and ``GPT2LMHeadModel`` use ``LlamaForSequenceClassification``'s and
    ``GPT2ForSequenceClassification``'s); the unembedding is the LM head, with the final norm's
    gain folded in. A final logit soft-cap (Gemma-2's ``final_logit_softcapping``, which the
    reward-model config leaves off) becomes ``cfg.output_logits_soft_cap``.
    """
    from transformer_lens import HookedTransformer

    name = type(hf_model).__name__
    seq = sequence_classification_name(name)
    if seq is None:
        raise UnsupportedArchitectureError(f"{name} is not an HF causal LM (*ForCausalLM, "
                                           "*LMHeadModel); pass e.g. a LlamaForCausalLM")
    arch = get_architecture(seq)
    dtype = dtype or next(hf_model.parameters()).dtype
    fields = arch.config(hf_model.config)
    fields.update(d_vocab_out=hf_model.config.vocab_size, original_architecture=name,
                  model_name=str(getattr(hf_model.config, "name_or_path", "") or name),
                  dtype=dtype, device=str(device or next(hf_model.parameters()).device))
    cap = getattr(hf_model.config, "final_logit_softcapping", None)
    if cap:
        fields["output_logits_soft_cap"] = float(cap)
    cfg = tl_backend.make_config(**fields)
    with torch.no_grad():
        state_dict = dict(arch.convert(hf_model, cfg))
    model = HookedTransformer(cfg, None, move_to_device=False)
    if tokenizer is not None:
        # attached as given (TransformerLens would re-load it by name, which needs a hub)
        model.tokenizer = tokenizer
        adds_bos = len(tokenizer.encode("")) > 0
        cfg.tokenizer_prepends_bos = adds_bos
        cfg.default_prepend_bos = adds_bos
    tl_backend.process_weights(model, state_dict)
    model.move_model_modules_to_device()
    model.eval()
    return model


def hooked_logits(model: Any, resid: Float[torch.Tensor, "*batch d_model"],
                  ) -> Float[torch.Tensor, "*batch d_vocab"]:
    """Logits of a TransformerLens causal LM from final residuals (before ``ln_final``), as its
    forward computes them: final norm, unembedding, then the output soft-cap if it has one."""
    return apply_softcap(model.unembed(model.ln_final(resid)), model.cfg.output_logits_soft_cap)
