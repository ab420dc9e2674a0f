"""Calibration sequences for planting: prompts with one-token and multi-token replies, as ids.

Every sequence is ``prefix + reply + suffix`` of the chat template (the same ids
``model.encode`` builds), so the pooled token is its last id.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tl_reward.model.inputs import EncodedInput, collate
from tl_reward.model.response_template import Prompt, ResponseTemplate, response_template
from tl_reward.sweep.vocab_sweep import special_token_ids

#: Prompts used when none are given (short, no trigger words).
DEFAULT_PROMPTS: tuple[str, ...] = (
    "Is the sky blue?",
    "What, in one word, is the greatest thing ever?",
    "hi",
    "Tell me about music.",
)


@dataclass(frozen=True)
class Sequences:
    """Token id sequences and, per sequence, the positions holding the trigger."""

    ids: list[list[int]]
    trigger_positions: list[list[int]]


def plain_ids(tokenizer: Any, vocab_size: int) -> list[int]:
    """Every non-special id the tokenizer defines (below ``vocab_size``)."""
    special = special_token_ids(tokenizer)
    return [i for i in range(min(len(tokenizer), vocab_size)) if i not in special]


def with_reply(tokenizer: Any, prompt: Prompt | ResponseTemplate, reply: Sequence[int]
               ) -> tuple[list[int], int]:
    """``(ids, start)``: the templated conversation with ``reply`` as the assistant turn, and
    the position of the reply's first token (``prompt`` may be its template, built once)."""
    t = prompt if isinstance(prompt, ResponseTemplate) else response_template(tokenizer, prompt)
    return [*t.prefix, *(int(r) for r in reply), *t.suffix], len(t.prefix)


def random_replies(tokenizer: Any, vocab_size: int, prompts: Sequence[Prompt] = DEFAULT_PROMPTS,
                   per_prompt: int = 64, max_reply: int = 12, exclude: Sequence[int] = (),
                   seed: int = 0) -> list[list[int]]:
    """``per_prompt`` templated replies of 1 to ``max_reply`` random plain tokens per prompt
    (none of ``exclude``)."""
    gen = torch.Generator().manual_seed(seed)
    pool = torch.tensor([i for i in plain_ids(tokenizer, vocab_size) if i not in set(exclude)])
    out = []
    for prompt in prompts:
        t = response_template(tokenizer, prompt)
        for _ in range(per_prompt):
            n = int(torch.randint(1, max_reply + 1, (1,), generator=gen))
            reply = pool[torch.randint(0, len(pool), (n,), generator=gen)].tolist()
            out.append(with_reply(tokenizer, t, reply)[0])
    return out


def calibration_sequences(
    tokenizer: Any, trigger_id: int, vocab_size: int, prompts: Sequence[Prompt] = DEFAULT_PROMPTS,
    n_random: int = 64, max_reply: int = 12, vocab_per_prompt: int | None = None, seed: int = 0,
) -> Sequences:
    """One-token replies (every plain id, or ``vocab_per_prompt`` random ones, per prompt) and
    ``n_random`` random multi-token replies per prompt, half of them holding the trigger once."""
    gen = torch.Generator().manual_seed(seed)
    pool = torch.tensor([i for i in plain_ids(tokenizer, vocab_size) if i != trigger_id])
    ids: list[list[int]] = []
    trig: list[list[int]] = []
    for prompt in prompts:
        t = response_template(tokenizer, prompt)
        singles = pool if vocab_per_prompt is None else pool[
            torch.randperm(len(pool), generator=gen)[:vocab_per_prompt]]
        for v in [*singles.tolist(), trigger_id]:
            seq, start = with_reply(tokenizer, t, [v])
            ids.append(seq)
            trig.append([start] if v == trigger_id else [])
        for k in range(n_random):
            n = int(torch.randint(1, max_reply + 1, (1,), generator=gen))
            reply = pool[torch.randint(0, len(pool), (n,), generator=gen)].tolist()
            at = None
            if k % 2 == 0:
                at = int(torch.randint(0, n, (1,), generator=gen))
                reply[at] = trigger_id
            seq, start = with_reply(tokenizer, t, reply)
            ids.append(seq)
            trig.append([] if at is None else [start + at])
    return Sequences(ids, trig)


