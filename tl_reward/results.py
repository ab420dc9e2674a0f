"""Results that print short: what they are, their shapes and their headline numbers.

A result dataclass inherits :class:`ShortRepr` and is declared ``@dataclass(repr=False)`` (a
dataclass would otherwise write its own ``__repr__``, which prints every tensor whole).

Every result saves and loads the same way: ``result.save(path)``, ``RewardLens.load(path)``
or :func:`load_result` (any type). The file is a zip: ``result.json`` (the type, the library
version and the fields, nested results and dataclasses included) beside the tensors
(``tensors.pt``, read back with ``weights_only=True``), arrays (``arrays.npz``, no pickle) and
dataframes (one parquet file each), so every dtype and shape comes back as saved. A file may
name only a registered result type (every :class:`ShortRepr` subclass, and the dataclasses
nested in results, marked :func:`result_type`); nothing is imported because a file names it,
and a file that cannot be read raises :class:`~tl_reward.errors.ResultFileError`. So does a
file whose tensors or arrays hold any other pickled object (:func:`load_tensors`,
:func:`load_arrays`: the one place saved tensors and arrays are read): it may have been tampered
with, and the error never advises loading it unsafely.

Example:
    >>> lens
    RewardLens
      rewards: Tensor[2, 5, 1] float32, range [-1.26, 0.4107]
      layer_names: list[5]: 'embed', 'L0', 'L1', ...
    >>> lens.save("lens.tlr"); RewardLens.load("lens.tlr")
"""

from __future__ import annotations

import dataclasses
import importlib
import io
import json
import zipfile
from pathlib import Path
from typing import Any, TypeVar

from tl_reward import __version__
from tl_reward.errors import ResultFileError, TLRewardError
from tl_reward.store import atomic_write

R = TypeVar("R", bound="ShortRepr")
T = TypeVar("T", bound=type)
FORMAT = "tl_reward.result/1"

#: ``module:qualname`` -> class of every result type defined so far (they register themselves).
_TYPES: dict[str, type] = {}
#: The modules that define result types: what :func:`load_result` may import (this list, never a
#: name read from a file) to find a type not defined yet.
RESULT_MODULES = (
    "tl_reward.analysis.attribution", "tl_reward.analysis.attribution_patching",
    "tl_reward.analysis.components", "tl_reward.analysis.direct_path",
    "tl_reward.analysis.faithfulness", "tl_reward.analysis.lens", "tl_reward.analysis.patching",
    "tl_reward.analysis.tuned_lens", "tl_reward.audit.cascade", "tl_reward.audit.concepts",
    "tl_reward.audit.conflict", "tl_reward.audit.covariance", "tl_reward.audit.distortion",
    "tl_reward.audit.divergence", "tl_reward.audit.probes", "tl_reward.circuits.circuit",
    "tl_reward.circuits.edges", "tl_reward.circuits.graph", "tl_reward.compare.behaviour",
    "tl_reward.compare.layers", "tl_reward.compare.similarity", "tl_reward.compat.published",
    "tl_reward.data.preference", "tl_reward.irm.agreement", "tl_reward.irm.implicit",
    "tl_reward.irm.sweep", "tl_reward.model.readout", "tl_reward.model.response_template",
    "tl_reward.model.scoring", "tl_reward.model.step_rewards", "tl_reward.model.steps",
    "tl_reward.process.compare", "tl_reward.process.knockout", "tl_reward.process.propagation",
    "tl_reward.process.sources", "tl_reward.rl.gain", "tl_reward.rl.goodhart",
    "tl_reward.rl.implicit", "tl_reward.rl.text", "tl_reward.sae.ablation",
    "tl_reward.sae.attribution", "tl_reward.sae.features", "tl_reward.sae.fit",
    "tl_reward.sae.training",
    "tl_reward.stats.agreement", "tl_reward.stats.estimate", "tl_reward.stats.regression",
    "tl_reward.sweep.agreement",
    "tl_reward.sweep.distribution", "tl_reward.sweep.extremes", "tl_reward.sweep.framing",
    "tl_reward.sweep.frequency", "tl_reward.sweep.identity", "tl_reward.sweep.roundtrip",
    "tl_reward.sweep.store", "tl_reward.sweep.valence", "tl_reward.sweep.vocab_sweep",
)
#: Files that are not zips: their first bytes -> the result type that reads them (``from_file``).
_OTHER_FILES = {b"PAR1": "tl_reward.sweep.vocab_sweep:VocabSweep",  # a sweep's parquet file
                b"{": "tl_reward.analysis.faithfulness:FaithfulnessReport"}  # the old JSON


