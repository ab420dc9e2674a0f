"""Tiny seeded causal-LM pairs (a reference and a perturbed "policy") for implicit-reward tests."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from tl_reward.testing.tiny import _config, randomize_, tiny_tokenizer


def tiny_causal_lm(arch: str = "llama", seed: int = 0, tokenizer: Any = None,
                   ) -> tuple[nn.Module, Any]:
    """``(hf_model, tokenizer)``: a seeded tiny HF ``*ForCausalLM`` (eager attention)."""
    import transformers as tf

    tokenizer = tokenizer or tiny_tokenizer()
    cfg = _config(arch, 1, tokenizer)
    cls = {"llama": tf.LlamaForCausalLM, "llama3": tf.LlamaForCausalLM,
           "mistral": tf.MistralForCausalLM, "qwen2": tf.Qwen2ForCausalLM,
           "gemma2": tf.Gemma2ForCausalLM, "gpt2": tf.GPT2LMHeadModel}[arch]
    torch.manual_seed(seed)
    model = cls._from_config(cfg, attn_implementation="eager")
    randomize_(model, seed)
    return model.eval(), tokenizer


def tiny_causal_lm_pair(arch: str = "llama", seed: int = 0, shift: float = 0.3,
                        ) -> tuple[nn.Module, nn.Module, Any]:
    """``(policy, reference, tokenizer)``: the policy is the reference with every weight moved
    by ``shift`` times its own scale of seeded Gaussian noise (a stand-in for tuning), so
    per-token log-ratios are of order 0.1-1."""
    reference, tok = tiny_causal_lm(arch, seed)
    policy = copy.deepcopy(reference)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(shift * p.detach().std().nan_to_num(0.1) * torch.randn(p.shape, generator=gen))
    return policy.eval(), reference, tok
