"""The identities on the real demo backbone (SmolLM2-135M, 30 layers, GQA, tied chat tokens)."""

from __future__ import annotations

import pytest
import torch

from tl_reward.analysis.attribution import differential_attribution
from tl_reward.analysis.direct_path import direct_path_patching
from tl_reward.analysis.lens import differential_lens
from tl_reward.analysis.patching import activation_patching
from tl_reward.data import PreferencePair
from tl_reward.data.pairs import tokenize_pair


@pytest.fixture
def demo(demo_rm):  # noqa: ANN001, ANN201
    """The demo RM (conftest's ``demo_rm``, loaded once per session)."""
    return demo_rm


@pytest.mark.slow
def test_demo_rm_identities(demo) -> None:
    pair = PreferencePair.from_prompt("Can you tell me a joke?",
                                      "Why did the scarecrow win an award? He was outstanding.",
                                      "No.")
    tp = tokenize_pair(demo, pair)
    assert tp.chosen_ids[-2:] == tp.rejected_ids[-2:] == [2, 198]  # <|im_end|> \n
    scores = demo.rewards([pair.chosen_conversation(), pair.rejected_conversation()]).score
    dra = differential_attribution(demo, [tp], per_position=True)
    torch.testing.assert_close(dra.chosen.total()[:, 0], scores[:1], atol=1e-4, rtol=0)
    torch.testing.assert_close(dra.margin[0, 0], scores[0] - scores[1], atol=1e-4, rtol=0)
    for hp, heads in ((dra.chosen.head_positions[0], dra.chosen.heads[0]),
                      (dra.rejected.head_positions[0], dra.rejected.heads[0])):
        torch.testing.assert_close(hp.sum(2), heads, atol=1e-4, rtol=0)
    lens = differential_lens(demo, [tp])
    torch.testing.assert_close(lens.differential("recompute")[0, -1, 0], dra.margin[0, 0],
                               atol=1e-4, rtol=0)
    final = activation_patching(demo, tp, "resid", "denoising", positions="all",
                                layers=[demo.cfg.n_layers])
    assert float(final.patched[0]) == pytest.approx(float(scores[0]), abs=1e-4)
    frozen = direct_path_patching(demo, tp, level="sublayer", scale="frozen")
    diff, _ = dra.difference("sublayer")
    torch.testing.assert_close(frozen.effect * frozen.delta, diff[0, :, 0], atol=1e-4, rtol=0)
