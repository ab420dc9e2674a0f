"""``tl-reward explain``: why does the RM prefer one reply? One pair in, an HTML report out.

The report holds the rewards and margin, the differential reward lens (frozen and recompute)
with its crystallisation layer, the components whose direct contribution to the margin is
largest (exact DRA, per head), per-token reward maps of both replies, the attention patterns of
the top heads, and optionally (``--patching``) whole-sublayer noising against direct-path
patching.
"""

from __future__ import annotations

import argparse
import html
from pathlib import Path
from typing import Any

from tl_reward.cli.common import (
    add_model_options,
    add_report_options,
    add_step_option,
    load_model,
    pair_from_record,
    read_jsonl,
    require_objective,
    write_report,
)
from tl_reward.data.preference import PreferencePair
from tl_reward.errors import TLRewardError


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "explain", help="explain a reward model's preference on one pair (HTML report)",
        description="Explain one preference pair: --prompt, --chosen and --rejected, or "
                    "--input FILE.jsonl (--line N) whose line holds 'prompt' (string or "
                    "messages), 'chosen' and 'rejected' replies, or HH-RLHF 'chosen'/'rejected' "
                    "dialogues.")
    add_model_options(p)
    p.add_argument("--prompt", help="user prompt")
    p.add_argument("--chosen", help="the preferred reply")
    p.add_argument("--rejected", help="the dispreferred reply")
    p.add_argument("--input", type=Path, help="JSONL file of pairs")
    p.add_argument("--line", type=int, default=0, help="which non-empty line of --input (0-based)")
    p.add_argument("--objective", default=None,
                   help="objective name or 'score' (default: the model's reward or score; "
                        "required for a multi-objective model without a score)")
    p.add_argument("--top-k", type=int, default=12, help="components and heads to show")
    add_step_option(p, "compares (an index or 'last'; the replies are solutions)")
    p.add_argument("--patching", action="store_true",
                   help="also run whole-sublayer noising and direct-path patching (slower)")
    add_report_options(p, "explain.html", cdn="load plotly/circuitsvis JavaScript from CDNs")
    p.set_defaults(run=run)


