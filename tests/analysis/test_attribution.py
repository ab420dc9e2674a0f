"""DRA identities on every architecture: components sum to the reward (HF's forward), heads to
their layer's attention output, neurons to their MLP, source positions to their head."""

from __future__ import annotations

import pytest
import torch
from helpers import hf_rewards

from tl_reward.analysis.attribution import differential_attribution, direct_reward_attribution
from tl_reward.analysis.components import final_components
from tl_reward.data import PreferencePair
from tl_reward.testing import ARCHITECTURES

INPUTS = [("Is the sky blue?", "Yes, the sky is blue on a clear day."), ("hi", "No.")]
CASES = [(a, k) for a in ARCHITECTURES for k in ((3,) if a == "armorm" else (1, 3))]


@pytest.mark.parametrize(("arch", "k"), CASES, ids=[f"{a}-K{k}" for a, k in CASES])
def test_components_sum_to_hf_reward(tiny, arch: str, k: int) -> None:
    model, hf, _ = tiny(arch, k)
    dra = direct_reward_attribution(model, INPUTS, neurons=True, per_position=True)
    batch = model.make_batch(INPUTS)
    ref = hf_rewards(hf, batch.tokens, batch.attention_mask)
    total = dra.total()
    # every objective column against HF's own rewards; ArmoRM's score via w_eff(x)
    cols = [dra.objectives.index(o) for o in model.objectives]
    torch.testing.assert_close(total[:, cols], ref["reward"], atol=1e-4, rtol=0)
    if "score" in dra.objectives and ref["score"] is not None:
        torch.testing.assert_close(total[:, dra.objectives.index("score")], ref["score"],
                                   atol=1e-4, rtol=0)
    # neurons + MLP bias = MLP; source positions = head
    assert dra.neurons is not None and dra.mlp_bias is not None
    torch.testing.assert_close(dra.neurons.sum(2) + dra.mlp_bias, dra.mlp, atol=1e-4, rtol=0)
    assert dra.head_positions is not None
    for i, hp in enumerate(dra.head_positions):
        assert hp.shape[2] == int(batch.lengths[i])
        torch.testing.assert_close(hp.sum(2), dra.heads[i], atol=1e-4, rtol=0)
        # causal attention: nothing after the pooled token contributes
        assert torch.count_nonzero(hp[:, :, int(dra.positions[i]) + 1 :]) == 0
    # the token map plus the rest at t* is the reward
    tm = dra.token_map(0, 0)
    assert tm.contribution.sum() == pytest.approx(float(dra.reward[0, 0]), abs=1e-4)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_heads_sum_to_attention_output(tiny, arch: str) -> None:
    model, _, _ = tiny(arch, 3 if arch == "armorm" else 1)
    batch = model.make_batch(INPUTS)
    _, cache = model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask)
    pos = model.pool_positions(batch.tokens, batch.attention_mask)
    comps = final_components(model, cache, pos)
    rows = torch.arange(len(pos))
    for layer in range(model.cfg.n_layers):
        out = cache[f"blocks.{layer}.hook_attn_out"][rows, pos]
        torch.testing.assert_close(comps.heads[:, layer].sum(1) + comps.attn_bias[:, layer], out,
                                   atol=1e-4, rtol=0)
    stack, names = comps.stack("head")
    assert len(names) == stack.shape[1]
    torch.testing.assert_close(stack.sum(1), comps.resid, atol=1e-4, rtol=0)


def test_differential_attribution_sums_to_margin(tiny) -> None:
    model, _, _ = tiny("llama", 1)
    pairs = [PreferencePair.from_prompt("Is the sky blue?", "Yes, on a clear day.", "No."),
             PreferencePair.from_prompt("hi", "Hello! How can I help?", "Go away.")]
    pa = differential_attribution(model, pairs)
    diff, names = pa.difference("head")
    bias_diff = pa.chosen.bias - pa.rejected.bias
    torch.testing.assert_close(diff.sum(1) + bias_diff, pa.margin, atol=1e-4, rtol=0)
    scores = model.rewards([c for p in pairs for c in (p.chosen_conversation(),
                                                       p.rejected_conversation())]).score
    torch.testing.assert_close(pa.margin[:, 0], scores[0::2] - scores[1::2], atol=1e-4, rtol=0)
    df = pa.to_dataframe("sublayer")
    assert len(df) == 2 * len(pa.difference("sublayer")[1])
    assert set(df.component) >= {"embed", "L0.attn", "L2.mlp"}


def test_neuron_level_components_and_top_components(tiny) -> None:
    """``top_components(level="neuron")`` after ``neurons=True`` raised "level must be sublayer
    or head". The neuron level sums, with the head's bias, to HF's reward; its top entry is the
    largest terms, each neuron named by its layer and index."""
    model, hf, _ = tiny("llama", 1)
    dra = direct_reward_attribution(model, INPUTS, neurons=True)
    vals, names = dra.components("neuron")
    batch = model.make_batch(INPUTS)
    ref = hf_rewards(hf, batch.tokens, batch.attention_mask)["reward"]
    torch.testing.assert_close(vals.sum(1) + dra.bias, ref, atol=1e-4, rtol=0)
    n_layers, d_mlp = dra.neurons.shape[1:3]
    assert sum(n.endswith("mlp_bias") for n in names) == n_layers
    assert len(names) == vals.shape[1] == len(dra.components("head")[1]) + n_layers * d_mlp
    top = dra.top_components(10, index=1, level="neuron")
    assert top.contribution.abs().is_monotonic_decreasing
    neurons = [(c, v) for c, v in zip(top.component, top.contribution, strict=True)
               if ".N" in c]
    assert neurons  # 3 x 64 neurons: some are among the ten largest terms
    for c, v in neurons:  # each name points at its own neuron's term
        layer, idx = int(c[1:c.index(".")]), int(c[c.index(".N") + 2:])
        assert v == pytest.approx(float(dra.neurons[1, layer, idx, 0]), abs=1e-6)
    tenth = float(dra.neurons[1, ..., 0].abs().flatten().topk(10).values[-1])
    assert abs(top.contribution[9]) >= tenth - 1e-6  # no larger neuron was left out
    plain = direct_reward_attribution(model, INPUTS)
    with pytest.raises(ValueError, match="neurons=True"):
        plain.top_components(level="neuron")
