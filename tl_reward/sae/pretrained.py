"""Pretrained SAELens SAEs for a reward model's base model: find them, and attach them right.

* :func:`saes_for` lists the releases of SAELens's shipped registry (``pretrained_saes.yaml``,
  read through SAELens, offline) whose ``model`` is the RM's base model: from :data:`RM_BASES`
  (each listed RM family's published base) or the ``base=`` you name. Names are compared
  normalised (``qwen3-8b`` matches ``Qwen/Qwen3-8B``; ``gpt2`` matches ``gpt2-small``, not
  ``gpt2-medium``); given a loaded model, a base is kept only if its ``d_model`` and
  ``n_layers`` (:data:`BASE_SHAPES`) are the model's.
* :func:`prepare_sae` checks an SAE against the model it is attached to and corrects what it
  safely can, naming the cfg field of every mismatch:

  - ``hook_name`` must be a hook here, ``d_in`` this model's width (``check_sae``); the SAE is
    moved to the model's device and at least its precision.
  - ``normalize_activations="expected_average_only_in"``: SAELens folds the release's
    ``norm_scaling_factor`` into the weights in ``from_pretrained``, but ``load_from_disk``
    does not, and at run time the SAE then encodes unscaled activations (a silently wrong
    reconstruction). Pass ``norm_scaling_factor=`` to fold it (SAELens's
    ``fold_activation_norm_scaling_factor``), else :class:`~tl_reward.errors.SAEError`.
  - ``model_from_pretrained_kwargs``: this library loads with TransformerLens's
    ``fold_ln``, ``center_writing_weights`` and ``fold_value_biases``
    (:data:`tl_reward.tl_backend.weights.PROCESSING`). ``fold_ln`` leaves the residual as it
    is; centring changes it only on LayerNorm models (GPT-2: TransformerLens skips it for
    RMSNorm), where the residual exposed is the HF residual minus its per-token mean, which
    cannot be undone. So on a LayerNorm model an SAE trained with
    ``center_writing_weights=False`` is refused (on a ``BridgeRewardModel``, which exposes
    HF's uncentred residual, one trained with ``True``); ``fold_value_biases=False`` is refused for
    a ``hook_z`` SAE (``hook_z`` here excludes ``b_V``). RMSNorm models (Llama, Qwen, Gemma)
    expose the raw HF residual, which SAEs trained on HF activations (Llama Scope) expect.
  - ``prepend_bos``: a warning when the SAE's BOS convention differs from this model's
    sequences (position 0 is then a token the SAE never saw there).
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from tl_reward import tl_backend
from tl_reward.errors import SAEError, require_sae_lens
from tl_reward.model.inputs import encode
from tl_reward.sae.splice import check_sae
from tl_reward.tl_backend.weights import PROCESSING

RM_BASES: dict[str, tuple[str, ...]] = {
    r"skywork-reward(-v2)?-llama-3\.1-8b": ("meta-llama/Llama-3.1-8B-Instruct",
                                            "meta-llama/Llama-3.1-8B"),
    r"skywork-reward-v2-llama-3\.2-1b": ("meta-llama/Llama-3.2-1B-Instruct",),
    r"skywork-reward-v2-llama-3\.2-3b": ("meta-llama/Llama-3.2-3B-Instruct",),
    r"skywork-reward-v2-qwen3-(?P<size>0\.6b|1\.7b|4b|8b)": ("Qwen/Qwen3-{size}",
                                                               "Qwen/Qwen3-{size}-Base"),
    r"armorm-llama3-8b": ("meta-llama/Meta-Llama-3-8B-Instruct",),
    r"(skywork-reward|qrm)-gemma-2-27b": ("google/gemma-2-27b-it", "google/gemma-2-27b"),
    r"grm-gemma2?-2b": ("google/gemma-2-2b-it", "google/gemma-2-2b"),
    r"gemma-2-9b": ("google/gemma-2-9b-it", "google/gemma-2-9b"),
    r"grm-llama3\.2-3b": ("meta-llama/Llama-3.2-3B-Instruct",),
    r"(?<![a-z])gpt2(?!-(medium|large|xl))": ("gpt2",),
    r"mistral-7b(-instruct)?-v0\.1": ("mistralai/Mistral-7B-v0.1",),
    r"smollm2-135m": ("HuggingFaceTB/SmolLM2-135M-Instruct",),
}
"""RM name pattern (lower case, searched in the hub name) -> the published base models it was
fine-tuned from, nearest first (``{size}`` filled from the match)."""

_ALIASES = {"gpt2": "gpt2-small", "mistral-7b-v0.1": "mistral-7b"}

BASE_SHAPES: dict[str, tuple[int, int]] = {
    "llama-3.1-8b": (4096, 32), "meta-llama-3-8b": (4096, 32), "llama-3.2-1b": (2048, 16),
    "llama-3.2-3b": (3072, 28), "qwen3-0.6b": (1024, 28), "qwen3-1.7b": (2048, 28),
    "qwen3-4b": (2560, 36), "qwen3-8b": (4096, 36), "gemma-2-2b": (2304, 26),
    "gemma-2-9b": (3584, 42), "gemma-2-27b": (4608, 46), "gpt2-small": (768, 12),
    "mistral-7b": (4096, 32), "smollm2-135m": (576, 30),
}
"""``(d_model, n_layers)`` of each base in :data:`RM_BASES` (normalised name, without its
``-instruct`` / ``-it`` / ``-base`` ending: the tuned variants share the shape)."""


def base_shape(name: str) -> tuple[int, int] | None:
    """``(d_model, n_layers)`` of a base model from :data:`BASE_SHAPES` (None when unknown)."""
    return BASE_SHAPES.get(re.sub(r"-(instruct|it|base)$", "", normalise_model_name(name)))


def normalise_model_name(name: str) -> str:
    """``Qwen/Qwen3-8B`` -> ``qwen3-8b``: lower case, no organisation, known aliases."""
    short = name.strip().lower().split("/")[-1]
    return _ALIASES.get(short, short)


def rm_bases(name: str) -> tuple[str, ...]:
    """The base models :data:`RM_BASES` gives for an RM's hub name (empty when unknown)."""
    low = name.lower()
    for pattern, bases in RM_BASES.items():
        m = re.search(pattern, low)
        if m:
            return tuple(b.format(**{k: v.upper() for k, v in m.groupdict().items()})
                         for b in bases)
    return ()


