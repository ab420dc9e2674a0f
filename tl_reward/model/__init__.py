"""Loading reward models into TransformerLens, their heads, pooling and inputs."""

from tl_reward._lazy import lazy_exports

_EXPORTS = {
    "ArmoRMHead": "tl_reward.model.heads",
    "BridgeRewardModel": "tl_reward.model.bridge_reward_model",
    "EncodedInput": "tl_reward.model.inputs",
    "HookedRewardModel": "tl_reward.model.hooked_reward_model",
    "HookedSAERewardModel": "tl_reward.model.hooked_sae_reward_model",
    "JudgeFormat": "tl_reward.model.judge",
    "LinearRewardHead": "tl_reward.model.heads",
    "PairScores": "tl_reward.model.scoring",
    "RatingHead": "tl_reward.model.rating_head",
    "RewardBatch": "tl_reward.model.inputs",
    "RewardHead": "tl_reward.model.heads",
    "RewardResult": "tl_reward.model.scoring",
    "score_pairs": "tl_reward.model.scoring",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
