"""``tl-reward irm``: a tuned policy's implicit reward on preference pairs and tokens. HTML out.

The implicit reward of a reply is ``beta * sum_t [log pi(y_t) - log pi_ref(y_t)]`` over its
tokens (template closing tokens included). The report gives, per pair, both replies' implicit
rewards and whether the policy prefers the chosen one, the per-token split of the first pair,
and with ``--prompt`` the vocabulary tokens the policy's implicit reward ranks highest and
lowest as the whole reply. With ``--rm`` it adds the explicit RM's margins beside the implicit
ones (agreement on which reply is preferred).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tl_reward.cli.common import (
    add_device_options,
    add_report_options,
    apply_threads,
    load_model,
    read_pairs,
    write_report,
)
from tl_reward.data.preference import pair_rows
from tl_reward.errors import TLRewardError


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "irm", help="a policy's implicit reward on pairs and tokens (HTML report)",
        description="Implicit rewards of a tuned policy against its reference model. --policy "
                    "and --reference: causal LMs (hub names or local directories, "
                    "*ForCausalLM); --input: JSONL pairs ('prompt', 'chosen', 'rejected', or "
                    "HH-RLHF dialogues).")
    p.add_argument("--policy", required=True, help="the tuned causal LM")
    p.add_argument("--reference", required=True, help="the reference causal LM")
    p.add_argument("--beta", type=float, required=True, help="the DPO temperature")
    p.add_argument("--input", type=Path, required=True, help="JSONL file of pairs")
    p.add_argument("--max-pairs", type=int, default=None, help="use the first N pairs only")
    p.add_argument("--prompt", action="append", default=[],
                   help="also sweep the vocabulary as the reply to this prompt (repeatable)")
    p.add_argument("--top", type=int, default=15, help="tokens shown per end of each sweep")
    p.add_argument("--rm", default=None, help="an explicit reward model to compare margins with")
    p.add_argument("--batch-size", type=int, default=8)
    add_device_options(p)
    add_report_options(p, "irm.html")
    p.set_defaults(run=run)


def _causal_lm(name: str, args: argparse.Namespace) -> tuple[Any, Any]:
    """The HF causal LM ``name`` and its tokenizer; a checkpoint of another kind (a reward
    model: ``*ForSequenceClassification``) or one whose weights leave any layer (the LM head)
    newly initialised is refused, not loaded with a random head."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from tl_reward.architectures.lm_head import sequence_classification_name

    remote = args.trust_remote_code
    archs = getattr(AutoConfig.from_pretrained(name, trust_remote_code=remote),
                    "architectures", None) or []
    if not any(sequence_classification_name(a) for a in archs):
        raise TLRewardError(
            f"{name} is a {', '.join(archs) or 'checkpoint without architectures'}, not a "
            "causal LM (*ForCausalLM, *LMHeadModel): loading it as one would give it a random "
            "LM head. --policy and --reference take the tuned policy and its reference LM; an "
            "explicit reward model goes to --rm")
    model, info = AutoModelForCausalLM.from_pretrained(name, trust_remote_code=remote,
                                                       output_loading_info=True)
    if info["missing_keys"]:
        raise TLRewardError(f"{name}: the checkpoint lacks {sorted(info['missing_keys'])[:4]}; "
                            "it is not a complete causal LM (pass the policy or reference "
                            "LM's own folder)")
    if args.device:
        model = model.to(args.device)
    return model.eval(), AutoTokenizer.from_pretrained(name)


def run(args: argparse.Namespace) -> int:
    import numpy as np
    import pandas as pd

    from tl_reward.irm.implicit import implicit_rewards
    from tl_reward.irm.sweep import irm_vocab_sweep
    from tl_reward.viz.irm import plot_token_contributions

    apply_threads(args)
    pairs = read_pairs(args.input, args.max_pairs)
    policy, tok = _causal_lm(args.policy, args)
    reference, _ = _causal_lm(args.reference, args)
    convs, _ = pair_rows(pairs)
    res = implicit_rewards(policy, reference, convs, args.beta, tokenizer=tok,
                           batch_size=args.batch_size)
    r = res.rewards.double().cpu().numpy()
    table = pd.DataFrame({"prompt": [p.prompt[-1]["content"][:60] for p in pairs],
                          "chosen": r[0::2], "rejected": r[1::2], "margin": r[0::2] - r[1::2]})
    if args.rm:
        from tl_reward.model.scoring import score_pairs

        table["rm_margin"] = score_pairs(load_model(args, args.rm), pairs).margin.double().numpy()
        table["agree"] = np.sign(table["margin"]) == np.sign(table["rm_margin"])
    acc = float((table["margin"] > 0).mean())
    contrib = (res.policy_logprobs[0] - res.reference_logprobs[0]).double() * args.beta
    parts: list[Any] = [
        f"<p>policy {args.policy}, reference {args.reference}, beta {args.beta}: {len(pairs)} "
        f"pairs, the policy's implicit reward prefers the chosen reply on {acc:.3f} of them"
        + (f"; it agrees with the RM {args.rm} on {float(table['agree'].mean()):.3f}"
           if args.rm else "") + ".</p>",
        "<h2>Implicit rewards per pair</h2>", table,
        "<h2>The first chosen reply, token by token</h2>",
        plot_token_contributions(res.tokens[0], contrib.cpu().numpy(), float(r[0]))]
    if args.prompt:
        sweep = irm_vocab_sweep(policy, reference, list(args.prompt), args.beta, tokenizer=tok,
                                progress=True).to_vocab_sweep()
        parts += ["<h2>Tokens as the whole reply</h2>", sweep.plot(k=args.top)]
    path = write_report(args, parts, "Implicit reward of a tuned policy")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"chosen preferred on {acc:.3f} of {len(pairs)} pairs; wrote {path}")
    return 0
