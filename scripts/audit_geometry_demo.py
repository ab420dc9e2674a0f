"""Conflict and concept numbers of the multi-objective demo RM (``tl-reward/smollm2-135m-multi``).

Data: HH-RLHF harmless-base test pairs from index 700 on (after the pairs the sentiment head was
trained on) whose prompt is a single user turn (short sequences keep this affordable on a CPU),
the first ``--n-pairs`` of them. Writes ``scripts/audit_geometry_demo_results.json``.

    python scripts/audit_geometry_demo.py --n-pairs 60
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tl_reward import HookedRewardModel
from tl_reward.audit.concepts import (
    concept_alignment,
    concept_vector,
    published_concept_alignment,
    steering_curve,
)
from tl_reward.audit.conflict import (
    behavioural_conflict,
    geometric_conflict,
    gradient_conflict,
    published_conflict,
)
from tl_reward.data.hh_rlhf import load_hh_rlhf
from tl_reward.model.demo import load_multi_head

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"
OUT = Path(__file__).resolve().parent / "audit_geometry_demo_results.json"
REFUSAL = ("i'm sorry", "i am sorry", "i can't", "i cannot", "i won't", "i will not",
           "i don't think i", "not appropriate", "i'm not able", "i am not able")


def vader(texts: list[str]) -> np.ndarray:
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    a = SentimentIntensityAnalyzer()
    return np.array([a.polarity_scores(t)["compound"] for t in texts])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n-pairs", type=int, default=60)
    p.add_argument("--start", type=int, default=700)
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args()
    torch.set_num_threads(2)
    t0 = time.time()
    pairs = [q for q in load_hh_rlhf(DATA)[args.start:] if len(q.prompt) == 1
             and len(q.chosen) < 600 and len(q.rejected) < 600][: args.n_pairs]
    model = HookedRewardModel.from_pretrained("tl-reward/smollm2-135m-multi", device="cpu")
    t_load = time.time() - t0
    convs = [c for q in pairs for c in (q.chosen_conversation(), q.rejected_conversation())]
    replies = [r for q in pairs for r in (q.chosen, q.rejected)]
    out: dict[str, Any] = {"n_pairs": len(pairs), "n_corpus": len(convs), "start": args.start,
                           "objectives": model.objectives}

    t = time.time()
    geo = geometric_conflict(model, convs, n_resamples=200)
    beh = behavioural_conflict(model, convs, pairs)
    out["geometric"] = geo.to_dataframe().to_dict("records")
    out["geometric_meta"] = geo.meta
    out["behavioural"] = beh.to_dataframe().to_dict("records")
    out["conflict_seconds_geo_beh"] = time.time() - t
    t = time.time()
    grad = gradient_conflict(model, convs[:10])
    out["gradient"] = grad.to_dataframe().to_dict("records")
    out["gradient_seconds"] = time.time() - t

    # published conflict: harmlessness = (chosen, rejected); sentiment = (more, less positive)
    v = vader(replies).reshape(-1, 2)
    pos_first = [(c, r) if v[i, 0] >= v[i, 1] else (r, c)
                 for i, (c, r) in enumerate(zip(convs[0::2], convs[1::2], strict=True))]
    pub = published_conflict(model, {
        "harmlessness": (convs[0::2], convs[1::2]),
        "sentiment": ([a for a, _ in pos_first], [b for _, b in pos_first])})
    out["published_conflict"] = {"cosine": float(pub.cosines[0, 1]),
                                 "verdicts": {" vs ".join(k): x for k, x in pub.verdicts.items()},
                                 "overall": pub.overall}

    # concepts at the final residual and at the middle layer
    vv = v.reshape(-1)
    raw_rows, _ = load_multi_head()
    concepts = {
        "positive sentiment (VADER > 0.3 vs < -0.3)": (
            [c for c, s in zip(convs, vv, strict=True) if s > 0.3],
            [c for c, s in zip(convs, vv, strict=True) if s < -0.3]),
        "refusal phrase vs none": (
            [c for c, r in zip(convs, replies, strict=True)
             if any(k in r.lower() for k in REFUSAL)],
            [c for c, r in zip(convs, replies, strict=True)
             if not any(k in r.lower() for k in REFUSAL)]),
    }
    out["concepts"] = []
    t = time.time()
    for name, (pos, neg) in concepts.items():
        for layer in (model.cfg.n_layers // 2, model.cfg.n_layers):
            if len(pos) < 4 or len(neg) < 4:
                continue
            cv = concept_vector(model, pos, neg, layer=layer, name=name)
            sep = None
            for k, obj in enumerate(model.objectives):
                al = concept_alignment(model, cv, convs[:20], objective=obj,
                                       separability=sep is None)
                sep = sep or al.separability
                m = min(len(pos), len(neg))
                pubc = published_concept_alignment(model, pos[:m], neg[:m], raw_rows[k],
                                                   objective=obj, name=name)
                row = {"concept": name, "layer": layer, "objective": obj, "n_pos": len(pos),
                       "n_neg": len(neg), **al.summary(),
                       "separability": sep.accuracy, "separability_ci": [sep.ci_low, sep.ci_high],
                       "published_cosine": pubc.cosine,
                       "published_separability": pubc.separability}
                if layer == model.cfg.n_layers:
                    sc = steering_curve(model, cv, convs[:10], alphas=(-2, -1, 1, 2),
                                        objective=obj)
                    row["steering_alphas"] = sc.alphas.tolist()
                    row["steering_mean_change"] = sc.change.mean(1).tolist()
                out["concepts"].append(row)
                print(json.dumps({k2: row[k2] for k2 in ("concept", "layer", "objective",
                                                         "cosine_head", "slope", "separability",
                                                         "published_cosine")}))
    out["concept_seconds"] = time.time() - t
    out["load_seconds"] = t_load
    out["wall_seconds"] = time.time() - t0
    Path(args.out).write_text(json.dumps(out, indent=2, default=float) + "\n")
    print(geo.to_dataframe().to_string())
    print(beh.to_dataframe().to_string())
    print(grad.to_dataframe().to_string())
    print(json.dumps(out["published_conflict"]))
    print(f"wall {out['wall_seconds']:.0f} s; wrote {args.out}")


if __name__ == "__main__":
    main()
