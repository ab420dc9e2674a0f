"""False alarms of the reward-gain and Goodhart verdicts on the demo reward model, with replies
of a real policy: null runs resampled from one scored pool.

The reward model is ``tl-reward/smollm2-135m-hh`` (30 layers of 9 heads: 332 components at the
head level); the policy is SmolLM2-135M-Instruct (the demo RM's own backbone as a chat model,
sampling at temperature 1, replies of at most ``--length`` tokens) answering the first human
turn of HH-RLHF harmless-base test conversations. The pool: ``--per-prompt`` replies to each of
``--prompts`` prompts, scored once through :class:`~tl_reward.rl.trl.RewardModelFunction`
(``decompose=True``: the reward and every head's direct contribution, as a training run records
them) and graded by VADER (the compound score of the reply, a gold grader of another kind).

A null run is a policy that never changes (GRPO at learning rate 0): each of its ``--steps``
steps holds ``--groups`` prompts drawn without replacement, each with ``--generations`` replies
drawn with replacement from that prompt's pool, so every step is an independent draw from one
distribution and the true change of the mean reward (of every component's part, of gold) since
step 0 is exactly 0. Any alarm is false. Per null run (seeds 0 to K - 1):
:meth:`~tl_reward.rl.gain.RewardGain.alarm` on the reward and over every component (Holm over
steps x components), the uncorrected rule (the first step whose 95 % interval lies above 0), and
:func:`~tl_reward.rl.goodhart.goodhart_curve`'s peak (moved off step 0), ``overoptimised``,
``gold_fell`` and ``gold_stalled`` (``--min-gain``, in gold's sd units over the pool). Rates
with Clopper-Pearson intervals. Writes ``experiments/results/rl_null_demo.json``.

Usage: ``python experiments/rl_null_demo.py [--runs 200]`` (the pool: about 6 CPU-minutes, kept
in ``--work``; the runs: about 2 CPU-seconds each).
"""

from __future__ import annotations

import argparse
import gzip
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rl_length import HH
from rl_null import rate, verdicts
from rl_planted import log

OUT = Path(__file__).resolve().parent / "results" / "rl_null_demo.json"


def hh_prompts(n: int, max_words: int = 30) -> list[str]:
    """The first human turn of the first ``n`` HH-RLHF harmless-base test conversations whose
    turn has at most ``max_words`` words (distinct)."""
    from tl_reward.data.hh_rlhf import parse_dialogue

    out: list[str] = []
    for line in gzip.open(HH, "rt"):
        turn = parse_dialogue(json.loads(line)["chosen"])[0]["content"]
        if turn and len(turn.split()) <= max_words and turn not in out:
            out.append(turn)
        if len(out) == n:
            return out
    raise SystemExit(f"only {len(out)} prompts of at most {max_words} words in {HH}")


def sample_pool(prompts: list[str], per_prompt: int, length: int, seed: int
                ) -> tuple[list[str], list[str]]:
    """``per_prompt`` SmolLM2-135M-Instruct replies to each prompt (chat template, temperature
    1); replies that come out empty are drawn again."""
    from tl_reward.model.demo import load_smollm2

    lm, tok = load_smollm2()
    tok.padding_side = "left"
    torch.manual_seed(seed)
    ps, cs = [], []
    for i, p in enumerate(prompts):
        text = tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                       add_generation_prompt=True)
        enc = tok([text] * per_prompt, return_tensors="pt")
        replies: list[str] = []
        while len(replies) < per_prompt:
            with torch.no_grad():
                out = lm.generate(**enc, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                                  max_new_tokens=length, pad_token_id=tok.pad_token_id)
            new = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
            replies += [r.strip() for r in new if r.strip()]
        ps += [p] * per_prompt
        cs += replies[:per_prompt]
        if (i + 1) % 8 == 0:
            log(f"sampled {i + 1} of {len(prompts)} prompts")
    return ps, cs


def gold_vader_reply(prompts: list[Any], completions: list[Any]) -> list[float]:
    """VADER compound score of each reply."""
    from tl_reward.irm.vader import vader_compound

    return vader_compound([str(c) for c in completions]).tolist()


