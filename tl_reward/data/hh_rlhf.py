"""Anthropic HH-RLHF dialogues (``\\n\\nHuman: ...\\n\\nAssistant: ...``) as preference pairs."""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

from tl_reward.data.conversation import Conversation, Message
from tl_reward.data.preference import PreferencePair

_TURN = re.compile(r"\n\n(Human|Assistant):[ ]?")
_ROLE = {"Human": "user", "Assistant": "assistant"}


def parse_dialogue(text: str) -> Conversation:
    """Split an HH-RLHF transcript into user/assistant messages (content stripped)."""
    parts = _TURN.split(text)
    if len(parts) < 3:
        raise ValueError(f"not an HH-RLHF dialogue (no 'Human:'/'Assistant:' turns): {text[:80]!r}")
    return [Message(role=_ROLE[speaker], content=content.strip())
            for speaker, content in zip(parts[1::2], parts[2::2], strict=True)]


@dataclass
class LoadReport:
    """What a loader kept and what it skipped, with reasons."""

    kept: int = 0
    skipped_empty: int = 0
    skipped_mismatch: int = 0
    skipped_malformed: int = 0

    @property
    def skipped(self) -> int:
        return self.skipped_empty + self.skipped_mismatch + self.skipped_malformed


def pair_from_dialogues(chosen: str, rejected: str, **meta: Any) -> PreferencePair:
    """One pair from two full HH dialogues that share every turn but the last reply."""
    c, r = parse_dialogue(chosen), parse_dialogue(rejected)
    if not c or not r or c[-1]["role"] != "assistant" or r[-1]["role"] != "assistant":
        raise ValueError("both dialogues must end with an assistant reply")
    if c[:-1] != r[:-1]:
        raise ValueError("chosen and rejected dialogues differ before the final reply")
    return PreferencePair(prompt=c[:-1], chosen=c[-1]["content"], rejected=r[-1]["content"],
                          meta=dict(meta))


def iter_hh_records(records: Iterable[dict[str, Any]], report: LoadReport | None = None,
                    skip_invalid: bool = True) -> Iterator[PreferencePair]:
    """Pairs from records with ``chosen``/``rejected`` dialogue strings."""
    report = report if report is not None else LoadReport()
    for i, rec in enumerate(records):
        try:
            pair = pair_from_dialogues(rec["chosen"], rec["rejected"], index=i)
        except Exception as exc:  # noqa: BLE001 - classified below
            if not skip_invalid:
                raise
            msg = str(exc)
            if "empty" in msg:
                report.skipped_empty += 1
            elif "differ" in msg:
                report.skipped_mismatch += 1
            else:
                report.skipped_malformed += 1
            continue
        report.kept += 1
        yield pair


def load_hh_rlhf(source: str | Path | Any, limit: int | None = None, skip_invalid: bool = True,
                 split: str = "test", report: LoadReport | None = None) -> list[PreferencePair]:
    """Load HH-RLHF-style pairs from a local ``.jsonl``/``.jsonl.gz`` file or a ``datasets`` object.

    ``source`` may be a path, a ``datasets.Dataset``/``DatasetDict`` with ``chosen`` and
    ``rejected`` columns, or a hub name (needs network; ``datasets.load_dataset`` is called).
    Pairs whose replies are empty or whose dialogues differ before the last reply are
    skipped and counted in ``report`` (pass ``skip_invalid=False`` to raise instead).
    """
    records: Iterable[dict[str, Any]]
    if isinstance(source, (str, Path)) and Path(source).exists():
        path = Path(source)
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as fh:
            records = [json.loads(line) for line in fh if line.strip()]
    elif isinstance(source, (str, Path)):
        import datasets

        records = datasets.load_dataset(str(source), split=split)
    else:
        records = source[split] if hasattr(source, "keys") and split in source.keys() else source
    return list(islice(iter_hh_records(records, report, skip_invalid), limit))
