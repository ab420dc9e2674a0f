"""One run identity and one chunked, resumable store for long jobs.

A :class:`RunIdentity` holds everything that determines a job's results (model fingerprint,
tokenizer and chat template, inputs, the source of each user function, settings, library
version). A :class:`ChunkStore` keeps a job's finished chunks in a folder named by
:meth:`RunIdentity.folder_name`, beside a ``manifest.json`` holding the identity: a rerun reads
the chunks there and computes the rest; reopening it with another identity raises
:class:`StoreMismatchError` naming every differing field. An :class:`EntryCache` is the
content-addressed variant: one file per result, keyed on the whole identity (:func:`entry_key`).

Example:
    >>> ident = RunIdentity.of_model("probes", model).with_job(texts, settings={"seed": 0})
    >>> store = ChunkStore(Path("runs") / ident.folder_name(), ident)
    >>> if not store.has("chunk-0.parquet"): store.save("chunk-0.parquet", df.to_parquet)
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from tl_reward.errors import StoreMismatchError

__all__ = ["ChunkStore", "EntryCache", "Manifest", "RunIdentity", "StoreMismatchError",
           "atomic_write", "check_resume", "digest", "entry_key", "function_digest"]

FORMAT = "tl_reward.store/1"


def _json_default(o: Any) -> Any:
    return o.tolist() if hasattr(o, "tolist") else str(o)  # arrays in full, never abridged


def digest(obj: Any) -> str:
    """SHA-256 (hex) of ``obj``'s canonical JSON (sorted keys; arrays and tensors as lists);
    bytes are hashed as they are."""
    data = obj if isinstance(obj, bytes) else json.dumps(obj, sort_keys=True,
                                                         default=_json_default).encode()
    return hashlib.sha256(data).hexdigest()


def _value(v: Any) -> Any:
    """``v`` as canonical JSON data, by value: sets sorted, tuples and dicts item by item,
    arrays and tensors by dtype, shape and bytes; anything else by its type's name."""
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, list | tuple):
        return [type(v).__name__, [_value(x) for x in v]]
    if isinstance(v, set | frozenset):
        return ["set", sorted((_value(x) for x in v), key=json.dumps)]
    if isinstance(v, dict):
        return ["dict", sorted(([_value(k), _value(x)] for k, x in v.items()), key=json.dumps)]
    if hasattr(v, "dtype") and hasattr(v, "shape") and hasattr(v, "tolist"):  # array, tensor
        import numpy as np

        a = v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v)
        return [type(v).__name__, str(v.dtype), list(a.shape),
                hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()]
    return type(v).__qualname__


def _codes(code: Any) -> Any:
    """``code`` and the code objects nested in it (comprehensions, lambdas, inner functions)."""
    yield code
    for c in code.co_consts:
        if inspect.iscode(c):
            yield from _codes(c)


def _fn_parts(fn: Any, seen: set[int], out: list[Any]) -> None:
    if id(fn) in seen:
        return
    seen.add(id(fn))
    fn = inspect.unwrap(fn)
    if hasattr(fn, "func") and hasattr(fn, "args"):  # functools.partial
        out.append(["partial", [_value(a) for a in (*fn.args, *sorted(fn.keywords.items()))]])
        _fn_parts(fn.func, seen, out)
        return
    code = getattr(fn, "__code__", None)
    if code is None:  # a builtin (its name) or a callable object (its type, state, __call__)
        state = {k: _value(v) for k, v in sorted(getattr(fn, "__dict__", {}).items())}
        out.append(["callable", type(fn).__qualname__, getattr(fn, "__module__", None),
                    getattr(fn, "__qualname__", None), state])
        call = inspect.getattr_static(type(fn), "__call__", None)
        if call is not None and hasattr(call, "__code__"):
            _fn_parts(call, seen, out)
        return
    try:
        body: Any = inspect.getsource(fn)
    except (OSError, TypeError):  # no source (e.g. exec'd): the code object itself
        body = [code.co_code.hex(), repr(code.co_consts), code.co_names]
    out.append([fn.__module__, fn.__qualname__, body, [_value(d) for d in fn.__defaults__ or ()],
                {k: _value(d) for k, d in sorted((fn.__kwdefaults__ or {}).items())}])
    for cell in fn.__closure__ or ():
        try:
            v = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if callable(v) and not isinstance(v, type):
            _fn_parts(v, seen, out)
        else:
            out.append(_value(v))
    glb = getattr(fn, "__globals__", {})
    for name in sorted({n for c in _codes(code) for n in c.co_names if n in glb}):
        g = glb[name]  # the module globals it reads: functions followed, constants by value
        if inspect.isfunction(g):
            if _package(g) == _package(fn):  # others: their library's version covers them
                _fn_parts(g, seen, out)
        elif not (inspect.ismodule(g) or isinstance(g, type) or callable(g)):
            out.append([name, _value(g)])


