"""Plant a process reward model (PRM) with two step rules whose mechanisms are known.

A PRM reads a score at the tag that closes each step (:mod:`tl_reward.model.steps`). The plant
takes a Llama-style sequence classifier whose outputs ``head_weights`` combine into the step
score (``[-1, 1]``: a two-class head, as Qwen2.5-Math-PRM's) and plants, for a tag, two tokens
``a`` and ``b`` and their counterfactuals ``a'`` and ``b'``:

* rule A (local): step ``k``'s score drops by about ``c`` when step ``k`` holds ``a``: a
  position after step ``k - 1``'s tag (for step 0: after BOS, so an ``a`` in the prompt counts
  for step 0) and before step ``k``'s tag;
* rule B (cross-step): step ``k``'s score drops by about ``c`` when ``b`` stands anywhere before
  step ``k``'s tag: in an earlier step ``j < k`` or in the prompt, and also in step ``k``
  itself. One head cannot tell a tag after ``b`` from its own tag, so rule B fires at ``b``'s
  own step too (``drop_b_own``); there its head and its source (the position of ``b``) tell it
  from rule A. At ``k > j`` it is the only rule reading step ``j``.

Coordinates: the last ten residual coordinates (:data:`COORDS`) are cleared
(:func:`~tl_reward.planted.flag.clear_dims`): no weight reads or writes them except the norms
(gain 1), the three planted heads and the score. Every token holds exactly one *type*
coordinate, valued so that it is exactly 1 after block 0's norm: ``flag_a`` (``a``), ``flag_b``
(``b``), ``mark`` (the tag and BOS) or ``const`` (every other token). ``a`` is ``a'``'s row with
its ``const`` moved to ``flag_a`` (same RMS: the base cannot tell them apart), ``b`` likewise.

Heads (grouped-query attention unrolled first, so each changes alone):

* ``detector`` (block 0): every position attends to the nearest *marker* (``a``, a tag, BOS)
  by at least ``logit_margin`` logits over every farther marker and every other position, at
  every distance below ``max_len`` (a rotary pair with a phase plus the slowest pair as an
  offset; exact, since every normed type coordinate is 1). It writes ``x`` when that marker is
  an ``a`` and ``y`` otherwise, the same size.
* ``reader`` (last block): at a tag, attends to the position just before it (a rotary pair with
  logit ``> 0`` at distance 1 and ``< 0`` beyond; tags and BOS have key 0; its margin is
  fitted on the calibration solutions) and copies ``x``/``y`` there into ``out_a``/``pad_a``:
  step ``k`` reads whether the nearest marker before its tag is an ``a``.
* ``b_head`` (block 0): at a tag, attends to every ``b`` before it (slowest rotary pair) over
  the sinks (tags and BOS); every other query attends to the sinks. It writes ``out_b`` from a
  ``b`` and ``pad_b`` from a sink, the same size.

The score reads ``out_a`` and ``out_b`` only, scaled so that the median drop on the
calibration solutions is ``c``. Each head writes one of two coordinates of equal size, so
swapping ``a`` for ``a'`` (or ``b`` for ``b'``) changes nothing but the planted path, up to
``exp(-logit_margin)``. Writes are ``write_scale`` times the embedding RMS: the planted model and
the base (the three heads silenced) differ on solutions without ``a`` and ``b`` only by the
pads' share of the norms (``base_gap``).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tl_reward.errors import TLRewardError, check_range
from tl_reward.model.inputs import EncodedInput, collate
from tl_reward.model.response_template import Prompt, response_template
from tl_reward.planted.calibration import DEFAULT_PROMPTS, layer_inputs, plain_ids
from tl_reward.planted.flag import clear_dims
from tl_reward.planted.surgery import (
    attention,
    check_llama_like,
    expand_kv_heads,
    head_dim,
    head_rows,
    one_token_id,
    silence_heads,
)
from tl_reward.planted.trigger import PlantedModel

#: The cleared residual coordinates, in order (the last ``len(COORDS)`` of the model).
COORDS: tuple[str, ...] = ("const", "flag_a", "flag_b", "mark", "x", "y", "out_a", "pad_a",
                           "out_b", "pad_b")


@dataclass(frozen=True)
class PRMTruth:
    """What the PRM plant guarantees, measured on its calibration solutions before any
    analysis runs (drops: counterfactual's step score minus the planted token's).

    Attributes:
        tag, tag_id: the step tag.
        a, a_id, a_counterfactual_id: rule A's token and its base synonym.
        b, b_id, b_counterfactual_id: rule B's token and its base synonym.
        c: the target drop (the median of ``drop_a`` and of ``drop_b``).
        detector: ``(0, head)``, rule A's block-0 head (nearest marker).
        reader: ``(last block, head)``, rule A's head that writes the score (reads one back).
        b_head: ``(0, head)``, rule B's only head.
        dims: the residual coordinates named by :data:`COORDS`.
        head_weights: how the head's outputs combine into the step score.
        max_len: the sequence length below which the block-0 margins hold.
        margins: the smallest attention-logit margin of the detector (every distance below
            ``max_len``), the reader (on the calibration solutions) and ``b_head`` (every
            distance).
        drop_a: ``(median, min, max)`` at the step holding ``a``.
        drop_b: ``(median, min, max)`` at the steps after the one holding ``b``.
        drop_b_own: ``(median, min, max)`` at the step holding ``b``.
        off_target: the largest ``|drop|`` where no rule fires (``a``'s pairs at other steps,
            ``b``'s before its step).
        ablated: the largest ``|drop|`` with the detector, the reader (rule A's pairs) and
            ``b_head`` (rule B's) zero-ablated.
        base_drop: the largest ``|drop|`` of either pair set at any step in the base.
        base_gap: the largest ``|planted - base|`` step score on the counterfactual solutions.
        n_pairs: calibration pairs per rule.
    """

    tag: str
    tag_id: int
    a: str
    a_id: int
    a_counterfactual_id: int
    b: str
    b_id: int
    b_counterfactual_id: int
    c: float
    detector: tuple[int, int]
    reader: tuple[int, int]
    b_head: tuple[int, int]
    dims: tuple[int, ...]
    head_weights: tuple[float, ...]
    max_len: int
    margins: tuple[float, float, float]
    drop_a: tuple[float, float, float]
    drop_b: tuple[float, float, float]
    drop_b_own: tuple[float, float, float]
    off_target: float
    ablated: tuple[float, float, float]
    base_drop: float
    base_gap: float
    n_pairs: int

    def hook(self, head: tuple[int, int]) -> str:
        """The TransformerLens ``hook_z`` of ``head`` (ablate ``[..., head[1], :]``)."""
        return f"blocks.{head[0]}.attn.hook_z"

    @property
    def a_edges(self) -> tuple[tuple[str, str, str], ...]:
        """Rule A's path (names as in :mod:`tl_reward.circuits`): the embedding into the
        detector's key and value, the detector into the reader's value, the reader's write."""
        d, r = (f"a{x}.h{y}" for x, y in (self.detector, self.reader))
        return (("input", d, "k"), ("input", d, "v"), (d, r, "v"), (r, "reward", ""))

    @property
    def b_edges(self) -> tuple[tuple[str, str, str], ...]:
        """Rule B's path: the embedding into ``b_head``'s key and value, and its write (the
        query reads the tag, which the swap keeps)."""
        h = f"a{self.b_head[0]}.h{self.b_head[1]}"
        return (("input", h, "k"), ("input", h, "v"), (h, "reward", ""))


@dataclass(frozen=True)
class _Pair:
    """A calibration pair: token ids with the planted token and with its counterfactual, the
    tag positions, and the step holding the token."""

    planted: list[int]
    counterfactual: list[int]
    read_at: list[int]
    step: int


def _type_values(emb: torch.Tensor, eps: float) -> torch.Tensor:
    """Per row, the value of one more coordinate that is exactly 1 after an RMS norm (gain 1)
    of the row with it."""
    d = emb.shape[1]
    s = emb.double().pow(2).sum(1)
    return ((s / d + eps) / (1 - 1 / d)).sqrt()


def _recency_kernel(inv_freq: torch.Tensor, n: int, margin: float
                    ) -> tuple[int, float, float, float, float]:
    """``(slot, phase, r, offset, low)``: logits ``r cos(f d + phase) + offset cos(f_min d)``
    (``f`` the rotary pair ``slot``'s frequency) that fall by at least ``margin`` per unit of
    distance and stay at least ``margin`` for every distance ``d < n``; ``low``: the smallest
    of those falls and logits."""
    d = torch.arange(n, dtype=torch.float64)
    slow = int(inv_freq.argmin())
    best: tuple[float, int, float] | None = None
    for slot in range(len(inv_freq)):
        if slot == slow:
            continue
        for phase in torch.linspace(0.0, math.pi, 181, dtype=torch.float64).tolist():
            g = torch.cos(float(inv_freq[slot]) * d + phase)
            gap = float((g[:-1] - g[1:]).min())
            if best is None or gap > best[0]:
                best = (gap, slot, phase)
    assert best is not None
    gap, slot, phase = best
    if gap <= 0:
        raise TLRewardError(f"no rotary pair orders {n} positions by distance: lower max_len")
    r = margin / gap
    low = float(torch.cos(float(inv_freq[slot]) * d + phase).min())
    offset = max(0.0, margin - r * low) / math.cos(float(inv_freq[slow]) * (n - 1))
    logits = r * torch.cos(float(inv_freq[slot]) * d + phase) + offset * torch.cos(
        float(inv_freq[slow]) * d)
    fall = float((logits[:-1] - logits[1:]).min())
    return slot, phase, r, offset, min(fall, float(logits.min()))


def _reader_slot(inv_freq: torch.Tensor, n: int) -> int:
    """The fastest rotary pair whose logit ``-sin(f (d - 1.5))`` is negative for every distance
    ``2 <= d < n``."""
    ok = [i for i, f in enumerate(inv_freq.tolist()) if f * (n - 2.5) < math.pi]
    if not ok:
        raise TLRewardError(f"no rotary pair is slow enough for {n} positions: lower max_len")
    return max(ok, key=lambda i: float(inv_freq[i]))


def _pair(weight: torch.Tensor, row: int, half: int, slot: int, cols: Sequence[int],
          amp: float, phase: float = 0.0) -> None:
    """Write ``amp`` at angle ``phase`` into rotary pair ``slot`` of the head starting at row
    ``row``, read from each of ``cols``."""
    for col in cols:
        weight[row + slot, col] = amp * math.cos(phase)
        weight[row + slot + half, col] = amp * math.sin(phase)


@torch.no_grad()
def step_scores(hf: Any, ids: Sequence[Sequence[int]], tag_id: int,
                head_weights: Sequence[float], batch_size: int = 32) -> list[torch.Tensor]:
    """HF's own step scores: per sequence, ``head_weights . score(h)`` at each ``tag_id``
    position (float64)."""
    w = torch.tensor([float(x) for x in head_weights], dtype=torch.float64)
    out: list[torch.Tensor] = []
    pad = int(hf.config.pad_token_id or 0)
    for s in range(0, len(ids), batch_size):
        chunk = [list(x) for x in ids[s: s + batch_size]]
        batch = collate([EncodedInput(x) for x in chunk], pad)
        h = hf.model(input_ids=batch.tokens, attention_mask=batch.attention_mask)
        scores = hf.score(h.last_hidden_state).double() @ w
        for i, x in enumerate(chunk):
            out.append(scores[i, [p for p, t in enumerate(x) if t == tag_id]])
    return out


def _drops(hf: Any, pairs: Sequence[_Pair], tag_id: int, head_weights: Sequence[float]
           ) -> list[torch.Tensor]:
    """Per pair, each step's score with the counterfactual minus with the planted token."""
    got = step_scores(hf, [x for p in pairs for x in (p.counterfactual, p.planted)], tag_id,
                      head_weights)
    return [got[2 * i] - got[2 * i + 1] for i in range(len(pairs))]


def _pairs(tokenizer: Any, pool: torch.Tensor, token: int, swap: int, tag_id: int,
           prompts: Sequence[Prompt], n: int, max_steps: int, max_step_len: int,
           gen: torch.Generator, cross: bool) -> list[_Pair]:
    """``n`` random solutions (2 to ``max_steps`` steps of 1 to ``max_step_len`` tokens of
    ``pool``) with ``token`` (or ``swap``) at a random position of a random step (``cross``:
    not the last)."""
    out = []
    templates = [response_template(tokenizer, p) for p in prompts]
    if any(token in t.prefix for t in templates):
        raise TLRewardError(f"a calibration prompt holds the token {token}, which would fire "
                            "its rule on every step: pass prompts= without it")
    for i in range(n):
        t = templates[i % len(templates)]
        n_steps = int(torch.randint(2, max_steps + 1, (1,), generator=gen))
        steps = [pool[torch.randint(0, len(pool), (int(torch.randint(
            1, max_step_len + 1, (1,), generator=gen)),), generator=gen)].tolist()
            for _ in range(n_steps)]
        k = int(torch.randint(0, n_steps - 1 if cross else n_steps, (1,), generator=gen))
        at = int(torch.randint(0, len(steps[k]), (1,), generator=gen))
        sides = []
        for v in (token, swap):
            steps[k][at] = v
            reply = [x for s in steps for x in (*s, tag_id)]
            sides.append([*t.prefix, *reply, *t.suffix])
        read_at = [p for p, x in enumerate(sides[0]) if x == tag_id]
        out.append(_Pair(sides[0], sides[1], read_at, k))
    return out


#: A step pair: ``(solution holding the token, its counterfactual, the step holding it)``, each
#: solution a ``(prompt, [step text, ...])`` pair.
StepPair = tuple[Any, Any, int]


def pair_prefixes(model: Any, pairs: Sequence[StepPair], step: int | None = None
                  ) -> tuple[list[EncodedInput], list[EncodedInput]]:
    """Both sides' prefixes (a hooked PRM's inputs) up to each pair's step (``step``, else the
    one holding the token)."""
    sides: tuple[list[EncodedInput], list[EncodedInput]] = ([], [])
    for x, y, j in pairs:
        for side, sol in zip(sides, (x, y), strict=True):
            side.append(model.at_steps([sol], j if step is None else step)[0][0])
    return sides


def step_drops(model: Any, pairs: Sequence[StepPair]) -> list[torch.Tensor]:
    """Per pair, each step's score of a hooked PRM with the counterfactual minus with the
    token."""
    got = model.rewards([s for x, y, _ in pairs for s in (y, x)]).score
    out, at = [], 0
    for x, _, _ in pairs:
        n = len(x[1])
        out.append(got[at: at + n] - got[at + n: at + 2 * n])
        at += 2 * n
    return out


def _spread(x: torch.Tensor) -> tuple[float, float, float]:
    return float(x.median()), float(x.min()), float(x.max())


def _distinct_ids(tokenizer: Any, vocab: int, a: str | int, b: str | int,
                  a_cf: str | int | None, b_cf: str | int | None) -> list[int]:
    """``[a, a', b, b']`` as ids: distinct plain tokens (default counterfactuals: the first
    plain ids not taken)."""
    a_id = one_token_id(tokenizer, a, vocab, "a")
    b_id = one_token_id(tokenizer, b, vocab, "b")
    plain = plain_ids(tokenizer, vocab)
    free = iter(i for i in plain if i not in (a_id, b_id))
    ids = [a_id, one_token_id(tokenizer, a_cf, vocab, "a_counterfactual")
           if a_cf is not None else next(free), b_id]
    free = iter(i for i in plain if i not in ids)
    ids.append(one_token_id(tokenizer, b_cf, vocab, "b_counterfactual")
               if b_cf is not None else next(free))
    if len(set(ids)) != 4 or not set(ids) <= set(plain):
        raise TLRewardError(f"a, its counterfactual, b and its counterfactual must be four "
                            f"distinct plain tokens, got ids {ids}")
    return ids


def plant_prm(
    hf: Any, tokenizer: Any, a: str | int, b: str | int, tag: str = "<extra_0>",
    a_counterfactual: str | int | None = None, b_counterfactual: str | int | None = None,
    c: float = 3.0, detector: int = 0, reader: int = 0, b_head: int = 1,
    head_weights: Sequence[float] = (-1.0, 1.0), prompts: Sequence[Prompt] = DEFAULT_PROMPTS,
    n_pairs: int = 32, max_steps: int = 4, max_step_len: int = 6, max_len: int = 128,
    logit_margin: float = 30.0, write_scale: float = 0.1, seed: int = 0,
) -> PlantedModel:
    """Plant rules A and B (module doc) in a Llama-style sequence classifier.

    Args:
        hf: the classifier (not modified); its tokenizer holds ``tag`` as one token.
        tokenizer: with a chat template that opens every sequence with BOS.
        a, b: the rules' tokens (one token or an id); a_counterfactual, b_counterfactual:
            their synonyms in the base (default: the first free plain ids).
        c: the target drop of each rule.
        detector, b_head: heads of block 0; reader: a head of the last block.
        head_weights: the step score's weights on the head's outputs.
        prompts, n_pairs, max_steps, max_step_len, seed: random calibration solutions.
        max_len: the longest sequence the block-0 margins are guaranteed for.
        logit_margin: the attention-logit margin of every planted head.
        write_scale: each head's write, in units of the embedding RMS.

    Raises:
        TLRewardError: for a bad argument, a tag that is not one token, or a plant that moves
            some calibration step by under ``c / 4``.
    """
    check_llama_like(hf)
    cfg = hf.config
    n_layers, n_heads, d_model = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.hidden_size
    for name, h in (("detector", detector), ("reader", reader), ("b_head", b_head)):
        check_range(name, h, 0, n_heads)
    if detector == b_head:
        raise TLRewardError("the detector and b_head are both block-0 heads: pick two")
    if n_layers < 2:
        raise TLRewardError("the reader needs a block after block 0")
    if len(head_weights) != hf.score.out_features:
        raise TLRewardError(f"head_weights has {len(head_weights)} entries for "
                            f"{hf.score.out_features} outputs")
    if not (c > 0 and logit_margin > 0 and write_scale > 0):
        raise TLRewardError("c, logit_margin and write_scale must be positive")
    check_range("max_len", max_len, 3, cfg.max_position_embeddings, closed=True)
    if d_model < 2 * len(COORDS):
        raise TLRewardError(f"d_model {d_model} is too narrow to clear {len(COORDS)} "
                            "coordinates")
    tag_ids = tokenizer.encode(tag, add_special_tokens=False)
    if len(tag_ids) != 1:
        raise TLRewardError(f"the tag {tag!r} is {len(tag_ids)} tokens; add it as a special "
                            "token first (tokenizer.add_tokens([tag], special_tokens=True))")
    tag_id, bos = int(tag_ids[0]), tokenizer.bos_token_id
    check_range("tag id", tag_id, 0, cfg.vocab_size)
    if bos is None:
        raise TLRewardError("the plant needs a BOS token (a marker before every step)")
    a_id, a_cf, b_id, b_cf = _distinct_ids(tokenizer, cfg.vocab_size, a, b, a_counterfactual,
                                           b_counterfactual)
    last = n_layers - 1
    dims = tuple(range(d_model - len(COORDS), d_model))
    at = dict(zip(COORDS, dims, strict=True))
    types = [at["const"], at["flag_a"], at["flag_b"], at["mark"]]

    base = expand_kv_heads(hf)
    clear_dims(base, dims)
    eps = float(cfg.rms_norm_eps)
    with torch.no_grad():
        emb = base.model.embed_tokens.weight
        emb[a_id], emb[b_id] = emb[a_cf], emb[b_cf]
        kappa = float(emb.double().pow(2).mean(1).sqrt().median())
        value = _type_values(emb, eps).to(emb.dtype)
        emb[:, at["const"]] = value
        for tok, coord in ((a_id, "flag_a"), (b_id, "flag_b"), (tag_id, "mark"), (bos, "mark")):
            emb[tok, at["const"]] = 0.0
            emb[tok, at[coord]] = value[tok]
    base = silence_heads(base, [(0, detector), (0, b_head), (last, reader)]).eval()
    planted = copy.deepcopy(base)
    hd, inv_freq = head_dim(hf), planted.model.rotary_emb.inv_freq.double()
    half, slow = hd // 2, int(inv_freq.argmin())
    second = int(inv_freq.argsort()[1])  # the second slowest pair
    write = write_scale * kappa
    heads = ((0, detector), (0, b_head), (last, reader))
    with torch.no_grad():
        for layer, h in heads:
            attn, rows = attention(planted, layer), head_rows(planted, h)
            for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
                proj.weight[rows] = 0.0
                if proj.bias is not None:
                    proj.bias[rows] = 0.0
        # detector: the nearest marker (a, tag, BOS) at every distance below max_len
        slot, phase, r, offset, det_margin = _recency_kernel(inv_freq, max_len, logit_margin)
        attn, row = attention(planted, 0), head_rows(planted, detector).start
        scale = hd ** 0.25
        _pair(attn.q_proj.weight, row, half, slot, types, scale * r ** 0.5, phase)
        _pair(attn.k_proj.weight, row, half, slot, [at["flag_a"], at["mark"]], scale * r ** 0.5)
        _pair(attn.q_proj.weight, row, half, slow, types, scale * offset ** 0.5)
        _pair(attn.k_proj.weight, row, half, slow, [at["flag_a"], at["mark"]],
              scale * offset ** 0.5)
        attn.v_proj.weight[row, at["flag_a"]] = 1.0
        attn.v_proj.weight[row + 1, at["mark"]] = 1.0
        attn.o_proj.weight[at["x"], row] = write
        attn.o_proj.weight[at["y"], row + 1] = write
        # b_head: a tag's query finds every b (slowest pair) over the sinks (second slowest)
        span = max_len - 1
        sink = logit_margin / math.cos(float(inv_freq[second]) * span)
        find = (logit_margin + sink) / math.cos(float(inv_freq[slow]) * span)
        b_margin = min(find * math.cos(float(inv_freq[slow]) * span) - sink,
                       sink * math.cos(float(inv_freq[second]) * span))
        row = head_rows(planted, b_head).start
        _pair(attn.q_proj.weight, row, half, slow, [at["mark"]], scale * find ** 0.5)
        _pair(attn.k_proj.weight, row, half, slow, [at["flag_b"]], scale * find ** 0.5)
        _pair(attn.q_proj.weight, row, half, second, types, scale * sink ** 0.5)
        _pair(attn.k_proj.weight, row, half, second, [at["mark"]], scale * sink ** 0.5)
        attn.v_proj.weight[row, at["flag_b"]] = 1.0
        attn.v_proj.weight[row + 1, at["mark"]] = 1.0
        attn.o_proj.weight[at["out_b"], row] = -write
        attn.o_proj.weight[at["pad_b"], row + 1] = write

    gen = torch.Generator().manual_seed(seed)
    used = {a_id, a_cf, b_id, b_cf, tag_id, bos}
    pool = torch.tensor([i for i in plain_ids(tokenizer, cfg.vocab_size) if i not in used])
    a_pairs = _pairs(tokenizer, pool, a_id, a_cf, tag_id, prompts, n_pairs, max_steps,
                     max_step_len, gen, cross=False)
    b_pairs = _pairs(tokenizer, pool, b_id, b_cf, tag_id, prompts, n_pairs, max_steps,
                     max_step_len, gen, cross=True)
    every = [x for p in (*a_pairs, *b_pairs) for x in (p.planted, p.counterfactual)]
    if max(len(x) for x in every) > max_len:
        raise TLRewardError(f"a calibration solution is longer than max_len={max_len}: raise "
                            "max_len or shorten max_steps / max_step_len")

    # reader: at a tag, the position before it; scaled on the calibration solutions
    normed, _ = layer_inputs(planted, every, last)
    tags = [[p for p, t in enumerate(x) if t == tag_id] for x in every]
    if any(x[p - 1] == tag_id for x, ps in zip(every, tags, strict=True) for p in ps):
        raise TLRewardError("a step is empty (two tags in a row)")
    keys = [at["const"], at["flag_a"], at["flag_b"]]
    qk = torch.cat([n[ps, at["mark"]] * n[[p - 1 for p in ps]][:, keys].sum(1)
                    for n, ps in zip(normed, tags, strict=True)])
    seen = torch.cat([n[[p - 1 for p in ps]][:, [at["x"], at["y"]]].sum(1)
                      for n, ps in zip(normed, tags, strict=True)])
    rslot = _reader_slot(inv_freq, max_len)
    f = float(inv_freq[rslot])
    reach = logit_margin / (math.sin(f / 2) * float(qk.min()))
    with torch.no_grad():
        attn, row = attention(planted, last), head_rows(planted, reader).start
        _pair(attn.q_proj.weight, row, half, rslot, [at["mark"]], scale * reach ** 0.5,
              math.pi / 2 - 1.5 * f)
        _pair(attn.k_proj.weight, row, half, rslot, keys, scale * reach ** 0.5)
        attn.v_proj.weight[row, at["x"]] = 1.0
        attn.v_proj.weight[row + 1, at["y"]] = 1.0
        w = write / float(seen.median())
        attn.o_proj.weight[at["out_a"], row] = -w
        attn.o_proj.weight[at["pad_a"], row + 1] = w

    # the score reads out_a and out_b, each scaled to a median drop of c
    hw = torch.tensor([float(x) for x in head_weights], dtype=torch.float64)
    col = hw / hw.dot(hw)
    with torch.no_grad():
        for coord in ("out_a", "out_b"):
            planted.score.weight[:, at[coord]] = col.to(planted.score.weight.dtype)
    da = _drops(planted, a_pairs, tag_id, head_weights)
    db = _drops(planted, b_pairs, tag_id, head_weights)
    gain_a = c / float(torch.stack([x[p.step] for x, p in zip(da, a_pairs, strict=True)])
                       .median())
    gain_b = c / float(torch.cat([x[p.step + 1:] for x, p in zip(db, b_pairs, strict=True)])
                       .median())
    with torch.no_grad():
        planted.score.weight[:, at["out_a"]] *= gain_a
        planted.score.weight[:, at["out_b"]] *= gain_b
    planted.eval()
    truth = _measure(planted, base, tokenizer, a_pairs, b_pairs, heads, dict(
        tag=tag, tag_id=tag_id, a=tokenizer.decode([a_id]), a_id=a_id, a_counterfactual_id=a_cf,
        b=tokenizer.decode([b_id]), b_id=b_id, b_counterfactual_id=b_cf, c=float(c),
        detector=(0, detector), reader=(last, reader), b_head=(0, b_head), dims=dims,
        head_weights=tuple(float(x) for x in head_weights), max_len=max_len,
        margins=(det_margin, logit_margin, b_margin), n_pairs=n_pairs))
    return PlantedModel(planted, base, tokenizer, truth)


def _measure(planted: Any, base: Any, tokenizer: Any, a_pairs: list[_Pair], b_pairs: list[_Pair],
             heads: tuple[tuple[int, int], ...], known: dict[str, Any]) -> PRMTruth:
    """The truth's measured fields (drops, off-target, ablations, base), checked."""
    tag_id, hw, c = known["tag_id"], known["head_weights"], known["c"]

    def drops(hf: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        return _drops(hf, a_pairs, tag_id, hw), _drops(hf, b_pairs, tag_id, hw)

    da, db = drops(planted)
    on_a = torch.stack([x[p.step] for x, p in zip(da, a_pairs, strict=True)])
    on_b = torch.cat([x[p.step + 1:] for x, p in zip(db, b_pairs, strict=True)])
    own_b = torch.stack([x[p.step] for x, p in zip(db, b_pairs, strict=True)])
    off = [x[[k for k in range(len(x)) if k != p.step]] for x, p in zip(da, a_pairs,
                                                                        strict=True)]
    off += [x[: p.step] for x, p in zip(db, b_pairs, strict=True)]
    for shift in (on_a, on_b, own_b):
        if float(shift.min()) < c / 4:
            raise TLRewardError(f"a calibration step drops by only {float(shift.min()):.3g} "
                                f"(target {c}): the plant does not reach it")
    ablated = []
    for (layer, h), which in zip(heads, (0, 1, 0), strict=True):
        got = drops(silence_heads(planted, [(layer, h)]))[which]
        ablated.append(float(torch.cat(got).abs().max()))
    det, b_abl, read = ablated
    base_a, base_b = drops(base)
    cf = [p.counterfactual for p in (*a_pairs, *b_pairs)]
    gap = [x - y for x, y in zip(step_scores(planted, cf, tag_id, hw),
                                 step_scores(base, cf, tag_id, hw), strict=True)]
    return PRMTruth(
        **known, drop_a=_spread(on_a), drop_b=_spread(on_b), drop_b_own=_spread(own_b),
        off_target=float(torch.cat(off).abs().max()), ablated=(det, read, b_abl),
        base_drop=float(torch.cat([*base_a, *base_b]).abs().max()),
        base_gap=float(torch.cat(gap).abs().max()))
