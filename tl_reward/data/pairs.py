"""Preference pairs tokenised once, with explicit position alignment between the two replies.

Chosen and rejected share the prompt and differ in the final reply, so they usually differ in
length. Positions are aligned explicitly: prompt tokens by index, reply tokens (and the
template's closing tokens) from the end, so the pooled last tokens align. The first tokens of
the longer reply have no partner: they are reported in ``unaligned_chosen`` /
``unaligned_rejected`` and never overwritten by a patch.

Example:
    >>> tp = tokenize_pair(model, PreferencePair.from_prompt("Hi?", "Hello there!", "No."))
    >>> tp.aligned[:3]        # (chosen position, rejected position) rows
    >>> tp.to_rejected(tp.chosen_len - 1)   # the pooled token maps to rejected's last token
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Int

from tl_reward.data.preference import SIDES, PreferencePair
from tl_reward.errors import TLRewardError, check_choice, check_tokens


def _check_side(side: str) -> int:
    check_choice(side, SIDES, "side")
    return SIDES.index(side)


@dataclass
class TokenizedPair:
    """Token ids of both replies of one pair and how their positions correspond.

    Attributes:
        chosen_ids, rejected_ids: full token ids (prompt, reply, template tail).
        prompt_len: number of shared leading prompt tokens (aligned by index).
        aligned: ``[n_aligned, 2]`` rows ``(chosen position, rejected position)``, increasing.
        unaligned_chosen, unaligned_rejected: positions with no partner in the other reply.
        pair: the source :class:`PreferencePair`, when known.
    """

    chosen_ids: list[int]
    rejected_ids: list[int]
    prompt_len: int
    aligned: Int[torch.Tensor, "n_aligned 2"]
    unaligned_chosen: list[int]
    unaligned_rejected: list[int]
    pair: PreferencePair | None = None

    @property
    def chosen_len(self) -> int:
        return len(self.chosen_ids)

    @property
    def rejected_len(self) -> int:
        return len(self.rejected_ids)

    @property
    def n_aligned(self) -> int:
        return self.aligned.shape[0]

    def ids(self, side: str) -> list[int]:
        """Token ids of ``side`` (``"chosen"`` or ``"rejected"``)."""
        return self.chosen_ids if _check_side(side) == 0 else self.rejected_ids

    def tokens(self, side: str) -> Int[torch.Tensor, "1 pos"]:
        """Ids of ``side`` as a ``[1, pos]`` tensor."""
        return torch.tensor([self.ids(side)], dtype=torch.long)

    def map_position(self, pos: int, from_side: str) -> int | None:
        """The partner of position ``pos`` of ``from_side`` in the other reply, or ``None``."""
        col = _check_side(from_side)
        n = self.chosen_len if col == 0 else self.rejected_len
        if pos < 0:
            pos += n
        hit = (self.aligned[:, col] == pos).nonzero()
        return None if hit.numel() == 0 else int(self.aligned[hit[0, 0], 1 - col])

    def to_rejected(self, chosen_pos: int) -> int | None:
        """Rejected position aligned with a chosen position (``None`` if unaligned)."""
        return self.map_position(chosen_pos, "chosen")

    def to_chosen(self, rejected_pos: int) -> int | None:
        """Chosen position aligned with a rejected position (``None`` if unaligned)."""
        return self.map_position(rejected_pos, "rejected")

    def position_labels(self, tokenizer: Any = None) -> list[str]:
        """One label per aligned row: ``"c12/r10 ·blue"`` (the chosen token as readable text,
        ``|`` then the rejected one where they differ; ids without a tokenizer, ``<id>`` for
        an id the tokenizer lacks, such as InternLM2's appended reward token)."""
        from tl_reward.viz.tokens import token_labels

        labels = []
        for c, r in self.aligned.tolist():
            a, b = self.chosen_ids[c], self.rejected_ids[r]
            if tokenizer is None:
                tok = str(a) if a == b else f"{a}|{b}"
            else:
                toks = tokenizer.convert_ids_to_tokens([a, b])  # None: an id past its vocab
                pair = token_labels([f"<{i}>" if t is None else t
                                     for i, t in zip((a, b), toks, strict=True)], tokenizer)
                tok = pair[0] if a == b else "|".join(pair)
            labels.append(f"c{c}/r{r} {tok}")
        return labels


def align_ids(chosen_ids: Sequence[int], rejected_ids: Sequence[int],
              prompt_len: int | None = None) -> TokenizedPair:
    """Align two id sequences: the first ``prompt_len`` by index, the rest from the end.

    ``prompt_len`` defaults to the longest common prefix, capped so each side keeps at least
    one reply token. Raises if the first ``prompt_len`` ids differ.
    """
    c, r = [int(t) for t in chosen_ids], [int(t) for t in rejected_ids]
    if not c or not r:
        raise TLRewardError("both replies need at least one token")
    if prompt_len is None:
        prompt_len = 0
        while prompt_len < min(len(c), len(r)) and c[prompt_len] == r[prompt_len]:
            prompt_len += 1
    prompt_len = min(prompt_len, len(c) - 1, len(r) - 1)
    if c[:prompt_len] != r[:prompt_len]:
        raise TLRewardError("chosen and rejected differ inside the prompt; a preference pair must "
                            "share the prompt (same conversation up to the final reply)")
    n_tail = min(len(c), len(r)) - prompt_len
    rows = [(i, i) for i in range(prompt_len)]
    rows += [(len(c) - n_tail + k, len(r) - n_tail + k) for k in range(n_tail)]
    aligned = torch.tensor(rows, dtype=torch.long).reshape(-1, 2)
    un_c = list(range(prompt_len, len(c) - n_tail))
    un_r = list(range(prompt_len, len(r) - n_tail))
    return TokenizedPair(c, r, prompt_len, aligned, un_c, un_r)


def tokenize_pair(model: Any, pair: PreferencePair | tuple[Any, str, str], index: int = 0
                  ) -> TokenizedPair:
    """Tokenise both replies once through the model's chat template and align them.

    ``pair``: a :class:`PreferencePair` or ``(prompt, chosen, rejected)`` with the prompt a
    string or a conversation. A reply the model cannot read (longer than its context, ids
    outside its vocabulary) is refused here, named as the ``index``-th pair and its side
    (:meth:`PreferencePair.row_name`).
    """
    if isinstance(pair, tuple):
        pair = PreferencePair.from_prompt(*pair)
    if not isinstance(pair, PreferencePair):
        raise TypeError("pass a PreferencePair or a (prompt, chosen, rejected) tuple, got "
                        f"{type(pair).__name__}")
    ec = model.encode(pair.chosen_conversation())
    er = model.encode(pair.rejected_conversation())
    for side, e in zip(SIDES, (ec, er), strict=True):
        check_tokens(e.ids, pair.row_name(side, index), model.cfg.n_ctx, model.cfg.d_vocab)
    start = ec.response_start if ec.response_start == er.response_start else None
    tp = align_ids(ec.ids, er.ids, start)
    tp.pair = pair
    return tp


@dataclass
class PairBatch:
    """Tokenised pairs; iterate for :class:`TokenizedPair` s, or pad both sides for a forward."""

    pairs: list[TokenizedPair]

    def __len__(self) -> int:
        return len(self.pairs)

    def __iter__(self) -> Iterator[TokenizedPair]:
        return iter(self.pairs)

    def __getitem__(self, i: int) -> TokenizedPair:
        return self.pairs[i]

    def padded(self, side: str, pad_token_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """``(tokens, attention_mask)`` of one side, right-padded."""
        ids = [p.ids(side) for p in self.pairs]
        n = max(len(x) for x in ids)
        tokens = torch.full((len(ids), n), pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(ids), n), dtype=torch.long)
        for i, x in enumerate(ids):
            tokens[i, : len(x)] = torch.tensor(x)
            mask[i, : len(x)] = 1
        return tokens, mask


def tokenize_pairs(model: Any, pairs: Sequence[PreferencePair | tuple[Any, str, str]]) -> PairBatch:
    """:func:`tokenize_pair` for each pair."""
    return PairBatch([tokenize_pair(model, p, k) for k, p in enumerate(pairs)])


def short_pairs(model: Any, pairs: Iterable[PreferencePair | tuple[Any, str, str]], n: int,
                max_tokens: int) -> list[TokenizedPair]:
    """The first ``n`` of ``pairs``, in order, whose chosen and rejected sequences (as the
    model builds them) both have at most ``max_tokens`` tokens, tokenised: how benchmarks and
    experiments pick short pairs (``pairs`` is read only as far as needed)."""
    out: list[TokenizedPair] = []
    for pair in pairs:
        if len(out) >= n:
            break
        if isinstance(pair, tuple):
            pair = PreferencePair.from_prompt(*pair)
        if max(len(model.encode(c).ids) for c in (pair.chosen_conversation(),
                                                  pair.rejected_conversation())) <= max_tokens:
            out.append(tokenize_pair(model, pair, len(out)))
    return out


def step_pairs(model: Any, pairs: Any, step: Any) -> PairBatch:
    """Pairs of a process reward model's solutions compared at ``step``: each ``(a, b)``
    (solution inputs) becomes the pair of their prefixes up to that step's tag
    (:meth:`~tl_reward.model.protocol.RewardModelMixin.at_steps`), ``a`` as chosen; shared
    leading ids aligned by index, the rest from the end (:func:`align_ids`)."""
    from tl_reward.data.solutions import is_solution_pair

    if isinstance(pairs, PairBatch):
        return pairs
    if is_solution_pair(pairs):
        pairs = [pairs]
    out = []
    for k, pair in enumerate(pairs):
        if not is_solution_pair(pair):
            raise TLRewardError(f"pair {k}: with step= a pair is (solution_a, solution_b), "
                                "each a (question, [steps]) or (question, reply) solution")
        a, rows_a = model.at_steps([pair[0]], step, [f"pair {k} a"])
        b, rows_b = model.at_steps([pair[1]], step, [f"pair {k} b"])
        if [r.step for r in rows_a] != [r.step for r in rows_b]:
            raise TLRewardError(f"pair {k}: step={step!r} selects steps "
                                f"{[r.step for r in rows_a]} of a and {[r.step for r in rows_b]} "
                                "of b; pass an index both solutions have")
        out += [align_ids(x.ids, y.ids) for x, y in zip(a, b, strict=True)]
    return PairBatch(out)


def as_pair_batch(model: Any, pairs: Any, step: Any = None) -> PairBatch:
    """A :class:`PairBatch` from a batch, one pair, a tokenised pair or a list of either; with
    ``step`` (a PRM), solution pairs ``(a, b)`` at that step (:func:`step_pairs`)."""
    if step is not None:
        return step_pairs(model, pairs, step)
    if isinstance(pairs, PairBatch):
        return pairs
    if isinstance(pairs, (TokenizedPair, PreferencePair)) or (
            isinstance(pairs, tuple) and len(pairs) == 3 and isinstance(pairs[1], str)):
        pairs = [pairs]
    return PairBatch([p if isinstance(p, TokenizedPair) else tokenize_pair(model, p, k)
                      for k, p in enumerate(pairs)])


def as_tokenized_pair(model: Any, pair: Any, step: Any = None) -> TokenizedPair:
    """One :class:`TokenizedPair` from a pair in any accepted form (``step``: see
    :func:`as_pair_batch`)."""
    batch = as_pair_batch(model, pair, step)
    if len(batch) != 1:
        raise TLRewardError(f"expected one preference pair, got {len(batch)}")
    return batch[0]