def _package(fn: Any) -> str:
    return (getattr(fn, "__module__", None) or "").split(".")[0]


def function_digest(fn: Callable[..., Any]) -> str:
    """SHA-256 of what a function computes, as far as its text shows: its source (or, without
    source, its code object), its defaults, its closure and the module globals it (or code nested
    in it) reads by name: functions of its own top-level package followed, constants hashed by
    value (sets, tuples, dicts, arrays and tensors included)."""
    parts: list[Any] = []
    _fn_parts(fn, set(), parts)
    return digest(parts)


class Manifest:
    """A frozen dataclass kept as a store's ``manifest.json``: canonical JSON, and the fields
    in which another one differs (``_UNCHECKED`` fields never count)."""

    _UNCHECKED: tuple[str, ...] = ()

    def to_json(self) -> str:
        """Canonical JSON (sorted keys): the same text for equal manifests."""
        return json.dumps(asdict(self), sort_keys=True)  # type: ignore[call-overload]

    def differences(self, other: Any, ignore: Sequence[str] = ()) -> list[str]:
        """Names of the fields that differ, except ``ignore`` (dict fields by key, as
        ``<field>.<key>``)."""
        out = []
        for f in fields(self):  # type: ignore[arg-type]
            x, y = getattr(self, f.name), getattr(other, f.name)
            if f.name in ignore or f.name in self._UNCHECKED or x == y:
                continue
            if isinstance(x, dict) and isinstance(y, dict):
                out += [f"{f.name}.{k}" for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k)]
            else:
                out.append(f.name)
        return out


def check_resume(found: Manifest, identity: Manifest, error: type[StoreMismatchError],
                 what: str, fix: str) -> None:
    """Refuse to continue ``found`` (a stored run) as ``identity``: when either run had hooks or
    foreign modules attached (their code is not part of the identity), or naming each checked
    field that differs."""
    attached = [*getattr(found, "attachments", ()), *getattr(identity, "attachments", ())]
    if attached:
        raise error(f"cannot resume: {what} or this run has hooks or modules attached to the "
                    f"model ({'; '.join(dict.fromkeys(attached))}), and those are not part of a "
                    "run's identity, so its results cannot be reused. Remove them and start "
                    "again with overwrite=True, or write to another output")
    diff = found.differences(identity)
    if diff:
        raise error(f"cannot resume: {what} was made with other settings ({', '.join(diff)} "
                    f"differ from this run's); its results cannot be reused. {fix}")


@dataclass(frozen=True)
class RunIdentity(Manifest):
    """Everything that determines a job's results; equal identities give equal results.

    Attributes:
        kind: the job (``"probes"``, ``"grams"``, ...).
        model_name: the model's name (names the folder; not part of the check).
        model_fingerprint: :func:`~tl_reward.model.fingerprint.model_fingerprint`.
        tokenizer: :func:`~tl_reward.model.fingerprint.tokenizer_fingerprint`.
        chat_template: SHA-256 of the tokenizer's chat template (also in ``tokenizer``; its
            own field so a refusal names it).
        inputs: SHA-256 of the inputs (item texts or token ids).
        functions: name -> :func:`function_digest` of each user function the job calls.
        settings: the job's other settings (JSON values).
        library: :func:`tl_reward.library_version` (version and source digest); format: the
            store's format.
        attachments: :func:`~tl_reward.model.fingerprint.attachments`: hooks and foreign
            modules on the model (a run with any is never resumed).
    """

    _UNCHECKED = ("model_name",)  # names the folder only

    kind: str
    model_name: str
    model_fingerprint: str
    tokenizer: str
    chat_template: str
    inputs: str
    functions: dict[str, str] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    library: str = ""
    format: str = FORMAT
    attachments: list[str] = field(default_factory=list)

    @classmethod
    def of_model(cls, kind: str, model: Any, tokenizer: Any = None) -> RunIdentity:
        """The model's part of a ``kind`` job's identity (fingerprint, tokenizer, template,
        library); :meth:`with_job` adds the job's part. ``tokenizer``: default
        ``model.tokenizer``."""
        import tl_reward
        from tl_reward.model.fingerprint import (
            attachments,
            model_fingerprint,
            tokenizer_fingerprint,
        )

        tok = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
        return cls(kind, str(model.cfg.model_name), model_fingerprint(model),
                   tokenizer_fingerprint(tok), digest(getattr(tok, "chat_template", None)),
                   "", attachments=attachments(model), library=tl_reward.library_version())

    def with_job(self, inputs: Any, functions: Mapping[str, Callable[..., Any]] | None = None,
                 settings: Mapping[str, Any] | None = None) -> RunIdentity:
        """This identity with the job's part: ``inputs`` (JSON values or bytes, hashed), the
        user ``functions`` it calls (by name, hashed) and its ``settings`` (JSON values)."""
        return replace(
            self, inputs=digest(inputs),
            functions={k: function_digest(f) for k, f in (functions or {}).items()},
            settings=json.loads(json.dumps(dict(settings or {}), sort_keys=True,
                                           default=_json_default)))

    @classmethod
    def from_json(cls, text: str) -> RunIdentity:
        """The identity in ``text``; fields it lacks are empty (so they count as differing)."""
        raw = json.loads(text) if text.strip() else {}
        raw = raw if isinstance(raw, dict) else {}
        empty: dict[str, Any] = {"functions": {}, "settings": {}, "attachments": []}
        return cls(**{f.name: raw.get(f.name, empty.get(f.name, "")) for f in fields(cls)})

    def folder_name(self) -> str:
        """``<kind>-<model name>-<12 hex of inputs and settings>``: the same job, one folder."""
        name = re.sub(r"[^A-Za-z0-9._-]+", "_", self.model_name)[-40:] or "model"
        return f"{self.kind}-{name}-{digest([self.inputs, self.settings])[:12]}"


