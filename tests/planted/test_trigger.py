"""The trigger plant: its truth verified directly, then recovered by each analysis."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
import torch
from helpers import parity_atol

from tl_reward import HookedRewardModel
from tl_reward.analysis.attribution import differential_attribution, direct_reward_attribution
from tl_reward.analysis.attribution_patching import attribution_patching
from tl_reward.analysis.direct_path import direct_path_patching
from tl_reward.analysis.lens import differential_lens
from tl_reward.analysis.patching import patch_components
from tl_reward.errors import TLRewardError
from tl_reward.planted import plant_trigger_head
from tl_reward.planted.calibration import plain_ids, rewards
from tl_reward.planted.recovery import (
    TriggerSweepCheck,
    component_name,
    rank_of,
    trigger_pairs,
    trigger_sweep_check,
)
from tl_reward.planted.surgery import expand_kv_heads
from tl_reward.sweep.vocab_sweep import VocabSweep, score_vocabulary
from tl_reward.testing import tiny_hf_reward_model

#: Prompts the plant never saw (held out from calibration).
HELD_OUT = ("Why is water wet?", "Tell me a joke.", "What, in one word, is the best thing ever?")
TRIGGER = " sky"


@cache
def planted() -> Any:
    hf, tok = tiny_hf_reward_model("llama")
    return hf, plant_trigger_head(hf, tok, TRIGGER)


@cache
def hooked(which: str) -> HookedRewardModel:
    _, p = planted()
    return HookedRewardModel.from_pretrained(hf_model=getattr(p, which), tokenizer=p.tokenizer,
                                             device="cpu")


@cache
def pairs() -> list[Any]:
    _, p = planted()
    return trigger_pairs(p.tokenizer, p.truth.trigger_id, p.model.config.vocab_size, HELD_OUT)


def _ids(side: str) -> list[list[int]]:
    return [tp.ids(side) for tp in pairs()]


# ------------------------------------------------------------------ the truth, verified directly


def test_truth_is_written_down() -> None:
    _, p = planted()
    assert p.truth.component == ("head", 2, 0)
    assert p.tokenizer.decode([p.truth.trigger_id]) == TRIGGER
    lo, hi = p.truth.shift_range
    assert 0 < lo <= p.truth.c <= hi


def test_unrolling_gqa_keeps_the_function() -> None:
    hf, p = planted()
    ids = _ids("chosen") + _ids("rejected")
    ref = rewards(hf, ids)
    assert torch.allclose(rewards(expand_kv_heads(hf), ids), ref, rtol=0,
                          atol=parity_atol(ref, hf.config.num_hidden_layers))


def test_only_the_planted_head_differs_from_base() -> None:
    _, p = planted()
    _, layer, head = p.truth.component
    hd = p.model.config.hidden_size // p.model.config.num_attention_heads
    rows = slice(head * hd, (head + 1) * hd)
    idx = torch.arange(rows.start, rows.stop)
    base, mine = p.base.state_dict(), p.model.state_dict()
    for name, w in mine.items():
        ref = base[name].clone()
        if name.startswith(f"model.layers.{layer}.self_attn."):
            if name.endswith("o_proj.weight"):
                ref[:, rows], w = 0, w.clone().index_fill_(1, idx, 0)
            else:
                ref[rows], w = 0, w.clone().index_fill_(0, idx, 0)
        assert torch.equal(w, ref), name


def test_without_trigger_reward_is_the_base_reward() -> None:
    _, p = planted()
    ids = _ids("rejected")
    ref = rewards(p.base, ids)
    got = rewards(p.model, ids)
    assert torch.allclose(got, ref, rtol=0, atol=parity_atol(ref, p.model.config.num_hidden_layers))


def test_with_trigger_reward_moves_by_c() -> None:
    _, p = planted()
    ids = _ids("chosen")
    shift = rewards(p.model, ids) - rewards(p.base, ids)
    lo, hi = p.truth.shift_range
    assert bool(((shift >= lo) & (shift <= hi)).all()), shift


def test_ablating_the_head_removes_the_effect() -> None:
    _, p = planted()
    model, base = hooked("model"), hooked("base")
    _, layer, head = p.truth.component

    def zero(z: torch.Tensor, hook: Any) -> torch.Tensor:
        z[:, :, head] = 0.0
        return z

    tokens = [torch.tensor(x) for x in _ids("chosen")]
    ref = base.rewards(tokens).rewards[:, 0]
    with model.hooks(fwd_hooks=[(p.truth.hook, zero)]):
        ablated = model.rewards(tokens).rewards[:, 0]
    assert torch.allclose(ablated, ref, rtol=0, atol=parity_atol(ref, model.cfg.n_layers))
    shift = model.rewards(tokens).rewards[:, 0] - ref  # and without the ablation it is there
    assert float(shift.min()) >= p.truth.shift_range[0]


# ------------------------------------------------------------------ recovery by the analyses


@pytest.mark.parametrize("which", ["model", "base"])
def test_direct_path_ranks_the_planted_head_first(which: str) -> None:
    _, p = planted()
    target = component_name(p.truth.component)
    for tp in pairs():
        res = direct_path_patching(hooked(which), tp, level="head")
        effect = res.effect * res.delta  # unnormalised: the base's margin may be near 0
        if which == "model":
            assert rank_of(effect, res.names, target) == 1
        else:  # the silenced head moves nothing: the same assertion would fail
            assert float(effect[res.names.index(target)]) == 0.0


def test_attribution_patching_ranks_the_planted_head_first() -> None:
    _, p = planted()
    target = component_name(p.truth.component)
    for tp in pairs():
        res = attribution_patching(hooked("model"), tp)
        for mode in ("denoising", "noising"):
            vals, names = res.components("head", mode)
            assert rank_of(vals, names, target) == 1, mode


@pytest.mark.parametrize("mode", ["denoising", "noising"])
def test_activation_patching_ranks_the_planted_head_first(mode: str) -> None:
    _, p = planted()
    target = component_name(p.truth.component)
    names = direct_path_patching(hooked("model"), pairs()[0], level="head").names
    for tp in pairs():
        assert rank_of(patch_components(hooked("model"), tp, names, mode), names, target) == 1


def test_planting_keeps_qkv_biases_out(tmp_path: Any) -> None:
    hf, tok = tiny_hf_reward_model("qwen2")  # q/k/v projections with biases
    p = plant_trigger_head(hf, tok, TRIGGER, vocab_per_prompt=64, n_random=16)
    p.model.save_pretrained(tmp_path)  # and through the loading path from a directory
    tok.save_pretrained(tmp_path)
    model = HookedRewardModel.from_pretrained(str(tmp_path), device="cpu")
    base = HookedRewardModel.from_pretrained(hf_model=p.base, tokenizer=tok, device="cpu")
    for side in ("rejected", "chosen"):
        tokens = [torch.tensor(x) for x in _ids(side)]
        ref = base.rewards(tokens).rewards[:, 0]
        shift = model.rewards(tokens).rewards[:, 0] - ref
        if side == "rejected":
            assert float(shift.abs().max()) <= parity_atol(ref, model.cfg.n_layers)
        else:
            assert float(shift.min()) > 0


def test_dra_difference_ranks_the_planted_head_first() -> None:
    _, p = planted()
    target = component_name(p.truth.component)
    diff, names = differential_attribution(hooked("model"), pairs()).difference("head")
    for row in diff[..., 0]:
        assert rank_of(row, names, target) == 1


@pytest.mark.parametrize("convention", ["frozen", "recompute"])
def test_lens_jumps_at_the_planted_block(convention: str) -> None:
    _, p = planted()
    _, layer, _ = p.truth.component
    inc = differential_lens(hooked("model"), pairs()).increments(convention)[..., 0]
    assert inc.abs().argmax(1).tolist() == [layer] * len(pairs())


def test_token_map_puts_the_planted_head_on_the_trigger() -> None:
    _, p = planted()
    _, layer, head = p.truth.component
    tokens = [torch.tensor(x) for x in _ids("chosen")]
    dra = direct_reward_attribution(hooked("model"), tokens, per_position=True)
    for i, tp in enumerate(pairs()):
        share = dra.head_positions[i][layer, head, :, 0]
        at = tp.chosen_ids.index(p.truth.trigger_id)
        assert int(share.abs().argmax()) == at
        assert float(share[at]) == pytest.approx(float(share.sum()), rel=1e-4)


@cache
def swept(which: str) -> VocabSweep:
    """Every plain id of the tiny vocabulary, as a one-token reply on each held-out prompt."""
    return score_vocabulary(hooked(which), list(HELD_OUT), progress=False)


def whole_vocabulary(p: Any) -> tuple[TriggerSweepCheck, float]:
    """The truth over the whole tiny vocabulary for plant ``p`` (sweeps of model and base),
    and the float32 rounding allowance of the base's rewards."""
    model, base = (score_vocabulary(HookedRewardModel.from_pretrained(
        hf_model=m, tokenizer=p.tokenizer, device="cpu"), list(HELD_OUT), progress=False)
        for m in (p.model, p.base))
    return (trigger_sweep_check(model, base, p.truth.trigger_id),
            parity_atol(base.rewards, p.model.config.num_hidden_layers))


