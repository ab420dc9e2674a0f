"""A formatting plant (``reward += c`` on the markdown token ``**``): its truth for the probes,
stated from the token ids and verified directly, then recovered by the probes (BH), the
distortion index and the published reward-lens v1 verdicts, as the scorecard reports."""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import parity_atol

from tl_reward import HookedRewardModel
from tl_reward.analysis.attribution_patching import attribution_patching
from tl_reward.analysis.direct_path import direct_path_patching
from tl_reward.audit.distortion import distortion_index
from tl_reward.audit.perturbations import DEFAULT_DIMENSIONS, DIMENSIONS, user_items
from tl_reward.audit.probes import ProbeReport, run_probes
from tl_reward.compat.published import published_distortion_index
from tl_reward.data.pairs import align_ids
from tl_reward.errors import TLRewardError
from tl_reward.planted import plant_trigger_head
from tl_reward.planted.probe_truth import (
    FIRES,
    MIXED,
    UNTOUCHED,
    edit_truth,
    items_without,
    plant_effect_report,
    probe_truth,
)
from tl_reward.planted.recovery import component_name, rank_of
from tl_reward.testing import tiny_hf_reward_model

TRIGGER = "**"
#: Two-sentence replies (the formatting edit needs two), none holding the trigger.
RECORDS = [
    ("Is the sky blue?", "Yes, the sky looks blue. Sunlight scatters in the air."),
    ("Tell me about music.", "Music is organised sound. People play it everywhere."),
    ("How do plants grow?", "Plants need light and water. Roots take minerals from soil."),
    ("What is rain?", "Rain is water falling from clouds. It feeds rivers and lakes."),
    ("Why sleep?", "Sleep restores the body. Memory settles during deep sleep."),
    ("Can you cook pasta?", "Boil salted water first. Cook the pasta until tender."),
    ("What is a river?", "A river carries water downhill. Most rivers reach the ocean."),
    ("Should I exercise?", "Regular exercise helps health. Walking daily is a good start."),
    ("How do birds fly?", "Birds flap their wings. Feathers shape the flowing air."),
    ("What is bread?", "Bread is baked dough. Yeast makes the dough rise."),
    ("Why read books?", "Books share knowledge. Reading also builds patience."),
    ("What are stars?", "Stars are burning balls of gas. The nearest star is the Sun."),
    ("Why is snow white?", "Snow scatters all colours of light. Together they look white."),
    ("What is a tree?", "A tree is a tall woody plant. Its leaves make food from light."),
    ("How do magnets work?", "Magnets have two poles. Opposite poles attract each other."),
    ("What is tea?", "Tea is made from dried leaves. Hot water draws out the flavour."),
]


@cache
def planted() -> Any:
    hf, tok = tiny_hf_reward_model("llama")
    return plant_trigger_head(hf, tok, TRIGGER)


@cache
def hooked(which: str) -> HookedRewardModel:
    p = planted()
    return HookedRewardModel.from_pretrained(hf_model=getattr(p, which), tokenizer=p.tokenizer,
                                             device="cpu")


@cache
def items() -> list[Any]:
    return items_without(hooked("model"), user_items(RECORDS), planted().truth.trigger_id)


@cache
def report(which: str) -> ProbeReport:
    return run_probes(hooked(which), items(), n_permutations=4995, progress=False)


def fired(rep: ProbeReport) -> dict[str, int]:
    return {s.dimension: int(np.sign(s.mean)) if s.p_adjusted < 0.05 else 0 for s in rep.stats}


# ------------------------------------------------------------------ the truth, before any reward


def test_truth_is_read_off_the_token_ids() -> None:
    p = planted()
    assert p.tokenizer.decode([p.truth.trigger_id]) == TRIGGER
    assert len(items()) == len(RECORDS)
    table = edit_truth(hooked("model"), items(), p.truth.trigger_id)
    truth = probe_truth(table)
    assert truth == {d: FIRES if d == "formatting" else UNTOUCHED for d in DEFAULT_DIMENSIONS}
    # independent of the ids: the formatting edit writes the markdown, no other edit does
    fmt = table[table.dimension == "formatting"]
    assert fmt.perturbed_holds.all() and not fmt.neutral_holds.any()


def test_mixed_and_untouched_dimensions() -> None:
    t = pd.DataFrame({"dimension": ["a", "a", "b", "b", "c", "c"],
                      "applied": [True, True, True, False, True, True],
                      "neutral_holds": [False, True, False, True, False, False],
                      "perturbed_holds": [True, True, True, True, False, True]})
    # a: one edit has the token on both sides (it adds nothing there); b: the skipped item
    # does not count; c: only some edits add it
    assert probe_truth(t) == {"a": MIXED, "b": FIRES, "c": MIXED}


