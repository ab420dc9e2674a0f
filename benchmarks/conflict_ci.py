"""Whitened cosines of resampled items (once ``geometric_conflict``'s bootstrap CI, removed: no
interval of the whitened cosine reaches its coverage, docs/statistics.md): a d x d Ledoit-Wolf
fit per resample against the n x n Gram of the centred rows (:class:`GramLedoitWolf`), same run.

The old way, per resample: centre the resampled rows, form ``S = Xc'Xc / n`` and the
Ledoit-Wolf sums (``O(n d^2)``), then ``w S w'`` (``O(T d^2)``). The new way builds ``K = Y Y'``
and ``Y W'`` once (``O(n^2 d)``) and then costs ``O(n^2 + n T^2)`` per resample. Both run on
the same synthetic normed residual (anisotropic Gaussian rows, ``n`` items, ``d`` dimensions,
``T`` term directions) and the same resample indices. When the old way would take longer than
``--old-budget`` seconds for all ``--n-bootstrap`` resamples, only the first ``--min-old``
resamples run (default 5) and its total is extrapolated (printed as such). The cosines of the
resamples both ran are compared.

    python benchmarks/conflict_ci.py [--n 256] [--d 4096] [--terms 5] [--n-bootstrap 200]
                                     [--old-budget 120] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

from tl_reward.audit.conflict import GramLedoitWolf, cosine_matrix
from tl_reward.audit.covariance import ledoit_wolf

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--d", type=int, default=4096)
    ap.add_argument("--terms", type=int, default=5)
    ap.add_argument("--n-bootstrap", type=int, default=200)
    ap.add_argument("--old-budget", type=float, default=120.0,
                    help="seconds the old way may run before extrapolating")
    ap.add_argument("--min-old", type=int, default=5,
                    help="old-way resamples to time at least before extrapolating")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None, help="write a JSON summary here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    n, d, b = args.n, args.d, args.n_bootstrap

    gen = torch.Generator().manual_seed(0)
    h = torch.randn(n, d, generator=gen, dtype=torch.float64) * torch.logspace(-1, 0.5, d,
                                                                               dtype=torch.float64)
    w = torch.randn(args.terms, d, generator=gen, dtype=torch.float64)
    rng = np.random.default_rng(0)
    draws = [rng.integers(0, n, n) for _ in range(b)]

    # old: one d x d Ledoit-Wolf fit per resample, until the budget is spent
    t0 = time.perf_counter()
    old = []
    for idx in draws:
        old.append(cosine_matrix(w, ledoit_wolf(h[torch.from_numpy(idx)])[0]).numpy())
        if len(old) >= args.min_old and len(old) < b and (time.perf_counter() - t0) * b / len(old) \
                > args.old_budget:
            break
    t_old_run = time.perf_counter() - t0
    old_per = t_old_run / len(old)
    t_old_total = old_per * b
    extrapolated = len(old) < b

    # new: one n x n Gram, then O(n^2) per resample
    t0 = time.perf_counter()
    gram = GramLedoitWolf(h, w)
    t_setup = time.perf_counter() - t0
    new = [gram.cosines(idx)[0] for idx in draws]
    t_new_total = time.perf_counter() - t0
    diff = float(max(np.abs(o - c).max() for o, c in zip(old, new, strict=False)))

    print(f"n = {n}, d = {d}, T = {args.terms} terms, B = {b} resamples, "
          f"{args.threads} thread(s), {platform.processor() or platform.machine()}")
    how = (f"ran {len(old)} of {b} resamples ({t_old_run:.1f} s), total EXTRAPOLATED"
           if extrapolated else f"ran all {b}")
    print(f"old (d x d Ledoit-Wolf per resample): {old_per:.3f} s / resample, "
          f"{t_old_total:.1f} s for B = {b} ({how})")
    print(f"new (n x n Gram): {t_setup:.3f} s once + {(t_new_total - t_setup) / b * 1e3:.2f} ms "
          f"/ resample, {t_new_total:.2f} s for B = {b}")
    print(f"speed-up {t_old_total / t_new_total:.0f}x; max |cosine difference| over the "
          f"{len(old)} common resamples: {diff:.1e}")
    if args.out:
        args.out.write_text(json.dumps({
            "n": n, "d": d, "terms": args.terms, "n_bootstrap": b, "threads": args.threads,
            "old_seconds_per_resample": old_per, "old_seconds_total": t_old_total,
            "old_extrapolated_from": len(old) if extrapolated else None,
            "new_seconds_setup": t_setup, "new_seconds_total": t_new_total,
            "max_abs_difference": diff}, indent=1))


if __name__ == "__main__":
    main()