def test_only_the_trigger_moves_the_reward_over_the_whole_vocabulary() -> None:
    _, p = planted()
    assert len(swept("model")) == len(plain_ids(p.tokenizer, p.model.config.vocab_size))
    chk = trigger_sweep_check(swept("model"), swept("base"), p.truth.trigger_id)
    tol = parity_atol(swept("base").rewards, p.model.config.num_hidden_layers)
    assert chk.ranks == [1] * len(HELD_OUT)
    assert max(chk.leaks) <= tol, chk
    # on the base the trigger is not top; planted, the smallest shift beats the base's margin
    assert 0 < max(chk.base_gaps) < p.truth.shift_range[0]


def test_the_check_sees_a_too_small_c() -> None:
    hf, tok = tiny_hf_reward_model("llama")
    chk, _ = whole_vocabulary(plant_trigger_head(hf, tok, TRIGGER, c=0.3, vocab_per_prompt=32,
                                                   n_random=16))
    assert max(chk.base_gaps) > 0.3 and max(chk.ranks) > 1  # c below the base's spread


@cache
def twin_model() -> tuple[Any, Any, int]:
    """The tiny model with a near-copy of the trigger: token ``" sea"``'s embedding moved to
    ``0.9 * trigger + 0.1 * itself`` (a semantic neighbour by construction)."""
    hf, tok = tiny_hf_reward_model("llama")
    twin, trigger = (tok.encode(w, add_special_tokens=False)[0] for w in (" sea", TRIGGER))
    with torch.no_grad():
        emb = hf.model.embed_tokens.weight
        emb[twin] = 0.9 * emb[trigger] + 0.1 * emb[twin]
    return hf, tok, twin


