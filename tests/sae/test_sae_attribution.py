"""SAE feature attribution: the exact final-residual split sums to HF's reward on every
architecture, the reconstruction gap is the measured reward change, gradient attribution is the
finite-difference derivative, ablation is the hand-made intervention, save/load is identical."""

from __future__ import annotations

import pytest
import torch
from helpers import hf_rewards, sae_terms_by_hand
from sae_lens import SAE
from sae_lens.saes.sae import SAEMetadata
from sae_lens.saes.standard_sae import StandardSAE, StandardSAEConfig
from sae_lens.saes.topk_sae import TopKSAE, TopKSAEConfig

from tl_reward import HookedRewardModel
from tl_reward.data import PreferencePair
from tl_reward.model.hooked_sae_reward_model import HookedSAERewardModel
from tl_reward.sae import (
    SAEError,
    ablation_check,
    as_sae_model,
    differential_sae_attribution,
    pair_ablation_check,
    sae_attribution,
)
from tl_reward.sae.ablation import ablated_objectives
from tl_reward.sae.splice import decoder_directions
from tl_reward.testing import ARCHITECTURES, tiny_hf_reward_model

INPUTS = [("Is the sky blue?", "Yes, the sky is blue on a clear day."), ("hi", "No.")]
PAIRS = [PreferencePair.from_prompt("Is the sky blue?", "Yes, on a clear day.", "No."),
         PreferencePair.from_prompt("hi", "Hello! How can I help?", "Go away.")]
CASES = [(a, k) for a in ARCHITECTURES for k in ((3,) if a == "armorm" else (1,))] + [("gpt2", 3)]


def make_sae(d_in: int, hook: str, seed: int = 0, rescale: bool = False, d_sae: int = 96,
             k: int = 6, dtype: str = "float32") -> TopKSAE:
    torch.manual_seed(seed)
    cfg = TopKSAEConfig(d_in=d_in, d_sae=d_sae, k=k, rescale_acts_by_decoder_norm=rescale,
                        dtype=dtype)
    cfg.metadata = SAEMetadata(hook_name=hook)
    sae = TopKSAE(cfg)
    with torch.no_grad():
        sae.b_dec.normal_(0, 0.3)
        sae.b_enc.normal_(0, 0.1)
        sae.W_dec.mul_(torch.rand(d_sae, 1, dtype=sae.W_dec.dtype) + 0.5)  # unequal norms
    return sae


def sae_model(tiny, arch: str, k: int) -> tuple[HookedSAERewardModel, object]:
    base, hf, _ = tiny(arch, k)
    return as_sae_model(base), hf


@pytest.mark.parametrize(("arch", "k"), CASES, ids=[f"{a}-K{k}" for a, k in CASES])
def test_exact_split_sums_to_hf_reward(tiny, arch: str, k: int) -> None:
    model, hf = sae_model(tiny, arch, k)
    hook = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    sae = make_sae(model.cfg.d_model, hook, rescale=arch == "llama")
    attr = sae_attribution(model, sae, INPUTS)
    assert attr.method == "exact"
    batch = model.make_batch(INPUTS)
    ref = hf_rewards(hf, batch.tokens, batch.attention_mask)
    cols = [attr.objectives.index(o) for o in model.objectives]
    torch.testing.assert_close(attr.total()[:, cols], ref["reward"], atol=1e-4, rtol=0)
    if "score" in attr.objectives:  # ArmoRM: features against w_eff(x)
        torch.testing.assert_close(attr.total()[:, attr.objectives.index("score")],
                                   ref["score"], atol=1e-4, rtol=0)
    # only the k active features at t* carry a contribution, and b_dec and error are not zero
    assert int((attr.features[..., 0] != 0).sum(-1).max()) <= sae.cfg.k
    assert attr.b_dec.abs().min() > 0 and attr.error.abs().min() > 0
    # the error term off: the reported gap is the reward change SAELens's splice measures
    with torch.no_grad():
        spliced = model.run_with_saes(batch.tokens, attention_mask=batch.attention_mask,
                                      saes=[sae], use_error_term=False, return_type="reward")
    torch.testing.assert_close(attr.reconstruction_gap[:, cols], spliced - ref["reward"],
                               atol=1e-4, rtol=0)


