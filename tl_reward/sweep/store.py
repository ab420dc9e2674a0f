"""Sweep results on disk: written chunk by chunk, resumable, shardable by id range, mergeable.

While a sweep runs, each finished chunk is written atomically as a parquet file in
``<output>.parts/``, a :class:`~tl_reward.store.ChunkStore` whose manifest holds the sweep's
:class:`SweepSpec`; an interrupted sweep computes only the missing chunks. When all are in, they
become one parquet file sorted by token id (the spec in its schema metadata) and the parts are
removed. Chunks do not depend on interruptions, so a resumed sweep writes the same bytes as an
uninterrupted one, and shards of ``shard=(i, n)`` merge into the file one run would write.

Example:
    >>> merge_sweeps(["best.0.parquet", "best.1.parquet"], "best.parquet")
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tl_reward.errors import TLRewardError
from tl_reward.results import result_type
from tl_reward.store import ChunkStore, Manifest, StoreMismatchError, atomic_write, check_resume

FORMAT = "tl_reward.vocab_sweep/1"
METADATA_KEY = b"tl_reward.vocab_sweep"
ROW_GROUP_SIZE = 65_536
_FIX = ("Use the same model, tokenizer, prompts, ids, batch size and range, or another output "
        "file")


class SweepStoreError(TLRewardError):
    """A sweep file or parts folder that does not fit the requested sweep."""


class SweepMismatchError(SweepStoreError, StoreMismatchError):
    """A sweep to resume that was made with other settings (named in the message)."""


@result_type
@dataclass(frozen=True)
class SweepSpec(Manifest):
    """Everything that determines a sweep's rows. Two files belong to one sweep iff their specs
    agree on every field except ``id_range``.

    Attributes:
        model_name: the model's name (``cfg.model_name``).
        model_fingerprint: :func:`~tl_reward.model.fingerprint.model_fingerprint` (every weight,
            the head, config, dtype, pooling rule and library version).
        tokenizer: :func:`~tl_reward.model.fingerprint.tokenizer_fingerprint` (vocabulary,
            special tokens, chat template; the text mode re-tokenises with it).
        mode: ``"ids"`` (exact id path) or ``"text"`` (decode, template, re-tokenise).
        cache: ``"fast"``, ``"stock"`` or ``"none"`` (how continuations were run).
        dtype, pooling: the model's dtype and pooling rule (where the reward is read).
        labels, prompts: one label (column names) and one conversation per prompt.
        prefixes, suffixes: template ids around the response, per prompt.
        objectives: the K objective names; ``has_score``: whether a combined score exists.
        batch_size: candidates per forward pass (chunks on disk have this size).
        n_candidates, candidates_digest: the whole candidate list, before any id range.
        id_range: ``[lo, hi)`` of token ids this file covers.
        attachments: hooks and foreign modules on the model
            (:func:`~tl_reward.model.fingerprint.attachments`); a sweep with any never resumes.
        format: the file format.
    """

    model_name: str
    model_fingerprint: str
    tokenizer: str
    mode: str
    cache: str
    dtype: str
    pooling: str
    labels: tuple[str, ...]
    prompts: tuple[Any, ...]
    prefixes: tuple[tuple[int, ...], ...]
    suffixes: tuple[tuple[int, ...], ...]
    objectives: tuple[str, ...]
    has_score: bool
    batch_size: int
    n_candidates: int
    candidates_digest: str
    id_range: tuple[int, int]
    attachments: tuple[str, ...] = ()
    format: str = FORMAT

    @classmethod
    def from_json(cls, text: str | bytes) -> SweepSpec:
        raw = json.loads(text)
        if raw.get("format") != FORMAT:
            raise SweepStoreError(f"not a tl_reward vocabulary sweep (expected format {FORMAT})")
        conv = (dict.fromkeys(("labels", "prompts", "objectives", "id_range", "attachments"),
                              tuple)
                | dict.fromkeys(("prefixes", "suffixes"), lambda v: tuple(map(tuple, v))))
        raw.setdefault("pooling", "unknown")  # written before the rule was recorded
        raw.setdefault("tokenizer", "unknown")  # written before the tokenizer was recorded
        raw.setdefault("attachments", ())
        return cls(**{f.name: conv.get(f.name, lambda v: v)(raw[f.name]) for f in fields(cls)})

    def columns(self) -> list[str]:
        """Value columns after ``token_id`` and ``token``."""
        cols = [score_column(lab) for lab in self.labels] if self.has_score else []
        if len(self.objectives) > 1 or not self.has_score:
            cols += [reward_column(lab, o) for lab in self.labels for o in self.objectives]
        return cols


def score_column(label: str) -> str:
    """Column of the combined score for a prompt label."""
    return f"score:{label}"


def reward_column(label: str, objective: str) -> str:
    """Column of one objective's reward for a prompt label."""
    return f"reward:{label}:{objective}"


