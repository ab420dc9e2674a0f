"""Pretrained SAELens SAEs: the registry look-up per RM family, SAELens-format SAEs loaded from
disk with each cfg variant, and the mismatches that must raise or warn."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from sae_lens import SAE
from sae_lens.saes.jumprelu_sae import JumpReLUSAE, JumpReLUSAEConfig
from sae_lens.saes.sae import SAEMetadata
from sae_lens.saes.standard_sae import StandardSAE, StandardSAEConfig
from sae_lens.saes.topk_sae import TopKSAE, TopKSAEConfig

from tl_reward.errors import SAEError
from tl_reward.sae import as_sae_model, sae_fit
from tl_reward.sae.pretrained import load_sae, normalise_model_name, prepare_sae, saes_for


@pytest.mark.parametrize("rm, release", [
    ("Skywork/Skywork-Reward-V2-Llama-3.1-8B", "llama_scope_lxr_8x"),
    ("Skywork/Skywork-Reward-Llama-3.1-8B-v0.2", "goodfire-llama-3.1-8b-instruct"),
    ("Skywork/Skywork-Reward-V2-Qwen3-8B", "qwen-scope-3-8b-base-w64k-l50"),
    ("Skywork/Skywork-Reward-V2-Qwen3-8B", "mwhanna-qwen3-8b-transcoders"),
    ("RLHFlow/ArmoRM-Llama3-8B-v0.1", "llama-3-8b-it-res-jh"),
    ("Skywork/Skywork-Reward-Gemma-2-27B-v0.2", "gemma-scope-27b-pt-res"),
    ("Ray2333/GRM-gemma2-2B-rewardmodel-ft", "gemma-scope-2b-pt-res"),
    ("OpenAssistant/gpt2-reward", "gpt2-small-res-jb"),
])
def test_saes_for_each_family(rm: str, release: str) -> None:
    found = saes_for(rm)
    df = found.to_dataframe()
    assert release in set(df["release"]) and found.reason is None
    bases = {normalise_model_name(b) for b in found.bases}
    assert {normalise_model_name(m) for m in df["model"]} <= bases      # only the RM's bases
    if release == "gpt2-small-res-jb":
        row = df[(df.release == release) & (df.sae_id == "blocks.8.hook_resid_pre")].iloc[0]
        assert row.hook_name == "blocks.8.hook_resid_pre" and row.layer == 8 and row.l0 > 0


def test_saes_for_none_with_a_reason() -> None:
    for rm in ("Skywork/Skywork-Reward-V2-Llama-3.2-1B", "tl-reward/smollm2-135m-hh"):
        found = saes_for(rm)
        assert len(found) == 0 and "no release" in found.reason
    assert "base=" in saes_for("someone/unknown-rm").reason
    # a base the user names, in the registry's other spelling
    assert "mwhanna-qwen3-8b-transcoders" in set(
        saes_for("x/y", base="Qwen/Qwen3-8B").to_dataframe()["release"])
    assert normalise_model_name("Qwen/Qwen3-8B") == normalise_model_name("qwen3-8b")



def test_saes_for_matches_the_size_exactly() -> None:
    """Other sizes of a base get no SAEs: by name (gpt2-medium/large/xl, Mistral-7B v0.2) and,
    for a loaded model, by its config against the base's (d_model, n_layers)."""
    from types import SimpleNamespace

    for rm in ("someone/gpt2-medium-reward", "someone/gpt2-large-rm", "someone/gpt2-xl-rm",
               "someone/distilgpt2-rm", "weqweasdas/RM-Mistral-7B"):
        assert len(saes_for(rm)) == 0, rm
    assert "mistral-7b-res-wg" in set(saes_for("x/Mistral-7B-Instruct-v0.1-rm")
                                      .to_dataframe()["release"])

    def model(d_model: int, n_layers: int) -> SimpleNamespace:
        return SimpleNamespace(cfg=SimpleNamespace(model_name="OpenAssistant/gpt2-reward",
                                                   d_model=d_model, n_layers=n_layers))

    assert len(saes_for(model(768, 12))) > 0                 # gpt2-small's own shape
    for shape in ((1024, 24), (768, 6)):
        found = saes_for(model(*shape))
        assert len(found) == 0 and f"d_model {shape[0]} and n_layers {shape[1]}" in found.reason


ARCHS = {"standard": (StandardSAE, StandardSAEConfig), "topk": (TopKSAE, TopKSAEConfig),
         "jumprelu": (JumpReLUSAE, JumpReLUSAEConfig)}


