"""Single-feature SAE ablation: restart after the SAE's block against SAELens's full splice.

For an SAE at ``blocks.L.hook_resid_post`` the ablated activation is ``x - f_i d_i`` (error
node on), so the run can restart at block ``L + 1`` from it, with the blocks before the SAE run
once per input. The naive way splices the SAE in with ``model.saes(..., use_error_term=True)``
and runs every row through every block. Same inputs, same features, same run; the script
prints both times and the largest difference in the ablated rewards.

    python benchmarks/sae_ablation.py [--layer 20] [--features 8] [--n 4]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from sae_lens.saes.sae import SAEMetadata
from sae_lens.saes.topk_sae import TopKSAE, TopKSAEConfig

from tl_reward.sae.ablation import ablated_objectives

ROOT = Path(__file__).resolve().parents[1]
HH = ROOT.parent / "shared" / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tl-reward/smollm2-135m-hh")
    parser.add_argument("--layer", type=int, default=20)
    parser.add_argument("--features", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(2)

    from tl_reward.cli.demo import EXAMPLE_PAIRS
    from tl_reward.data import load_hh_rlhf
    from tl_reward.model.hooked_sae_reward_model import HookedSAERewardModel

    model = HookedSAERewardModel.from_pretrained(args.model, device="cpu")
    pairs = load_hh_rlhf(HH, limit=50) if HH.exists() else list(EXAMPLE_PAIRS)
    convs = [p.chosen_conversation() for p in pairs
             if len(model.encode(p.chosen_conversation()).ids) <= 160][: args.n]
    hook = f"blocks.{args.layer}.hook_resid_post"
    torch.manual_seed(0)
    cfg = TopKSAEConfig(d_in=model.cfg.d_model, d_sae=8 * model.cfg.d_model, k=32)
    cfg.metadata = SAEMetadata(hook_name=hook)
    sae = TopKSAE(cfg)
    sets = [[i] for i in range(args.features)]
    times = {"restart": 0.0, "splice": 0.0}
    worst = 0.0
    for conv in convs:
        batch = model.make_batch(conv)
        out = {}
        for name, fast in (("restart", True), ("splice", False)):
            t = time.perf_counter()
            out[name] = ablated_objectives(model, sae, batch.tokens, batch.attention_mask, sets,
                                           ["reward"], fast=fast)
            times[name] += time.perf_counter() - t
        worst = max(worst, float((out["restart"] - out["splice"]).abs().max()))
    n_tok = sum(len(model.encode(c).ids) for c in convs)
    print(f"{len(convs)} inputs ({n_tok} tokens), {args.features} single-feature ablations each, "
          f"SAE at {hook} of {model.cfg.n_layers} blocks")
    print(f"  SAELens splice (every block, every row): {times['splice']:.2f} s")
    print(f"  restart after block {args.layer}:              {times['restart']:.2f} s "
          f"({times['splice'] / times['restart']:.2f}x faster)")
    print(f"  max |difference| in ablated rewards: {worst:.2e}")


if __name__ == "__main__":
    main()
