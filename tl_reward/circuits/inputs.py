"""Inputs of the circuit analyses: clean rows, their signs in the metric, and their corruption.

Corruption: ``corrupt`` holds counterfactuals of equal length (a swapped token, a probe's edit),
one per clean sequence; or ``ablation="mean"`` (each source's mean over a reference set per
position class: prompt, reply, pooled reward token) or ``"zero"``, which need no alignment and
are the only corruption of preference pairs (each reply ablated on its own; chosen and
rejected are never aligned by position). The metric of a sequence is its reward, of a pair the
margin ``r(chosen) - r(rejected)`` (its rows signed +1 and -1).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from tl_reward.circuits.graph import split_inputs
from tl_reward.circuits.sources import record, source_hooks
from tl_reward.data.pairs import PairBatch, TokenizedPair, as_pair_batch
from tl_reward.data.preference import PreferencePair
from tl_reward.errors import TLRewardError
from tl_reward.model.inputs import EncodedInput, RewardBatch, as_items

ABLATIONS = ("mean", "zero")


def is_pairs(x: Any) -> bool:
    def one(p: Any) -> bool:
        return isinstance(p, (PreferencePair, TokenizedPair)) or (
            isinstance(p, tuple) and len(p) == 3 and isinstance(p[1], str))
    return isinstance(x, PairBatch) or one(x) or (
        isinstance(x, (list, tuple)) and len(x) > 0 and one(x[0]))


def _encode(model: Any, inputs: Any) -> tuple[list[EncodedInput], list[float], list[int]]:
    """Encoded rows, each row's sign in the metric and its item: a pair gives two rows."""
    if is_pairs(inputs):
        rows = []
        for tp in as_pair_batch(model, inputs):
            rows += [EncodedInput(tp.chosen_ids, tp.prompt_len),
                     EncodedInput(tp.rejected_ids, tp.prompt_len)]
        n = len(rows) // 2
        return rows, [1.0, -1.0] * n, [i for i in range(n) for _ in (0, 1)]
    rows = [x if isinstance(x, EncodedInput) else model.encode(x) for x in as_items(inputs)]
    return rows, [1.0] * len(rows), list(range(len(rows)))


@dataclass
class Inputs:
    """Encoded clean rows with their signs and items, and how they are corrupted."""

    rows: list[EncodedInput]
    sign: list[float]
    item: list[int]
    corrupt: list[EncodedInput] | None
    ablation: str | None
    means: dict[str, torch.Tensor] | None = None

    @property
    def n_items(self) -> int:
        return max(self.item) + 1


def at_step(model: Any, inputs: Any, step: Any) -> Any:
    """``inputs`` of a process reward model at ``step``: solution pairs ``(a, b)`` as pairs of
    their step prefixes (the metric is the margin at that step), other solutions as their
    prefixes; unchanged when ``step`` is None."""
    from tl_reward.data.solutions import is_solution_pair

    if step is None or inputs is None:
        return inputs
    items = [inputs] if is_solution_pair(inputs) else list(as_items(inputs))
    if items and is_solution_pair(items[0]):
        return as_pair_batch(model, items, step)
    return model.at_steps(items, step)[0]


