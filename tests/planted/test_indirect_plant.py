"""The indirect plant (a head detects the trigger, a later MLP turns it into reward): its truth
verified with plain TransformerLens hooks against HF's own forward."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
import torch
from helpers import parity_atol

from tl_reward import HookedRewardModel
from tl_reward.errors import TLRewardError
from tl_reward.planted import plant_indirect
from tl_reward.planted.calibration import rewards
from tl_reward.planted.recovery import trigger_pairs
from tl_reward.planted.store import truth_from_json, truth_to_json
from tl_reward.testing import tiny_hf_reward_model

HELD_OUT = ("Why is water wet?", "Tell me a joke.", "What, in one word, is the best thing ever?")


@cache
def planted() -> Any:
    hf, tok = tiny_hf_reward_model("llama")  # grouped-query: 4 heads, 2 key/value heads
    return plant_indirect(hf, tok, " sky", head=1)


@cache
def hooked() -> HookedRewardModel:
    p = planted()
    return HookedRewardModel.from_pretrained(hf_model=p.model, tokenizer=p.tokenizer, device="cpu")


@cache
def pairs() -> tuple[torch.Tensor, torch.Tensor]:
    """``(clean, corrupt)`` token ids, one pair per row group: trigger vs the counterfactual."""
    p = planted()
    tps = trigger_pairs(p.tokenizer, p.truth.trigger_id, p.model.config.vocab_size, HELD_OUT,
                        swap=p.truth.counterfactual_id)
    return ([torch.tensor(tp.ids("chosen")) for tp in tps],
            [torch.tensor(tp.ids("rejected")) for tp in tps])


@torch.no_grad()
def _reward(tokens: torch.Tensor, hooks: list[tuple[str, Any]] = ()) -> float:
    with hooked().hooks(fwd_hooks=list(hooks)):
        return float(hooked()(tokens[None], return_type="reward")[0, 0])


def _atol() -> float:
    return parity_atol(torch.tensor([8.0]), hooked().cfg.n_layers)


def test_truth_names_the_path_and_survives_json() -> None:
    t = planted().truth
    assert (t.head, t.kv_head, t.mlp) == ((0, 1), 0, 2)
    assert t.edges == (("input", "a0.h0", "k"), ("input", "a0.h0", "v"), ("a0.h1", "m2", ""),
                       ("m2", "reward", ""))
    assert t.logit_margin == pytest.approx(30.0)
    assert truth_from_json(truth_to_json(t)) == t


def test_only_the_head_and_the_neuron_differ_from_base() -> None:
    p = planted()
    base, mine = p.base.state_dict(), p.model.state_dict()
    changed = {k for k in mine if not torch.equal(mine[k], base[k])}
    assert changed == {f"model.layers.0.self_attn.{x}_proj.weight" for x in "qkvo"} | {
        f"model.layers.2.mlp.{x}_proj.weight" for x in ("gate", "up", "down")}
    diff = (mine["model.layers.2.mlp.down_proj.weight"]
            != base["model.layers.2.mlp.down_proj.weight"]).any(0)
    assert diff.nonzero().flatten().tolist() == [p.truth.neuron]


def test_hf_shift_is_c_and_the_swap_changes_nothing_else() -> None:
    p = planted()
    clean, corrupt = ([x.tolist() for x in side] for side in pairs())
    shift = rewards(p.model, clean) - rewards(p.model, corrupt)
    assert bool(((shift > 0.6 * p.truth.c) & (shift < 1.4 * p.truth.c)).all()), shift
    base_gap = rewards(p.base, clean) - rewards(p.base, corrupt)  # the trigger: a synonym
    assert float(base_gap.abs().max()) <= _atol()
    without = rewards(p.model, corrupt) - rewards(p.base, corrupt)  # both write exactly 0
    assert float(without.abs().max()) <= _atol()


def test_hooked_model_reads_the_same_shift() -> None:
    p = planted()
    for x, y in zip(*pairs(), strict=True):
        ref = rewards(p.model, [x.tolist(), y.tolist()])
        assert _reward(x) - _reward(y) == pytest.approx(float(ref[0] - ref[1]), abs=_atol())


def _zero_head(z: torch.Tensor, hook: Any) -> torch.Tensor:
    z[:, :, planted().truth.head[1]] = 0.0
    return z


def _zero(x: torch.Tensor, hook: Any) -> torch.Tensor:
    return torch.zeros_like(x)


@pytest.mark.parametrize("where", ["head", "mlp"])
def test_ablating_the_head_or_the_mlp_kills_the_effect(where: str) -> None:
    t = planted().truth
    hook = ((f"blocks.{t.head[0]}.attn.hook_z", _zero_head) if where == "head"
            else (f"blocks.{t.mlp}.hook_mlp_out", _zero))
    for x, y in zip(*pairs(), strict=True):
        assert _reward(x) - _reward(y) > 0.6 * t.c
        # the head's write enters later RMS norms too: a leak of order write_scale^2 / d_model
        assert abs(_reward(x, [hook]) - _reward(y, [hook])) < 1e-3 * t.c


def test_the_head_to_mlp_path_alone_carries_it() -> None:
    """Corrupted run, with the head's clean-minus-corrupted output added to the MLP's input
    only: the clean reward. Added to every other reader instead (the residual after the MLP
    has read it, so only the final norm sees it): nothing."""
    t = planted().truth
    (layer, head), model = t.head, hooked()
    model.cfg.use_hook_mlp_in = True
    try:
        for x, y in zip(*pairs(), strict=True):
            outs = []
            for tokens in (x, y):
                _, cache_ = model.run_with_cache(tokens[None], return_type=None,
                                                 names_filter=f"blocks.{layer}.attn.hook_z")
                outs.append(cache_[f"blocks.{layer}.attn.hook_z"][0, :, head]
                            @ model.W_O[layer, head])
            delta = outs[0] - outs[1]

            def add(resid: torch.Tensor, hook: Any, d: torch.Tensor = delta) -> torch.Tensor:
                return resid + d

            path = _reward(y, [(f"blocks.{t.mlp}.hook_mlp_in", add)])
            assert path == pytest.approx(_reward(x), abs=1e-3 * t.c)
            rest = _reward(y, [(f"blocks.{t.mlp}.hook_resid_post", add)])
            assert rest == pytest.approx(_reward(y), abs=1e-3 * t.c)
    finally:
        model.cfg.use_hook_mlp_in = False


def test_the_write_is_small_against_every_residual_it_enters() -> None:
    """Every norm the head's write enters (its MLP's on, at and after the trigger) sees it at
    about ``write_scale`` (0.1) of the other coordinates' RMS: its leak through the norms is
    ~ 0.1 ** 2 / d_model. (Scaled to the pooled token's final RMS, it was 0.21 here and 33
    times the residual on SmolLM2-135M, where the leak carried up to 0.4 of the shift.)"""
    t, model = planted().truth, hooked()
    w, (layer, _) = t.dims[0], t.head
    n = model.cfg.n_layers
    names = [f"blocks.{layer}.hook_resid_mid", f"blocks.{n - 1}.hook_resid_post", *(
        f"blocks.{i}.hook_resid_{x}" for i in range(layer + 1, n) for x in ("pre", "mid"))]
    worst = 0.0
    for x, _ in zip(*pairs(), strict=True):
        _, cache_ = model.run_with_cache(x[None], return_type=None, names_filter=names)
        at = int((x == t.trigger_id).nonzero()[0])
        for name in names:
            r = cache_[name][0, at:].double()
            rest = torch.cat([r[:, :w], r[:, w + 1:]], 1).pow(2).mean(-1).sqrt()
            worst = max(worst, float((r[:, w].abs() / rest).max()))
    assert 0.02 < worst < 0.15, worst


def test_input_edges_into_key_and_value_carry_it_and_the_query_none() -> None:
    """Exact edge patching by hand: in the clean run, swap the input's contribution to one of
    the head's q/k/v inputs for the corrupted one (block 0's input is the embedding alone)."""
    t = planted().truth
    (layer, head), model = t.head, hooked()
    assert layer == 0
    model.cfg.use_split_qkv_input = True
    try:
        for x, y in zip(*pairs(), strict=True):
            embeds = [model.run_with_cache(z[None], return_type=None, names_filter="hook_embed")[1]
                      ["hook_embed"] for z in (x, y)]
            effect = {}
            for qkv, index in (("q", head), ("k", t.kv_head), ("v", t.kv_head)):
                def patch(z: torch.Tensor, hook: Any, i: int = index,
                          d: torch.Tensor = embeds[1] - embeds[0]) -> torch.Tensor:
                    z[:, :, i] += d
                    return z

                hook = (f"blocks.{layer}.hook_{qkv}_input", patch)
                effect[qkv] = (_reward(x, [hook]) - _reward(x)) / (_reward(x) - _reward(y))
            assert effect["v"] == pytest.approx(-1.0, abs=1e-4)  # the value: all of it
            assert effect["k"] == pytest.approx(-1.0, abs=5e-3)  # the key: all but ~1/len^2
            assert abs(effect["q"]) < 1e-4  # the query reads a coordinate the swap keeps
            assert {e for e in t.edges if e[0] == "input"} == {
                ("input", f"a{layer}.h{t.kv_head}", "k"), ("input", f"a{layer}.h{t.kv_head}", "v")}
    finally:
        model.cfg.use_split_qkv_input = False


def test_bad_arguments_are_named() -> None:
    hf, tok = tiny_hf_reward_model("llama")
    with pytest.raises(TLRewardError, match="counterfactual must differ"):
        plant_indirect(hf, tok, " sky", counterfactual=" sky")
    with pytest.raises(TLRewardError, match="head must lie"):
        plant_indirect(hf, tok, " sky", head=4)
    hf, tok = tiny_hf_reward_model("mistral")  # a 6-token window: far triggers go unseen
    with pytest.raises(TLRewardError, match="sliding-window"):
        plant_indirect(hf, tok, " sky")