@dataclass
class PretrainedSAEs:
    """:func:`saes_for`'s result: one row per SAE of the matching releases, or a ``reason``."""

    model_name: str
    bases: tuple[str, ...]
    rows: list[dict[str, Any]] = field(default_factory=list)
    reason: str | None = None

    def to_dataframe(self) -> pd.DataFrame:
        """release, sae_id, model, hook_name / layer / width (where the id names them), l0 and
        explained variance (where the registry gives them; SAELens's defaults, l0 0 and 1.0,
        read as not given)."""
        cols = ["release", "sae_id", "model", "hook_name", "layer", "width", "l0",
                "expected_var_explained"]
        return pd.DataFrame(self.rows, columns=cols)

    def __len__(self) -> int:
        return len(self.rows)

    def __repr__(self) -> str:
        rel = sorted({r["release"] for r in self.rows})
        tail = f"{len(self.rows)} SAEs in {len(rel)} releases" if self.rows else self.reason
        return f"PretrainedSAEs({self.model_name!r}, bases={list(self.bases)}: {tail})"


def _parse_id(sae_id: str) -> dict[str, Any]:
    """Hook name, layer and width where the SAE id spells them (None otherwise)."""
    hook = re.search(r"blocks\.\d+\.hook_(resid_pre|resid_mid|resid_post|attn_out|mlp_out|z)"
                     r"(?![a-z])", sae_id)
    layer = re.search(r"(?:layer_|blocks\.|^l|\.l)(\d+)", sae_id)
    width = re.search(r"width_(\d+[km]?)|(\d+[km])\b|(\d+x)\b", sae_id)
    return {"hook_name": hook.group(0) if hook else None,
            "layer": int(layer.group(1)) if layer else None,
            "width": next((g for g in width.groups() if g), None) if width else None}


def _given(values: dict[str, float], sae_id: str) -> float | None:
    """A registry value, None where SAELens filled its default (1.0: not given)."""
    v = values.get(sae_id)
    return None if v is None or v == 1.0 else v


def saes_for(model: Any, base: str | None = None) -> PretrainedSAEs:
    """The SAELens releases whose ``model`` is ``model``'s base (or ``base``): read from the
    registry SAELens ships, no network. ``model``: a reward model or its hub name."""
    require_sae_lens()
    from sae_lens.loading.pretrained_saes_directory import get_pretrained_saes_directory

    name = model if isinstance(model, str) else str(model.cfg.model_name)
    bases = (base,) if base else rm_bases(name)
    if not bases:
        return PretrainedSAEs(name, (), reason=(
            f"no base model known for {name!r}: name it with base='org/model' (RM families "
            f"known: {', '.join(RM_BASES)})"))
    if not isinstance(model, str):
        shape = (model.cfg.d_model, model.cfg.n_layers)
        kept = tuple(b for b in bases if base_shape(b) in (None, shape))
        if not kept:
            return PretrainedSAEs(name, bases, reason=(
                f"the model's d_model {shape[0]} and n_layers {shape[1]} are none of its bases' "
                f"({', '.join(f'{b}: {base_shape(b)}' for b in bases)}): it is another size; "
                "name its base with base='org/model'"))
        bases = kept
    want = {normalise_model_name(b) for b in bases}
    rows = []
    for release, lookup in get_pretrained_saes_directory().items():
        if normalise_model_name(lookup.model) not in want:
            continue
        for sae_id in lookup.saes_map:
            rows.append({"release": release, "sae_id": sae_id, "model": lookup.model,
                         **_parse_id(sae_id), "l0": lookup.expected_l0.get(sae_id) or None,
                         "expected_var_explained": _given(lookup.expected_var_explained, sae_id)})
    reason = None if rows else (f"SAELens's registry has no release for {', '.join(bases)}")
    return PretrainedSAEs(name, tuple(bases), rows, reason)


