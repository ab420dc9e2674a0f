"""Results print short: their name, each field's shape or value, never whole tensors."""

from __future__ import annotations

import torch

from tl_reward.analysis.attribution import direct_reward_attribution
from tl_reward.analysis.lens import differential_lens
from tl_reward.analysis.patching import activation_patching
from tl_reward.data import PreferencePair

PAIR = PreferencePair.from_prompt("Is the sky blue?", "Yes, the sky is blue.", "No, it is red.")


def _short(text: str, name: str) -> None:
    lines = text.splitlines()
    assert lines[0] == name and len(lines) <= 30, text
    assert max(map(len, lines)) <= 160, text
    assert "tensor([" not in text and "\n\n" not in text  # no tensor printed whole


def test_results_print_short(tiny) -> None:  # noqa: ANN001
    model = tiny("llama", 1)[0]
    dra = direct_reward_attribution(model, [("Is the sky blue?", "Yes.")] * 3, per_position=True)
    text = repr(dra)
    _short(text, "DirectAttribution")
    assert f"heads: Tensor[{', '.join(map(str, dra.heads.shape))}] float32, range [" in text
    lo, hi = float(dra.heads.min()), float(dra.heads.max())
    assert f"range [{lo:.4g}, {hi:.4g}]" in text  # the headline numbers are the data's
    res = activation_patching(model, PAIR, "resid", "denoising")
    _short(repr(res), "PatchingResult")
    lens = differential_lens(model, [PAIR])
    _short(repr(lens), "PairLens")
    margin = float(lens.differential()[0, -1, 0])
    assert f"margin: Tensor[1, 1] float32: [{margin:.4g}]" in repr(lens)  # the headline
    assert repr(res) == str(res)
    small = torch.tensor([0.5, -1.0])
    from tl_reward.results import describe

    assert describe(small) == "Tensor[2] float32: [0.5, -1]"


def test_rewards_sweeps_and_reports_print_short(tiny) -> None:  # noqa: ANN001
    """The rest of the result classes: rewards, sweeps, implicit rewards, readouts."""
    from tl_reward.model.readout import reward_readout
    from tl_reward.sweep.vocab_sweep import score_vocabulary

    model = tiny("llama", 1)[0]
    res = model.rewards([("Is the sky blue?", "Yes.")] * 40)
    _short(repr(res), "RewardResult")
    lo, hi = float(res.rewards.min()), float(res.rewards.max())
    assert f"range [{lo:.4g}, {hi:.4g}]" in repr(res) or lo == hi
    sweep = score_vocabulary(model, "Love?", list(range(20, 120)), progress=False)
    _short(repr(sweep), "VocabSweep")
    batch = model.build([("Is the sky blue?", "Yes.")])
    with torch.no_grad():
        resid = model(batch.tokens, attention_mask=batch.attention_mask,
                      stop_at_layer=model.cfg.n_layers)
    _short(repr(reward_readout(model, resid, batch.tokens, batch.attention_mask)), "Readout")
