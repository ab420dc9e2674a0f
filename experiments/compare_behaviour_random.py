"""Behavioural comparison of the demo RM with a random-initialised copy: the null baseline.

The demo RM (SmolLM2-135M-Instruct + HH-RLHF head) against the same architecture with HF's
random initialisation (seed 0; its head is random too), on the first ``--n`` HH-RLHF
harmless-base test pairs with both sides at most ``--max-tokens`` tokens: rank agreement on the
chosen conversations, pairwise-preference agreement, and reward readability from the last
block's residual stream (pooled token) in every direction. Writes
experiments/results/compare_behaviour_random.csv.

Run:  python experiments/compare_behaviour_random.py
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from tl_reward import HookedRewardModel
from tl_reward.compare.behaviour import compare_models
from tl_reward.data import load_hh_rlhf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_random_init import DATA, OUT, random_copy  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=160)
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("TL_REWARD_THREADS", "1")))
    demo = HookedRewardModel.from_pretrained("tl-reward/smollm2-135m-hh", device="cpu")
    pairs = []
    for p in load_hh_rlhf(DATA):
        if max(len(demo.encode(c).ids) for c in (p.chosen_conversation(),
                                                 p.rejected_conversation())) <= args.max_tokens:
            pairs.append(p)
        if len(pairs) >= args.n:
            break
    rep = compare_models({"demo": demo, "random": random_copy(0)}, pairs)
    df = rep.to_dataframe()
    df.to_csv(OUT / "compare_behaviour_random.csv", index=False)
    print(f"{len(pairs)} pairs")
    print(df.round(3).to_string(index=False))
    print("accuracy:", {p.model_a: p.accuracy_a for p in rep.preference},
          {p.model_b: p.accuracy_b for p in rep.preference})


if __name__ == "__main__":
    main()
