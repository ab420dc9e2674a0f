"""Tiny seeded reward models of every supported architecture, built offline from configs.

Weights are re-drawn at a scale where every part of the network matters (norm gains away from
1, biases non-zero, rewards of order 1), so parity checks against HF's forward can fail.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

ARCHITECTURES: tuple[str, ...] = (
    "llama", "llama3", "mistral", "gemma2", "qwen2", "qwen3", "gpt2", "armorm"
)
#: Tiny models of custom-code reward models beyond plain linear heads (reference modules in
#: ``tl_reward.testing``), saved with their modeling code like the real checkpoints.
CUSTOM_ARCHITECTURES: tuple[str, ...] = ("inform", "nemotron", "qrm", "internlm2")
#: Tiny process reward models (a reward at each step's tag; inputs are solutions, so they stay
#: out of the outcome-RM lists above): Qwen2.5-Math-PRM's two-class MLP head read at
#: ``<extra_0>``, its tokenizer holding the tag as a special token.
PRM_ARCHITECTURES: tuple[str, ...] = ("qwen2_prm",)
#: PRM architecture -> its step tag (added to the tiny tokenizer as a special token).
PRM_TAGS = {"qwen2_prm": "<extra_0>"}
#: Families only :class:`~tl_reward.BridgeRewardModel` loads (no HookedRewardModel converter):
#: mixture-of-experts MLPs, OLMo-2's norms after each sublayer (none before), Phi-3's fused
#: projections, StableLM's LayerNorm with value biases (sequential, and with its parallel
#: attention and MLP and per-head q/k norms).
BRIDGE_ARCHITECTURES: tuple[str, ...] = ("mixtral", "olmo2", "phi3", "qwen3moe", "stablelm",
                                         "stablelm_parallel")
#: Custom-code architecture -> its reference class (saved with ``trust_remote_code``).
_CUSTOM_CLASSES = {"armorm": "LlamaForRewardModelWithGating",
                   "inform": "INFORMForSequenceClassification",
                   "qrm": "LlamaForRewardModelWithGating31",
                   "internlm2": "InternLM2ForRewardModel",
                   "qwen2_prm": "Qwen2ForProcessRewardModel"}
#: Custom-code architectures whose checkpoint loads as ``AutoModel`` (with a custom config
#: class), as the published Qwen2.5-Math-PRM's ``auto_map`` names them.
_AUTO_MODEL = ("qwen2_prm",)

SPECIAL_TOKENS = {
    "bos_token": "<|begin_of_text|>",
    "eos_token": "<|eot_id|>",
    "pad_token": "<|pad|>",
}
HEADER_TOKENS = ["<|start_header_id|>", "<|end_header_id|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>"
    "{% if m['role'] == 'assistant' %}<|assistant|>{% else %}{{ m['role'] }}{% endif %}"
    "<|end_header_id|>{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|><|assistant|><|end_header_id|>{% endif %}"
)
_CORPUS = (
    "The quick brown fox jumps over the lazy dog. Is the sky blue? Yes, the sky is blue on a "
    "clear day because of Rayleigh scattering. No. I cannot help with that request. Here is a "
    "helpful, honest and harmless answer: drink water, sleep well, and be kind to others. "
    "What, in one word, is the greatest thing ever? Love. Friendship. Music. Hate. War. "
    "Sure! **Bold** text, lists:\n- one\n- two\n1. first\n2. second\nThanks for asking."
)


def tiny_tokenizer(vocab_size: int = 320) -> Any:
    """A byte-level BPE tokenizer with BOS/EOS/PAD and a Llama-3-like chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = [*SPECIAL_TOKENS.values(), *HEADER_TOKENS]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer)
    bos = SPECIAL_TOKENS["bos_token"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, tok.token_to_id(bos))]
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **SPECIAL_TOKENS,
                                   additional_special_tokens=HEADER_TOKENS)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def assistant_pattern(tokenizer: Any) -> list[int]:
    """Ids that open an assistant turn in the tiny template (ArmoRM's gating pattern)."""
    return [tokenizer.convert_tokens_to_ids(t)
            for t in ("<|eot_id|>", "<|start_header_id|>", "<|assistant|>", "<|end_header_id|>")]


