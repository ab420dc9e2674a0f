"""Recovery metrics: where an analysis ranks the planted truth, and the pairs that probe it."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tl_reward.data.pairs import TokenizedPair, align_ids
from tl_reward.errors import TLRewardError
from tl_reward.model.response_template import Prompt
from tl_reward.planted.calibration import DEFAULT_PROMPTS, plain_ids, with_reply
from tl_reward.sweep.vocab_sweep import VocabSweep

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
                  max_reply: int = 10, seed: int = 1, swap: int | None = None
                  ) -> list[TokenizedPair]:
    """Pairs of equal-length random replies: chosen holds the trigger once, rejected has a
    random other token (``swap`` if given) in its place (every position aligned)."""
    gen = torch.Generator().manual_seed(seed)
    pool = torch.tensor([i for i in plain_ids(tokenizer, vocab_size) if i != trigger_id])
    pairs = []
    for prompt in prompts:
        for _ in range(per_prompt):
            n = int(torch.randint(1, max_reply + 1, (1,), generator=gen))
            reply = pool[torch.randint(0, len(pool), (n,), generator=gen)].tolist()
            at = int(torch.randint(0, n, (1,), generator=gen))
            if swap is not None:
                reply[at] = swap
            chosen = [*reply[:at], trigger_id, *reply[at + 1:]]
            rejected, _ = with_reply(tokenizer, prompt, reply)
            pairs.append(align_ids(with_reply(tokenizer, prompt, chosen)[0], rejected))
    return pairs


@dataclass(frozen=True)
class TriggerSweepCheck:
    """The trigger plant's truth over one-token replies, per prompt of two sweeps.

    Attributes:
        ranks: the trigger's rank in the planted sweep (1: top; ties count against it).
        leaks: the largest ``|r - r_base|`` over every other id.
        leak_ids: the id of each largest leak.
        base_gaps: the base's best reward over the other ids minus the trigger's base reward
            (the trigger is top iff its shift beats this, where nothing else leaks).
    """

    ranks: list[int]
    leaks: list[float]
    leak_ids: list[int]
    base_gaps: list[float]


def trigger_sweep_check(planted: VocabSweep, base: VocabSweep, trigger_id: int,
                        objective: int = 0) -> TriggerSweepCheck:
    """:class:`TriggerSweepCheck` of a planted model's sweep against its base's (same ids
    and prompts), on reward row ``objective``."""
    ids = planted.token_ids.tolist()
    if base.token_ids.tolist() != ids or len(base.labels) != len(planted.labels):
        raise TLRewardError("the two sweeps do not cover the same ids and prompts; sweep the "
                            "planted and the base model with the same ids and prompts")
    at = ids.index(trigger_id)
    others = torch.ones(len(ids), dtype=torch.bool)
    others[at] = False
    out: tuple[list, list, list, list] = ([], [], [], [])
    for i in range(len(planted.labels)):
        r, b = planted.values(i, objective), base.values(i, objective)
        d = (r - b).abs().masked_fill(~others, -1.0)
        out[0].append(int((r[others] >= r[at]).sum()) + 1)
        out[1].append(float(d.max()))
        out[2].append(ids[int(d.argmax())])
        out[3].append(float(b[others].max() - b[at]))
    return TriggerSweepCheck(*out)
