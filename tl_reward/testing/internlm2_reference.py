"""An HF-style module with the published InternLM2 reward-model structure
(internlm/internlm2-*-reward, ``InternLM2ForRewardModel``).

It follows the published modeling code: a fused ``wqkv`` projection whose output is laid out
``(kv_head, group + 2, head_dim)`` (the group's queries, then its key, then its value), ``wo``,
a SwiGLU ``feed_forward`` (``w2(silu(w1 x) * w3 x)``), RMSNorms ``attention_norm``/``ffn_norm``/
``norm``, rotary embeddings (rotate-half), and ``v_head = Linear(d, 1, bias=False)`` read at the
last position of the attention mask, which must hold ``config.reward_token_id`` (appended after
the conversation). Only the eager path for sequences within ``max_position_embeddings`` is
written (where the published dynamic-NTK rotary equals the plain one). Imports only torch and
transformers (shipped as custom code with ``save_pretrained``).
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import SequenceClassifierOutputWithPast


class InternLM2Config(PretrainedConfig):
    model_type = "internlm2"

    def __init__(self, vocab_size=103168, hidden_size=4096, intermediate_size=11008,
                 num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=None,
                 hidden_act="silu", max_position_embeddings=2048, rms_norm_eps=1e-6,
                 bias=False, rope_theta=10000, rope_scaling=None, reward_token_id=92527,
                 **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.rms_norm_eps = rms_norm_eps
        self.bias = bias
        self.rope_theta = rope_theta
        self.rope_scaling = rope_scaling
        self.reward_token_id = reward_token_id
        super().__init__(**kwargs)


class InternLM2RMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


class InternLM2Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // self.num_heads
        self.num_key_value_heads = config.num_key_value_heads
        self.num_key_value_groups = self.num_heads // self.num_key_value_heads
        self.rope_theta = config.rope_theta
        self.wqkv = nn.Linear(config.hidden_size,
                              (self.num_heads + 2 * self.num_key_value_heads) * self.head_dim,
                              bias=config.bias)
        self.wo = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=config.bias)

    def forward(self, x, mask, position_ids):
        b, q, _ = x.shape
        qkv = self.wqkv(x).reshape(b, q, self.num_key_value_heads,
                                   2 + self.num_key_value_groups, self.head_dim)
        query = qkv[..., : self.num_key_value_groups, :].reshape(b, q, self.num_heads,
                                                                 self.head_dim)
        key, value = qkv[..., -2, :], qkv[..., -1, :]
        query, key, value = (t.transpose(1, 2) for t in (query, key, value))
        inv_freq = 1.0 / (self.rope_theta ** (
            torch.arange(0, self.head_dim, 2, device=x.device).float() / self.head_dim))
        freqs = position_ids[:, :, None].float() * inv_freq[None, None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[:, None].to(x.dtype), emb.sin()[:, None].to(x.dtype)
        query = query * cos + rotate_half(query) * sin
        key = key * cos + rotate_half(key) * sin
        key = key.repeat_interleave(self.num_key_value_groups, dim=1)
        value = value.repeat_interleave(self.num_key_value_groups, dim=1)
        scores = query @ key.transpose(2, 3) / self.head_dim ** 0.5 + mask
        attn = F.softmax(scores.float(), dim=-1).to(query.dtype)
        out = (attn @ value).transpose(1, 2).reshape(b, q, -1)
        return self.wo(out)


class InternLM2MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.w1 = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.w3 = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.w2 = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class InternLM2DecoderLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = InternLM2Attention(config)
        self.feed_forward = InternLM2MLP(config)
        self.attention_norm = InternLM2RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.ffn_norm = InternLM2RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, x, mask, position_ids):
        x = x + self.attention(self.attention_norm(x), mask, position_ids)
        return x + self.feed_forward(self.ffn_norm(x))


class InternLM2PreTrainedModel(PreTrainedModel):
    config_class = InternLM2Config
    base_model_prefix = "model"


class InternLM2Model(InternLM2PreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([InternLM2DecoderLayer(config)
                                     for _ in range(config.num_hidden_layers)])
        self.norm = InternLM2RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        b, q = input_ids.shape
        x = self.tok_embeddings(input_ids)
        if position_ids is None:  # as published: positions ignore padding
            position_ids = torch.arange(q, device=x.device)[None].expand(b, -1)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        causal = torch.ones(q, q, dtype=torch.bool, device=x.device).tril()
        allowed = causal[None, None] & attention_mask[:, None, None, :].bool()
        mask = torch.zeros(allowed.shape, dtype=x.dtype, device=x.device)
        mask = mask.masked_fill(~allowed, torch.finfo(x.dtype).min)
        for layer in self.layers:
            x = layer(x, mask, position_ids)
        return (self.norm(x),)


class InternLM2ForRewardModel(InternLM2PreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.model = InternLM2Model(config)
        self.v_head = nn.Linear(config.hidden_size, 1, bias=False)
        self.reward_token_id = config.reward_token_id
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, **kwargs):
        eos = attention_mask.size(1) - 1 - attention_mask.long().fliplr().argmax(dim=1,
                                                                                 keepdim=True)
        last = input_ids.gather(dim=1, index=eos).squeeze(1)
        assert torch.all(last == self.reward_token_id).item(), \
            "The last token of input_ids must be the reward token"
        hidden_states = self.model(input_ids, attention_mask=attention_mask,
                                   position_ids=position_ids)[0]
        values = self.v_head(hidden_states).squeeze(-1)
        scores = values.gather(dim=1, index=eos).squeeze(1)
        return SequenceClassifierOutputWithPast(logits=scores)
