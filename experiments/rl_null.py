"""False alarms of the reward-gain verdicts on real null GRPO runs, and their power on runs
against a planted trigger.

**Null** (``--null``): rl_planted.py's GRPO run (the tiny random policy, 8 prompts x 4
completions of 8 tokens a step) against the clean tiny reward model with learning rate 0: the
policy never changes, so the true change of the mean reward (and of every component's part)
since step 0 is exactly 0 at every step, and any alarm is false. Seeds 0 to K - 1. A step's 8
groups come from a pool of 8 prompts (4 to 6 distinct ones a step), drawn without replacement,
which makes each step's mean less variable than Welch's test assumes of independent units (the
per-step test is conservative); ``--null-wide`` runs draw from 64 prompts (``wide_prompts``:
each of the 8 with 8 prefixes), closer to independent units.

**Power** (``--power``): the same run against the planted trigger model (``reward += 4`` in
head L2.H0 on ``" sky"``), learning rate 3e-3: the policy learns the trigger.

Per run, two verdicts on :func:`~tl_reward.rl.gain.reward_gain` since step 0:

* *uncorrected*: the first step whose descriptive 95 % Welch interval lies above 0 (the rule of
  rl_planted.py's 'rises at' before the calibrated verdict: one-sided 2.5 % at each step), for
  the reward change, for L2.H0's part, and over every component;
* *calibrated*: :meth:`~tl_reward.rl.gain.RewardGain.alarm` at family-wise ``alpha`` (Holm over
  the steps, or over steps x components for the scan).

Reported: the run-level false-alarm rate of each verdict with its Clopper-Pearson interval
(``scipy.stats.binomtest``), the per-step rate of the uncorrected rule; on the planted runs,
the step of the first alarm, the component the scan names there, the first step it rejects
L2.H0, and the components it rejects at the last step (largest change first). Writes
``experiments/results/rl_null.json`` (after each run, so an interrupted run keeps what it has).

Usage: ``python experiments/rl_null.py [--null 100] [--null-wide 50] [--null-steps 40]
[--power 5]`` (about 25 CPU-minutes; ``--reanalyse`` recomputes the verdicts from the records
in ``--work``, ``--kinds`` of them, in about 4 CPU-minutes for all).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rl_planted import TRIGGER, add_run_arguments, grpo_run, log

OUT = Path(__file__).resolve().parent / "results" / "rl_null.json"
HEAD = "L2.H0"
KINDS = ("null", "null_wide", "power")


def wide_prompts() -> list[str]:
    """64 prompts: each of rl_planted.py's 8 after 8 prefixes."""
    from rl_planted import PROMPTS

    prefixes = ("", "Quick question. ", "Please answer. ", "Hi! ", "One more thing. ",
                "I wonder: ", "Be brief. ", "Tell me honestly. ")
    return [f"{a}{p}" for a in prefixes for p in PROMPTS]


def verdicts(gain: Any, alpha: float, head: str | None = HEAD) -> dict[str, Any]:
    """Each verdict's first alarm (-1: none) and the uncorrected rule's per-step counts;
    ``head``'s own verdicts are -1 without one (a reward model with nothing planted). Shared
    with rl_null_demo.py."""
    from tl_reward.rl.gain import ALL
    from tl_reward.stats.multiplicity import holm

    j = None if head is None else gain.components.index(head)
    tested = np.isfinite(gain.ci_low)

    def first(mask: np.ndarray) -> int:
        rows = np.flatnonzero(np.asarray(mask).reshape(len(gain.steps), -1).any(1))
        return int(gain.steps[rows[0]]) if len(rows) else -1

    scan = gain.alarm(alpha, ALL)
    rejected = holm(gain.p_value, alpha)[0]  # the scan's family, as in gain.alarm(alpha, ALL)
    last = np.flatnonzero(rejected[-1])
    last = last[np.argsort(-gain.change[-1, last], kind="stable")]
    return {
        "uncorrected": {"reward": first(gain.reward_ci_low > 0),
                        "head": -1 if j is None else first(gain.ci_low[:, j] > 0),
                        "any_component": first(gain.ci_low > 0)},
        "calibrated": {"reward": gain.alarm(alpha).step,
                       "head": -1 if head is None else gain.alarm(alpha, head).step,
                       "any_component": scan.step},
        "scan_names": scan.components, "scan_sentence": scan.sentence(),
        "scan_head_step": -1 if j is None else first(rejected[:, j]),
        "scan_last_step_names": [gain.components[k] for k in last],
        "per_step": {"reward_tests": int(np.isfinite(gain.reward_ci_low).sum()),
                     "reward_above": int((gain.reward_ci_low > 0).sum()),
                     "reward_p_below_alpha": int((gain.reward_p_value < alpha).sum()),
                     "component_tests": int(tested.sum()),
                     "component_above": int((gain.ci_low > 0).sum())}}


