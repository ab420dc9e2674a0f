"""What circuits say about the demo RM: faithfulness curves on held-out HH-RLHF pairs.

Pairs: the first ``--n-pairs`` harmless-base test pairs (file order) with both replies at most
``--max-tokens`` tokens, split by a seeded permutation into a selection half and a held-out
half. Corruption: mean ablation (each source's mean over the selection half's replies, per
position class), the margin ``r(chosen) - r(rejected)`` as the metric. For each method (EAP,
EAP-IG at 5 steps under each rule), the attribution on the selection half chooses circuits,
evaluated on the held-out half: edge circuits (greedy from the reward, and MIB's top edges
pruned), node circuits (the top heads and MLPs, every edge among them) and random circuits of
each kind; with CPR and CMD, and the fewest edges that keep half and 80 % of the margin.
Also the command line's default (``tl-reward circuit``: EAP-IG, greedy, 100 edges) on the
same pairs.

Run: ``python experiments/circuits_demo.py`` (about an hour on one CPU thread); results in
``experiments/results/circuits_demo.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tl_reward import HookedRewardModel
from tl_reward.circuits import RewardCircuit, edge_attribution, evaluate_circuit
from tl_reward.circuits.circuit import faithfulness_curve
from tl_reward.circuits.edges import DEFAULT_IG_RULE, IG_RULES
from tl_reward.data import load_hh_rlhf, short_pairs

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"
OUT = ROOT / "experiments" / "results" / "circuits_demo.json"
#: Circuit sizes, as fractions of the edges (edge circuits) or of the heads and MLPs (nodes).
SIZES = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.2, 1.0)


def fewest(curve: dict[str, Any], level: float) -> int | None:
    """The fewest edges of a circuit on the curve keeping ``level`` of the margin."""
    ok = [n for n, f in zip(curve["n_edges"], curve["faithfulness"], strict=True) if f >= level]
    return min(ok) if ok else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n-pairs", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--selects", default="greedy,top,nodes")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("TL_REWARD_THREADS", "1")))
    model = HookedRewardModel.from_pretrained("tl-reward/smollm2-135m-hh", device="cpu")
    pairs = short_pairs(model, load_hh_rlhf(DATA), args.n_pairs, args.max_tokens)
    order = np.random.default_rng(args.seed).permutation(len(pairs))
    fit = [pairs[i] for i in order[: len(pairs) // 2]]
    held = [pairs[i] for i in order[len(pairs) // 2 :]]
    kw = {"ablation": "mean", "reference": fit, "batch_size": 8}
    out: dict[str, Any] = {"model": "tl-reward/smollm2-135m-hh", "pairs": len(pairs),
                           "selection": len(fit), "held_out": len(held),
                           "max_tokens": args.max_tokens, "sizes": list(SIZES), "methods": {}}
    methods = [("eap", {"method": "eap"}),
               *((f"eap-ig {r}", {"method": "eap-ig", "ig_rule": r}) for r in IG_RULES)]
    atts = {}
    for name, extra in methods:
        t = time.time()
        att = atts[name] = edge_attribution(model, fit, **kw, **extra)
        res: dict[str, Any] = {"label": att.label, "attribution_s": time.time() - t}
        for select in args.selects.split(","):
            c = faithfulness_curve(model, att, held, sizes=SIZES, select=select, **kw)
            res[select] = {"n_edges": c.n_edges, "faithfulness": c.faithfulness.tolist(),
                           "random": c.random.tolist(), "cpr": c.cpr, "cmd": c.cmd}
            res[select]["edges_for_half"] = fewest(res[select], 0.5)
            res[select]["edges_for_80"] = fewest(res[select], 0.8)
            print(name, select, {k: v for k, v in res[select].items()
                                 if k in ("cpr", "cmd", "edges_for_half", "edges_for_80")},
                  flush=True)
        out["methods"][name] = res
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1))
    att = atts[f"eap-ig {DEFAULT_IG_RULE}"]  # the command line's defaults
    circuit = RewardCircuit.greedy(att, 100)
    ev = evaluate_circuit(model, circuit, held, **kw)
    out["cli_default"] = {"label": att.label, "edges": circuit.n_edges,
                          "faithfulness": ev.faithfulness.value,
                          "ci": [ev.faithfulness.ci_low, ev.faithfulness.ci_high]}
    print("cli default", out["cli_default"], flush=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
