"""Shared fixtures of the RL tests: the tiny reward model and its trigger-planted copy
(trigger ``" sky"`` in head L2.H0)."""

from __future__ import annotations

from typing import Any

import pytest
from rl_script import TRIGGER

from tl_reward.planted import PlantedModel, plant_trigger_head
from tl_reward.testing import tiny_hf_reward_model


@pytest.fixture(scope="session")
def planted() -> PlantedModel:
    hf, tok = tiny_hf_reward_model("llama")
    return plant_trigger_head(hf, tok, TRIGGER, vocab_per_prompt=32, n_random=16)


@pytest.fixture(scope="session")
def rm(planted: PlantedModel) -> Any:
    """The planted reward model, hooked."""
    from tl_reward import HookedRewardModel

    return HookedRewardModel.from_pretrained(hf_model=planted.model, tokenizer=planted.tokenizer,
                                             device="cpu")


@pytest.fixture(scope="session")
def base_rm() -> Any:
    """The reward model before planting (head L2.H0 an ordinary head), hooked."""
    from tl_reward import HookedRewardModel

    hf, tok = tiny_hf_reward_model("llama")
    return HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu")
