"""Offline builders of tiny reward models and the ArmoRM reference module (for tests,
tutorials and users' own checks)."""

from tl_reward.testing.tiny import (
    ARCHITECTURES,
    BRIDGE_ARCHITECTURES,
    CONVERSATIONS,
    CUSTOM_ARCHITECTURES,
    PRM_ARCHITECTURES,
    save_tiny_reward_model,
    tiny_hf_reward_model,
    tiny_tokenizer,
)

__all__ = ["ARCHITECTURES", "BRIDGE_ARCHITECTURES", "CONVERSATIONS", "CUSTOM_ARCHITECTURES",
           "PRM_ARCHITECTURES", "save_tiny_reward_model", "tiny_hf_reward_model", "tiny_tokenizer"]
