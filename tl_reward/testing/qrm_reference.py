"""An HF-style module with the published QRM structure (nicolinho/QRM-Llama3.1-8B).

It follows the published modeling code (``LlamaForRewardModelWithGating31``): a Llama body, a
``regression_layer`` giving ``num_quantiles`` quantiles per objective at the pooled token (first
pad minus one), a gating network of ``Linear(no bias) -> ReLU -> BatchNorm1d`` blocks and a
final ``Linear``, softmax at a temperature times a learned scale, read at the start of the last
assistant header; ``rewards = E_q[quantiles] @ T`` and ``score = sum(gate * rewards)``. One
addition for tiny tokenizers: ``config.gating_token_pattern`` overrides the Llama-3 header ids.
Imports torch, transformers and the published helpers in :mod:`.armorm_reference` (shipped
beside it as custom code by ``save_pretrained``).
"""

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaModel, LlamaPreTrainedModel
from transformers.utils import ModelOutput

from .armorm_reference import find_token_for_gating, pooled_positions, token_pattern


class GatingNetwork(nn.Module):
    def __init__(self, in_features, out_features, bias=True, temperature=10, logit_scale=1.0,
                 hidden_dim=1024, n_hidden=3):
        super().__init__()
        self.temperature = temperature
        self.logit_scale = nn.Parameter(torch.ones(1) * logit_scale)
        layers = []
        for _ in range(n_hidden):
            layers.append(nn.Linear(in_features, hidden_dim, bias=False))
            layers.append(nn.ReLU())
            layers.append(nn.BatchNorm1d(hidden_dim))
            in_features = hidden_dim
        layers.append(nn.Linear(in_features, out_features, bias=bias))
        self.layers = nn.ModuleList(layers)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        x = F.softmax(x / self.temperature, dim=1)
        return x * self.logit_scale[0]


@dataclass
class CustomOutput(ModelOutput):
    reward_quantiles: torch.FloatTensor = None
    rewards: torch.FloatTensor = None
    gating_output: torch.FloatTensor = None
    score: torch.FloatTensor = None
    logits: torch.FloatTensor = None


class LlamaForRewardModelWithGating31(LlamaPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.model = LlamaModel(config)
        self.num_labels = config.num_labels
        cfg = config.to_dict()
        self.num_objectives = cfg.get("num_objectives", 19)
        self.num_quantiles = config.num_quantiles
        self.regression_layer = nn.Linear(config.hidden_size,
                                          config.num_quantiles * self.num_objectives, bias=False)
        self.post_init()
        t = torch.zeros(self.num_objectives, self.num_objectives)
        t[range(self.num_objectives), range(self.num_objectives)] = 1.0
        self.reward_transform_matrix = nn.Parameter(t)
        self.reward_transform_matrix.requires_grad = False
        self.gating = GatingNetwork(
            config.hidden_size, self.num_objectives,
            temperature=cfg.get("gating_temperature", 10),
            hidden_dim=cfg.get("gating_hidden_dim", 1024),
            n_hidden=cfg.get("gating_n_hidden", 3),
        )

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, **kwargs):
        tokens_hidden_states = self.model(input_ids, attention_mask=attention_mask,
                                          position_ids=position_ids)[0]
        sequence_lengths = pooled_positions(self.config, input_ids)
        rows = torch.arange(input_ids.shape[0], device=tokens_hidden_states.device)
        hidden_states = tokens_hidden_states[rows, sequence_lengths]
        # the published code runs the head in float32 (``.float()`` inputs under an autocast
        # to float32); written out here so a bfloat16 model runs too
        rewards = F.linear(hidden_states.float(), self.regression_layer.weight.float())
        rewards = rewards.reshape(-1, self.num_objectives, self.num_quantiles)
        pattern = list(getattr(self.config, "gating_token_pattern", None) or token_pattern)
        positions = [find_token_for_gating(ids.tolist(), pattern) for ids in input_ids]
        prompt_embedding = tokens_hidden_states[rows, positions, :]
        gating = self.gating
        if gating.layers[0].weight.dtype != torch.float32:
            gating = copy.deepcopy(gating).float()
        gating_output = gating(prompt_embedding.float())
        quantiles_adjusted = torch.matmul(torch.transpose(rewards.float(), 1, 2),
                                          self.reward_transform_matrix.float())
        reward_quantiles = torch.mul(
            gating_output.unsqueeze(-1).repeat(1, 1, self.num_objectives),
            torch.transpose(quantiles_adjusted, 1, 2),
        ).sum(1)
        expectation = rewards.float().mean(dim=2)
        expectation_adjusted = expectation @ self.reward_transform_matrix.float()
        score = torch.sum(gating_output * expectation_adjusted, dim=1, keepdim=True)
        return CustomOutput(reward_quantiles=reward_quantiles, rewards=expectation_adjusted,
                            gating_output=gating_output, score=score, logits=score)
