"""BridgeRewardModel vs HookedRewardModel vs HF's own forward on one seeded Llama reward model.

Scores the same batch of ``--batch`` sequences of ``--tokens`` random ids (right-padded to
varied lengths) with a seeded random ``LlamaForSequenceClassification`` of ``--shape`` (see
``loading_memory.py``) in ``--dtype`` on ``--device``, four ways:

* ``hf``: HF's own forward (the reference);
* ``bridge``: the reward bridge, which wraps the HF module (no copy);
* ``hooked``: ``HookedRewardModel`` (converted weights; fused attention where the backend
  offers it and no hook needs the pattern);
* ``hooked (materialised)``: the same with ``fused_attention = False`` (TransformerLens's own
  attention, every pattern materialised), where the backend has that switch.

Accounting: **each row runs in its own spawned process, where only that row's model is
alive.** Every process builds the same seeded weights (the HF model in float32 from
``torch.manual_seed(0)``, copied into ``--dtype``; a fingerprint of the weights is compared
across rows); the bridge wraps that HF module; the hooked rows convert it and delete it
before measuring. A row's peak is the device's peak *above that process's memory once its
model is loaded* (CUDA: ``max_memory_allocated`` minus ``memory_allocated`` after loading;
CPU: the resident-set high-water mark above the post-load resident set, ``memory.py``),
printed beside the bytes of the row's own weights and the memory held after loading. The hf
process also scores the batch with the float32 weights, so that each way's distance from the
exact reward shows beside HF's own rounding; the parent compares every row's rewards with
HF's. ``load s``: building the seeded HF model (hf), wrapping it (bridge) or converting it
(hooked rows).

Prints a table whose header names the device (and GPU), dtype, shape and batch x tokens,
then one JSON line (also written to ``--json``).

    python benchmarks/bridge.py --shape llama-3.1-8b --dtype bfloat16 --device cuda
    python benchmarks/bridge.py --shape tiny --threads 1 --json results/bridge_cpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from alone import run_alone
from loading_memory import SHAPES
from memory import peak_mb, start_peak

TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
ROWS = ("hf", "bridge", "hooked", "hooked (materialised)")


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _weights_bytes(module: torch.nn.Module) -> int:
    """Bytes of ``module``'s parameters and buffers, each storage counted once."""
    seen: dict[int, int] = {}
    for t in [*module.parameters(), *module.buffers()]:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def _fingerprint(hf: torch.nn.Module) -> float:
    """A float64 sum over a strided sample of every HF weight: equal across rows when their
    processes built the same weights."""
    with torch.no_grad():
        return float(sum(p.detach().flatten()[::997].double().sum().cpu()
                         for p in hf.parameters()))


