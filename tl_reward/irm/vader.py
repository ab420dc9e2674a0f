"""VADER sentiment (``vadersentiment``): the reward with known per-token utilities."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

import numpy as np

from tl_reward.errors import TLRewardError
from tl_reward.sweep.lexicon import token_word


@cache
def vader_analyzer() -> Any:
    """VADER's ``SentimentIntensityAnalyzer`` (lexicon shipped with ``vadersentiment``)."""
    try:
        from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer
    except ModuleNotFoundError as exc:
        raise TLRewardError("VADER needs the 'vadersentiment' package: "
                            "pip install vadersentiment") from exc
    return SentimentIntensityAnalyzer()


def vader_lexicon() -> dict[str, float]:
    """Word -> mean human valence rating in [-4, 4] (VADER's lexicon, lower-case words)."""
    return dict(vader_analyzer().lexicon)


def vader_compound(texts: Sequence[str]) -> np.ndarray:
    """VADER compound score in [-1, 1] of each text."""
    sia = vader_analyzer()
    return np.array([sia.polarity_scores(t)["compound"] for t in texts], dtype=np.float64)


def token_utilities(tokens: Sequence[str]) -> np.ndarray:
    """VADER lexicon valence of each decoded token's word (NaN when not in the lexicon)."""
    lex = vader_lexicon()
    return np.array([lex.get(token_word(t), np.nan) for t in tokens], dtype=np.float64)