def write_sae(path: Path, d_in: int, hook: str, seed: int = 0, arch: str = "standard",
              **cfg: object) -> Path:
    """A seeded SAELens SAE of ``arch`` saved in SAELens's disk format (cfg.json +
    safetensors)."""
    meta = dict(hook_name=hook, model_name="tiny", prepend_bos=cfg.pop("prepend_bos", True),
                model_from_pretrained_kwargs=cfg.pop("model_from_pretrained_kwargs", {}))
    cls, cfg_cls = ARCHS[arch]
    sae = cls(cfg_cls(d_in=d_in, d_sae=48, metadata=SAEMetadata(**meta), **cfg))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in sae.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    sae.save_model(path)
    return path


def hook_acts(model, batch, hook: str) -> torch.Tensor:
    _, cache = model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask,
                                    names_filter=[hook])
    return cache[hook]


VARIANTS = [
    ("blocks.1.hook_resid_pre", dict(apply_b_dec_to_input=True)),
    ("blocks.1.hook_resid_post", dict(apply_b_dec_to_input=False)),
    ("blocks.0.hook_mlp_out", dict(normalize_activations="constant_norm_rescale")),
    ("blocks.1.hook_resid_post", dict(normalize_activations="layer_norm")),
    ("blocks.1.attn.hook_z", dict(reshape_activations="hook_z")),
    ("blocks.0.hook_resid_post", dict(arch="topk", k=6)),
    ("blocks.1.hook_mlp_out", dict(arch="jumprelu", apply_b_dec_to_input=False)),
]


@pytest.mark.parametrize("hook, cfg", VARIANTS)
def test_disk_sae_variants_splice_as_saelens(tiny, tmp_path, hook, cfg) -> None:
    """Loaded from disk by SAELens's loader, attached here: the spliced activation is what the
    SAE's own forward gives on the clean activation."""
    model = as_sae_model(tiny("llama", 1)[0])
    d_in = model.cfg.n_heads * model.cfg.d_head if hook.endswith("hook_z") else model.cfg.d_model
    sae = load_sae(model, str(write_sae(tmp_path, d_in, hook, **dict(cfg))))
    assert sae.cfg.apply_b_dec_to_input == cfg.get("apply_b_dec_to_input", True)
    assert sae.cfg.architecture() == cfg.get("arch", "standard")
    batch = model.build([("Is the sky blue?", "Yes."), ("hi", "Hello there, friend!")])
    x = hook_acts(model, batch, hook)
    with torch.no_grad():
        want = sae(x)
        _, cache = model.run_with_cache_with_saes(
            batch.tokens, attention_mask=batch.attention_mask, saes=[sae],
            use_error_term=False, names_filter=[f"{hook}.hook_sae_output"])
    got = cache[f"{hook}.hook_sae_output"]
    assert got.shape == x.shape
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert (got - x).abs().max() > 1e-2                     # the splice did change it


def test_expected_average_norm_needs_its_factor(tiny, tmp_path) -> None:
    model = as_sae_model(tiny("llama", 1)[0])
    hook = "blocks.1.hook_resid_post"
    path = write_sae(tmp_path, model.cfg.d_model, hook,
                     normalize_activations="expected_average_only_in")
    with pytest.raises(SAEError, match="normalize_activations"):
        load_sae(model, str(path))                          # load_from_disk does not fold it
    with pytest.raises(SAEError, match="normalize_activations"):
        sae_fit(model, SAE.load_from_disk(path), [("hi", "Hello!")])
    s = 2.5
    sae = load_sae(model, str(path), norm_scaling_factor=s)
    assert sae.cfg.normalize_activations == "none"
    raw = SAE.load_from_disk(path)                          # the SAE as trained: on x * s
    x = torch.randn(7, model.cfg.d_model, generator=torch.Generator().manual_seed(1)) * 3
    with torch.no_grad():
        torch.testing.assert_close(sae(x), raw(x * s) / s, atol=1e-5, rtol=1e-5)
        assert (raw(x) - raw(x * s) / s).abs().max() > 1e-2  # skipping the factor is wrong
    with pytest.raises(SAEError, match="norm_scaling_factor"):
        prepare_sae(model, sae, norm_scaling_factor=s)      # folded already


