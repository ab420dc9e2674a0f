"""tl_reward: mechanistic interpretability for reward models, on TransformerLens.

>>> from tl_reward import HookedRewardModel
>>> model = HookedRewardModel.from_pretrained("tl-reward/smollm2-135m-hh")
"""

from tl_reward._lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "DEMO_MODEL_NAME": "tl_reward.model.demo",
    "Architecture": "tl_reward.architectures",
    "HookedRewardModel": "tl_reward.model.hooked_reward_model",
    "BridgeRewardModel": "tl_reward.model.bridge_reward_model",
    "Message": "tl_reward.data.conversation",
    "PreferencePair": "tl_reward.data.preference",
    "RewardResult": "tl_reward.model.scoring",
    "load_hh_rlhf": "tl_reward.data.hh_rlhf",
    "load_result": "tl_reward.results",
    "register_architecture": "tl_reward.architectures",
    "score_pairs": "tl_reward.model.scoring",
    "supported_architectures": "tl_reward.architectures",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
