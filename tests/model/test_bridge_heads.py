"""Custom reward heads on the TransformerBridge (issue 30): LM-head rows, INF-ORM's MLP head,
ArmoRM's and QRM's gating heads, InternLM2's reward token (its body re-laid as HF's Llama).

References: the HF (custom-code reference) module's own forward on each unpadded row (rewards,
score and gate), and the HookedRewardModel converted from the same weights (skipped under
TransformerLens 4; there the decompositions are checked against the HF module alone).
Tolerances from the dtype: float32, :func:`parity_atol`; bfloat16, four
roundings of the reward scale (``4 x 2^-7 x max(1, |reward|)``; measured at most 1.2 of them,
bridge against HookedRewardModel, which rounds differently; the bridge against HF's own bf16
forward is exact but for QRM, whose published head runs in float32). A reward read one token
before the pooled one exceeds it (checked).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import CONVERSATIONS, needs_hooked_transformer, parity_atol
from tl_reward.errors import TLRewardError, UnsupportedArchitectureError
from tl_reward.model.bridge_reward_model import BridgeRewardModel
from tl_reward.testing import save_tiny_reward_model, tiny_hf_reward_model

#: tiny model -> (num_labels, lm_head_rows)
HEADS: dict[str, tuple[int, list[int] | None]] = {
    "nemotron": (1, [0, 7]), "inform": (1, None), "armorm": (3, None), "qrm": (4, None),
    "internlm2": (1, None)}
DTYPES = [torch.float32, torch.bfloat16]


def _tol(ref: torch.Tensor, dtype: torch.dtype) -> float:
    if dtype == torch.float32:
        return parity_atol(ref, 3)
    return 4 * torch.finfo(dtype).eps * max(1.0, float(ref.abs().max()))


def _hf_reference(hf: Any, ids: list[int], rows: list[int] | None) -> dict[str, torch.Tensor]:
    """The HF module's own outputs on one unpadded row, in float32."""
    tokens = torch.tensor([ids])
    with torch.no_grad():
        out = hf(input_ids=tokens, attention_mask=torch.ones_like(tokens))
    if rows is not None:  # a causal LM: its logits at the last token, those rows
        return {"reward": out.logits[0, -1, rows].float()}
    if hasattr(out, "gating_output"):
        return {"reward": out.rewards[0].float(), "score": out.score.reshape(-1)[0].float(),
                "gating": out.gating_output[0].float()}
    logits = out.logits.reshape(1, -1).float()  # InternLM2's reward: one scalar per row
    return {"reward": logits[0], "score": logits[0, 0]}


def _bridge(arch: str, dtype: torch.dtype) -> tuple[BridgeRewardModel, Any]:
    k, rows = HEADS[arch]
    hf, tok = tiny_hf_reward_model(arch, num_labels=k)
    model = BridgeRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, dtype=dtype,
                                              lm_head_rows=rows)
    return model, hf


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "bfloat16"])
@pytest.mark.parametrize("arch", sorted(HEADS))
def test_custom_head_rewards_equal_hf(arch: str, dtype: torch.dtype) -> None:
    """Rewards, score and gate equal the HF module's own on every row, right and left padded;
    the reward is ``unembed.hook_out`` (the forward's own head output) at the pooled token."""
    model, hf = _bridge(arch, dtype)
    rows = HEADS[arch][1]
    refs = [_hf_reference(hf, model.encode(c).ids, rows) for c in CONVERSATIONS]
    ref = {key: torch.stack([r[key] for r in refs]) for key in refs[0]}
    tol = _tol(ref["reward"], dtype)
    for side in ("right", "left"):
        res = model.rewards(CONVERSATIONS, padding_side=side)
        assert res.rewards.dtype == torch.float32
        torch.testing.assert_close(res.rewards, ref["reward"], atol=tol, rtol=0)
        for key in ("score", "gating"):
            if key in ref:
                torch.testing.assert_close(getattr(res, key), ref[key], atol=tol, rtol=0)
    batch = model.build(CONVERSATIONS)
    _, cache = model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask)
    out = cache["unembed.hook_out"].float()
    at = torch.arange(len(CONVERSATIONS))
    read = model.pooled_outputs(batch.tokens, batch.attention_mask)[0]  # the same batch
    torch.testing.assert_close(out[at, batch.pooled], read, atol=0, rtol=0)
    assert (out[at, batch.pooled - 1] - ref["reward"]).abs().max() > tol  # the check can fail