@pytest.mark.parametrize(("arch", "k"), CASES, ids=[f"{a}-K{k}" for a, k in CASES])
def test_exact_feature_terms_by_hand(tiny, arch: str, k: int) -> None:
    """Every term of the exact split, recomputed independently by ``sae_terms_by_hand`` (SAELens's
    decoder, HF's head and gain, a hand-computed norm scale), so the error term cannot absorb a
    mistake: a decoder-norm bug in the feature terms, balanced in the error, fails here while
    the sum still matches HF's reward."""
    model, hf = sae_model(tiny, arch, k)
    hook = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    sae = make_sae(model.cfg.d_model, hook, rescale=arch in ("llama", "gpt2"))
    n_checked = 0
    for item in INPUTS:
        attr = sae_attribution(model, sae, [item])
        slot = [attr.objectives.index(o) for o in model.objectives]
        ref = sae_terms_by_hand(model, hf, arch, sae, item)
        assert int(attr.positions[0]) == ref["t"] and 0 < len(ref["active"]) <= sae.cfg.k
        # float32 terms of order 1: 2e-5 is ~100 float32 steps
        torch.testing.assert_close(attr.features[0][:, slot], ref["features"], atol=2e-5,
                                   rtol=1e-5)
        for term in ("b_dec", "error", "bias"):
            torch.testing.assert_close(getattr(attr, term)[0, slot], ref[term], atol=2e-5,
                                       rtol=1e-5)
        n_checked += len(ref["active"])
    assert n_checked >= 2 * sae.cfg.k - 2


def test_differential_sums_to_margin(tiny) -> None:
    model, _ = sae_model(tiny, "qwen2", 1)
    sae = make_sae(model.cfg.d_model, f"blocks.{model.cfg.n_layers - 1}.hook_resid_post")
    pa = differential_sae_attribution(model, sae, PAIRS)
    parts = (pa.difference().sum(1) + (pa.chosen.b_dec - pa.rejected.b_dec)
             + (pa.chosen.error - pa.rejected.error) + (pa.chosen.bias - pa.rejected.bias))
    torch.testing.assert_close(parts, pa.margin, atol=1e-4, rtol=0)
    scores = model.rewards([c for p in PAIRS for c in (p.chosen_conversation(),
                                                       p.rejected_conversation())]).score
    torch.testing.assert_close(pa.margin[:, 0], scores[0::2] - scores[1::2], atol=1e-4, rtol=0)
    top = pa.top_features(5)
    assert len(top) == 5 and top.mean_abs_difference.is_monotonic_decreasing
    df = pa.to_dataframe()
    assert set(df.columns) >= {"pair", "feature", "difference"} and len(df) > 0


def _float64_model(arch: str = "llama", k: int = 1) -> HookedSAERewardModel:
    hf, tok = tiny_hf_reward_model(arch, num_labels=k, seed=0)
    return HookedSAERewardModel.from_pretrained(hf_model=hf.double(), tokenizer=tok,
                                                device="cpu", dtype=torch.float64)


def _with_feature_scaled(model: HookedSAERewardModel, sae: SAE, hook: str, batch: object,
                         feature: int, factor: float, return_type: str) -> torch.Tensor:
    """The model's output for input 0 with SAE feature ``feature`` scaled by ``factor``."""
    def fn(acts: torch.Tensor, hook: object) -> torch.Tensor:
        acts = acts.clone()
        acts[..., feature] *= factor
        return acts
    with torch.no_grad(), model.saes(saes=[sae], use_error_term=True):
        out = model.run_with_hooks(batch.tokens, attention_mask=batch.attention_mask,
                                   return_type=return_type,
                                   fwd_hooks=[(f"{hook}.hook_sae_acts_post", fn)])
    return out[0]


def test_armorm_score_gradient_through_the_gate() -> None:
    """ArmoRM's score: the gradient includes the gate's dependence on the features (finite
    differences of the model's own score, float64)."""
    model = _float64_model("armorm", 3)
    hook = "blocks.1.hook_resid_post"
    sae = make_sae(model.cfg.d_model, hook, dtype="float64")
    attr = sae_attribution(model, sae, INPUTS[:1], objectives="score", method="gradient")
    batch = model.make_batch(INPUTS[:1])
    i = int(attr.features[0, :, 0].abs().argmax())
    eps = 1e-4

    def score(factor: float) -> float:
        return float(_with_feature_scaled(model, sae, hook, batch, i, factor, "score"))

    fd = (score(1 + eps) - score(1 - eps)) / (2 * eps)
    assert float(attr.features[0, i, 0]) == pytest.approx(fd, rel=1e-5, abs=1e-9)


