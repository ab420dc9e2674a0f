"""Loading reward models into TransformerLens, their heads, pooling and inputs."""

from tl_reward.model.heads import ArmoRMHead, LinearRewardHead, RewardHead
from tl_reward.model.hooked_reward_model import HookedRewardModel
from tl_reward.model.inputs import EncodedInput, RewardBatch
from tl_reward.model.scoring import PairScores, RewardResult, score_pairs

__all__ = [
    "ArmoRMHead",
    "EncodedInput",
    "HookedRewardModel",
    "HookedSAERewardModel",
    "LinearRewardHead",
    "PairScores",
    "RewardBatch",
    "RewardHead",
    "RewardResult",
    "score_pairs",
]


def __getattr__(name: str) -> object:
    """``HookedSAERewardModel`` is imported on first use (SAELens takes a second to import)."""
    if name == "HookedSAERewardModel":
        from tl_reward.model.hooked_sae_reward_model import HookedSAERewardModel

        return HookedSAERewardModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