def _config(arch: str, num_labels: int, tokenizer: Any) -> Any:
    import transformers as tf

    vocab = 64 * math.ceil((len(tokenizer) + 16) / 64)  # headroom, as real checkpoints have
    ids = {"pad_token_id": tokenizer.pad_token_id, "bos_token_id": tokenizer.bos_token_id,
           "eos_token_id": tokenizer.eos_token_id, "num_labels": num_labels}
    llama_like = dict(vocab_size=vocab, hidden_size=64, intermediate_size=96,
                      num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256, rms_norm_eps=1e-5, **ids)
    if arch == "llama":
        return tf.LlamaConfig(**llama_like)
    if arch == "llama3":
        return tf.LlamaConfig(**llama_like, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16})
    if arch == "mistral":
        return tf.MistralConfig(**llama_like, sliding_window=6)
    if arch == "qwen2":
        return tf.Qwen2Config(**llama_like)
    if arch == "qwen2_prm":
        from tl_reward.testing.qwen2_prm_reference import Qwen2RMConfig

        return Qwen2RMConfig(**llama_like)
    if arch == "qwen3":  # head_dim != hidden / heads, as in every real Qwen3
        return tf.Qwen3Config(**llama_like, head_dim=24, tie_word_embeddings=False)
    if arch == "gemma2":
        return tf.Gemma2Config(**{**llama_like, "intermediate_size": 96}, head_dim=16,
                               query_pre_attn_scalar=24, sliding_window=6,
                               attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
                               hidden_activation="gelu_pytorch_tanh")
    if arch == "gpt2":
        return tf.GPT2Config(vocab_size=vocab, n_embd=64, n_layer=3, n_head=4, n_positions=256,
                             **ids)
    if arch in ("inform", "nemotron"):
        return tf.LlamaConfig(**llama_like)
    if arch == "mixtral":
        return tf.MixtralConfig(**llama_like, num_local_experts=4, num_experts_per_tok=2)
    if arch == "qwen3moe":
        return tf.Qwen3MoeConfig(**llama_like, num_experts=4, num_experts_per_tok=2,
                                 moe_intermediate_size=32, head_dim=16)
    if arch == "olmo2":
        return tf.Olmo2Config(**llama_like)
    if arch == "phi3":
        return tf.Phi3Config(**llama_like)
    if arch.startswith("stablelm"):
        parallel = arch == "stablelm_parallel"
        return tf.StableLmConfig(**llama_like, layer_norm_eps=1e-5, use_qkv_bias=True,
                                 use_parallel_residual=parallel, qk_layernorm=parallel)
    if arch == "internlm2":
        from tl_reward.testing.internlm2_reference import InternLM2Config

        keep = {k: v for k, v in llama_like.items() if k != "num_labels"}
        # the reward token: the first id past the tokenizer (real ones use an unused token)
        return InternLM2Config(**keep, rope_theta=1000000.0, reward_token_id=len(tokenizer),
                               rope_scaling={"type": "dynamic", "factor": 2.0})
    if arch in ("qrm", "armorm"):
        cfg = tf.LlamaConfig(**llama_like)
        cfg.num_objectives = num_labels
        if arch == "qrm":  # the published reward_quantiles broadcast needs q = K
            cfg.num_quantiles = num_labels
        cfg.gating_hidden_dim = 32
        cfg.gating_n_hidden = 2 if arch == "qrm" else 3
        cfg.gating_temperature = 0.5 if arch == "qrm" else 10  # QRM's visibly prompt-dependent
        cfg.gating_token_pattern = assistant_pattern(tokenizer)
        return cfg
    known = ARCHITECTURES + CUSTOM_ARCHITECTURES + PRM_ARCHITECTURES + BRIDGE_ARCHITECTURES
    raise ValueError(f"unknown tiny architecture {arch!r}; choose from {known}")


def randomize_(model: nn.Module, seed: int = 0) -> nn.Module:
    """Redraw every parameter: gains near (not at) their identity, O(1) activations."""
    gen = torch.Generator().manual_seed(seed)
    gemma = "Gemma" in type(model).__name__
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith("reward_transform_matrix"):
                p.copy_(torch.eye(p.shape[0]) + 0.5 * noise)
            elif name.endswith("logit_scale"):
                p.copy_(torch.tensor([1.7]))
            elif p.ndim == 1 and ("norm" in name or ".ln_" in name):
                p.copy_((0.0 if gemma else 1.0) + 0.3 * noise)
            elif p.ndim == 1:
                p.copy_(0.1 * noise)
            elif "embed" in name or name.endswith(("wte.weight", "wpe.weight")):
                p.copy_(noise)
            else:
                p.copy_(noise / math.sqrt(p.shape[-1]))
    return model


