"""HookedRewardModel vs the HF model (or published-structure reference) on the same device, for
every tiny architecture, in float32 and bfloat16, batch of 3, right and left padding.

Right padding is compared with HF's own right-padded batch; left padding with HF run on each
row unpadded (HF's left-padded rotary positions are not the unpadded ones for every model).
Prints one row per (architecture, dtype, padding) with the max abs difference of the rewards
(and of the combined score where the model has one), and a final JSON line. Runs on CPU too.

    python benchmarks/cuda_parity.py [--device cuda] [--dtypes float32,bfloat16]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch

from tl_reward import HookedRewardModel
from tl_reward.testing import (
    ARCHITECTURES,
    CONVERSATIONS,
    CUSTOM_ARCHITECTURES,
    tiny_hf_reward_model,
)

K = {"armorm": 4, "qrm": 4, "internlm2": 1, "nemotron": 1}


@torch.no_grad()
def hf_reference(arch: str, hf: Any, tokens: torch.Tensor, mask: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(rewards [b, K], score [b] or None)`` from the HF / reference forward."""
    out = hf(input_ids=tokens, attention_mask=mask)
    if arch == "nemotron":
        last = (torch.arange(tokens.shape[1], device=tokens.device) * mask).argmax(-1)
        return out.logits[torch.arange(tokens.shape[0]), last][:, [0]], None
    if hasattr(out, "gating_output"):
        return out.rewards, out.score.reshape(-1)
    logits = out.logits.reshape(tokens.shape[0], -1)
    return logits, logits[:, 0] if logits.shape[1] == 1 else None


def compare(arch: str, dtype: torch.dtype, device: str) -> list[dict[str, Any]]:
    k = K.get(arch, 2)
    hf, tok = tiny_hf_reward_model(arch, num_labels=k, seed=0)
    kwargs = {"lm_head_rows": [0]} if arch == "nemotron" else {}
    model = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device=device,
                                              dtype=dtype, **kwargs)
    hf = hf.to(device=device, dtype=dtype).eval()
    rows = []
    for side in ("right", "left"):
        batch = model.make_batch(CONVERSATIONS, padding_side=side)
        res = model.rewards(CONVERSATIONS, batch_size=3, padding_side=side)
        if side == "right":
            ref_r, ref_s = hf_reference(arch, hf, batch.tokens, batch.attention_mask)
        else:
            parts = [hf_reference(arch, hf, *(lambda b: (b.tokens, b.attention_mask))(
                model.make_batch(c))) for c in CONVERSATIONS]
            ref_r = torch.cat([p[0] for p in parts])
            ref_s = None if parts[0][1] is None else torch.cat([p[1] for p in parts])
        row = {"arch": arch, "dtype": str(dtype).replace("torch.", ""), "padding": side,
               "reward_max_abs_diff": float((res.rewards.float().cpu()
                                             - ref_r.float().cpu()).abs().max()),
               "reward_max_abs": float(ref_r.float().abs().max())}
        if ref_s is not None and res.score is not None:
            row["score_max_abs_diff"] = float((res.score.float().cpu()
                                               - ref_s.float().cpu()).abs().max())
        rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--archs", default=",".join(ARCHITECTURES + CUSTOM_ARCHITECTURES))
    args = p.parse_args()
    rows = []
    print(f"device {args.device}")
    print(f"{'architecture':<12}{'dtype':<10}{'padding':<9}{'reward diff':>13}{'score diff':>12}"
          f"{'|reward|':>10}")
    for arch in args.archs.split(","):
        for name in args.dtypes.split(","):
            for r in compare(arch, getattr(torch, name), args.device):
                rows.append(r)
                score = r.get("score_max_abs_diff")
                print(f"{r['arch']:<12}{r['dtype']:<10}{r['padding']:<9}"
                      f"{r['reward_max_abs_diff']:13.2e}"
                      f"{'' if score is None else f'{score:.2e}':>12}{r['reward_max_abs']:10.2f}")
    worst = {d: max(r["reward_max_abs_diff"] for r in rows if r["dtype"] == d)
             for d in {r["dtype"] for r in rows}}
    print(json.dumps({"device": args.device, "worst_reward_max_abs_diff": worst, "rows": rows}))


if __name__ == "__main__":
    main()
