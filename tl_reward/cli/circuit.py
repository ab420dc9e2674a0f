"""``tl-reward circuit``: the edges that carry a reward model's preference on some pairs, as an
offline circuit view (and optionally the EAP-IG / MIB graph JSON)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tl_reward.cli.common import (
    add_model_options,
    add_step_option,
    load_model,
    read_pairs,
    require_objective,
)
from tl_reward.errors import TLRewardError


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "circuit", help="edge attribution of the reward margin, drawn as a circuit",
        description="Scores every edge (input, heads' q/k/v inputs, MLPs, reward) for the margin "
                    "r(chosen) - r(rejected) of the preference pairs of --input (JSONL: "
                    "'prompt', 'chosen', 'rejected', or HH-RLHF), each reply ablated on its own "
                    "(--ablation mean: each source's mean over the pairs' replies per position "
                    "class; zero). Selects a circuit of --edges edges (default: grown greedily "
                    "from the reward, so every edge lies on a path into it), evaluates its "
                    "faithfulness, and draws that circuit; with --mib-json, also the scored "
                    "graph in EAP-IG / MIB's JSON format.")
    add_model_options(p)
    p.add_argument("--input", type=Path, required=True, help="JSONL file of preference pairs")
    p.add_argument("--limit", type=int, help="use the first N pairs only")
    p.add_argument("--method", choices=["eap-ig", "eap", "exact"], default="eap-ig")
    p.add_argument("--ig-steps", type=int, default=5, help="EAP-IG steps (MIB uses 5)")
    p.add_argument("--ig-rule", help="where EAP-IG's points sit between the corrupted (0) and "
                                      "clean (1) input: left, k/m for k = 0..m-1 (hannamw/"
                                      "EAP-IG's and MIB's); right, k = 1..m; midpoint, (k + "
                                      "1/2)/m (default: the library's, docs/circuits.md)")
    p.add_argument("--ablation", choices=["mean", "zero"], default="mean")
    p.add_argument("--edges", "--top", dest="edges", type=int, default=100,
                   help="edges in the circuit (--top: the same)")
    p.add_argument("--select", choices=["greedy", "top"], default="greedy",
                   help="greedy: grown from the reward, --edges connected edges; top: the "
                        "--edges largest |scores|, then pruned to those on an input-to-reward "
                        "path (possibly fewer, or none)")
    p.add_argument("--objective", help="the objective to read (needed when the model has "
                                       "several and no combined score)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--mib-json", type=Path, help="also write the scored graph as MIB JSON")
    p.add_argument("--sae", help="a local SAELens SAE folder (or a release with --sae-id) at an "
                                 "MLP output or residual hook: its features and error term "
                                 "become nodes of the circuit")
    p.add_argument("--sae-id", help="the SAE id within the release --sae (needs the hub)")
    p.add_argument("--output", type=Path, default=Path("circuit.html"), help="HTML view path")
    add_step_option(p, "the metric (an index or 'last'; the replies are solutions)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tl_reward.circuits import RewardCircuit, edge_attribution, evaluate_circuit
    from tl_reward.circuits.mib import to_mib_json

    if args.edges < 1:
        raise TLRewardError(f"--edges (--top) must be at least 1, got {args.edges}")
    if args.sae and args.mib_json:
        raise TLRewardError("--mib-json writes EAP-IG's graph, which has no SAE feature nodes: "
                            "drop --sae or --mib-json")
    pairs = read_pairs(args.input, args.limit)
    model = load_model(args)
    require_objective(model, args.objective)
    kw: dict[str, Any] = {"ablation": args.ablation, "objective": args.objective,
                          "batch_size": args.batch_size}
    if args.step is not None:  # a PRM: each pair's two replies as solutions, at that step
        pairs = [((p.prompt, p.chosen), (p.prompt, p.rejected)) for p in pairs]
        kw["step"] = args.step
    if args.sae:
        from tl_reward.sae import load_sae

        kw["sae"] = load_sae(model, args.sae, args.sae_id)
    rule = {} if args.ig_rule is None else {"ig_rule": args.ig_rule}
    attr = edge_attribution(model, pairs, method=args.method, ig_steps=args.ig_steps,
                            **rule, **kw)
    select = RewardCircuit.greedy if args.select == "greedy" else RewardCircuit.top
    circuit = select(attr, args.edges)
    ev = evaluate_circuit(model, circuit, pairs, **kw)
    print(attr)
    how = ("grown greedily from the reward" if args.select == "greedy"
           else f"the top {args.edges} by |score|, pruned")
    print(f"circuit of {circuit.n_edges} edges ({how}): faithfulness {ev.faithfulness}")
    title = (f"{model.cfg.model_name}: {attr.label} on {len(pairs)} pairs (ablation "
             f"{args.ablation}); {circuit.n_edges} edges ({how}) keep "
             f"{ev.faithfulness.value:.2f} of the margin")
    path = circuit.view(attr, title=title).save(args.output)
    print(f"wrote {path}")
    if args.mib_json:
        cfg = model.cfg
        to_mib_json(attr.to_dataframe(), cfg.n_layers, cfg.n_heads, set(circuit.edges()),
                    args.mib_json, n_kv_heads=attr.graph.n_kv_heads, d_model=cfg.d_model,
                    scoring=attr.label)
        print(f"wrote {args.mib_json}")
    return 0
