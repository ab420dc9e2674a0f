"""Concept vectors: steering against HF's own forward, the local slope against finite steps,
the head cosine against a hand computation, and the published separability's constant 1."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import parity_atol
from statsmodels.stats.proportion import proportion_confint

from tl_reward.audit.concepts import (
    concept_alignment,
    concept_from_activations,
    concept_separability,
    concept_vector,
    steering_curve,
)
from tl_reward.audit.pooled import pooled_residual
from tl_reward.compat.published import published_concept_alignment

POS = [("Is the sky blue?", f"Yes, the sky is blue{'!' * i}") for i in range(1, 9)]
NEG = [("Is the sky blue?", f"No. War. Hate{'.' * i}") for i in range(1, 9)]


def _hf_steered(hf, tokens, mask, pos, step):
    """HF's reward with ``step`` added to the final hidden state (input of ``model.norm``) at the
    pooled token: an independent implementation of steering at the final residual."""

    def pre(module, args):
        (h,) = args
        h = h.clone()
        h[torch.arange(len(pos)), pos] += step
        return (h,)

    handle = hf.model.norm.register_forward_pre_hook(pre)
    try:
        with torch.no_grad():
            return hf(input_ids=tokens, attention_mask=mask).logits
    finally:
        handle.remove()


def test_steering_matches_hf_and_first_order_slope(tiny):
    model, hf, _ = tiny("llama", 2)
    n = model.cfg.n_layers
    w = model.W_U[:, 1].detach().float()
    gen = torch.Generator().manual_seed(0)
    # a concept along the head's own direction w (plus noise so the spread is not 0)
    h_pos = torch.randn(6, w.numel(), generator=gen) * 0.1 + w
    h_neg = torch.randn(6, w.numel(), generator=gen) * 0.1
    concept = concept_from_activations("w", n, h_pos, h_neg)
    alphas = [-2.0, 1e-3, 2.0]
    curve = steering_curve(model, concept, POS[:3], alphas=alphas, objective="objective_1")

    batch = model.make_batch(POS[:3])
    pos = model.pool_positions(batch.tokens, batch.attention_mask)
    base = hf(input_ids=batch.tokens, attention_mask=batch.attention_mask).logits[:, 1]
    torch.testing.assert_close(curve.base, base.detach(), atol=1e-4, rtol=0)
    for j, a in enumerate(alphas):
        ref = _hf_steered(hf, batch.tokens, batch.attention_mask, pos,
                          a * concept.spread * concept.unit)[:, 1]
        # float32 forward of a 3-layer model: 1e-4 absolute on rewards of order 1
        torch.testing.assert_close(curve.rewards[j], ref, atol=1e-4, rtol=0)

    # the reference in float64, by hand: steering at the final residual changes only the final
    # RMS norm and the head, r(a) = w . (h + a s u) / rms(h + a s u) + b (gain folded into w)
    h = pooled_residual(model, POS[:3]).double()
    w64, b64 = w.double(), float(model.b_U[1])
    step64 = (concept.spread * concept.unit).double()

    def r64(a: float) -> torch.Tensor:
        x = h + a * step64
        return x @ w64 / (x.pow(2).mean(-1) + model.cfg.eps).sqrt() + b64

    # float32 against float64 at the rewards' scale (parity_atol: 256 eps per layer)
    tol_r = parity_atol(curve.rewards, n)
    torch.testing.assert_close(curve.base.double(), r64(0.0), atol=tol_r, rtol=0)
    for j, a in enumerate(alphas):
        torch.testing.assert_close(curve.rewards[j].double(), r64(a), atol=tol_r, rtol=0)
    # the slope by a float64 central difference: truncation O(da^2) and rounding ~eps64 |r| / da
    # (together ~1e-12 here), far below the float32 slope's own error, which is ~eps32 x depth
    # x the slope (measured <= 1.2e-8 under every CPU variant; 256 eps per layer as parity_atol)
    da = 1e-4
    fd = (r64(da) - r64(-da)) / (2 * da)
    tol = 256 * torch.finfo(torch.float32).eps * n * float(fd.abs().max())
    torch.testing.assert_close(curve.predicted_slope.double(), fd, atol=tol, rtol=0)
    # the frozen-scale direction alone (w . u / s) misses the norm's response: a bug that
    # dropped the gradient's second term would be caught here
    sc = (h.pow(2).mean(-1) + model.cfg.eps).sqrt()
    frozen = (step64 @ w64) / sc
    assert (frozen - fd).abs().max() > 100 * tol
    # far from 0 the curve bends (the norm rescales): a straight line would miss r(2), which the
    # curve matches within tol_r, by more than twice that tolerance
    assert ((r64(2.0) - r64(0.0)) - 2.0 * fd).abs().max() > 2 * tol_r


def test_head_cosine_and_published_definition(tiny):
    model, hf, _ = tiny("llama", 2)
    concept = concept_vector(model, POS, NEG, name="yes")
    al = concept_alignment(model, concept, POS + NEG, objective=0)
    w = model.W_U[:, 0].detach().float()
    hand = float(w @ concept.vector / (w.norm() * concept.vector.norm()))
    assert al.cosine_head.shape == (16,)
    torch.testing.assert_close(al.cosine_head, torch.full((16,), hand), atol=1e-5, rtol=0)

    pub = published_concept_alignment(model, POS, NEG, hf.score.weight[0])
    d = (pooled_residual(model, POS) - pooled_residual(model, NEG)).mean(0)
    raw = hf.score.weight[0].detach()
    assert pub.cosine == pytest.approx(float(d @ raw / (d.norm() * raw.norm())), abs=1e-5)
    # the raw row is not the direction the head applies (gain folded in W_U)
    assert abs(pub.cosine - hand) > 1e-3
    assert pub.separability == pytest.approx(1.0)


def test_separability_is_measured_not_constant(tiny):
    model, hf, _ = tiny("llama", 1)
    texts = [("Tell me something.", f"Item {i}: love music war {i % 3}") for i in range(24)]
    perm = torch.randperm(24, generator=torch.Generator().manual_seed(1)).tolist()
    a, b = [texts[i] for i in perm[:12]], [texts[i] for i in perm[12:]]  # no real concept
    null = concept_vector(model, a, b, name="random split")
    sep = concept_separability(null, seed=2)
    # by hand: scikit-learn's out-of-fold predictions on the pooled residuals, and the percentile
    # exact binomial (Clopper-Pearson, statsmodels' beta method) interval of the correct count
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_predict
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x = torch.cat([pooled_residual(model, a), pooled_residual(model, b)]).double().numpy()
    y = np.r_[np.ones(12), np.zeros(12)]
    pred = cross_val_predict(make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000)),
                             x, y, cv=StratifiedKFold(5, shuffle=True, random_state=2))
    correct = (pred == y).astype(float)
    assert sep.accuracy == pytest.approx(correct.mean(), abs=1e-12)
    assert (sep.ci_low, sep.ci_high) == pytest.approx(
        proportion_confint(int(correct.sum()), 24, 0.05, method="beta"), abs=1e-12)
    assert (sep.n, sep.folds, sep.chance) == (24, 5, 0.5)
    # no real concept: the CI includes chance
    assert sep.ci_low < 0.5 < sep.ci_high
    real = concept_separability(concept_vector(model, POS, NEG))
    assert real.accuracy >= 0.9 and real.ci_low > 0.5
    # the published "separability" is 1 on the random split as well
    pub = published_concept_alignment(model, a, b, hf.score.weight[0])
    assert pub.separability == pytest.approx(1.0)


def test_bf16_alignment_close_to_float32(tiny):
    from tl_reward import HookedRewardModel

    model, hf, tok = tiny("llama", 1)
    m16 = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu",
                                            dtype=torch.bfloat16)
    c32 = concept_vector(model, POS, NEG)
    c16 = concept_vector(m16, POS, NEG)
    assert c16.vector.dtype == torch.float32
    a32 = concept_alignment(model, c32, POS[:4], separability=False)
    a16 = concept_alignment(m16, c16, POS[:4], separability=False)
    assert a16.slope.dtype == torch.float32
    # bf16 keeps ~3 significant digits through 3 layers: cosines agree to a few 1e-2
    torch.testing.assert_close(a16.cosine_head, a32.cosine_head, atol=5e-2, rtol=0)
    df = a16.to_dataframe()
    assert list(df.columns)[:4] == ["concept", "layer", "objective", "input"]


def test_gated_head_uses_w_eff_per_input(tiny):
    """ArmoRM's score: the direction is w_eff(x) = W_reg^T T g(x), different per input."""
    model, hf, _ = tiny("armorm", 4)
    # the gate reads the prompt (the assistant header), so the prompts differ
    convs = [[{"role": "user", "content": q}, {"role": "assistant", "content": r}]
             for q, r in (("Is the sky blue?", "Yes, it is."), ("hi", "No. War."),
                          ("What is love?", "Love. Music."), ("Thanks", "Sure!"))]
    concept = concept_vector(model, convs[:2], convs[2:], name="c")
    al = concept_alignment(model, concept, convs, objective="score", separability=False)
    batch = model.make_batch(convs)
    out = hf(input_ids=batch.tokens, attention_mask=batch.attention_mask)
    gain = hf.model.norm.weight.detach().float()
    w_reg = hf.regression_layer.weight.detach().float() * gain
    t = hf.reward_transform_matrix.detach().float()
    w_eff = (out.gating_output.detach().float() @ t.T) @ w_reg  # [n, d]
    ref = torch.nn.functional.cosine_similarity(w_eff, concept.vector[None], dim=-1)
    torch.testing.assert_close(al.cosine_head, ref, atol=1e-4, rtol=0)
    assert float(ref.max() - ref.min()) > 1e-4  # the direction really moves with the input