@needs_hooked_transformer
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "bfloat16"])
@pytest.mark.parametrize("arch", sorted(HEADS))
def test_custom_head_rewards_equal_hooked(arch: str, dtype: torch.dtype) -> None:
    """The same weights loaded by HookedRewardModel: the same objectives, pooling rule,
    rewards, score and gate, right and left padded."""
    from tl_reward import HookedRewardModel

    k, rows = HEADS[arch]
    hf, tok = tiny_hf_reward_model(arch, num_labels=k)
    hooked = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu",
                                               dtype=dtype, lm_head_rows=rows)
    model = BridgeRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, dtype=dtype,
                                              lm_head_rows=rows)
    assert (model.objectives, model.pooling) == (hooked.objectives, hooked.pooling)
    assert type(model.reward_head) is type(hooked.reward_head)
    for side in ("right", "left"):
        got, ref = (m.rewards(CONVERSATIONS, padding_side=side) for m in (model, hooked))
        tol = _tol(ref.rewards, dtype)
        for key in ("rewards", "score", "gating"):
            if getattr(ref, key) is None:
                assert getattr(got, key) is None, key
            else:
                torch.testing.assert_close(getattr(got, key), getattr(ref, key), atol=tol,
                                           rtol=0)


def test_mlp_head_has_no_fixed_direction() -> None:
    """INF-ORM's head is HookedRewardModel's :class:`MLPRewardHead` on HF's own layers, its
    hooks fire in the bridge's forward, and ``W_U`` is NaN (as HookedRewardModel's)."""
    model, hf = _bridge("inform", torch.float32)
    head = model.unembed.original_component
    assert type(head).__name__ == "MLPRewardHead" and head.hidden is hf.score[0]
    seen = []
    head.hook_post.add_hook(lambda act, hook: seen.append(act.shape))
    model.rewards(CONVERSATIONS[:1])
    head.hook_post.remove_hooks()
    assert seen and seen[0][-1] == hf.config.hidden_size
    assert bool(model.folded_head[0].isnan().all())


def test_from_disk(tmp_path: Path) -> None:
    """By path: a causal LM with ``lm_head_rows`` and ArmoRM's custom code, as loaded models."""
    path = save_tiny_reward_model(tmp_path / "nemo", "nemotron")
    model = BridgeRewardModel.from_pretrained(str(path), lm_head_rows=[3])
    hf = tiny_hf_reward_model("nemotron")[0]
    ref = _hf_reference(hf, model.encode(CONVERSATIONS[0]).ids, [3])["reward"]
    torch.testing.assert_close(model.rewards(CONVERSATIONS[:1]).rewards[0], ref,
                               atol=parity_atol(ref, 3), rtol=0)
    path = save_tiny_reward_model(tmp_path / "armo", "armorm", num_labels=3)
    model = BridgeRewardModel.from_pretrained(str(path), trust_remote_code=True)
    hf = tiny_hf_reward_model("armorm", num_labels=3)[0]
    ref = _hf_reference(hf, model.encode(CONVERSATIONS[0]).ids, None)["score"]
    torch.testing.assert_close(model.rewards(CONVERSATIONS[:1]).score[0], ref,
                               atol=parity_atol(ref, 3), rtol=0)


def test_lm_head_rows_refusals() -> None:
    """A causal LM without ``lm_head_rows``, rows out of range, and a soft-capped LM head
    refuse by name."""
    hf, tok = tiny_hf_reward_model("nemotron")
    with pytest.raises(UnsupportedArchitectureError, match="pass lm_head_rows="):
        BridgeRewardModel.from_pretrained(hf_model=hf, tokenizer=tok)
    with pytest.raises(TLRewardError, match="lm_head_rows must be"):
        BridgeRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, lm_head_rows=[10**6])
    seq, tok = tiny_hf_reward_model("llama")
    with pytest.raises(UnsupportedArchitectureError, match="CausalLM"):
        BridgeRewardModel.from_pretrained(hf_model=seq, tokenizer=tok, lm_head_rows=[0])


