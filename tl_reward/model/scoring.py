"""Scoring many inputs: length-sorted batches, progress, typed results."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch
from jaxtyping import Float, Int
from tqdm.auto import tqdm

from tl_reward.data.preference import PreferencePair, pair_rows
from tl_reward.errors import UnknownObjectiveError
from tl_reward.model.heads import objective_slot
from tl_reward.model.inputs import as_items, encode_inputs, input_texts
from tl_reward.model.readout import accumulation_dtype
from tl_reward.results import ShortRepr

if TYPE_CHECKING:
    from tl_reward.model.inputs import EncodedInput, RewardBatch, RewardInput
    from tl_reward.model.protocol import RewardModelMixin


@dataclass(repr=False)
class RewardResult(ShortRepr):
    """Rewards of N inputs.

    Attributes:
        rewards: ``[N, K]`` per-objective rewards.
        objectives: the K objective names.
        score: ``[N]`` combined score, or ``None`` for a multi-objective head without one.
        gating: ``[N, K]`` ArmoRM gating weights, else ``None``.
        n_tokens: ``[N]`` sequence lengths.
        labels: optional names of the inputs.
        texts: the inputs' texts by column (``prompt`` and ``response``, ``text``: see
            :func:`~tl_reward.model.inputs.input_texts`), shown after the scores.
    """

    rewards: Float[torch.Tensor, "n K"]
    objectives: list[str]
    score: Float[torch.Tensor, " n"] | None
    gating: Float[torch.Tensor, "n K"] | None
    n_tokens: Int[torch.Tensor, " n"]
    labels: list[str] | None = None
    texts: dict[str, list[str | None]] | None = None

    def __len__(self) -> int:
        return self.rewards.shape[0]

    def values(self, objective: int | str = "score") -> Float[torch.Tensor, " n"]:
        """``[N]`` combined score (``"score"``) or one objective's rewards (name or index)."""
        if objective != "score":
            return self.rewards[:, objective_slot(self.objectives, objective)]
        if self.score is None:
            raise UnknownObjectiveError(f"this model has objectives {self.objectives} and no "
                                        "combined score; pass objective=<name>")
        return self.score

    def to_dataframe(self) -> pd.DataFrame:
        """One row per input, in input order: label, token count, score, each objective's
        reward (and gate), then the input's texts (``prompt`` and ``response``, or ``text``)."""
        df = pd.DataFrame({"n_tokens": self.n_tokens.tolist()})
        if self.labels is not None:
            df.insert(0, "label", list(self.labels))
        if self.score is not None:
            df["score"] = self.score.tolist()
        for k, name in enumerate(self.objectives):
            df[name if name != "score" else "objective_score"] = self.rewards[:, k].tolist()
        if self.gating is not None:
            for k, name in enumerate(self.objectives):
                df[f"gate:{name}"] = self.gating[:, k].tolist()
        for name, values in (self.texts or {}).items():
            df[name if name not in df else f"input_{name}"] = values  # an objective "text"
        return df

    def plot(self) -> Any:
        """A plotly bar chart of the scores (or of each objective)."""
        import plotly.express as px

        df = self.to_dataframe()
        x = df["label"] if "label" in df else df.index.astype(str)
        if self.score is not None:
            return px.bar(df, x=x, y="score", title="Reward score")
        return px.bar(df, x=x, y=self.objectives, barmode="group", title="Rewards per objective")


def sorted_batches(model: RewardModelMixin, encoded: Sequence[EncodedInput], batch_size: int,
                   padding_side: str = "right", progress: bool | None = None,
                   desc: str = "scoring", whole: bool = False
                   ) -> Iterator[tuple[list[int], RewardBatch]]:
    """``(indices into encoded, padded batch)`` in length-sorted batches (longest first), with
    a progress bar when ``progress`` (``None``: past four batches); ``whole``: a PRM's whole
    solutions (:meth:`~tl_reward.model.protocol.RewardModelMixin.collate`)."""
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i].ids))
    show = progress if progress is not None else len(encoded) > 4 * batch_size
    for start in tqdm(range(0, len(order), batch_size), disable=not show, desc=desc,
                      unit="batch"):
        idx = order[start : start + batch_size]
        yield idx, model.collate([encoded[i] for i in idx], padding_side, whole=whole)


