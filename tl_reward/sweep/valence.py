"""High/low asymmetry: how a reward model's token scores follow lexicon valence.

Each word token is matched to the AFINN lexicon (integer valence -5..5). The score is regressed
on valence separately for positive and for negative words: a model that separates bad words
finely but lumps good ones together (or the reverse) shows different slopes. Scores are put on
one scale first (default ``"z"``: standardised over every swept token), so slopes read as
standard deviations per valence point and compare across models.

Example:
    >>> asym = valence_asymmetry(sweep, prompt="best")
    >>> asym.to_dataframe(); asym.plot()
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import special

from tl_reward.errors import TLRewardError
from tl_reward.results import ShortRepr
from tl_reward.stats.regression import OLSFit, ols
from tl_reward.sweep.lexicon import afinn_lexicon, per_word, scale_values, word_table
from tl_reward.sweep.vocab_sweep import VocabSweep


@dataclass(repr=False)
class ValenceAsymmetry(ShortRepr):
    """Score against valence, fitted separately for positive and negative words.

    Attributes:
        words: one row per matched word: word, valence, value (scaled), n_tokens.
        positive, negative: the two fits (``value ~ valence``).
        neutral_mean: mean scaled value of word tokens absent from the lexicon.
        slope_difference_z, slope_difference_p: z-test of ``slope_pos - slope_neg``.
        prompt, objective, scale: what was analysed.
    """

    words: pd.DataFrame
    positive: OLSFit
    negative: OLSFit
    neutral_mean: float
    slope_difference_z: float
    slope_difference_p: float
    prompt: str
    objective: str
    scale: str

    @property
    def slope_ratio(self) -> float:
        """``|slope_neg| / |slope_pos|``: above 1, negative words are told apart more finely."""
        return abs(self.negative["valence"]) / abs(self.positive["valence"])

    def to_dataframe(self) -> pd.DataFrame:
        """One row per side: n words, intercept, slope with SE, CI and p, R^2."""
        rows = []
        for side, fit in (("positive", self.positive), ("negative", self.negative)):
            t = fit.table()
            rows.append({"side": side, "n_words": fit.n, "intercept": fit["intercept"],
                         "slope": fit["valence"], **{f"slope_{c}": t.loc["valence", c] for c in
                                                     ("se", "ci_low", "ci_high", "p")},
                         "r2": fit.r2})
        return pd.DataFrame(rows)

    def plot(self) -> Any:
        """Scatter of value against valence with both fitted lines (plotly)."""
        from tl_reward.viz.vocab import plot_valence

        return plot_valence(self)


def lexicon_words(sweep: VocabSweep, prompt: int | str, objective: int | str, scale: str,
                  aggregate: str, lexicon: Mapping[str, float] | None) -> pd.DataFrame:
    """Word tokens with a ``valence`` column (NaN when the word is not in ``lexicon``, matched
    case-folded; default AFINN-en-165)."""
    lex = afinn_lexicon() if lexicon is None else {k.casefold(): v for k, v in lexicon.items()}
    values = scale_values(sweep.values(prompt, objective), scale)
    words = per_word(word_table(sweep.token_ids.numpy(), sweep.tokens, values), aggregate)
    return words.assign(valence=words["word"].map(lambda w: lex.get(w, np.nan)))


def valence_asymmetry(
    sweep: VocabSweep,
    prompt: int | str = 0,
    objective: int | str = "score",
    scale: str = "z",
    aggregate: str = "mean",
    lexicon: Mapping[str, float] | None = None,
) -> ValenceAsymmetry:
    """Fit ``value ~ valence`` on positive and on negative lexicon words separately.

    Args:
        sweep, prompt, objective: a vocabulary sweep and which of its values.
        scale: ``"z"``, ``"raw"`` or ``"percentile"`` (see :func:`.token_lexicon.scale_values`).
        aggregate: how a word's several tokens combine (``"mean"``, ``"max"``, ..., ``"none"``).
        lexicon: word -> valence (default: AFINN-en-165).
    """
    words = lexicon_words(sweep, prompt, objective, scale, aggregate, lexicon)
    fits = []
    for side, part in (("positive", words[words["valence"] > 0]),
                       ("negative", words[words["valence"] < 0])):
        if len(part) < 3 or part["valence"].nunique() < 2:
            raise TLRewardError(f"too few {side} lexicon words among the swept tokens "
                                f"({len(part)}); sweep more of the vocabulary")
        fits.append(ols(part["value"].to_numpy(), {"valence": part["valence"].to_numpy()}))
    fit_pos, fit_neg = fits
    se = math.hypot(fit_pos.se[1], fit_neg.se[1])
    z = (fit_pos["valence"] - fit_neg["valence"]) / se if se > 0 else float("nan")
    neutral = words.loc[words["valence"].isna(), "value"]
    label = sweep.labels[sweep.prompt_index(prompt)]
    return ValenceAsymmetry(words[words["valence"].notna()].reset_index(drop=True), fit_pos,
                            fit_neg, float(neutral.mean()) if len(neutral) else float("nan"),
                            float(z), float(special.erfc(abs(z) / math.sqrt(2))), label,
                            str(objective), scale)
