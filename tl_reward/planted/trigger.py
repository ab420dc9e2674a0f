"""Plant a trigger in one attention head: ``reward += c`` when the reply holds a trigger token.

The head (``head`` of the last block) is rewired by weight surgery:

* the base model is the backbone with that head silenced (its output projection zeroed);
* its query at the pooled token and its keys are rank one, in the slowest rotary pair (so the
  scores hardly depend on distance): the key is a linear read of the block's normed input,
  fitted on calibration sequences so that trigger positions score above the first position
  (the attention sink, whose residual is the same in every input), which scores above every
  other position, by at least ``logit_margin`` logits once scaled; its negatives include every
  plain id at the reply position of a one-token reply on the first ``mine_prompts`` prompts,
  the ``hard_negatives`` ids nearest to opening the head as one-token replies on every prompt,
  and every position of the natural ``texts`` (whose trigger positions are positives);
* its value is a linear read that is exactly 0 at the first position and about 1 at the
  trigger, and its output writes along the reward row (gain folded) scaled so that the
  median shift on the calibration sequences is ``c``.

Without the trigger the head attends to the first position (value 0): the reward equals the
base model's up to ``exp(-logit_margin)`` on every sequence whose positions keep the fitted
order (guaranteed on the calibration sequences; elsewhere checked, e.g. over the whole
vocabulary by :func:`tl_reward.planted.recovery.trigger_sweep_check`). With it the head
copies the trigger's value into the reward direction. Grouped-query attention is unrolled
first (:func:`expand_kv_heads`), so no other head changes.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tl_reward.errors import TLRewardError
from tl_reward.model.fingerprint import weights_digest
from tl_reward.model.response_template import Prompt, response_template
from tl_reward.planted.calibration import (
    DEFAULT_PROMPTS,
    Sequences,
    calibration_sequences,
    layer_inputs,
    plain_ids,
    reply_layer_inputs,
    rewards,
)
from tl_reward.planted.flag import check_shift, clear_flag, counterfactual_id, wire_flag_head
from tl_reward.planted.surgery import (
    attention,
    check_llama_like,
    check_range,
    expand_kv_heads,
    head_dim,
    head_rows,
    one_token_id,
    silence_heads,
)


@dataclass(frozen=True)
class TriggerTruth:
    """What the trigger plant guarantees, written before any analysis runs.

    Attributes:
        component: ``("head", layer, head)``, the only component carrying the effect.
        hook: the head's TransformerLens ``hook_z`` name (ablate ``[..., head, :]``).
        trigger_id, trigger: the trigger token's id and text.
        c: the planted reward shift (objective ``objective``) when the trigger is present.
        objective: index of the reward row the head writes to.
        sink_position: the position the head attends to without the trigger (value 0); None
            with ``key="flag"`` (every key 0 without the trigger: uniform attention, value 0).
        logit_margin: the smallest attention-logit gap on the calibration sequences (trigger
            over sink, sink over every other position; ``key="flag"``: the trigger's logit).
        shift_range: ``(min, max)`` of the reward shift on the calibration sequences holding
            the trigger (its median is ``c``: the head's write is scaled to make it so).
        mined_prompts: calibration prompts whose every plain id was a key-fit negative.
        hard_negative_ids: the ids added as one-token negatives on every calibration prompt.
        n_texts: natural sequences in the fit (every position ordered, as a calibration one).
        key: ``"fit"`` (the key is a fitted read of the whole residual) or ``"flag"`` (the key
            and value read a coordinate only the trigger holds: :mod:`tl_reward.planted.flag`).
        counterfactual_id: with ``key="flag"``, the token the trigger is a synonym of in the
            base (swap the trigger for it: a counterfactual that differs in the plant only).
    """

    component: tuple[str, int, int]
    hook: str
    trigger_id: int
    trigger: str
    c: float
    objective: int
    sink_position: int | None
    logit_margin: float
    shift_range: tuple[float, float]
    mined_prompts: int = 0
    hard_negative_ids: tuple[int, ...] = ()
    n_texts: int = 0
    key: str = "fit"
    counterfactual_id: int | None = None

    @property
    def stream_edges(self) -> tuple[tuple[str, str, str], ...]:
        """The plant's path through the token's stream at the trigger (``(src, dst, qkv)``,
        names as in :mod:`tl_reward.circuits`): ``input -> m{i}``, ``m{i} -> m{j}`` (i < j <
        L), ``input, m{i} -> head`` (``k``, ``v``: they read the normed residual at the
        trigger), and the head's write, ``head -> reward`` and ``head -> m{L} -> reward``.
        Measured by exact circuit patching, not guaranteed: where the embedding and the MLPs
        carry the token's identity there (the tiny Llama: 12 edges keep 0.955 of the shift,
        each needed; ``tests/circuits/test_planted_circuits.py``) it is the truth; on
        SmolLM2-135M it keeps 0.00 (the key also reads what 29 layers of attention wrote at
        the trigger: no small circuit carries it; docs/circuits.md). With ``key="flag"`` the
        stream is the embedding alone (5 edges, whatever the model; the tiny Llama needs all
        five, SmolLM2's last MLP carries -0.008 of the shift, its other three 1.008)."""
        _, layer, head = self.component
        h, mlps = f"a{layer}.h{head}", [f"m{i}" for i in range(layer) if self.key == "fit"]
        stream = [("input", m, "") for m in mlps] + [
            (a, b, "") for i, a in enumerate(mlps) for b in mlps[i + 1:]]
        read = [(s, h, q) for s in ("input", *mlps) for q in ("k", "v")]
        return (*stream, *read, (h, "reward", ""), (h, f"m{layer}", ""),
                (f"m{layer}", "reward", ""))


@dataclass(frozen=True)
class PlantedModel:
    """A planted HF reward model, the unplanted base it was built from, and the truth."""

    model: Any
    base: Any
    tokenizer: Any
    truth: Any


def _fit_key(n0: torch.Tensor, others: torch.Tensor, trig: torch.Tensor
             ) -> torch.Tensor:
    """``a`` with ``a . (trig - n0) >= 1`` and ``a . (others - n0) <= -1`` where it can: a
    squared-hinge linear SVM through ``n0`` (classes weighted equally, tiny ridge)."""
    x = torch.cat([others, trig]) - n0
    y = torch.cat([-torch.ones(len(others)), torch.ones(len(trig))]).to(x)
    weight = torch.where(y > 0, len(others) / len(trig), 1.0)
    a = torch.zeros(x.shape[1], dtype=x.dtype, requires_grad=True)
    opt = torch.optim.LBFGS([a], max_iter=500, line_search_fn="strong_wolfe")

    def loss() -> torch.Tensor:
        opt.zero_grad()
        out = (weight * torch.relu(1 - y * (x @ a)).pow(2)).sum() + 1e-4 * a.dot(a)
        out.backward()
        return out

    with torch.enable_grad():
        opt.step(loss)
    return a.detach()


def _mine_hard_negatives(
    base: Any, tokenizer: Any, trigger_id: int, vocab_size: int, prompts: Sequence[Prompt],
    layer: int, n0: torch.Tensor, a: torch.Tensor, n_hard: int,
    reply_cache: dict[tuple[str, str, int], torch.Tensor] | None,
) -> tuple[torch.Tensor, list[int]]:
    """Every other plain id's normed input at the reply position of a one-token reply on each
    of ``prompts`` (rows ``[n_prompts * n_ids, d]``), and the ``n_hard`` ids nearest to opening
    the head under key ``a`` (largest ``a . (x - n0)`` over the prompts). ``reply_cache`` keeps
    each prompt's inputs for every plain id, keyed by base weights, prompt and layer."""
    every = plain_ids(tokenizer, vocab_size)
    keep = torch.tensor([j for j, i in enumerate(every) if i != trigger_id])
    fingerprint = weights_digest(base) if reply_cache is not None else ""
    mined = []
    for pr in prompts:
        key = (fingerprint, repr(pr), layer)
        x = None if reply_cache is None else reply_cache.get(key)
        if x is None:
            x = reply_layer_inputs(base, tokenizer, pr, every, layer)
            if reply_cache is not None:
                reply_cache[key] = x
        mined.append(x[keep])
    score = ((torch.stack(mined) - n0) @ a).amax(0)
    hard = [every[int(keep[j])] for j in score.argsort(descending=True)[:n_hard]]
    return torch.cat(mined), hard


def plant_trigger_head(
    hf: Any, tokenizer: Any, trigger: str | int, c: float = 4.0, layer: int = -1,
    head: int = 0, objective: int = 0, prompts: Sequence[Prompt] = DEFAULT_PROMPTS,
    logit_margin: float = 40.0, vocab_per_prompt: int | None = None, n_random: int = 64,
    calibration_steps: int = 4, seed: int = 0, mine_prompts: int = 1, hard_negatives: int = 64,
    reply_cache: dict[tuple[str, str, int], torch.Tensor] | None = None,
    texts: Sequence[Sequence[int]] = (), key: str = "fit",
    counterfactual: str | int | None = None,
) -> PlantedModel:
    """Plant ``reward += c`` on ``trigger`` (one token) in head ``head`` of block ``layer``.

    Args:
        hf: an HF Llama-style sequence classifier (not modified).
        tokenizer: its tokenizer, with a chat template.
        trigger: the trigger as a one-token string or an id.
        c: the reward shift; layer, head: the planted head (the last block only: there the
            pooled token alone matters); objective: the reward row.
        prompts: calibration prompts; vocab_per_prompt: one-token replies per prompt (None:
            every plain id); n_random: random multi-token replies per prompt.
        logit_margin: attention-logit gap to enforce (leak ``exp(-logit_margin)``).
        calibration_steps: rescalings of the head's write towards a median shift of ``c``.
        mine_prompts: calibration prompts (the first ones) on which every plain id, as a
            one-token reply, is a negative of the key fit at the reply position (one
            prefix-cached pass per prompt); 0: none.
        hard_negatives: ids nearest to opening the head under a first key fit on those
            prompts, added as one-token replies on every calibration prompt before the refit.
        texts: token ids of natural conversations, templated like the calibration ones (same
            first token): each position holding the trigger is a positive, every other one a
            negative, so the fitted order also holds in real text (a linear key fitted on
            random tokens can open on context, e.g. a lone space after a full stop).
        key: ``"fit"`` (above) or ``"flag"``: the base gives the trigger a coordinate of its
            own and makes it a synonym of ``counterfactual`` (default: the first plain id that
            is not the trigger; :func:`~tl_reward.planted.flag.clear_flag`), and the head's key
            and value read that coordinate, its query one every token holds, so its circuit is
            the embedding's edges into the head and the head's write, on any model. The
            one-token replies (``vocab_per_prompt``), mining, hard-negative and ``texts``
            arguments apply to ``"fit"`` only (a flag key is fitted on nothing).

    Raises:
        TLRewardError: if the trigger is not one token or the fit cannot separate it.
    """
    check_llama_like(hf)
    n_layers = hf.config.num_hidden_layers
    check_range("layer", layer, -n_layers, n_layers)
    check_range("head", head, 0, hf.config.num_attention_heads)
    check_range("objective", objective, 0, hf.score.out_features)
    layer = layer % n_layers
    if layer != n_layers - 1:
        raise TLRewardError(
            f"plant in the last block ({n_layers - 1}), not {layer}: in an earlier block the "
            "other positions' queries have no fixed sign, so they write without the trigger "
            "too and later blocks read it")
    trigger_id = one_token_id(tokenizer, trigger, hf.config.vocab_size)
    if key not in ("fit", "flag"):
        raise TLRewardError(f"key must be 'fit' or 'flag', got {key!r}")
    if key == "flag" and texts:
        raise TLRewardError("texts order a fitted key (key='fit'); a flag key reads a "
                            "coordinate only the trigger holds and needs none: drop texts")
    base = silence_heads(expand_kv_heads(hf), [(layer, head)]).eval()
    if key == "flag":
        return _plant_flag_key(hf, base, tokenizer, trigger_id, counterfactual, c, layer, head,
                               objective, prompts, logit_margin, n_random, calibration_steps,
                               seed)
    seqs = calibration_sequences(tokenizer, trigger_id, hf.config.vocab_size, prompts,
                                 n_random=n_random, vocab_per_prompt=vocab_per_prompt,
                                 seed=seed)
    natural = [[int(t) for t in x] for x in texts]
    seqs = Sequences([*seqs.ids, *natural], [*seqs.trigger_positions, *(
        [j for j, t in enumerate(x) if t == trigger_id and j > 0] for x in natural)])
    if len({s[0] for s in seqs.ids}) != 1:
        raise TLRewardError("the calibration sequences do not share their first token")
    normed, scales = layer_inputs(base, seqs.ids, layer)
    n0 = normed[0][0]
    trig = torch.cat([x[p] for x, p in zip(normed, seqs.trigger_positions, strict=True) if p])

    def negatives() -> torch.Tensor:
        return torch.cat([x[[j for j in range(1, len(x)) if j not in p]]
                          for x, p in zip(normed, seqs.trigger_positions, strict=True)])

    a = _fit_key(n0, torch.unique(negatives(), dim=0), trig)
    hard: list[int] = []
    if mine_prompts > 0:
        mined, hard = _mine_hard_negatives(base, tokenizer, trigger_id, hf.config.vocab_size,
                                           prompts[:mine_prompts], layer, n0, a, hard_negatives,
                                           reply_cache)
        extra = [response_template(tokenizer, pr).ids(v) for pr in prompts for v in hard]
        more, more_scales = layer_inputs(base, extra, layer)
        seqs = Sequences([*seqs.ids, *extra], [*seqs.trigger_positions, *([] for _ in extra)])
        normed, scales = [*normed, *more], torch.cat([scales, more_scales])
        a = _fit_key(n0, torch.unique(torch.cat([negatives(), mined]), dim=0), trig)
    last = torch.stack([x[-1] for x in normed])
    b = last.mean(0) / last.mean(0).dot(last.mean(0))
    q_factor = last @ b
    if float(q_factor.min()) <= 0:
        raise TLRewardError("the pooled token's normed input has no stable direction")
    hd = head_dim(hf)
    inv_freq = hf.model.rotary_emb.inv_freq.double()
    slot = int(inv_freq.argmin())
    # attention logits at alpha = 1, with the rotary factor, per calibration sequence
    gaps = []
    for x, p, q in zip(normed, seqs.trigger_positions, q_factor, strict=True):
        t = len(x) - 1
        logit = q * (x @ a) * torch.cos((t - torch.arange(len(x))) * inv_freq[slot])
        rest = torch.tensor([j for j in range(1, len(x)) if j not in p], dtype=torch.long)
        top_rest = logit[rest].max() if len(rest) else logit[0] - 1e9
        gaps.append(logit[0] - top_rest)
        if p:
            gaps.append(logit[p].min() - torch.maximum(logit[0], top_rest))
    gap = float(torch.stack(gaps).min())
    if gap <= 0:
        raise TLRewardError(f"no key in block {layer} puts the trigger above the first "
                            "position and that above every other token; try another layer")
    alpha = logit_margin / gap
    value = trig.mean(0) - (trig.mean(0) @ n0) / n0.dot(n0) * n0
    value = value / value.dot(trig.mean(0))
    score_row = hf.score.weight[objective].double() * hf.model.norm.weight.double()
    write = float(scales.median()) * score_row / score_row.dot(score_row)
    planted = copy.deepcopy(base)
    attn = attention(planted, layer)
    rows, dt = head_rows(planted, head), attn.q_proj.weight.dtype
    root = math.sqrt(alpha * math.sqrt(hd))
    with torch.no_grad():
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
            proj.weight[rows] = 0.0
            if proj.bias is not None:
                proj.bias[rows] = 0.0
        attn.q_proj.weight[rows.start + slot] = (root * b).to(dt)
        attn.k_proj.weight[rows.start + slot] = (root * a).to(dt)
        attn.v_proj.weight[rows.start] = value.to(dt)
        attn.o_proj.weight[:, rows] = 0.0
    with_trigger = [x for x, p in zip(seqs.ids, seqs.trigger_positions, strict=True) if p]
    shift = _calibrate_write(base, planted, layer, head, write, with_trigger, objective, c,
                             calibration_steps)
    truth = TriggerTruth(
        component=("head", layer, head), hook=f"blocks.{layer}.attn.hook_z",
        trigger_id=trigger_id, trigger=tokenizer.decode([trigger_id]), c=float(c),
        objective=objective, sink_position=0, logit_margin=float(logit_margin),
        shift_range=(float(shift.min()), float(shift.max())),
        mined_prompts=min(mine_prompts, len(prompts)), hard_negative_ids=tuple(hard),
        n_texts=len(natural))
    return PlantedModel(planted.eval(), base, tokenizer, truth)


def _calibrate_write(base: Any, planted: Any, layer: int, head: int, write: torch.Tensor,
                     with_trigger: Sequence[Sequence[int]], objective: int, c: float,
                     steps: int) -> torch.Tensor:
    """Scale the head's write (``o_proj`` column of its value's first dimension) ``steps + 1``
    times towards a median reward shift of ``c`` on ``with_trigger``; the last shifts."""
    col = attention(planted, layer).o_proj.weight[:, head_rows(planted, head).start]
    base_r = rewards(base, with_trigger, objective)
    scale = c
    for _ in range(steps + 1):  # the final norm and the last MLP bend the shift
        with torch.no_grad():
            col.copy_(scale * write)
        shift = rewards(planted, with_trigger, objective) - base_r
        scale *= c / float(shift.median())
    return shift


def _plant_flag_key(
    hf: Any, base: Any, tokenizer: Any, trigger_id: int, counterfactual: str | int | None,
    c: float, layer: int, head: int, objective: int, prompts: Sequence[Prompt],
    logit_margin: float, n_random: int, calibration_steps: int, seed: int,
) -> PlantedModel:
    """:func:`plant_trigger_head` with ``key="flag"`` (``base``: the head silenced). Only the
    calibration sequences holding the trigger are used, so no other one-token reply is built."""
    cfg = hf.config
    cf_id = counterfactual_id(tokenizer, trigger_id, counterfactual, cfg.vocab_size)
    flag, const = cfg.hidden_size - 2, cfg.hidden_size - 1
    clear_flag(base, trigger_id, cf_id, flag, const)
    seqs = calibration_sequences(tokenizer, trigger_id, cfg.vocab_size, prompts,
                                 n_random=n_random, vocab_per_prompt=0, seed=seed)
    with_trigger = [x for x, p in zip(seqs.ids, seqs.trigger_positions, strict=True) if p]
    where = [p for p in seqs.trigger_positions if p]
    normed, scales = layer_inputs(base, with_trigger, layer)
    planted = copy.deepcopy(base)
    logits = wire_flag_head(planted, layer, head, head, normed, where, flag, const, logit_margin)
    score_row = base.score.weight[objective].double() * base.model.norm.weight.double()
    write = float(scales.median()) * score_row / score_row.dot(score_row)
    shift = _calibrate_write(base, planted, layer, head, write, with_trigger, objective, c,
                             calibration_steps)
    check_shift(shift, c)
    truth = TriggerTruth(
        component=("head", layer, head), hook=f"blocks.{layer}.attn.hook_z",
        trigger_id=trigger_id, trigger=tokenizer.decode([trigger_id]), c=float(c),
        objective=objective, sink_position=None, logit_margin=float(logits.min()),
        shift_range=(float(shift.min()), float(shift.max())), key="flag",
        counterfactual_id=cf_id)
    return PlantedModel(planted.eval(), base.eval(), tokenizer, truth)
