"""Memory of layer x layer maps: streamed per-layer Grams against keeping every activation.

Both ways build the centred Gram of every block's residual stream at the pooled token for the
same HH-RLHF conversations on the demo RM. The naive way keeps what ``run_with_cache`` gives
(every layer's residual stream at every position, for every batch) and pools at the end; tl_reward
(``layer_grams``) copies only the pooled rows out of each batch through hooks and drops them
once the Grams are built. Each way runs in its own process; peak resident memory is measured
above the loaded model, and the Grams are compared.

    python benchmarks/layer_maps.py [--n 64] [--max-tokens 192] [--batch-size 8]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
HH = ROOT.parent / "shared" / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"
OUT = ROOT / "benchmarks" / "results"


def inputs(model, n: int, max_tokens: int) -> list:
    from tl_reward.data import load_hh_rlhf

    out = []
    for pair in load_hh_rlhf(HH):
        conv = pair.chosen_conversation()
        if len(model.encode(conv).ids) <= max_tokens:
            out.append(conv)
        if len(out) >= n:
            break
    return out


def run_one(way: str, n: int, max_tokens: int, batch_size: int, path: Path) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from memory import peak_mb, start_peak

    from tl_reward import HookedRewardModel
    from tl_reward.compare.layers import layer_grams

    model = HookedRewardModel.from_pretrained("tl-reward/smollm2-135m-hh", device="cpu")
    convs = inputs(model, n, max_tokens)
    hooks = [f"blocks.{i}.hook_resid_post" for i in range(model.cfg.n_layers)]
    base = start_peak("cpu")
    t0 = time.time()
    if way == "stream":
        grams = layer_grams(model, convs, hooks, batch_size=batch_size).grams
    else:
        caches, positions = [], []
        with torch.no_grad():
            for s in range(0, len(convs), batch_size):
                batch = model.make_batch(convs[s: s + batch_size])
                _, cache = model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask,
                                                names_filter=lambda name: name in hooks)
                caches.append(cache)
                positions.append(model.pool_positions(batch.tokens, batch.attention_mask))
        grams = np.zeros((len(hooks), len(convs), len(convs)))
        for i, h in enumerate(hooks):
            x = torch.cat([c[h][torch.arange(len(p)), p] for c, p in zip(caches, positions,
                                                                         strict=True)])
            x = x.double().numpy()
            x -= x.mean(0)
            grams[i] = x @ x.T
    seconds = time.time() - t0
    peak = peak_mb("cpu") - base
    np.save(path.with_suffix(".npy"), grams)
    path.write_text(json.dumps({"way": way, "seconds": seconds, "peak_mb": peak,
                                "n": len(convs)}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--way", choices=["naive", "stream"], default=None)
    ap.add_argument("--result", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(2)
    if args.way:
        run_one(args.way, args.n, args.max_tokens, args.batch_size, args.result)
        return
    OUT.mkdir(parents=True, exist_ok=True)
    res = {}
    for way in ("naive", "stream"):
        path = OUT / f"layer_maps_{way}.json"
        subprocess.run([sys.executable, __file__, "--way", way, "--n", str(args.n),
                        "--max-tokens", str(args.max_tokens), "--batch-size",
                        str(args.batch_size), "--result", str(path)], check=True)
        res[way] = json.loads(path.read_text())
        res[way]["grams"] = np.load(path.with_suffix(".npy"))
        path.with_suffix(".npy").unlink()
        path.unlink()
    diff = np.abs(res["naive"]["grams"] - res["stream"]["grams"]).max()
    scale = np.abs(res["naive"]["grams"]).max()
    print(f"{res['naive']['n']} conversations, 30 layers, pooled token, batch {args.batch_size}")
    print(f"{'':28s}{'seconds':>10s}{'peak MB':>10s}")
    for way, label in (("naive", "run_with_cache, keep all"), ("stream", "tl_reward layer_grams")):
        print(f"{label:28s}{res[way]['seconds']:10.1f}{res[way]['peak_mb']:10.0f}")
    print(f"max abs Gram difference {diff:.3g} (Gram scale {scale:.3g})")
    summary = {w: {k: v for k, v in res[w].items() if k != "grams"} for w in res}
    summary["max_abs_gram_difference"] = float(diff)
    (OUT / "layer_maps_cpu.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