@needs_hooked_transformer
@pytest.mark.parametrize("arch", sorted(HEADS))
def test_decompositions_equal_hooked(arch: str) -> None:
    """The lens, direct reward attribution, zero-ablated heads and attribution patching read
    the same custom head on both backends (ArmoRM's and QRM's prompt-dependent gate, the MLP
    head's local linearisation): float32, :func:`parity_atol` of each quantity."""
    from tests.model.test_bridge_analyses import _attribution_patching, _dra, _head_zero, _lens
    from tl_reward import HookedRewardModel

    k, rows = HEADS[arch]
    hf, tok = tiny_hf_reward_model(arch, num_labels=k)
    hooked = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu",
                                               lm_head_rows=rows)
    model = BridgeRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, lm_head_rows=rows)
    for fn in (_lens, _dra, _head_zero, _attribution_patching):
        want, got = fn(hooked), fn(model)
        for key, ref in want.items():
            torch.testing.assert_close(got[key], ref, rtol=0, equal_nan=True,
                                       msg=f"{arch} {fn.__name__}: {key}",
                                       atol=parity_atol(ref.nan_to_num(), 3))


# InternLM2's module names (attention.wqkv, feed_forward) are not the hand references' Llama
# names; its decompositions are checked against HookedRewardModel above
@pytest.mark.parametrize("arch", sorted(set(HEADS) - {"internlm2"}))
def test_decompositions_against_hf(arch: str) -> None:
    """On the bridge alone (both TransformerLens versions): the lens's last layer (both
    conventions) and DRA's total are the HF module's own objectives (the gate's score first),
    and zero-ablating each head is HF's forward with that head zeroed through a hook; float32,
    :func:`parity_atol`."""
    from tests.model.test_bridge_analyses import _check, _head_zero_alone
    from tl_reward.analysis.attribution import direct_reward_attribution
    from tl_reward.analysis.lens import reward_lens

    model, _ = _bridge(arch, torch.float32)
    k, rows = HEADS[arch]
    hf = tiny_hf_reward_model(arch, num_labels=k)[0]  # fresh: the bridge put its parts in its own
    lens = reward_lens(model, CONVERSATIONS)

    def values(ids: torch.Tensor) -> dict[str, torch.Tensor]:
        ref = _hf_reference(hf, ids[0].tolist(), rows)
        score = [ref["score"][None]] if "gating" in ref else []
        return dict(zip(lens.objectives, torch.cat([*score, ref["reward"]]), strict=True))

    ref = torch.stack([torch.stack(list(values(torch.tensor([model.encode(c).ids])).values()))
                       for c in CONVERSATIONS])
    for convention in ("frozen", "recompute"):
        _check(lens.values[convention][:, -1], ref, f"lens {convention}")
    _check(direct_reward_attribution(model, CONVERSATIONS).total(), ref, "DRA total")
    _head_zero_alone(model, hf, values=values)


def test_internlm2_reward_token_and_hooks(tmp_path: Path) -> None:
    """InternLM2 from disk with its custom code: every sequence ends in the reward token, the
    reward is read there (equal to the published-structure module's own forward), and the
    HookedTransformer hook names resolve with HookedRewardModel's shapes and values (float32,
    :func:`parity_atol`)."""
    from tests.helpers import hooked_transformer_missing
    from tests.model.test_bridge import HOOKS

    path = save_tiny_reward_model(tmp_path / "internlm2", "internlm2", seed=3)
    model = BridgeRewardModel.from_pretrained(str(path), trust_remote_code=True)
    hf = tiny_hf_reward_model("internlm2", seed=3)[0]
    reward_token = hf.config.reward_token_id
    assert model.suffix_ids == (reward_token,)
    for side in ("right", "left"):
        batch = model.build(CONVERSATIONS, padding_side=side)
        assert (batch.tokens[torch.arange(len(CONVERSATIONS)), batch.pooled]
                == reward_token).all()
    ref = torch.cat([_hf_reference(hf, model.encode(c).ids, None)["reward"]
                     for c in CONVERSATIONS])
    torch.testing.assert_close(model.rewards(CONVERSATIONS).values(0), ref,
                               atol=parity_atol(ref, 3), rtol=0)
    if hooked_transformer_missing() is not None:  # TransformerLens 4: no HookedRewardModel
        return
    from tl_reward import HookedRewardModel

    hooked = HookedRewardModel.from_pretrained(str(path), device="cpu", trust_remote_code=True)
    batch = model.build(CONVERSATIONS[:2])
    caches = [m.run_with_cache(batch.tokens, attention_mask=batch.attention_mask)[1]
              for m in (model, hooked)]
    real = batch.attention_mask.bool()  # pad positions: each backend's own convention
    for name in HOOKS:
        got, want = caches[0][name].float(), caches[1][name].float()
        assert got.shape == want.shape, name
        if name != "ln_final.hook_normalized":  # HookedTransformer folds the gain away
            torch.testing.assert_close(got[real], want[real], atol=parity_atol(want, 3),
                                       rtol=0, msg=name)
