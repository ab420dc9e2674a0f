"""BridgeRewardModel vs HookedRewardModel vs HF's own forward on one seeded Llama reward model.

Builds a seeded random ``LlamaForSequenceClassification`` of ``--shape`` (see
``loading_memory.py``) in ``--dtype`` on ``--device``, then scores the same batch of
``--batch`` sequences of ``--tokens`` random ids (right-padded to varied lengths) three ways:
HF's forward (the reference; also run once in float32 on the same weights, so that each way's
distance from the exact reward shows beside HF's own rounding), the reward bridge (wraps the HF
module: no copy) and ``HookedRewardModel`` (converted weights). Prints each way's largest reward
difference from HF, its median time per batch, the device's peak memory while it runs, and the
time of loading it; then one JSON line.

    python benchmarks/bridge.py --shape llama-3.1-8b --dtype bfloat16 --device cuda
    python benchmarks/bridge.py --shape tiny --threads 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch
from loading_memory import SHAPES

from tl_reward import BridgeRewardModel, HookedRewardModel
from tl_reward.testing import tiny_tokenizer

TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _peak(device: str) -> float:
    return torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else float("nan")


def _timed(fn: Any, device: str, repeats: int) -> tuple[Any, float, float]:
    out = fn()  # warm-up
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        out = fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return out, statistics.median(times), _peak(device)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="tiny", choices=["tiny", *sorted(SHAPES)])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    import transformers as tf

    dtype = getattr(torch, a.dtype)
    tok = tiny_tokenizer()
    shape = TINY if a.shape == "tiny" else SHAPES[a.shape]
    cfg = tf.LlamaConfig(num_labels=1, pad_token_id=tok.pad_token_id, **shape)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device(a.device):
        hf = tf.LlamaForSequenceClassification._from_config(cfg, dtype=torch.float32).eval()
    build_s = time.perf_counter() - t0
    gen = torch.Generator().manual_seed(1)
    n = min(a.tokens, shape["max_position_embeddings"])
    tokens = torch.randint(len(tok), cfg.vocab_size, (a.batch, n), generator=gen)
    mask = torch.ones_like(tokens)
    for i in range(a.batch):  # right padding to varied lengths
        cut = n - i * (n // (2 * a.batch))
        tokens[i, cut:] = tok.pad_token_id
        mask[i, cut:] = 0
    tokens, mask = tokens.to(a.device), mask.to(a.device)
    rows: dict[str, dict[str, float]] = {}

    with torch.no_grad():  # the same weights in float32: how far each way is from exact
        exact = hf(input_ids=tokens, attention_mask=mask).logits[:, 0].float()
    if dtype != torch.float32:  # the same weights; buffers such as rotary inv_freq as HF
        with torch.device(a.device):  # initialises them in this dtype (a cast would round them)
            low = tf.LlamaForSequenceClassification._from_config(cfg, dtype=dtype).eval()
        low.load_state_dict(hf.state_dict())
        del hf
        hf = low
    with torch.no_grad():
        ref, t_hf, m_hf = _timed(lambda: hf(input_ids=tokens, attention_mask=mask).logits[:, 0]
                                 .float(), a.device, a.repeats)
    rows["hf"] = {"max_abs_diff": 0.0, "vs_float32": float((ref - exact).abs().max()),
                  "seconds": t_hf, "peak_gib": m_hf, "load_s": build_s}

    t0 = time.perf_counter()
    bridge = BridgeRewardModel.from_pretrained(hf_model=hf, tokenizer=tok)
    load_b = time.perf_counter() - t0
    got, t_b, m_b = _timed(lambda: bridge.pooled_outputs(tokens, mask)[0][:, 0], a.device,
                           a.repeats)
    rows["bridge"] = {"max_abs_diff": float((got - ref).abs().max()),
                      "vs_float32": float((got - exact).abs().max()), "seconds": t_b,
                      "peak_gib": m_b, "load_s": load_b}

    t0 = time.perf_counter()
    hooked = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device=a.device,
                                               dtype=dtype)
    load_h = time.perf_counter() - t0
    got, t_h, m_h = _timed(lambda: hooked.pooled_outputs(tokens, mask)[0][:, 0], a.device,
                           a.repeats)
    rows["hooked"] = {"max_abs_diff": float((got - ref).abs().max()),
                      "vs_float32": float((got - exact).abs().max()), "seconds": t_h,
                      "peak_gib": m_h, "load_s": load_h}

    print(f"{a.shape} {a.dtype} on {a.device}: batch {a.batch} x {n} tokens, "
          f"|reward| max {float(ref.abs().max()):.3g}")
    print(f"{'way':8} {'max |diff| vs HF':>17} {'vs HF float32':>14} {'s / batch':>10} "
          f"{'peak GiB':>9} {'load s':>7}")
    for way, r in rows.items():
        print(f"{way:8} {r['max_abs_diff']:17.3g} {r['vs_float32']:14.3g} {r['seconds']:10.4f} "
              f"{r['peak_gib']:9.2f} {r['load_s']:7.1f}")
    print(json.dumps({"shape": a.shape, "dtype": a.dtype, "device": a.device, "batch": a.batch,
                      "tokens": n, "rows": rows}))


if __name__ == "__main__":
    main()
