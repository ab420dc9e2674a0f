"""Loading HF reward models into ``HookedRewardModel``: by name, from disk, or in memory.

A local directory or an in-memory model is never fetched over the network; only a hub name
is (and only when a hub is reachable).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tl_reward import tl_backend
from tl_reward.architectures import architecture_of, get_architecture
from tl_reward.architectures.lm_head import (
    causal_lm_architecture,
    lm_head_rows_layer,
    row_objectives,
    sequence_classification_name,
)
from tl_reward.errors import TLRewardError, TokenizerMismatchError
from tl_reward.model.demo import (
    JUDGE_MODEL_NAME,
    PRM_HEAD_WEIGHTS,
    PRM_MODEL_NAME,
    PRM_TAG,
    demo_hf_reward_model,
    demo_prm_hf_model,
    load_smollm2,
    multi_hf_reward_model,
)
from tl_reward.model.heads import LinearRewardHead, objective_names_of
from tl_reward.model.pooling import check_rule

if TYPE_CHECKING:
    from tl_reward.model.hooked_reward_model import HookedRewardModel

BuiltinLoader = Callable[[torch.dtype], tuple[Any, Any]]


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json",
                   "vocab.txt", "merges.txt", "spiece.model", "sentencepiece.bpe.model")

BUILTIN_MODELS: dict[str, BuiltinLoader] = {
    "tl-reward/smollm2-135m-hh": demo_hf_reward_model,
    "demo": demo_hf_reward_model,
    "tl-reward/smollm2-135m-multi": multi_hf_reward_model,
    PRM_MODEL_NAME: demo_prm_hf_model,
    JUDGE_MODEL_NAME: load_smollm2,  # a causal LM: load it with from_judge (or lm_head_rows)
}

#: The loaders' options of a built-in name that needs any (the demo PRM's step tag and
#: two-class score); an option the caller passes wins.
BUILTIN_OPTIONS: dict[str, dict[str, Any]] = {
    PRM_MODEL_NAME: {"step_tag": PRM_TAG, "head_weights": PRM_HEAD_WEIGHTS},
}


def builtin_options(name: str | None, **given: Any) -> dict[str, Any]:
    """``given`` with each ``None`` filled from ``BUILTIN_OPTIONS[name]`` (a built-in name's
    loader options; the caller's own values win)."""
    options = BUILTIN_OPTIONS.get(name or "", {})
    return {k: options.get(k) if v is None else v for k, v in given.items()}


def reward_auto_class(config: Any, lm_head_rows: Sequence[int] | None = None,
                      name_or_path: str = "", trust_remote_code: bool = False) -> Any:
    """The transformers Auto class a reward checkpoint loads with: ``AutoModelForCausalLM``
    for ``lm_head_rows``; ``AutoModel`` where the config's ``auto_map`` names the checkpoint's
    own class under ``AutoModel`` and has no ``AutoModelForSequenceClassification`` entry
    (Qwen2.5-Math-PRM's custom code; ``AutoModelForSequenceClassification`` refuses its config
    class); else ``AutoModelForSequenceClassification``. A class the ``auto_map`` ships as
    custom code needs ``trust_remote_code=True`` (a clear error here: without it transformers
    would quietly build its own class, a PRM's body without the head)."""
    import transformers

    auto_map = getattr(config, "auto_map", None) or {}
    names = list(getattr(config, "architectures", None) or [])
    own = str(auto_map.get("AutoModel", "")).rsplit(".", 1)[-1]
    if lm_head_rows is not None:
        auto = transformers.AutoModelForCausalLM
    elif "AutoModelForSequenceClassification" not in auto_map and names and own == names[0]:
        auto = transformers.AutoModel
    else:
        auto = transformers.AutoModelForSequenceClassification
    if auto.__name__ in auto_map and not trust_remote_code:
        raise TLRewardError(
            f"{name_or_path or 'this checkpoint'} ships custom modeling code "
            f"({names[0] if names else auto_map[auto.__name__]}); pass trust_remote_code=True "
            "if you trust it")
    return auto


def load_hf_reward_model(
    name_or_path: str, dtype: torch.dtype = torch.float32, trust_remote_code: bool = False,
    lm_head_rows: Sequence[int] | None = None, **hf_kwargs: Any,
) -> Any:
    """The HF reward model behind a hub name or local directory (architecture checked first);
    with ``lm_head_rows`` a causal LM whose LM-head rows are the reward."""
    from transformers import AutoConfig

    looks_local = name_or_path.startswith((".", "/", "~")) or Path(name_or_path).exists()
    if looks_local and not Path(name_or_path).expanduser().is_dir():
        raise TLRewardError(f"no model directory at {name_or_path!r}")
    try:
        config = AutoConfig.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    except OSError as exc:
        raise TLRewardError(
            f"could not load the config of {name_or_path!r} ({exc}). For a hub model the hub must "
            "be reachable; otherwise pass a local directory saved with save_pretrained, or "
            f"hf_model=. Built-in names: {sorted(BUILTIN_MODELS)}"
        ) from exc
    names = list(getattr(config, "architectures", None) or [])
    if not names:
        raise TLRewardError(
            f"{name_or_path}'s config names no architecture; load the model yourself and pass "
            "hf_model="
        )
    if lm_head_rows is not None:
        seq = sequence_classification_name(names[0])
        if seq is None:
            raise TLRewardError(f"lm_head_rows= needs a causal LM checkpoint; {name_or_path} "
                                f"is a {names[0]}")
        arch = get_architecture(seq)
    else:
        arch = get_architecture(names[0])
    auto_cls = reward_auto_class(config, lm_head_rows, name_or_path, trust_remote_code)
    kwargs = {**arch.hf_load_kwargs, **hf_kwargs}
    return auto_cls.from_pretrained(
        name_or_path, dtype=dtype, trust_remote_code=trust_remote_code, **kwargs
    )


_BODY_LAYER = re.compile(r"^(?:model\.layers|transformer\.h|model\.model\.layers)\.(\d+)\.")


def layer_releaser(hf_model: Any) -> Callable[[int], None]:
    """``release(i)`` empties the parameters of the HF body's layer ``i`` (for a model the
    loader owns: it is unusable afterwards, and host memory holds one copy of each block)."""
    by_layer: dict[int, list[torch.nn.Parameter]] = {}
    for name, p in hf_model.named_parameters():
        m = _BODY_LAYER.match(name)
        if m:
            by_layer.setdefault(int(m.group(1)), []).append(p)

    def release(layer: int) -> None:
        for p in by_layer.pop(layer, []):
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)

    return release


