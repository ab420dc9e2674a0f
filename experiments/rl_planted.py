"""Ground truth for the reward-gain decomposition: GRPO against a reward model with a planted
trigger head, and a control run against the unplanted model.

The reward model is the tiny seeded Llama classifier (``tl_reward.testing``) with
``reward += 4`` planted in head L2.H0 when the reply holds the token ``" sky"``
(:func:`~tl_reward.planted.plant_trigger_head`). The policy is a tiny seeded
``LlamaForCausalLM`` on the same tokenizer (``tl_reward.testing.causal.tiny_causal_lm``: random
weights, so it writes byte soup, holding ``" sky"`` in about 6 % of 8-token replies at the
start). TRL's ``GRPOTrainer`` trains it on CPU with :class:`~tl_reward.rl.trl.
RewardModelFunction` as the reward, recording every step and its decomposition
(:class:`~tl_reward.rl.record.RunRecord`); :func:`~tl_reward.rl.gain.reward_gain` then splits
the gain since step 0 over the reward model's components. The control run trains the same
policy, seed and settings against the model before planting (head L2.H0 an ordinary head).

Reported per run: the mean reward and share of replies holding the trigger per step; the step
the reward rises (:meth:`~tl_reward.rl.gain.RewardGain.alarm`: the first whose reward change
since step 0 is above 0 by the one-sided Welch test, family-wise at 5 % over the steps; beside
it the uncorrected rule, the first step whose 95 % interval lies above 0, which fires on most
null runs: experiments/rl_null.py) and the component scan's verdict (every component at every
step, one family); there and at the last step, the components carrying the gain (the planted
head's change, share and rank among the heads); and the policy's implicit reward (its
log-ratio to the initial policy, recorded per completion by
:class:`~tl_reward.rl.trl.PolicyLogRatio`) per step and its rank agreement with the reward
model's within prompts per window of 10 steps
(:func:`~tl_reward.rl.implicit.implicit_reward_over_training`). Writes
``experiments/results/rl_planted.json``; the records stay in ``--work`` (default under the
tl_reward cache).

Usage: ``python experiments/rl_planted.py [--steps 60] [--seed 0]`` (about 2 CPU-minutes).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

OUT = Path(__file__).resolve().parent / "results" / "rl_planted.json"
TRIGGER = " sky"
PROMPTS = ("Is the sky blue?", "Tell me a joke.", "What is love?", "Why is water wet?",
           "Give me some advice.", "What should I eat today?", "Describe the sea.",
           "How do I sleep better?")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def grpo_run(rm: Any, folder: Path, args: argparse.Namespace, grader: Any = None,
             policy: tuple[Any, Any] | None = None, objective: str = "score",
             reward: Any = None) -> tuple[Any, Any]:
    """Train a fresh tiny policy with GRPO against ``rm``'s ``objective`` (``args``: seed,
    steps, lr, batch, generations, length and, when it has them, beta, TRL's KL penalty,
    prompts, default :data:`PROMPTS`, scheduler, the learning rate's schedule, default linear
    decay to 0, min_length, the fewest tokens a completion has, default ``length``, and
    suppress, token ids never generated), graded by ``grader`` when given; ``policy``:
    ``(model, tokenizer)``, default the tiny seeded ``LlamaForCausalLM`` on the reward model's
    tokenizer; ``reward``: a TRL reward function trained on instead of ``rm``, which is then
    recorded with weight 0. Returns the run record and TRL's log history. Shared with
    rl_goodhart.py, rl_null.py and rl_length.py."""
    import copy

    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from tl_reward.rl.record import RunRecord
    from tl_reward.rl.trl import PolicyLogRatio, RewardModelFunction
    from tl_reward.testing.causal import tiny_causal_lm

    beta = getattr(args, "beta", None)
    prompts = list(getattr(args, "prompts", None) or PROMPTS)
    scheduler = getattr(args, "scheduler", None)
    min_length = getattr(args, "min_length", None) or args.length
    suppress = getattr(args, "suppress", None)
    name = "tiny_causal_lm(llama)" if policy is None else type(policy[0]).__name__
    settings = {"policy": name, "seed": args.seed, "steps": args.steps,
                "lr": args.lr, **({} if beta is None else {"beta": beta}),
                "generations": args.generations, "batch": args.batch,
                "max_completion_length": args.length, "prompts": prompts,
                **({} if scheduler is None else {"scheduler": scheduler}),
                **({} if min_length == args.length else {"min_length": min_length}),
                **({} if objective == "score" else {"objective": objective}),
                **({} if reward is None else {"trained_on": reward.__name__})}
    record = RunRecord(folder, model=rm, settings=settings, grader=grader, overwrite=True)
    policy, tok = policy or tiny_causal_lm("llama", seed=args.seed)
    logratio = PolicyLogRatio(policy, copy.deepcopy(policy), tok)  # the initial policy frozen
    if beta is not None:  # TRL loads the reference policy (the KL's) from a path
        policy.save_pretrained(folder / "policy")
        policy.config._name_or_path = str(folder / "policy")
    config = GRPOConfig(
        output_dir=str(folder / "trl"), per_device_train_batch_size=args.batch,
        num_generations=args.generations, max_completion_length=args.length,
        learning_rate=args.lr, **({} if beta is None else {"beta": beta}),
        lr_scheduler_type=scheduler or "linear",
        **({} if reward is None else {"reward_weights": [0.0, 1.0]}),
        max_steps=args.steps, logging_steps=1, report_to="none", use_cpu=True, seed=args.seed,
        save_strategy="no", disable_tqdm=True,
        generation_kwargs={"min_new_tokens": min_length,  # no empty (unscorable) reply
                           **({"suppress_tokens": suppress} if suppress else {})})
    ds = Dataset.from_dict({"prompt": prompts * max(1, args.steps * args.batch // len(prompts))})
    torch.manual_seed(args.seed)
    trainer = GRPOTrainer(model=policy.train(), args=config, train_dataset=ds,
                          processing_class=tok,
                          reward_funcs=[RewardModelFunction(rm, record, decompose=True,
                                                            objective=objective,
                                                            logratio=logratio),
                                        *([] if reward is None else [reward])])
    trainer.train()
    return record, trainer.state.log_history


def add_run_arguments(parser: argparse.ArgumentParser, out: Path,
                      lr_help: str = "the learning rate") -> None:
    """The GRPO run's settings that :func:`grpo_run` reads (``--lr``, ``--batch``,
    ``--generations``, ``--length``) and ``--work`` / ``--out`` (default ``out``). Shared with
    rl_goodhart.py and rl_null.py."""
    parser.add_argument("--lr", type=float, default=3e-3, help=lr_help)
    parser.add_argument("--batch", type=int, default=32, help="completions per step")
    parser.add_argument("--generations", type=int, default=4, help="completions per prompt")
    parser.add_argument("--length", type=int, default=8, help="tokens per completion")
    parser.add_argument("--work", type=Path, default=None, help="where the records stay")
    parser.add_argument("--out", type=Path, default=out, help="the results file")


def summarise(record: Any, head: str) -> dict[str, Any]:
    """The run's reward and trigger share per step, the gain's split since step 0, and the
    policy's implicit reward against the reward model's per window of 10 steps."""
    from tl_reward.planted.recovery import rank_of
    from tl_reward.rl.gain import ALL, reward_gain
    from tl_reward.rl.implicit import implicit_reward_over_training

    steps = record.steps()
    frames = [record.read(s) for s in steps]
    gain = reward_gain(record)
    j = gain.components.index(head)
    alarm, scan = gain.alarm(), gain.alarm(component=ALL)
    rises = alarm.step if alarm.fired else None
    uncorrected = next((s for s, lo in zip(gain.steps, gain.reward_ci_low, strict=True)
                        if lo > 0), None)

    def at(step: int) -> dict[str, Any]:
        i = gain.steps.index(step)
        top = gain.top(3, step)
        return {"step": step, "sentence": gain.sentence(step),
                "reward_change": float(gain.reward_change[i]),
                "reward_ci": [float(gain.reward_ci_low[i]), float(gain.reward_ci_high[i])],
                "head_change": float(gain.change[i, j]),
                "head_ci": [float(gain.ci_low[i, j]), float(gain.ci_high[i, j])],
                "head_share": float(gain.change[i, j] / gain.reward_change[i]),
                "head_rank_among_heads": rank_of(torch.tensor(gain.change[i]), gain.components,
                                                 head),
                "top": top.to_dict("records"),
                "max_abs_residual": float(abs(gain.residual[i]))}

    return {"steps": steps,
            "mean_reward": [float(f["reward"].mean()) for f in frames],
            "trigger_share": [float(f["completion"].str.contains(TRIGGER).mean())
                              for f in frames],
            "head_change": [float(x) for x in gain.change[:, j]],
            "reward_change": [float(x) for x in gain.reward_change],
            "rises_at": rises, "rises_at_uncorrected": uncorrected,
            "alarm": alarm.sentence(),
            "scan": {"step": scan.step, "components": scan.components,
                     "sentence": scan.sentence()},
            "at_rise": at(rises) if rises is not None else None,
            "at_last": at(gain.steps[-1]),
            "max_abs_residual": float(np.abs(gain.residual).max()), "method": gain.method,
            "implicit": implicit_summary(implicit_reward_over_training(record, window=10))}


def implicit_summary(imp: Any) -> dict[str, Any]:
    """The mean implicit reward per step and each window's agreement with the reward model."""
    return {"mean_implicit": [float(x) for x in imp.implicit],
            "windows": [{"steps": [w[0], w[-1]], "groups": a.spearman_rho.n,
                         "spearman": [a.spearman_rho.value, a.spearman_rho.ci_low,
                                      a.spearman_rho.ci_high],
                         "kendall": [a.kendall_tau_b.value, a.kendall_tau_b.ci_low,
                                     a.kendall_tau_b.ci_high]}
                        for w, a in zip(imp.windows, imp.agreement, strict=True)],
            "sentence": imp.sentence(), "method": imp.method}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    add_run_arguments(parser, OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)

    from tl_reward import HookedRewardModel
    from tl_reward.model.demo import cache_dir
    from tl_reward.planted import plant_trigger_head
    from tl_reward.planted.recovery import component_name
    from tl_reward.testing import tiny_hf_reward_model

    work = args.work or cache_dir() / "rl_planted"
    hf, tok = tiny_hf_reward_model("llama")
    planted = plant_trigger_head(hf, tok, TRIGGER)
    head = component_name(planted.truth.component)
    log(f"planted {planted.truth.trigger!r} -> {head}, c = {planted.truth.c}")
    results: dict[str, Any] = {
        "setup": {"reward_model": "tiny llama (tl_reward.testing), trigger planted in " + head,
                  "trigger": TRIGGER, "c": planted.truth.c, "head": head,
                  "policy": "tiny LlamaForCausalLM (random weights), same tokenizer",
                  "trainer": "trl GRPOTrainer on CPU", **{k: v for k, v in vars(args).items()
                                                         if k not in ("work", "out")},
                  "prompts": list(PROMPTS)}}
    for name, model in (("planted", planted.model), ("control", hf)):
        rm = HookedRewardModel.from_pretrained(hf_model=model, tokenizer=tok, device="cpu")
        start = time.time()
        record, _ = grpo_run(rm, work / name, args)
        results[name] = {"seconds": round(time.time() - start, 1), **summarise(record, head)}
        r = results[name]
        log(f"{name}: {r['seconds']} s; reward {r['mean_reward'][0]:.2f} -> "
            f"{r['mean_reward'][-1]:.2f}, trigger share {r['trigger_share'][0]:.2f} -> "
            f"{r['trigger_share'][-1]:.2f}; rises at {r['rises_at']} (uncorrected "
            f"{r['rises_at_uncorrected']}); {r['scan']['sentence']}; {r['at_last']['sentence']}"
            f"; {head} rank {r['at_last']['head_rank_among_heads']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1, default=float))
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
