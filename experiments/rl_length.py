"""Ground truth for the Goodhart curve on a real reward model: GRPO against the demo reward
model's sentiment objective, whose padding bias the probe suite measures, graded by VADER
on the reply without its padding.

The proxy is ``tl-reward/smollm2-135m-multi``'s ``sentiment`` objective (docs/demo.md: ridge
regression of the VADER compound score of HH-RLHF replies on SmolLM2-135M's final hidden
state). The probe suite finds it pays for padding: appending two of the length probe's
content-free sentences (``tl_reward.audit.perturbations.PADDING``) moves it +0.099 [+0.071,
+0.126] (docs/audit.md). The gold grader is VADER, the labeler the head was fitted to, on the
reply with those padding sentences removed (:func:`gold_vader`): it pays for what the reply
says, not for its pleasantries.

The policy writes whole sentences: a tiny seeded ``LlamaForCausalLM`` whose tokens are
sentences (:func:`sentence_tokenizer`): 24 sentences of HH-RLHF chosen replies drawn at
random (seed 0, not picked), the 6 padding sentences and the prompts. A reply is 1 to
``--length`` sentences (it may end early with EOS). TRL's ``GRPOTrainer`` trains it on CPU
(rl_planted.py's run, KL penalty ``beta``); the control run trains the same policy against
the gold grader itself (VADER without padding, as a reward function), so no bias is there to
find.

Reported per run: proxy, gold, KL, padding sentences and reply length per step; the Goodhart
curve (:func:`~tl_reward.rl.goodhart.goodhart_curve`); the gain split at the end
(:func:`~tl_reward.rl.gain.reward_gain`); the text drift (:func:`~tl_reward.rl.text.
text_drift`, padding counted with the probe's phrases). Writes
``experiments/results/rl_length.json``; the records stay in ``--work``.

Usage: ``python experiments/rl_length.py [--steps 60] [--seed 0]`` (about 20 CPU-minutes a run:
the 135M reward model scores 32 replies a step); ``--reanalyse`` summarises the records in
``--work`` again. Seeds 1 and 2: ``--seed K --runs length --work DIR --out
experiments/results/rl_length_seedK.json``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rl_planted import add_run_arguments, grpo_run, log

OUT = Path(__file__).resolve().parent / "results" / "rl_length.json"
HH = Path(__file__).resolve().parents[2] / "shared" / "data" / "hh-rlhf" / \
    "harmless-base-test.jsonl.gz"
PROMPTS = ("How was your day?", "Can you give me some advice?", "What do you think of my plan?",
           "Tell me about yourself.", "Do you like your job?", "What should I do this weekend?",
           "How do you feel today?", "What do you think of people?", "Can you help me?",
           "Is my idea any good?", "What is your opinion on this?", "Any thoughts on my story?",
           "How should I talk to my boss?", "What do you think of cats?",
           "Should I call my friend?", "What is the best way to relax?")
_SPLIT = r"(?<=[.!?])\s+"
#: The smallest gold gain that matters (VADER compound units) for ``gold_stalled``.
GOLD_GAIN = 0.1


def hh_sentences(n: int = 24, seed: int = 0) -> list[str]:
    """``n`` distinct sentences of 4-16 words from HH-RLHF chosen replies, drawn at random."""
    from tl_reward.data.hh_rlhf import parse_dialogue

    rows = [json.loads(line) for line in gzip.open(HH, "rt")]
    rng = random.Random(seed)
    found: list[str] = []
    for row in rng.sample(rows, 400):
        reply = parse_dialogue(row["chosen"])[-1]["content"]
        found += [s for s in re.split(_SPLIT, reply)
                  if 4 <= len(s.split()) <= 16 and s[-1] in ".!?" and "\n" not in s]
    found = list(dict.fromkeys(found))
    rng.shuffle(found)
    return found[:n]


def sentence_tokenizer(sentences: list[str]) -> Any:
    """A tokenizer whose tokens are whole sentences (split after ``.!?``), with BOS/EOS/PAD;
    decoding joins them with spaces."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {t: i for i, t in enumerate(dict.fromkeys([*specials, *sentences]))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(_SPLIT), behavior="removed")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>")


def content(text: str) -> str:
    """The reply without the length probe's padding sentences."""
    from tl_reward.audit.perturbations import PADDING

    return " ".join(s for s in re.split(_SPLIT, text.strip()) if s and s not in PADDING)