def test_gradient_attribution_is_the_derivative() -> None:
    """a_i = d r / d alpha with feature i scaled by alpha everywhere (central difference at
    alpha = 1, float64); the gap with the error term off equals a plain TransformerLens splice."""
    model = _float64_model()
    hook = "blocks.0.hook_resid_post"
    sae = make_sae(model.cfg.d_model, hook, rescale=True, dtype="float64")
    attr = sae_attribution(model, sae, INPUTS[:1], method="gradient")
    assert attr.method == "gradient"
    batch = model.make_batch(INPUTS[:1])
    feats = attr.features[0, :, 0].abs().argsort(descending=True)[:3].tolist()
    eps = 1e-4

    def scaled(i: int, factor: float) -> float:
        return float(_with_feature_scaled(model, sae, hook, batch, i, factor, "reward")[0])

    for i in feats:
        fd = (scaled(i, 1 + eps) - scaled(i, 1 - eps)) / (2 * eps)  # d r / d (scale of f_i)
        assert float(attr.features[0, i, 0]) == pytest.approx(fd, rel=1e-6, abs=1e-9)
    # error node + b_dec + features = x . dr/dx: compare with autograd on the plain model
    store = {}

    def grab(t: torch.Tensor, hook: object) -> torch.Tensor:
        t.retain_grad()
        store["x"] = t
        return t
    with model.hooks(fwd_hooks=[(hook, grab)]):
        r = model(batch.tokens, attention_mask=batch.attention_mask, return_type="reward")
    r.sum().backward()
    x_dot_g = float((store["x"] * store["x"].grad).sum().detach())
    assert float(attr.total()[0, 0]) == pytest.approx(x_dot_g, rel=1e-6)  # results are float32
    # gap: replace x by the reconstruction with a plain TL hook
    x_hat = {}

    def splice(t: torch.Tensor, hook: object) -> torch.Tensor:
        x_hat["v"] = sae.decode(sae.encode(t))
        return x_hat["v"]
    with torch.no_grad():
        r0 = model(batch.tokens, attention_mask=batch.attention_mask, return_type="reward")
        r1 = model.run_with_hooks(batch.tokens, attention_mask=batch.attention_mask,
                                  return_type="reward", fwd_hooks=[(hook, splice)])
    assert float(attr.reconstruction_gap[0, 0]) == pytest.approx(float(r1 - r0), rel=1e-6, abs=1e-7)


def test_ablation_is_the_hand_made_intervention(tiny) -> None:
    model, _ = sae_model(tiny, "gemma2", 1)
    hook = "blocks.1.hook_resid_post"
    sae = make_sae(model.cfg.d_model, hook, rescale=True)
    batch = model.make_batch(INPUTS[0])
    with torch.no_grad():
        x = model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask,
                                 names_filter=hook)[1][hook]
        f = sae.encode(x)
    feats = f[0].amax(0).argsort(descending=True)[:3].tolist()
    got = ablated_objectives(model, sae, batch.tokens, batch.attention_mask,
                             [[feats[0]], feats], ["reward"])
    spliced = ablated_objectives(model, sae, batch.tokens, batch.attention_mask,
                                 [[feats[0]], feats], ["reward"], fast=False)
    torch.testing.assert_close(got, spliced, atol=1e-4, rtol=0)  # restart = SAELens splice
    d = decoder_directions(sae)
    for row, fs in enumerate([[feats[0]], feats]):
        removed = (f[..., fs, None] * d[fs]).sum(-2)
        with torch.no_grad():
            want = model.run_with_hooks(batch.tokens, attention_mask=batch.attention_mask,
                                        return_type="reward",
                                        fwd_hooks=[(hook, lambda t, hook, r=removed: t - r)])
        assert float(got[row, 0]) == pytest.approx(float(want[0, 0]), abs=1e-4)