def tiny_hf_reward_model(
    arch: str = "llama", num_labels: int = 1, seed: int = 0, tokenizer: Any = None
) -> tuple[nn.Module, Any]:
    """``(hf_model, tokenizer)``: a seeded tiny HF reward model of ``arch``."""
    import transformers as tf

    tokenizer = tokenizer or tiny_tokenizer()
    if arch in PRM_TAGS and PRM_TAGS[arch] not in tokenizer.get_vocab():
        tokenizer.add_tokens([PRM_TAGS[arch]], special_tokens=True)
    cfg = _config(arch, num_labels, tokenizer)
    torch.manual_seed(seed)
    if arch == "armorm":
        from tl_reward.testing.armorm_reference import LlamaForRewardModelWithGating

        model = LlamaForRewardModelWithGating(cfg)
    elif arch == "nemotron":  # a causal LM read through LM-head rows (``lm_head_rows=``)
        model = tf.LlamaForCausalLM._from_config(cfg, attn_implementation="eager")
    elif arch == "qrm":
        from tl_reward.testing.qrm_reference import LlamaForRewardModelWithGating31

        model = LlamaForRewardModelWithGating31(cfg)
    elif arch == "internlm2":
        from tl_reward.testing.internlm2_reference import InternLM2ForRewardModel

        model = InternLM2ForRewardModel(cfg)
    elif arch == "inform":
        from tl_reward.testing.inform_reference import INFORMForSequenceClassification

        model = INFORMForSequenceClassification(cfg)
    elif arch == "qwen2_prm":
        from tl_reward.testing.qwen2_prm_reference import Qwen2ForProcessRewardModel

        if num_labels != 2:
            raise ValueError("a Qwen2.5-Math-PRM head has two classes: pass num_labels=2")
        model = Qwen2ForProcessRewardModel(cfg)
    else:
        cls = {"llama": tf.LlamaForSequenceClassification,
               "llama3": tf.LlamaForSequenceClassification,
               "mistral": tf.MistralForSequenceClassification,
               "qwen2": tf.Qwen2ForSequenceClassification,
               "qwen3": tf.Qwen3ForSequenceClassification,
               "gemma2": tf.Gemma2ForSequenceClassification,
               "gpt2": tf.GPT2ForSequenceClassification,
               "mixtral": tf.MixtralForSequenceClassification,
               "qwen3moe": tf.Qwen3MoeForSequenceClassification,
               "olmo2": tf.Olmo2ForSequenceClassification,
               "phi3": tf.Phi3ForSequenceClassification,
               "stablelm": tf.StableLmForSequenceClassification,
               "stablelm_parallel": tf.StableLmForSequenceClassification}[arch]
        kwargs = {"attn_implementation": "eager"}
        model = cls._from_config(cfg, **kwargs)
    randomize_(model, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    for m in model.modules():  # inference statistics that matter (QRM's gating BatchNorm)
        if isinstance(m, nn.BatchNorm1d):
            m.running_mean.copy_(0.3 * torch.randn(m.num_features, generator=gen))
            m.running_var.copy_(0.5 + torch.rand(m.num_features, generator=gen))
    return model.eval(), tokenizer


def save_tiny_reward_model(path: str | Path, arch: str = "llama", num_labels: int = 1,
                           seed: int = 0) -> Path:
    """Build a tiny model and save it (with tokenizer, and custom code for the custom-code
    architectures) to ``path``; a PRM (:data:`PRM_ARCHITECTURES`) has two classes whatever
    ``num_labels`` says."""
    if arch in PRM_ARCHITECTURES:
        num_labels = 2
    model, tok = tiny_hf_reward_model(arch, num_labels, seed)
    path = Path(path)
    if arch in _CUSTOM_CLASSES:
        model.config.architectures = [_CUSTOM_CLASSES[arch]]
        type(model).register_for_auto_class(
            "AutoModel" if arch in _AUTO_MODEL else "AutoModelForSequenceClassification")
        if arch in ("internlm2", *_AUTO_MODEL):  # its config class is custom code too
            type(model.config).register_for_auto_class("AutoConfig")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


# Three conversations of different lengths and roles (a system turn, several turns): the
# padded-batch checks of tests and benchmarks.
CONVERSATIONS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "Is the sky blue?"},
     {"role": "assistant", "content": "Yes, the sky is blue on a clear day."}],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "No."}],
    [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "What is love?"},
     {"role": "assistant", "content": "Love. Friendship. Music."},
     {"role": "user", "content": "Thanks"}, {"role": "assistant", "content": "Sure!"}],
]