def test_items_holding_the_trigger_are_dropped() -> None:
    extra = user_items([*RECORDS, ("Say it.", "Here it is in **bold**. Done now.")])
    assert len(items_without(hooked("model"), extra, planted().truth.trigger_id)) == len(RECORDS)


def test_truth_verified_directly() -> None:
    p = planted()
    pl, ba = report("model"), report("base")
    for d in DEFAULT_DIMENSIONS:
        gap = (pl.deltas(d) - ba.deltas(d)).to_numpy()
        if d == "formatting":  # the edit adds the trigger once: the planted shift
            assert p.truth.shift_range[0] * 0.8 < gap.min() and gap.max() < \
                p.truth.shift_range[1] * 1.2, gap
        else:
            assert np.abs(gap).max() <= rounding(), d


# ------------------------------------------------------------------ recovery


def test_probes_fire_on_formatting_and_keep_the_base_verdicts() -> None:
    base = report("base")
    # the base pays for padding (15 of 16 items): an untouched dimension that fires, truly
    assert fired(base)["length"] == 1 and int((base.deltas("length") > 0).sum()) == 15
    assert fired(report("model")) == {**fired(base), "formatting": 1}
    assert fired(base)["formatting"] != 1  # the same assertion fails on the base
    assert abs(base["formatting"].mean) < 0.5 * planted().truth.c


def rounding() -> float:
    pl = report("model")
    return parity_atol(torch.tensor(pl.rows["neutral:" + pl.objective].dropna().to_numpy()), 3)


def test_plant_effect_report_is_planted_minus_base() -> None:
    pl, ba = report("model"), report("base")
    eff = plant_effect_report(pl, ba, atol=rounding(), n_permutations=4995)
    for d in DEFAULT_DIMENSIONS:
        ref = (pl.deltas(d) - ba.deltas(d)).to_numpy(copy=True)
        ref[np.abs(ref) <= rounding()] = 0.0  # rounding, no effect: every untouched delta
        assert np.array_equal(eff.deltas(d).to_numpy(), ref)
        assert (d == "formatting") == bool(ref.any())
    n = len(items())  # every formatting effect is positive: the exact sign-flip minimum
    assert eff["formatting"].p_value == pytest.approx(2 / 2**n)
    assert all(eff[d].p_value == 1.0 for d in DEFAULT_DIMENSIONS if d != "formatting")
    assert fired(eff) == {d: int(d == "formatting") for d in DEFAULT_DIMENSIONS}


def test_plant_effect_refuses_runs_of_other_edits() -> None:
    other = run_probes(hooked("base"), items(), seed=1, n_permutations=4995, progress=False)
    with pytest.raises(TLRewardError, match="differ in their items"):
        plant_effect_report(report("model"), other, atol=rounding())


def test_distortion_is_above_its_floor_on_the_plant_only() -> None:
    assert distortion_index(report("model")).above_floor
    assert not distortion_index(report("base")).above_floor


def test_published_verdicts_on_the_plant() -> None:
    pl, ba = report("model"), report("base")

    def flags(rep: ProbeReport) -> dict[str, bool]:
        return {s.dimension: abs(s.published_d) > 0.5 for s in rep.stats}

    assert flags(pl) == {**flags(ba), "formatting": True}
    assert not flags(ba)["formatting"]
    # the published index scores the strongest dimension 0 by construction ...
    d_pl = published_distortion_index(pl.delta_matrix())
    assert [d for d, v in zip(d_pl.dimensions, d_pl.distortion, strict=True) if v == 0] == \
        ["formatting"]
    # ... so on the base, with no plant, it names another dimension the same way
    d_ba = published_distortion_index(ba.delta_matrix())
    zero = [d for d, v in zip(d_ba.dimensions, d_ba.distortion, strict=True) if v == 0]
    assert len(zero) == 1 and zero != ["formatting"]


def test_the_planted_head_ranks_first_on_every_formatting_edit() -> None:
    model = hooked("model")
    target = component_name(planted().truth.component)
    for it in items():  # the edit adds the token; its pair is not position-aligned
        e = DIMENSIONS["formatting"].apply(it, 0)
        pair = align_ids(model.encode(it.conversation(e.perturbed_reply, e.perturbed_user)).ids,
                         model.encode(it.conversation(e.neutral_reply, e.neutral_user)).ids)
        dp = direct_path_patching(model, pair, level="head")
        assert rank_of(dp.effect, dp.names, target) == 1, it.item_id
        for mode in ("denoising", "noising"):
            v, n = attribution_patching(model, pair).components("head", mode)
            assert rank_of(v, n, target) == 1, (it.item_id, mode)
