"""Loading reward models into TransformerLens, their heads, pooling and inputs."""

from tl_reward.model.heads import ArmoRMHead, LinearRewardHead, RewardHead
from tl_reward.model.hooked_reward_model import HookedRewardModel
from tl_reward.model.inputs import EncodedInput, RewardBatch
from tl_reward.model.scoring import PairScores, RewardResult, score_pairs

__all__ = [
    "ArmoRMHead",
    "EncodedInput",
    "HookedRewardModel",
    "LinearRewardHead",
    "PairScores",
    "RewardBatch",
    "RewardHead",
    "RewardResult",
    "score_pairs",
]
