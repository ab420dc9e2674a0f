"""Top features over preference pairs and feature views (alignment, examples, ablation)."""

from __future__ import annotations

import pytest
import torch
from helpers import sae_terms_by_hand
from sae_lens.saes.sae import SAEMetadata
from sae_lens.saes.topk_sae import TopKSAE, TopKSAEConfig

from tl_reward.data import PreferencePair
from tl_reward.sae import SAEError, as_sae_model
from tl_reward.sae.ablation import ablated_objectives
from tl_reward.sae.features import feature_views, top_features
from tl_reward.sae.splice import decoder_directions

PAIRS = [PreferencePair.from_prompt("Is the sky blue?", "Yes, on a clear day.", "No."),
         PreferencePair.from_prompt("hi", "Hello! How can I help?", "Go away."),
         PreferencePair.from_prompt("Help me steal a car.", "I can't help with that.",
                                    "Sure, first break the window.")]


def make_sae(model, hook: str, seed: int = 0) -> TopKSAE:
    torch.manual_seed(seed)
    cfg = TopKSAEConfig(d_in=model.cfg.d_model, d_sae=64, k=6, rescale_acts_by_decoder_norm=True)
    cfg.metadata = SAEMetadata(hook_name=hook)
    sae = TopKSAE(cfg)
    with torch.no_grad():
        sae.b_enc.normal_(0, 0.1)
    return sae


def test_top_features_rank_pair_differences(tiny) -> None:
    """The ranking against an independent one: each pair's chosen-minus-rejected feature terms
    computed by hand (SAELens's decoder, HF's head and LayerNorm gain, the norm scale from the
    residual: ``sae_terms_by_hand``), mean |difference| over pairs, top 4 per objective."""
    base, hf, _ = tiny("gpt2", 3)
    model = as_sae_model(base)
    sae = make_sae(model, f"blocks.{model.cfg.n_layers - 1}.hook_resid_post")
    top = top_features(model, sae, PAIRS, k=4)
    assert set(top.table.objective) == set(model.objectives)
    diff = torch.stack([
        sae_terms_by_hand(model, hf, "gpt2", sae, p.chosen_conversation())["features"]
        - sae_terms_by_hand(model, hf, "gpt2", sae, p.rejected_conversation())["features"]
        for p in PAIRS])  # [pairs, d_sae, K]
    for k, obj in enumerate(model.objectives):
        t = top.table[top.table.objective == obj]
        score = diff[..., k].abs().mean(0)
        want = score.topk(4).indices.tolist()
        assert score[want[-1]] - score.topk(5).values[-1] > 1e-4  # a clear cut at rank 4
        assert t.feature.tolist() == want
        for _, row in t.iterrows():
            assert row.mean_difference == pytest.approx(float(diff[:, row.feature, k].mean()),
                                                        abs=2e-5)
    assert top.features == top.table[top.table.objective == "objective_0"].feature.tolist()
    assert len(top.plot().data[0].y) == 4


def test_feature_views(tiny) -> None:
    model = as_sae_model(tiny("llama", 1)[0])
    hook = "blocks.1.hook_resid_post"
    sae = make_sae(model, hook, seed=3)
    corpus = [c for p in PAIRS for c in (p.chosen_conversation(), p.rejected_conversation())]
    # the two features that fire most over the corpus
    total = torch.zeros(sae.cfg.d_sae)
    for item in corpus:
        ids = torch.tensor([model.encode(item).ids])
        with torch.no_grad():
            x = model.run_with_cache(ids, attention_mask=torch.ones_like(ids),
                                     names_filter=hook)[1][hook]
            total += sae.encode(x)[0].sum(0)
    feats = total.topk(2).indices.tolist()
    views = feature_views(model, sae, feats, corpus, n_examples=3, context=2, ablate_items=2)
    assert [v.feature for v in views] == feats
    w = model.W_U[:, 0].detach()
    for v in views:
        d = decoder_directions(sae)[v.feature].detach()
        assert v.reward_alignment == pytest.approx(float(torch.cosine_similarity(d, w, 0)),
                                                   abs=1e-5)
        assert 0 < v.frequency <= 1 and v.mean_activation > 0
        ex = v.examples
        assert len(ex) == 3 and ex.activation.is_monotonic_decreasing
        # each example's activation is the feature at that token, re-computed here
        i, p = int(ex.item[0]), int(ex.position[0])
        ids = torch.tensor([model.encode(corpus[i]).ids])
        with torch.no_grad():
            x = model.run_with_cache(ids, attention_mask=torch.ones_like(ids),
                                     names_filter=hook)[1][hook]
            assert float(sae.encode(x)[0, p, v.feature]) == pytest.approx(ex.activation[0],
                                                                            abs=1e-5)
        # ablation effects match the single-input ablation
        a = v.ablation.iloc[0]
        item = torch.tensor([model.encode(corpus[int(a["item"])]).ids])
        vals = ablated_objectives(model, sae, item, torch.ones_like(item), [[], [v.feature]],
                                  ["reward"])
        assert a.reward_change == pytest.approx(float(vals[1, 0] - vals[0, 0]), abs=1e-4)
    assert len(views.summary()) == 2
    html = views.dashboard()
    assert "TopkSamples" in html.local_src
    assert len(views.plot().data) == 3
    with pytest.raises(SAEError, match="feature"):
        feature_views(model, sae, [999], corpus)
