"""Implicit reward of the packaged VADER policy against VADER (and an explicit RM if present).

Writes ``experiments/results/irm_vader.json`` after every section (a rerun skips finished
sections). Sections:

* ``layer_change``: per-layer parameter change (HF weights), the top layers.
* ``heldout_pairs``: held-out single-turn HH pairs re-ordered by VADER (never trained on); the
  share on which the implicit reward agrees with VADER, with a bootstrap CI.
* ``corpus``: implicit reward vs VADER compound over held-out HH replies (Kendall, CI).
* ``vocabulary``: IRM vocabulary sweep over the tokens whose word is in the VADER lexicon vs
  the lexicon valence (Kendall, CI).
* ``explicit``: the same against an explicit reward model's sentiment objective, when
  ``tl-reward/smollm2-135m-multi`` loads.
* ``seed_pipeline``: SAEs at the two most-changed layers, ridge to VADER utilities, Kendall.

Usage: ``python experiments/irm_vader.py [--sections a,b]``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tl_reward.irm.agreement import pair_agreement, rank_agreement
from tl_reward.irm.implicit import implicit_rewards
from tl_reward.irm.policy import load_vader_pair, vader_adapter_metadata
from tl_reward.irm.vader import token_utilities, vader_compound, vader_lexicon
from tl_reward.model.demo import cache_dir

OUT = Path(__file__).resolve().parent / "results" / "irm_vader.json"
WORK = cache_dir() / "vader_dpo"
SECTIONS = ("layer_change", "heldout_pairs", "corpus", "vocabulary", "explicit", "seed_pipeline")
VOCAB_PROMPT = "Describe how you feel in one word."


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def save(results: dict[str, Any]) -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    tmp = OUT.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=1, default=float))
    tmp.replace(OUT)


def pair_dict(a: Any) -> dict[str, Any]:
    e = a.agreement
    return {"share": e.value, "ci_low": e.ci_low, "ci_high": e.ci_high, "n": e.n}


VALENCE = ("implicit reward", "VADER valence")


def agreement_dict(a: Any) -> dict[str, Any]:
    tau = a.kendall_tau_b
    return {"kendall_tau_b": tau.value, "ci_low": tau.ci_low, "ci_high": tau.ci_high,
            "kendall_pvalue": tau.p_value, "spearman_rho": a.spearman_rho.value, "n": tau.n,
            "method": tau.method}


def heldout_pairs() -> list[dict[str, Any]]:
    return [json.loads(x) for x in (WORK / "pairs_heldout.jsonl").open()]


def corpus_items(limit: int) -> tuple[list[tuple[str, str]], np.ndarray]:
    """Held-out single-turn HH replies (both of each dialogue), cut as in training."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    from train_vader_policy import DEFAULT_DATA, hh_single_turn

    held = set(json.loads((WORK / "prompts.json").read_text())["heldout"])
    recs = [r for r in hh_single_turn(DEFAULT_DATA, 30) if r["prompt"] in held][:limit]
    items = [(r["prompt"], reply) for r in recs for reply in r["replies"]]
    return items, vader_compound([x[1] for x in items])