def build_report(model: Any, pair: PreferencePair, objective: str | None = None,
                 top_k: int = 12, patching: bool = False, step: Any = None) -> list[Any]:
    """The parts of the explain report (figures, views, tables, HTML headings); ``step``: a
    process reward model's two replies as solutions compared at that step."""
    import pandas as pd

    from tl_reward.analysis.attribution import differential_attribution
    from tl_reward.analysis.lens import differential_lens
    from tl_reward.data.pairs import step_pairs, tokenize_pair
    from tl_reward.model.readout import resolve_objectives
    from tl_reward.viz.attribution import component_bar, head_heatmap
    from tl_reward.viz.tokens import attribution_token_map, head_attention_view, top_heads

    require_objective(model, objective)
    obj = resolve_objectives(model, objective)[0]
    if step is None:
        tp = tokenize_pair(model, pair)
    else:
        tp = step_pairs(model, [((pair.prompt, pair.chosen), (pair.prompt, pair.rejected))],
                        step)[0]
    lens = differential_lens(model, [tp], objectives=obj)
    dra = differential_attribution(model, [tp], objectives=obj, per_position=True)
    margin = float(dra.margin[0, 0])
    cryst = lens.chosen.layer_names[int(lens.crystallisation_layer()[0, 0])]
    summary = pd.DataFrame({
        "quantity": ["objective", "r(chosen)", "r(rejected)", "margin", "prefers",
                     "crystallisation layer (50%, frozen)", "tokens (chosen / rejected)",
                     "unaligned positions (chosen / rejected)"],
        "value": [obj, f"{float(dra.chosen.reward[0, 0]):.4f}",
                  f"{float(dra.rejected.reward[0, 0]):.4f}", f"{margin:+.4f}",
                  "chosen" if margin > 0 else "rejected" if margin < 0 else "tie", cryst,
                  f"{tp.chosen_len} / {tp.rejected_len}",
                  f"{len(tp.unaligned_chosen)} / {len(tp.unaligned_rejected)}"]})
    diff, names = dra.difference("head")
    d = diff[0, :, 0]
    order = d.abs().argsort(descending=True)[:top_k]
    top = pd.DataFrame({"component": [names[i] for i in order],
                        "contribution": d[order].tolist(),
                        "chosen": dra.chosen.components("head")[0][0, order, 0].tolist(),
                        "rejected": dra.rejected.components("head")[0][0, order, 0].tolist()})
    head_diff = dra.chosen.heads[0, ..., 0] - dra.rejected.heads[0, ..., 0]
    heads = top_heads(head_diff, min(4, top_k))
    last = pair.prompt[-1]["content"] if pair.prompt else ""
    parts: list[Any] = [
        f"<p><b>Prompt (last turn):</b> {html.escape(last)}<br><b>Chosen:</b> "
        f"{html.escape(pair.chosen)}<br><b>Rejected:</b> {html.escape(pair.rejected)}</p>",
        summary,
        "<h2>Differential reward lens</h2><p>D_l = r_l(chosen) - r_l(rejected) after each "
        "layer. Frozen scale: consecutive differences are each block's exact contribution; "
        "recompute: the final norm applied afresh (logit-lens convention).</p>",
        lens.plot(convention="frozen"), lens.plot(convention="recompute"),
        "<h2>Top components (exact DRA difference)</h2><p>Contribution of each head, "
        "attention bias, MLP and embedding to the margin; all components plus the head bias "
        "sum to it exactly.</p>",
        component_bar(top, title="Largest contributions to the margin"), top,
        head_heatmap(head_diff, title="Per-head contribution to the margin"),
        "<h2>Token reward maps</h2><p>Each source token's direct contribution through every "
        "attention head to the reward at the last token (embeddings, MLPs and biases at the "
        "last token are not token-split).</p><h3>Chosen</h3>",
        attribution_token_map(dra.chosen, 0, 0), "<h3>Rejected</h3>",
        attribution_token_map(dra.rejected, 0, 0),
        f"<h2>Attention patterns of the top heads {heads} (chosen)</h2>",
        head_attention_view(model, tp.chosen_ids, heads)]
    if patching:
        from tl_reward.analysis.direct_path import direct_path_patching
        from tl_reward.analysis.patching import patch_components

        dp = direct_path_patching(model, tp, "sublayer", "noising", "recompute", obj)
        noise = patch_components(model, tp, dp.names, "noising", obj)
        table = pd.DataFrame({"component": dp.names, "direct_path": dp.effect.tolist(),
                              "noising": noise.tolist()})
        import plotly.express as px

        parts += ["<h2>Patching: direct path against whole-sublayer noising</h2><p>Effects "
                  "normalised by the margin: the fraction of it lost when the component's "
                  "output comes from the rejected run (only on its direct path to the head, or "
                  "through everything downstream).</p>",
                  px.bar(table, x="component", y=["direct_path", "noising"], barmode="group",
                         title="Noising effects per sublayer",
                         labels={"value": "fraction of the margin", "variable": "patching"})]
    return parts


def run(args: argparse.Namespace) -> int:
    if args.input:  # pair number --line: our fields or HH-RLHF dialogues
        lines = read_jsonl(args.input)
        if not 0 <= args.line < len(lines):
            raise TLRewardError(f"{args.input} has {len(lines)} pairs; --line {args.line} is "
                                "out of range")
        pair = pair_from_record(lines[args.line][1], lines[args.line][0])
    elif args.prompt and args.chosen and args.rejected:
        pair = PreferencePair.from_prompt(args.prompt, args.chosen, args.rejected)
    else:
        raise TLRewardError("pass --prompt, --chosen and --rejected, or --input FILE.jsonl")
    parts = build_report(load_model(args), pair, args.objective, args.top_k, args.patching,
                         args.step)
    path = write_report(args, parts, "Why does the reward model prefer this reply?")
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")
    return 0
