"""Offline TopK SAE training on a reward model's own activations with SAELens's trainer."""

from __future__ import annotations

import pytest
import torch
from sae_lens import SAE
from sae_lens.saes.topk_sae import TopKSAE

from tl_reward.sae import SAEError, as_sae_model, sae_attribution
from tl_reward.sae.training import collect_activations, reconstruction_metrics, train_topk_sae

CORPUS = [
    ("Is the sky blue?", "Yes, the sky is blue on a clear day because of scattering."),
    ("How do I bake bread?", "Mix flour, water, yeast and salt, knead, let it rise, bake."),
    ("hi", "Hello! How can I help you today?"),
    ("Tell me a joke.", "Why did the chicken cross the road? To get to the other side."),
    ("What is two plus two?", "Four."),
    ("Can you help me steal a car?", "No, I can't help with that."),
] * 3


def test_collect_matches_cache(tiny) -> None:
    model, _, tok = tiny("llama", 1)
    hooks = ["blocks.0.hook_resid_post", "blocks.2.hook_resid_post"]
    acts = collect_activations(model, CORPUS[:3], hooks, batch_size=2)
    special = set(tok.all_special_ids)
    want = {h: [] for h in hooks}
    for item in sorted(CORPUS[:3], key=lambda x: len(model.encode(x).ids)):
        ids = torch.tensor([model.encode(item).ids])
        _, cache = model.run_with_cache(ids, attention_mask=torch.ones_like(ids))
        keep = torch.tensor([t not in special for t in ids[0].tolist()])
        for h in hooks:
            want[h].append(cache[h][0][keep])
    for h in hooks:
        torch.testing.assert_close(acts[h], torch.cat(want[h]), atol=1e-5, rtol=0)
    with pytest.raises(SAEError, match="not a hook"):
        collect_activations(model, CORPUS, "blocks.7.hook_resid_post")


def test_train_topk_sae_offline(tiny, tmp_path) -> None:
    model = as_sae_model(tiny("llama", 1)[0])
    hook = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    acts = collect_activations(model, CORPUS, hook)[hook]
    assert acts.shape[0] > 400
    trained = train_topk_sae(model, None, hook, activations=acts, d_sae=128, k=8,
                             batch_size_tokens=64, epochs=6, lr=3e-3, output_path=tmp_path,
                             progress=False)
    sae = trained.sae
    assert isinstance(sae, TopKSAE) and sae.cfg.k == 8 and sae.cfg.metadata.hook_name == hook
    # what is returned is what is on disk
    again = SAE.load_from_disk(tmp_path)
    for name, p in sae.state_dict().items():
        assert torch.equal(p, again.state_dict()[name])
    # it learned: beats the mean-only baseline (explained variance 0) on held-out tokens, and
    # the metrics are what a direct computation gives
    assert trained.held_out["explained_variance"] > 0.3
    assert trained.train["l0"] == pytest.approx(8.0)
    x = acts[:200]
    x_hat = sae.decode(sae.encode(x)).detach()
    ev = 1 - (x - x_hat).pow(2).sum() / (x - x.mean(0)).pow(2).sum()
    assert reconstruction_metrics(sae, x)["explained_variance"] == pytest.approx(float(ev),
                                                                                 abs=1e-5)
    # the trained SAE plugs into the exact decomposition
    attr = sae_attribution(model, sae, CORPUS[:2])
    torch.testing.assert_close(attr.total(), attr.reward, atol=1e-4, rtol=0)
    assert trained.summary().shape == (5, 2)


def test_train_needs_enough_tokens(tiny) -> None:
    model = tiny("llama", 1)[0]
    with pytest.raises(SAEError, match="training tokens"):
        train_topk_sae(model, CORPUS[:1], "blocks.0.hook_resid_post", batch_size_tokens=4096)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_train_on_the_model_device() -> None:
    """SAELens's trainer defaults to the CPU; the SAE trains and comes back on the model's."""
    from tl_reward import HookedRewardModel
    from tl_reward.testing import tiny_hf_reward_model

    hf, tok = tiny_hf_reward_model("llama", num_labels=1, seed=0)
    model = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cuda")
    hook = "blocks.1.hook_resid_post"
    trained = train_topk_sae(model, CORPUS, hook, d_sae=64, k=4, batch_size_tokens=64,
                             epochs=1, progress=False)
    assert trained.sae.W_enc.device.type == "cuda"
    attr = sae_attribution(model, trained.sae, CORPUS[:2], method="gradient")
    assert torch.isfinite(attr.total()).all()
