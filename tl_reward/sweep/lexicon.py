"""Tokens as words: normalisation, AFINN valence, ``wordfreq`` frequency, score scaling.

Shared by the valence, frequency and identity analyses of a vocabulary sweep. A token is a
word when its decoded string, stripped of surrounding whitespace, is alphabetic (apostrophes
and inner hyphens allowed); several tokens (``" Love"``, ``"love"``) can map to one word.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

import numpy as np
import pandas as pd
import torch

from tl_reward.errors import TLRewardError, check_choice
from tl_reward.stats.ranks import as_array

SCALES = ("z", "raw", "percentile")
_WORD = re.compile(r"^[^\W\d_]+(?:['’-][^\W\d_]+)*$")


def token_word(token: str, casefold: bool = True) -> str | None:
    """The word a decoded token spells (stripped, case-folded), or ``None`` if it is not one."""
    s = token.strip()
    if not s or not _WORD.match(s):
        return None
    return s.casefold() if casefold else s


@cache
def afinn_lexicon(version: str = "en-165") -> dict[str, int]:
    """The AFINN valence lexicon (word -> integer valence in [-5, 5]) shipped with ``afinn``."""
    try:
        text = (resources.files("afinn") / "data" / f"AFINN-{version}.txt").read_text(
            encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise TLRewardError(f"AFINN lexicon {version!r} not found; install it with "
                            "`pip install afinn`") from exc
    rows = (line.rpartition("\t") for line in text.splitlines())
    return {word.casefold(): int(value) for word, _, value in rows if word}


def zipf_frequency(words: list[str], lang: str = "en") -> np.ndarray:
    """Zipf frequency (log10 occurrences per billion words) from ``wordfreq``; 0 if unseen."""
    try:
        from wordfreq import zipf_frequency as zf
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise TLRewardError("frequency analyses need `pip install wordfreq`") from exc
    return np.array([zf(w, lang) for w in words], dtype=np.float64)


def scale_values(values: torch.Tensor | np.ndarray, scale: str = "z") -> np.ndarray:
    """Scores on a common scale: ``"z"`` (standardised over all swept tokens), ``"raw"``,
    or ``"percentile"`` (0-100, ties averaged)."""
    v = as_array(values)
    check_choice(scale, SCALES, "scale")
    if scale == "raw":
        return v
    if scale == "z":
        sd = v.std()
        return (v - v.mean()) / (sd if sd > 0 else 1.0)
    return percentile_of(v, v)


def percentile_of(reference: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Percentile rank (0-100) of each value within ``reference``: the mean of the share
    strictly below and the share at or below (``scipy.stats.percentileofscore(kind='mean')``)."""
    ref = np.sort(np.asarray(reference, dtype=np.float64))
    vals = np.asarray(values, dtype=np.float64)
    below = np.searchsorted(ref, vals, side="left")
    at_or_below = np.searchsorted(ref, vals, side="right")
    return (below + at_or_below) / 2.0 / len(ref) * 100.0


def word_table(token_ids: np.ndarray, tokens: list[str], values: np.ndarray,
               casefold: bool = True) -> pd.DataFrame:
    """Word tokens only: ``token_id``, ``token``, ``word``, ``value``."""
    words = [token_word(t, casefold) for t in tokens]
    keep = [i for i, w in enumerate(words) if w is not None]
    return pd.DataFrame({"token_id": np.asarray(token_ids)[keep],
                         "token": [tokens[i] for i in keep],
                         "word": [words[i] for i in keep],
                         "value": np.asarray(values)[keep]})


def per_word(table: pd.DataFrame, aggregate: str = "mean") -> pd.DataFrame:
    """One row per word (``aggregate`` over its tokens: mean, max, min or first) with the
    number of tokens; ``"none"`` keeps every token."""
    check_choice(aggregate, ("mean", "max", "min", "first", "none"), "aggregate")
    if aggregate == "none":
        return table.assign(n_tokens=1)
    grouped = table.groupby("word", sort=True)
    out = grouped["value"].agg(aggregate).to_frame("value")
    out["n_tokens"] = grouped.size()
    out["tokens"] = grouped["token"].agg(list)
    return out.reset_index()
