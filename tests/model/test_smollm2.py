"""The real SmolLM2-135M backbone: parity with HF, and the demo RM by name."""

from __future__ import annotations

from functools import cache, partial
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import CONVERSATIONS, parity_atol

from tl_reward import HookedRewardModel

pytestmark = pytest.mark.slow


@cache
def smollm2_seq_cls() -> tuple[Any, Any, HookedRewardModel]:
    from transformers import AutoTokenizer, LlamaForSequenceClassification

    from tl_reward.model.demo import smollm2_local_dir

    path = smollm2_local_dir()
    torch.manual_seed(0)
    hf = LlamaForSequenceClassification.from_pretrained(path, num_labels=1, dtype=torch.float32)
    with torch.no_grad():
        hf.score.weight.normal_(0, 1.0)
    tok = AutoTokenizer.from_pretrained(path)
    hf.config.pad_token_id = tok.pad_token_id
    model = HookedRewardModel.from_pretrained(hf_model=hf.eval(), tokenizer=tok, device="cpu")
    return hf, tok, model


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_smollm2_matches_hf(padding_side: str) -> None:
    hf, _, model = smollm2_seq_cls()
    assert model.cfg.n_ctx == 8192 and model.cfg.n_key_value_heads == 3
    batch = model.make_batch(CONVERSATIONS, padding_side=padding_side)
    with torch.no_grad():
        ours = model(batch.tokens, attention_mask=batch.attention_mask, return_type="reward")[:, 0]
        if padding_side == "right":
            ref = hf(input_ids=batch.tokens, attention_mask=batch.attention_mask).logits[:, 0]
        else:  # HF ignores left padding in its positions: compare with unpadded runs
            ref = torch.stack([hf(input_ids=model.make_batch(c).tokens).logits[0, 0]
                               for c in CONVERSATIONS])
    assert ref.abs().max() > 0.1
    tol = parity_atol(ref, model.cfg.n_layers)  # ~3e-3 for rewards near 3.5 (see parity_atol)
    torch.testing.assert_close(ours, ref, atol=tol, rtol=0)
    # the tolerance still catches real bugs, by orders of magnitude: reading the reward one token
    # early, or a head that skips the final norm's gain (not folded into W_U)
    with torch.no_grad():
        per_pos, cache = model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask,
                                              names_filter="ln_final.hook_normalized")
    rows = torch.arange(len(CONVERSATIONS))
    pos = model.pool_positions(batch.tokens, batch.attention_mask)
    early = per_pos[rows, pos - 1, 0]
    unfolded = cache["ln_final.hook_normalized"][rows, pos] @ hf.score.weight[0]
    assert (early - ref).abs().max() > 100 * tol
    assert (unfolded - ref).abs().max() > 100 * tol


def test_demo_reward_model_by_name(demo_rm) -> None:
    from tl_reward.model.demo import HEAD_FILE, demo_hf_reward_model, load_demo_head

    if not HEAD_FILE.exists():
        pytest.skip("demo head not trained yet")
    model = demo_rm
    weight, _ = load_demo_head()
    assert weight.shape == (1, model.cfg.d_model)
    hf, _ = demo_hf_reward_model()
    batch = model.make_batch(CONVERSATIONS)
    with torch.no_grad():
        ref = hf(input_ids=batch.tokens, attention_mask=batch.attention_mask).logits[:, 0]
    res = model.rewards(CONVERSATIONS)
    torch.testing.assert_close(res.score, ref, atol=parity_atol(ref, model.cfg.n_layers), rtol=0)


def train_demo_head_script() -> Any:
    """``scripts/train_demo_head.py`` as a module."""
    import importlib.util
    import sys

    script = Path(__file__).resolve().parents[2] / "scripts" / "train_demo_head.py"
    spec = importlib.util.spec_from_file_location("train_demo_head", script)
    train = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, train)  # its dataclasses look their module up
    spec.loader.exec_module(train)
    return train


