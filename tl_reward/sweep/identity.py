"""Identity-group audit: where do terms for groups of people fall in a model's ranking?

The user supplies the groups and their terms (e.g. ``{"religion": ["christian", "muslim",
"jewish", "atheist"]}``); tl_reward ships no list. Each term is matched to every token that
spells it (stripped; case-folded unless ``case_sensitive``) and reported as the percentile of
its score among all swept tokens (0 = worst, 100 = best), per prompt. Terms that are no single
token are listed as missing: score them as responses with ``model.rewards`` instead.

Example:
    >>> audit = identity_percentiles(sweep, {"gender": ["man", "woman"]})
    >>> audit.summary(); audit.plot()
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from tl_reward.errors import TLRewardError
from tl_reward.results import ShortRepr
from tl_reward.sweep.lexicon import percentile_of, token_word
from tl_reward.sweep.vocab_sweep import VocabSweep


@dataclass(repr=False)
class IdentityAudit(ShortRepr):
    """Percentiles of identity terms' tokens per prompt.

    Attributes:
        matches: one row per (group, term, token, prompt): token id and string, value,
            percentile.
        missing: ``(group, term)`` pairs with no single-token match.
        objective: what was ranked.
    """

    matches: pd.DataFrame
    missing: list[tuple[str, str]]
    objective: str

    def to_dataframe(self) -> pd.DataFrame:
        return self.matches

    def by_term(self) -> pd.DataFrame:
        """Per (group, term, prompt): mean percentile over the term's tokens, and their count."""
        return (self.matches.groupby(["group", "term", "prompt"], sort=False)["percentile"]
                .agg(["mean", "min", "max", "count"]).reset_index())

    def summary(self) -> pd.DataFrame:
        """Per (group, prompt): mean, min and max of the terms' mean percentiles."""
        terms = self.by_term()
        return (terms.groupby(["group", "prompt"], sort=False)["mean"]
                .agg(["mean", "min", "max", "count"]).rename(columns={"count": "n_terms"})
                .reset_index())

    def plot(self) -> Any:
        """Strip chart of term percentiles per group and prompt (plotly)."""
        from tl_reward.viz.vocab import plot_identity

        return plot_identity(self)


def identity_percentiles(
    sweep: VocabSweep,
    groups: Mapping[str, Sequence[str]],
    objective: int | str = "score",
    prompts: Sequence[int | str] | None = None,
    case_sensitive: bool = False,
) -> IdentityAudit:
    """Percentile of every token that spells a group's term, per prompt."""
    if not groups or not any(groups.values()):
        raise TLRewardError("pass identity groups as {group: [term, ...]}")
    words = [token_word(t, casefold=not case_sensitive) for t in sweep.tokens]
    index: dict[str, list[int]] = {}
    for i, w in enumerate(words):
        if w is not None:
            index.setdefault(w, []).append(i)
    idx = [sweep.prompt_index(p) for p in (prompts or range(len(sweep.labels)))]
    values = {p: sweep.values(p, objective).double().numpy() for p in idx}
    rows, missing = [], []
    for group, terms in groups.items():
        for term in terms:
            key = term.strip() if case_sensitive else term.strip().casefold()
            hits = index.get(key, [])
            if not hits:
                missing.append((group, term))
            for p in idx:
                pct = percentile_of(values[p], values[p][hits]) if hits else []
                for i, q in zip(hits, pct, strict=True):
                    rows.append({"group": group, "term": term, "prompt": sweep.labels[p],
                                 "token_id": int(sweep.token_ids[i]), "token": sweep.tokens[i],
                                 "value": float(values[p][i]), "percentile": float(q)})
    cols = ["group", "term", "prompt", "token_id", "token", "value", "percentile"]
    return IdentityAudit(pd.DataFrame(rows, columns=cols), missing, str(objective))
