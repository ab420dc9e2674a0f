"""Save and reload a :class:`PlantedModel`: both HF models, the tokenizer and the truth (JSON).

Layout: ``path/model``, ``path/base`` (``save_pretrained`` folders, the tokenizer in both) and
``path/truth.json`` (``{"type": ..., "fields": ...}``; dicts as ``[key, value]`` lists, tuples as
lists, restored from the dataclass's annotations). Either model folder loads on its own with
``HookedRewardModel.from_pretrained(path / "model")``, except the implicit-reward policy, whose
LM-head bias HF's Llama does not keep: it is rebuilt from ``base`` and the truth's offsets.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from tl_reward.errors import TLRewardError
from tl_reward.planted.implicit import ImplicitTruth, offset_policy
from tl_reward.planted.indirect import IndirectTruth
from tl_reward.planted.objectives import ObjectivesTruth
from tl_reward.planted.prefix import PrefixTruth
from tl_reward.planted.prm import PRMTruth
from tl_reward.planted.trigger import PlantedModel, TriggerTruth

TRUTHS: dict[str, type] = {t.__name__: t for t in (TriggerTruth, ObjectivesTruth, PrefixTruth,
                                                  ImplicitTruth, IndirectTruth, PRMTruth)}


def _plain(x: Any) -> Any:
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: _plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, dict):
        return [[_plain(k), _plain(v)] for k, v in x.items()]
    if isinstance(x, (tuple, list)):
        return [_plain(v) for v in x]
    return x


def _tuples(x: Any) -> Any:
    return tuple(_tuples(v) for v in x) if isinstance(x, list) else x


def truth_to_json(truth: Any) -> str:
    """The truth dataclass as JSON (see the module doc)."""
    return json.dumps({"type": type(truth).__name__, "fields": _plain(truth)})


def truth_from_json(text: str) -> Any:
    """The truth dataclass back from :func:`truth_to_json`."""
    raw = json.loads(text)
    cls = TRUTHS.get(raw["type"])
    if cls is None:
        raise TLRewardError(f"unknown truth type {raw['type']!r}; known: {sorted(TRUTHS)}")
    out = {}
    for f in dataclasses.fields(cls):
        if f.name not in raw["fields"]:
            continue
        v = raw["fields"][f.name]
        kind = str(f.type)
        if kind.startswith("dict"):
            v = {_tuples(k): _tuples(val) for k, val in v}
        elif kind.startswith("Thresholds"):
            from tl_reward.audit.conflict import Thresholds

            v = Thresholds(**v)
        else:
            v = _tuples(v)
        out[f.name] = v
    return cls(**out)


def save_planted(planted: PlantedModel, path: str | Path) -> Path:
    """Write ``planted`` to the folder ``path`` (created)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    for name in ("model", "base"):
        getattr(planted, name).save_pretrained(path / name)
        planted.tokenizer.save_pretrained(path / name)
    (path / "truth.json").write_text(truth_to_json(planted.truth))
    return path


def load_planted(path: str | Path) -> PlantedModel:
    """A :class:`PlantedModel` from a folder written by :func:`save_planted`."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    path = Path(path)
    truth = truth_from_json((path / "truth.json").read_text())
    tok = AutoTokenizer.from_pretrained(path / "model")
    if isinstance(truth, ImplicitTruth):  # the policy's LM-head bias does not survive saving
        base = AutoModelForCausalLM.from_pretrained(path / "base").eval()
        return PlantedModel(offset_policy(base, truth.offsets), base, tok, truth)
    model, base = (AutoModelForSequenceClassification.from_pretrained(path / n).eval()
                   for n in ("model", "base"))
    return PlantedModel(model, base, tok, truth)
