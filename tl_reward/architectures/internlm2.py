"""InternLM2 reward models (internlm/internlm2-1_8b/7b/20b-reward, ``InternLM2ForRewardModel``,
custom code): a Llama-like body with a fused ``wqkv`` projection, ``v_head`` on the final
hidden state, read at a reward token appended after the conversation.

The fused projection's output is laid out ``(kv_head, group + 2, head_dim)``: each key/value
head's group of queries, then its key, then its value; :func:`split_wqkv` splits it, here into
TransformerLens's ``W_Q``/``W_K``/``W_V`` and, for the TransformerBridge, into the HF
``LlamaModel`` the body is (:func:`llama_body`). ``config.reward_token_id`` is appended to every
text or conversation input (:attr:`HookedRewardModel.suffix_ids`), and the reward is read at it
(the last real token: HF's pooling rule, which equals the published last-mask-position rule
because the reward token is never the pad token). InternLM2's ``dynamic`` rotary scaling only
changes positions beyond ``max_position_embeddings``, which is also our ``n_ctx``: within it
the plain rotary is exact.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import einops
import torch
from torch import nn

if TYPE_CHECKING:  # TransformerLens 4 has none
    from transformer_lens import HookedTransformerConfig

from tl_reward.architectures.common import gated_rms_fields, require_false
from tl_reward.architectures.registry import Architecture, register_architecture


def internlm2_config(hf_config: Any) -> dict[str, Any]:
    """HookedTransformerConfig fields for an InternLM2 config."""
    require_false(hf_config, "bias")
    d_head = hf_config.hidden_size // hf_config.num_attention_heads
    scaling = dict(getattr(hf_config, "rope_scaling", None) or {})
    rope_src = hf_config
    if str(scaling.get("type", scaling.get("rope_type", ""))).lower() == "dynamic":
        rope_src = SimpleNamespace(rope_theta=hf_config.rope_theta, rope_scaling=None,
                                   max_position_embeddings=hf_config.max_position_embeddings)
    return gated_rms_fields(hf_config, d_head, rope_config=rope_src)


def split_wqkv(wqkv: torch.Tensor, n_kv: int, d_head: int
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The query, key and value rows (``[heads x d_head, d_model]`` each, heads in order) of
    a fused ``wqkv`` weight laid out ``(kv_head, group + 2, head_dim)``."""
    w = wqkv.reshape(n_kv, -1, d_head, wqkv.shape[-1])
    return w[:, :-2].flatten(0, 2), w[:, -2].flatten(0, 1), w[:, -1].flatten(0, 1)


def convert_internlm2(hf_model: nn.Module, cfg: HookedTransformerConfig) -> dict[str, Any]:
    """TransformerLens state dict of an InternLM2 body (``unembed`` is written by the loader)."""
    body: Any = hf_model.model
    n_kv = cfg.n_key_value_heads or cfg.n_heads
    kv = "_" if cfg.n_key_value_heads is not None else ""
    sd: dict[str, Any] = {"embed.W_E": body.tok_embeddings.weight, "ln_final.w": body.norm.weight}
    for i, layer in enumerate(body.layers):
        p = f"blocks.{i}."
        attn, mlp = layer.attention, layer.feed_forward
        q, k, v = split_wqkv(attn.wqkv.weight, n_kv, cfg.d_head)
        sd[p + "ln1.w"] = layer.attention_norm.weight
        sd[p + "attn.W_Q"] = einops.rearrange(q, "(n d) m -> n m d", n=cfg.n_heads)
        sd[p + f"attn.{kv}W_K"] = einops.rearrange(k, "(n d) m -> n m d", n=n_kv)
        sd[p + f"attn.{kv}W_V"] = einops.rearrange(v, "(n d) m -> n m d", n=n_kv)
        sd[p + "attn.b_Q"] = torch.zeros(cfg.n_heads, cfg.d_head, dtype=cfg.dtype)
        sd[p + f"attn.{kv}b_K"] = torch.zeros(n_kv, cfg.d_head, dtype=cfg.dtype)
        sd[p + f"attn.{kv}b_V"] = torch.zeros(n_kv, cfg.d_head, dtype=cfg.dtype)
        sd[p + "attn.W_O"] = einops.rearrange(attn.wo.weight, "m (n d) -> n d m", n=cfg.n_heads)
        sd[p + "attn.b_O"] = torch.zeros(cfg.d_model, dtype=cfg.dtype)
        sd[p + "ln2.w"] = layer.ffn_norm.weight
        sd[p + "mlp.W_gate"] = mlp.w1.weight.T
        sd[p + "mlp.W_in"] = mlp.w3.weight.T
        sd[p + "mlp.W_out"] = mlp.w2.weight.T
        sd[p + "mlp.b_in"] = torch.zeros(cfg.d_mlp, dtype=cfg.dtype)  # type: ignore[arg-type]
        sd[p + "mlp.b_out"] = torch.zeros(cfg.d_model, dtype=cfg.dtype)
    return sd


