"""Peak host memory of loading a reward model: block-at-a-time processing vs TransformerLens's.

TransformerLens's ``load_and_process_state_dict`` upcasts the whole state dict to float32 and
clones all of it at every folding step; ``tl_backend.process_weights`` gives the same weights
bit for bit (tested) while processing and loading one block at a time. Each way loads the same
checkpoint from disk in its own subprocess; the figure is the resident-set high-water mark
above the process's baseline after imports, and the loaded weights are compared.

Default model: a seeded random reward model in Llama-3.2-1B's configuration (1.24B parameters,
128,256-token vocabulary), saved once in bfloat16 and loaded as bfloat16.

    python benchmarks/loading_memory.py [--model DIR_OR_NAME] [--dtype bfloat16] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
from pathlib import Path
from typing import Any

import torch
from memory import peak_mb, start_peak

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
LLAMA_3_2_1B = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                    num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                    max_position_embeddings=4096, rope_theta=500000.0, tie_word_embeddings=False,
                    rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 8192})


def build_random_llama(path: Path, dtype: torch.dtype) -> Path:
    """Save a seeded random ``LlamaForSequenceClassification`` in Llama-3.2-1B's shape."""
    if (path / "config.json").exists():
        return path
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from tl_reward.testing import tiny_tokenizer

    tok = tiny_tokenizer()
    cfg = LlamaConfig(num_labels=1, pad_token_id=tok.pad_token_id, **LLAMA_3_2_1B)
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = LlamaForSequenceClassification(cfg).to(dtype)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _worker(way: str, args: dict[str, Any], out: Any) -> None:
    torch.set_num_threads(args["threads"])
    import tl_reward.tl_backend as backend
    from tl_reward import HookedRewardModel

    if way == "stock":
        backend.process_weights = backend.process_weights_stock
    base = start_peak("cpu")
    t0 = time.perf_counter()
    model = HookedRewardModel.from_pretrained(args["model"], device="cpu",
                                              dtype=getattr(torch, args["dtype"]))
    seconds = time.perf_counter() - t0
    peak = peak_mb("cpu") - base
    weights = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    gen = torch.Generator().manual_seed(0)
    probe = {k: v.flatten()[torch.randint(v.numel(), (64,), generator=gen)].float().tolist()
             for k, v in model.state_dict().items() if v.numel()}
    out.put({"way": way, "seconds": seconds, "peak_mb": peak, "weights_mb": weights,
             "probe": probe})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="default: a random Llama-3.2-1B-shaped RM")
    p.add_argument("--dir", type=Path, default=Path("/tmp/tl_reward_bench/llama-3.2-1b-rm"))
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=str(RESULTS / "loading_memory_cpu.json"))
    args = vars(p.parse_args())
    if args["model"] is None:
        args["model"] = str(build_random_llama(args["dir"], getattr(torch, args["dtype"])))
    ctx = mp.get_context("spawn")
    results = {}
    for way in ("blockwise", "stock"):
        q = ctx.Queue()
        proc = ctx.Process(target=_worker, args=(way, args, q))
        proc.start()
        results[way] = q.get()
        proc.join()
    ours, stock = results["blockwise"], results["stock"]
    same = all(ours["probe"][k] == stock["probe"][k] for k in stock["probe"])
    print(f"model {args['model']}  dtype {args['dtype']}  loaded weights "
          f"{ours['weights_mb']:.0f} MB")
    print(f"{'':34}{'peak MB':>10}{'x weights':>11}{'seconds':>10}")
    for name, r in (("TransformerLens processing", stock), ("tl_reward block-at-a-time", ours)):
        print(f"{name:34}{r['peak_mb']:10.0f}{r['peak_mb'] / r['weights_mb']:11.2f}"
              f"{r['seconds']:10.1f}")
    print(f"peak ratio stock / block-at-a-time: {stock['peak_mb'] / ours['peak_mb']:.2f}; "
          f"sampled weights identical: {same}")
    if args["json"]:
        summary = {k: {kk: vv for kk, vv in v.items() if kk != "probe"}
                   for k, v in results.items()}
        Path(args["json"]).write_text(json.dumps(
            {"config": {**args, "dir": str(args["dir"])}, "results": summary,
             "peak_ratio_stock_over_blockwise": stock["peak_mb"] / ours["peak_mb"],
             "sampled_weights_identical": same}, indent=2))


if __name__ == "__main__":
    main()