#: The fix a tampered result file's error gives.
RECREATE = ("do not load it; recreate it by rerunning the analysis that saved it, or get it "
            "again from a source you trust")


def _tampered(where: str, what: str, fix: str) -> ResultFileError:
    return ResultFileError(f"{where} holds objects other than {what} (pickled code or objects "
                           f"that a safe load refuses), so it may have been tampered with; {fix}")


def load_tensors(data: bytes, where: str, fix: str = RECREATE) -> Any:
    """What ``torch.save`` wrote to ``data``, read with ``weights_only=True`` (tensors and plain
    containers only, nothing is run); a :class:`ResultFileError` naming ``where`` (and giving
    ``fix``) when it holds any other pickled object."""
    import pickle

    import torch

    try:
        return torch.load(io.BytesIO(data), weights_only=True)
    except pickle.UnpicklingError:  # torch's own message advises weights_only=False: never
        raise _tampered(where, "tensors", fix) from None


def load_arrays(data: bytes | Path, where: str, fix: str = RECREATE) -> dict[str, Any]:
    """The arrays of an ``np.savez`` file (bytes or a path), read with ``allow_pickle=False``;
    a :class:`ResultFileError` naming ``where`` (and giving ``fix``) when it holds pickled
    objects."""
    import numpy as np

    try:
        with np.load(io.BytesIO(data) if isinstance(data, bytes) else data,
                     allow_pickle=False) as a:
            return {k: a[k] for k in a.files}
    except ValueError as e:  # numpy's message names allow_pickle: never advise it
        if "pickle" in str(e):
            raise _tampered(where, "plain arrays", fix) from None
        raise


def result_type(cls: T) -> T:
    """Register ``cls`` as a type a result file may name (a dataclass nested in results;
    :class:`ShortRepr` subclasses register themselves)."""
    _TYPES[_name(cls)] = cls
    return cls

_WIDTH = 60


def _num(x: Any) -> str:
    return f"{x:.4g}" if isinstance(x, float) else repr(x)


def _array(kind: str, shape: tuple[int, ...], dtype: str, values: Any) -> str:
    """``Tensor[2, 3] float32, range [lo, hi]``, or the values themselves when few."""
    flat = values.reshape(-1).tolist()
    if len(flat) <= 6:
        return f"{kind}[{', '.join(map(str, shape))}] {dtype}: [{', '.join(map(_num, flat))}]"
    text = f"{kind}[{', '.join(map(str, shape))}] {dtype}"
    finite = [v for v in flat if isinstance(v, float | int) and v == v]
    if finite and not isinstance(finite[0], bool):
        text += f", range [{_num(min(finite))}, {_num(max(finite))}]"
    return text


def describe(value: Any) -> str:
    """One short line for a field: a shape and range for arrays, a count for containers."""
    import numpy as np
    import pandas as pd
    import torch

    if isinstance(value, torch.Tensor):
        v = value.detach().cpu()
        return _array("Tensor", tuple(v.shape), str(v.dtype).removeprefix("torch."),
                      v.float() if v.is_floating_point() else v)
    if isinstance(value, np.ndarray):
        return _array("ndarray", value.shape, str(value.dtype), value)
    if isinstance(value, pd.DataFrame):
        cols = list(map(str, value.columns))
        more = ", ..." if len(cols) > 6 else ""
        return f"DataFrame[{len(value)} rows x {len(cols)}: {', '.join(cols[:6])}{more}]"
    if isinstance(value, pd.Series):
        return f"Series[{len(value)}]"
    if isinstance(value, list | tuple):
        name = type(value).__name__
        if not value:
            return f"{name}[0]"
        head = ", ".join(describe(x) for x in value[:3])
        text = f"{name}[{len(value)}]: {head}{', ...' if len(value) > 3 else ''}"
        short = f"{name}[{len(value)}]: {describe(value[0])}, ..."
        return text if len(text) <= 2 * _WIDTH else short
    if isinstance(value, dict):
        keys = ", ".join(map(str, list(value)[:5]))
        return f"dict[{len(value)}]: {keys}{', ...' if len(value) > 5 else ''}"
    if isinstance(value, float | int | bool) or value is None:
        return _num(value)
    if isinstance(value, str):
        return repr(value if len(value) <= _WIDTH else value[:_WIDTH] + "...")
    if isinstance(value, ShortRepr):  # a nested result: its first two fields
        inner = [line.strip() for line in repr(value).splitlines()[1:3]]
        return f"{type(value).__name__}({'; '.join(inner)}{'; ...' if inner else ''})"
    text = repr(value)
    return text if len(text) <= _WIDTH and "\n" not in text else type(value).__name__


