"""Plant an indirect mechanism: a head detects a trigger token, a later MLP turns that into reward.

Three residual coordinates (the last three, ``dims = (write, flag, const)``) are cleared for the
plant in the base: no embedding column, ``o_proj`` row or ``down_proj`` row writes them and no
``q/k/v``, ``gate/up`` or ``score`` column reads them, except that every token's embedding holds
``const = kappa`` and the trigger's holds ``flag = kappa`` instead, its other coordinates copied
from the ``counterfactual`` token (same RMS), so in the base the trigger is that token's
synonym. The base also silences every query head of the planted head's key/value group and the
planted MLP neuron. The planted model then differs from the base in two places only:

* head ``head`` of block ``head_layer``: its query reads ``const``, its key and value read
  ``flag`` (in the slowest rotary pair), so every later position attends to the trigger with
  logit >= ``logit_margin`` (every other key is exactly 0) and copies ``value ~ 1``; the output
  writes ``write_scale`` times the residual RMS *floor* to the ``write`` coordinate: the
  smallest RMS of any later norm's input (from the head's own MLP to the final norm) at the
  trigger or after it, on the calibration sequences;
* neuron ``neuron`` of the last block's MLP: ``silu(g x) * u x`` of the normed ``write``
  coordinate (exactly 0 without it), written along the reward row, scaled so that the median
  shift on the calibration sequences holding the trigger is ``c``.

Without the trigger both write exactly 0 (the planted model equals the base); swapping the
trigger for the counterfactual token changes nothing else. The write coordinate reaches the
reward only through the MLP (its sole reader) but enters every later RMS norm, where it moves the
scale by about ``write_scale ** 2 / (2 d_model)`` at most (relative; value ~ 1): on
SmolLM2-135M patching the head's 465 other outgoing edges moves the reward by < 0.001 of the
shift. (Scaled to the pooled token's final RMS, 334 times the floor there, the write was 33
times the smallest residual RMS it entered and that leak carried 0.11 to 0.40 of the shift.)
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tl_reward.errors import TLRewardError
from tl_reward.model.response_template import Prompt
from tl_reward.planted.calibration import (
    DEFAULT_PROMPTS,
    calibration_sequences,
    layer_inputs,
    rewards,
)
from tl_reward.planted.flag import check_shift, clear_flag, counterfactual_id, wire_flag_head
from tl_reward.planted.surgery import (
    attention,
    check_llama_like,
    check_range,
    head_rows,
    one_token_id,
)
from tl_reward.planted.trigger import PlantedModel


@dataclass(frozen=True)
class IndirectTruth:
    """What the indirect plant guarantees, written before any analysis runs.

    Attributes:
        head: ``(layer, head)`` of the detecting head (hook ``blocks.{layer}.attn.hook_z``).
        kv_head: its key/value head (``head // (n_heads // n_kv_heads)``).
        mlp: the layer of the MLP that turns the detection into reward (the last block).
        neuron: that MLP's planted hidden unit.
        trigger_id, trigger: the trigger token's id and text.
        counterfactual_id: the token the trigger is a synonym of in the base (swap the trigger
            for it: an equal-length counterfactual that differs in the plant only).
        c: the planted shift of reward row ``objective`` (median on calibration sequences).
        objective: the reward row.
        dims: residual coordinates ``(write, flag, const)`` cleared for the plant.
        edges: ``(src, dst, qkv)`` edges that carry the effect of the swap (node names as in
            :mod:`tl_reward.circuits`; key/value destinations named by the key/value head):
            ``input -> a{l}.h{kv}`` (``k``, ``v``), ``a{l}.h{h} -> m{L}`` and ``m{L} -> reward``.
            The query reads ``const``, equal in both, so ``input -> a{l}.h{h}`` (``q``) carries
            nothing.
        logit_margin: the smallest attention logit of the trigger at the pooled token on the
            calibration sequences (every other key is 0).
        shift_range: ``(min, max)`` of the shift over the calibration sequences holding it.
    """

    head: tuple[int, int]
    kv_head: int
    mlp: int
    neuron: int
    trigger_id: int
    trigger: str
    counterfactual_id: int
    c: float
    objective: int
    dims: tuple[int, int, int]
    edges: tuple[tuple[str, str, str], ...]
    logit_margin: float
    shift_range: tuple[float, float]


@torch.no_grad()
def _rms_floor(hf: Any, ids: list[list[int]], where: list[list[int]], layer: int) -> float:
    """The smallest RMS of any norm's input from block ``layer``'s MLP on, at or after each
    sequence's first trigger position."""
    blocks = hf.model.layers
    norms = [blocks[layer].post_attention_layernorm, hf.model.norm, *(
        n for b in blocks[layer + 1:] for n in (b.input_layernorm, b.post_attention_layernorm))]
    got: list[torch.Tensor] = []
    hooks = [n.register_forward_pre_hook(lambda m, i: got.append(i[0][0].double()))
             for n in norms]
    lo = float("inf")
    try:
        for x, p in zip(ids, where, strict=True):
            got.clear()
            hf.model(input_ids=torch.tensor([x]))
            lo = min(lo, *(float(r[min(p):].pow(2).mean(-1).min()) for r in got))
    finally:
        for h in hooks:
            h.remove()
    return lo ** 0.5


def plant_indirect(
    hf: Any, tokenizer: Any, trigger: str | int, counterfactual: str | int | None = None,
    c: float = 4.0, head_layer: int = 0, head: int = 0, neuron: int = 0, objective: int = 0,
    prompts: Sequence[Prompt] = DEFAULT_PROMPTS, logit_margin: float = 30.0,
    write_scale: float = 0.1, gate: float = 4.0, n_random: int = 16,
    vocab_per_prompt: int | None = 16, calibration_steps: int = 4, seed: int = 0,
) -> PlantedModel:
    """Plant ``reward += c`` on ``trigger`` through head ``head`` of block ``head_layer`` and
    one neuron of the last block's MLP (see the module doc).

    Args:
        hf: an HF Llama-style sequence classifier (not modified).
        tokenizer: its tokenizer, with a chat template.
        trigger, counterfactual: one-token strings or ids (default counterfactual: the first
            plain id that is not the trigger).
        c: the reward shift; objective: the reward row.
        head_layer, head: the detecting head (any block: the MLP is the last block's).
        neuron: the MLP's hidden unit to plant.
        prompts, n_random, vocab_per_prompt, seed: calibration sequences (see
            :func:`~tl_reward.planted.calibration.calibration_sequences`).
        logit_margin: the trigger's smallest attention logit (leak ``n * exp(-margin)``).
        write_scale: the head's write, in units of the residual RMS floor (module doc).
        gate: the neuron's gate pre-activation at the median trigger.
        calibration_steps: rescalings of the neuron's write towards a median shift of ``c``.

    Raises:
        TLRewardError: if an argument is out of range, the model is too narrow, or some
            calibration sequence holding the trigger shifts by less than ``c / 4``.
    """
    check_llama_like(hf)
    cfg = hf.config
    n_layers, n_heads, d_model = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.hidden_size
    n_kv = getattr(cfg, "num_key_value_heads", None) or n_heads
    check_range("head_layer", head_layer, -n_layers, n_layers)
    check_range("head", head, 0, n_heads)
    check_range("neuron", neuron, 0, hf.model.layers[-1].mlp.down_proj.in_features)
    check_range("objective", objective, 0, hf.score.out_features)
    if not (c > 0 and logit_margin > 0 and write_scale > 0 and gate > 0):
        raise TLRewardError("c, logit_margin, write_scale and gate must be positive")
    if d_model < 8:
        raise TLRewardError(f"d_model {d_model} < 8: too narrow to clear three coordinates")
    head_layer %= n_layers
    trigger_id = one_token_id(tokenizer, trigger, cfg.vocab_size)
    cf_id = counterfactual_id(tokenizer, trigger_id, counterfactual, cfg.vocab_size)
    dims = [d_model - 3, d_model - 2, d_model - 1]
    write, flag, const = dims
    rep = n_heads // n_kv
    kv, last = head // rep, n_layers - 1
    base = copy.deepcopy(hf)
    clear_flag(base, trigger_id, cf_id, flag, const, extra=(write,))
    attn = attention(base, head_layer)
    with torch.no_grad():
        for h in range(kv * rep, (kv + 1) * rep):  # the group's query heads read our key/value
            attn.o_proj.weight[:, head_rows(base, h)] = 0.0
        base.model.layers[-1].mlp.down_proj.weight[:, neuron] = 0.0
    base.eval()

    seqs = calibration_sequences(tokenizer, trigger_id, cfg.vocab_size, prompts,
                                 n_random=n_random, vocab_per_prompt=vocab_per_prompt, seed=seed)
    with_trigger = [x for x, p in zip(seqs.ids, seqs.trigger_positions, strict=True) if p]
    where = [p for p in seqs.trigger_positions if p]
    normed, scales = layer_inputs(base, with_trigger, head_layer)
    floor = _rms_floor(base, with_trigger, where, head_layer)
    planted = copy.deepcopy(base)
    logits = wire_flag_head(planted, head_layer, head, kv, normed, where, flag, const,
                            logit_margin)
    with torch.no_grad():
        attention(planted, head_layer).o_proj.weight[write, head_rows(planted, head).start] = (
            write_scale * floor)
    mid, _ = layer_inputs(planted, with_trigger, last, norm="post_attention_layernorm")
    x_med = float(torch.stack([x[-1, write] for x in mid]).median())
    mlp = planted.model.layers[-1].mlp
    score_row = hf.score.weight[objective].double() * planted.model.norm.weight.double()
    score_row[dims] = 0.0
    direction = float(scales.median()) * score_row / score_row.dot(score_row)
    with torch.no_grad():
        for proj, g in ((mlp.gate_proj, gate), (mlp.up_proj, 1.0)):
            proj.weight[neuron] = 0.0
            proj.weight[neuron, write] = g / x_med
    base_r = rewards(base, with_trigger, objective)
    scale = c / float(torch.nn.functional.silu(torch.tensor(gate)))
    for _ in range(calibration_steps + 1):  # the final norm bends the shift
        with torch.no_grad():
            mlp.down_proj.weight[:, neuron] = (scale * direction).to(mlp.down_proj.weight.dtype)
        shift = rewards(planted, with_trigger, objective) - base_r
        scale *= c / float(shift.median())
    check_shift(shift, c)
    src = f"a{head_layer}.h"
    edges = (("input", f"{src}{kv}", "k"), ("input", f"{src}{kv}", "v"),
             (f"{src}{head}", f"m{last}", ""), (f"m{last}", "reward", ""))
    truth = IndirectTruth(
        head=(head_layer, head), kv_head=kv, mlp=last, neuron=neuron, trigger_id=trigger_id,
        trigger=tokenizer.decode([trigger_id]), counterfactual_id=cf_id, c=float(c),
        objective=objective, dims=(write, flag, const), edges=edges,
        logit_margin=float(logits.min()), shift_range=(float(shift.min()), float(shift.max())))
    return PlantedModel(planted.eval(), base, tokenizer, truth)
