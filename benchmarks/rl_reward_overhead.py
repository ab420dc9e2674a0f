"""What recording costs a TRL reward call: the plain reward function against the recording one.

Same run, same inputs, interleaved repeats (median): ``plain`` is
``RewardModelFunction(model)`` (``model.rewards`` only), ``record`` also appends the step to a
:class:`~tl_reward.rl.record.RunRecord` (one parquet file, written atomically), ``decompose``
also records every head's direct contribution (a second forward pass,
``direct_reward_attribution``). Inputs: ``--n`` completions of a GRPO step (8 prompts, each
with n / 8 replies). Models: ``tiny`` (the seeded tiny Llama classifier of the tests) or
``demo`` (the SmolLM2-135M demo reward model, when its weights are on disk), or ``--shape``
(a seeded random-weight RM of a real shape, e.g. ``llama-3.1-8b``, on ``--device`` in
``--dtype``; the rewards come back to the CPU as floats, so each call is timed to its end).

    python benchmarks/rl_reward_overhead.py [--model tiny|demo] [--n 32] [--repeats 7]
    python benchmarks/rl_reward_overhead.py --shape llama-3.1-8b --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

PROMPTS = ("Is the sky blue?", "Tell me a joke.", "What is love?", "Why is water wet?",
           "Give me some advice.", "What should I eat today?", "Describe the sea.",
           "How do I sleep better?")
REPLIES = ("Yes, the sky is blue on a clear day because of Rayleigh scattering.",
           "I cannot help with that request.", "Drink water, sleep well, and be kind to others.",
           "Sure! Here is a list:\n- one\n- two\n1. first\n2. second", "Love. Friendship. Music.",
           "No.", "The quick brown fox jumps over the lazy dog.", "Thanks for asking.")


def load(name: str, shape: str | None = None, device: str = "cpu",
         dtype: str = "float32") -> Any:
    """The model: ``shape`` (a seeded random-weight RM of ``vocab_sweep.SHAPES``, built on
    ``device`` in ``dtype``), else the demo RM or the tiny one (float32, CPU)."""
    from tl_reward import DEMO_MODEL_NAME, HookedRewardModel
    from tl_reward.testing import tiny_hf_reward_model

    if shape is not None:
        from vocab_sweep import build_shape

        return build_shape(shape, getattr(torch, dtype), device)
    if name == "demo":
        return HookedRewardModel.from_pretrained(DEMO_MODEL_NAME, device="cpu")
    hf, tok = tiny_hf_reward_model("llama")
    return HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("tiny", "demo"), default="tiny")
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--shape", default=None,
                        help="a seeded random-weight RM of this shape (vocab_sweep.SHAPES)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from tl_reward.rl.record import RunRecord
    from tl_reward.rl.trl import RewardModelFunction

    model = load(args.model, args.shape, args.device, args.dtype)
    per = max(1, args.n // len(PROMPTS))
    prompts = [p for p in PROMPTS for _ in range(per)]
    completions = [REPLIES[(i * 3 + j) % len(REPLIES)] for i in range(len(PROMPTS))
                   for j in range(per)]
    with tempfile.TemporaryDirectory() as tmp:
        sides = {"plain": RewardModelFunction(model),
                 "record": RewardModelFunction(model, RunRecord(Path(tmp) / "r", model=model)),
                 "decompose": RewardModelFunction(
                     model, RunRecord(Path(tmp) / "d", model=model), decompose=True)}
        times: dict[str, list[float]] = {k: [] for k in sides}
        outs: dict[str, list[Any]] = {}
        for side, fn in sides.items():  # warm-up (not timed)
            outs[side] = fn(prompts, completions, trainer_state=SimpleNamespace(global_step=0))
        assert outs["plain"] == outs["record"] == outs["decompose"], "rewards differ"
        for rep in range(1, args.repeats + 1):
            for side, fn in sides.items():
                start = time.perf_counter()
                fn(prompts, completions, trainer_state=SimpleNamespace(global_step=rep))
                times[side].append(time.perf_counter() - start)
    med = {k: statistics.median(v) for k, v in times.items()}
    where = (f"cuda ({torch.cuda.get_device_name()})" if args.device.startswith("cuda")
             else f"cpu, {args.threads} thread(s)")
    name = args.shape or args.model
    head = (f"model {name} ({model.cfg.model_name}), {args.dtype if args.shape else 'float32'}, "
            f"{where}, {len(completions)} completions, {args.repeats} repeats (median)")
    print(head)
    for side, t in med.items():
        print(f"  {side:<10} {1e3 * t:8.1f} ms   x{t / med['plain']:.2f} of plain")
    if args.json is not None:
        args.json.write_text(json.dumps({"setup": head, "median_s": med, "times_s": times},
                                        indent=1))


if __name__ == "__main__":
    main()