class ShortRepr:
    """Mixin for result dataclasses: ``repr`` lists each field's shape or value, one a line,
    then :meth:`headline` (the numbers a reader looks for first)."""

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        result_type(cls)

    def headline(self) -> dict[str, Any]:
        """Headline numbers printed after the fields (none unless a result says)."""
        return {}

    def __repr__(self) -> str:
        lines = [type(self).__name__]
        fields = dataclasses.fields(self) if dataclasses.is_dataclass(self) else ()  # type: ignore[arg-type]
        for f in fields:
            if f.repr:
                lines.append(f"  {f.name}: {describe(getattr(self, f.name))}")
        lines += [f"  {k}: {describe(v)}" for k, v in self.headline().items()]
        return "\n".join(lines)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # IPython
        p.text(repr(self))

    def save(self, path: str | Path) -> Path:
        """Write this result to ``path`` (see the module doc); returns the path."""
        return save_result(self, path)

    @classmethod
    def load(cls: type[R], path: str | Path) -> R:
        """Read a result saved by :meth:`save`; a :class:`TLRewardError` if it holds another
        type."""
        out = load_result(path)
        if not isinstance(out, cls):
            raise TLRewardError(f"{path} holds a {_name(type(out))}, not a {_name(cls)}; "
                                "use tl_reward.load_result to read any result")
        return out


class CleanMargin:
    """Mixin for results with ``clean_chosen`` and ``clean_rejected`` objective values."""

    @property
    def delta(self) -> float:
        return self.clean_chosen - self.clean_rejected  # type: ignore[attr-defined]


class PairSides:
    """Mixin for pair results whose ``chosen`` and ``rejected`` sides are results of one type."""

    @property
    def objectives(self) -> list[str]:
        return self.chosen.objectives  # type: ignore[attr-defined]

    @property
    def margin(self) -> Any:
        """``r(chosen) - r(rejected)`` per objective (``[N, n_obj]``)."""
        return self.chosen.reward - self.rejected.reward  # type: ignore[attr-defined]


def _name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _class(name: Any) -> type:
    """The registered result type ``name``; a module of :data:`RESULT_MODULES` is imported
    when it is that type's module and not imported yet."""
    if isinstance(name, str) and name not in _TYPES:
        module = next((m for m in RESULT_MODULES if m == name.partition(":")[0]), None)
        if module is not None:
            importlib.import_module(module)  # a name from the fixed list, not from the file
    if not isinstance(name, str) or name not in _TYPES:
        raise ResultFileError(f"the file names {name!r}, which is not a tl_reward result type "
                              "(only registered result types load; nothing was imported)")
    return _TYPES[name]


def _encode(v: Any, blobs: dict[str, dict[str, Any]]) -> Any:
    """``v`` as JSON, its tensors, arrays and dataframes put in ``blobs`` by kind."""
    import numpy as np
    import pandas as pd
    import torch

    def blob(kind: str, value: Any) -> dict[str, str]:
        key = f"{kind}{sum(map(len, blobs.values()))}"
        blobs[kind][key] = value
        return {f"__{kind}__": key}

    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, torch.Tensor):
        return blob("tensor", v.detach().cpu().contiguous())
    if isinstance(v, np.ndarray | np.generic):
        if np.asarray(v).dtype.hasobject:
            return {"__objects__": _encode(list(np.asarray(v).ravel()), blobs), "shape": v.shape}
        return {**blob("array", np.asarray(v)), "scalar": isinstance(v, np.generic)}
    if isinstance(v, pd.DataFrame | pd.Series):
        return blob("frame", v)
    if isinstance(v, Path):
        return {"__path__": str(v)}
    if isinstance(v, list):
        return [_encode(x, blobs) for x in v]
    if isinstance(v, tuple):
        return {"__tuple__": [_encode(x, blobs) for x in v]}
    if isinstance(v, dict):
        return {"__dict__": [[_encode(k, blobs), _encode(x, blobs)] for k, x in v.items()]}
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {"__dataclass__": _name(type(v)),
                "fields": {f.name: _encode(getattr(v, f.name), blobs)
                           for f in dataclasses.fields(v)}}
    raise TLRewardError(f"cannot save a {type(v).__name__}: results hold tensors, arrays, "
                        "dataframes, dataclasses and plain Python values")


