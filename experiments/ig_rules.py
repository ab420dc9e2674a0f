"""Which EAP-IG rule agrees best with exact edge patching (the default's evidence).

EAP-IG averages the gradient over ``m`` points on the corrupted (0) -> clean (1) line of the
embeddings; the rules put them at ``k/m`` for ``k = 0..m-1`` (``left``: hannamw/EAP-IG and
MIB), ``k = 1..m`` (``right``) or ``(k + 1/2)/m`` (``midpoint``). Each rule's scores are
compared with exact edge patching (one patched forward per edge, the oracle) on:

* the tiny planted models (``tl_reward.planted``): the indirect plant, the trigger-head plant
  and its flag-key variant, on their trigger/counterfactual swaps (every edge patched);
* tiny random-weight models of three families (Llama, GPT-2, Qwen2) on random one-token swaps
  (every edge patched);
* the demo RM on HH-RLHF harmless-base pairs with mean ablation (the margin): exact patching on
  the union of each method's top edges and seeded random edges (every edge would take hours).

Agreement: Pearson and Spearman correlation with the exact scores, the relative error
``||s - exact|| / ||exact||``, and the overlap of the top 10 and 20 edges by ``|score|``.

Run: ``python experiments/ig_rules.py`` (about 15 minutes on one CPU thread); results in
``experiments/results/ig_rules.json``.
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
from scipy import stats

from tl_reward import HookedRewardModel
from tl_reward.circuits import edge_attribution
from tl_reward.circuits.edges import IG_RULES
from tl_reward.data import load_hh_rlhf, short_pairs
from tl_reward.planted import plant_indirect, plant_trigger_head
from tl_reward.planted.recovery import trigger_pairs
from tl_reward.testing import tiny_hf_reward_model

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"
OUT = ROOT / "experiments" / "results" / "ig_rules.json"
PROMPTS = ("Why is water wet?", "Tell me a joke.", "What, in one word, is the best thing ever?")


def agreement(s: torch.Tensor, exact: torch.Tensor) -> dict[str, float]:
    """How well scores ``s`` match ``exact`` where both are defined."""
    ok = ~(s.isnan() | exact.isnan())
    a, b = s[ok].double().numpy(), exact[ok].double().numpy()
    top = {k: len(set(np.argsort(-np.abs(a))[:k]) & set(np.argsort(-np.abs(b))[:k])) / k
           for k in (10, 20)}
    return {"pearson": float(stats.pearsonr(a, b)[0]),
            "spearman": float(stats.spearmanr(a, b)[0]),
            "rel_error": float(np.linalg.norm(a - b) / np.linalg.norm(b)),
            "top10": top[10], "top20": top[20], "edges": int(ok.sum())}


def compare(model: Any, clean: Any, corrupt: Any, steps: tuple[int, ...], **kw: Any
            ) -> dict[str, Any]:
    """Exact scores of every edge, then EAP and each rule at each step count against them."""
    exact = edge_attribution(model, clean, corrupt, method="exact", **kw).scores
    out: dict[str, Any] = {"eap": agreement(edge_attribution(
        model, clean, corrupt, method="eap", **kw).scores, exact)}
    for m in steps:
        for rule in IG_RULES:
            att = edge_attribution(model, clean, corrupt, method="eap-ig", ig_steps=m,
                                   ig_rule=rule, **kw)
            out[f"{rule}-{m}"] = agreement(att.scores, exact)
    return out


def planted(steps: tuple[int, ...]) -> dict[str, Any]:
    hf, tok = tiny_hf_reward_model("llama")
    out = {}
    builds = {"indirect": lambda: plant_indirect(hf, tok, " sky", head=1),
              "trigger": lambda: plant_trigger_head(hf, tok, " sky"),
              "trigger-flag": lambda: plant_trigger_head(hf, tok, " sky", key="flag")}
    for name, build in builds.items():
        p = build()
        model = HookedRewardModel.from_pretrained(hf_model=p.model, tokenizer=tok, device="cpu")
        swap = getattr(p.truth, "counterfactual_id", None) if name != "trigger" else None
        tps = trigger_pairs(tok, p.truth.trigger_id, p.model.config.vocab_size, PROMPTS,
                            swap=swap)
        out[name] = compare(model, [tp.ids("chosen") for tp in tps],
                            [tp.ids("rejected") for tp in tps], steps)
        print(name, {k: round(v["pearson"], 3) for k, v in out[name].items()}, flush=True)
    return out


def random_models(steps: tuple[int, ...], n_seq: int = 8) -> dict[str, Any]:
    out = {}
    for arch in ("llama", "gpt2", "qwen2"):
        hf, tok = tiny_hf_reward_model(arch)
        model = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu")
        gen = torch.Generator().manual_seed(0)
        v = model.cfg.d_vocab
        clean = torch.randint(5, v, (n_seq, 10), generator=gen)
        corrupt = clean.clone()
        at = torch.randint(1, 9, (n_seq,), generator=gen)
        corrupt[torch.arange(n_seq), at] = torch.randint(5, v, (n_seq,), generator=gen)
        out[arch] = compare(model, clean.tolist(), corrupt.tolist(), steps)
        print(arch, {k: round(v["pearson"], 3) for k, v in out[arch].items()}, flush=True)
    return out


def demo(n_pairs: int, max_tokens: int, n_top: int, n_random: int) -> dict[str, Any]:
    model = HookedRewardModel.from_pretrained("tl-reward/smollm2-135m-hh", device="cpu")
    pairs = short_pairs(model, load_hh_rlhf(DATA), n_pairs, max_tokens)
    kw = {"ablation": "mean", "batch_size": 8}
    scores, seconds = {}, {}
    for name, extra in [("eap", {"method": "eap"}),
                        *((r, {"method": "eap-ig", "ig_rule": r}) for r in IG_RULES)]:
        t = time.time()
        scores[name] = edge_attribution(model, pairs, **kw, **extra).scores
        seconds[name] = time.time() - t
        print(name, f"{seconds[name]:.0f} s", flush=True)
    g = torch.Generator().manual_seed(0)
    has = ~scores["eap"].isnan()
    pick = torch.zeros_like(has)
    for s in scores.values():  # each method's top edges
        flat = s.abs().nan_to_num(-1.0).flatten()
        pick.view(-1)[flat.topk(n_top).indices] = True
    idx = has.nonzero()
    rand = idx[torch.randperm(len(idx), generator=g)[:n_random]]
    pick[rand[:, 0], rand[:, 1]] = True
    t = time.time()
    exact = edge_attribution(model, pairs, method="exact", edges=pick, **kw).scores
    seconds["exact (picked edges)"] = time.time() - t
    out: dict[str, Any] = {"pairs": len(pairs), "edges_patched": int(pick.sum()),
                           "seconds": seconds}
    for name, s in scores.items():
        out[name] = agreement(s, exact)
        out[name + " (random edges)"] = agreement(
            s[rand[:, 0], rand[:, 1]], exact[rand[:, 0], rand[:, 1]])
    print({k: v for k, v in out.items() if isinstance(v, dict)}, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", default="1,2,5,10,20")
    ap.add_argument("--sections", default="planted,random,demo")
    ap.add_argument("--n-pairs", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--n-top", type=int, default=60)
    ap.add_argument("--n-random", type=int, default=200)
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("TL_REWARD_THREADS", "1")))
    steps = tuple(int(s) for s in args.steps.split(","))
    out = json.loads(OUT.read_text()) if OUT.exists() else {}
    sections = args.sections.split(",")
    if "planted" in sections:
        out["planted"] = planted(steps)
    if "random" in sections:
        out["random"] = random_models(steps)
    if "demo" in sections:
        out["demo"] = demo(args.n_pairs, args.max_tokens, args.n_top, args.n_random)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, indent=1))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
