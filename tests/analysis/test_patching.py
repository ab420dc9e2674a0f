"""Activation patching: agreement with transformer_lens.patching, the final-residual identity,
ablations against hand-written hooks, direct-path patching against DRA and a hooked run."""

from __future__ import annotations

import pytest
import torch
from helpers import parity_atol
from transformer_lens import patching as tl_patching

from tl_reward.analysis.attribution import differential_attribution
from tl_reward.analysis.direct_path import direct_path_patching
from tl_reward.analysis.patching import activation_patching, mean_activations
from tl_reward.data import PreferencePair
from tl_reward.data.pairs import align_ids, tokenize_pair
from tl_reward.errors import TLRewardError
from tl_reward.testing import ARCHITECTURES

PAIR = PreferencePair.from_prompt("Is the sky blue?", "Yes, the sky is blue.", "No, it is red.")


def equal_length_pair(model, tok):  # noqa: ANN001, ANN201
    """Chosen and rejected of equal length differing in the reply (TL's patching needs it)."""
    tp = tokenize_pair(model, PAIR)
    ids = list(tp.rejected_ids)
    gen = torch.Generator().manual_seed(0)
    specials = set(tok.all_special_ids)
    for i in range(tp.prompt_len, len(ids) - 2):
        while (t := int(torch.randint(0, len(tok), (1,), generator=gen))) in specials:
            pass
        ids[i] = t
    chosen = list(tp.rejected_ids)
    return align_ids(chosen, ids, tp.prompt_len)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_resid_patching_agrees_with_transformer_lens(tiny, arch: str) -> None:
    model, _, tok = tiny(arch, 3 if arch == "armorm" else 1)
    obj = model.objectives[0]
    tp = equal_length_pair(model, tok)
    ours = activation_patching(model, tp, "resid", "denoising", objective=obj)
    clean = torch.tensor([tp.chosen_ids])
    corrupt = torch.tensor([tp.rejected_ids])
    _, clean_cache = model.run_with_cache(clean)
    r_c, r_r = ours.clean_chosen, ours.clean_rejected
    with torch.no_grad():
        assert float(model(clean)[0, -1, 0]) == pytest.approx(r_c, abs=1e-4)

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return (logits[0, -1, 0] - r_r) / (r_c - r_r)

    # effects are rewards over the margin: float32 rounding of the rewards, divided by it
    # (gpt2's tiny margin made a fixed 1e-4 fail under MKL's reproducible mode: 2.2e-4)
    tol = parity_atol(torch.tensor([r_c, r_r]), model.cfg.n_layers) / abs(r_c - r_r)
    assert tol < 0.05  # GPT-2: 0.017; effects run 0 to 1: a wrong site or position is far off
    theirs = tl_patching.get_act_patch_resid_pre(model, corrupt, clean_cache, metric)
    torch.testing.assert_close(ours.effect[:-1], theirs, atol=tol, rtol=0)
    if arch == "llama":
        heads = activation_patching(model, tp, "head", "denoising", positions="all")
        theirs_h = tl_patching.get_act_patch_attn_head_out_all_pos(model, corrupt, clean_cache,
                                                                   metric)
        torch.testing.assert_close(heads.effect, theirs_h, atol=tol, rtol=0)
        attn = activation_patching(model, tp, "attn_out", "denoising")
        theirs_a = tl_patching.get_act_patch_attn_out(model, corrupt, clean_cache, metric)
        torch.testing.assert_close(attn.effect, theirs_a, atol=tol, rtol=0)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_final_residual_patch_gives_source_reward(tiny, arch: str) -> None:
    model, _, _ = tiny(arch, 3 if arch == "armorm" else 1)
    tp = tokenize_pair(model, PAIR)
    assert tp.unaligned_rejected  # lengths differ: only aligned positions are written
    n = model.cfg.n_layers
    den = activation_patching(model, tp, "resid", "denoising", positions="all", layers=[n])
    noi = activation_patching(model, tp, "resid", "noising", positions="all", layers=[n])
    assert float(den.patched[0]) == pytest.approx(den.clean_chosen, abs=1e-4)
    assert float(noi.patched[0]) == pytest.approx(noi.clean_rejected, abs=1e-4)
    assert float(den.effect[0]) == pytest.approx(1.0, abs=1e-4)
    score = model.rewards([PAIR.chosen_conversation(), PAIR.rejected_conversation()]).score
    assert den.clean_chosen == pytest.approx(float(score[0]), abs=1e-4)
    # chunking and start_at_layer do not change results
    a = activation_patching(model, tp, "resid", "noising", layers=[1, n], chunk_size=3)
    b = activation_patching(model, tp, "resid", "noising", layers=[1, n], chunk_size=64)
    torch.testing.assert_close(a.effect, b.effect, atol=1e-5, rtol=0)
    assert a.effect.shape == (2, tp.n_aligned) and a.unaligned == (0, 2)


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_ablations_match_hand_written_hooks(tiny, mode: str) -> None:
    model, _, _ = tiny("gpt2", 1)
    tp = tokenize_pair(model, PAIR)
    reference = [("hi", "Hello there."), ("What is love?", "Love. Friendship. Music.")]
    res = activation_patching(model, tp, "mlp_out", mode, positions="all", reference=reference)
    hook = "blocks.1.hook_mlp_out"
    means = mean_activations(model, reference, [hook])
    batch = model.make_batch(reference)
    _, cache = model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask)
    m = batch.attention_mask.bool()
    torch.testing.assert_close(means[hook], cache[hook][m].mean(0), atol=1e-5, rtol=0)
    fill = torch.zeros(model.cfg.d_model) if mode == "zero" else means[hook]

    def ablate(act: torch.Tensor, hook: object) -> torch.Tensor:
        return fill.expand_as(act).clone()

    vals = []
    for side in ("chosen", "rejected"):
        toks = tp.tokens(side)
        logits = model.run_with_hooks(toks, attention_mask=torch.ones_like(toks),
                                      fwd_hooks=[(hook, ablate)])
        vals.append(float(logits[0, -1, 0].detach()))
    assert float(res.patched[0, 1]) == pytest.approx(vals[0], abs=1e-4)
    assert float(res.patched[1, 1]) == pytest.approx(vals[1], abs=1e-4)
    expect = (res.delta - (vals[0] - vals[1])) / res.delta
    assert float(res.effect[1]) == pytest.approx(expect, abs=1e-4)
    assert res.to_dataframe().shape[0] == model.cfg.n_layers


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_direct_path_patching(tiny, arch: str) -> None:
    model, _, _ = tiny(arch, 3 if arch == "armorm" else 1)
    obj = "score"
    frozen = direct_path_patching(model, PAIR, level="head", scale="frozen", objective=obj)
    pa = differential_attribution(model, [PAIR], objectives=obj)
    diff, names = pa.difference("head")
    n_emb = len(pa.chosen.embed_names)
    diff = torch.cat([diff[:, :n_emb].sum(1, keepdim=True), diff[:, n_emb:]], 1)[0, :, 0]
    assert frozen.names == ["embed", *names[n_emb:]]
    # under the frozen scale, direct-path patching equals the DRA difference (the identity the
    # spec states); the check against the model itself follows
    torch.testing.assert_close(frozen.effect * frozen.delta, diff, atol=1e-4, rtol=0)
    # frozen scale, against an actual hooked forward of the target (rejected) reply: at the
    # pooled token the final residual loses the component's own output and gains the source's,
    # rescaled to the target's norm scale, which is held at its clean value; nothing upstream
    # changes (the direct path only). Outputs come from the raw hooks: z @ W_O for a head.
    tp = tokenize_pair(model, PAIR)
    n = model.cfg.n_layers
    runs = {}
    for side in ("chosen", "rejected"):
        toks = tp.tokens(side)
        _, cache = model.run_with_cache(toks, attention_mask=torch.ones_like(toks))
        runs[side] = (toks, cache)

    def output(side: str, name: str) -> torch.Tensor:
        cache = runs[side][1]
        if name == "embed":
            return cache["blocks.0.hook_resid_pre"][0, -1]
        layer, part = name[1:].split(".")
        if part == "mlp":
            return cache[f"blocks.{layer}.hook_mlp_out"][0, -1]
        block = model.blocks[int(layer)]
        out = cache[f"blocks.{layer}.attn.hook_z"][0, -1, int(part[1:])] @ block.attn.W_O[
            int(part[1:])]
        if hasattr(block, "ln1_post"):  # Gemma-2's sandwich norm: w_post / s_post, s_post frozen
            gain = getattr(block.ln1_post, "w", None)
            out = out / cache[f"blocks.{layer}.ln1_post.hook_scale"][0, -1]
            out = out * gain if gain is not None else out
        return out

    toks_t, cache_t = runs["rejected"]
    s_t = cache_t["ln_final.hook_scale"]
    s_s = runs["chosen"][1]["ln_final.hook_scale"][0, -1]
    for name in ("embed", "L0.H1", f"L{n - 1}.H0", "L0.mlp", f"L{n - 1}.mlp"):
        swap = output("chosen", name) * (s_t[0, -1] / s_s) - output("rejected", name)

        def add(act: torch.Tensor, hook: object, d: torch.Tensor = swap) -> torch.Tensor:
            act = act.clone()
            act[0, -1] += d
            return act

        with model.hooks(fwd_hooks=[(f"blocks.{n - 1}.hook_resid_post", add),
                                    ("ln_final.hook_scale", lambda s, hook: s_t)]):
            val = float(model(toks_t, "score", attention_mask=torch.ones_like(toks_t))[0].detach())
        assert float(frozen.patched[frozen.names.index(name)]) == pytest.approx(val, abs=1e-4)
    # recomputed scale: against a hooked run that adds o_src - o_tgt to the final residual
    rec = direct_path_patching(model, PAIR, level="sublayer", scale="recompute", mode="noising",
                               objective=obj)
    tp = tokenize_pair(model, PAIR)
    n = model.cfg.n_layers
    caches = {}
    for side in ("chosen", "rejected"):
        _, caches[side] = model.run_with_cache(tp.tokens(side))
    for layer in (0, n - 1):
        name = f"blocks.{layer}.hook_mlp_out"
        delta = caches["rejected"][name][0, -1] - caches["chosen"][name][0, -1]

        def add(act: torch.Tensor, hook: object, d: torch.Tensor = delta) -> torch.Tensor:
            act = act.clone()
            act[0, -1] += d
            return act

        toks = tp.tokens("chosen")
        with model.hooks(fwd_hooks=[(f"blocks.{n - 1}.hook_resid_post", add)]):
            val = float(model(toks, "score", attention_mask=torch.ones_like(toks))[0].detach())
        idx = rec.names.index(f"L{layer}.mlp")
        assert float(rec.patched[idx]) == pytest.approx(val, abs=1e-4)