def llama_body(hf_model: nn.Module) -> nn.Module:
    """The body as HF's ``LlamaModel`` (what a TransformerBridge adapter knows): the same
    weights, shared but for ``wqkv``, split (:func:`split_wqkv`) into copies; eager attention
    unless the config names another; rotary as :func:`internlm2_config` reads it."""
    import transformers

    src: Any = hf_model.model
    hf_config, c = hf_model.config, internlm2_config(hf_model.config)
    weight = src.norm.weight
    config = transformers.LlamaConfig(
        vocab_size=c["d_vocab"], hidden_size=c["d_model"], intermediate_size=c["d_mlp"],
        num_hidden_layers=c["n_layers"], num_attention_heads=c["n_heads"], head_dim=c["d_head"],
        num_key_value_heads=c["n_key_value_heads"] or c["n_heads"], hidden_act=c["act_fn"],
        max_position_embeddings=c["n_ctx"], rms_norm_eps=c["eps"], rope_theta=c["rotary_base"],
        pad_token_id=hf_config.pad_token_id, tie_word_embeddings=False, dtype=weight.dtype,
        name_or_path=getattr(hf_config, "name_or_path", ""))
    config._attn_implementation = getattr(hf_config, "attn_implementation", None) or "eager"
    with torch.device("meta"):
        body = transformers.LlamaModel(config)
    state = {"embed_tokens.weight": src.tok_embeddings.weight, "norm.weight": weight}
    for i, layer in enumerate(src.layers):
        p, attn, mlp = f"layers.{i}.", layer.attention, layer.feed_forward
        q, k, v = split_wqkv(attn.wqkv.weight.detach(), config.num_key_value_heads, c["d_head"])
        state.update({p + "input_layernorm.weight": layer.attention_norm.weight,
                      p + "self_attn.q_proj.weight": q, p + "self_attn.k_proj.weight": k,
                      p + "self_attn.v_proj.weight": v,
                      p + "self_attn.o_proj.weight": attn.wo.weight,
                      p + "post_attention_layernorm.weight": layer.ffn_norm.weight,
                      p + "mlp.gate_proj.weight": mlp.w1.weight,
                      p + "mlp.up_proj.weight": mlp.w3.weight,
                      p + "mlp.down_proj.weight": mlp.w2.weight})
    body.load_state_dict(state, strict=True, assign=True)
    with torch.device(weight.device):  # the rotary's frequencies, off the meta device
        body.rotary_emb = type(body.rotary_emb)(config)
    return body.eval()


INTERNLM2 = register_architecture(
    Architecture(
        hf_class="InternLM2ForRewardModel",
        config=internlm2_config,
        convert=convert_internlm2,
        head=lambda m: m.v_head,
        suffix_ids=lambda c: [int(c.reward_token_id)],
        bridge_body=llama_body,
        description="InternLM2 reward models (v_head at an appended reward token; "
                    "trust_remote_code=True)",
    )
)
