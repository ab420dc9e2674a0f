"""Train the multi-objective demo heads: harmlessness (Bradley-Terry) and sentiment (ridge).

Both heads read the same feature as the demo head (``scripts/train_demo_head.py``, whose code
and feature cache this script reuses): the final *normed* hidden state of SmolLM2-135M-Instruct
at the last real token of the chat-templated HH-RLHF conversation (HF's pooled position).

* ``harmlessness``: the packaged demo head itself (``smollm2_hh_head.safetensors``, the
  Bradley-Terry head of ``scripts/train_demo_head.py`` on all 2,248 usable pairs), copied
  verbatim; its held-out accuracy is the demo script's, and it is re-evaluated here on the
  held-out pairs of this run. ``--refit`` fits it afresh on this run's training pairs instead
  (same code as the demo script).
* ``sentiment``: ridge regression (no intercept, as ``LlamaForSequenceClassification``'s score
  layer has no bias) of the **VADER compound score of the assistant reply** (the final
  assistant message alone, ``vaderSentiment`` 3.3.2's ``polarity_scores(reply)["compound"]``,
  in [-1, 1]) on the feature of each conversation (chosen and rejected alike); the penalty is
  picked by 5-fold CV over training *pairs* (both replies of a pair in the same fold). Its output
  is in compound units.

The split is by pair and is the demo head's own (seed 0, 80/20 over the demo's 2,248 pairs),
restricted to the pairs this run uses (``--limit N`` takes the first N, which keeps feature
extraction affordable on a shared CPU), so neither head has seen a held-out pair and no
held-out reply shares a prompt with a training reply. Held-out metrics: pairwise accuracy of
the harmlessness head (bootstrap CI over pairs) and R^2 of the sentiment head (bootstrap CI
over pairs; R^2 computed around the held-out mean). The two rows are written to
``tl_reward/assets/smollm2_multi_head.safetensors`` (``weight`` ``[2, d_model]``) with the
training metadata. There is no combined score: the objectives are kept apart on purpose.

Usage::

    python scripts/train_multi_head.py                      # the packaged run (first 700 pairs)
    python scripts/train_multi_head.py --limit 40 --out /tmp/multi.safetensors \
        --results /tmp/multi.json                           # quick end-to-end check
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_demo_head as demo  # noqa: E402  (the demo head's features, BT fit and bootstrap)

from tl_reward.data.hh_rlhf import load_hh_rlhf  # noqa: E402
from tl_reward.model.demo import MULTI_HEAD_FILE, MULTI_OBJECTIVES, load_demo_head  # noqa: E402

DEFAULT_RESULTS = Path(__file__).resolve().parent / "train_multi_head_results.json"
RIDGE_GRID = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0, 3.0, 10.0, 30.0)
SENTIMENT_TARGET = "VADER compound score of the assistant reply (vaderSentiment 3.3.2)"


def vader_compound(texts: list[str]) -> np.ndarray:
    """VADER compound score in [-1, 1] of each text."""
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    analyser = SentimentIntensityAnalyzer()
    return np.array([analyser.polarity_scores(t)["compound"] for t in texts], dtype=np.float64)


def fit_ridge(x: np.ndarray, y: np.ndarray, lam: float) -> np.ndarray:
    """Minimise ``mean (y - x w)^2 + lam |w|^2`` (no intercept), closed form in float64."""
    n, d = x.shape
    return np.linalg.solve(x.T @ x / n + lam * np.eye(d), x.T @ y / n)


def r_squared(y: np.ndarray, pred: np.ndarray) -> float:
    """``1 - SSE / SST`` with SST around the mean of ``y`` (can be negative)."""
    return float(1.0 - ((y - pred) ** 2).sum() / ((y - y.mean()) ** 2).sum())


def ridge_cv(x_pairs: np.ndarray, y_pairs: np.ndarray, grid: tuple[float, ...], k: int,
             seed: int) -> tuple[float, list[dict[str, float]]]:
    """k-fold CV over pairs (``x_pairs`` ``[n, 2, d]``, ``y_pairs`` ``[n, 2]``); lowest mean MSE."""
    rng = np.random.default_rng(seed)
    folds = np.array_split(rng.permutation(len(x_pairs)), k)
    d = x_pairs.shape[-1]
    rows = []
    for lam in grid:
        mses, r2s = [], []
        for f in range(k):
            trn = np.concatenate([folds[g] for g in range(k) if g != f])
            w = fit_ridge(x_pairs[trn].reshape(-1, d), y_pairs[trn].reshape(-1), lam)
            xv, yv = x_pairs[folds[f]].reshape(-1, d), y_pairs[folds[f]].reshape(-1)
            pred = xv @ w
            mses.append(float(((yv - pred) ** 2).mean()))
            r2s.append(r_squared(yv, pred))
        rows.append({"lambda": lam, "cv_mse": float(np.mean(mses)), "cv_r2": float(np.mean(r2s))})
        print(f"  lambda={lam:<8g} cv_mse={rows[-1]['cv_mse']:.4f} cv_r2={rows[-1]['cv_r2']:.4f}")
    return min(rows, key=lambda r: r["cv_mse"])["lambda"], rows


def bootstrap_pairs(stat: Any, n_pairs: int, n_boot: int, seed: int) -> list[float]:
    """Percentile 95% bootstrap CI of ``stat(idx)`` over resampled pair indices."""
    rng = np.random.default_rng(seed)
    vals = np.array([stat(rng.integers(0, n_pairs, n_pairs)) for _ in range(n_boot)])
    return [float(np.quantile(vals, 0.025)), float(np.quantile(vals, 0.975))]


def fit_harmlessness(f_c: torch.Tensor, f_r: torch.Tensor, train: torch.Tensor,
                     held: torch.Tensor, seed: int, n_boot: int) -> tuple[torch.Tensor, dict]:
    """The demo script's Bradley-Terry fit (same standardisation, CV and scaling)."""
    d = f_c - f_r
    scale = d[train].pow(2).mean(0).sqrt().clamp_min(1e-8)
    z = d / scale
    print("harmlessness (Bradley-Terry), 5-fold CV on train pairs:")
    lam, cv_rows = demo.cross_validate(z[train], demo.LAMBDA_GRID, k=5, seed=seed)
    w = demo.fit_bt(z[train], lam) / scale
    reward_std = float(torch.cat([f_c[train] @ w, f_r[train] @ w]).std())
    w = w / reward_std
    correct = ((d[held] @ w).numpy() > 0).astype(np.float64)
    train_acc, _ = demo.bt_metrics(d[train], w)
    _, held_loss = demo.bt_metrics(d[held], w * reward_std)
    stats = {
        "method": "Bradley-Terry logistic loss on chosen-minus-rejected features, L2 penalty on "
                  "the weight over RMS-standardised differences, no bias",
        "lambda": lam, "lambda_grid": list(demo.LAMBDA_GRID), "cv": cv_rows,
        "heldout_accuracy": float(correct.mean()),
        "heldout_ci95": demo.bootstrap_ci(correct, n_boot, seed),
        "heldout_bt_logloss": held_loss, "train_accuracy": train_acc,
        "reward_scale": "unit standard deviation over training replies (chosen and rejected)",
    }
    return w, stats


