"""False alarms and power of the Goodhart curve's peak rule and after-peak verdicts, by
simulation (no model runs).

Each simulated run has S steps of n units (a unit: a prompt's completions averaged). A unit's
proxy reward and gold score are the step's true means plus standard normal noise, correlated
0.5 within the unit (both score the same completions). Scenarios (true means over the run,
``t`` going from 0 to 1):

* ``flat``: proxy and gold flat. The peak should be the first step, and no verdict fire.
* ``both rise``: proxy and gold each rise by 1 sd (healthy training: gold never stops rising).
* ``gold slower``: the proxy rises by 1 sd, gold by 0.3 sd (gold still rises, more slowly).
* ``gold flat``: the proxy rises by 1 sd, gold flat from the start (gains that buy nothing).
* ``gold falls``: the proxy rises by 1 sd, gold rises by 1 sd to the middle and falls back
  (Gao et al.'s over-optimisation).
* ``gold stalls``: the proxy rises by 1 sd, gold rises by 1 sd to the middle and stays there.

Per scenario: how often the peak is not the first step, the peak's median, and how often
``overoptimised`` (the proxy rose after the peak) and ``gold_fell`` (it rose and gold fell) fire,
and ``gold_stalled`` with the smallest gold gain that matters ``--min-gain`` (sd units; default
0.25): how often it fires, and how often it fires wrongly, where gold's true change from the
peak found to the last step is at least that gain. Rates carry Clopper-Pearson intervals
(``scipy.stats.binomtest``). The verdicts are :mod:`tl_reward.rl.goodhart`'s own
(``peak_step``, ``after_peak``, ``after_peak_verdicts``, ``gold_stalled_verdict``), at alpha
0.05 and 95 % intervals, as ``goodhart_curve`` runs them.

Usage: ``python experiments/goodhart_null.py [--sims 600]`` (about 2 CPU-minutes); writes
``experiments/results/goodhart_null.json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from tl_reward.rl.goodhart import after_peak, after_peak_verdicts, gold_stalled_verdict, peak_step

OUT = Path(__file__).resolve().parent / "results" / "goodhart_null.json"
RHO = 0.5


def scenarios(s: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Scenario -> (the proxy's and gold's true means per step)."""
    t = np.linspace(0.0, 1.0, s)
    flat = np.zeros(s)
    return {"flat": (flat, flat), "both rise": (t, t), "gold slower": (t, 0.3 * t),
            "gold flat": (t, flat), "gold falls": (t, 1 - 2 * np.abs(t - 0.5)),
            "gold stalls": (t, np.minimum(2 * t, 1.0))}


def simulate(proxy: np.ndarray, gold: np.ndarray, n: int, rng: np.random.Generator,
             min_gain: float = 0.25) -> tuple[int, bool, bool, bool, bool]:
    """One run: its peak step, ``overoptimised``, ``gold_fell``, ``gold_stalled`` and whether
    that is wrong (gold's true change after the peak is at least ``min_gain``)."""
    per = []
    for p, g in zip(proxy, gold, strict=True):
        z = rng.standard_normal((n, 2))
        z[:, 1] = RHO * z[:, 0] + np.sqrt(1 - RHO**2) * z[:, 1]
        per.append(z + np.array([p, g]))
    steps = list(range(len(per)))
    peak = peak_step(steps, [u[:, 1] for u in per], alpha=0.05, confidence=0.95)
    _, lo, hi = after_peak(per, peak, 0.95)
    stalled = gold_stalled_verdict([lo[0], hi[0]], [lo[1], hi[1]], min_gain)
    return (peak, *after_peak_verdicts([lo[0], hi[0]], [lo[1], hi[1]]), stalled,
            stalled and bool(gold[-1] - gold[peak] >= min_gain))


def rate(hits: int, sims: int) -> dict[str, Any]:
    ci = stats.binomtest(hits, sims).proportion_ci(0.95)
    return {"rate": hits / sims, "ci95": [ci.low, ci.high], "hits": hits}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sims", type=int, default=600)
    ap.add_argument("--steps", default="10,30,60")
    ap.add_argument("--units", default="8,64")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min-gain", type=float, default=0.25,
                    help="gold_stalled's smallest gold gain that matters (sd units)")
    args = ap.parse_args(argv)
    rows = []
    for s in (int(v) for v in args.steps.split(",")):
        for n in (int(v) for v in args.units.split(",")):
            for k, (name, (proxy, gold)) in enumerate(scenarios(s).items()):
                rng = np.random.default_rng([args.seed, s, n, k])
                runs = [simulate(proxy, gold, n, rng, args.min_gain)
                        for _ in range(args.sims)]
                peaks = np.array([r[0] for r in runs])
                row = {"scenario": name, "steps": s, "units": n, "sims": args.sims,
                       "peak_not_first": rate(int((peaks > 0).sum()), args.sims),
                       "peak_median": float(np.median(peaks)),
                       "overoptimised": rate(sum(r[1] for r in runs), args.sims),
                       "gold_fell": rate(sum(r[2] for r in runs), args.sims),
                       "gold_stalled": rate(sum(r[3] for r in runs), args.sims),
                       "gold_stalled_wrong": rate(sum(r[4] for r in runs), args.sims)}
                rows.append(row)
                print(f"S={s:3d} n={n:3d} {name:12s} peak>first {row['peak_not_first']['rate']:.3f}"
                      f" (median {row['peak_median']:.0f})  overoptimised "
                      f"{row['overoptimised']['rate']:.3f}  gold_fell "
                      f"{row['gold_fell']['rate']:.3f}  gold_stalled "
                      f"{row['gold_stalled']['rate']:.3f} (wrong "
                      f"{row['gold_stalled_wrong']['rate']:.3f})", flush=True)
    OUT.write_text(json.dumps({"rho": RHO, "alpha": 0.05, "confidence": 0.95,
                               "min_gain": args.min_gain, "rows": rows}, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
