"""Conflict and concept numbers of the multi-objective demo RM (``tl-reward/smollm2-135m-multi``).

Data: HH-RLHF harmless-base test pairs from index 700 on (after the pairs the sentiment head was
trained on) whose prompt is a single user turn (short sequences keep this affordable on a CPU),
the first ``--n-pairs`` of them. Writes ``scripts/audit_geometry_demo_results.json``.

    python scripts/audit_geometry_demo.py --n-pairs 20
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
    concept_from_activations,
    concept_separability,
    steering_curve,
)
from tl_reward.audit.conflict import (
    behavioural_conflict,
    geometric_conflict,
    gradient_conflict,
    published_verdict,
)
from tl_reward.audit.pooled import pooled_residual
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
    p.add_argument("--n-pairs", type=int, default=20)
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
    grad = gradient_conflict(model, convs[:4])
    out["gradient"] = grad.to_dataframe().to_dict("records")
    out["gradient_seconds"] = time.time() - t

    # one pass for the final residual at t* of every conversation: the published definitions
    # (exactly as published_conflict / published_concept_alignment compute them) and the concept
    # vectors at the final layer are derived from it
    t = time.time()
    h_final = pooled_residual(model, convs)
    h_mid = pooled_residual(model, convs, layer=model.cfg.n_layers // 2)
    v = vader(replies).reshape(-1, 2)
    hc, hr = h_final[0::2], h_final[1::2]
    more_pos = torch.from_numpy(v[:, 0] >= v[:, 1])[:, None]
    d_harm = (hc - hr).mean(0)
    d_sent = torch.where(more_pos, hc - hr, hr - hc).mean(0)
    pub_cos = float(d_harm @ d_sent / (d_harm.norm() * d_sent.norm()))
    out["published_conflict"] = {"cosine": pub_cos, "verdict": published_verdict(pub_cos),
                                 "definition": "mean(h_pref - h_disp) per term at the final "
                                               "residual before the norm; harmlessness: "
                                               "chosen vs rejected; sentiment: the reply with "
                                               "the higher VADER compound vs the other"}

    vv = v.reshape(-1)
    raw_rows, _ = load_multi_head()
    refusal = np.array([any(k in r.lower() for k in REFUSAL) for r in replies])
    concepts = {"positive sentiment (VADER > 0.3 vs < -0.3)": (vv > 0.3, vv < -0.3),
                "refusal phrase vs none": (refusal, ~refusal)}
    out["concepts"] = []
    for name, (pos_m, neg_m) in concepts.items():
        if pos_m.sum() < 4 or neg_m.sum() < 4:
            continue
        pm, nm = torch.from_numpy(pos_m), torch.from_numpy(neg_m)
        for layer, h in ((model.cfg.n_layers // 2, h_mid), (model.cfg.n_layers, h_final)):
            cv = concept_from_activations(name, layer, h[pm], h[nm])
            sep = concept_separability(cv)
            m = int(min(pm.sum(), nm.sum()))
            pub_v = (h_final[pm][:m] - h_final[nm][:m]).mean(0)
            pub_v = pub_v / pub_v.norm()
            for k, obj in enumerate(model.objectives):
                al = concept_alignment(model, cv, convs[:10], objective=obj, separability=False)
                row = {"concept": name, "layer": layer, "objective": obj,
                       "n_pos": int(pm.sum()), "n_neg": int(nm.sum()), **al.summary(),
                       "separability": sep.accuracy,
                       "separability_ci": [sep.ci_low, sep.ci_high],
                       "published_cosine": float(pub_v @ raw_rows[k] / raw_rows[k].norm()),
                       "published_separability": float(pub_v.norm())}
                if layer == model.cfg.n_layers:
                    sc = steering_curve(model, cv, convs[:6], alphas=(-2, 2), objective=obj)
                    row["steering_alphas"] = sc.alphas.tolist()
                    row["steering_mean_change"] = sc.change.mean(1).tolist()
                    row["steering_predicted"] = (sc.alphas * sc.predicted_slope.mean()).tolist()
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
