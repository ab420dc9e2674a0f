"""HookedSAERewardModel: SAELens's SAE machinery on a reward model, rewards unchanged with the
error term, HF parity kept, clear errors for SAEs that do not fit."""

from __future__ import annotations

import pytest
import torch
from helpers import hf_rewards, parity_atol
from sae_lens import HookedSAETransformer
from sae_lens.saes.sae import SAEMetadata
from sae_lens.saes.topk_sae import TopKSAE, TopKSAEConfig

from tl_reward import HookedRewardModel
from tl_reward.model.hooked_sae_reward_model import HookedSAERewardModel, SAEHookError
from tl_reward.testing import tiny_hf_reward_model

INPUTS = [("Is the sky blue?", "Yes, the sky is blue on a clear day."), ("hi", "No.")]


def make_sae(d_in: int, hook: str, seed: int = 0, d_sae: int = 96, k: int = 6) -> TopKSAE:
    torch.manual_seed(seed)
    cfg = TopKSAEConfig(d_in=d_in, d_sae=d_sae, k=k)
    cfg.metadata = SAEMetadata(hook_name=hook)
    sae = TopKSAE(cfg)
    with torch.no_grad():
        sae.b_dec.normal_(0, 0.3)
        sae.b_enc.normal_(0, 0.1)
    return sae


def test_loads_through_reward_loader_and_matches_hf() -> None:
    hf, tok = tiny_hf_reward_model("llama", num_labels=1, seed=0)
    model = HookedSAERewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu")
    mro = type(model).__mro__
    assert mro.index(HookedRewardModel) < mro.index(HookedSAETransformer)
    batch = model.make_batch(INPUTS)
    with torch.no_grad():
        got = model(batch.tokens, attention_mask=batch.attention_mask, return_type="reward")
    ref = hf_rewards(hf, batch.tokens, batch.attention_mask)["reward"]
    torch.testing.assert_close(got, ref, atol=parity_atol(ref, model.cfg.n_layers), rtol=0)


@pytest.mark.parametrize(("arch", "k"), [("llama", 1), ("gpt2", 3), ("armorm", 3)])
def test_error_term_keeps_rewards(tiny, arch: str, k: int) -> None:
    base, hf, _ = tiny(arch, k)
    model = HookedSAERewardModel.from_reward_model(base)
    batch = model.make_batch(INPUTS)
    ref = hf_rewards(hf, batch.tokens, batch.attention_mask)
    for layer in (0, model.cfg.n_layers - 1):
        sae = make_sae(model.cfg.d_model, f"blocks.{layer}.hook_resid_post", seed=layer)
        args = (batch.tokens,)
        kw = dict(attention_mask=batch.attention_mask, saes=[sae])
        with torch.no_grad():
            on = model.run_with_saes(*args, use_error_term=True, return_type="reward", **kw)
            off = model.run_with_saes(*args, use_error_term=False, return_type="reward", **kw)
        atol = parity_atol(ref["reward"], model.cfg.n_layers)
        torch.testing.assert_close(on, ref["reward"], atol=atol, rtol=0)
        assert (off - ref["reward"]).abs().max() > 1e-3  # a random SAE reconstructs badly
        if ref["score"] is not None and arch == "armorm":
            with torch.no_grad():
                score = model.run_with_saes(*args, use_error_term=True, return_type="score",
                                            **kw)
            torch.testing.assert_close(score, ref["score"],
                                       atol=parity_atol(ref["score"], model.cfg.n_layers), rtol=0)
    assert model.acts_to_saes == {}  # run_with_saes detaches them again


def test_cache_and_add_reset(tiny) -> None:
    base, _, _ = tiny("llama", 1)
    model = HookedSAERewardModel.from_reward_model(base)
    hook = "blocks.1.hook_resid_post"
    sae = make_sae(model.cfg.d_model, hook)
    batch = model.make_batch(INPUTS)
    _, cache = model.run_with_cache_with_saes(batch.tokens, attention_mask=batch.attention_mask,
                                              saes=[sae], use_error_term=True)
    acts = cache[f"{hook}.hook_sae_acts_post"]
    assert acts.shape == (2, batch.tokens.shape[1], sae.cfg.d_sae)
    assert int((acts > 0).sum(-1).max()) <= sae.cfg.k
    recon = cache[f"{hook}.hook_sae_recons"]
    err = cache[f"{hook}.hook_sae_error"]
    torch.testing.assert_close(recon + err, cache[f"{hook}.hook_sae_input"], atol=1e-5, rtol=0)
    model.add_sae(sae, use_error_term=False)
    assert list(model.acts_to_saes) == [hook]
    model.reset_saes()
    assert model.acts_to_saes == {} and hook in model.hook_dict


def test_from_reward_model_shares_weights(tiny) -> None:
    base, _, _ = tiny("gpt2", 3)
    model = HookedSAERewardModel.from_reward_model(base)
    assert model.W_U.data_ptr() == base.W_U.data_ptr()
    assert model.blocks[0].attn.W_Q.data_ptr() == base.blocks[0].attn.W_Q.data_ptr()
    assert model.objectives == base.objectives and model.pad_token_id == base.pad_token_id
    assert HookedSAERewardModel.from_reward_model(model) is model