def score_inputs(
    model: RewardModelMixin,
    inputs: RewardInput | Sequence[RewardInput],
    batch_size: int = 8,
    padding_side: str = "right",
    pooling: str | None = None,
    progress: bool | None = None,
    labels: Sequence[str] | None = None,
    names: Sequence[str] | None = None,
) -> RewardResult:
    """Score any inputs (see :mod:`tl_reward.model.inputs`) in length-sorted batches; an error
    about an input calls it ``names[i]`` (default ``input i``, see :func:`encode_inputs`)."""
    items = as_items(inputs)
    encoded = encode_inputs(model, items, names)
    k, acc = model.cfg.d_vocab_out, accumulation_dtype(model)
    rewards = torch.zeros(len(encoded), k, dtype=acc)
    scores: torch.Tensor | None = torch.zeros(len(encoded), dtype=acc)
    gating: torch.Tensor | None = None
    for idx, batch in sorted_batches(model, encoded, batch_size, padding_side, progress):
        r, s, g = model.pooled_outputs(batch.tokens, batch.attention_mask, pooling)
        rewards[idx] = r.to(acc).cpu()
        if s is None:
            scores = None
        elif scores is not None:
            scores[idx] = s.to(acc).cpu()
        if g is not None:
            gating = torch.zeros(len(encoded), k, dtype=acc) if gating is None else gating
            gating[idx] = g.to(acc).cpu()
    n_tokens = torch.tensor([len(e.ids) for e in encoded])
    return RewardResult(rewards, list(model.objectives), scores, gating, n_tokens,
                        list(labels) if labels is not None else None,
                        input_texts(items, model.tokenizer))


@dataclass(repr=False)
class PairScores(ShortRepr):
    """Scores of chosen and rejected replies over N preference pairs."""

    chosen: Float[torch.Tensor, " n"]
    rejected: Float[torch.Tensor, " n"]
    pairs: list[PreferencePair]

    @property
    def margin(self) -> Float[torch.Tensor, " n"]:
        """``chosen - rejected`` per pair."""
        return self.chosen - self.rejected

    @property
    def accuracy(self) -> float:
        """Fraction of pairs where the chosen reply scores higher."""
        return float((self.margin > 0).float().mean())

    def to_dataframe(self) -> pd.DataFrame:
        """One row per pair: last prompt turn, both replies, their scores and the margin."""
        return pd.DataFrame({
            "prompt": [p.prompt[-1]["content"] if p.prompt else "" for p in self.pairs],
            "chosen": [p.chosen for p in self.pairs],
            "rejected": [p.rejected for p in self.pairs],
            "chosen_score": self.chosen.tolist(),
            "rejected_score": self.rejected.tolist(),
            "margin": self.margin.tolist(),
        })

    def plot(self) -> Any:
        """Scatter of rejected against chosen score; points above the diagonal are correct."""
        import plotly.express as px

        df = self.to_dataframe()
        fig = px.scatter(df, x="rejected_score", y="chosen_score", hover_data=["prompt"],
                         title=f"Preference pairs (accuracy {self.accuracy:.2f})")
        lo = float(min(df.rejected_score.min(), df.chosen_score.min()))
        hi = float(max(df.rejected_score.max(), df.chosen_score.max()))
        fig.add_shape(type="line", x0=lo, y0=lo, x1=hi, y1=hi, line={"dash": "dash"})
        return fig


def score_pairs(
    model: RewardModelMixin, pairs: Sequence[PreferencePair], objective: str = "score",
    batch_size: int = 8, progress: bool | None = None,
) -> PairScores:
    """Score the chosen and rejected reply of each pair (``objective``: 'score' or a name); an
    error names the pair and the side (:func:`~tl_reward.data.preference.pair_rows`)."""
    convs, names = pair_rows(pairs)
    res = score_inputs(model, convs, batch_size=batch_size, progress=progress, names=names)
    vals = res.values(objective)
    return PairScores(vals[0::2], vals[1::2], list(pairs))