def test_processing_and_bos_mismatches(tiny, tmp_path) -> None:
    gpt2 = as_sae_model(tiny("gpt2", 1)[0])                 # LayerNorm: centred residual
    llama = as_sae_model(tiny("llama", 1)[0])               # RMSNorm: the HF residual
    raw = {"center_writing_weights": False}
    p = write_sae(tmp_path / "a", gpt2.cfg.d_model, "blocks.0.hook_resid_post",
                  model_from_pretrained_kwargs=raw)
    with pytest.raises(SAEError, match="center_writing_weights"):
        load_sae(gpt2, str(p))
    p = write_sae(tmp_path / "b", llama.cfg.d_model, "blocks.0.hook_resid_post",
                  model_from_pretrained_kwargs=raw)
    load_sae(llama, str(p))                                 # nothing to centre on RMSNorm
    d_z = llama.cfg.n_heads * llama.cfg.d_head
    p = write_sae(tmp_path / "c", d_z, "blocks.0.attn.hook_z", reshape_activations="hook_z",
                  model_from_pretrained_kwargs={"fold_value_biases": False})
    with pytest.raises(SAEError, match="fold_value_biases"):
        load_sae(llama, str(p))
    has_bos = llama.encode("hi").ids[0] == llama.tokenizer.bos_token_id
    p = write_sae(tmp_path / "d", llama.cfg.d_model, "blocks.0.hook_resid_post",
                  prepend_bos=not has_bos)
    with pytest.warns(UserWarning, match="prepend_bos"):
        load_sae(llama, str(p))
    p = write_sae(tmp_path / "e", llama.cfg.d_model, "blocks.0.hook_resid_post",
                  prepend_bos=has_bos)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_sae(llama, str(p))
    p = write_sae(tmp_path / "f", llama.cfg.d_model, "blocks.9.hook_resid_post")
    with pytest.raises(SAEError, match="not a hook"):
        load_sae(llama, str(p))


def test_cli_sae_fit(tmp_path, capsys) -> None:
    """``tl-reward sae-fit``: the listing, and the fit of a disk SAE equal to ``sae_fit``'s."""
    import json

    import pandas as pd

    from tl_reward import HookedRewardModel
    from tl_reward.cli import main
    from tl_reward.sae import sae_fit
    from tl_reward.testing import save_tiny_reward_model

    assert main(["sae-fit", "--list", "--model", "Skywork/Skywork-Reward-V2-Qwen3-8B"]) == 0
    assert "qwen-scope-3-8b-base" in capsys.readouterr().out
    path = save_tiny_reward_model(tmp_path / "rm", "llama")
    model = HookedRewardModel.from_pretrained(str(path), device="cpu")
    sae_dir = write_sae(tmp_path / "sae", model.cfg.d_model, "blocks.1.hook_resid_post")
    pairs = [{"prompt": "Is the sky blue?", "chosen": "Yes.", "rejected": "No, green."},
             {"prompt": "hi", "chosen": "Hello!", "rejected": "Go away."},
             {"prompt": "2+2?", "chosen": "4", "rejected": "5"}]
    jsonl = tmp_path / "pairs.jsonl"
    jsonl.write_text("\n".join(json.dumps(x) for x in pairs))
    out = tmp_path / "fit.csv"
    assert main(["sae-fit", "--model", str(path), "--device", "cpu", "--sae", str(sae_dir),
                 "--input", str(jsonl), "--output", str(out)]) == 0
    df = pd.read_csv(out)
    want = sae_fit(model, SAE.load_from_disk(sae_dir),
                   [(p["prompt"], p["chosen"], p["rejected"]) for p in pairs]).to_dataframe()
    assert list(df["metric"]) == list(want["metric"])
    torch.testing.assert_close(torch.tensor(df["value"].values), torch.tensor(want["value"].values),
                               atol=1e-6, rtol=1e-6)
    assert main(["sae-fit", "--model", str(path), "--sae", str(sae_dir)]) == 1


@pytest.mark.parametrize("hook, width", [
    ("blocks.0.hook_resid_post", "d_model"), ("blocks.1.hook_attn_out", "d_model"),
    ("blocks.0.hook_mlp_out", "d_model"), ("blocks.0.mlp.hook_post", "d_mlp"),
    ("blocks.1.mlp.hook_pre", "d_mlp"), ("blocks.0.attn.hook_z", "z"),
])
def test_check_sae_width_is_the_hooks_own(tiny, hook, width) -> None:
    """``d_in`` must be the width of the SAE's own hook (read from the model's cache); the
    other widths (d_model where d_mlp is read, and so on) are refused by name."""
    from tl_reward.sae import check_sae

    model = as_sae_model(tiny("llama", 1)[0])                  # d_model 64, d_mlp 96, z 64
    batch = model.build([("hi", "Hello!")])
    _, cache = model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask,
                                    names_filter=[hook])
    z = hook.endswith("hook_z")
    real = cache[hook].flatten(2).shape[-1] if z else cache[hook].shape[-1]
    widths = {model.cfg.d_model, model.cfg.d_mlp, model.cfg.d_model + 8}

    def sae(d_in: int) -> StandardSAE:
        return StandardSAE(StandardSAEConfig(
            d_in=d_in, d_sae=8, reshape_activations="hook_z" if z else "none",
            metadata=SAEMetadata(hook_name=hook)))

    assert check_sae(model, sae(real)) == hook
    for d_in in widths - {real}:
        with pytest.raises(SAEError, match=f"d_in is {d_in} but '{hook}' is {real} wide"):
            check_sae(model, sae(d_in))