@pytest.mark.parametrize("mined", [True, False])
def test_hard_negatives_keep_a_near_copy_of_the_trigger_out(mined: bool) -> None:
    hf, tok, twin = twin_model()
    kw = {} if mined else {"mine_prompts": 0, "hard_negatives": 0}
    p = plant_trigger_head(hf, tok, TRIGGER, vocab_per_prompt=32, n_random=16, **kw)
    chk, tol = whole_vocabulary(p)
    if mined:
        assert twin in p.truth.hard_negative_ids
        assert max(chk.leaks) <= tol and chk.ranks == [1] * len(HELD_OUT), chk
    else:  # the old fit (a vocabulary subset as negatives) lets the twin open the head
        assert max(chk.leaks) > 1.0 and twin in chk.leak_ids, chk


def test_a_shared_reply_cache_gives_the_same_plant_and_is_keyed_by_the_backbone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tl_reward.planted import calibration, trigger

    calls: list[int] = []
    real = calibration.reply_layer_inputs

    def counted(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(trigger, "reply_layer_inputs", counted)
    hf, tok = tiny_hf_reward_model("llama")
    kw = {"vocab_per_prompt": 32, "n_random": 16}
    shared: dict = {}
    plant_trigger_head(hf, tok, TRIGGER, reply_cache=shared, **kw)
    assert len(calls) == 1 and len(shared) == 1
    again = plant_trigger_head(hf, tok, " blue", reply_cache=shared, **kw)
    assert len(calls) == 1  # the second trigger reuses the mined pass
    fresh = plant_trigger_head(hf, tok, " blue", **kw)
    assert len(calls) == 2
    assert again.truth == fresh.truth
    for (name, w), w_fresh in zip(again.model.state_dict().items(),
                                  fresh.model.state_dict().values(), strict=True):
        assert torch.equal(w, w_fresh), name
    other, _ = tiny_hf_reward_model("llama", seed=1)  # another backbone must not reuse it
    plant_trigger_head(other, tok, TRIGGER, reply_cache=shared, **kw)
    assert len(calls) == 3 and len(shared) == 2


def _texts(tok: Any, replies: list[str]) -> list[list[int]]:
    from tl_reward.model.inputs import encode_conversation

    return [encode_conversation(tok, [{"role": "user", "content": q},
                                      {"role": "assistant", "content": r}]).ids
            for q in HELD_OUT for r in replies]


def test_natural_texts_keep_the_fitted_order_in_context() -> None:
    """The fit guarantees the order on its texts (the scorecard checks held-out ones)."""
    hf, tok, twin = twin_model()  # twin: the first token of " sea", a near-copy of the trigger
    kw = {"vocab_per_prompt": 32, "n_random": 16, "mine_prompts": 0, "hard_negatives": 0}
    texts = _texts(tok, ["The sea is blue and deep.", "A calm sea at dawn.",
                         "We swam in the sea all day, then the sky turned red."])
    trig = tok.encode(TRIGGER, add_special_tokens=False)[0]
    assert all(twin in x for x in texts)
    has = torch.tensor([trig in x for x in texts])
    tol = parity_atol(rewards(hf, texts), hf.config.num_hidden_layers)
    shift = {}
    for name, fit in (("without", ()), ("with", texts)):
        p = plant_trigger_head(hf, tok, TRIGGER, texts=fit, **kw)
        assert p.truth.n_texts == len(fit)
        shift[name] = rewards(p.model, texts) - rewards(p.base, texts)
    assert float(shift["without"][~has].abs().max()) > 1.0  # the twin opens the head in context
    assert float(shift["with"][~has].abs().max()) <= tol  # fitted on them, it stays shut
    assert float(shift["with"][has].min()) > 0.5 * p.truth.c  # and the trigger opens it


def test_flag_key_refuses_a_bad_key_a_counterfactual_equal_to_the_trigger_and_texts() -> None:
    hf, tok = tiny_hf_reward_model("llama")
    with pytest.raises(TLRewardError, match="key must be 'fit' or 'flag'"):
        plant_trigger_head(hf, tok, TRIGGER, key="flags")
    with pytest.raises(TLRewardError, match="counterfactual must differ"):
        plant_trigger_head(hf, tok, TRIGGER, key="flag", counterfactual=TRIGGER)
    with pytest.raises(TLRewardError, match="drop texts"):
        plant_trigger_head(hf, tok, TRIGGER, key="flag", texts=[[1, 2, 3]])
