"""The seeds' RV2 experiment on our models: SmolLM2-135M-Instruct against a random-initialised copy.

Layer x layer debiased CKA, RV2, RV and linear CKA (each with a permutation null, B = 199)
between the reference (SmolLM2-135M-Instruct, the demo RM's backbone: its residual stream is the
causal LM's) and a copy of the same architecture with HF's random initialisation (seed 0), and
within each model, on the chosen conversations of the first ``--n`` HH-RLHF harmless-base test
pairs (file order) of at most ``--max-tokens`` tokens, read at the pooled token (the last real
token, as the RM reads its reward). Hook points: the embeddings (``blocks.0.hook_resid_pre``),
the residual stream after each of the 30 blocks, and the final norm's output (what a head reads).

The question (Thompson et al.'s RV2 paper): do the inputs and the targets anchor the lowest and
highest layers, so that even a random network resembles a trained one there?

With ``--tuned`` the VADER DPO policy of ``tl_reward.irm`` (SmolLM2 + LoRA, read as a
TransformerLens causal LM at its last real token) is added and compared with the reference.
Grams are saved per model under ``experiments/results/`` (a rerun reuses them), then every map
and a summary.

Run:  nohup python experiments/compare_random_init.py \
          > experiments/results/compare_random_init.log 2>&1 &
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from tl_reward import HookedRewardModel
from tl_reward.compare.layers import LayerGrams, compare_grams, layer_grams
from tl_reward.data import load_hh_rlhf
from tl_reward.model.demo import demo_hf_reward_model

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"
OUT = ROOT / "experiments" / "results"
MEASURES = ("debiased_cka", "rv2", "rv", "linear_cka")
PREFIX = "compare_random_init"


def hooks(n_layers: int) -> list[str]:
    return (["blocks.0.hook_resid_pre"]
            + [f"blocks.{i}.hook_resid_post" for i in range(n_layers)]
            + ["ln_final.hook_normalized"])


def random_copy(seed: int = 0) -> HookedRewardModel:
    """The demo RM's architecture with HF's random initialisation (normal(0, 0.02), unit norms)."""
    from transformers import LlamaForSequenceClassification

    hf, tok = demo_hf_reward_model()
    torch.manual_seed(seed)
    rand = LlamaForSequenceClassification(hf.config)
    rand.eval()
    del hf
    return HookedRewardModel.from_pretrained(hf_model=rand, tokenizer=tok, device="cpu")


def grams_for(name: str, load, inputs, hook_list, batch_size: int,
              positions: str = "pooled") -> LayerGrams:
    path = OUT / f"{PREFIX}_grams_{name}.npz"
    if path.exists():
        z = np.load(path, allow_pickle=False)
        print(f"{name}: Grams reused from {path.name}", flush=True)
        return LayerGrams(name, [str(h) for h in z["hooks"]], z["grams"], positions,
                          z["row_item"])
    model = load()
    t0 = time.time()
    g = layer_grams(model, inputs, hook_list, positions=positions, batch_size=batch_size,
                    progress=True)
    g.model = name
    np.savez(path, hooks=np.array(g.hooks), grams=g.grams, row_item=g.row_item)
    print(f"{name}: {len(g.hooks)} hook points x {g.n_rows} inputs in {time.time() - t0:.0f} s",
          flush=True)
    del model
    return g


def summarise(res, name: str) -> dict:
    out = {}
    for m in res.measures:
        obs, ex, p = res.observed[m], res.excess(m), res.p_value[m]
        k = min(obs.shape)
        out[m] = {
            "diagonal_observed": dict(zip(res.layers_a[:k], np.round(np.diag(obs[:k, :k]), 4)
                                          .tolist(), strict=True)),
            "diagonal_null_mean": dict(zip(res.layers_a[:k], np.round(
                np.diag(res.null_mean[m][:k, :k]), 4).tolist(), strict=True)),
            "diagonal_excess": dict(zip(res.layers_a[:k], np.round(np.diag(ex[:k, :k]), 4)
                                        .tolist(), strict=True)),
            "diagonal_p": dict(zip(res.layers_a[:k], np.round(np.diag(p[:k, :k]), 4).tolist(),
                                   strict=True)),
        }
    res.to_dataframe().to_csv(OUT / f"{PREFIX}_{name}.csv", index=False)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=160)
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--permutations", type=int, default=199)
    ap.add_argument("--positions", choices=["pooled", "response"], default="pooled",
                    help="rows: the pooled token of each input, or every response token "
                         "(results then carry the suffix _response)")
    ap.add_argument("--measures", nargs="+", default=list(MEASURES))
    ap.add_argument("--tuned", action="store_true",
                    help="add the VADER DPO policy of tl_reward.irm (load_vader_pair)")
    args = ap.parse_args()
    global PREFIX
    if args.positions == "response":
        PREFIX = "compare_random_init_response"
    torch.set_num_threads(int(os.environ.get("TL_REWARD_THREADS", "1")))
    OUT.mkdir(parents=True, exist_ok=True)
    _, tok = demo_hf_reward_model()
    inputs = []
    for pair in load_hh_rlhf(DATA):
        conv = pair.chosen_conversation()
        ids = tok.apply_chat_template(conv, tokenize=True, return_dict=True)["input_ids"]
        if len(ids) <= args.max_tokens:
            inputs.append(conv)
        if len(inputs) >= args.n:
            break
    print(f"{len(inputs)} conversations (<= {args.max_tokens} tokens)", flush=True)
    hook_list = hooks(30)
    grams = {
        "reference": grams_for("reference", lambda: HookedRewardModel.from_pretrained(
            "tl-reward/smollm2-135m-hh", device="cpu"), inputs, hook_list, args.batch_size,
            args.positions),
        "random": grams_for("random", random_copy, inputs, hook_list, args.batch_size,
                            args.positions),
    }
    if args.tuned:
        from tl_reward.irm.policy import load_vader_pair

        grams["tuned"] = grams_for("tuned", lambda: load_vader_pair("tl", device="cpu")[0],
                                   inputs, hook_list, args.batch_size, args.positions)
    pairs = [("reference", None), ("random", None), ("reference", "random")]
    if "tuned" in grams:
        pairs += [("reference", "tuned"), ("tuned", None)]
    summary: dict = {"n_inputs": len(inputs), "max_tokens": args.max_tokens,
                     "positions": args.positions, "n_rows": grams["reference"].n_rows,
                     "n_permutations": args.permutations, "hooks": hook_list, "maps": {}}
    figs = []
    for a, b in pairs:
        name = a if b is None else f"{a}_vs_{b}"
        t0 = time.time()
        res = compare_grams(grams[a], None if b is None else grams[b], args.measures,
                            args.permutations, seed=0)
        res.model_a, res.model_b = a, b or a
        summary["maps"][name] = summarise(res, name)
        figs.append(res.plot(kind="observed"))
        figs.append(res.plot(kind="excess"))
        print(f"{name}: done in {time.time() - t0:.0f} s", flush=True)
        (OUT / f"{PREFIX}_summary.json").write_text(json.dumps(summary, indent=1))
    from tl_reward.viz.html import save_html

    save_html(OUT / f"{PREFIX}.html", *figs,
              title="SmolLM2-135M-Instruct vs a random-initialised copy")
    print("written", OUT / f"{PREFIX}_summary.json", flush=True)


if __name__ == "__main__":
    main()
