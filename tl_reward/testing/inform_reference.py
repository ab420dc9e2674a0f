"""An HF-style module with the published INF-ORM structure (infly/INF-ORM-Llama3.1-70B).

It follows the modeling code on the model card: a ``LlamaModel`` body and
``score = Sequential(Linear(d, d), ReLU, Linear(d, num_labels))`` applied at every position,
read at the legacy position (first pad token minus one, modulo the length). It is the
independent reference that tl_reward's MLP-head conversion is tested against; it imports torch,
transformers and :mod:`.armorm_reference`, which ``save_pretrained`` ships beside it as custom code.
"""

import torch
from torch import nn
from transformers import LlamaModel, LlamaPreTrainedModel
from transformers.modeling_outputs import SequenceClassifierOutputWithPast

from .armorm_reference import pooled_positions


class INFORMForSequenceClassification(LlamaPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = LlamaModel(config)
        self.score = nn.Sequential(
            nn.Linear(config.hidden_size, config.hidden_size),
            nn.ReLU(),
            nn.Linear(config.hidden_size, self.num_labels),
        )
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, **kwargs):
        hidden_states = self.model(input_ids, attention_mask=attention_mask,
                                   position_ids=position_ids)[0]
        logits = self.score(hidden_states)
        sequence_lengths = pooled_positions(self.config, input_ids)
        if isinstance(sequence_lengths, torch.Tensor):
            sequence_lengths = sequence_lengths.to(logits.device)
        pooled = logits[torch.arange(input_ids.shape[0], device=logits.device), sequence_lengths]
        return SequenceClassifierOutputWithPast(logits=pooled)