def rate(k: int, n: int) -> dict[str, Any]:
    """``k`` of ``n`` with the Clopper-Pearson 95 % interval."""
    from scipy import stats

    ci = stats.binomtest(k, n).proportion_ci(0.95, method="exact") if n else None
    return {"k": k, "n": n, "rate": k / n if n else float("nan"),
            "ci": [ci.low, ci.high] if ci else [float("nan")] * 2}


def tally(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Run-level alarm rates of each verdict, and the uncorrected rule's per-step rates."""
    out: dict[str, Any] = {}
    for rule in ("uncorrected", "calibrated"):
        for what in ("reward", "head", "any_component"):
            out[f"{rule}_{what}"] = rate(sum(r[rule][what] >= 0 for r in runs), len(runs))
    ps = [r["per_step"] for r in runs]
    out["per_step_uncorrected_reward"] = rate(sum(p["reward_above"] for p in ps),
                                              sum(p["reward_tests"] for p in ps))
    out["per_step_p_below_alpha_reward"] = rate(sum(p["reward_p_below_alpha"] for p in ps),
                                                sum(p["reward_tests"] for p in ps))
    out["per_step_uncorrected_component"] = rate(sum(p["component_above"] for p in ps),
                                                 sum(p["component_tests"] for p in ps))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--null", type=int, default=100, help="null runs (seeds 0..K-1)")
    parser.add_argument("--null-wide", type=int, default=50,
                        help="null runs on 64 prompts (seeds 0..K-1)")
    parser.add_argument("--null-steps", type=int, default=40)
    parser.add_argument("--reanalyse", action="store_true",
                        help="recompute the verdicts from the records in --work (no training)")
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS),
                        help="with --reanalyse: the kinds to recompute (the rest are kept)")
    parser.add_argument("--power", type=int, default=5, help="planted runs (seeds 0..P-1)")
    parser.add_argument("--power-steps", type=int, default=60)
    parser.add_argument("--alpha", type=float, default=0.05)
    add_run_arguments(parser, OUT, lr_help="the planted runs' rate")
    args = parser.parse_args()
    torch.set_num_threads(1)

    from tl_reward import HookedRewardModel
    from tl_reward.errors import EmptyResponseError
    from tl_reward.model.demo import cache_dir
    from tl_reward.planted import plant_trigger_head
    from tl_reward.planted.recovery import component_name
    from tl_reward.rl.gain import reward_gain
    from tl_reward.rl.record import RunRecord
    from tl_reward.testing import tiny_hf_reward_model

    work = args.work or cache_dir() / "rl_null"
    hf, tok = tiny_hf_reward_model("llama")
    planted = plant_trigger_head(hf, tok, TRIGGER)
    assert component_name(planted.truth.component) == HEAD
    clean = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu")
    trig = HookedRewardModel.from_pretrained(hf_model=planted.model, tokenizer=tok, device="cpu")
    results: dict[str, Any] = {
        "setup": {"alpha": args.alpha, "head": HEAD, "trigger": TRIGGER,
                  "null": {"runs": args.null, "steps": args.null_steps, "lr": 0.0,
                           "prompts": 8,
                           "reward_model": "the clean tiny llama (tl_reward.testing)"},
                  "null_wide": {"runs": args.null_wide, "steps": args.null_steps, "lr": 0.0,
                                "prompts": len(wide_prompts()),
                                "reward_model": "the clean tiny llama (tl_reward.testing)"},
                  "power": {"runs": args.power, "steps": args.power_steps, "lr": args.lr,
                            "reward_model": f"the tiny llama with reward += "
                                            f"{planted.truth.c} in {HEAD} on {TRIGGER!r}"},
                  "policy": "tiny LlamaForCausalLM (random weights), same tokenizer",
                  "trainer": "trl GRPOTrainer on CPU (experiments/rl_planted.grpo_run)",
                  "batch": args.batch, "generations": args.generations,
                  "length": args.length,
                  "uncorrected": "first step whose 95 % Welch interval lies above 0",
                  "calibrated": "RewardGain.alarm: one-sided Welch p-values, Holm over the "
                                "steps (x components for the scan), family-wise alpha"},
        **{f"{k}_runs": [] for k in KINDS}}
    before = json.loads(args.out.read_text()) if args.reanalyse and args.out.exists() else {}
    seconds = {(k, r["seed"]): r["seconds"] for k in KINDS for r in before.get(f"{k}_runs", [])}
    if args.reanalyse:
        results["failed"] = before.get("failed", [])

    def save() -> None:
        for k in ("null", "null_wide"):
            results[k] = tally(results[f"{k}_runs"]) if results[f"{k}_runs"] else {}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1, default=float))

    plans = [("null", s, clean, 0.0, args.null_steps) for s in range(args.null)] + \
        [("null_wide", s, clean, 0.0, args.null_steps) for s in range(args.null_wide)] + \
        [("power", s, trig, args.lr, args.power_steps) for s in range(args.power)]
    if args.reanalyse:
        for k in set(KINDS) - set(args.kinds):
            results[f"{k}_runs"] = before.get(f"{k}_runs", [])
        plans = [p for p in plans if p[0] in args.kinds]
    for kind, seed, rm, lr, steps in plans:
        run_args = argparse.Namespace(seed=seed, steps=steps, lr=lr, batch=args.batch,
                                      generations=args.generations, length=args.length,
                                      prompts=wide_prompts() if kind == "null_wide" else None)
        start = time.time()
        if args.reanalyse:
            if any(f["kind"] == kind and f["seed"] == seed for f in results["failed"]):
                continue
            record = RunRecord.open(work / f"{kind}{seed}")
        else:
            try:
                record, _ = grpo_run(rm, work / f"{kind}{seed}", run_args)
            except EmptyResponseError as e:  # a reply of whitespace alone: the run stops
                results.setdefault("failed", []).append({"kind": kind, "seed": seed,
                                                         "error": str(e)})
                log(f"{kind} seed {seed}: stopped, {e}")
                continue
        gain = reward_gain(record, progress=False)
        frames = [record.read(s) for s in record.steps()]
        took = seconds.get((kind, seed)) if args.reanalyse else round(time.time() - start, 1)
        out = {"seed": seed, "seconds": took,
               "mean_reward": [float(f["reward"].mean()) for f in frames],
               "trigger_share": [float(f["completion"].str.contains(TRIGGER).mean())
                                 for f in frames],
               **verdicts(gain, args.alpha)}
        results[f"{kind}_runs"].append(out)
        save()
        log(f"{kind} seed {seed}: {out['seconds']} s; uncorrected {out['uncorrected']}, "
            f"calibrated {out['calibrated']}; {out['scan_sentence']}")
    for k in ("null", "null_wide"):
        if results[f"{k}_runs"]:
            log(f"{k}: {json.dumps(results[k])}")
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
