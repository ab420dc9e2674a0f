"""An HF-style module with the published ArmoRM structure (RLHFlow/ArmoRM-Llama3-8B-v0.1).

It is the independent reference that tl_reward's ArmoRM conversion is tested against, and a
way to build tiny ArmoRM-shaped models offline. It imports only torch and transformers so that
``save_pretrained`` can ship it as custom code (``trust_remote_code=True``), as the real model
does. ``score = sum(gating_output * (rewards @ reward_transform_matrix), dim=1)``.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaModel, LlamaPreTrainedModel
from transformers.utils import ModelOutput

# <|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n in the Llama-3 tokenizer
token_pattern = [128009, 128006, 78191, 128007, 271]


def find_token_for_gating(lst, pattern):
    """Index of the last occurrence of ``pattern`` in ``lst`` (its first token)."""
    n = len(pattern)
    for j in range(len(lst) - n, -1, -1):
        if lst[j : j + n] == pattern:
            return j
    raise ValueError("Token pattern not found in the list.")


def pooled_positions(config, input_ids):
    """The published pooled index: the first pad token minus one, modulo the length (-1, the
    last token, without a pad id, for one sequence only)."""
    if config.pad_token_id is None and input_ids.shape[0] != 1:
        raise ValueError("Cannot handle batch sizes > 1 if no padding token is defined.")
    if config.pad_token_id is None:
        return -1
    sequence_lengths = torch.eq(input_ids, config.pad_token_id).int().argmax(-1) - 1
    return sequence_lengths % input_ids.shape[-1]


class GatingNetwork(nn.Module):
    def __init__(self, in_features, out_features, bias=True, temperature=10, logit_scale=1.0,
                 hidden_dim=1024, n_hidden=3):
        super().__init__()
        self.temperature = temperature
        self.logit_scale = nn.Parameter(torch.ones(1) * logit_scale)
        layers = []
        for _ in range(n_hidden):
            layers.append(nn.Linear(in_features, hidden_dim))  # hidden layers always biased
            in_features = hidden_dim
        layers.append(nn.Linear(in_features, out_features, bias=bias))
        self.layers = nn.ModuleList(layers)

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = F.relu(x)
        x = F.softmax(x / self.temperature, dim=1)
        return x * self.logit_scale[0]


@dataclass
class CustomOutput(ModelOutput):
    rewards: torch.FloatTensor = None
    hidden_state: torch.FloatTensor = None
    prompt_embedding: torch.FloatTensor = None
    gating_output: torch.FloatTensor = None
    score: torch.FloatTensor = None
    logits: torch.FloatTensor = None


class LlamaForRewardModelWithGating(LlamaPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = LlamaModel(config)
        cfg = config.to_dict()
        self.num_objectives = cfg.get("num_objectives", 19)
        self.regression_layer = nn.Linear(config.hidden_size, self.num_objectives, bias=False)
        self.post_init()
        eye = torch.zeros(self.num_objectives, self.num_objectives)
        eye[range(self.num_objectives), range(self.num_objectives)] = 1.0
        self.reward_transform_matrix = nn.Parameter(eye)
        self.reward_transform_matrix.requires_grad = False
        self.gating = GatingNetwork(
            config.hidden_size, self.num_objectives,
            temperature=cfg.get("gating_temperature", 10),
            hidden_dim=cfg.get("gating_hidden_dim", 1024),
            n_hidden=cfg.get("gating_n_hidden", 3),
        )

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, **kwargs):
        out = self.model(input_ids, attention_mask=attention_mask, position_ids=position_ids)
        tokens_hidden_states = out[0]
        sequence_lengths = pooled_positions(self.config, input_ids)
        rows = torch.arange(input_ids.shape[0], device=tokens_hidden_states.device)
        hidden_states = tokens_hidden_states[rows, sequence_lengths]
        rewards = self.regression_layer(hidden_states)
        pattern = list(getattr(self.config, "gating_token_pattern", None) or token_pattern)
        gating_positions = [find_token_for_gating(ids.tolist(), pattern) for ids in input_ids]
        prompt_embedding = tokens_hidden_states[rows, gating_positions, :]
        gating_output = self.gating(prompt_embedding)
        rewards_adjusted = rewards @ self.reward_transform_matrix
        score = torch.sum(gating_output * rewards_adjusted, dim=1)
        return CustomOutput(rewards=rewards, hidden_state=hidden_states,
                            prompt_embedding=prompt_embedding, gating_output=gating_output,
                            score=score, logits=score)
