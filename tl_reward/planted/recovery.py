"""Recovery metrics: where an analysis ranks the planted truth, and the pairs that probe it."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch

from tl_reward.data.pairs import TokenizedPair, align_ids
from tl_reward.planted.calibration import DEFAULT_PROMPTS, plain_ids, with_reply
from tl_reward.sweep.response_template import Prompt

_HEAD = re.compile(r"^L\d+\.H\d+$")


def component_name(component: tuple[Any, ...]) -> str:
    """The analyses' name of a truth's component: ``L2.H0`` or ``L1.mlp``."""
    kind, layer, *rest = component
    return f"L{layer}.H{rest[0]}" if kind == "head" else f"L{layer}.{kind}"


def rank_of(values: torch.Tensor, names: Sequence[str], target: str, heads_only: bool = True
            ) -> int:
    """1-based rank of ``target`` by ``|value|`` (descending) among the named components
    (only the heads when ``heads_only``); ties count against the target."""
    keep = [i for i, n in enumerate(names) if not heads_only or _HEAD.match(n)]
    mine = abs(float(values[names.index(target)]))
    return 1 + sum(abs(float(values[i])) >= mine for i in keep if names[i] != target)


def trigger_pairs(tokenizer: Any, trigger_id: int, vocab_size: int,
                  prompts: Sequence[Prompt] = DEFAULT_PROMPTS, per_prompt: int = 2,
                  max_reply: int = 10, seed: int = 1) -> list[TokenizedPair]:
    """Pairs of equal-length random replies: chosen holds the trigger once, rejected has a
    random other token in its place (every position aligned)."""
    gen = torch.Generator().manual_seed(seed)
    pool = torch.tensor([i for i in plain_ids(tokenizer, vocab_size) if i != trigger_id])
    pairs = []
    for prompt in prompts:
        for _ in range(per_prompt):
            n = int(torch.randint(1, max_reply + 1, (1,), generator=gen))
            reply = pool[torch.randint(0, len(pool), (n,), generator=gen)].tolist()
            at = int(torch.randint(0, n, (1,), generator=gen))
            chosen = [*reply[:at], trigger_id, *reply[at + 1:]]
            rejected, _ = with_reply(tokenizer, prompt, reply)
            pairs.append(align_ids(with_reply(tokenizer, prompt, chosen)[0], rejected))
    return pairs