def _inputs(args: dict[str, Any], pad: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``--batch`` rows of random ids, right-padded to lengths falling from the full width."""
    b, n = args["batch"], args["n"]
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(args["first_id"], vocab, (b, n), generator=gen)
    mask = torch.ones_like(tokens)
    for i in range(b):
        cut = n - i * (n // (2 * b))
        tokens[i, cut:] = pad
        mask[i, cut:] = 0
    return tokens.to(args["device"]), mask.to(args["device"])


def _seeded_hf(args: dict[str, Any], tok: Any, keep_float32: bool = False
               ) -> tuple[Any, Any]:
    """The seeded HF model in ``--dtype`` (and its float32 original when ``keep_float32``).
    Buffers such as rotary ``inv_freq`` are as HF initialises them in that dtype: the low
    precision copy is built afresh and loads the float32 state dict (a cast would round them)."""
    import transformers as tf

    shape = TINY if args["shape"] == "tiny" else SHAPES[args["shape"]]
    cfg = tf.LlamaConfig(num_labels=1, pad_token_id=tok.pad_token_id, **shape)
    dtype = getattr(torch, args["dtype"])
    torch.manual_seed(0)
    with torch.device(args["device"]):
        full = tf.LlamaForSequenceClassification._from_config(cfg, dtype=torch.float32).eval()
    if dtype == torch.float32:
        return full, (full if keep_float32 else None)
    with torch.device(args["device"]):
        low = tf.LlamaForSequenceClassification._from_config(cfg, dtype=dtype).eval()
    low.load_state_dict(full.state_dict())
    return low, (full if keep_float32 else None)


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return f"{device} ({platform.processor() or platform.machine()})"


def _measure(row: str, args: dict[str, Any], out: Any) -> None:
    """Build, load and time one row in this fresh process; put its figures on ``out``."""
    torch.set_num_threads(args["threads"])
    from tl_reward import BridgeRewardModel, HookedRewardModel
    from tl_reward.testing import tiny_tokenizer

    device, dtype = args["device"], getattr(torch, args["dtype"])
    tok = tiny_tokenizer()
    t0 = time.perf_counter()
    hf, full = _seeded_hf(args, tok, keep_float32=row == "hf")
    build_s = time.perf_counter() - t0
    tokens, mask = _inputs(args, tok.pad_token_id, hf.config.vocab_size)
    res: dict[str, Any] = {"fingerprint": _fingerprint(hf), "device": _device_name(device)}
    if full is not None:  # the exact reward, before the float32 copy goes
        with torch.no_grad():
            exact = full(input_ids=tokens, attention_mask=mask).logits[:, 0]
        res["exact"] = exact.float().tolist()  # plain lists: no shared memory to outlive us
        del full
    t0 = time.perf_counter()
    model: Any
    if row == "hf":
        model, load_s = hf, build_s

        def fn() -> torch.Tensor:
            return model(input_ids=tokens, attention_mask=mask).logits[:, 0].float()
    elif row == "bridge":
        model = BridgeRewardModel.from_pretrained(hf_model=hf, tokenizer=tok)
        load_s = time.perf_counter() - t0

        def fn() -> torch.Tensor:
            return model.pooled_outputs(tokens, mask)[0][:, 0]
    else:
        model = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device=device,
                                                  dtype=dtype)
        load_s = time.perf_counter() - t0
        del hf  # only the converted weights stay alive
        if row == "hooked (materialised)" and hasattr(model, "fused_attention"):
            model.fused_attention = False
        res["fused_attention"] = getattr(model, "fused_attention", None)

        def fn() -> torch.Tensor:
            return model.pooled_outputs(tokens, mask)[0][:, 0]
    base = start_peak(device)  # MB held with the model loaded (and nothing else of the row's)
    times = []
    with torch.no_grad():
        got = fn()  # warm-up
        for _ in range(args["repeats"]):
            _sync(device)
            t0 = time.perf_counter()
            got = fn()
            _sync(device)
            times.append(time.perf_counter() - t0)
    peak = peak_mb(device)
    res |= {"rewards": got.float().tolist(), "seconds": statistics.median(times),
            "weights_mib": _weights_bytes(model) / 2**20, "loaded_mib": base,
            "peak_mib_above_loaded": peak - base, "load_s": load_s}
    out.put(res)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="tiny", choices=["tiny", *sorted(SHAPES)])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--rows", default=",".join(ROWS),
                   help=f"comma-separated subset of: {', '.join(ROWS)} (hf is always run)")
    p.add_argument("--json", type=Path, default=None, help="also write the JSON here")
    a = p.parse_args()
    from tl_reward.testing import tiny_tokenizer

    shape = TINY if a.shape == "tiny" else SHAPES[a.shape]
    n = min(a.tokens, shape["max_position_embeddings"])
    args = vars(a) | {"n": n, "first_id": len(tiny_tokenizer()), "json": None}
    rows = ["hf", *[r for r in a.rows.split(",") if r and r != "hf"]]
    unknown = set(rows) - set(ROWS)
    if unknown:
        p.error(f"unknown rows {sorted(unknown)}; choose from {ROWS}")
    got = {row: run_alone(_measure, row, args) for row in rows}
    ref, exact = (torch.tensor(got["hf"][k], dtype=torch.float64) for k in ("rewards", "exact"))
    table: dict[str, dict[str, Any]] = {}
    for row, r in got.items():
        rewards = torch.tensor(r["rewards"], dtype=torch.float64)
        table[row] = {"max_abs_diff": float((rewards - ref).abs().max()),
                      "vs_float32": float((rewards - exact).abs().max()),
                      **{k: r[k] for k in ("seconds", "weights_mib", "loaded_mib",
                                           "peak_mib_above_loaded", "load_s")}}
        if "fused_attention" in r:
            table[row]["fused_attention"] = r["fused_attention"]
    prints = {r["fingerprint"] for r in got.values()}
    if len(prints) != 1:
        raise SystemExit(f"the rows' processes built different weights: {prints}")
    device = got["hf"]["device"]  # named in a child: the parent never initialises CUDA
    mem = "CUDA allocated" if a.device.startswith("cuda") else "resident set (RSS)"
    print(f"shape {a.shape}, {a.dtype}, on {device}, {a.threads} CPU threads: batch {a.batch} x "
          f"{n} tokens (right-padded), |reward| max {float(ref.abs().max()):.3g}")
    print(f"each row alone in its own process; memory = {mem}; peak = above the row's memory "
          "once its model is loaded")
    print(f"{'way':22} {'max |diff| vs HF':>17} {'vs HF float32':>14} {'s / batch':>10} "
          f"{'weights MiB':>12} {'loaded MiB':>11} {'peak above MiB':>15} {'load s':>7}")
    for row, r in table.items():
        note = ""
        if "fused_attention" in r:
            note = ("  (no fused_attention switch)" if r["fused_attention"] is None
                    else f"  fused_attention={r['fused_attention']}")
        print(f"{row:22} {r['max_abs_diff']:17.3g} {r['vs_float32']:14.3g} "
              f"{r['seconds']:10.4f} {r['weights_mib']:12.1f} {r['loaded_mib']:11.1f} "
              f"{r['peak_mib_above_loaded']:15.1f} {r['load_s']:7.1f}{note}")
    import transformers

    record = {"shape": a.shape, "dtype": a.dtype, "device": device, "threads": a.threads,
              "batch": a.batch, "tokens": n, "repeats": a.repeats, "memory": mem,
              "accounting": "each row alone in its own spawned process; peak above the "
                            "process's memory once the row's model is loaded",
              "torch": torch.__version__, "transformers": transformers.__version__,
              "max_abs_reward": float(ref.abs().max()), "rows": table}
    print(json.dumps(record))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
