"""Forward time and peak memory: HookedRewardModel against the HF model's own forward.

Same inputs (HH-RLHF conversations when ../shared is present, else built-in pairs), same batch
size, same run. Each side runs in its own subprocess so peak memory is measured cleanly: on CPU
the resident-set high-water mark above the post-load baseline (reset through
``/proc/self/clear_refs``), on GPU ``torch.cuda.max_memory_allocated`` above the weights.

    python benchmarks/forward.py [--model tl-reward/smollm2-135m-hh] [--n 32] [--batch-size 8]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from memory import peak_mb, start_peak

ROOT = Path(__file__).resolve().parents[1]
HH = ROOT.parent / "shared" / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"


def _conversations(n: int, max_tokens: int, tok: Any) -> list[list[dict[str, str]]]:
    from tl_reward.cli.demo import EXAMPLE_PAIRS
    from tl_reward.data import load_hh_rlhf

    pairs = load_hh_rlhf(HH, limit=4 * n) if HH.exists() else list(EXAMPLE_PAIRS) * n
    convs = [c for p in pairs for c in (p.chosen_conversation(), p.rejected_conversation())]
    keep = [c for c in convs if len(tok.apply_chat_template(c, tokenize=True,
                                                            return_dict=True)["input_ids"])
            <= max_tokens]
    return keep[:n]


def _worker(side: str, args: dict[str, Any], out: Any) -> None:
    torch.set_num_threads(args["threads"])
    from tl_reward import HookedRewardModel
    from tl_reward.model.loading import BUILTIN_MODELS, load_hf_reward_model

    dtype = getattr(torch, args["dtype"])
    name = args["model"]
    if name in BUILTIN_MODELS:
        hf, tok = BUILTIN_MODELS[name](dtype)
    else:
        from transformers import AutoTokenizer

        hf, tok = load_hf_reward_model(name, dtype), AutoTokenizer.from_pretrained(name)
    device = args["device"]
    convs = _conversations(args["n"], args["max_tokens"], tok)
    model = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device=device,
                                              dtype=dtype)
    batches = [model.make_batch(convs[i : i + args["batch_size"]])
               for i in range(0, len(convs), args["batch_size"])]
    if side == "hf":
        runner = hf.to(device)
        del model

        def step(b: Any) -> torch.Tensor:
            return runner(input_ids=b.tokens, attention_mask=b.attention_mask).logits[:, 0]
    else:
        del hf
        runner = model

        def step(b: Any) -> torch.Tensor:
            return runner(b.tokens, attention_mask=b.attention_mask, return_type="score")
    base = start_peak(device)
    times, scores = [], []
    with torch.inference_mode():
        step(batches[0])  # warm-up
        for _ in range(args["repeats"]):
            t0 = time.perf_counter()
            scores = [step(b).float().cpu() for b in batches]
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
    peak = peak_mb(device)
    out.put({"side": side, "seconds": statistics.median(times), "peak_mb": peak - base,
             "n_seqs": len(convs), "n_tokens": int(sum(b.lengths.sum() for b in batches)),
             "scores": torch.cat(scores).tolist()})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tl-reward/smollm2-135m-hh")
    p.add_argument("--n", type=int, default=32, help="number of conversations")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = vars(p.parse_args())
    ctx = mp.get_context("spawn")
    results = {}
    for side in ("hf", "tl"):
        q = ctx.Queue()
        proc = ctx.Process(target=_worker, args=(side, args, q))
        proc.start()
        results[side] = q.get()
        proc.join()
    hf, tl = results["hf"], results["tl"]
    diff = max(abs(a - b) for a, b in zip(hf["scores"], tl["scores"], strict=True))
    print(f"model {args['model']}  device {args['device']}  dtype {args['dtype']}  "
          f"{hf['n_seqs']} sequences, {hf['n_tokens']} tokens, batch {args['batch_size']}")
    print(f"{'':22}{'HF forward':>14}{'HookedRewardModel':>20}{'ratio TL/HF':>14}")
    print(f"{'time per pass (s)':22}{hf['seconds']:14.3f}{tl['seconds']:20.3f}"
          f"{tl['seconds'] / hf['seconds']:14.2f}")
    print(f"{'peak extra memory (MB)':22}{hf['peak_mb']:14.1f}{tl['peak_mb']:20.1f}"
          f"{tl['peak_mb'] / max(hf['peak_mb'], 1e-9):14.2f}")
    print(f"max |score difference| = {diff:.2e}")
    if args["json"]:
        summary = {k: {kk: vv for kk, vv in v.items() if kk != "scores"}
                   for k, v in results.items()}
        args["json"].write_text(json.dumps({**summary, "max_abs_diff": diff,
                                            "config": args}, indent=2, default=str))


if __name__ == "__main__":
    main()
