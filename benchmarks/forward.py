"""Forward time and peak memory: HookedRewardModel against the HF model's own forward.

Same inputs (HH-RLHF conversations when ../shared is present, else built-in pairs), same batch
size, same run. Each side runs in its own subprocess where only its model is alive, so peak
memory is measured cleanly: on CPU the resident-set high-water mark above the post-load
baseline (reset through ``/proc/self/clear_refs``), on GPU ``torch.cuda.max_memory_allocated``
above the weights. Sides: ``hf`` (HF's forward), ``tl`` (``HookedRewardModel``, fused attention
where the backend offers it and no hook needs the pattern) and ``tl-materialised`` (the same
with ``fused_attention = False``: TransformerLens's attention, every pattern materialised;
where the backend has no such switch it runs the same path as ``tl``). The printed header and
the JSON name the model, device (and GPU), dtype, threads and the batch.

    python benchmarks/forward.py [--model tl-reward/smollm2-135m-hh] [--n 32] [--batch-size 8]
    python benchmarks/forward.py --interleaved --threads 1 --n 16 --repeats 7   # time only
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from alone import run_alone
from memory import peak_mb, start_peak

ROOT = Path(__file__).resolve().parents[1]
SIDES = ("hf", "tl", "tl-materialised")
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


def _measure(side: str, args: dict[str, Any], out: Any) -> None:
    """Load the model, keep only ``side``'s, time its passes and put the figures on ``out``."""
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
        if side == "tl-materialised" and hasattr(model, "fused_attention"):
            model.fused_attention = False

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
    name = torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu"
    out.put({"side": side, "seconds": statistics.median(times), "peak_mb": peak - base,
             "device_name": name, "fused_attention": getattr(runner, "fused_attention", None),
             "n_seqs": len(convs), "n_tokens": int(sum(b.lengths.sum() for b in batches)),
             "scores": torch.cat(scores).tolist()})


def _interleaved(args: dict[str, Any]) -> dict[str, float]:
    """Median seconds per pass of each side, the sides taking turns pass by pass in one process
    (HF's model and the hooked one both alive: time only), so machine drift hits them alike."""
    torch.set_num_threads(args["threads"])
    from tl_reward import HookedRewardModel
    from tl_reward.model.loading import BUILTIN_MODELS

    dtype = getattr(torch, args["dtype"])
    hf, tok = BUILTIN_MODELS[args["model"]](dtype)
    model = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device=args["device"],
                                              dtype=dtype)
    hf = hf.to(args["device"])
    convs = _conversations(args["n"], args["max_tokens"], tok)
    batches = [model.make_batch(convs[i : i + args["batch_size"]])
               for i in range(0, len(convs), args["batch_size"])]

    def run(side: str) -> None:
        model.fused_attention = side == "tl"
        for b in batches:
            if side == "hf":
                hf(input_ids=b.tokens, attention_mask=b.attention_mask)
            else:
                model(b.tokens, attention_mask=b.attention_mask, return_type="score")
        if args["device"].startswith("cuda"):
            torch.cuda.synchronize()

    times: dict[str, list[float]] = {side: [] for side in SIDES}
    with torch.inference_mode():
        for side in SIDES:
            run(side)  # warm-up
        for _ in range(args["repeats"]):
            for side in SIDES:
                t0 = time.perf_counter()
                run(side)
                times[side].append(time.perf_counter() - t0)
    return {side: statistics.median(t) for side, t in times.items()}


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
    p.add_argument("--interleaved", action="store_true",
                   help="time only: the sides take turns in one process (a built-in model)")
    args = vars(p.parse_args())
    if args.pop("interleaved"):
        med = _interleaved(args)
        print(f"model {args['model']}  device {args['device']}  dtype {args['dtype']}  threads "
              f"{args['threads']}  {args['n']} conversations, batch {args['batch_size']}; "
              f"sides taking turns in one process, median of {args['repeats']} passes")
        for side, sec in med.items():
            print(f"{side:16} {sec:8.3f} s  {sec / med['hf']:5.2f} x HF")
        if args["json"]:
            args["json"].write_text(json.dumps({"interleaved_seconds": med, "config": args},
                                               indent=2, default=str))
        return
    results = {side: run_alone(_measure, side, args) for side in SIDES}
    hf = results["hf"]
    diffs = {k: max(abs(a - b) for a, b in zip(hf["scores"], v["scores"], strict=True))
             for k, v in results.items() if k != "hf"}
    device = f"{args['device']} ({hf['device_name']})" if args["device"].startswith(
        "cuda") else args["device"]
    print(f"model {args['model']}  device {device}  dtype {args['dtype']}  threads "
          f"{args['threads']}  {hf['n_seqs']} sequences, {hf['n_tokens']} tokens, batch "
          f"{args['batch_size']}; each side alone in its process")
    head = {"hf": "HF forward", "tl": "HookedRewardModel", "tl-materialised": "materialised"}
    print(f"{'':24}" + "".join(f"{head[k]:>19}" for k in results) + f"{'ratio TL/HF':>13}"
          + f"{'materialised/HF':>17}")
    for label, key, fmt in (("time per pass (s)", "seconds", "19.3f"),
                            ("peak extra memory (MB)", "peak_mb", "19.1f")):
        vals = [results[k][key] for k in results]
        ratios = [results[k][key] / max(hf[key], 1e-9) for k in results if k != "hf"]
        print(f"{label:24}" + "".join(f"{v:{fmt}}" for v in vals)
              + "".join(f"{r:{w}.2f}" for r, w in zip(ratios, (13, 17), strict=False)))
    print("max |score difference| vs HF: "
          + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items())
          + f"; fused_attention switch: {results['tl']['fused_attention']}")
    if args["json"]:
        summary = {k: {kk: vv for kk, vv in v.items() if kk != "scores"}
                   for k, v in results.items()}
        args["json"].write_text(json.dumps({**summary, "max_abs_diff": diffs["tl"],
                                            "max_abs_diff_by_side": diffs, "device": device,
                                            "config": args}, indent=2, default=str))


if __name__ == "__main__":
    main()
