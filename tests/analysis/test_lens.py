"""Reward lens: the last layer is HF's reward in both conventions; frozen increments are the
blocks' direct contributions; crystallisation by brute force; tuned lens R^2 against sklearn."""

from __future__ import annotations

import pytest
import torch
from helpers import CONVERSATIONS, hf_rewards
from sklearn.metrics import r2_score

from tl_reward.analysis.attribution import direct_reward_attribution
from tl_reward.analysis.lens import differential_lens, reward_lens
from tl_reward.analysis.tuned_lens import tuned_reward_lens
from tl_reward.data import PreferencePair
from tl_reward.testing import ARCHITECTURES

CASES = [(a, 3 if a in ("armorm", "qwen2") else 1) for a in ARCHITECTURES]


@pytest.mark.parametrize(("arch", "k"), CASES, ids=[a for a, _ in CASES])
def test_last_lens_layer_is_the_reward(tiny, arch: str, k: int) -> None:
    model, hf, _ = tiny(arch, k)
    lens = reward_lens(model, CONVERSATIONS)
    batch = model.make_batch(CONVERSATIONS)
    ref = hf_rewards(hf, batch.tokens, batch.attention_mask)
    cols = [lens.objectives.index(o) for o in model.objectives]
    for conv in ("frozen", "recompute"):
        torch.testing.assert_close(lens.values[conv][:, -1, cols], ref["reward"], atol=1e-4,
                                   rtol=0)
        if "score" in lens.objectives:
            torch.testing.assert_close(lens.values[conv][:, -1, 0], ref["score"], atol=1e-4,
                                       rtol=0)
    # frozen increments are each block's direct contribution (attention + MLP DRA)
    dra = direct_reward_attribution(model, CONVERSATIONS)
    torch.testing.assert_close(lens.increments("frozen"), dra.attn + dra.mlp, atol=1e-4, rtol=0)
    torch.testing.assert_close(lens.values["frozen"][:, 0], dra.embed.sum(1) + dra.bias,
                               atol=1e-4, rtol=0)
    assert lens.layer_names[0] == "embed" and len(lens.layer_names) == model.cfg.n_layers + 1


def test_differential_lens_and_crystallisation(tiny) -> None:
    model, _, _ = tiny("gemma2", 1)
    pairs = [PreferencePair.from_prompt("Is the sky blue?", "Yes, the sky is blue.", "No."),
             PreferencePair.from_prompt("hi", "Hello! How can I help?", "Go away."),
             PreferencePair.from_prompt("What is love?", "Love. Music.", "Hate. War.")]
    pl = differential_lens(model, pairs)
    d = pl.differential()
    scores = model.rewards([c for p in pairs for c in (p.chosen_conversation(),
                                                       p.rejected_conversation())]).score
    torch.testing.assert_close(d[:, -1, 0], scores[0::2] - scores[1::2], atol=1e-4, rtol=0)
    for frac in (0.25, 0.5, 0.9):
        got = pl.crystallisation_layer(frac)[:, 0].tolist()
        for i in range(len(pairs)):
            final = float(d[i, -1, 0])
            want = next(li for li in range(d.shape[1])
                        if (float(d[i, li, 0]) * (1 if final > 0 else -1)) >= frac * abs(final))
            assert got[i] == want
    assert set(pl.to_dataframe().crystallisation_layer) <= set(pl.chosen.layer_names)


def test_tuned_lens_heldout_r2(tiny) -> None:
    model, _, _ = tiny("llama", 1)
    inputs = [(f"Question {i}?", f"The sky is {'blue' if i % 2 else 'red'} and {i * 7} dogs.")
              for i in range(48)]
    tuned = tuned_reward_lens(model, inputs, test_fraction=0.25, seed=1)
    assert tuned.n_test == 12 and tuned.n_train == 36
    # the final layer's normed residual maps linearly onto the reward: R^2 ~ 1
    assert float(tuned.r2_test[-1, 0]) > 0.99 and float(tuned.r2_frozen[-1, 0]) == pytest.approx(1)
    # reported R^2 is sklearn's, for predictions on the held-out inputs
    perm = torch.tensor(__import__("numpy").random.default_rng(1).permutation(48))
    test = [inputs[i] for i in perm[:12].tolist()]
    pred = tuned.predict(model, test)
    truth = model.rewards(test).score
    for layer in (0, 2):
        assert float(tuned.r2_test[layer, 0]) == pytest.approx(
            r2_score(truth.numpy(), pred[:, layer, 0].numpy()), abs=1e-4)
    assert len(tuned.to_dataframe()) == model.cfg.n_layers + 1


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_recompute_lens_below_the_last_layer(tiny, arch: str) -> None:
    """At every layer below the last, the "recompute" lens is the model's own final norm and
    head applied to that layer's residual (TransformerLens's ``ln_final`` and ``unembed``
    modules, not the library's readout): checked on an RMSNorm and a LayerNorm model, where
    centring the direction matters. Dropping the centring or using the final scale fails it."""
    model, _, _ = tiny(arch)
    lens = reward_lens(model, CONVERSATIONS)
    batch = model.make_batch(CONVERSATIONS)
    names = ["blocks.0.hook_resid_pre"] + [f"blocks.{i}.hook_resid_post"
                                           for i in range(model.cfg.n_layers)]
    _, cache = model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask)
    rows = torch.arange(batch.tokens.shape[0])
    for layer, name in enumerate(names[:-1]):
        h = cache[name][rows, batch.pooled]
        ref = model.unembed(model.ln_final(h[:, None]))[:, 0, 0]
        torch.testing.assert_close(lens.values["recompute"][:, layer, 0], ref, atol=1e-5, rtol=0)
        frozen_wrong = (lens.values["frozen"][:, layer, 0] - ref).abs().max()
        assert frozen_wrong > 1e-3  # the conventions differ below the last layer
