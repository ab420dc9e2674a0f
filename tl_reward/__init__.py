"""tl_reward: mechanistic interpretability for reward models, on TransformerLens.

>>> from tl_reward import HookedRewardModel
>>> model = HookedRewardModel.from_pretrained("tl-reward/smollm2-135m-hh")
"""

from tl_reward.architectures import (
    Architecture,
    register_architecture,
    supported_architectures,
)
from tl_reward.data import Message, PreferencePair, load_hh_rlhf
from tl_reward.model import HookedRewardModel, RewardResult, score_pairs
from tl_reward.model.demo import DEMO_MODEL_NAME

__version__ = "0.1.0"

__all__ = [
    "DEMO_MODEL_NAME",
    "Architecture",
    "HookedRewardModel",
    "Message",
    "PreferencePair",
    "RewardResult",
    "load_hh_rlhf",
    "register_architecture",
    "score_pairs",
    "supported_architectures",
]