def from_hf_model(
    cls: type[HookedRewardModel],
    hf_model: Any,
    tokenizer: Any,
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    pooling: str | None = None,
    objective_names: Sequence[str] | None = None,
    n_ctx: int | None = None,
    model_name: str | None = None,
    lm_head_rows: Sequence[int] | None = None,
    release_hf: bool = False,
    step_tag: str | None = None,
    head_weights: Sequence[float] | None = None,
) -> HookedRewardModel:
    """Convert an in-memory HF reward model (registered architecture) to ``cls``; with
    ``lm_head_rows`` a causal LM whose LM-head rows become ``W_U``.

    Conversion streams block by block: each block is converted and processed on the CPU, loaded,
    moved to ``device`` and (``release_hf=True``, for an HF model the loader owns) its HF
    weights are freed, so host memory holds the checkpoint plus one block in float32 beside the
    model (nothing of the converted model when ``device`` is a GPU)."""
    hf_config = hf_model.config
    if lm_head_rows is not None:
        arch = causal_lm_architecture(hf_model)
        head_layer = lm_head_rows_layer(hf_model, lm_head_rows)
        objective_names = objective_names or row_objectives(lm_head_rows)
    else:
        arch = architecture_of(hf_model)
        head_layer = arch.head(hf_model)
    k = int(head_layer.weight.shape[0])
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    fields = arch.config(hf_config)
    if n_ctx is not None:
        fields["n_ctx"] = n_ctx
    fields.update(
        d_vocab_out=k,
        original_architecture=arch.hf_class,
        model_name=model_name or str(getattr(hf_config, "name_or_path", "") or arch.hf_class),
        dtype=dtype,
        device=str(device),
    )
    cfg = tl_backend.make_config(**fields)
    if tokenizer is not None and len(tokenizer) > cfg.d_vocab:
        raise TokenizerMismatchError(
            f"the tokenizer has {len(tokenizer)} tokens but the model's embedding has "
            f"{cfg.d_vocab} rows; this tokenizer does not belong to this model (load the one "
            "saved with it)")
    with torch.no_grad():
        state_dict = tl_backend.convert_state_dict(arch.convert, hf_model, head_layer,
                                                   tl_backend.cpu_config(cfg))
        gain = state_dict["ln_final.w"].detach().float().clone()
    objectives = objective_names_of(hf_config, k, objective_names or arch.objective_names)
    pad = getattr(hf_config, "pad_token_id", None)
    if pad is None and tokenizer is not None:
        pad = tokenizer.pad_token_id
    model = cls(cfg, tokenizer, move_to_device=False, pooling=check_rule(pooling or arch.pooling),
                pad_token_id=pad)
    tl_backend.process_weights(model, state_dict,
                               release=layer_releaser(hf_model) if release_hf else None,
                               device=cfg.device)
    del state_dict
    head = (
        arch.reward_head(hf_model, gain, objectives)
        if arch.reward_head is not None
        else LinearRewardHead(objectives)
    )
    model.reward_head = head.to(dtype)
    model.suffix_ids = arch.suffix(hf_config)
    if head.nonlinear:  # no fixed direction exists: make any use of W_U fail loudly
        with torch.no_grad():
            model.unembed.W_U.fill_(float("nan"))
            model.unembed.b_U.fill_(float("nan"))
    model.setup()
    model.move_model_modules_to_device()
    model.reward_head.to(cfg.device)
    model.use_steps(step_tag or arch.step_tag, head_weights)
    model.eval()
    return model