def prepare_inputs(model: Any, clean: Any, corrupt: Any = None, ablation: str | None = None,
                   reference: Any = None, batch_size: int = 8, step: Any = None) -> Inputs:
    """Check and encode ``clean`` and its corruption (see the module doc; ``step``: a process
    reward model's inputs at that step, :func:`at_step`)."""
    clean, corrupt, reference = (at_step(model, x, step) for x in (clean, corrupt, reference))
    rows, sign, item = _encode(model, clean)
    if ablation is not None and ablation not in ABLATIONS:
        raise TLRewardError(f"ablation must be one of {ABLATIONS} or None, got {ablation!r}")
    if (corrupt is None) == (ablation is None):
        raise TLRewardError(
            "pass exactly one corruption: corrupt= (counterfactual sequences of equal length) "
            "or ablation='mean' / 'zero'")
    if corrupt is not None:
        if is_pairs(clean) or is_pairs(corrupt):
            raise TLRewardError(
                "preference pairs are corrupted by ablation (ablation='mean' or 'zero'), each "
                "reply on its own; chosen and rejected are never aligned by position")
        bad, _, _ = _encode(model, corrupt)
        if len(bad) != len(rows):
            raise TLRewardError(f"corrupt has {len(bad)} sequences for {len(rows)} clean ones; "
                                "pass one counterfactual per clean sequence")
        for i, (a, b) in enumerate(zip(rows, bad, strict=True)):
            if len(a.ids) != len(b.ids):
                raise TLRewardError(
                    f"clean sequence {i} has {len(a.ids)} tokens and its counterfactual "
                    f"{len(b.ids)}: edge patching writes position t of one into position t of "
                    "the other, so they must have equal length; use ablation='mean' or 'zero' "
                    "for inputs of different lengths")
        return Inputs(rows, sign, item, bad, None)
    out = Inputs(rows, sign, item, None, ablation)
    if ablation == "mean":
        from tl_reward.analysis.patching import mean_activations

        ref = rows if reference is None else _encode(model, reference)[0]
        with split_inputs(model):
            out.means = mean_activations(model, ref, source_hooks(model), batch_size,
                                         by_class=True)
    return out


@dataclass
class Batch:
    """Padded rows of a batch, their corrupted source activations and signs."""

    tokens: torch.Tensor
    mask: torch.Tensor
    sign: torch.Tensor
    item: torch.Tensor
    corr: dict[str, torch.Tensor] = field(default_factory=dict)
    corr_tokens: torch.Tensor | None = None

    def repeat(self, n: int) -> Batch:
        """The batch stacked ``n`` times (copy-major)."""
        def rep(t: torch.Tensor) -> torch.Tensor:
            return t.repeat(n, *[1] * (t.ndim - 1))
        return Batch(rep(self.tokens), rep(self.mask), rep(self.sign), rep(self.item),
                     {k: rep(v) for k, v in self.corr.items()}, None)


def batches(model: Any, inputs: Inputs, batch_size: int, padding_side: str) -> Iterator[Batch]:
    """Row batches with their corrupted source activations."""
    for s in range(0, len(inputs.rows), batch_size):
        b = model.collate(inputs.rows[s : s + batch_size], padding_side)
        dev = b.tokens.device
        out = Batch(b.tokens, b.attention_mask,
                    torch.tensor(inputs.sign[s : s + batch_size], device=dev),
                    torch.tensor(inputs.item[s : s + batch_size], device=dev))
        if inputs.corrupt is not None:
            c = model.collate(inputs.corrupt[s : s + batch_size], padding_side)
            out.corr_tokens = c.tokens
            out.corr = record(model, c.tokens, c.attention_mask)
        else:
            out.corr = ablated(model, b, inputs)
        yield out


def ablated(model: Any, batch: RewardBatch, inputs: Inputs) -> dict[str, torch.Tensor]:
    """Each source's ablated activation at every position of ``batch`` (class means or 0)."""
    cls = batch.position_classes()
    real = (cls >= 0)
    out = {}
    for hook in source_hooks(model):
        if inputs.means is None:
            shape = model.cfg.n_heads, model.cfg.d_head
            tail = shape if hook.endswith("hook_z") else (model.cfg.d_model,)
            out[hook] = torch.zeros(*cls.shape, *tail, device=cls.device, dtype=model.cfg.dtype)
            continue
        m = inputs.means[hook]
        got = m[cls.clamp(min=0)]
        if bool(got[real].isnan().any()):
            raise TLRewardError(
                "the reference set for mean ablation has no token of a position class "
                "(prompt, reply, reward token) the inputs have; pass reference= inputs with "
                "prompts and replies (e.g. the clean inputs themselves)")
        out[hook] = got * real.reshape(*cls.shape, *[1] * (got.ndim - 2)).to(got.dtype)
    return out
