"""Planted models save and reload with their truth."""

from __future__ import annotations

from pathlib import Path

import torch

from tl_reward.planted import (
    plant_implicit_reward,
    plant_objectives,
    plant_shared_prefix,
    plant_trigger_head,
)
from tl_reward.planted.store import load_planted, save_planted
from tl_reward.testing import tiny_hf_reward_model


def test_every_truth_round_trips(tmp_path: Path) -> None:
    hf, tok = tiny_hf_reward_model("llama")
    lm, _ = tiny_hf_reward_model("nemotron")
    plants = {"trigger": plant_trigger_head(hf, tok, " sky", vocab_per_prompt=32, n_random=8),
              "trigger-flag": plant_trigger_head(hf, tok, " sky", key="flag"),
              "objectives": plant_objectives(hf, tok, n_per_prompt=4),
              "prefix": plant_shared_prefix(hf, tok, 1),
              "implicit": plant_implicit_reward(lm, tok)}
    for name, p in plants.items():
        back = load_planted(save_planted(p, tmp_path / name))
        assert back.truth == p.truth, name
        for side in ("model", "base"):  # the same weights (reloads may pick another kernel)
            a, b = getattr(p, side).state_dict(), getattr(back, side).state_dict()
            assert a.keys() == b.keys(), (name, side)
            assert all(torch.equal(a[k], b[k]) for k in a), (name, side)
        assert type(back.model) is type(p.model)