def digest_ids(ids: Sequence[int] | np.ndarray) -> str:
    """SHA-256 of a list of token ids (identifies a candidate set)."""
    return hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest()


def _schema(spec: SweepSpec) -> pa.Schema:
    cols = [pa.field("token_id", pa.int64()), pa.field("token", pa.string())]
    cols += [pa.field(c, pa.float32()) for c in spec.columns()]
    return pa.schema(cols, metadata={METADATA_KEY: spec.to_json().encode()})


def make_table(spec: SweepSpec, token_ids: Sequence[int], tokens: Sequence[str],
               values: dict[str, np.ndarray]) -> pa.Table:
    """A table of rows in ``spec``'s schema (``values``: column -> float array)."""
    data: dict[str, Any] = {"token_id": np.asarray(token_ids, dtype=np.int64),
                            "token": list(tokens)}
    for c in spec.columns():
        data[c] = np.asarray(values[c], dtype=np.float32)
    return pa.table(data, schema=_schema(spec))


def read_spec(path: str | Path) -> SweepSpec:
    """The spec stored in a finished sweep file."""
    meta = pq.read_schema(path).metadata or {}
    if METADATA_KEY not in meta:
        raise SweepStoreError(f"{path} is not a tl_reward vocabulary sweep file")
    return SweepSpec.from_json(meta[METADATA_KEY])


def read_table(path: str | Path) -> tuple[pa.Table, SweepSpec]:
    """A finished sweep file's rows and spec."""
    path = Path(path)
    if not path.exists():
        parts = parts_dir(path)
        hint = (f"; an unfinished sweep is in {parts}, resume it with resume=True"
                if parts.exists() else "")
        raise SweepStoreError(f"no sweep file at {path}{hint}")
    return pq.read_table(path), read_spec(path)


def write_table(table: pa.Table, spec: SweepSpec, path: str | Path) -> Path:
    """Write rows sorted by token id with ``spec`` as metadata, atomically."""
    path = Path(path)
    table = table.sort_by("token_id").replace_schema_metadata(
        {METADATA_KEY: spec.to_json().encode()})
    return atomic_write(path, lambda p: pq.write_table(table, p, row_group_size=ROW_GROUP_SIZE))


def parts_dir(path: str | Path) -> Path:
    """Where the chunks of an unfinished sweep writing to ``path`` live."""
    path = Path(path)
    return path.with_name(path.name + ".parts")


