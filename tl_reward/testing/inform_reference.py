"""An HF-style module with the published INF-ORM structure (infly/INF-ORM-Llama3.1-70B).

It follows the modeling code on the model card: a ``LlamaModel`` body and
``score = Sequential(Linear(d, d), ReLU, Linear(d, num_labels))`` applied at every position,
read at the legacy position (first pad token minus one, modulo the length). It is the
independent reference that tl_reward's MLP-head conversion is tested against, and imports only
torch and transformers so ``save_pretrained`` can ship it as custom code.
"""

import torch
from torch import nn
from transformers import LlamaModel, LlamaPreTrainedModel
from transformers.modeling_outputs import SequenceClassifierOutputWithPast


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
        batch_size = input_ids.shape[0]
        if self.config.pad_token_id is None and batch_size != 1:
            raise ValueError("Cannot handle batch sizes > 1 if no padding token is defined.")
        if self.config.pad_token_id is None:
            sequence_lengths = -1
        else:
            sequence_lengths = torch.eq(input_ids, self.config.pad_token_id).int().argmax(-1) - 1
            sequence_lengths = (sequence_lengths % input_ids.shape[-1]).to(logits.device)
        pooled = logits[torch.arange(batch_size, device=logits.device), sequence_lengths]
        return SequenceClassifierOutputWithPast(logits=pooled)
