"""One pooled readout for every analysis (issue 9, item 1).

A tiny Llama whose pad token is ``<|eot_id|>`` = EOS, as many RMs set it: the template closes
every turn with it, so "hf" reads the token before the final ``<|eot_id|>``, "legacy" the end of
the first turn (inside the shared prompt) and "mask" the final ``<|eot_id|>``. The clean rewards
of every analysis must be HF's backbone and head read at that token (brute force), and patch
effects must match TransformerLens's own patching and hand-written hooks with a metric read at
the pooled token. Before the fix, activation patching, patch_components and attribution patching
read the last position (1.265 / 0.722 instead of 0.695 / 0.322 under "hf").
"""

from __future__ import annotations

import warnings

import pytest
import torch
from helpers import hf_reward_at, hf_rewards, pad_is_eot_hf, pad_is_eot_model
from sae_lens.saes.sae import SAEMetadata
from sae_lens.saes.topk_sae import TopKSAE, TopKSAEConfig
from transformer_lens import patching as tl_patching

from tl_reward.analysis.attribution import differential_attribution
from tl_reward.analysis.attribution_patching import attribution_patching
from tl_reward.analysis.direct_path import direct_path_patching
from tl_reward.analysis.lens import differential_lens
from tl_reward.analysis.patching import activation_patching, patch_components
from tl_reward.data import PreferencePair
from tl_reward.data.pairs import align_ids, tokenize_pair
from tl_reward.sae import sae_attribution
from tl_reward.sae.ablation import ablated_objectives

PAIR = PreferencePair.from_prompt("Is the sky blue?", "Yes, the sky is blue.", "No, it is red.")
RULES = ["hf", "legacy", "mask"]
ATOL = 1e-4  # float32 forwards of a 3-layer model, rewards O(1)


def brute_position(ids: list[int], pad: int, rule: str) -> int:
    """The pooled position of unpadded ``ids`` from each rule's definition."""
    if rule == "hf":
        return max(i for i, t in enumerate(ids) if t != pad)
    if rule == "legacy":
        return ids.index(pad) - 1 if pad in ids else len(ids) - 1
    return len(ids) - 1


def tiny_sae(d_in: int, hook: str) -> TopKSAE:
    torch.manual_seed(0)
    cfg = TopKSAEConfig(d_in=d_in, d_sae=48, k=6)
    cfg.metadata = SAEMetadata(hook_name=hook)
    sae = TopKSAE(cfg)
    with torch.no_grad():
        sae.b_dec.normal_(0, 0.3)
        sae.b_enc.normal_(0, 0.1)
    return sae


