"""Layer x layer maps: streamed Grams against full caches, and every cell against similarity.py."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from tl_reward.compare.layers import compare_grams, compare_layers, layer_grams
from tl_reward.compare.similarity import SIMILARITIES, permutation_test
from tl_reward.errors import TLRewardError
from tl_reward.model.inputs import encode
from tl_reward.testing.tiny import tiny_tokenizer

WORDS = ["Is the sky blue?", "Yes, on a clear day.", "No.", "I cannot help with that.",
         "Love. Friendship. Music.", "Drink water and sleep well.", "Hate. War.", "Sure!",
         "The quick brown fox jumps over the lazy dog.", "Thanks for asking."]
INPUTS = [[{"role": "user", "content": WORDS[i % 10]},
           {"role": "assistant", "content": WORDS[(3 * i + 1) % 10] + " " * (i % 2) + "ok"}]
          for i in range(8)]


@cache
def tiny_lm(seed: int = 0) -> HookedTransformer:
    """A tiny TransformerLens causal LM (GPT-2 style) on the tiny tokenizer."""
    tok = tiny_tokenizer()
    cfg = HookedTransformerConfig(n_layers=3, d_model=32, d_head=8, n_heads=4, d_mlp=64,
                                  n_ctx=128, d_vocab=len(tok), act_fn="gelu",
                                  normalization_type="LN", seed=seed, device="cpu")
    model = HookedTransformer(cfg)
    model.tokenizer = tok  # as given: pooled at the last real token
    return model


_CACHE: dict = {}


def cached_rows(model, inputs, hook, positions="pooled"):
    """Each input alone (no padding) through run_with_cache: the reference activations."""
    key = (id(model), positions, len(inputs))
    if key not in _CACHE:
        per_hook: dict[str, list[torch.Tensor]] = {}
        for item in inputs:
            enc = model.encode(item) if hasattr(model, "encode") else encode(model.tokenizer,
                                                                            item)
            tokens = torch.tensor([enc.ids])
            _, cache_ = model.run_with_cache(tokens)
            pos = model.pool_positions(tokens)[0] if hasattr(model, "pool_positions") else -1
            for name in model.hook_dict:
                if name.endswith("hook_resid_post"):
                    act = cache_[name][0].double()
                    per_hook.setdefault(name, []).append(
                        act[pos][None] if positions == "pooled" else act[enc.response_start:])
        _CACHE[key] = {h: torch.cat(v).numpy() for h, v in per_hook.items()}
    return _CACHE[key][hook]


def centred_gram(x):
    x = x - x.mean(0)
    return x @ x.T


def _close(a, b):
    # float32 activations (O(1)-O(10)) batched vs alone: ~1e-6 relative; Gram entries sum
    # d_model products, so compare at 1e-4 of the Gram's scale (a wrong row or position is O(1))
    np.testing.assert_allclose(a, b, atol=1e-4 * np.abs(b).max(), rtol=0)


@pytest.mark.parametrize("positions", ["pooled", "response"])
def test_streamed_grams_equal_grams_of_full_activations(tiny, positions):
    model = tiny("llama")[0]
    hooks = [f"blocks.{i}.hook_resid_post" for i in range(model.cfg.n_layers)]
    # batches of 3 (padding inside each), one hook point per pass
    g = layer_grams(model, INPUTS, positions=positions, batch_size=3, layer_chunk=1)
    assert g.hooks == hooks and g.labels() == ["0", "1", "2"]
    for i, h in enumerate(hooks):
        _close(g.grams[i], centred_gram(cached_rows(model, INPUTS, h, positions)))
    # one pass over all hooks, another batch size: the same Grams
    g2 = layer_grams(model, INPUTS, positions=positions, batch_size=4)
    _close(g2.grams, g.grams)
    if positions == "response":
        assert g.n_rows > len(INPUTS) and (np.diff(g.row_item) >= 0).all()


def test_grams_at_the_wrong_position_would_differ(tiny):
    """The check above can fail: the first token's rows give a different Gram."""
    model = tiny("llama")[0]
    g = layer_grams(model, INPUTS, layers=[1], batch_size=3)
    rows = cached_rows(model, INPUTS, "blocks.1.hook_resid_post", "response")
    wrong = np.stack([rows[0]] + [rows[1]] * (len(INPUTS) - 1))
    assert np.abs(g.grams[0] - centred_gram(wrong)).max() > 1e-2


def _hsic_u(k, ll):
    """Song et al. (2012) unbiased HSIC of two Grams, their eq. (5), written out."""
    n = k.shape[0]
    k, ll = k - np.diag(np.diag(k)), ll - np.diag(np.diag(ll))
    one = np.ones(n)
    return (np.trace(k @ ll) + (one @ k @ one) * (one @ ll @ one) / ((n - 1) * (n - 2))
            - 2 / (n - 2) * one @ k @ ll @ one) / (n * (n - 3))