def fit_sentiment(f_c: torch.Tensor, f_r: torch.Tensor, y_c: np.ndarray, y_r: np.ndarray,
                  train: np.ndarray, held: np.ndarray, seed: int, n_boot: int
                  ) -> tuple[torch.Tensor, dict]:
    """Ridge regression of the VADER compound score on the feature (no intercept)."""
    x = torch.stack([f_c, f_r], 1).double().numpy()  # [n, 2, d]
    y = np.stack([y_c, y_r], 1)  # [n, 2]
    d = x.shape[-1]
    scale = np.sqrt((x[train].reshape(-1, d) ** 2).mean(0)).clip(1e-8)
    z = x / scale
    print("sentiment (ridge on VADER compound), 5-fold CV on train pairs:")
    lam, cv_rows = ridge_cv(z[train], y[train], RIDGE_GRID, k=5, seed=seed)
    w = fit_ridge(z[train].reshape(-1, d), y[train].reshape(-1), lam) / scale
    pred = x @ w  # [n, 2]
    yh, ph = y[held], pred[held]

    def r2_of(idx: np.ndarray) -> float:
        return r_squared(yh[idx].reshape(-1), ph[idx].reshape(-1))

    def r_of(idx: np.ndarray) -> float:
        return float(np.corrcoef(yh[idx].reshape(-1), ph[idx].reshape(-1))[0, 1])

    stats = {
        "method": "ridge regression (mean squared error + lambda |w|^2 over RMS-standardised "
                  "features), no intercept; both replies of a pair are samples",
        "target": SENTIMENT_TARGET,
        "lambda": lam, "lambda_grid": list(RIDGE_GRID), "cv": cv_rows,
        "heldout_r2": r2_of(np.arange(len(held))),
        "heldout_r2_ci95": bootstrap_pairs(r2_of, len(held), n_boot, seed),
        "heldout_pearson_r": r_of(np.arange(len(held))),
        "heldout_pearson_r_ci95": bootstrap_pairs(r_of, len(held), n_boot, seed),
        "train_r2": r_squared(y[train].reshape(-1), pred[train].reshape(-1)),
        "target_mean_all": float(y.mean()), "target_sd_all": float(y.std(ddof=1)),
        "target_share_zero": float((y == 0).mean()),
        "chosen_minus_rejected_target_mean": float((y_c - y_r).mean()),
    }
    return torch.from_numpy(w), stats


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (the feature options are the demo script's)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=str(demo.DEFAULT_DATA), help="HH-RLHF .jsonl(.gz) file")
    p.add_argument("--max-tokens", type=int, default=256, help="max templated length")
    p.add_argument("--limit", type=int, default=700,
                   help="use only the first N valid pairs (0: all; the packaged heads used 700)")
    p.add_argument("--seed", type=int, default=0, help="seed for the split, CV folds, bootstrap")
    p.add_argument("--out", default=str(MULTI_HEAD_FILE), help="output safetensors file")
    p.add_argument("--results", default=str(DEFAULT_RESULTS), help="output JSON summary")
    p.add_argument("--recompute", action="store_true", help="ignore the feature cache")
    p.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples")
    p.add_argument("--refit", action="store_true",
                   help="refit the harmlessness head on this run's pairs (default: demo head)")
    return p.parse_args(argv)


def demo_split(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The demo head's train / held-out split (over its ``n_pairs_used`` pairs, seed ``seed``)
    restricted to the first ``n`` pairs; the feature caches list pairs in the same order."""
    _, meta = load_demo_head()
    n_full = int(meta["n_pairs_used"])
    if n > n_full:
        raise RuntimeError(f"{n} pairs but the demo head was trained on {n_full}")
    perm = np.random.default_rng(seed).permutation(n_full)
    n_train = int(round(0.8 * n_full))
    train, held = perm[:n_train], perm[n_train:]
    return np.sort(train[train < n]), np.sort(held[held < n])


def main(argv: list[str] | None = None) -> None:
    """Fit both heads on the demo features, evaluate on held-out pairs, and save."""
    from safetensors.torch import save_file

    args = parse_args(argv)
    args.limit = args.limit or None
    torch.set_num_threads(2)
    t_start = time.time()
    blob = demo.extract_or_load(args)
    pairs = load_hh_rlhf(Path(args.data), limit=args.limit)
    index = blob["pair_index"].tolist()
    if [int(pairs[i].meta["index"]) for i in index] != blob["record_index"].tolist():
        raise RuntimeError("the feature cache does not line up with the loaded pairs")
    y_c = vader_compound([pairs[i].chosen for i in index])
    y_r = vader_compound([pairs[i].rejected for i in index])

    f_c, f_r = blob["chosen"].double(), blob["rejected"].double()
    n = len(f_c)
    train, held = demo_split(n, args.seed)
    tr, he = torch.from_numpy(train), torch.from_numpy(held)
    print(f"{n} pairs: {len(train)} train / {len(held)} held-out (the demo head's split)")

    if args.refit:
        w_h, harm = fit_harmlessness(f_c, f_r, tr, he, args.seed, args.n_boot)
    else:
        demo_w, demo_meta = load_demo_head()
        w_h = demo_w[0].double()
        correct = (((f_c[he] - f_r[he]) @ w_h).numpy() > 0).astype(np.float64)
        harm = {
            "method": "the packaged demo head (scripts/train_demo_head.py), copied verbatim",
            "demo_heldout_accuracy": demo_meta["heldout_accuracy"],
            "demo_heldout_ci95": demo_meta["heldout_ci95"],
            "demo_n_train": demo_meta["n_train"], "demo_n_heldout": demo_meta["n_heldout"],
            "lambda": demo_meta["lambda"],
            "heldout_accuracy": float(correct.mean()),
            "heldout_ci95": demo.bootstrap_ci(correct, args.n_boot, args.seed),
            "reward_scale": demo_meta["reward_scale"],
        }
    w_s, sent = fit_sentiment(f_c, f_r, y_c, y_r, train, held, args.seed, args.n_boot)

    # How the two objectives relate on held-out data (the conflict a user would measure).
    s_h = torch.cat([f_c[he] @ w_h, f_r[he] @ w_h]).numpy()
    s_s = torch.cat([f_c[he] @ w_s, f_r[he] @ w_s]).numpy()
    pref_h = ((f_c[he] - f_r[he]) @ w_h).numpy() > 0
    pref_s = ((f_c[he] - f_r[he]) @ w_s).numpy() > 0
    cos = float(torch.nn.functional.cosine_similarity(w_h, w_s, dim=0))
    relation = {
        "heldout_score_pearson_r": float(np.corrcoef(s_h, s_s)[0, 1]),
        "heldout_pair_disagreement_share": float((pref_h != pref_s).mean()),
        "heldout_sentiment_head_pairwise_accuracy_on_harmlessness": float(pref_s.mean()),
        "raw_cosine_of_head_rows": cos,
    }
    try:
        demo_w, _ = load_demo_head()
        relation["cosine_with_packaged_demo_head"] = float(
            torch.nn.functional.cosine_similarity(w_h.float(), demo_w[0].float(), dim=0))
    except Exception as exc:  # noqa: BLE001 - informative only
        relation["cosine_with_packaged_demo_head"] = f"unavailable: {exc}"

    results: dict[str, Any] = {
        "objectives": list(MULTI_OBJECTIVES),
        "combined_score": "none (the objectives are kept apart; pass objective=<name>)",
        "backbone": demo.BACKBONE, "feature": demo.FEATURE, "pooling": demo.POOLING,
        "pad_token_id": demo.PAD_ID,
        "data_file": Path(blob["data"]).name, "data_sha256": blob["data_sha256"],
        "max_tokens": args.max_tokens, "limit": args.limit,
        "n_pairs_used": n, "n_train": len(train), "n_heldout": len(held), "seed": args.seed,
        "split": "by pair: the demo head's 80/20 split (seed 0 over its 2,248 pairs) "
                 "restricted to the pairs used here",
        "harmlessness": harm, "sentiment": sent, "relation": relation,
        "bias": "none for either head",
        "hf_parity_max_abs_diff": blob["hf_parity_max_abs_diff"],
        "extract_seconds": blob["extract_seconds"],
        "wall_seconds": time.time() - t_start,
    }
    weight = torch.stack([w_h, w_s]).float().contiguous()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file({"weight": weight}, str(out),
              metadata={k: json.dumps(v) for k, v in results.items()})
    Path(args.results).write_text(json.dumps(results, indent=2) + "\n")

    print("\n=== multi-objective demo heads ===")
    print(f"harmlessness held-out pairwise accuracy {harm['heldout_accuracy']:.4f} "
          f"95% CI {harm['heldout_ci95']} ({len(held)} pairs)")
    print(f"sentiment    held-out R^2 {sent['heldout_r2']:.4f} 95% CI {sent['heldout_r2_ci95']} "
          f"(r = {sent['heldout_pearson_r']:.3f})")
    print(f"relation: {json.dumps(relation)}")
    print(f"wall time {results['wall_seconds']:.0f} s; wrote {out} and {args.results}")


if __name__ == "__main__":
    main()
