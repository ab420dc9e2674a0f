"""Supported HF reward-model architectures, one file each, and the registry."""

from tl_reward.architectures import armorm, gemma2, gpt2, llama, mistral, qwen2, qwen3  # noqa: F401
from tl_reward.architectures.registry import (
    Architecture,
    architecture_of,
    get_architecture,
    register_architecture,
    supported_architectures,
)

__all__ = [
    "Architecture",
    "architecture_of",
    "get_architecture",
    "register_architecture",
    "supported_architectures",
]