class ChunkStore:
    """A job's chunks in one folder, beside a ``manifest.json`` with its identity.

    Args:
        folder: the job's folder (created when missing).
        identity: the job's :class:`RunIdentity` (or another :class:`Manifest` with
            ``from_json``, e.g. a sweep's); a manifest there must hold the same one.
        overwrite: remove the folder's contents first.
        error: the exception raised on a mismatch (a :class:`StoreMismatchError` subclass, so
            callers keep their own error type).
        what, fix: the refusal's subject and advice.
    """

    def __init__(self, folder: str | Path, identity: Any, overwrite: bool = False,
                 error: type[StoreMismatchError] = StoreMismatchError, what: str | None = None,
                 fix: str = "Pass overwrite=True to start again, or use another output folder"
                 ) -> None:
        self.folder = Path(folder)
        if overwrite:
            shutil.rmtree(self.folder, ignore_errors=True)
        manifest = self.folder / "manifest.json"
        if manifest.exists():
            found = type(identity).from_json(manifest.read_text())
            kind = getattr(found, "kind", "") or "tl_reward"
            check_resume(found, identity, error, what or f"the {kind} run in {self.folder}", fix)
        else:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.save("manifest.json", lambda p: p.write_text(identity.to_json()))

    def path(self, name: str) -> Path:
        """Where chunk ``name`` lives."""
        return self.folder / name

    def has(self, name: str) -> bool:
        """Whether chunk ``name`` is finished."""
        return self.path(name).exists()

    def save(self, name: str, write: Callable[[Path], Any]) -> Path:
        """Write chunk ``name`` with :func:`atomic_write` (a crash never leaves half a chunk)."""
        return atomic_write(self.path(name), write)


def atomic_write(path: Path, write: Callable[[Path], Any]) -> Path:
    """``write(<path>.tmp)`` then rename it to ``path``: readers see all of it or none."""
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)
    return path


def entry_key(identity: RunIdentity, content: Any) -> str:
    """16 hex digits naming one result in an :class:`EntryCache`: a hash of ``content`` and of
    every identity field but the model's name (a renamed copy of a model shares entries). A
    model with attachments has no key (their code is not in the identity): refused."""
    if identity.attachments:
        raise StoreMismatchError(
            f"cannot cache results of a model with hooks or modules attached "
            f"({'; '.join(identity.attachments)}): they are not part of a cache key. Remove "
            "them, or run without a cache folder")
    return digest([{k: v for k, v in asdict(identity).items() if k != "model_name"},
                   content])[:16]


class EntryCache:
    """A content-addressed cache: one JSON file per result, ``<folder>/<entry_key>.json``.

    Entries of every model and run share the folder: a key covers the whole run identity, so a
    changed model, tokenizer or setting gives new keys (recomputed, never mixed), and the
    entries of a run that did not change are found again.
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def get(self, key: str) -> Any | None:
        """The entry under ``key``, or ``None``."""
        path = self.folder / f"{key}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def put(self, key: str, value: Any) -> None:
        """Write the entry under ``key`` atomically."""
        atomic_write(self.folder / f"{key}.json", lambda p: p.write_text(json.dumps(value)))