def test_patching_errors(tiny) -> None:
    model, _, _ = tiny("llama", 1)
    with pytest.raises(TLRewardError, match="reference="):
        activation_patching(model, PAIR, "mlp_out", "mean")
    with pytest.raises(TLRewardError, match="unknown mode"):
        activation_patching(model, PAIR, "mlp_out", "resample")
    with pytest.raises(TLRewardError, match="unknown site"):
        activation_patching(model, PAIR, "attn_scores")
    with pytest.raises(TLRewardError, match="positions='all'"):
        activation_patching(model, PAIR, "neuron", positions="each")


def test_layer_aligned_chunks_equal_one_forward_per_head(tiny) -> None:
    """``by_layer`` chunking (and any chunk size) gives each head's noising effect as one
    plain forward of the chosen reply with that head's z swapped in on the aligned rows."""
    from tl_reward.analysis.patching import _chunks, patch_components

    model, _, _ = tiny("qwen2", 1)
    tp = tokenize_pair(model, PreferencePair.from_prompt("Is it?", "Yes it is, surely.", "No."))
    names = [f"L{i}.H{h}" for i in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)]
    _, ch = model.run_with_cache(tp.tokens("chosen"), return_type=None)
    _, rj = model.run_with_cache(tp.tokens("rejected"), return_type=None)
    rows = tp.aligned[tp.prompt_len:]

    def score(side: str) -> float:
        t = tp.tokens(side).reshape(1, -1)
        with torch.no_grad():
            return float(model(t, attention_mask=torch.ones_like(t), return_type="score")[0])

    ref = []
    for name in names:
        layer, head = int(name[1:].split(".")[0]), int(name.split(".H")[1])
        hook = f"blocks.{layer}.attn.hook_z"

        def swap(z, hook, head=head, hook_name=hook):
            z = z.clone()
            z[0, rows[:, 0], head] = rj[hook_name][0, rows[:, 1], head]
            return z

        with model.hooks(fwd_hooks=[(hook, swap)]):
            ref.append(score("chosen"))
    r_c, r_r = score("chosen"), score("rejected")
    ref = (r_c - torch.tensor(ref)) / (r_c - r_r)
    assert ref.abs().max() > 1e-3  # heads matter here, so a wrong chunk would show
    for kw in ({"chunk_size": 5}, {"chunk_size": 5, "by_layer": True},
               {"chunk_size": 64, "by_layer": True}):
        got = patch_components(model, tp, names, "noising", **kw)
        torch.testing.assert_close(got, ref.to(got.dtype), atol=1e-4, rtol=0)
    assert _chunks([0, 1, 2, 3, 4], [0, 0, 1, 1, 1], 2, True) == [[0, 1], [2, 3], [4]]
    assert _chunks([0, 1, 2, 3, 4], [0, 0, 1, 1, 1], 3, False) == [[0, 1, 2], [3, 4]]
    assert _chunks([0, 1, 2, 3, 4], [0, 0, 1, 1, 1], 3, True) == [[0, 1], [2, 3, 4]]