def residual_is_centred(model: Any) -> bool:
    """Whether this model's residual stream is TransformerLens-centred (LayerNorm models loaded
    with ``center_writing_weights``; RMSNorm models and a bridge keep the HF residual)."""
    return bool(PROCESSING["center_writing_weights"]) and model.cfg.normalization_type in (
        "LN", "LNPre") and not tl_backend.is_bridge(model)


def prepare_sae(model: Any, sae: Any, norm_scaling_factor: float | None = None) -> Any:
    """``sae`` checked against ``model`` and corrected in place where that is exact (see the
    module docstring); raises :class:`SAEError` naming the cfg field of a mismatch."""
    hook = check_sae(model, sae)
    norm = sae.cfg.normalize_activations
    if norm == "expected_average_only_in":
        if norm_scaling_factor is None:
            raise SAEError(
                "the SAE's normalize_activations='expected_average_only_in' needs its "
                "norm_scaling_factor (SAELens's registry lists it per SAE id; from_pretrained "
                "folds it, load_from_disk does not): pass norm_scaling_factor=..."
            )
        sae.fold_activation_norm_scaling_factor(norm_scaling_factor)
    elif norm_scaling_factor is not None:
        raise SAEError(
            f"norm_scaling_factor given, but the SAE's normalize_activations={norm!r} does not "
            "take one (already folded?)"
        )
    kwargs = sae.cfg.metadata.model_from_pretrained_kwargs or {}
    centred, read = residual_is_centred(model), kwargs.get("center_writing_weights")
    layer_norm = model.cfg.normalization_type in ("LN", "LNPre")
    if layer_norm and read is not None and bool(read) != centred and (
        "resid" in hook or hook.endswith(("_out", "hook_embed", "hook_pos_embed"))
    ):
        why = ("the centred one (the per-token mean is removed and cannot be restored)"
               if centred else "HF's uncentred one (a bridge: load the model with "
               "HookedRewardModel.from_pretrained for this SAE)")
        raise SAEError(
            f"the SAE's model_from_pretrained_kwargs has center_writing_weights={read} (it read "
            f"{'a centred' if read else 'an uncentred'} residual) but this LayerNorm model "
            f"exposes {why} at {hook!r}"
        )
    if hook.endswith("hook_z") and kwargs.get("fold_value_biases") is False:
        raise SAEError(
            "the SAE's model_from_pretrained_kwargs has fold_value_biases=False (its hook_z "
            "includes b_V) but this model folds value biases into b_O"
        )
    bos = model.tokenizer.bos_token_id
    ids = encode(model.tokenizer, "hi").ids  # plain text: whether sequences open with BOS
    has_bos = bos is not None and len(ids) > 0 and int(ids[0]) == bos
    want = sae.cfg.metadata.prepend_bos
    if want is not None and bool(want) != has_bos:
        warnings.warn(
            f"the SAE's prepend_bos={want} but this model's sequences "
            f"{'start' if has_bos else 'do not start'} with BOS: position 0 is not what the SAE "
            "saw in training", stacklevel=2)
    return sae


def load_sae(model: Any, path_or_release: str, sae_id: str | None = None,
             norm_scaling_factor: float | None = None) -> Any:
    """An SAE for ``model``: ``SAE.load_from_disk(path)`` or ``SAE.from_pretrained(release,
    sae_id)`` (needs the hub), on the model's device, through :func:`prepare_sae`."""
    require_sae_lens()
    from sae_lens import SAE

    device = str(model.cfg.device)
    if sae_id is None:
        if not (Path(path_or_release) / "cfg.json").is_file():
            raise SAEError(f"{path_or_release} is not a saved SAE folder (no cfg.json there); "
                           "pass SAE.save_model's folder, or a release with its sae_id")
        sae = SAE.load_from_disk(path_or_release, device=device)
    else:
        sae = SAE.from_pretrained(path_or_release, sae_id, device=device)
    return prepare_sae(model, sae, norm_scaling_factor)
