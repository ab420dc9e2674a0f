"""Conflict and concept numbers of the multi-objective demo RM (``tl-reward/smollm2-135m-multi``).

Two stages, so that the numbers are affordable on a shared 2-core CPU:

1. ``--dump``: the residual at the pooled token (final layer, before the norm, and the middle
   layer) of HH-RLHF pairs from index 700 on (after the pairs the sentiment head was trained on)
   whose prompt is a single user turn, ``--n-pairs`` of them. The backbone is shared by every
   SmolLM2 demo RM, so any head will do for this stage.
2. default: with the trained heads, every number from library functions on those activations
   and on the training script's features (HF's final normed state at the pooled token) of the
   heads' held-out pairs among the first 700, the corpus: only those rows are extracted
   (``train_demo_head.extract_rows``; the full cache's rows when it exists). Geometric
   conflict (``geometric_conflict(normed=...)``: the feature divided by the norm's gain is the
   normed residual the head columns read), behavioural conflict (``pair_correlation`` and
   ``pair_disagreement`` on the heads' scores and margins, which equal HF's rewards: rows,
   verdicts and the disagreement's test family as ``behavioural_conflict`` gives them), the
   published conflict, and concepts (``concept_from_activations``,
   ``concept_separability``, the head cosine and the slope through ``local_gradient``; steering
   at the final residual is exact from the stored residual: the norm and the head are all that
   follow it).

Writes ``scripts/audit_geometry_demo_results.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tl_reward import HookedRewardModel
from tl_reward.audit.concepts import concept_from_activations, concept_separability, local_gradient
from tl_reward.audit.conflict import (
    ConflictResult,
    Thresholds,
    geometric_conflict,
    pair_correlation,
    pair_disagreement,
)
from tl_reward.audit.pooled import pooled_residual
from tl_reward.compat.published import published_verdict
from tl_reward.data.hh_rlhf import load_hh_rlhf
from tl_reward.model.demo import cache_dir, load_multi_head, smollm2_local_dir
from tl_reward.model.readout import normalise
from tl_reward.stats.paired import sign_flip_test

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"
OUT = Path(__file__).resolve().parent / "audit_geometry_demo_results.json"
DUMP = cache_dir() / "multi_audit_dump.pt"
REFUSAL = ("i'm sorry", "i am sorry", "i can't", "i cannot", "i won't", "i will not",
           "i don't think i", "not appropriate", "i'm not able", "i am not able")


def vader(texts: list[str]) -> np.ndarray:
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    a = SentimentIntensityAnalyzer()
    return np.array([a.polarity_scores(t)["compound"] for t in texts])


def dump(n_pairs: int, start: int) -> None:
    t0 = time.time()
    pairs = [q for q in load_hh_rlhf(DATA)[start:] if len(q.prompt) == 1
             and len(q.chosen) < 600 and len(q.rejected) < 600][:n_pairs]
    model = HookedRewardModel.from_pretrained("tl-reward/smollm2-135m-hh", device="cpu")
    convs = [c for q in pairs for c in (q.chosen_conversation(), q.rejected_conversation())]
    replies = [r for q in pairs for r in (q.chosen, q.rejected)]
    h_final = pooled_residual(model, convs)
    h_mid = pooled_residual(model, convs, layer=model.cfg.n_layers // 2)
    torch.save({"h_final": h_final, "h_mid": h_mid, "replies": replies, "start": start,
                "n_pairs": len(pairs), "seconds": time.time() - t0}, DUMP)
    print(f"dumped {len(convs)} conversations in {time.time() - t0:.0f} s to {DUMP}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dump", action="store_true")
    p.add_argument("--n-pairs", type=int, default=30)
    p.add_argument("--start", type=int, default=700)
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.dump:
        dump(args.n_pairs, args.start)
        return
    t0 = time.time()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import train_demo_head as demo
    import train_multi_head as multi

    model = HookedRewardModel.from_pretrained("tl-reward/smollm2-135m-multi", device="cpu")
    raw, meta = load_multi_head()
    out: dict[str, Any] = {"objectives": model.objectives}

    # ---- corpus: the heads' held-out pairs, their rows of the training feature cache only
    _, held = multi.demo_split(int(meta["n_pairs_used"]), 0)
    blob = demo.extract_rows(demo.parse_args(["--limit", str(meta["limit"] or 0)]), held)
    if blob["n_pairs_used"] != meta["n_pairs_used"]:
        raise RuntimeError(f"{blob['n_pairs_used']} pairs in the feature cache, but the heads "
                           f"were trained on {meta['n_pairs_used']}")
    fc, fr = blob["chosen"].double(), blob["rejected"].double()
    out["features"] = {"rows": len(held), "source": blob["source"],
                       "extract_seconds": blob["extract_seconds"]}
    from safetensors import safe_open

    with safe_open(str(smollm2_local_dir() / "model.safetensors"), framework="pt") as fh:
        gain = fh.get_tensor("model.norm.weight").double()
    feats = torch.cat([fc, fr])
    geo = geometric_conflict(model, normed=feats / gain)
    out["geometric"] = geo.to_dataframe().to_dict("records")
    out["geometric_meta"] = geo.meta
    w = raw.double()  # HF's rows: reward = feature . row
    names = list(model.objectives)
    s_all = (feats @ w.T).numpy()
    m = ((fc - fr) @ w.T).numpy()
    disagreement, family = pair_disagreement(list(m.T), names, 0.05, seed=0)
    beh = ConflictResult(names, pair_correlation(list(s_all.T), names, Thresholds(), 2000,
                                                 seed=0) + disagreement, Thresholds(),
                         {"n_corpus": len(s_all), "n_pairs": len(m),
                          "pair disagreement family": family})
    out["behavioural"] = beh.to_dataframe().to_dict("records")
    out["behavioural_meta"] = beh.meta
    out["n_heldout_pairs"] = len(held)

    # ---- the dumped residuals: published conflict and concepts
    d = torch.load(DUMP, weights_only=False)
    h_final, h_mid, replies = d["h_final"].double(), d["h_mid"].double(), d["replies"]
    out["dump"] = {"n_pairs": d["n_pairs"], "start": d["start"], "seconds": d["seconds"]}
    v = vader(replies).reshape(-1, 2)
    hc, hr = h_final[0::2], h_final[1::2]
    more_pos = torch.from_numpy(v[:, 0] >= v[:, 1])[:, None]
    d_harm = (hc - hr).mean(0)
    d_sent = torch.where(more_pos, hc - hr, hr - hc).mean(0)
    pub_cos = float(d_harm @ d_sent / (d_harm.norm() * d_sent.norm()))
    out["published_conflict"] = {"cosine": pub_cos, "verdict": published_verdict(pub_cos)}

    vv = v.reshape(-1)
    refusal = np.array([any(k in r.lower() for k in REFUSAL) for r in replies])
    concepts = {"positive sentiment (VADER > 0.3 vs < -0.3)": (vv > 0.3, vv < -0.3),
                "refusal phrase vs none": (refusal, ~refusal)}
    out["concepts"] = []
    n = model.cfg.n_layers
    w_u = model.W_U.detach().double()  # gain folded: the direction in residual coordinates
    normed_final = normalise(model, h_final)
    for name, (pos_m, neg_m) in concepts.items():
        if pos_m.sum() < 4 or neg_m.sum() < 4:
            continue
        pm, nm = torch.from_numpy(pos_m), torch.from_numpy(neg_m)
        for layer, h in ((n // 2, h_mid), (n, h_final)):
            cv = concept_from_activations(name, layer, h[pm].float(), h[nm].float())
            sep = concept_separability(cv)
            u = cv.unit.double()
            k_pub = int(min(pm.sum(), nm.sum()))
            pub_v = (h_final[pm][:k_pub] - h_final[nm][:k_pub]).mean(0)
            pub_v = pub_v / pub_v.norm()
            for k, obj in enumerate(model.objectives):
                wk = w_u[:, k]
                g = local_gradient(model, h_final, wk.expand_as(h_final)).double()
                slope = (cv.spread * (g @ u)).numpy()
                t = sign_flip_test(slope)
                lo, hi = t.ci_low, t.ci_high
                row = {"concept": name, "layer": layer, "objective": obj,
                       "n_pos": int(pm.sum()), "n_neg": int(nm.sum()),
                       "cosine_head": float(wk @ u / wk.norm()),
                       "slope": float(slope.mean()), "slope_ci_low": lo, "slope_ci_high": hi,
                       "spread": cv.spread, "separability": sep.accuracy,
                       "separability_ci": [sep.ci_low, sep.ci_high],
                       "published_cosine": float(pub_v @ raw[k].double() / raw[k].norm()),
                       "published_separability": float(pub_v.norm())}
                if layer == n:  # exact: only the final norm and the head follow
                    base = (normed_final * wk).sum(-1)
                    alphas = [-2.0, -1.0, 1.0, 2.0]
                    row["steering_alphas"] = alphas
                    row["steering_mean_change"] = [
                        float(((normalise(model, h_final + a * cv.spread * u) * wk).sum(-1)
                               - base).mean()) for a in alphas]
                    row["steering_predicted"] = [a * row["slope"] for a in alphas]
                out["concepts"].append(row)
    out["wall_seconds"] = time.time() - t0
    Path(args.out).write_text(json.dumps(out, indent=2, default=float) + "\n")
    print(json.dumps(out, indent=1, default=float))


if __name__ == "__main__":
    main()