@pytest.mark.parametrize("rule", RULES)
def test_every_analysis_reads_the_pooled_token(rule: str) -> None:
    model = pad_is_eot_model(rule)
    hf, _ = pad_is_eot_hf()
    pad = model.pad_token_id
    tp = tokenize_pair(model, PAIR)
    ref = torch.stack([hf_reward_at(hf, tp.ids(s), brute_position(tp.ids(s), pad, rule))[0]
                       for s in ("chosen", "rejected")])
    if rule == "hf":  # HF's own forward applies this rule
        batch = model.make_batch([PAIR.chosen_conversation(), PAIR.rejected_conversation()])
        torch.testing.assert_close(hf_rewards(hf, batch.tokens, batch.attention_mask)["reward"]
                                   [:, 0], ref, atol=ATOL, rtol=0)
    assert tp.ids("chosen")[-1] == pad  # the template ends with the pad token
    got: dict[str, torch.Tensor] = {}
    got["rewards"] = model.rewards([PAIR.chosen_conversation(),
                                    PAIR.rejected_conversation()]).score
    pa = differential_attribution(model, [PAIR])
    got["dra"] = torch.stack([pa.chosen.total()[0, 0], pa.rejected.total()[0, 0]])
    lens = differential_lens(model, [PAIR])
    got["lens"] = torch.stack([lens.chosen.values["frozen"][0, -1, 0],
                               lens.rejected.values["frozen"][0, -1, 0]])
    with warnings.catch_warnings():
        # legacy reads inside the shared prompt: margin 0, normalised effects NaN (warned)
        warnings.simplefilter("ignore" if rule == "legacy" else "error", RuntimeWarning)
        n = model.cfg.n_layers
        den = activation_patching(model, tp, "resid", "denoising", positions="all", layers=[n])
        at = attribution_patching(model, tp)
        dp = direct_path_patching(model, tp)
        comp = patch_components(model, tp, ["L1.mlp"], mode="noising")
    for name, res in (("patching", den), ("attribution_patching", at), ("direct_path", dp)):
        got[name] = torch.tensor([res.clean_chosen, res.clean_rejected])
    # the whole final residual patched in gives the source's reward
    got["patched_final"] = torch.tensor([float(den.patched[0]), ref[1]])
    hook = f"blocks.{n - 1}.hook_resid_post"
    sae = tiny_sae(model.cfg.d_model, hook)
    got["sae_exact"] = sae_attribution(model, sae, [tp.tokens("chosen")[0],
                                                    tp.tokens("rejected")[0]]).reward[:, 0]
    sae1 = tiny_sae(model.cfg.d_model, "blocks.1.hook_resid_post")
    got["sae_gradient"] = sae_attribution(model, sae1, [tp.tokens("chosen")[0],
                                                        tp.tokens("rejected")[0]]).reward[:, 0]
    got["sae_ablation_none"] = torch.cat([
        ablated_objectives(model, sae1, tp.tokens(s), torch.ones_like(tp.tokens(s)), [[]],
                           ["reward"])[:, 0] for s in ("chosen", "rejected")])
    for name, val in got.items():
        torch.testing.assert_close(val.float(), ref, atol=ATOL, rtol=0, msg=name)

    # patch effects against independent references with the metric read at the pooled token
    toks = tp.tokens("chosen")
    t_star = int(model.pool_positions(toks, torch.ones_like(toks))[0])
    assert t_star == brute_position(tp.ids("chosen"), pad, rule)
    name = "blocks.1.hook_mlp_out"
    _, cache_r = model.run_with_cache(tp.tokens("rejected"))
    rows_c, rows_r = tp.aligned[:, 0], tp.aligned[:, 1]

    def swap(act: torch.Tensor, hook: object) -> torch.Tensor:
        act = act.clone()
        act[0, rows_c] = cache_r[name][0, rows_r]
        return act

    with torch.no_grad(), model.hooks(fwd_hooks=[(name, swap)]):
        patched = float(model(toks, "score", attention_mask=torch.ones_like(toks))[0])
    r_c, r_r = float(ref[0]), float(ref[1])
    if rule == "legacy":  # margin 0: effect undefined, and the patch changes nothing at t*
        assert torch.isnan(comp[0]) and patched == pytest.approx(r_c, abs=ATOL)
    else:
        assert float(comp[0]) * (r_c - r_r) == pytest.approx(r_c - patched, abs=ATOL)


def test_patching_after_the_pooled_token() -> None:
    """Pooling "hf", equal-length pair: our per-position effects equal TransformerLens's
    patching with a metric at the pooled token; positions after it (the final <|eot_id|>) are
    exactly 0, in activation and attribution patching."""
    model = pad_is_eot_model("hf")
    tok = model.tokenizer
    tp = tokenize_pair(model, PAIR)
    ids = list(tp.rejected_ids)
    gen = torch.Generator().manual_seed(0)
    specials = set(tok.all_special_ids)
    for i in range(tp.prompt_len, len(ids) - 2):
        while (t := int(torch.randint(0, len(tok), (1,), generator=gen))) in specials:
            pass
        ids[i] = t
    eq = align_ids(list(tp.rejected_ids), ids, tp.prompt_len)
    ours = activation_patching(model, eq, "resid", "denoising")
    clean, corrupt = torch.tensor([eq.chosen_ids]), torch.tensor([eq.rejected_ids])
    t_star = int(model.pool_positions(clean, torch.ones_like(clean))[0])
    _, clean_cache = model.run_with_cache(clean)
    r_c, r_r = ours.clean_chosen, ours.clean_rejected

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return (logits[0, t_star, 0] - r_r) / (r_c - r_r)

    theirs = tl_patching.get_act_patch_resid_pre(model, corrupt, clean_cache, metric)
    torch.testing.assert_close(ours.effect[:-1], theirs, atol=ATOL, rtol=0)
    after = eq.aligned[:, 0] > t_star
    assert bool(after.any())  # the final <|eot_id|>
    assert (ours.effect[:, after] == 0).all()
    at = attribution_patching(model, eq)
    assert (at.resid["denoising"][:, after] == 0).all()
