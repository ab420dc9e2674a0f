"""An HF-style module with the published Qwen2.5-Math-PRM structure (Qwen/Qwen2.5-Math-PRM-7B,
``Qwen2ForProcessRewardModel`` in its ``modeling_qwen2_rm.py``).

It follows the published checkpoint: a ``Qwen2Model`` body and a two-layer ReLU MLP
``score = Sequential(Linear(d, d), ReLU, Linear(d, 2))`` applied at *every* position, so the
forward returns ``logits [batch, pos, 2]`` (no pooling). The config class is a ``Qwen2Config``
(``model_type`` ``"qwen2"``) under its own name, and the checkpoint's ``auto_map`` names only
``AutoConfig`` and ``AutoModel``, as the published one does.

The published usage (model card): the steps are joined with ``"<extra_0>"`` and one more
``"<extra_0>"`` follows the last step, as the assistant message of the chat template; a step's
reward is ``softmax(logits, -1)[..., 1]`` at each ``"<extra_0>"`` position. It is the
independent reference that tl_reward's PRM loading is tested against; it imports only torch and
transformers (``save_pretrained`` ships it beside the weights as custom code).
"""

from torch import nn
from transformers import Qwen2Config, Qwen2Model, Qwen2PreTrainedModel
from transformers.modeling_outputs import SequenceClassifierOutputWithPast


class Qwen2RMConfig(Qwen2Config):
    model_type = "qwen2"


class Qwen2ForProcessRewardModel(Qwen2PreTrainedModel):
    config_class = Qwen2RMConfig

    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = Qwen2Model(config)
        self.score = nn.Sequential(
            nn.Linear(config.hidden_size, config.hidden_size),
            nn.ReLU(),
            nn.Linear(config.hidden_size, self.num_labels),
        )
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, **kwargs):
        hidden_states = self.model(input_ids, attention_mask=attention_mask,
                                   position_ids=position_ids)[0]
        return SequenceClassifierOutputWithPast(logits=self.score(hidden_states))