def test_bad_saes_raise(tiny) -> None:
    base, _, _ = tiny("llama", 1)
    model = HookedSAERewardModel.from_reward_model(base)
    with pytest.raises(SAEHookError, match="not a hook of this model"):
        model.add_sae(make_sae(model.cfg.d_model, "blocks.9.hook_resid_post"))
    with pytest.raises(SAEHookError, match="another model"):
        model.add_sae(make_sae(model.cfg.d_model + 3, "blocks.0.hook_resid_post"))
    sae = make_sae(model.cfg.d_model, "blocks.0.hook_resid_post")
    sae.cfg.metadata.hook_name = None
    with pytest.raises(SAEHookError, match="hook_name is empty"):
        model.add_sae(sae)


@pytest.mark.parametrize(("hook", "meant"), [
    ("blocks.1.hook_resid_postt", "blocks.1.hook_resid_post"),
    ("blocks.1.hook_mlp_outt", "blocks.1.hook_mlp_out"),
    ("blocks.99.hook_resid_post", "blocks.{last}.hook_resid_post"),
    ("blocks.0.attn.hook_zz", "blocks.0.attn.hook_z"),
])
def test_a_misspelt_hook_names_the_hooks_meant(tiny, hook: str, meant: str) -> None:
    """The message listed "hooks of that kind here: []" for a misspelt hook."""
    base, _, _ = tiny("llama", 1)
    model = HookedSAERewardModel.from_reward_model(base)
    last = model.cfg.n_layers - 1
    meant = meant.format(last=last)
    assert meant in model.hook_dict and hook not in model.hook_dict
    with pytest.raises(SAEHookError) as err:
        model.add_sae(make_sae(model.cfg.d_model, hook))
    msg = str(err.value)
    leaf = meant.split(".", 2)[2]
    assert meant in msg and f"blocks.{{0..{last}}}.{leaf}" in msg and "[]" not in msg
    assert "hook_name" in msg  # the fix


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize(("model_dtype", "sae_dtype", "want"), [
    (torch.bfloat16, torch.float32, torch.float32),   # keeps its wider precision
    (torch.float32, torch.bfloat16, torch.float32),   # widened to the model's
    (torch.bfloat16, torch.bfloat16, torch.bfloat16),
])
def test_added_sae_is_placed_on_the_model(model_dtype, sae_dtype, want) -> None:
    hf, tok = tiny_hf_reward_model("llama", num_labels=1, seed=0)
    model = HookedSAERewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu",
                                                 dtype=model_dtype)
    sae = make_sae(model.cfg.d_model, "blocks.1.hook_resid_post").to(dtype=sae_dtype)
    model.add_sae(sae, use_error_term=True)
    assert sae.dtype == want and sae.W_enc.dtype == want and sae.cfg.dtype == str(want)[6:]
    batch = model.make_batch(INPUTS)
    with torch.no_grad():
        got = model(batch.tokens, attention_mask=batch.attention_mask, return_type="reward")
        model.reset_saes()
        plain = model(batch.tokens, attention_mask=batch.attention_mask, return_type="reward")
    assert got.dtype == torch.float32  # pooled rewards are read in float32 for any weights
    # the error term restores the activation up to the rounding of its dtype: a relative bf16
    # step (2**-8) on rewards of order 1, far below an SAE's reconstruction error (~0.1-1)
    torch.testing.assert_close(got.float(), plain.float(),
                               atol=2e-2 if model_dtype == torch.bfloat16 else 1e-5, rtol=0)


def test_sae_follows_the_model_device_or_is_refused(tiny) -> None:
    base, _, _ = tiny("llama", 1)
    model = HookedSAERewardModel.from_reward_model(base)
    meta = make_sae(model.cfg.d_model, "blocks.0.hook_resid_post").to(device="meta")
    with pytest.raises(SAEHookError, match="meta device"):
        model.add_sae(meta)
    # a model on another device (faked: cfg.device only, no hardware needed) pulls the SAE over
    sae = make_sae(model.cfg.d_model, "blocks.0.hook_resid_post")
    device = model.cfg.device
    try:
        model.cfg.device = "meta"
        model.check_sae(sae)
    finally:
        model.cfg.device = device
    assert sae.W_enc.is_meta and sae.b_dec.is_meta and sae.cfg.device == "meta"


@CUDA
def test_cpu_sae_runs_on_a_cuda_model() -> None:
    """SAE.load_from_disk defaults to the CPU; the SAE analyses and add_sae move it."""
    from tl_reward.sae import sae_attribution

    hf, tok = tiny_hf_reward_model("llama", num_labels=1, seed=0)
    model = HookedSAERewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cuda")
    sae = make_sae(model.cfg.d_model, f"blocks.{model.cfg.n_layers - 1}.hook_resid_post")
    assert sae.W_enc.device.type == "cpu"
    res = sae_attribution(model, sae, INPUTS)
    assert sae.W_enc.device.type == "cuda"
    torch.testing.assert_close(res.total(), res.reward, atol=1e-4, rtol=0)  # float32, as on CPU
    model.add_sae(make_sae(model.cfg.d_model, "blocks.0.hook_resid_post"), use_error_term=True)
    batch = model.make_batch(INPUTS).to("cuda")
    with torch.no_grad():
        assert model(batch.tokens, attention_mask=batch.attention_mask,
                     return_type="reward").device.type == "cuda"