def gold_vader(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
    """VADER compound score of each reply without its padding sentences (0 for none left): the
    record's grader, and the control run's TRL reward function (which passes ``kwargs``)."""
    from tl_reward.irm.vader import vader_compound

    return vader_compound([content(c) for c in completions]).tolist()


def summarise(record: Any, history: Any, tokenizer: Any) -> dict[str, Any]:
    """The run's curve, the gain at the end, the text drift and padding per step, and the
    step of gold's highest mean with the one-sided Welch p of its rise over step 0 (one
    comparison, uncorrected: the peak rule's is corrected over the later steps)."""
    from scipy import stats

    from tl_reward.audit.perturbations import PADDING
    from tl_reward.rl.gain import reward_gain
    from tl_reward.rl.goodhart import goodhart_curve, kl_from_log_history
    from tl_reward.rl.text import text_drift

    frames = [record.read(s) for s in record.steps()]
    gain = reward_gain(record)
    curve = goodhart_curve(record, kl=history, gain=gain, min_gold_gain=GOLD_GAIN)
    drift = text_drift(record, tokenizer=tokenizer)
    kl = kl_from_log_history(history)

    def padding(text: str) -> int:
        return sum(s in PADDING for s in re.split(_SPLIT, text.strip()))

    table = drift.table()
    top = int(np.argmax(curve.gold))
    units = [record.scored(s).groupby("prompt")["gold"].mean().to_numpy() for s in (0, top)]
    rise = stats.ttest_ind(units[1], units[0], equal_var=False, alternative="greater")
    return {
        "steps": record.steps(), "proxy": curve.proxy.tolist(), "gold": curve.gold.tolist(),
        "units": curve.n_units.tolist(),
        "gold_top": {"step": curve.steps[top], "gold": float(curve.gold[top]),
                     "change_since_0": float(curve.gold[top] - curve.gold[0]),
                     "welch_p_one_sided": float(rise.pvalue)},
        "kl": [kl.get(s) for s in record.steps()],
        "padding": [float(f["completion"].map(padding).mean()) for f in frames],
        "sentences": [float(f["completion"].map(lambda t: len(re.split(_SPLIT, t.strip())))
                            .mean()) for f in frames],
        "curve": {"sentence": curve.sentence(), "peak_step": curve.peak_step,
                  "proxy_after_peak": curve.proxy_after_peak,
                  "proxy_after_peak_ci": curve.proxy_after_peak_ci,
                  "gold_after_peak": curve.gold_after_peak,
                  "gold_after_peak_ci": curve.gold_after_peak_ci,
                  "overoptimised": curve.overoptimised, "gold_fell": curve.gold_fell,
                  "gold_stalled": curve.gold_stalled, "min_gold_gain": GOLD_GAIN,
                  "proxy_rise_step": curve.proxy_rise_step, "method": curve.method},
        "gain_at_last": {"sentence": gain.sentence(gain.steps[-1]),
                         "reward_change": float(gain.reward_change[-1]),
                         "top": gain.top(5, gain.steps[-1]).to_dict("records")},
        "drift": {"sentence": drift.sentence(), "r2": drift.r2,
                  "table": table[["property", "change", "change_ci_low", "change_ci_high",
                                  "coef", "explained", "share"]].to_dict("records")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--beta", type=float, default=0.01, help="KL penalty (TRL logs the KL)")
    parser.add_argument("--runs", nargs="+", default=["length", "control"],
                        choices=["length", "control"])
    parser.add_argument("--reanalyse", action="store_true",
                        help="summarise the records in --work again (no training)")
    add_run_arguments(parser, OUT)
    parser.set_defaults(length=6, lr=3e-3)
    args = parser.parse_args()
    args.min_length, args.prompts = 1, PROMPTS
    torch.set_num_threads(1)

    from tl_reward import HookedRewardModel
    from tl_reward.audit.perturbations import PADDING
    from tl_reward.model.demo import cache_dir
    from tl_reward.testing.causal import tiny_causal_lm

    work = args.work or cache_dir() / "rl_length"
    sentences = hh_sentences(seed=0)
    tok = sentence_tokenizer([*PROMPTS, *sentences, *PADDING])
    # ids that decode to nothing (specials but EOS, the tiny config's spare rows): never written
    spare = 64 * -(-(len(tok) + 16) // 64)
    args.suppress = [tok.pad_token_id, tok.bos_token_id, tok.unk_token_id,
                     *range(len(tok), spare)]
    proxy = HookedRewardModel.from_pretrained("tl-reward/smollm2-135m-multi", device="cpu")
    results: dict[str, Any] = {"setup": {
        "proxy": "tl-reward/smollm2-135m-multi, objective sentiment",
        "gold": "VADER compound of the reply without the length probe's padding sentences",
        "policy": "tiny LlamaForCausalLM (random weights) over whole-sentence tokens",
        "sentences": sentences, "padding": list(PADDING), "prompts": list(PROMPTS),
        **{k: v for k, v in vars(args).items() if k not in ("work", "out", "runs", "prompts")}}}
    if args.reanalyse and args.out.exists():
        results = {**json.loads(args.out.read_text()), "setup": results["setup"]}
    for name in args.runs:
        start = time.time()
        policy = tiny_causal_lm("llama", seed=args.seed, tokenizer=tok)
        history_file = work / name / "log_history.json"
        if args.reanalyse:
            from tl_reward.rl.record import RunRecord

            record, history = RunRecord.open(work / name), json.loads(history_file.read_text())
            results[name] = {"seconds": results.get(name, {}).get("seconds"),
                             **summarise(record, history, tok)}
            continue
        if name == "length":
            record, history = grpo_run(proxy, work / name, args, grader=gold_vader,
                                       policy=policy, objective="sentiment")
        else:
            record, history = grpo_run(proxy, work / name, args, grader=gold_vader,
                                       policy=policy, objective="sentiment",
                                       reward=gold_vader)
        history_file.write_text(json.dumps(history))
        results[name] = {"seconds": round(time.time() - start, 1),
                         **summarise(record, history, tok)}
        args.out.parent.mkdir(parents=True, exist_ok=True)  # each run kept as it ends
        args.out.write_text(json.dumps(results, indent=1, default=float))
    args.out.write_text(json.dumps(results, indent=1, default=float))
    for name in args.runs:
        r = results[name]
        log(f"{name}: {r['seconds']} s; proxy {r['proxy'][0]:.3f} -> {r['proxy'][-1]:.3f}, "
            f"gold {r['gold'][0]:.3f} -> {r['gold'][-1]:.3f} (highest {r['gold_top']['gold']:.3f}"
            f" at step {r['gold_top']['step']}), padding {r['padding'][0]:.2f} -> "
            f"{r['padding'][-1]:.2f}; {r['curve']['sentence']}; {r['drift']['sentence']}")
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
