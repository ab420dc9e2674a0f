"""Peak host memory of loading a reward model: streamed block-at-a-time loading vs the naive way.

The naive way ("stock") converts the whole model and runs TransformerLens's
``load_and_process_state_dict``, which upcasts the whole state dict to float32 and clones it at
every folding step, keeping the HF model alive throughout. tl_reward's loader ("blockwise")
converts, processes and loads one block at a time on the CPU, moves each block to ``--device``
as soon as it is loaded, and frees the HF block it came from (the loader owns the HF model), so
host memory holds the checkpoint plus one block in float32 beside the model. Both give the same
weights bit for bit (tested; sampled weights are compared here too). Each way loads the same
checkpoint from disk in its own subprocess; the figure is the resident-set high-water mark
above the process's baseline after imports, as a multiple of the loaded weights.

Shapes (seeded random ``LlamaForSequenceClassification``, built without a hub and saved once):
``llama-3.1-8b`` (hidden 4096, 32 layers, 32 heads, 8 kv heads, mlp 14336, vocab 128256; needs
~50+ GB host RAM), ``llama-3.2-1b``, ``small`` (a 0.3B Llama, for a check on a small machine).

    python benchmarks/loading_memory.py --shape llama-3.1-8b --dtype bfloat16 --device cuda
    python benchmarks/loading_memory.py --shape small --ways blockwise,stock

Prints a table and one JSON line (also written to ``--json``). Needs only torch, transformers,
transformer-lens and tl_reward.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
from pathlib import Path
from typing import Any

import torch
from memory import peak_mb, proc_status_mb, start_peak

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
LLAMA_3_2_1B = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                    num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                    max_position_embeddings=4096, rope_theta=500000.0, tie_word_embeddings=False,
                    rope_scaling={**_LLAMA3_ROPE, "factor": 32.0})
LLAMA_3_1_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                    num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                    max_position_embeddings=8192, rope_theta=500000.0, tie_word_embeddings=False,
                    rope_scaling=_LLAMA3_ROPE)
SMALL = dict(vocab_size=32000, hidden_size=1024, intermediate_size=4096, num_hidden_layers=16,
             num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=4096,
             rope_theta=500000.0, tie_word_embeddings=False, rope_scaling=_LLAMA3_ROPE)
SHAPES = {"llama-3.1-8b": LLAMA_3_1_8B, "llama-3.2-1b": LLAMA_3_2_1B, "small": SMALL}


def build_random_llama(path: Path, dtype: torch.dtype, shape: str = "llama-3.2-1b") -> Path:
    """Save a seeded random ``LlamaForSequenceClassification`` of ``shape``, created directly
    in ``dtype`` (an 8B model never exists in float32 here)."""
    if (path / "config.json").exists():
        return path
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from tl_reward.testing import tiny_tokenizer

    tok = tiny_tokenizer()
    cfg = LlamaConfig(num_labels=1, pad_token_id=tok.pad_token_id, **SHAPES[shape])
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("cpu"):
            model = LlamaForSequenceClassification(cfg)
    finally:
        torch.set_default_dtype(default)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


class AnonPeak:
    """Samples ``RssAnon`` (resident memory not backed by a file) every few ms: the checkpoint's
    memory-mapped safetensors pages count in RSS while read but are not allocated memory."""

    def __init__(self) -> None:
        import threading

        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, proc_status_mb("RssAnon"))
            self._stop.wait(0.005)

    def __enter__(self) -> AnonPeak:
        self.base = proc_status_mb("RssAnon")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _worker(way: str, args: dict[str, Any], out: Any) -> None:
    torch.set_num_threads(args["threads"])
    import tl_reward.tl_backend as backend
    from tl_reward import HookedRewardModel

    if way == "stock":
        backend.process_weights = backend.process_weights_stock
    device = args["device"]
    base = start_peak("cpu")
    gpu_base = start_peak(device) if device.startswith("cuda") else 0.0
    t0 = time.perf_counter()
    with AnonPeak() as anon:
        model = HookedRewardModel.from_pretrained(args["model"], device=device,
                                                  dtype=getattr(torch, args["dtype"]))
    seconds = time.perf_counter() - t0
    peak = peak_mb("cpu") - base
    anon_peak = anon.peak - anon.base
    gpu_peak = peak_mb(device) - gpu_base if device.startswith("cuda") else None
    weights = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    gen = torch.Generator().manual_seed(0)
    probe = {k: v.flatten()[torch.randint(v.numel(), (64,), generator=gen, device="cpu")
                            .to(v.device)].float().tolist()
             for k, v in model.state_dict().items() if v.numel()}
    out.put({"way": way, "seconds": seconds, "peak_mb": peak, "anon_peak_mb": anon_peak,
             "gpu_peak_mb": gpu_peak,
             "weights_mb": weights, "probe": probe})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a saved RM; default: a random one of --shape")
    p.add_argument("--shape", default="llama-3.2-1b", choices=sorted(SHAPES))
    p.add_argument("--dir", type=Path, default=None,
                   help="where the random RM is saved (default /tmp/tl_reward_bench/<shape>-rm)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", default="cpu", help="cpu or cuda: where the model is loaded")
    p.add_argument("--ways", default="blockwise,stock",
                   help="comma-separated: blockwise (tl_reward) and/or stock (naive)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None,
                   help="default benchmarks/results/loading_memory_<shape>_<device>.json")
    args = vars(p.parse_args())
    args["dir"] = args["dir"] or Path(f"/tmp/tl_reward_bench/{args['shape']}-rm")
    if args["model"] is None:
        args["model"] = str(build_random_llama(args["dir"], getattr(torch, args["dtype"]),
                                               args["shape"]))
    ctx = mp.get_context("spawn")
    results = {}
    for way in args["ways"].split(","):
        q = ctx.Queue()
        proc = ctx.Process(target=_worker, args=(way, args, q))
        proc.start()
        results[way] = q.get()
        proc.join()
    first = next(iter(results.values()))
    print(f"model {args['model']}  dtype {args['dtype']}  device {args['device']}  loaded "
          f"weights {first['weights_mb']:.0f} MB")
    print(f"{'':36}{'RSS peak MB':>12}{'x weights':>10}{'anon peak MB':>13}{'x weights':>10}"
          f"{'seconds':>9}")
    names = {"stock": "naive (whole model, TL processing)", "blockwise": "tl_reward streamed"}
    for way, r in results.items():
        w = r["weights_mb"]
        print(f"{names[way]:36}{r['peak_mb']:12.0f}{r['peak_mb'] / w:10.2f}"
              f"{r['anon_peak_mb']:13.0f}{r['anon_peak_mb'] / w:10.2f}{r['seconds']:9.1f}")
    summary: dict[str, Any] = {
        "shape": args["shape"], "dtype": args["dtype"], "device": args["device"],
        "weights_mb": first["weights_mb"],
        **{f"{w}_host_peak_x_weights": r["peak_mb"] / r["weights_mb"] for w, r in results.items()},
        **{f"{w}_host_anon_peak_x_weights": r["anon_peak_mb"] / r["weights_mb"]
           for w, r in results.items()},
        **{f"{w}_gpu_peak_mb": r["gpu_peak_mb"] for w, r in results.items()
           if r["gpu_peak_mb"] is not None},
    }
    if "stock" in results and "blockwise" in results:
        ours, stock = results["blockwise"], results["stock"]
        summary["sampled_weights_identical"] = all(
            ours["probe"][k] == stock["probe"][k] for k in stock["probe"])
        summary["peak_ratio_stock_over_blockwise"] = stock["peak_mb"] / ours["peak_mb"]
    print(json.dumps(summary))
    out = args["json"] or str(RESULTS / f"loading_memory_{args['shape']}_{args['device']}.json")
    Path(out).write_text(json.dumps(
        {"config": {**args, "dir": str(args["dir"])}, "summary": summary,
         "results": {k: {kk: vv for kk, vv in v.items() if kk != "probe"}
                     for k, v in results.items()}}, indent=2))


if __name__ == "__main__":
    main()
