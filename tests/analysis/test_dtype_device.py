"""bfloat16 and CUDA, the way real reward models run (issue 9, items 5, 6 and the device path).

bf16 tolerance. bfloat16 keeps 8 significant bits: every rounding moves a value by up to 2^-9
of itself, and a run rounds the residual stream after each of its 2L + 1 additions and every
matmul output. We accumulate every readout, effect and attribution in float32, so what remains
is the bf16 rounding inside the forward pass itself, of the order of 2^-8 of the terms that
add up to the reward. With ``S = sum_c |a_c| + |b|`` (the float32 DRA terms of the input), we
assert ``|bf16 - float32| <= 4 * 2^-8 * S`` on the same inputs (measured: at most 2.6 * 2^-8 * S
over the tiny models of every architecture) and the bf16 DRA identity ``|total - reward| <=
2 * 2^-8 * S`` (measured at most 0.65 * 2^-8 * S). Before the fixes, DRA and direct-path raised
in bf16 (a float32 direction met bf16 activations), ``reward_direction(objective)`` raised on
every architecture, and patched values were stored in bf16.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from helpers import hf_rewards

from tl_reward import HookedRewardModel
from tl_reward.analysis.attribution import direct_reward_attribution
from tl_reward.analysis.attribution_patching import attribution_patching
from tl_reward.analysis.direct_path import direct_path_patching
from tl_reward.analysis.lens import reward_lens
from tl_reward.analysis.patching import activation_patching
from tl_reward.data import PreferencePair
from tl_reward.testing import ARCHITECTURES, tiny_hf_reward_model

PAIR = PreferencePair.from_prompt("Is the sky blue?", "Yes, the sky is blue.", "No, it is red.")
INPUTS = [("Is the sky blue?", "Yes, the sky is blue on a clear day."), ("hi", "No.")]
ULP = 2.0**-8


def pair_of_models(arch: str, device: str = "cpu") -> tuple[HookedRewardModel, HookedRewardModel]:
    hf, tok = tiny_hf_reward_model(arch, 3 if arch == "armorm" else 1)
    return tuple(HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device=device,
                                                   dtype=d)
                 for d in (torch.float32, torch.bfloat16))  # type: ignore[return-value]


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_reward_direction_in_bf16(arch: str) -> None:
    """Without ``normed`` (a fixed objective): float32 (accumulation dtype), equal to the float32
    model's direction up to the bf16 rounding of ``W_U``: the head weight and the final norm's
    gain are each rounded, then their product (three roundings of up to 2^-9: < 2 * 2^-8 of the
    largest entry; small entries can come out of a cancellation, so the bound is absolute)."""
    m32, m16 = pair_of_models(arch)
    obj = m32.objectives[0]
    w32, b32 = (t.detach() for t in m32.reward_direction(obj))
    w16, b16 = (t.detach() for t in m16.reward_direction(obj))
    assert w16.dtype == torch.float32 and b16.dtype == torch.float32
    torch.testing.assert_close(w16, w32, atol=2 * ULP * float(w32.abs().max()), rtol=0)
    torch.testing.assert_close(b16, b32, atol=2 * ULP * float(b32.abs().max()), rtol=0)


@pytest.mark.parametrize("arch", ["llama", "gemma2", "gpt2", "armorm"])
def test_analyses_in_bf16_match_float32(arch: str) -> None:
    m32, m16 = pair_of_models(arch)
    a32 = direct_reward_attribution(m32, INPUTS, neurons=True, per_position=True)
    a16 = direct_reward_attribution(m16, INPUTS, neurons=True, per_position=True)
    comps, _ = a32.components("head")
    s = float((comps.abs().sum(1) + a32.bias.abs()).max())  # S: the scale of the terms
    tol, ident = 4 * ULP * s, 2 * ULP * s
    assert a16.reward.dtype == torch.float32
    # the bf16 DRA identity, and the bf16 model against the float32 one and HF's float32 forward
    torch.testing.assert_close(a16.total(), a16.reward, atol=ident, rtol=0)
    torch.testing.assert_close(a16.reward, a32.reward, atol=tol, rtol=0)
    batch = m32.make_batch(INPUTS)
    ref = hf_rewards(tiny_hf_reward_model(arch, 3 if arch == "armorm" else 1)[0],
                     batch.tokens, batch.attention_mask)["reward"]
    cols = [a16.objectives.index(o) for o in m16.objectives]
    torch.testing.assert_close(a16.reward[:, cols], ref, atol=tol, rtol=0)
    c16, _ = a16.components("head")
    torch.testing.assert_close(c16, comps, atol=tol, rtol=0)
    assert a16.neurons is not None and a32.neurons is not None
    torch.testing.assert_close(a16.neurons, a32.neurons, atol=tol, rtol=0)
    for x, y in zip(a16.head_positions or [], a32.head_positions or [], strict=True):
        torch.testing.assert_close(x, y, atol=tol, rtol=0)
    # lens, direct path, activation and attribution patching, in reward units
    l32, l16 = reward_lens(m32, INPUTS), reward_lens(m16, INPUTS)
    for conv in ("frozen", "recompute"):
        torch.testing.assert_close(l16.values[conv], l32.values[conv], atol=tol, rtol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # margins are not 0 here
        d32, d16 = (direct_path_patching(m, PAIR, level="head") for m in (m32, m16))
        torch.testing.assert_close(d16.patched, d32.patched, atol=tol, rtol=0)
        p32, p16 = (activation_patching(m, PAIR, "resid", "noising") for m in (m32, m16))
        assert p16.patched.dtype == torch.float32  # stored in float32, not bf16
        torch.testing.assert_close(p16.patched, p32.patched, atol=tol, rtol=0)
        t32, t16 = (attribution_patching(m, PAIR) for m in (m32, m16))
        for site in ("resid", "attn_out", "mlp_out"):
            torch.testing.assert_close(getattr(t16, site)["noising"] * t16.delta,
                                       getattr(t32, site)["noising"] * t32.delta,
                                       atol=tol, rtol=0)


def test_bf16_tolerance_can_fail() -> None:
    """The tolerance above is tight enough to catch a plausible bug: the bf16 reward read one
    token before the pooled one exceeds it."""
    m32, m16 = pair_of_models("llama")
    a32 = direct_reward_attribution(m32, INPUTS)
    comps, _ = a32.components("head")
    s = float((comps.abs().sum(1) + a32.bias.abs()).max())
    batch = m16.make_batch(INPUTS)
    with torch.no_grad():
        logits = m16(batch.tokens, attention_mask=batch.attention_mask).float()
    wrong_token = logits[torch.arange(2), batch.lengths - 2]
    assert (wrong_token - a32.reward).abs().max() > 4 * ULP * s


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_fast_sweep_cache_in_bf16(arch: str) -> None:
    """The fast prefix cache (hook-free lean path) against the naive bf16 forward with
    TransformerLens's materialised attention, every objective: within three bf16 roundings of
    the reward scale (3 x 2^-8 x max |reward|). The two paths multiply differently shaped
    batches, so a CPU's bf16 kernels may round them differently: equal bit for bit on the Intel
    CPU this was written on, one reward of 120 off by 1.8 roundings (gemma2) on an AMD EPYC.
    Before the fix it summed the prefix and new parts of ``pattern @ v`` in bf16 (three
    roundings instead of TransformerLens's one) and differed by 0.023 on llama (scale 1.0): 5.9
    roundings. Fused attention rounds bf16 differently again (as far from float32:
    ``test_fused_attention``), so both sides here use the materialised kernels."""
    from tl_reward.model.response_template import response_template
    from tl_reward.sweep.vocab_sweep import PAPER_PROMPTS, candidate_ids, score_vocabulary

    hf, tok = tiny_hf_reward_model(arch, 3 if arch == "armorm" else 1)
    model = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu",
                                              dtype=torch.bfloat16)
    ids = candidate_ids(model)[:120]
    template = response_template(tok, PAPER_PROMPTS["best"])
    seqs = torch.tensor([template.ids(v) for v in ids])
    model.fused_attention = False  # prefix and naive: the kernels the lean path mirrors
    with torch.no_grad():
        naive = model(seqs, attention_mask=torch.ones_like(seqs), return_type="reward").float()
    fast = score_vocabulary(model, {"b": PAPER_PROMPTS["best"]}, ids, batch_size=64,
                            cache="fast", progress=False).rewards[:, 0].float()
    atol = 3 * ULP * float(naive.abs().max())
    assert naive.std(0).min() > atol  # the tokens matter more than the tolerance
    torch.testing.assert_close(fast, naive, atol=atol, rtol=0)


def test_identities_on_device(device: str) -> None:
    """Every analysis runs with the model on ``device`` (cuda where available) and keeps its
    identities: DRA sums to ``rewards``, the last lens value is the reward, the final-residual
    patch gives the source reward, attribution patching of the final residual at the pooled
    token is exact (the reward is linear in it up to the frozen scale: checked by finite
    difference), and the fast sweep cache equals the naive forward."""
    from tl_reward.model.response_template import response_template
    from tl_reward.sweep.vocab_sweep import PAPER_PROMPTS, candidate_ids, score_vocabulary

    hf, tok = tiny_hf_reward_model("llama")
    model = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device=device)
    assert str(model.W_U.device).startswith(device)
    scores = model.rewards(INPUTS).score
    dra = direct_reward_attribution(model, INPUTS, neurons=True, per_position=True)
    torch.testing.assert_close(dra.total()[:, 0], scores, atol=1e-4, rtol=0)
    lens = reward_lens(model, INPUTS)
    torch.testing.assert_close(lens.values["frozen"][:, -1, 0], scores, atol=1e-4, rtol=0)
    n = model.cfg.n_layers
    den = activation_patching(model, PAIR, "resid", "denoising", positions="all", layers=[n])
    assert float(den.patched[0]) == pytest.approx(den.clean_chosen, abs=1e-4)
    ap = attribution_patching(model, PAIR)
    assert ap.clean_chosen == pytest.approx(den.clean_chosen, abs=1e-4)
    dp = direct_path_patching(model, PAIR)
    torch.testing.assert_close(dp.effect.sum() * dp.delta, torch.tensor(dp.delta),
                               atol=1e-4, rtol=0)  # frozen scale: the components add up
    ids = candidate_ids(model)[:64]
    template = response_template(tok, PAPER_PROMPTS["best"])
    seqs = torch.tensor([template.ids(v) for v in ids], device=device)
    with torch.no_grad():
        naive = model(seqs, attention_mask=torch.ones_like(seqs), return_type="score").cpu()
    sweep = score_vocabulary(model, {"b": PAPER_PROMPTS["best"]}, ids, batch_size=32,
                             cache="fast", progress=False)
    torch.testing.assert_close(sweep.values("b"), naive, atol=1e-4, rtol=0)
