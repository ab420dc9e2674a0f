"""Every family the bridge loads: exact decompositions, bf16 and float64 rewards (issue 39).

For each sequence classifier in ``REWARD_ADAPTERS`` and each custom head (``HEAD_BRIDGES`` and
LM-head rows), a tiny seeded model of that family on the bridge. References: HF's own forward
(the custom heads: their module's own), on each unpadded row, for the reward; and the
identities that define each decomposition: DRA's components sum to the reward at every level,
each head's source positions to the head, each MLP's neurons to the MLP, and each block's
attention and MLP to the lens's step over that block (residuals read at the frozen final
scale); the lens's last layer is the reward; direct-path patching at a frozen scale is the DRA
difference. Float32 tolerances: :func:`~helpers.parity_atol` of each quantity. A family that
cannot be split (a mixture-of-experts MLP into neurons) refuses by name.

Runs under TransformerLens 3.9 and 4.3 (no HookedTransformer needed but for the one test marked
``needs_hooked_transformer``).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.helpers import CONVERSATIONS, hf_rewards, needs_hooked_transformer, parity_atol
from tests.model.test_bridge_heads import HEADS, _hf_reference
from tl_reward.data import PreferencePair
from tl_reward.errors import TLRewardError
from tl_reward.model.bridge_reward_model import HEAD_BRIDGES, BridgeRewardModel
from tl_reward.testing import PRM_ARCHITECTURES, tiny_hf_reward_model
from tl_reward.tl_backend.bridge import REWARD_ADAPTERS

#: tiny model -> HF class: one of each in REWARD_ADAPTERS (StableLM both ways)
FAMILIES = {
    "llama": "LlamaForSequenceClassification", "mistral": "MistralForSequenceClassification",
    "qwen2": "Qwen2ForSequenceClassification", "qwen3": "Qwen3ForSequenceClassification",
    "gemma2": "Gemma2ForSequenceClassification", "gpt2": "GPT2ForSequenceClassification",
    "mixtral": "MixtralForSequenceClassification", "olmo2": "Olmo2ForSequenceClassification",
    "phi3": "Phi3ForSequenceClassification", "qwen3moe": "Qwen3MoeForSequenceClassification",
    "stablelm": "StableLmForSequenceClassification",
    "stablelm_parallel": "StableLmForSequenceClassification"}
MOE = ("mixtral", "qwen3moe")
PAIR = PreferencePair.from_prompt("Is the sky blue?", "Yes, the sky is blue.", "No, it is red.")


def _load(arch: str, dtype: torch.dtype = torch.float32) -> tuple[BridgeRewardModel, Any]:
    """The bridge of the tiny ``arch`` model and a fresh HF copy (the bridge puts its
    components into the module it wraps)."""
    k, rows = HEADS.get(arch, (1, None))
    hf, tok = tiny_hf_reward_model(arch, num_labels=k)
    model = BridgeRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, dtype=dtype,
                                              lm_head_rows=rows)
    return model, tiny_hf_reward_model(arch, num_labels=k)[0]


def _hf_objectives(model: BridgeRewardModel, hf: Any, arch: str, items: list[Any]
                   ) -> torch.Tensor:
    """``[N, n_obj]``: HF's forward on each unpadded row, the objectives in the analyses'
    default order (a gating head's score first)."""
    out = []
    for item in items:
        ids = model.encode(item).ids
        if arch in HEADS:
            ref = _hf_reference(hf, ids, HEADS[arch][1])
            score = [ref["score"][None]] if "gating" in ref else []
            out.append(torch.cat([*score, ref["reward"]]))
        else:
            t = torch.tensor([ids])
            out.append(hf_rewards(hf, t, torch.ones_like(t))["reward"][0].double())
    return torch.stack(out)


def _close(got: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    assert float(ref.abs().max()) > 1e-3, what  # not vacuous
    torch.testing.assert_close(got.double(), ref.double(), atol=parity_atol(ref, 3), rtol=0,
                               msg=what)


def test_every_family_and_custom_head_is_covered() -> None:
    """A new reward adapter or custom head fails here until it has a tiny model below."""
    assert set(FAMILIES.values()) == set(REWARD_ADAPTERS)
    for arch, name in FAMILIES.items():
        assert type(tiny_hf_reward_model(arch)[0]).__name__ == name
    customs = {type(tiny_hf_reward_model(a, num_labels=HEADS[a][0])[0]).__name__
               for a in HEADS if HEADS[a][1] is None}
    # the process RMs' heads are read at step tags, not conversations: tests/process covers them
    customs |= {type(tiny_hf_reward_model(a, num_labels=2)[0]).__name__
                for a in PRM_ARCHITECTURES}
    assert customs == set(HEAD_BRIDGES)
    assert any(rows for _, rows in HEADS.values())  # and a causal LM's LM-head rows


@pytest.mark.parametrize("arch", [*FAMILIES, *sorted(HEADS)])
def test_decompositions_are_exact(arch: str) -> None:
    """DRA, the reward lens and direct-path patching add up to HF's reward (module
    docstring); for OLMo-2, whose norms follow each sublayer, the heads and neurons are read
    at the post-norms' frozen scale (before the fix the components summed to -1.20 for a
    reward of -0.84)."""
    from tl_reward.analysis.attribution import differential_attribution, direct_reward_attribution
    from tl_reward.analysis.components import merge_embed
    from tl_reward.analysis.direct_path import direct_path_patching
    from tl_reward.analysis.lens import reward_lens

    model, hf = _load(arch)
    ref = _hf_objectives(model, hf, arch, CONVERSATIONS)
    neurons = arch not in MOE
    d = direct_reward_attribution(model, CONVERSATIONS, neurons=neurons, per_position=True)
    _close(d.reward, ref, "reward")
    _close(d.total(), ref, "total")
    for level in ("sublayer", "head", *(("neuron",) if neurons else ())):
        _close(d.components(level)[0].sum(1) + d.bias, ref, f"{level} components")
    for i, per_pos in enumerate(d.head_positions):
        _close(per_pos.sum(-2), d.heads[i], f"row {i}: source positions")
    if neurons:
        _close(d.neurons.sum(2) + d.mlp_bias, d.mlp, "neurons")
    lens = reward_lens(model, CONVERSATIONS)
    for convention in ("frozen", "recompute"):
        _close(lens.values[convention][:, -1], ref, f"lens {convention}")
    frozen = lens.values["frozen"]
    _close(frozen[:, 0], d.embed.sum(1) + d.bias, "lens: embeddings")
    _close(frozen.diff(dim=1), d.attn + d.mlp, "lens: each block's attention and MLP")
    dp = direct_path_patching(model, PAIR, level="head", scale="frozen")
    clean = _hf_objectives(model, hf, arch, [PAIR.chosen_conversation(),
                                             PAIR.rejected_conversation()])[:, 0]
    _close(torch.tensor([dp.clean_chosen, dp.clean_rejected]), clean, "direct path: clean")
    pa = differential_attribution(model, [PAIR])
    diff, names = pa.difference("head")
    diff, names = merge_embed(diff[0], names, len(pa.chosen.embed_names))  # as direct path
    assert dp.names == names
    _close(dp.effect * (dp.clean_chosen - dp.clean_rejected), diff[:, 0],
           "direct path: the DRA difference")


def test_post_norms_name_hf_norms_after_each_sublayer() -> None:
    """``post_norms`` names the bridge's wrappers of HF's norms after attention and after the
    MLP: OLMo-2's (its ``ln1``/``ln2`` under TransformerLens 3.9, ``ln1_post``/``ln2_post``
    under 4.3) and Gemma-2's sandwich ones; a pre-norm model has none. OLMo-2's value bias
    reads no norm before attention (it has none)."""
    for arch, names in [("olmo2", ("post_attention_layernorm", "post_feedforward_layernorm")),
                        ("gemma2", ("post_attention_layernorm", "post_feedforward_layernorm"))]:
        model, _ = _load(arch)
        assert model.post_norms is not None, arch
        for layer in range(model.cfg.n_layers):
            hf_layer = model.original_model.model.layers[layer]
            for ours, theirs in zip(model.post_norms, names, strict=True):
                norm = getattr(model.blocks[layer], ours)  # HF's module, or the bridge's in
                assert getattr(hf_layer, theirs) in (norm, norm.original_component), ours
                assert type(norm.original_component).__name__.endswith("RMSNorm"), ours
    for arch in ("llama", "gpt2", "phi3", "stablelm_parallel", "mixtral"):
        assert _load(arch)[0].post_norms is None, arch
    model, _ = _load("olmo2")
    assert float(model.value_bias(0).abs().max()) == 0.0  # no bias, no norm before attention


@pytest.mark.parametrize("arch", MOE)
def test_mixture_of_experts_refuses_a_neuron_split(arch: str) -> None:
    """A mixture-of-experts MLP has no one set of neurons: DRA's and activation patching's
    neuron splits refuse, naming the family; attribution patching reports no neuron sites."""
    from tl_reward.analysis.attribution import direct_reward_attribution
    from tl_reward.analysis.attribution_patching import attribution_patching
    from tl_reward.analysis.patching import activation_patching

    model, _ = _load(arch)
    name = FAMILIES[arch]
    with pytest.raises(TLRewardError, match=rf"neurons=True.*{name}'s MLP is a mixture"):
        direct_reward_attribution(model, CONVERSATIONS[:1], neurons=True)
    with pytest.raises(TLRewardError, match=rf"neuron sites.*{name}"):
        activation_patching(model, PAIR, "neuron", "zero", positions="all")
    ap = attribution_patching(model, PAIR)
    assert ap.neuron["denoising"].shape == (model.cfg.n_layers, 0)


@pytest.mark.parametrize("arch", FAMILIES)
def test_bf16_rewards_within_hf_bf16_error(arch: str) -> None:
    """In bfloat16 the bridge is off HF's float32 reward by no more than HF's own bfloat16
    forward is (twice that, plus one bf16 rounding of the reward). OLMo-2 failed before the
    fix: TransformerLens's attention met float32 rotated queries with bf16 values."""
    model, hf32 = _load(arch, torch.bfloat16)
    ref32 = _hf_objectives(model, hf32, arch, CONVERSATIONS)
    ref16 = _hf_objectives(model, hf32.to(torch.bfloat16), arch, CONVERSATIONS).float()
    got = model.rewards(CONVERSATIONS).rewards
    hf_err = float((ref16 - ref32).abs().max())
    tol = 2 * hf_err + torch.finfo(torch.bfloat16).eps * max(1.0, float(ref32.abs().max()))
    assert float((got - ref32).abs().max()) <= tol, (got, ref32, hf_err)


def _attention64(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, scaling: float | None = None,
                 dropout: float = 0.0, softcap: float | None = None, **kwargs: Any
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's eager attention, by hand, without its float32 softmax: everything in the inputs'
    dtype (causal, with a sliding window and Gemma-2's soft cap where given)."""
    n_rep = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(n_rep, 1), value.repeat_interleave(n_rep, 1)
    w = query @ key.transpose(2, 3) * (query.shape[-1] ** -0.5 if scaling is None else scaling)
    if softcap is not None:
        w = torch.tanh(w / softcap) * softcap
    q_len, k_len = w.shape[-2:]
    q, k = torch.arange(k_len - q_len, k_len)[:, None], torch.arange(k_len)[None]
    allowed = k <= q
    if kwargs.get("sliding_window"):
        allowed &= q - k < kwargs["sliding_window"]
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        allowed = allowed & attention_mask[..., :k_len]
    elif attention_mask is not None:
        w = w + attention_mask[..., :k_len]
    w = torch.softmax(w.masked_fill(~allowed, float("-inf")), dim=-1)
    return (w @ value).transpose(1, 2).contiguous(), w


def _hf_float64(arch: str) -> Any:
    """The tiny ``arch`` model in float64 throughout: weights, attention (:func:`_attention64`)
    and experts (HF's grouped matmul has no float64 kernel). HF's rotary still computes its
    angles in float32, as it does in every float64 HF model."""
    from transformers import AttentionInterface

    AttentionInterface.register("tl_reward_float64", _attention64)
    hf = tiny_hf_reward_model(arch)[0].double()
    hf.set_attn_implementation("tl_reward_float64")
    if hasattr(hf.config, "_experts_implementation"):
        hf.set_experts_implementation("eager")
    return hf


def _float64_error(model: Any, hf: Any) -> float:
    """Largest ``|reward - HF's|`` over the rows (unpadded, HF's), relative to the reward."""
    ref = _hf_objectives(model, hf, "", CONVERSATIONS)
    got = model.rewards(CONVERSATIONS).rewards
    assert got.dtype == torch.float64
    return float((got - ref).abs().max()) / max(1.0, float(ref.abs().max()))


@pytest.mark.parametrize("arch", FAMILIES)
def test_float64_rewards_equal_hf_float64(arch: str) -> None:
    """A float64 bridge model's rewards equal HF's float64 forward to 1e-12 relative (a float32
    step anywhere leaves about 1e-8: TransformerLens's attention bridge took its softmax in
    float32: 4.9e-8 relative on the tiny Llama, 2.3e-7 on the demo RM)."""
    hf = tiny_hf_reward_model(arch)[0]
    if hasattr(hf.config, "_experts_implementation"):
        hf.set_experts_implementation("eager")
    model = BridgeRewardModel.from_pretrained(hf_model=hf, tokenizer=tiny_hf_reward_model(
        arch)[1], dtype=torch.float64)
    assert _float64_error(model, _hf_float64(arch)) < 1e-12


@needs_hooked_transformer
def test_hooked_float64_rewards_equal_hf_float64() -> None:
    """HookedRewardModel in float64 from a float32 HF model: TransformerLens processed the
    weights in float32 (folded gains, centred writing weights), 9.7e-8 relative off before.
    GPT-2 (no rotary): HookedTransformer computes rotary angles in float64, HF in float32, so
    the rotary families stay about 1e-7 apart (docs/bridge.md)."""
    from tl_reward import HookedRewardModel

    hf, tok = tiny_hf_reward_model("gpt2")
    model = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu",
                                              dtype=torch.float64)
    assert _float64_error(model, _hf_float64("gpt2")) < 1e-12