def _find_tokenizer(source: str, trust_remote_code: bool) -> Any:
    """The tokenizer saved at ``source``, or ``None`` (with a warning) when there is none, as in
    the checkpoints most training scripts save (config and weights only)."""
    from transformers import AutoTokenizer

    path = Path(source).expanduser()
    why = None
    if path.is_dir() and not any((path / f).exists() for f in TOKENIZER_FILES):
        why = f"{source} has no tokenizer files"
    else:
        try:
            return AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
        except (OSError, ValueError) as exc:
            why = f"the tokenizer of {source!r} could not be loaded ({str(exc).strip()[:200]})"
    warnings.warn(
        f"{why}; the model is loaded without a tokenizer and scores token ids only. For text "
        "or conversations pass tokenizer=AutoTokenizer.from_pretrained(<the base model>)",
        stacklevel=4,
    )
    return None


def load_reward_model(
    cls: type[HookedRewardModel],
    name_or_path: str | None,
    hf_model: Any = None,
    tokenizer: Any = None,
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    pooling: str | None = None,
    objective_names: Sequence[str] | None = None,
    n_ctx: int | None = None,
    trust_remote_code: bool = False,
    lm_head_rows: Sequence[int] | None = None,
    step_tag: str | None = None,
    head_weights: Sequence[float] | None = None,
    **hf_kwargs: Any,
) -> HookedRewardModel:
    """Resolve ``name_or_path``/``hf_model``/``tokenizer`` and convert (see ``from_pretrained``)."""
    owned = hf_model is None  # loaded here: its weights may be freed as they convert
    if hf_model is None:
        if name_or_path is None:
            raise TLRewardError("pass a model name or path, or hf_model=")
        if name_or_path in BUILTIN_MODELS:
            hf_model, builtin_tok = BUILTIN_MODELS[name_or_path](dtype)
            tokenizer = tokenizer or builtin_tok
            options = builtin_options(name_or_path, step_tag=step_tag, head_weights=head_weights)
            step_tag, head_weights = options["step_tag"], options["head_weights"]
        else:
            hf_model = load_hf_reward_model(name_or_path, dtype, trust_remote_code,
                                            lm_head_rows, **hf_kwargs)
    if tokenizer is None:
        source = name_or_path or getattr(hf_model, "name_or_path", None)
        if not source or not (Path(source).exists() or name_or_path):
            raise TLRewardError(
                "no tokenizer given and none can be found for an in-memory model; pass "
                "tokenizer="
            )
        tokenizer = _find_tokenizer(source, trust_remote_code)
    hf_model.eval()
    return from_hf_model(cls, hf_model, tokenizer, device=device, dtype=dtype, pooling=pooling,
                         objective_names=objective_names, n_ctx=n_ctx,
                         model_name=name_or_path, lm_head_rows=lm_head_rows,
                         release_hf=owned, step_tag=step_tag, head_weights=head_weights)
