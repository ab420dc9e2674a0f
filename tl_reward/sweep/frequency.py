"""Frequency bias: do common words score higher, once their valence is accounted for?

Word tokens get their Zipf frequency from ``wordfreq`` (log10 occurrences per billion words;
words ``wordfreq`` has never seen are left out). The scaled score is regressed on frequency
alone and on frequency plus valence (AFINN, split into a positive and a negative part so the
high/low asymmetry cannot masquerade as a frequency effect; 0 for words outside the lexicon).
The frequency coefficient of the second fit is the bias.

Example:
    >>> freq = frequency_bias(sweep, prompt="best")
    >>> freq.to_dataframe(); freq.plot()
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from tl_reward.errors import TLRewardError
from tl_reward.results import ShortRepr
from tl_reward.stats.regression import OLSFit, ols
from tl_reward.sweep.lexicon import zipf_frequency
from tl_reward.sweep.valence import lexicon_words
from tl_reward.sweep.vocab_sweep import VocabSweep


@dataclass(repr=False)
class FrequencyBias(ShortRepr):
    """Score against log word frequency, with and without valence as a covariate.

    Attributes:
        words: one row per word: word, zipf, valence (0 outside the lexicon), value.
        uncontrolled: ``value ~ zipf``.
        controlled: ``value ~ zipf + valence_pos + valence_neg``.
        prompt, objective, scale: what was analysed.
    """

    words: pd.DataFrame
    uncontrolled: OLSFit
    controlled: OLSFit
    prompt: str
    objective: str
    scale: str

    @property
    def coefficient(self) -> float:
        """Change in value per Zipf unit (tenfold frequency), valence held fixed."""
        return self.controlled["zipf"]

    def to_dataframe(self) -> pd.DataFrame:
        """Both fits' coefficient tables, stacked (``model`` column)."""
        return pd.concat([self.uncontrolled.table().assign(model="value ~ zipf"),
                          self.controlled.table().assign(
                              model="value ~ zipf + valence_pos + valence_neg")]
                         ).rename_axis("term").reset_index()

    def plot(self) -> Any:
        """Scatter of value against Zipf frequency, coloured by valence (plotly)."""
        from tl_reward.viz.vocab import plot_frequency

        return plot_frequency(self)


def frequency_bias(
    sweep: VocabSweep,
    prompt: int | str = 0,
    objective: int | str = "score",
    scale: str = "z",
    aggregate: str = "mean",
    lexicon: Mapping[str, float] | None = None,
    lang: str = "en",
    min_zipf: float = 0.0,
) -> FrequencyBias:
    """Regress word tokens' values on Zipf frequency, controlling for valence.

    Args:
        sweep, prompt, objective, scale, aggregate: as in :func:`.token_valence.valence_asymmetry`.
        lexicon: word -> valence (default AFINN-en-165).
        lang: ``wordfreq`` language code.
        min_zipf: keep words whose Zipf frequency exceeds this (0 drops unseen words).
    """
    words = lexicon_words(sweep, prompt, objective, scale, aggregate, lexicon)
    words["zipf"] = zipf_frequency(words["word"].tolist(), lang)
    words = words[words["zipf"] > min_zipf].reset_index(drop=True)
    words["valence"] = words["valence"].fillna(0.0)
    if len(words) < 5:
        raise TLRewardError(f"only {len(words)} swept word tokens have a frequency; sweep more "
                            "of the vocabulary")
    y, zipf, val = (words[c].to_numpy() for c in ("value", "zipf", "valence"))
    uncontrolled = ols(y, {"zipf": zipf})
    controlled = ols(y, {"zipf": zipf, "valence_pos": np.clip(val, 0, None),
                         "valence_neg": np.clip(val, None, 0)})
    label = sweep.labels[sweep.prompt_index(prompt)]
    return FrequencyBias(words, uncontrolled, controlled, label, str(objective), scale)