def reference_measures(x, y):
    """Each measure of two different matrices from its textbook formula, independently of
    similarity.py: CKA / RV in feature space, RV2 (Smilde et al. 2009) from the zero-diagonal
    Grams of centred data, debiased CKA from Song et al.'s unbiased HSIC of the raw Grams."""
    xc, yc = x - x.mean(0), y - y.mean(0)
    cka = np.linalg.norm(yc.T @ xc) ** 2 / (np.linalg.norm(xc.T @ xc) * np.linalg.norm(yc.T @ yc))
    k, ll = xc @ xc.T, yc @ yc.T
    k0, l0 = k - np.diag(np.diag(k)), ll - np.diag(np.diag(ll))
    rv2_ = (k0 * l0).sum() / np.sqrt((k0 * k0).sum() * (l0 * l0).sum())
    kr, lr = x @ x.T, y @ y.T
    dcka = _hsic_u(kr, lr) / np.sqrt(_hsic_u(kr, kr) * _hsic_u(lr, lr))
    return {"rv": cka, "linear_cka": cka, "rv2": rv2_, "debiased_cka": dcka}


def test_self_map_equals_textbook_formulas(tiny):
    model = tiny("llama")[0]
    res = compare_layers(model, None, INPUTS, measure=list(SIMILARITIES), n_permutations=20,
                         seed=3, batch_size=4)
    acts = [cached_rows(model, INPUTS, f"blocks.{i}.hook_resid_post") for i in range(3)]
    ref = [[reference_measures(a, b) for b in acts] for a in acts]
    for m in SIMILARITIES:
        direct = np.array([[r[m] for r in row] for row in ref])
        # float32 activations: similarities agree to ~1e-6; 1e-4 still fails on any wrong cell
        np.testing.assert_allclose(res.observed[m], direct, atol=1e-4)
        off = direct[~np.eye(3, dtype=bool)]
        assert np.abs(off - 1).min() > 1e-2  # different layers: the off-diagonal is informative
    # one cell's null and p equal similarity.permutation_test with the same permutations
    cell = permutation_test("debiased_cka", acts[0], acts[2], n_permutations=20, seed=3)
    assert res.null_mean["debiased_cka"][0, 2] == pytest.approx(cell.null_mean, abs=1e-4)
    assert res.p_value["debiased_cka"][0, 2] == pytest.approx(cell.p_value)
    df = res.to_dataframe()
    assert len(df) == 4 * 9 and set(df.columns) >= {"observed", "null_mean", "excess",
                                                    "p_value"}
    res.plot(kind="excess")


def test_between_reward_model_and_causal_lm(tiny):
    rm = tiny("llama")[0]
    lm = tiny_lm(0)
    res = compare_layers(rm, lm, INPUTS, measure=("debiased_cka", "rv2"), n_permutations=10,
                         layers_b=[0, 2], batch_size=4)
    assert res.observed["rv2"].shape == (3, 2) and res.layers_b == ["0", "2"]
    a = [cached_rows(rm, INPUTS, f"blocks.{i}.hook_resid_post") for i in range(3)]
    b = [cached_rows(lm, INPUTS, f"blocks.{i}.hook_resid_post") for i in (0, 2)]
    for m, fn in SIMILARITIES.items():
        if m in res.measures:
            direct = np.array([[fn(x, y) for y in b] for x in a])
            np.testing.assert_allclose(res.observed[m], direct, atol=1e-4)
    # the LM is pooled at its last real token: right padding in batches equals running alone
    g = layer_grams(lm, INPUTS, layers=[2], batch_size=3)
    _close(g.grams[0], centred_gram(b[1]))


def test_bad_requests_are_named(tiny):
    model = tiny("llama")[0]
    with pytest.raises(TLRewardError, match="unknown hook"):
        layer_grams(model, INPUTS, hook="blocks.{layer}.hook_nope")
    with pytest.raises(TLRewardError, match="at least 4"):
        layer_grams(model, INPUTS[:3])
    with pytest.raises(TLRewardError, match="assistant"):
        layer_grams(model, ["a plain string one", "two", "three", "four"], positions="response")
    with pytest.raises(TLRewardError, match="max_gram_bytes"):
        layer_grams(model, INPUTS, positions="response", max_gram_bytes=1e3)
    g = layer_grams(model, INPUTS, layers=[0])
    with pytest.raises(TLRewardError, match="unknown measure"):
        compare_grams(g, None, "cosine")


def test_bfloat16_model_gives_float64_grams_close_to_float32(tiny):
    """bf16 weights (as real RMs run on CUDA): rows are cast to float32 as they are read and the
    Grams accumulate in float64; they match the float32 model's to bf16 precision."""
    from tl_reward import HookedRewardModel

    model, hf, tok = tiny("llama")
    bf16 = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu",
                                             dtype=torch.bfloat16)
    g16 = layer_grams(bf16, INPUTS, batch_size=4)
    g32 = layer_grams(model, INPUTS, batch_size=4)
    assert g16.grams.dtype == np.float64
    # bf16 has 8 mantissa bits (relative 4e-3 per value); through 3 blocks the Grams differ by
    # 1.1 % of their scale (measured), so 3 %; a wrong position or layer is O(1)
    np.testing.assert_allclose(g16.grams, g32.grams, atol=0.03 * np.abs(g32.grams).max())
    res = compare_grams(g16, g32, "debiased_cka", n_permutations=0)
    assert np.all(np.diag(res.observed["debiased_cka"]) > 0.999)  # measured >= 0.9996