def test_demo_head_heldout_accuracy(hh_path, demo_rm) -> None:
    """The README's held-out accuracy, checked pair by pair. The training script's held-out
    rewards (``--heldout-scores``: its own features from HF's ``model.model``, and the packaged
    head) are the recorded split's pairs, in its order, of the same HH records, and give the
    recorded accuracy; the loaded demo RM reproduces 8 of them, drawn at random among those of
    at most 128 tokens, from their token ids (float32 parity). A wrong split, pooling or final
    norm fails it."""
    import json

    import numpy as np

    from tl_reward.data.hh_rlhf import load_hh_rlhf
    from tl_reward.model.demo import HEAD_FILE, load_demo_head

    train = train_demo_head_script()
    _, meta = load_demo_head()
    stored = json.loads(train.DEFAULT_HELDOUT.read_text())
    assert stored["head_file_sha256"] == train.file_sha256(HEAD_FILE)
    model = demo_rm
    data = load_hh_rlhf(hh_path)
    pairs, _ = train.tokenise_pairs(model.tokenizer, data, meta["max_tokens"])
    assert len(pairs) == meta["n_pairs_used"]
    _, held = train.heldout_split(len(pairs), meta["seed"])
    assert len(held) == meta["n_heldout"] and stored["rows"] == held.tolist()
    assert stored["record_index"] == [int(data[pairs[i].pair_index].meta["index"]) for i in held]
    chosen, rejected = np.array(stored["chosen"]), np.array(stored["rejected"])
    assert float((chosen > rejected).mean()) == pytest.approx(meta["heldout_accuracy"],
                                                            abs=0.5 / len(held))
    # 8 drawn at random among the pairs whose replies both fit in 128 tokens (the forward is
    # the cost; parity at full length is test_smollm2_matches_hf's)
    short = [i for i in range(len(held)) if max(len(pairs[held[i]].chosen_ids),
                                                len(pairs[held[i]].rejected_ids)) <= 128]
    assert len(short) >= 40
    pick = np.random.default_rng(0).choice(short, 8, replace=False)
    ids = [x for i in pick for x in (pairs[held[i]].chosen_ids, pairs[held[i]].rejected_ids)]
    ref = torch.tensor([v for i in pick for v in (chosen[i], rejected[i])])
    score = model.rewards(ids, batch_size=4).score.double()
    torch.testing.assert_close(score, ref, atol=parity_atol(ref, model.cfg.n_layers), rtol=0)


def test_extract_rows_matches_the_full_extraction(hh_path, tmp_path, monkeypatch) -> None:
    """``extract_rows`` extracts only the rows asked for, in that order, equal to the full
    extraction's rows up to float32 rounding (the padded batch shapes differ: 2e-6 of the
    largest feature on the 119 held-out pairs of the 700) and reads the full cache's rows bit
    for bit once it exists."""
    train = train_demo_head_script()
    monkeypatch.setattr(train, "cache_dir", lambda: tmp_path)
    loaded: list[Any] = []  # both runs read the one backbone (a GGUF load is seconds)
    load = train.load_smollm2

    def load_once(dtype: torch.dtype) -> Any:
        if not loaded:
            loaded.append(load(dtype))
        return loaded[0]

    torch.set_num_threads(1)
    # 128 tokens: 4 of the 5 pairs fit once their earliest exchanges are trimmed, 1 is skipped
    args = train.parse_args(["--data", str(hh_path), "--limit", "5", "--max-tokens", "128"])
    monkeypatch.setattr(train, "load_smollm2", load_once)
    # the script's own HF parity check on one pair, not three (each pair is 4 forwards)
    monkeypatch.setattr(train, "hf_parity_check", partial(train.hf_parity_check, n=1))
    rows = [3, 0, 2]
    alone = train.extract_rows(args, rows)
    assert alone["source"] == "extracted rows" and alone["rows"].tolist() == rows
    full = train.extract_or_load(args)
    assert alone["n_pairs_used"] == len(full["chosen"]) >= 4
    sel = torch.tensor(rows)
    for key in ("chosen", "rejected"):
        scale = float(full[key].abs().max())
        assert scale > 1.0
        torch.testing.assert_close(alone[key], full[key][sel], atol=1e-5 * scale, rtol=0)
        assert (alone[key] - full[key][sel.flip(0)]).abs().max() > 0.1  # order matters
    assert alone["record_index"].tolist() == full["record_index"][sel].tolist()
    cached = train.extract_rows(args, rows)
    assert cached["source"].endswith(".pt") and torch.equal(cached["chosen"], full["chosen"][sel])


@pytest.mark.parametrize("name", ["tl-reward/smollm2-135m-hh", "tl-reward/smollm2-135m-multi"])
def test_bridge_loads_the_demo_rms_by_name(name: str, demo_rm, monkeypatch) -> None:
    """``BridgeRewardModel.from_pretrained`` resolves the built-in names as HookedRewardModel
    does (offline: it asked the hub for a minute, then raised a raw OSError): the same
    objectives and rewards (float32, :func:`parity_atol`), and no hub call (any raises)."""
    import transformers.utils.hub as hub

    from tl_reward.model.bridge_reward_model import BridgeRewardModel
    from tl_reward.model.demo import DEMO_MODEL_NAME, MULTI_MODEL_NAME

    assert name in (DEMO_MODEL_NAME, MULTI_MODEL_NAME)

    def no_hub(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"hub access: {args}")

    monkeypatch.setattr(hub, "hf_hub_download", no_hub)
    monkeypatch.setattr(hub, "snapshot_download", no_hub)
    bridge = BridgeRewardModel.from_pretrained(name)
    monkeypatch.undo()
    hooked = demo_rm if name == DEMO_MODEL_NAME else HookedRewardModel.from_pretrained(
        name, device="cpu")
    assert bridge.objectives == hooked.objectives and bridge.cfg.model_name == name
    ref = hooked.rewards(CONVERSATIONS).rewards
    assert float(ref.abs().max()) > 0.1
    torch.testing.assert_close(bridge.rewards(CONVERSATIONS).rewards, ref, rtol=0,
                               atol=parity_atol(ref, hooked.cfg.n_layers))
