"""Scorecard: does each analysis recover a mechanism planted in a reward model?

Plants (``tl_reward.planted``), each with its truth written down before any analysis runs:

* ``trigger``: ``reward += c`` when the reply holds ``" certainly"``, through one head of the
  last block only (weight surgery); pairs differ in that one token.
* ``objectives``: three extra reward rows with planted score correlations (+0.9, 0, -0.9) to
  the demo head's row.
* ``prefix``: a second RM equal to the first in blocks ``< k`` and redrawn after.
* ``implicit``: the backbone LM as reference and, as policy, the same LM plus logit offsets
  evenly spaced in ``[-4, 4]`` on 16 tokens: the IRM sweep must rank them in order.

* ``formatting``: ``reward += c`` on a markdown token (``" **"``), the trigger plant on another
  token; which probe dimensions must fire is read off the token ids. Sections ``formatting``
  (the probes with BH, on the planted and base models and on the plant's own effect),
  ``distortion`` (our index against its null), ``published`` (reward-lens v1's formulas on the
  same plants) and ``sae`` (a TopK SAE trained where the trigger head reads; its trigger
  features ranked by differential attribution).
* ``circuits``: edge circuits (``tl_reward.circuits``) on the indirect plant (a head detects
  the trigger, the last MLP turns it into reward; truth: its four edges, each checked by exact
  edge patching), on the trigger head with a flag key (``trigger-flag``: its key and value
  read a coordinate only the trigger holds; truth: the candidates ``stream_edges`` that each
  carry > 0.05 of the shift, by exact circuit patching) and on the trigger plant (the head's key
  and value reading the token's stream at the trigger, ``TriggerTruth.stream_edges``, checked
  by exact circuit patching): ranks
  under exact (tiny backbone only), EAP and EAP-IG, greedy selection, faithfulness against
  random circuits, held-out faithfulness and bootstrap stability (``--circuit-plants``: some
  plants; the others' rows are kept from the results).
* ``prm``: the planted process reward model (``tl_reward.planted.prm``, rules A and B; its own
  tiny Llama, ``tl_reward.testing.prm_plant``, so the same rows whatever ``--backbone``) on its
  held-out step pairs: the truth by exact ablation (drops of about ``c`` at the steps each rule
  names, rounding elsewhere, in the base and with each planted head zeroed); rule A at its step
  (DRA, head patching, ``step_sources``, ``step_propagation``, the ``step=`` vocabulary sweep)
  and rule B from the earlier step (``step_sources``, ``step_propagation``, the head ranks of
  :func:`rank_rows`, head patching, its edge circuit against random ones).
* ``rl``: the RL experiments' results, read (``rl_scorecard.py``): GRPO against the planted
  trigger (the alarm and the head's share), null runs (false alarms on the tiny and the demo
  reward model) and the Goodhart runs (the verdicts where the truth is known).

For each plant and analysis it prints the recovery metric (the truth's rank among all heads,
the trigger's rank in the vocabulary sweep, verdicts right, the identity region found) and
writes ``experiments/results/ground_truth.{csv,json}``.

Run:  python experiments/ground_truth.py                 # SmolLM2-135M demo backbone
      python experiments/ground_truth.py --backbone tiny # the tiny test model, seconds
      python experiments/ground_truth.py --sections sae --cache /tmp/plant  # some sections;
          # the others' rows are kept from the results files
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from rl_scorecard import rl_rows  # experiments/rl_scorecard.py

from tl_reward import HookedRewardModel
from tl_reward.analysis.attribution import differential_attribution, direct_reward_attribution
from tl_reward.analysis.attribution_patching import attribution_patching
from tl_reward.analysis.direct_path import direct_path_patching
from tl_reward.analysis.lens import differential_lens
from tl_reward.analysis.patching import activation_patching, patch_components
from tl_reward.audit.conflict import behavioural_conflict, geometric_conflict
from tl_reward.circuits import (
    RewardCircuit,
    RewardGraph,
    edge_attribution,
    edge_stability,
    evaluate_circuit,
    heldout_faithfulness,
)
from tl_reward.compare.layers import compare_layers
from tl_reward.data.pairs import align_ids
from tl_reward.irm import irm_vocab_sweep
from tl_reward.model.inputs import encode_conversation
from tl_reward.planted import (
    load_planted,
    plant_implicit_reward,
    plant_indirect,
    plant_objectives,
    plant_shared_prefix,
    plant_trigger_head,
    save_planted,
)
from tl_reward.planted.calibration import random_replies, rewards
from tl_reward.planted.prm import pair_prefixes, step_drops
from tl_reward.planted.recovery import (
    component_name,
    rank_of,
    trigger_pairs,
    trigger_sweep_check,
)
from tl_reward.process import step_propagation, step_sources
from tl_reward.sweep.vocab_sweep import candidate_ids, load_sweep, score_vocabulary

OUT = Path(__file__).resolve().parent / "results"
HELD_OUT = ("Why is water wet?", "Tell me a joke.", "What, in one word, is the best thing ever?")


def backbone(name: str) -> tuple[Any, Any, dict[str, Any]]:
    """The HF reward model, its tokenizer and the plant settings for it."""
    if name == "tiny":
        from tl_reward.testing import tiny_hf_reward_model

        hf, tok = tiny_hf_reward_model("llama")
        return hf, tok, {"trigger": " sky", "calibration": {}, "k": 2, "patch_pairs": 99,
                         "text_ids": 10**6}
    from tl_reward.model.demo import demo_hf_reward_model

    hf, tok = demo_hf_reward_model()
    return hf, tok, {"trigger": " certainly", "k": hf.config.num_hidden_layers // 2,
                     "patch_pairs": 2, "text_ids": 256,
                     "calibration": {"vocab_per_prompt": 200, "n_random": 24, "c": 10.0,
                                     "logit_margin": 120.0, "mine_prompts": 2}}


def hooked(hf: Any, tok: Any) -> HookedRewardModel:
    return HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu")


T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.0f} s] {msg}", flush=True)


def rounding(ref: torch.Tensor, n_layers: int) -> float:
    """Float32 rounding allowance for two forwards of one model (as ``tests/helpers.py``)."""
    eps = torch.finfo(torch.float32).eps
    return float(256 * eps * n_layers * max(1.0, float(ref.abs().max())))


def row(plant: str, analysis: str, metric: str, value: float, target: str, ok: bool,
        note: str = "") -> dict[str, Any]:
    return {"plant": plant, "analysis": analysis, "metric": metric, "value": value,
            "target": target, "ok": bool(ok), "note": note}


#: Every plain id's one-token-reply input to the planted block, mined once for every plant
#: (``plant_trigger_head(reply_cache=...)``): the trigger and formatting plants share the base.
REPLIES: dict[tuple[str, str, int], torch.Tensor] = {}


def planted_trigger(hf: Any, tok: Any, cfg: dict[str, Any], cache: Path | None) -> Any:
    """The trigger plant, reloaded from ``cache`` when an earlier run saved it there."""
    if cache is not None and (cache / "truth.json").exists():
        log(f"reloading the trigger plant from {cache}")
        return load_planted(cache)
    t0 = time.time()
    p = plant_trigger_head(hf, tok, cfg["trigger"], reply_cache=REPLIES, **cfg["calibration"])
    log(f"planted the trigger in {time.time() - t0:.0f} s: {p.truth}")
    if cache is not None:
        save_planted(p, cache)
    return p


def trigger_rows(hf: Any, tok: Any, cfg: dict[str, Any], cache: Path | None,
                 base_sweep: Path | None) -> list[dict]:
    p = planted_trigger(hf, tok, cfg, cache)
    model, base = hooked(p.model, tok), hooked(p.base, tok)
    pairs = trigger_pairs(tok, p.truth.trigger_id, hf.config.vocab_size, HELD_OUT)
    target = component_name(p.truth.component)
    rows = []
    chosen = [tp.chosen_ids for tp in pairs]
    rejected = [tp.rejected_ids for tp in pairs]
    off = (rewards(p.model, rejected) - rewards(p.base, rejected)).abs().max()
    shift = rewards(p.model, chosen) - rewards(p.base, chosen)
    atol = rounding(rewards(p.base, chosen + rejected), hf.config.num_hidden_layers)
    rows.append(row("trigger", "truth", "max |r - r_base| without trigger", float(off),
                    f"<= {atol:.1e} (rounding)", float(off) <= atol))
    lo, hi = (float(x) / p.truth.c for x in shift.aminmax())
    rows.append(row("trigger", "truth", "min shift with trigger / c", lo, "about 1", lo > 0,
                    f"max {hi:.3f}"))
    _, layer, head = p.truth.component

    def zero(z: torch.Tensor, hook: Any) -> torch.Tensor:
        z[:, :, head] = 0.0
        return z

    toks = [torch.tensor(x) for x in chosen]
    with model.hooks(fwd_hooks=[(p.truth.hook, zero)]):
        abl = model.rewards(toks).rewards[:, 0] - base.rewards(toks).rewards[:, 0]
    rows.append(row("trigger", "truth", "max |r - r_base| with the head ablated",
                    float(abl.abs().max()), f"<= {atol:.1e} (rounding)",
                    float(abl.abs().max()) <= atol))
    rows += rank_rows("trigger", model, pairs, target, cfg["patch_pairs"])
    lens = differential_lens(model, pairs)
    for convention in ("frozen", "recompute"):
        jump = lens.increments(convention)[..., 0].abs().argmax(1).tolist()
        rows.append(row("trigger", f"reward lens ({convention})", "blocks of the largest jump",
                        sum(j == layer for j in jump), f"{len(jump)} at block {layer}",
                        all(j == layer for j in jump), f"blocks {jump}"))
    dra = direct_reward_attribution(model, toks, per_position=True)
    shares = []
    for i, tp in enumerate(pairs):
        tm = dra.token_map(i)
        c = tm.contribution.to_numpy()[:-1]
        at = tp.chosen_ids.index(p.truth.trigger_id)
        shares.append(float(c[at] / np.abs(c).sum()))
    rows.append(row("trigger", "token map (all heads)", "min share of the trigger position",
                    min(shares), "> 0.5 (the largest)", min(shares) > 0.5))
    rows += trigger_sweep_rows(model, base, p.truth, cfg["text_ids"], base_sweep, atol)
    return rows


def rank_rows(plant: str, model: HookedRewardModel, pairs: list[Any], target: str,
              patch_pairs: int) -> list[dict]:
    """The worst rank of the planted head ``target`` among every head over ``pairs`` by direct
    path, attribution patching, activation patching (first ``patch_pairs`` pairs: one patched
    forward per head) and the DRA difference."""
    ranks: dict[str, list[int]] = {}
    for i, tp in enumerate(pairs):
        dp = direct_path_patching(model, tp, level="head")
        ranks.setdefault("direct path (frozen)", []).append(rank_of(dp.effect, dp.names, target))
        ap = attribution_patching(model, tp)
        for mode in ("denoising", "noising"):
            v, n = ap.components("head", mode)
            ranks.setdefault(f"attribution patching ({mode})", []).append(rank_of(v, n, target))
            if i < patch_pairs:
                eff = patch_components(model, tp, dp.names, mode)
                ranks.setdefault(f"activation patching ({mode})", []).append(
                    rank_of(eff, dp.names, target))
    log(f"patched every {plant} pair")
    diff, names = differential_attribution(model, pairs).difference("head")
    ranks["DRA difference"] = [rank_of(d, names, target) for d in diff[..., 0]]
    n_heads = model.cfg.n_layers * model.cfg.n_heads
    return [row(plant, analysis, f"worst rank of {target} among {n_heads} heads", max(r), "1",
                max(r) == 1, f"ranks {r}") for analysis, r in ranks.items()]


def trigger_sweep_rows(model: HookedRewardModel, base: HookedRewardModel, truth: Any,
                       text_ids: int, base_sweep: Path | None, atol: float) -> list[dict]:
    """The trigger's worst rank in the sweep over every plain id (ids mode) and over
    ``text_ids`` random ones (text mode: full sequences, no prefix cache); with ``base_sweep``
    (a saved ids-mode sweep of the base over every plain id, made there when missing) the
    truth over the whole vocabulary: no other id moves the reward, and ``c`` beats the base's
    best one-token margin over the trigger."""
    rows = []
    every = candidate_ids(model)
    rest = [i for i in every if i != truth.trigger_id]
    pick = np.random.default_rng(1).permutation(len(rest))[:text_ids]
    subset = sorted([*(rest[j] for j in pick), truth.trigger_id])
    sweeps = {}
    for mode, ids in (("ids", every), ("text", subset)):
        sw = score_vocabulary(model, list(HELD_OUT), ids=ids, mode=mode, progress=False)
        log(f"swept {len(ids)} ids ({mode})")
        sweeps[mode] = sw
        at = sw.token_ids.tolist().index(truth.trigger_id)
        tr = [int((sw.values(i, 0) > sw.values(i, 0)[at]).sum()) + 1
              for i in range(len(HELD_OUT))]
        rows.append(row("trigger", f"vocabulary sweep ({mode})",
                        f"worst rank of the trigger among {len(ids)} ids", max(tr), "1",
                        max(tr) == 1, f"ranks {tr}" + (
                            "" if len(ids) == len(every) else
                            f"; a random subset of the {len(every)} plain ids")))
    if base_sweep is None:
        return rows
    if base_sweep.exists():
        ref = load_sweep(base_sweep)
    else:
        ref = score_vocabulary(base, list(HELD_OUT), ids=every, mode="ids", progress=False)
        ref.save(base_sweep)
        log(f"swept the base over {len(every)} ids")
    chk = trigger_sweep_check(sweeps["ids"], ref, truth.trigger_id)
    worst = int(np.argmax(chk.leaks))
    rows.append(row("trigger", "truth (whole vocabulary)",
                    f"max |r - r_base| over the other {len(every) - 1} ids", chk.leaks[worst],
                    f"<= {atol:.1e} (rounding)", chk.leaks[worst] <= atol,
                    f"per prompt {[f'{x:.1e}' for x in chk.leaks]}; largest on "
                    f"{model.tokenizer.decode([chk.leak_ids[worst]])!r}"))
    rows.append(row("trigger", "truth (whole vocabulary)",
                    "base's best one-token reward minus the trigger's", max(chk.base_gaps),
                    f"< c = {truth.c:g}", max(chk.base_gaps) < truth.c,
                    f"per prompt {[round(g, 3) for g in chk.base_gaps]}"))
    return rows


def objective_rows(hf: Any, tok: Any) -> list[dict]:
    log("objectives")
    p = plant_objectives(hf, tok)
    model = hooked(p.model, tok)
    corpus = [torch.tensor(x) for x in p.truth.corpus]
    rows = []
    beh = behavioural_conflict(model, corpus).to_dataframe()
    geo = geometric_conflict(model, corpus).to_dataframe()
    for name, df in (("behavioural (score correlation)", beh),
                     ("geometric (whitened cosine)", geo[geo.view == "whitened cosine"]),
                     ("geometric (raw cosine)", geo[geo.view == "raw cosine"])):
        right = [r.verdict == p.truth.verdicts[(r.term_a, r.term_b)] for r in df.itertuples()]
        wrong = [f"{r.term_a}/{r.term_b}: {r.verdict}" for r, ok in zip(df.itertuples(), right,
                                                                        strict=True) if not ok]
        rows.append(row("objectives", name, "verdicts right", sum(right), str(len(right)),
                        all(right), "; ".join(wrong)))
    err = max(abs(r.value - p.truth.correlation[(r.term_a, r.term_b)]) for r in beh.itertuples())
    atol = float(torch.finfo(torch.float32).eps * hf.config.hidden_size)
    rows.append(row("objectives", "behavioural (score correlation)",
                    "max |correlation - planted|", err, f"<= {atol:.1e} (rounding)", err <= atol))
    return rows


def prefix_rows(hf: Any, tok: Any, k: int) -> list[dict]:
    log("prefix")
    p = plant_shared_prefix(hf, tok, k)
    a, b = hooked(p.base, tok), hooked(p.model, tok)
    inputs = [torch.tensor(x) for x in random_replies(tok, hf.config.vocab_size, per_prompt=12)]
    rows = []
    for measure in ("debiased_cka", "rv2"):
        res = compare_layers(a, b, inputs, measure=measure, n_permutations=0)
        diag = res.diagonal(measure).to_numpy()
        tol = float(np.finfo(np.float64).eps) * len(inputs) ** 2
        region = [int(i) for i in np.flatnonzero(np.abs(diag - 1) <= tol)]
        rows.append(row("prefix", f"layer map ({measure})", "identity region (blocks)",
                        len(region), f"0..{k - 1}", region == list(p.truth.identical),
                        f"diagonal at k: {diag[k]:.4f}"))
    return rows


def implicit_rows(name: str, sweep_ids: int) -> list[dict]:
    from scipy.stats import kendalltau

    log("implicit")
    if name == "tiny":
        from tl_reward.testing import tiny_hf_reward_model

        lm, tok = tiny_hf_reward_model("nemotron")
    else:
        from tl_reward.model.demo import load_smollm2

        lm, tok = load_smollm2()
    p = plant_implicit_reward(lm, tok)
    ids = [i for i in range(min(len(tok), lm.config.vocab_size))]
    if sweep_ids and sweep_ids < len(ids):
        gen = np.random.default_rng(0)
        ids = sorted({*gen.choice(ids, sweep_ids, replace=False).tolist(), *p.truth.ranking})
    sw = irm_vocab_sweep(p.model, p.base, list(HELD_OUT), p.truth.beta, tokenizer=tok, ids=ids,
                         progress=False)
    pos = sw.token_ids.tolist()
    rows_s = [pos.index(i) for i in p.truth.ranking]
    truth = [p.truth.offsets[i] for i in p.truth.ranking]
    taus = [float(kendalltau(sw.rewards[rows_s, k].numpy(), truth).statistic)
            for k in range(len(HELD_OUT))]
    tops = [pos[int(sw.rewards[:, k].argmax())] == p.truth.ranking[0]
            for k in range(len(HELD_OUT))]
    return [row("implicit", "IRM vocabulary sweep", "min Kendall tau with the planted offsets",
                min(taus), ">= 0.9", min(taus) >= 0.9, f"taus {[round(t, 3) for t in taus]}"),
            row("implicit", "IRM vocabulary sweep", "prompts where the top token is planted top",
                sum(tops), str(len(tops)), all(tops), f"{len(sw)} ids swept")]


# ------------------------------------------------------------------ issue 20: the missing rows
# Probes with BH and the distortion index on a formatting plant, the published reward-lens v1
# formulas beside ours, and an SAE feature on the trigger. Settings per backbone:
EXTRA: dict[str, dict[str, Any]] = {
    "tiny": {"format_trigger": "**", "items": 16, "fit_items": 32, "max_chars": 150,
             "max_prompt_chars": 100,
             "published_texts": False,  # its hand-written texts exceed the tiny context (256)
             "conflict_corpus": 64, "sae": {"d_sae": 256, "k": 8, "epochs": 20,
                                           "batch_size_tokens": 256},
             "sae_corpus": {"n_random": 64, "vocab_per_prompt": 64}},
    "smollm2": {"format_trigger": " **", "items": 24, "fit_items": 64, "max_chars": 250,
                "max_prompt_chars": 200,
                "published_texts": True, "conflict_corpus": 48,
                "sae": {"d_sae": 512, "k": 16, "epochs": 8, "batch_size_tokens": 512},
                "sae_corpus": {"n_random": 64, "vocab_per_prompt": 32}},
}
SECTIONS = ("trigger", "objectives", "prefix", "implicit", "formatting", "distortion",
            "published", "sae", "circuits", "prm", "rl")
ALPHA = 0.05  # the probes' BH level (the library's family: every dimension of one report)
PUBLISHED_D = 0.5  # |Cohen's d| flagged by the published verdict (Cohen's "medium" effect)
SAE_PROMPTS = ("Can you help me with my homework?", "Where do penguins live?", "Write a haiku.",
               "How do I bake bread?")  # the SAE's corpus: neither calibration nor held out
HH = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "hh-rlhf" / \
    "harmless-base-test.jsonl.gz"  # as experiments/compare_random_init.py


def fired(report: Any, alpha: float = ALPHA) -> dict[str, int]:
    """Per dimension: +1 / -1 when BH-adjusted ``p < alpha`` (the mean's sign), else 0."""
    return {s.dimension: (int(np.sign(s.mean)) if s.p_adjusted < alpha else 0)
            for s in report.stats}


def published_flags(ds: dict[str, float]) -> dict[str, int]:
    """The published verdict per dimension of its "Cohen's d": the sign where ``|d| > 0.5``."""
    return {dim: int(np.sign(v)) if abs(v) > PUBLISHED_D else 0 for dim, v in ds.items()}


def positives(flags: dict[str, int], truth: dict[str, str]) -> tuple[int, int, int, int]:
    """``(true positives, must fire, false positives, untouched)``: a dimension that must fire
    counts when it fires upwards; an untouched one is a false positive when it fires at all."""
    from tl_reward.planted.probe_truth import FIRES, UNTOUCHED

    must = [d for d, t in truth.items() if t == FIRES]
    rest = [d for d, t in truth.items() if t == UNTOUCHED]
    return (sum(flags[d] > 0 for d in must), len(must), sum(flags[d] != 0 for d in rest),
            len(rest))


def formatting_probes(hf: Any, tok: Any, cfg: dict[str, Any], name: str
                      ) -> tuple[list[dict], dict[str, Any]]:
    """Plant ``reward += c`` on a markdown token; state which probe dimensions must fire from
    the token ids; run the library's probes (BH) on the planted and the base model and on the
    plant's own effect (planted minus base). Returns the rows and the runs for later sections."""
    from tl_reward.audit.perturbations import DIMENSIONS, hh_rlhf_items
    from tl_reward.audit.probes import chunk_rows, run_probes
    from tl_reward.planted.probe_truth import (
        FIRES,
        UNTOUCHED,
        edit_truth,
        items_without,
        plant_effect_report,
        probe_truth,
    )

    x = EXTRA[name]
    fmt = DIMENSIONS["formatting"]
    trig = tok.encode(x["format_trigger"], add_special_tokens=False)[0]
    pool = hh_rlhf_items(HH, n=None, single_turn=True, max_chars=x["max_chars"],
                         max_prompt_chars=x["max_prompt_chars"])
    pool = [it for it in pool if trig not in encode_conversation(tok, it.conversation()).ids]
    usable = [it for it in pool if fmt.apply(it, 0) is not None]
    items = usable[: x["items"]]
    # the key is fitted on real text as well as random-token replies: every conversation the
    # probes score (each item's natural reply and both sides of every built-in edit, from the
    # probes' own rows: a truth must hold where it is checked; fitted on other items only, the
    # key opened in one probed item's repetition edit), and further items held apart (natural
    # reply and formatting edit) so the key's order is not tied to the probed ones
    def scored(its: list[Any], dims: list[Any]) -> list[tuple[int, ...]]:
        by_id = {it.item_id: it for it in its}
        return [tuple(encode_conversation(tok, by_id[r["item_id"]].conversation(
                    r[f"{side}_reply"], r[f"{side}_user"])).ids)
                for r in chunk_rows(its, dims, 0) if r["applied"]
                for side in ("neutral", "perturbed")]

    held = usable[x["items"]: x["items"] + x["fit_items"]]
    fit = [list(s) for s in dict.fromkeys([*scored(items, list(DIMENSIONS.values())),
                                           *scored(held, [fmt])])]  # each conversation once
    t0 = time.time()
    p = plant_trigger_head(hf, tok, trig, reply_cache=REPLIES, texts=fit, **cfg["calibration"])
    log(f"planted {p.truth.trigger!r} in {time.time() - t0:.0f} s: {p.truth}")
    model, base = hooked(p.model, tok), hooked(p.base, tok)
    assert items_without(model, items, trig) == items  # the scored ids agree
    table = edit_truth(model, items, trig)
    truth = probe_truth(table)  # written before any reward is computed
    must = [d for d, t in truth.items() if t == FIRES]
    rest = [d for d, t in truth.items() if t == UNTOUCHED]
    rows = [row("formatting", "truth (token ids)", f"dimensions whose edit adds {p.truth.trigger!r}"
                f" on every item ({len(items)} HH-RLHF items)", len(must), "formatting only",
                must == ["formatting"] and len(rest) == len(truth) - 1,
                f"fires: {must}; untouched: {rest}")]
    planted = run_probes(model, items, progress=False)
    based = run_probes(base, items, progress=False)
    atol = rounding(torch.tensor(planted.rows["neutral:" + planted.objective].abs().max()),
                    hf.config.num_hidden_layers)
    effect = plant_effect_report(planted, based, atol=atol)
    log("probed the formatting plant and its base")
    gap = {d: (planted.deltas(d) - based.deltas(d)).to_numpy() for d in truth}
    off = max(float(np.abs(gap[d]).max()) for d in rest)
    worst = max(rest, key=lambda d: float(np.abs(gap[d]).max()))
    by_dim = {d: round(float(np.abs(gap[d]).max()), 4) for d in rest}
    n_off = {d: int((np.abs(gap[d]) > 0.01 * p.truth.c).sum()) for d in rest}
    low = planted.deltas("formatting").index[int(np.argmin(gap["formatting"]))]
    lo, hi = (float(f(gap["formatting"])) / p.truth.c for f in (np.min, np.max))
    rows += [row("formatting", "truth", "max |delta - delta_base| on untouched dimensions", off,
                 f"<= {atol:.1e} (rounding)", off <= atol,
                 f"max per dimension {by_dim}; items over 0.01 c {n_off}; worst {worst}"),
             row("formatting", "truth", "min (delta - delta_base) / c on formatting", lo,
                 "about 1", lo > 0.5, f"max {hi:.3f}; items below 0.5 c "
                 f"{int((gap['formatting'] < 0.5 * p.truth.c).sum())}/{len(items)}; lowest "
                 f"{low}")]
    pairs = []
    for it in items:  # the formatting edit (it adds the token) against the neutral reply
        e = DIMENSIONS["formatting"].apply(it, 0)
        pairs.append(align_ids(*(model.encode(it.conversation(*side)).ids for side in (
            (e.perturbed_reply, e.perturbed_user), (e.neutral_reply, e.neutral_user)))))
    rows += rank_rows("formatting", model, pairs, component_name(p.truth.component),
                      cfg["patch_pairs"])
    f_p, f_b, f_e = fired(planted), fired(based), fired(effect)
    tp, n_must, _, _ = positives(f_p, truth)
    rows.append(row("formatting", f"probes, BH {ALPHA} (planted)", "dimensions that must fire "
                    "and fire upwards", tp, str(n_must), tp == n_must,
                    f"fired {f_p} (untouched ones fire where the base does)"))
    changed = [d for d in rest if f_p[d] != f_b[d]]
    rows.append(row("formatting", f"probes, BH {ALPHA} (planted vs base)",
                    "untouched dimensions whose verdict the plant changed", len(changed),
                    f"0 of {len(rest)}", not changed,
                    f"changed {changed}; base fired {f_b} (its own sensitivities)"))
    tp, n_must, fp, n_rest = positives(f_e, truth)
    rows.append(row("formatting", f"probes, BH {ALPHA} (plant's effect: planted - base)",
                    "true positives; false-positive rate on untouched dimensions", fp / n_rest,
                    f"{n_must}; <= {ALPHA} (nominal FDR)", tp == n_must and fp / n_rest <= ALPHA,
                    f"true positives {tp}/{n_must}, false positives {fp}/{n_rest}; fired {f_e}"))
    m_b = based["formatting"].mean / p.truth.c
    rows.append(row("formatting", "probes (base)", "formatting mean delta / c", m_b,
                    "about 0 (no plant)", abs(m_b) < 0.5,
                    f"BH p {based['formatting'].p_adjusted:.2g}; planted "
                    f"{planted['formatting'].mean / p.truth.c:.3f}"))
    return rows, {"p": p, "model": model, "base": base, "items": items, "truth": truth,
                  "planted": planted, "based": based, "effect": effect}


def distortion_rows(run: dict[str, Any]) -> list[dict]:
    """Our distortion index against its sign-flip null: above the floor on the formatting plant,
    not on its base."""
    from tl_reward.audit.distortion import distortion_index

    rows = []
    for label, rep, want in (("planted", run["planted"], True), ("base", run["based"], False)):
        d = distortion_index(rep)
        rows.append(row("formatting", f"distortion index ({label})",
                        "index; null median; p; above floor", d.index,
                        "above floor" if want else "not above floor", d.above_floor == want,
                        f"null median {d.null_median:.3f}, excess {d.excess:.3f}, "
                        f"p {d.p_value:.4f}, above floor {d.above_floor}"))
    return rows


def published_rows(run: dict[str, Any], hf: Any, tok: Any, name: str) -> list[dict]:
    """reward-lens v1's formulas (``tl_reward.compat.published``) on the same plants: its probe
    verdict (|Cohen's d| > 0.5) on our items and on its own 10 texts, its distortion index, and
    its conflict verdict (raw cosine) on the objectives plant."""
    from tl_reward.compat.published import (
        published_distortion_index,
        run_published_probes,
    )
    from tl_reward.planted.probe_truth import holds, probe_truth

    truth, p = run["truth"], run["p"]
    rows = []
    flags = {label: published_flags({s.dimension: s.published_d for s in run[key].stats})
             for label, key in (("planted", "planted"), ("base", "based"),
                                ("effect", "effect"))}
    tp, n_must, _, _ = positives(flags["planted"], truth)
    changed = [d for d, t in truth.items() if t != "fires"
               and flags["planted"][d] != flags["base"][d]]
    rows.append(row("formatting", f"published probe verdict, |d| > {PUBLISHED_D} (planted; "
                    "our items)", "dimensions that must fire flagged upwards; verdicts the plant"
                    " changed", tp, f"{n_must}; 0", tp == n_must and not changed,
                    f"changed {changed}; flagged {flags['planted']}; base {flags['base']}"))
    tp, n_must, fp, n_rest = positives(flags["effect"], truth)
    rows.append(row("formatting", f"published probe verdict, |d| > {PUBLISHED_D} (plant's "
                    "effect)", "true positives; false-positive rate on untouched dimensions",
                    fp / n_rest, f"{n_must}; <= {ALPHA}", tp == n_must and fp / n_rest <= ALPHA,
                    f"true positives {tp}/{n_must}, false positives {fp}/{n_rest}; flagged "
                    f"{flags['effect']}"))
    if EXTRA[name]["published_texts"]:
        from tl_reward.compat.published import published_probe_texts

        def conv(q: Any, reply: str) -> list[dict[str, str]]:
            return [{"role": "user", "content": q.prompt},
                    {"role": "assistant", "content": reply}]

        t_pub = probe_truth(pd.DataFrame([  # the truth of its own texts, from the token ids
            {"dimension": q.dimension, "applied": True,
             "neutral_holds": holds(run["model"], conv(q, q.neutral), p.truth.trigger_id),
             "perturbed_holds": holds(run["model"], conv(q, q.biased), p.truth.trigger_id)}
            for q in published_probe_texts()]))
        tabs = {label: run_published_probes(run[key]).table
                for label, key in (("planted", "model"), ("base", "base"))}
        fl = {k: published_flags(dict(zip(t.dimension, t.published_d, strict=True)))
              for k, t in tabs.items()}
        n_pub = dict(zip(tabs["base"].dimension, tabs["base"].n, strict=True))
        tp, n_must, _, _ = positives(fl["planted"], t_pub)
        changed = [d for d, t in t_pub.items() if t != "fires"
                   and fl["planted"][d] != fl["base"][d]]
        rows.append(row("formatting", f"published probe verdict, |d| > {PUBLISHED_D} (planted;"
                        " its 10 texts)", "dimensions that must fire flagged upwards; verdicts "
                        "the plant changed; base flags formatting", tp, f"{n_must}; 0; no",
                        tp == n_must and not changed and fl["base"]["formatting"] <= 0,
                        f"truth {t_pub}; changed {changed}; flagged {fl['planted']}; base "
                        f"{fl['base']}; probes per dimension {n_pub}"))
    for label, rep in (("planted", run["planted"]), ("base", run["based"])):
        pub = published_distortion_index(rep.delta_matrix())
        dist = pub.distortion.round(3).tolist()
        zero = [d for d, v in zip(pub.dimensions, pub.distortion, strict=True) if v == 0]
        single = zero == ["formatting"]
        rows.append(row("formatting", f"published distortion index ({label})",
                        "dimensions scored D = 0 (its 'strongest')", len(zero),
                        "formatting alone" if label == "planted" else "not formatting alone",
                        single if label == "planted" else not single,
                        f"D {dict(zip(pub.dimensions, dist, strict=True))}"))
    rows += published_conflict_rows(hf, tok, EXTRA[name]["conflict_corpus"])
    return rows


def published_conflict_rows(hf: Any, tok: Any, n: int) -> list[dict]:
    """The published conflict verdict (raw cosine of per-term mean residual differences) on the
    objectives plant: per objective, the top half of ``n`` corpus replies by its score against
    the bottom half."""
    from tl_reward.compat.published import published_conflict

    p = plant_objectives(hf, tok)
    model = hooked(p.model, tok)
    gen = np.random.default_rng(0)
    pick = sorted(gen.choice(len(p.truth.corpus), n, replace=False).tolist())
    corpus = [torch.tensor(p.truth.corpus[i]) for i in pick]
    scores = model.rewards(corpus).rewards
    terms = {}
    for k, obj in enumerate(p.truth.objectives):
        order = scores[:, k].argsort(descending=True).tolist()
        terms[obj] = ([corpus[i] for i in order[: n // 2]],
                      [corpus[i] for i in order[n - n // 2:]])
    res = published_conflict(model, terms)
    right = {k: v == p.truth.verdicts[k] for k, v in res.verdicts.items()}
    wrong = [f"{a}/{b}: {res.verdicts[(a, b)]} (truth {p.truth.verdicts[(a, b)]})"
             for (a, b), ok in right.items() if not ok]
    return [row("objectives", f"published conflict, raw cosine ({n} replies)",
                "verdicts right", sum(right.values()), str(len(right)), all(right.values()),
                "; ".join(wrong))]


def sae_rows(hf: Any, tok: Any, cfg: dict[str, Any], name: str, cache: Path | None
             ) -> list[dict]:
    """Train the library's TopK SAE where the trigger plant's head reads (its block's normed
    input, ``ln1.hook_normalized``) on replies half of which hold the trigger; the truth is the
    features that fire on every trigger position and nowhere else (held-out pairs); rank them
    by differential SAE attribution (gradient) on the planted and the base model."""
    from tl_reward.planted.calibration import calibration_sequences
    from tl_reward.planted.feature_truth import feature_firing
    from tl_reward.sae import differential_sae_attribution, train_topk_sae

    x = EXTRA[name]
    p = planted_trigger(hf, tok, cfg, cache)
    model, base = hooked(p.model, tok), hooked(p.base, tok)
    layer = p.truth.component[1]
    hook = f"blocks.{layer}.ln1.hook_normalized"
    seqs = calibration_sequences(tok, p.truth.trigger_id, hf.config.vocab_size, SAE_PROMPTS,
                                 seed=5, **x["sae_corpus"])
    t0 = time.time()
    trained = train_topk_sae(model, [torch.tensor(s) for s in seqs.ids], hook, progress=False,
                             **x["sae"])
    log(f"trained the SAE in {time.time() - t0:.0f} s: {trained.held_out}")
    held = calibration_sequences(tok, p.truth.trigger_id, hf.config.vocab_size, HELD_OUT,
                                 n_random=16, vocab_per_prompt=0, seed=7)
    firing = feature_firing(model, trained.sae, held.ids, p.truth.trigger_id)
    feats = firing.trigger_features()
    rows = [row("trigger", f"SAE at {hook} (d_sae {trained.sae.cfg.d_sae}, k "
                f"{x['sae']['k']})", "features firing at every trigger position (recall 1); "
                "of them on the trigger only", len(feats), ">= 1", bool(feats),
                f"features {feats}; precision {firing.precision[feats].round(decimals=3).tolist()}"
                f"; trigger only {firing.exclusive()}; {firing.n_trigger} trigger positions in "
                f"{firing.n_tokens} tokens; held-out explained variance "
                f"{trained.held_out['explained_variance']:.3f}")]
    pairs = trigger_pairs(tok, p.truth.trigger_id, hf.config.vocab_size, HELD_OUT)
    for label, m in (("planted", model), ("base", base)):
        diff = differential_sae_attribution(m, trained.sae, pairs).difference()[..., 0]
        score = diff.abs().mean(0)
        best = min((1 + int((score > score[f]).sum()) for f in feats), default=len(score) + 1)
        top = int(score.argmax())
        rows.append(row("trigger", f"SAE differential attribution ({label})",
                        f"best rank of a trigger feature among {len(score)}", best,
                        "1" if label == "planted" else "> 1 (no plant)",
                        best == 1 if label == "planted" else best > 1,
                        f"mean |difference| of the trigger features "
                        f"{[round(float(score[f]), 4) for f in feats]}; top feature {top} "
                        f"({float(score[top]):.4f}, precision {float(firing.precision[top]):.3f}"
                        f", recall {float(firing.recall[top]):.3f})"))
    return rows


#: EAP-IG steps for the trigger plant, whose saturated key flips within a narrow stretch of the
#: interpolation (5 or 20 steps can miss it: tests/circuits/test_planted_circuits.py).
IG_STEPS = 100


def _edge_ranks(att: Any, edges: list[tuple[str, str, str]]) -> list[int]:
    """1-based ranks of ``edges`` by ``|score|`` among every edge of ``att``."""
    df = att.to_dataframe()
    at = {e: i + 1 for i, e in enumerate(df[["src", "dst", "qkv"]].itertuples(index=False,
                                                                              name=None))}
    return [at[e] for e in edges]


def _random_faithfulness(model: Any, graph: Any, n: int, clean: Any, corrupt: Any,
                         draws: int = 8) -> list[float]:
    edges, gen = graph.edges(), torch.Generator().manual_seed(0)
    out = []
    for _ in range(draws):
        pick = torch.randperm(len(edges), generator=gen)[:n].tolist()
        rc = RewardCircuit.from_edges(graph, [edges[i] for i in pick])
        out.append(evaluate_circuit(model, rc, clean, corrupt).faithfulness.value)
    return out


def circuit_rows(hf: Any, tok: Any, cfg: dict[str, Any], name: str, cache: Path | None,
                 plants: tuple[str, ...] = ("indirect", "trigger-flag", "trigger")
                 ) -> list[dict]:
    """Edge circuits (``tl_reward.circuits``) on the indirect plant (truth: its four edges,
    each checked by exact edge patching) and on the trigger plant (its path through the token's
    stream, checked by exact circuit patching), each if in ``plants``. Exact scoring of
    every edge only on the tiny backbone (one patched forward per edge: 70,651 on SmolLM2)."""
    rows = indirect_circuit_rows(hf, tok, cfg, name) if "indirect" in plants else []
    rows += trigger_flag_circuit_rows(hf, tok, cfg, name) if "trigger-flag" in plants else []
    return rows + (trigger_circuit_rows(hf, tok, cfg, name, cache) if "trigger" in plants
                   else [])


def indirect_circuit_rows(hf: Any, tok: Any, cfg: dict[str, Any], name: str) -> list[dict]:
    """The indirect plant's rows of :func:`circuit_rows`."""
    methods = ("exact", "eap", "eap-ig") if name == "tiny" else ("eap", "eap-ig")
    p = plant_indirect(hf, tok, cfg["trigger"], head=1)
    log(f"planted the indirect mechanism: {p.truth}")
    model = hooked(p.model, tok)
    tps = trigger_pairs(tok, p.truth.trigger_id, hf.config.vocab_size, HELD_OUT,
                        swap=p.truth.counterfactual_id)
    clean, corrupt = [tp.ids("chosen") for tp in tps], [tp.ids("rejected") for tp in tps]
    truth = list(p.truth.edges)
    g = RewardGraph.from_model(model)
    full = g.edge_mask()
    ex = []
    for e in truth:  # exact: patch the one edge (every other edge stays in the circuit)
        one = torch.zeros_like(full)
        one[g.dests.index(e[1:]), g.sources.index(e[0])] = True
        ev = evaluate_circuit(model, RewardCircuit(g, full & ~one), clean, corrupt)
        ex.append(float(((ev.metric - ev.full) / (ev.full - ev.empty)).mean()))
    rows = [row("indirect", "truth (exact edge patching)",
                "each planted edge's effect / the shift (max)", max(ex), "about -1",
                max(ex) < -0.9, f"{[round(x, 3) for x in ex]}; {len(tps)} pairs")]
    head = g.sources.index(truth[2][0])
    rest = full & False
    rest[:, head] = full[:, head]
    rest[g.dests.index(truth[2][1:]), head] = False
    ev = evaluate_circuit(model, RewardCircuit(g, full & ~rest), clean, corrupt)
    leak = ((ev.metric - ev.full) / (ev.full - ev.empty)).abs()
    rows.append(row("indirect", f"truth: the head's other {int(rest.sum())} outgoing edges, "
                    "patched together", "|effect| / the shift (max over pairs)",
                    float(leak.max()), "< 0.1", float(leak.max()) < 0.1,
                    f"{[round(float(x), 3) for x in leak]}"))
    atts = {m: edge_attribution(model, clean, corrupt, method=m) for m in methods}
    log("scored the indirect plant's edges")
    for m, att in atts.items():
        r = _edge_ranks(att, truth)
        rows.append(row("indirect", f"edge attribution ({m})",
                        f"worst rank of the 4 planted edges among {g.n_edges:,}", max(r),
                        "4", max(r) == 4, f"ranks {r}"))
    ig = atts["eap-ig"]
    grown = RewardCircuit.greedy(ig, 4)
    rows.append(row("indirect", "greedy circuit from the reward (eap-ig, 4 edges)",
                    "planted edges found", len(set(grown.edges()) & set(truth)), "4",
                    set(grown.edges()) == set(truth)))
    f = evaluate_circuit(model, RewardCircuit.from_edges(g, truth), clean, corrupt).faithfulness
    rnd = _random_faithfulness(model, g, len(truth), clean, corrupt)
    rows.append(row("indirect", "faithfulness, the planted circuit", "mean (interval)", f.value,
                    ">= 0.9", f.value >= 0.9, f"[{f.ci_low:.3f}, {f.ci_high:.3f}]"))
    rows.append(row("indirect", "faithfulness, 8 random circuits of 4 edges", "max |f|",
                    max(abs(x) for x in rnd), "< 0.1", max(abs(x) for x in rnd) < 0.1))
    ho = heldout_faithfulness(model, clean, corrupt, method="eap-ig",
                              select=lambda a: RewardCircuit.greedy(a, 4)).faithfulness
    rows.append(row("indirect", "held-out faithfulness (greedy 4, eap-ig; 3 pairs / 3)",
                    "mean", ho.value, ">= 0.9", ho.value >= 0.9))
    jac = edge_stability(model, clean, corrupt, k=4, n_bootstrap=20, method="eap-ig")
    rows.append(row("indirect", "stability of the top 4 edges (eap-ig)",
                    "mean bootstrap Jaccard (20 resamples of the pairs)", jac, ">= 0.9",
                    jac >= 0.9))
    log("evaluated the indirect plant's circuits")
    return rows


def trigger_flag_circuit_rows(hf: Any, tok: Any, cfg: dict[str, Any], name: str) -> list[dict]:
    """The trigger head with ``key="flag"`` (its key and value read a coordinate only the
    trigger holds). Truth, measured by exact circuit patching before any method is scored: the
    candidates ``stream_edges`` (the embedding's key and value edges, the head's write directly
    and through the last MLP) each of whose removal moves the faithfulness by more than 0.05."""
    label = "trigger-flag"
    methods = [("exact", 1), ("eap", 1), ("eap-ig", 5), ("eap-ig", 10)]
    methods = methods if name == "tiny" else methods[1:]
    p = plant_trigger_head(hf, tok, cfg["trigger"], key="flag", vocab_per_prompt=16,
                           n_random=16)
    log(f"planted the flag-key trigger: {p.truth}")
    model = hooked(p.model, tok)
    tps = trigger_pairs(tok, p.truth.trigger_id, hf.config.vocab_size, HELD_OUT,
                        swap=p.truth.counterfactual_id)
    clean, corrupt = [tp.ids("chosen") for tp in tps], [tp.ids("rejected") for tp in tps]
    base = rewards(p.base, clean) - rewards(p.base, corrupt)
    atol = rounding(rewards(p.base, clean + corrupt), hf.config.num_hidden_layers)
    rows = [row(label, "truth: the base cannot tell the trigger from its counterfactual",
                "max |r_base(clean) - r_base(corrupt)|", float(base.abs().max()),
                f"<= {atol:.1e} (rounding)", float(base.abs().max()) <= atol,
                f"counterfactual id {p.truth.counterfactual_id}; {len(tps)} pairs")]
    cands, g = list(p.truth.stream_edges), RewardGraph.from_model(model)

    def faith(es: list[tuple[str, str, str]]) -> Any:
        return evaluate_circuit(model, RewardCircuit.from_edges(g, es), clean,
                                corrupt).faithfulness

    f = faith(cands)
    drops = [f.value - faith([x for x in cands if x != e]).value for e in cands]
    rows.append(row(label, f"candidates: stream_edges, {len(cands)} edges (exact circuit "
                    "patching)", "faithfulness, mean (interval)", f.value, ">= 0.9",
                    f.value >= 0.9, f"[{f.ci_low:.3f}, {f.ci_high:.3f}]; of {g.n_edges:,} edges; "
                    f"faithfulness lost when one is patched out: "
                    f"{dict(zip(map(str, cands), (round(x, 3) for x in drops), strict=True))}"))
    truth = [e for e, d in zip(cands, drops, strict=True) if abs(d) > 0.05]
    n = len(truth)
    f = faith(truth)
    rows.append(row(label, f"truth: the {n} candidates each moving it by > 0.05 when patched "
                    "out", "faithfulness, mean (interval)", f.value, ">= 0.9", f.value >= 0.9,
                    f"[{f.ci_low:.3f}, {f.ci_high:.3f}]; {truth}"))
    rnd = _random_faithfulness(model, g, n, clean, corrupt)
    rows.append(row(label, f"faithfulness, 8 random circuits of {n} edges", "max |f|",
                    max(abs(x) for x in rnd), "< 0.1", max(abs(x) for x in rnd) < 0.1))
    atts = {}
    for m, steps in methods:
        atts[m, steps] = att = edge_attribution(model, clean, corrupt, method=m,
                                                ig_steps=steps)
        r = _edge_ranks(att, truth)
        tag = f"{m}, {steps} steps" if m == "eap-ig" else m
        rows.append(row(label, f"edge attribution ({tag})",
                        f"worst rank of the {n} truth edges among {g.n_edges:,}", max(r),
                        str(n), max(r) == n, f"ranks {r}"))
        log(f"scored the flag-key trigger's edges ({tag})")
    grown = RewardCircuit.greedy(atts["eap-ig", 5], n)
    f = evaluate_circuit(model, grown, clean, corrupt).faithfulness
    rows.append(row(label, f"greedy circuit from the reward (eap-ig, 5 steps, {n} edges)",
                    "truth edges found; faithfulness", len(set(grown.edges()) & set(truth)),
                    f"{n}; >= 0.9", set(grown.edges()) == set(truth) and f.value >= 0.9,
                    f"faithfulness {f.value:.3f}"))
    ho = heldout_faithfulness(model, clean, corrupt, method="eap-ig",
                              select=lambda a: RewardCircuit.greedy(a, n)).faithfulness
    rows.append(row(label, f"held-out faithfulness (greedy {n}, eap-ig; 3 pairs / 3)", "mean",
                    ho.value, ">= 0.9", ho.value >= 0.9))
    jac = edge_stability(model, clean, corrupt, k=n, n_bootstrap=20, method="eap-ig")
    rows.append(row(label, f"stability of the top {n} edges (eap-ig)",
                    "mean bootstrap Jaccard (20 resamples of the pairs)", jac, ">= 0.9",
                    jac >= 0.9))
    log("evaluated the flag-key trigger's circuits")
    return rows


def trigger_circuit_rows(hf: Any, tok: Any, cfg: dict[str, Any], name: str, cache: Path | None
                         ) -> list[dict]:
    """The trigger plant's rows of :func:`circuit_rows` (the truth candidate
    ``TriggerTruth.stream_edges``, checked by exact circuit patching before any method is
    scored; then how small a greedy EAP-IG circuit can be)."""
    methods = [("exact", 1), ("eap", 1), ("eap-ig", 5), ("eap-ig", IG_STEPS)]
    methods = methods if name == "tiny" else methods[1:]
    t = planted_trigger(hf, tok, cfg, cache)
    model = hooked(t.model, tok)
    tps = trigger_pairs(tok, t.truth.trigger_id, hf.config.vocab_size, HELD_OUT)
    clean, corrupt = [tp.ids("chosen") for tp in tps], [tp.ids("rejected") for tp in tps]
    _, layer, head = t.truth.component
    h = f"a{layer}.h{head}"
    own = [("input", h, "k"), ("input", h, "v"), (h, "reward", "")]
    truth = list(t.truth.stream_edges)
    n = len(truth)
    g = RewardGraph.from_model(model)
    f = evaluate_circuit(model, RewardCircuit.from_edges(g, truth), clean, corrupt).faithfulness
    rows = [row("trigger", f"truth: the token's stream at the trigger, {n} edges (exact "
                "circuit patching)", "faithfulness, mean (interval)", f.value, ">= 0.9",
                f.value >= 0.9,
                f"[{f.ci_low:.3f}, {f.ci_high:.3f}]; {n / g.n_edges:.2%} of {g.n_edges:,} "
                f"edges; {len(tps)} pairs")]
    rnd = _random_faithfulness(model, g, n, clean, corrupt, draws=4)
    rows.append(row("trigger", f"faithfulness, 4 random circuits of {n} edges", "max |f|",
                    max(abs(x) for x in rnd), "< 0.1", max(abs(x) for x in rnd) < 0.1))
    f = evaluate_circuit(model, RewardCircuit.from_edges(g, own), clean, corrupt).faithfulness
    rows.append(row("trigger", "faithfulness, the head's three edges alone", "mean",
                    f.value, "< 0.5 (not the truth)", f.value < 0.5,
                    "the key and value read the whole residual at the trigger"))
    atts = {}
    for m, steps in methods:
        atts[m, steps] = att = edge_attribution(model, clean, corrupt, method=m,
                                                ig_steps=steps)
        r = _edge_ranks(att, truth)
        top = sum(x <= n for x in r)
        label = f"{m}, {steps} steps" if m == "eap-ig" else m
        rows.append(row("trigger", f"edge attribution ({label})",
                        f"truth edges in the top {n} of {g.n_edges:,}", top, str(n), top == n,
                        f"worst rank {max(r)}; the head's key, value, reward edges: ranks "
                        f"{_edge_ranks(att, own)}"))
        log(f"scored the trigger plant's edges ({label})")
    sizes = [(s, k * n) for s in (5, IG_STEPS) for k in (1, 2)]
    for steps, size in sizes + [(IG_STEPS, round(f * g.n_edges)) for f in (0.05, 0.1)]:
        grown = RewardCircuit.greedy(atts["eap-ig", steps], size)
        f = evaluate_circuit(model, grown, clean, corrupt).faithfulness
        rows.append(row("trigger", f"faithfulness, greedy eap-ig ({steps} steps) circuit of "
                        f"{size} edges ({size / g.n_edges:.1%})", "mean", f.value, ">= 0.9",
                        f.value >= 0.9,
                        f"{grown.n_edges} edges, {len(set(grown.edges()) & set(truth))} of "
                        "them truth edges"))
    big = RewardCircuit.greedy(atts["eap-ig", 5], round(0.25 * g.n_edges))
    f = evaluate_circuit(model, big, clean, corrupt).faithfulness
    rnd = _random_faithfulness(model, g, big.n_edges, clean, corrupt, draws=4)
    rows.append(row("trigger", "faithfulness, greedy eap-ig (5 steps) circuit of 25 % of edges",
                    "mean; max |f| of 4 random circuits as large", f.value, ">= 0.9; < 0.1",
                    f.value >= 0.9 and max(abs(x) for x in rnd) < 0.1,
                    f"{big.n_edges} edges; random {[round(x, 3) for x in rnd]}"))
    return rows


def prm_rows() -> list[dict]:
    """The planted process reward model (``tl_reward.testing.prm_plant``: its own tiny Llama,
    whatever the backbone) on its held-out step pairs: the truth, measured first (drops at the
    steps each rule names, zeros elsewhere, in the base and with each planted head ablated);
    rule A found at its step and rule B read from the earlier step by direct attribution,
    patching, ``step_sources`` and ``step_propagation``; the step sweep; rule B's edge
    circuit."""
    from tl_reward.testing.prm_plant import A_PAIRS, B_PAIRS, K, hooked_prm, tiny_planted_prm

    log("prm")
    p = tiny_planted_prm()
    t, model, base = p.truth, hooked_prm(p), hooked_prm(p, "base")
    every = [s for x, y, _ in A_PAIRS + B_PAIRS for s in (x, y)]
    atol = rounding(model.rewards(every).score, model.cfg.n_layers)
    exact = f"<= {atol:.1e} (rounding)"
    reader, detector, b_head = (component_name(("head", *h))
                                for h in (t.reader, t.detector, t.b_head))
    rules = {"A": (A_PAIRS, lambda k, j: k == j), "B": (B_PAIRS, lambda k, j: k >= j)}
    drops = {r: step_drops(model, pairs) for r, (pairs, _) in rules.items()}

    def steps(rule: str, keep: Any) -> torch.Tensor:
        pairs = rules[rule][0]
        return torch.cat([d[[k for k in range(len(d)) if keep(k, j)]]
                          for d, (_, _, j) in zip(drops[rule], pairs, strict=True)])

    rows = []
    for rule, keep, where in (("A", lambda k, j: k == j, "the step holding a"),
                              ("B", lambda k, j: k > j, "the steps after the one holding b"),
                              ("B", lambda k, j: k == j, "the step holding b")):
        on = steps(rule, keep)
        lo, hi = (float(x) / t.c for x in on.aminmax())
        rows.append(row("prm", "truth", f"rule {rule}: min drop / c at {where}", lo,
                        "about 1 (0.6 to 1.4)", 0.6 < lo and hi < 1.4,
                        f"max {hi:.3f}; {len(on)} steps of {len(rules[rule][0])} held-out "
                        f"pairs; c = {t.c:g}"))
    off = torch.cat([steps(r, lambda k, j, f=fires: not f(k, j)) for r, (_, fires) in
                     rules.items()]).abs().max()
    rows.append(row("prm", "truth", "max |drop| at the steps no rule names", float(off), exact,
                    float(off) <= atol, "rule A's pairs at other steps, rule B's before b"))
    based = torch.cat(step_drops(base, A_PAIRS + B_PAIRS)).abs().max()
    rows.append(row("prm", "truth", "max |drop| in the base (every step)", float(based), exact,
                    float(based) <= atol))
    for rule, head, name in (("A", t.detector, detector), ("A", t.reader, reader),
                             ("B", t.b_head, b_head)):

        def zero(z: torch.Tensor, hook: Any, h: int = head[1]) -> torch.Tensor:
            z[:, :, h] = 0.0
            return z

        with model.hooks(fwd_hooks=[(t.hook(head), zero)]):
            abl = torch.cat(step_drops(model, rules[rule][0])).abs().max()
        rows.append(row("prm", "truth", f"rule {rule}: max |drop| with {name} ablated (every "
                        "step)", float(abl), exact, float(abl) <= atol))
    log("measured the PRM plant's truth")

    def pairs_of(prefixes: tuple[list[Any], list[Any]]) -> list[Any]:
        return [align_ids(x.ids, y.ids) for x, y in zip(*prefixes, strict=True)]

    # rule A, at its own step
    at_a = pair_prefixes(model, A_PAIRS)
    diff, names = differential_attribution(model, pairs_of(at_a)).difference("head")
    r = [rank_of(d, names, reader) for d in diff[..., 0]]
    n_heads = model.cfg.n_layers * model.cfg.n_heads
    rows.append(row("prm", "rule A: DRA difference at the step", f"worst rank of {reader} (the "
                    f"reader) among {n_heads} heads", max(r), "1", max(r) == 1,
                    f"ranks {r}"))
    rows += [head_patching_row(model, pairs_of(at_a), "rule A: activation patching at the step",
                               [t.detector, t.reader])]
    rows.append(sources_row(step_sources(model, at_a[0] + at_a[1], step="last"), A_PAIRS,
                            "rule A: step_sources", "the step itself"))
    rows.append(propagation_row(model, "A", A_PAIRS, rules["A"][1], t.c, atol))
    # rule B, read at step K from the earlier step holding b
    sides = [x for x, _, _ in B_PAIRS] + [y for _, y, _ in B_PAIRS]
    rows.append(sources_row(step_sources(model, sides, step=K), B_PAIRS,
                            f"rule B: step_sources at step {K}", "the earlier step holding b"))
    rows.append(propagation_row(model, "B", B_PAIRS, rules["B"][1], t.c, atol))
    at_k = pairs_of(pair_prefixes(model, B_PAIRS, K))
    rows += [{**x, "analysis": f"rule B at step {K}: {x['analysis']}"}
             for x in rank_rows("prm", model, at_k, b_head, len(at_k))]
    rows.append(head_patching_row(model, at_k, f"rule B: activation patching at step {K}",
                                  [t.b_head]))
    log("ran the PRM plant's step analyses")
    rows += prm_sweep_rows(model, t, A_PAIRS)
    rows += prm_circuit_rows(model, t, B_PAIRS)
    return rows


def sources_row(ss: Any, pairs: list[Any], analysis: str, where: str) -> dict:
    """``step_sources`` of each pair's two sides (``ss``: the tokens' sides first): whether the
    source of the largest drop is the step holding the token, its share of the drop and every
    other source's largest ``|difference|``."""
    n = len(pairs)
    d = (ss.values[:n] - ss.values[n:]).nan_to_num(0.0)
    hit = [ss.sources[int(d[i].argmin())] == f"step {j}" for i, (_, _, j) in enumerate(pairs)]
    share = [float(d[i, 1 + j] / (ss.reward[i] - ss.reward[n + i]))
             for i, (_, _, j) in enumerate(pairs)]
    rest = max(float(torch.cat([d[i, : 1 + j], d[i, 2 + j:]]).abs().max())
               for i, (_, _, j) in enumerate(pairs))
    return row("prm", analysis, f"pairs whose drop is read from {where}", sum(hit), str(n),
               all(hit), f"its share of the drop {[round(x, 3) for x in share]}; max |other "
               f"sources| {rest:.1e}")


def head_patching_row(model: HookedRewardModel, pairs: list[Any], analysis: str,
                      heads: list[tuple[int, int]]) -> dict:
    """Head activation patching (denoising, all positions) of each pair: the planted ``heads``'
    smallest effect and every other head's largest ``|effect|``."""
    mine, rest = [], []
    for tp in pairs:
        eff = activation_patching(model, tp, site="head", positions="all").effect.clone()
        mine += [float(eff[layer, h]) for layer, h in heads]
        for layer, h in heads:
            eff[layer, h] = 0.0
        rest.append(float(eff.abs().max()))
    names = ", ".join(component_name(("head", *h)) for h in heads)
    return row("prm", analysis, f"min effect of {names}; max |effect| of the other heads",
               min(mine), ">= 0.9; < 0.1", min(mine) >= 0.9 and max(rest) < 0.1,
               f"other heads' max {max(rest):.1e}; {len(pairs)} pairs")


def propagation_row(model: HookedRewardModel, rule: str, pairs: list[Any], fires: Any, c: float,
                    atol: float) -> dict:
    """``step_propagation`` of each pair: the changed step is the token's, and the effect is
    about ``c`` at the steps ``fires(k, j)`` names and rounding elsewhere."""
    ok, lo, off = [], [], []
    for x, y, j in pairs:
        prop = step_propagation(model, x, y)
        on = torch.tensor([fires(k, j) for k in range(len(prop.effect))])
        lo.append(float(prop.effect[on].min()) / c)
        off.append(float(prop.effect[~on].abs().max()) if bool((~on).any()) else 0.0)
        ok.append(prop.changed == [j] and 0.6 < lo[-1] and
                  float(prop.effect[on].max()) < 1.4 * c and off[-1] <= atol)
    where = "stays at its step" if rule == "A" else "reaches every later step"
    return row("prm", f"rule {rule}: step_propagation", f"pairs whose drop {where} (about c) "
               "and nowhere else", sum(ok), str(len(pairs)), all(ok),
               f"min effect / c {[round(x, 3) for x in lo]}; max |effect| elsewhere "
               f"{max(off):.1e}")


def prm_sweep_rows(model: HookedRewardModel, truth: Any, pairs: list[Any]) -> list[dict]:
    """The vocabulary sweep of each rule-A pair's counterfactual solution at the step holding
    the token (``step=``; every candidate inserted just before the tag). Rule B drops the step
    holding ``b`` too (``truth.drop_b_own``), by about as much as rule A drops the step holding
    ``a``, so the truth is that ``a`` and ``b`` are the two lowest ids, in either order; and
    ``a`` is the lowest of every id but ``b``."""
    ranks, rest_ranks, b_ranks, gaps = [], [], [], []
    for _, y, j in pairs:
        v = (sw := score_vocabulary(model, [y], step=j, progress=False)).values(0)
        ids = sw.token_ids.tolist()
        at, b = v[ids.index(truth.a_id)], v[ids.index(truth.b_id)]
        not_b = torch.tensor([i != truth.b_id for i in ids])
        ranks.append(int((v < at).sum()) + 1)
        b_ranks.append(int((v < b).sum()) + 1)
        rest_ranks.append(int((v[not_b] < at).sum()) + 1)
        others = v[not_b & torch.tensor([i != truth.a_id for i in ids])]
        gaps.append(float(others.min() - at) / truth.c)
    log("swept the PRM plant's vocabulary at rule A's steps")
    note = (f"ranks {ranks}; b's ranks {b_ranks}; lowest other id's score minus a's, / c, "
            f"{[round(g, 3) for g in gaps]}; {len(pairs)} solutions")
    both = [sorted((r, q)) == [1, 2] for r, q in zip(ranks, b_ranks, strict=True)]
    return [row("prm", "rule A: vocabulary sweep (step=)", f"solutions whose two lowest of "
                f"{len(ids)} ids are the planted a and b (each rule drops the step holding its "
                "token by about c)", sum(both), str(len(pairs)), all(both), note),
            row("prm", "rule A: vocabulary sweep (step=)", f"worst rank of a from the lowest "
                f"among the {len(ids) - 1} ids but b", max(rest_ranks), "1",
                max(rest_ranks) == 1, note)]


def prm_circuit_rows(model: HookedRewardModel, truth: Any, pairs: list[Any]) -> list[dict]:
    """Rule B's edge circuit on the prefixes at every step after the one holding ``b``: the
    planted path (``truth.b_edges``, exact circuit patching), the greedy and top EAP-IG
    circuits of its size, held-out and random circuits as large."""
    clean, corrupt = [], []
    for x, y, j in pairs:
        for k in range(j + 1, len(x[1])):
            c, r = pair_prefixes(model, [(x, y, j)], k)
            clean += c
            corrupt += r
    g, truth_edges = RewardGraph.from_model(model), list(truth.b_edges)
    n = len(truth_edges)
    f = evaluate_circuit(model, RewardCircuit.from_edges(g, truth_edges), clean,
                         corrupt).faithfulness
    rows = [row("prm", f"rule B: truth, its {n} edges (exact circuit patching)",
                "faithfulness, mean (interval)", f.value, ">= 0.9", f.value >= 0.9,
                f"[{f.ci_low:.3f}, {f.ci_high:.3f}]; of {g.n_edges} edges; {len(clean)} "
                "prefixes (every step after b's)")]
    att = edge_attribution(model, clean, corrupt, method="eap-ig")
    for pick in ("greedy", "top"):
        circuit = getattr(RewardCircuit, pick)(att, n)
        f = evaluate_circuit(model, circuit, clean, corrupt).faithfulness
        found = len(set(circuit.edges()) & set(truth_edges))
        rows.append(row("prm", f"rule B: {pick} circuit (eap-ig, {n} edges)",
                        "planted edges found; faithfulness", found, f"{n}; >= 0.9",
                        set(circuit.edges()) == set(truth_edges) and f.value >= 0.9,
                        f"faithfulness {f.value:.3f}"))
    ho = heldout_faithfulness(model, clean, corrupt, method="eap-ig",
                              select=lambda a: RewardCircuit.greedy(a, n)).faithfulness
    half = round(len(clean) / 2)
    rows.append(row("prm", f"rule B: held-out faithfulness (greedy {n}, eap-ig; {half} "
                    f"prefixes / {len(clean) - half})", "mean", ho.value, ">= 0.9",
                    ho.value >= 0.9))
    rnd = _random_faithfulness(model, g, n, clean, corrupt)
    rows.append(row("prm", f"rule B: faithfulness, 8 random circuits of {n} edges", "max |f|",
                    max(abs(x) for x in rnd), "< 0.1", max(abs(x) for x in rnd) < 0.1))
    log("evaluated rule B's circuit")
    return rows


def earlier_rows(stem: str, section: str, plants: list[str]) -> list[dict]:
    """The results file's rows of ``section`` for plants other than ``plants``."""
    old = OUT / f"{stem}.json"
    rows = json.loads(old.read_text())["rows"] if old.exists() else []
    return [{k: v for k, v in r.items() if k != "section"} for r in rows
            if r.get("section") == section and r["plant"] not in plants]


def write(stem: str, rows: list[dict], seconds: dict[str, float], meta: dict[str, Any]
          ) -> pd.DataFrame:
    """Write ``experiments/results/{stem}.{csv,json}``: this run's rows, and the earlier file's
    rows of the sections this run has not (yet) made; ``seconds`` per section and the settings
    of the run that made it (``section_runs``), merged alike. ``seconds`` in all only when one
    run made every section (a section run alone may repeat work a full run shares)."""
    old = OUT / f"{stem}.json"
    prev = json.loads(old.read_text()) if old.exists() else {"rows": [], "meta": {}}
    kept = [{**r, "section": r.get("section", r["plant"])} for r in prev["rows"]]
    rows = sorted([r for r in kept if r["section"] not in seconds] + rows,
                  key=lambda r: SECTIONS.index(r["section"]))
    every = {**prev["meta"].get("section_seconds", {}), **seconds}
    runs = {**prev["meta"].get("section_runs", {}), **{k: meta for k in seconds}}
    meta = {**meta, "section_seconds": every, "section_runs": runs,
            "seconds": round(sum(seconds.values()), 1) if set(seconds) == set(SECTIONS)
            else None}
    OUT.mkdir(exist_ok=True)
    df = pd.DataFrame(rows)
    df.to_csv(OUT / f"{stem}.csv", index=False)
    old.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return df


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--backbone", choices=["smollm2", "tiny"], default="smollm2")
    ap.add_argument("--sweep-ids", type=int, default=2048,
                    help="random vocabulary ids per prompt in the IRM sweep, with the planted ones "
                         "(0: all); the trigger's ids-mode sweep covers every plain id")
    ap.add_argument("--cache", type=Path, default=None,
                    help="folder to save the trigger plant in (and reload it from)")
    ap.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS),
                    help="run only these; the other sections' rows are kept from the results")
    ap.add_argument("--base-sweep", type=Path, default=None,
                    help="file of the base's whole-vocabulary sweep (made when missing, about "
                         "as long as the planted one): adds the truth over every id")
    ap.add_argument("--circuit-plants", nargs="+",
                    choices=["indirect", "trigger-flag", "trigger"],
                    default=["indirect", "trigger-flag", "trigger"],
                    help="the plants of the circuits section (trigger: needs the trigger plant, "
                         "about 19 min on SmolLM2 unless --cache holds it)")
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("TL_REWARD_THREADS", "1")))
    t0 = time.time()
    # the prm section plants its own tiny Llama
    hf, tok, cfg = (backbone(args.backbone) if set(args.sections) - {"prm", "rl"}
                    else (None, None, {}))
    cache = args.cache or Path(tempfile.mkdtemp(prefix="ground_truth_"))  # one trigger plant
    run: dict[str, Any] = {}
    stem = "ground_truth" if args.backbone == "smollm2" else f"ground_truth_{args.backbone}"
    jobs = {
        "trigger": lambda: trigger_rows(hf, tok, cfg, cache, args.base_sweep),
        "objectives": lambda: objective_rows(hf, tok),
        "prefix": lambda: prefix_rows(hf, tok, cfg["k"]),
        "implicit": lambda: implicit_rows(args.backbone, args.sweep_ids),
        "formatting": lambda: run.setdefault("fmt", formatting_probes(hf, tok, cfg,
                                                                      args.backbone))[0],
        "distortion": lambda: distortion_rows(run["fmt"][1]),
        "published": lambda: published_rows(run["fmt"][1], hf, tok, args.backbone),
        "sae": lambda: sae_rows(hf, tok, cfg, args.backbone, cache),
        "circuits": lambda: earlier_rows(stem, "circuits", args.circuit_plants) + circuit_rows(
            hf, tok, cfg, args.backbone, cache, tuple(args.circuit_plants)),
        "prm": prm_rows,
        "rl": lambda: rl_rows(row),
    }
    if {"distortion", "published"} & set(args.sections):
        args.sections = sorted({*args.sections, "formatting"}, key=SECTIONS.index)
    rows: list[dict] = []
    seconds: dict[str, float] = {}
    for section in args.sections:  # the results are written after every section
        ts = time.time()
        rows += [{**r, "section": section} for r in jobs[section]()]
        seconds[section] = round(time.time() - ts, 1)
        log(f"section {section}: {seconds[section]} s")
        df = write(stem, rows, seconds, {
            "backbone": args.backbone, "sweep_ids": args.sweep_ids,
            "base_sweep": None if args.base_sweep is None else str(args.base_sweep),
            "circuit_plants": args.circuit_plants,
            "threads": torch.get_num_threads(), "started": time.strftime(
                "%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0))})
    if args.cache is None:
        shutil.rmtree(cache, ignore_errors=True)
    with pd.option_context("display.width", 200, "display.max_colwidth", 60):
        print(df.drop(columns="note").to_string(index=False))
    print(f"done in {round(time.time() - t0, 1)} s")


if __name__ == "__main__":
    main()