def main() -> None:
    global OUT
    ap = argparse.ArgumentParser()
    ap.add_argument("--sections", default=",".join(SECTIONS))
    ap.add_argument("--corpus-limit", type=int, default=150)
    ap.add_argument("--redo", action="store_true")
    ap.add_argument("--adapter", default=None, help="adapter file (default: the packaged one)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    OUT = args.out
    torch.set_num_threads(2)
    results: dict[str, Any] = json.loads(OUT.read_text()) if OUT.exists() else {}
    meta = vader_adapter_metadata(args.adapter)
    beta = float(meta["beta"])
    results["adapter"] = meta
    policy, reference, tok = load_vader_pair(backend="hf", return_tokenizer=True,
                                           adapter_path=args.adapter)
    todo = [s for s in args.sections.split(",") if args.redo or s not in results]
    log(f"sections to run: {todo}")

    if "layer_change" in todo:
        from tl_reward.irm.layers import parameter_change

        ch = parameter_change(policy, reference)
        results["layer_change"] = {"top": ch.top(5), "table": ch.to_dataframe().to_dict("list")}
        save(results)
        log(f"layer change: top {ch.top(5)}")

    if "heldout_pairs" in todo:
        pairs = heldout_pairs()
        items = [(p["prompt"], p["chosen"]) for p in pairs] + [(p["prompt"], p["rejected"])
                                                               for p in pairs]
        t0 = time.time()
        r = implicit_rewards(policy, reference, items, beta, tokenizer=tok).rewards.numpy()
        n = len(pairs)
        agr = pair_agreement(r[:n], r[n:])
        results["heldout_pairs"] = {**pair_dict(agr),
                                    "mean_margin": float(agr.margins.mean()),
                                    "seconds": time.time() - t0}
        np.save(OUT.with_name("irm_vader_pairs.npy"), r)
        save(results)
        log(f"held-out pairs: agreement {agr}")

    if "corpus" in todo:
        items, vader = corpus_items(args.corpus_limit)
        t0 = time.time()
        r = implicit_rewards(policy, reference, items, beta, tokenizer=tok).rewards.numpy()
        ra = rank_agreement(r, vader, names=("implicit reward", "VADER compound"))
        results["corpus"] = {**agreement_dict(ra), "seconds": time.time() - t0}
        np.save(OUT.with_name("irm_vader_corpus.npy"), np.stack([r, vader]))
        save(results)
        log(f"corpus: {ra}")

    if "vocabulary" in todo:
        from tl_reward.irm.pipeline import lexicon_tokens
        from tl_reward.irm.sweep import irm_vocab_sweep
        from tl_reward.sweep.lexicon import token_word

        ids, words, utils = lexicon_tokens(tok, vader_lexicon(), policy.config.vocab_size)
        t0 = time.time()
        sweep = irm_vocab_sweep(policy, reference, {"feel": VOCAB_PROMPT}, beta,
                                tokenizer=tok, ids=ids, batch_size=128,
                                model_name="smollm2-vader-dpo")
        util = token_utilities(sweep.tokens)
        # a word's tokens (" love", "Love", ...) are near-duplicates: the CI resamples words
        words = [token_word(t) for t in sweep.tokens]
        ra = rank_agreement(sweep.rewards[:, 0].numpy(), util, names=VALENCE, units=words,
                            unit="word")
        first = rank_agreement(sweep.first[:, 0].numpy(), util, names=VALENCE, units=words,
                               unit="word")
        df = sweep.to_dataframe().assign(utility=util)
        df.to_csv(OUT.with_name("irm_vader_vocab.csv"), index=False)
        top = df.nlargest(10, "reward")["token"].tolist()
        bottom = df.nsmallest(10, "reward")["token"].tolist()
        results["vocabulary"] = {**agreement_dict(ra), "first_term_only": agreement_dict(first),
                                 "prompt": VOCAB_PROMPT, "n_tokens": len(ids),
                                 "top10": top, "bottom10": bottom,
                                 "seconds": time.time() - t0}
        save(results)
        log(f"vocabulary: {ra}; top {top}; bottom {bottom}")

    if "explicit" in todo:
        try:
            from tl_reward import HookedRewardModel

            rm = HookedRewardModel.from_pretrained("tl-reward/smollm2-135m-multi", device="cpu")
        except Exception as exc:  # noqa: BLE001 - report and skip
            log(f"explicit RM unavailable: {exc}")
            rm = None
        if rm is not None:
            obj = next((o for o in rm.objectives if "sentiment" in o.lower()), rm.objectives[-1])
            k = rm.objective_index(obj)
            pairs = heldout_pairs()
            items = [(p["prompt"], p["chosen"]) for p in pairs] + [(p["prompt"], p["rejected"])
                                                                   for p in pairs]
            ex = rm.rewards(items).rewards[:, k].float().numpy()
            irm_pairs = np.load(OUT.with_name("irm_vader_pairs.npy"))
            n = len(pairs)
            # the explicit RM's own order of each pair, then the IRM's agreement with it
            sign = np.sign(ex[:n] - ex[n:])
            agr = pair_agreement(sign * (irm_pairs[:n] - irm_pairs[n:]), np.zeros(n))
            vs_vader = pair_agreement(ex[:n], ex[n:])
            citems, cvader = corpus_items(args.corpus_limit)
            cex = rm.rewards(citems).rewards[:, k].float().numpy()
            cirm = np.load(OUT.with_name("irm_vader_corpus.npy"))[0]
            results["explicit"] = {
                "model": "tl-reward/smollm2-135m-multi", "objective": obj,
                "irm_vs_explicit_pairs": pair_dict(agr),
                "explicit_vs_vader_pairs": pair_dict(vs_vader),
                "irm_vs_explicit_corpus": agreement_dict(rank_agreement(cirm, cex)),
                "explicit_vs_vader_corpus": agreement_dict(rank_agreement(cex, cvader)),
            }
            save(results)
            log(f"explicit: {results['explicit']}")

    if "seed_pipeline" in todo:
        from tl_reward.irm.layers import parameter_change
        from tl_reward.irm.models import hooked_causal_lm
        from tl_reward.irm.pipeline import run_seed_pipeline
        from tl_reward.model.inputs import encode

        change = parameter_change(policy, reference)
        pol_tl, ref_tl = hooked_causal_lm(policy, tok), hooked_causal_lm(reference, tok)
        items, _ = corpus_items(args.corpus_limit)
        corpus = [encode(tok, x) for x in items]
        t0 = time.time()
        res = run_seed_pipeline(pol_tl, ref_tl, corpus, vader_lexicon(), prompt=VOCAB_PROMPT,
                                n_layers=2, layer_change=change, d_sae=2048, k=32,
                                sae_epochs=4, batch_size_tokens=512)
        results["seed_pipeline"] = {"layers": res.layers,
                                    "sae_metrics": res.sae_metrics.to_dict("records"),
                                    "reconstruction": res.to_dataframe().to_dict("records"),
                                    "seconds": time.time() - t0}
        save(results)
        log(f"seed pipeline:\n{res.to_dataframe()}")
    log("done")


if __name__ == "__main__":
    main()