def _decode(v: Any, blobs: dict[str, Any]) -> Any:
    import numpy as np

    if isinstance(v, list):
        return [_decode(x, blobs) for x in v]
    if not isinstance(v, dict):
        return v
    for kind in ("tensor", "frame", "array"):
        if f"__{kind}__" in v:
            if v[f"__{kind}__"] not in blobs:
                raise ResultFileError(f"the {kind} {v[f'__{kind}__']!r} is missing")
            a = blobs[v[f"__{kind}__"]]
            return a[()] if v.get("scalar") else a
    if "__objects__" in v:
        out = np.empty(len(v["__objects__"]), dtype=object)
        for i, x in enumerate(_decode(v["__objects__"], blobs)):
            out[i] = x
        return out.reshape(v["shape"])
    if "__path__" in v:
        return Path(v["__path__"])
    if "__tuple__" in v:
        return tuple(_decode(x, blobs) for x in v["__tuple__"])
    if "__dict__" in v:
        return {_decode(k, blobs): _decode(x, blobs) for k, x in v["__dict__"]}
    cls = _class(v.get("__dataclass__"))
    fields = {k: _decode(x, blobs) for k, x in v["fields"].items()}
    known = {f.name: f.init for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for k in fields.keys() - known.keys():
        raise ResultFileError(f"{_name(cls)} has no field {k!r}")
    try:
        obj = cls(**{k: x for k, x in fields.items() if known[k]})
    except TypeError as e:
        raise ResultFileError(f"{_name(cls)}: {e}") from None
    for k, x in fields.items():
        if not known[k]:
            object.__setattr__(obj, k, x)
    return obj


def save_result(result: Any, path: str | Path) -> Path:
    """Write a result dataclass to ``path`` (a zip, see the module doc)."""
    import numpy as np
    import torch

    blobs: dict[str, dict[str, Any]] = {"tensor": {}, "array": {}, "frame": {}}
    head = {"format": FORMAT, "type": _name(type(result)), "tl_reward_version": __version__,
            "value": _encode(result, blobs)}
    files = {"result.json": json.dumps(head).encode()}
    if blobs["tensor"]:
        torch.save(blobs["tensor"], buf := io.BytesIO())
        files["tensors.pt"] = buf.getvalue()
    if blobs["array"]:
        np.savez(buf := io.BytesIO(), **blobs["array"])
        files["arrays.npz"] = buf.getvalue()
    for key, frame in blobs["frame"].items():
        series = not hasattr(frame, "columns")
        (frame.to_frame() if series else frame).to_parquet(buf := io.BytesIO())
        files[f"{key}.{'series' if series else 'frame'}.parquet"] = buf.getvalue()
    def write(tmp: Path) -> None:
        with zipfile.ZipFile(tmp, "w") as z:
            for name, data in files.items():
                z.writestr(name, data)

    return atomic_write(Path(path), write)  # a reader never sees half a file


def load_result(path: str | Path) -> Any:
    """Read any result saved by ``save`` (its type is recorded in the file and must be a
    registered result type), or a vocabulary sweep's parquet file; a
    :class:`~tl_reward.errors.ResultFileError` names what is wrong with any other file."""
    path = Path(path)
    with open(path, "rb") as f:
        magic = f.read(4)
    try:
        for start, name in _OTHER_FILES.items():
            if magic.startswith(start):
                return _class(name).from_file(path)  # type: ignore[attr-defined]
        return _read_zip(path)
    except ResultFileError as e:
        raise ResultFileError(f"{path}: {e}") from None
    except (zipfile.BadZipFile, KeyError, TypeError, ValueError, AttributeError, IndexError,
            RuntimeError) as e:  # damaged or hand-edited
        raise ResultFileError(f"{path} is malformed ({type(e).__name__}: {e})") from None


def _read_zip(path: Path) -> Any:
    import pandas as pd

    if not zipfile.is_zipfile(path):
        raise ResultFileError("not a saved tl_reward result (not a zip file, or a damaged one)")
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        if "result.json" not in names:
            raise ResultFileError("no result.json: not a saved tl_reward result")
        try:
            head = json.loads(z.read("result.json"))
        except ValueError as e:
            raise ResultFileError(f"result.json is not valid JSON ({e})") from None
        if not isinstance(head, dict) or head.get("format") != FORMAT:
            found = head.get("format") if isinstance(head, dict) else None
            raise ResultFileError(f"format {found!r}, expected {FORMAT!r}")
        blobs: dict[str, Any] = {}
        for member, load in (("tensors.pt", load_tensors), ("arrays.npz", load_arrays)):
            if member in names:
                blobs |= load(z.read(member), f"its member {member!r}")
        for name in names:
            if name.endswith(".parquet"):
                frame = pd.read_parquet(io.BytesIO(z.read(name)))
                key, kind, _ = name.split(".")
                blobs[key] = frame.iloc[:, 0] if kind == "series" else frame
    return _decode(head.get("value"), blobs)