def null_run(pool: Any, names: list[str], seed: int, args: argparse.Namespace,
             folder: Path, min_gain: float) -> dict[str, Any]:
    """One null run resampled from the pool; its verdicts."""
    from tl_reward.rl.gain import reward_gain
    from tl_reward.rl.goodhart import goodhart_curve
    from tl_reward.rl.record import RunRecord

    rng = np.random.default_rng(seed)
    by_prompt = pool.groupby("prompt").indices
    keys = sorted(by_prompt)
    values = pool[names].to_numpy(np.float64)
    rec = RunRecord(folder, model=None, settings={"null": seed}, overwrite=True)
    for step in range(args.steps):
        rows = np.concatenate([rng.choice(by_prompt[keys[k]], args.generations)
                               for k in rng.choice(len(keys), args.groups, replace=False)])
        sub = pool.iloc[rows]
        rec.append(step, sub["prompt"].tolist(), sub["completion"].tolist(),
                   rewards=sub["reward"].tolist(), gold=sub["gold"].tolist(),
                   components=(values[rows], [n[4:] for n in names]))
    gain = reward_gain(rec, progress=False)
    curve = goodhart_curve(rec, gain=gain, min_gold_gain=min_gain)
    v = verdicts(gain, args.alpha, head=None)
    return {"seed": seed, "reward": v["calibrated"]["reward"],
            "any_component": v["calibrated"]["any_component"], "scan_names": v["scan_names"],
            "uncorrected_reward": v["uncorrected"]["reward"],
            "uncorrected_any_component": v["uncorrected"]["any_component"],
            "peak": curve.peak_step, "overoptimised": curve.overoptimised,
            "gold_fell": curve.gold_fell, "gold_stalled": bool(curve.gold_stalled),
            "components": len(gain.components)}


#: A run's verdicts that are a first step (-1: none), and those that are flags.
STEPS = ("reward", "any_component", "uncorrected_reward", "uncorrected_any_component")
FLAGS = ("overoptimised", "gold_fell", "gold_stalled")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--groups", type=int, default=8, help="prompts a step")
    parser.add_argument("--generations", type=int, default=4, help="replies a prompt a step")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--per-prompt", type=int, default=8, help="pool replies a prompt")
    parser.add_argument("--length", type=int, default=48, help="reply tokens at most")
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--min-gain", type=float, default=0.25,
                        help="gold_stalled's smallest gain, in gold's sd units over the pool")
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)

    from tl_reward import HookedRewardModel
    from tl_reward.model.demo import cache_dir
    from tl_reward.rl.record import COMPONENT_PREFIX, RunRecord
    from tl_reward.rl.trl import RewardModelFunction

    work = args.work or cache_dir() / "rl_null_demo"
    pool_dir = work / "pool"
    if not (pool_dir / "manifest.json").exists() or not RunRecord.open(pool_dir).steps():
        start = time.time()
        prompts, completions = sample_pool(hh_prompts(args.prompts), args.per_prompt,
                                           args.length, seed=0)
        log(f"sampled {len(completions)} replies in {time.time() - start:.0f} s")
        rm = HookedRewardModel.from_pretrained("tl-reward/smollm2-135m-hh", device="cpu")
        rec = RunRecord(pool_dir, model=rm, settings={"pool": vars(args) | {"work": None,
                                                                            "out": None}},
                        grader=gold_vader_reply, overwrite=True)
        RewardModelFunction(rm, rec, decompose=True)(prompts=prompts, completions=completions)
        log(f"pool scored in {time.time() - start:.0f} s")
    pool = RunRecord.open(pool_dir).read(0)
    names = [c for c in pool.columns if c.startswith(COMPONENT_PREFIX)]
    sd = float(pool["gold"].std())
    results: dict[str, Any] = {
        "setup": {"reward_model": "tl-reward/smollm2-135m-hh", "components": len(names),
                  "policy": "SmolLM2-135M-Instruct, temperature 1", "gold": "VADER compound",
                  "pool": len(pool), "gold_sd": sd, "reward_sd": float(pool["reward"].std()),
                  **{k: v for k, v in vars(args).items() if k not in ("work", "out")}},
        "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.runs):
            results["runs"].append(null_run(pool, names, seed, args, Path(tmp) / "run",
                                            args.min_gain * sd))
            if (seed + 1) % 20 == 0 or seed + 1 == args.runs:
                runs = results["runs"]
                results["rates"] = {
                    **{k: rate(sum(r[k] >= 0 for r in runs), len(runs)) for k in STEPS},
                    **{k: rate(sum(r[k] for r in runs), len(runs)) for k in FLAGS}}
                results["rates"]["peak_moved"] = rate(sum(r["peak"] > 0 for r in runs),
                                                      len(runs))
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(results, indent=1, default=float))
                log(f"{len(runs)} runs: " + ", ".join(
                    f"{k} {v['rate']:.3f}" for k, v in results["rates"].items()))
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