def test_ablation_check_reports() -> None:
    """Every row against independent measurements (float64): ``actual`` is the reward change
    when SAELens's own feature activation is zeroed (error term kept), ``predicted`` minus the
    central finite difference of the reward in that feature's scale; the summary's Pearson r is
    scipy's and its tolerance share is recounted."""
    from scipy import stats

    model = _float64_model()
    hook = "blocks.1.hook_resid_post"
    sae = make_sae(model.cfg.d_model, hook, dtype="float64")
    check = ablation_check(model, sae, INPUTS, top_k=4)
    assert len(check.predicted) == 8 and check.kind == "input"
    eps = 1e-4
    pred, act = [], []
    for i, f in zip(check.item.tolist(), check.feature.tolist(), strict=True):
        batch = model.make_batch(INPUTS[i])

        def r(factor: float, b: object = batch, f: int = f) -> float:
            return float(_with_feature_scaled(model, sae, hook, b, f, factor, "reward")[0])

        act.append(r(0.0) - r(1.0))
        pred.append(-(r(1 + eps) - r(1 - eps)) / (2 * eps))
    # results are stored in float32 (a relative 6e-8 rounding); the central difference adds an
    # O(eps^2) error
    torch.testing.assert_close(check.actual, torch.tensor(act, dtype=check.actual.dtype),
                               atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(check.predicted, torch.tensor(pred, dtype=check.predicted.dtype),
                               atol=1e-6, rtol=1e-5)
    assert any(abs(a) > 1e-3 for a in act)  # the ablations move the reward
    s = check.summary().iloc[0]
    assert s.pearson == pytest.approx(stats.pearsonr(pred, act)[0], abs=1e-6)
    within = [abs(p - a) <= check.atol + check.rtol * abs(a) for p, a in zip(pred, act,
                                                                              strict=True)]
    assert s.frac_within_tolerance == pytest.approx(sum(within) / len(within))
    assert check.plot().data[0].x is not None


def test_pair_ablation_check_measures_the_margin(tiny) -> None:
    model, _ = sae_model(tiny, "llama", 1)
    hook = "blocks.1.hook_resid_post"
    sae = make_sae(model.cfg.d_model, hook)
    check = pair_ablation_check(model, sae, PAIRS, top_k=3)
    assert check.kind == "pair" and len(check.joint_actual) == len(PAIRS)
    row = check.to_dataframe().iloc[0]
    p, f = int(row["pair"]), int(row.feature)
    margins = []
    for removed in ([], [f]):
        vals = []
        for conv in (PAIRS[p].chosen_conversation(), PAIRS[p].rejected_conversation()):
            b = model.make_batch(conv)
            vals.append(float(ablated_objectives(model, sae, b.tokens, b.attention_mask,
                                                 [removed], ["reward"], fast=False)[0, 0]))
        margins.append(vals[0] - vals[1])
    assert row.actual == pytest.approx(margins[1] - margins[0], abs=1e-4)
    pa = differential_sae_attribution(model, sae, PAIRS[p], method="gradient")
    assert row.predicted == pytest.approx(-float(pa.difference()[0, f, 0]), abs=1e-5)


def test_save_and_reload_identical(tiny, tmp_path) -> None:
    model, _ = sae_model(tiny, "llama", 1)
    for hook in (f"blocks.{model.cfg.n_layers - 1}.hook_resid_post", "blocks.0.hook_resid_post"):
        sae = make_sae(model.cfg.d_model, hook, rescale=True)
        before = sae_attribution(model, sae, INPUTS)
        sae.save_model(tmp_path / hook)
        loaded = SAE.load_from_disk(tmp_path / hook)
        assert type(loaded) is TopKSAE and loaded.cfg.metadata.hook_name == hook
        after = sae_attribution(model, loaded, INPUTS)
        assert torch.equal(before.features, after.features)
        assert torch.equal(before.error, after.error) and torch.equal(before.b_dec, after.b_dec)


def test_standard_sae_and_plain_model(tiny) -> None:
    """A ReLU SAE works too, and a plain HookedRewardModel is converted on the fly."""
    base, hf, _ = tiny("mistral", 1)
    assert type(base) is HookedRewardModel
    hook = f"blocks.{base.cfg.n_layers - 1}.hook_resid_post"
    cfg = StandardSAEConfig(d_in=base.cfg.d_model, d_sae=64)
    cfg.metadata = SAEMetadata(hook_name=hook)
    torch.manual_seed(1)
    sae = StandardSAE(cfg)
    attr = sae_attribution(base, sae, INPUTS)
    batch = base.make_batch(INPUTS)
    torch.testing.assert_close(attr.total(), hf_rewards(hf, batch.tokens,
                                                        batch.attention_mask)["reward"],
                               atol=1e-4, rtol=0)


def test_errors(tiny) -> None:
    model, _ = sae_model(tiny, "llama", 1)
    early = make_sae(model.cfg.d_model, "blocks.0.hook_resid_post")
    with pytest.raises(SAEError, match="method='gradient'"):
        sae_attribution(model, early, INPUTS, method="exact")
    with pytest.raises(SAEError, match="method must be"):
        sae_attribution(model, early, INPUTS, method="fast")
    early.cfg.normalize_activations = "layer_norm"
    with pytest.raises(SAEError, match="normalises activations"):
        sae_attribution(model, early, INPUTS)