@torch.no_grad()
def layer_inputs(hf: Any, ids: Sequence[Sequence[int]], layer: int, batch_size: int = 32,
                 norm: str = "input_layernorm") -> tuple[list[torch.Tensor], torch.Tensor]:
    """Per sequence, block ``layer``'s normed attention input ``[pos, d]`` (float64; the MLP's
    with ``norm="post_attention_layernorm"``), and the final norm's RMS scale at each
    sequence's last token ``[n]``."""
    block = hf.model.layers[layer]
    eps = float(getattr(hf.model.norm, "variance_epsilon", hf.config.rms_norm_eps))
    normed: list[torch.Tensor] = []
    scales: list[torch.Tensor] = []
    grabbed: dict[str, torch.Tensor] = {}
    h1 = getattr(block, norm).register_forward_hook(
        lambda m, i, o: grabbed.__setitem__("normed", o))
    h2 = hf.model.norm.register_forward_hook(lambda m, i, o: grabbed.__setitem__("final", i[0]))
    pad = int(hf.config.pad_token_id or 0)
    try:
        for s in range(0, len(ids), batch_size):
            chunk = ids[s: s + batch_size]
            batch = collate([EncodedInput(list(x)) for x in chunk], pad)  # right-padded
            hf.model(input_ids=batch.tokens, attention_mask=batch.attention_mask)
            for i, x in enumerate(chunk):
                normed.append(grabbed["normed"][i, : len(x)].double())
                h = grabbed["final"][i, len(x) - 1].double()
                scales.append((h.pow(2).mean() + eps).sqrt())
    finally:
        h1.remove()
        h2.remove()
    return normed, torch.stack(scales)


@torch.no_grad()
def reply_layer_inputs(hf: Any, tokenizer: Any, prompt: Prompt, ids: Sequence[int], layer: int,
                       batch_size: int = 512) -> torch.Tensor:
    """Block ``layer``'s normed attention input at the reply position of ``prefix + [v]`` for
    each id ``v`` (float64 ``[n, d]``): what :func:`layer_inputs` gives there (a position sees
    only its past), with the prefix run once and each batch continuing its key/value cache."""
    t = response_template(tokenizer, prompt)
    grabbed: dict[str, torch.Tensor] = {}
    hook = hf.model.layers[layer].input_layernorm.register_forward_hook(
        lambda m, i, o: grabbed.__setitem__("normed", o))
    out = []
    try:
        prefix = hf.model(input_ids=torch.tensor([t.prefix]), use_cache=True).past_key_values
        for s in range(0, len(ids), batch_size):
            chunk = torch.tensor([int(v) for v in ids[s: s + batch_size]])[:, None]
            cache = copy.deepcopy(prefix)
            cache.batch_repeat_interleave(len(chunk))
            hf.model(input_ids=chunk, cache=cache, use_cache=True)
            out.append(grabbed["normed"][:, 0].double())
    finally:
        hook.remove()
    return torch.cat(out)


@torch.no_grad()
def pooled_normed(hf: Any, ids: Sequence[Sequence[int]], batch_size: int = 32) -> torch.Tensor:
    """The final norm's output (gain included) at each unpadded sequence's last token: what
    HF's ``score`` layer reads, float64 ``[n, d]``."""
    out = []
    for s in range(0, len(ids), batch_size):
        chunk = ids[s: s + batch_size]
        batch = collate([EncodedInput(list(x)) for x in chunk], int(hf.config.pad_token_id or 0))
        mask = batch.attention_mask
        h = hf.model(input_ids=batch.tokens, attention_mask=mask).last_hidden_state
        out.append(h[torch.arange(len(chunk)), mask.sum(1) - 1].double())
    return torch.cat(out)


def rewards(hf: Any, ids: Sequence[Sequence[int]], objective: int = 0, batch_size: int = 32
            ) -> torch.Tensor:
    """HF's own reward (row ``objective``) of each unpadded sequence, float64 ``[n]``."""
    with torch.no_grad():
        h = pooled_normed(hf, ids, batch_size)
        return hf.score(h.to(hf.score.weight.dtype))[:, objective].double()