class SweepWriter:
    """Writes one sweep's chunks as they finish, and the final file when all are done.

    Args:
        path, spec, n_chunks: the final parquet file, the sweep being written and its number of
            chunks.
        resume: continue an unfinished sweep at ``path`` (its spec must equal ``spec``).
        overwrite: discard any previous file or parts at ``path``.
    """

    def __init__(self, path: str | Path, spec: SweepSpec, n_chunks: int, resume: bool = False,
                 overwrite: bool = False) -> None:
        self.path = Path(path)
        self.spec = spec
        self.n_chunks = n_chunks
        self.parts = parts_dir(self.path)
        self.finished = False
        if overwrite:
            shutil.rmtree(self.parts, ignore_errors=True)
            self.path.unlink(missing_ok=True)
        if self.path.exists():
            self._check(read_spec(self.path), f"the finished sweep {self.path}", resume)
            self.finished = True
            return
        if self.parts.exists():
            if not (self.parts / "manifest.json").exists():
                raise SweepStoreError(f"{self.parts} has no manifest.json; remove the folder or "
                                      "pass overwrite=True")
            self._check(None, f"the unfinished sweep in {self.parts}", resume)
        self.store = ChunkStore(self.parts, spec, error=SweepMismatchError,
                                what=f"the unfinished sweep in {self.parts}", fix=_FIX)

    def _check(self, found: SweepSpec | None, what: str, resume: bool) -> None:
        if not resume:
            raise SweepStoreError(f"{what} already exists; pass resume=True to continue it, or "
                                  "overwrite=True (--overwrite) to start again")
        if found is not None:
            check_resume(found, self.spec, SweepMismatchError, what, _FIX)

    def _chunk_path(self, index: int) -> Path:
        return self.parts / f"chunk-{index:07d}.parquet"

    def done(self) -> set[int]:
        """Indices of chunks already on disk."""
        if self.finished:
            return set(range(self.n_chunks))
        return {int(p.stem.split("-")[1]) for p in self.parts.glob("chunk-*.parquet")}

    def write(self, index: int, table: pa.Table) -> None:
        """Write chunk ``index`` atomically (a crash leaves it absent, never half-written)."""
        self.store.save(self._chunk_path(index).name, lambda p: pq.write_table(table, p))

    def finish(self) -> pa.Table:
        """Join all chunks into the final file (sorted by token id); remove the parts."""
        if self.finished:
            return read_table(self.path)[0]
        missing = sorted(set(range(self.n_chunks)) - self.done())
        if missing:
            raise SweepStoreError(f"{len(missing)} chunks are missing (first: {missing[0]}); "
                                  "run the sweep again with resume=True")
        tables = [pq.read_table(self._chunk_path(i)) for i in range(self.n_chunks)]
        table = pa.concat_tables(tables) if tables else _schema(self.spec).empty_table()
        _check_unique(table, str(self.parts))
        write_table(table, self.spec, self.path)
        shutil.rmtree(self.parts)
        self.finished = True
        return read_table(self.path)[0]


def _check_unique(table: pa.Table, where: str) -> None:
    ids = table.column("token_id").to_numpy()
    if len(np.unique(ids)) != len(ids):
        raise SweepStoreError(f"duplicate token ids in {where}")


def merge_sweeps(paths: Sequence[str | Path], output: str | Path) -> Path:
    """Merge finished shards of one sweep into one file (as if run in one go).

    The shards must share every setting but their id ranges, which must not overlap and must
    join into one range.
    """
    if not paths:
        raise SweepStoreError("no sweep files to merge")
    loaded = sorted((read_table(p) + (str(p),) for p in paths), key=lambda t: t[1].id_range[0])
    first = loaded[0][1]
    for _, spec, name in loaded[1:]:
        diff = first.differences(spec, ignore=("id_range",))
        if diff:
            raise SweepStoreError(f"{name} is not a shard of the same sweep as {loaded[0][2]} "
                                  f"(differs in {', '.join(diff)})")
    for (_, a, na), (_, b, nb) in zip(loaded, loaded[1:], strict=False):
        if b.id_range[0] != a.id_range[1]:
            kind = "overlap" if b.id_range[0] < a.id_range[1] else "leave a gap"
            raise SweepStoreError(f"the id ranges of {na} {list(a.id_range)} and {nb} "
                                  f"{list(b.id_range)} {kind}; merge shards that tile one range")
    table = pa.concat_tables([t.replace_schema_metadata(None) for t, _, _ in loaded])
    _check_unique(table, "the merged shards")
    spec = replace(first, id_range=(first.id_range[0], loaded[-1][1].id_range[1]))
    return write_table(table, spec, output)
