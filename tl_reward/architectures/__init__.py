"""Supported HF reward-model architectures, one file each, and the registry."""

from tl_reward.architectures import (  # noqa: F401
    armorm,
    gemma2,
    gpt2,
    inform,
    internlm2,
    llama,
    mistral,
    qrm,
    qwen2,
    qwen2_prm,
    qwen3,
)
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
