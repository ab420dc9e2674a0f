"""The recovery helpers and the planting errors."""

from __future__ import annotations

import pytest
import torch

from tl_reward.errors import TLRewardError
from tl_reward.planted import plant_trigger_head
from tl_reward.planted.recovery import component_name, rank_of
from tl_reward.testing import tiny_hf_reward_model

NAMES = ["embed", "L0.H0", "L0.H1", "L0.attn_bias", "L0.mlp", "L1.H0", "L1.H1", "L1.mlp"]


def test_component_names_match_the_analyses() -> None:
    assert component_name(("head", 2, 0)) == "L2.H0"
    assert component_name(("mlp", 1)) == "L1.mlp"


def test_rank_is_by_magnitude_among_heads_with_ties_against() -> None:
    vals = torch.tensor([9.0, 0.5, -3.0, 7.0, 8.0, 3.0, 0.0, 1.0])
    assert rank_of(vals, NAMES, "L0.H1") == 2  # |-3| ties |3|: the tie counts against ...
    assert rank_of(vals, NAMES, "L1.H0") == 2  # ... both
    assert rank_of(vals, NAMES, "L0.H0") == 3
    assert rank_of(vals, NAMES, "L1.H1") == 4
    assert rank_of(vals, NAMES, "L0.H1", heads_only=False) == 5  # embed, bias, mlp count


def test_a_trigger_of_several_tokens_is_refused() -> None:
    hf, tok = tiny_hf_reward_model("llama")
    with pytest.raises(TLRewardError, match="tokens; pass one token"):
        plant_trigger_head(hf, tok, " certainly")


def test_an_earlier_block_is_refused() -> None:
    hf, tok = tiny_hf_reward_model("llama")
    with pytest.raises(TLRewardError, match="plant in the last block"):
        plant_trigger_head(hf, tok, " sky", layer=1)
