"""Ablation corruption: position classes and their means against hand construction, and
preference pairs (each reply ablated on its own) against the two replies scored apart."""

from __future__ import annotations

import pytest
import torch
from helpers import hf_rewards

from tl_reward.analysis.patching import mean_activations
from tl_reward.circuits import edge_attribution

ITEMS = [("hi there friend", "a short reply"),
         ("what?", "a much longer reply than the other one here"), ("ok", "fine")]
PAIRS = [("hi there friend", "a short reply", "no"), ("what?", "yes indeed", "a much longer one")]


def _hand_classes(model, item) -> list[int]:
    enc = model.encode(item)
    t = torch.tensor([enc.ids])
    pooled = int(model.pool_positions(t, torch.ones_like(t))[0])
    out = [0 if i < enc.response_start else 1 for i in range(len(enc.ids))]
    out[pooled] = 2
    return out


@pytest.mark.parametrize("side", ["left", "right"])
def test_position_classes_match_hand_construction(tiny, side: str) -> None:
    model, _, _ = tiny("llama")
    got = model.build(ITEMS, side).position_classes()
    width = got.shape[1]
    for row, item in zip(got.tolist(), ITEMS, strict=True):
        hand = _hand_classes(model, item)
        pad = [-1] * (width - len(hand))
        assert row == (pad + hand if side == "left" else hand + pad)


def test_class_means_match_hand_means(tiny) -> None:
    model, _, _ = tiny("llama")
    hook = "blocks.1.hook_mlp_out"
    got = mean_activations(model, ITEMS, [hook], batch_size=2, by_class=True)[hook]
    acts, classes = [], []
    for item in ITEMS:
        _, cache = model.run_with_cache(torch.tensor([model.encode(item).ids]), return_type=None)
        acts.append(cache[hook][0])
        classes += _hand_classes(model, item)
    acts_t, cls = torch.cat(acts), torch.tensor(classes)
    want = torch.stack([acts_t[cls == c].mean(0) for c in range(3)])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_pairs_are_the_margin_of_their_replies_ablated_apart(tiny) -> None:
    model, hf, _ = tiny("llama")
    ref = [(p, c) for p, c, _ in PAIRS] + [(p, r) for p, _, r in PAIRS]
    pairs = edge_attribution(model, PAIRS, ablation="mean", reference=ref, method="exact")
    ch = edge_attribution(model, [(p, c) for p, c, _ in PAIRS], ablation="mean", reference=ref,
                          method="exact", batch_size=1)
    rj = edge_attribution(model, [(p, r) for p, _, r in PAIRS], ablation="mean", reference=ref,
                          method="exact", batch_size=1)
    torch.testing.assert_close(pairs.scores, ch.scores - rj.scores, atol=2e-5, rtol=0,
                               equal_nan=True)
    for i, (p, c, r) in enumerate(PAIRS):
        tc, tr = (torch.tensor([model.encode((p, x)).ids]) for x in (c, r))
        margin = (hf_rewards(hf, tc, torch.ones_like(tc))["reward"][0, 0]
                  - hf_rewards(hf, tr, torch.ones_like(tr))["reward"][0, 0])
        assert float(pairs.clean_metric[i]) == pytest.approx(float(margin), abs=2e-5)
