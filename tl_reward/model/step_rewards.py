"""A process reward model's rewards: one row per (input, step), read in one forward per batch.

Each solution runs once and its reward is read at every selected step's tag
(``pooled_outputs(..., read_at=...)``, the backend's one readout at a set of positions per
sequence). Attention is causal, so this equals scoring each step's prefix alone
(:func:`~tl_reward.model.steps.step_prefix`), which is what the analyses run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch
from jaxtyping import Float

from tl_reward.errors import UnknownObjectiveError
from tl_reward.model.heads import objective_slot
from tl_reward.model.inputs import as_items, encode_inputs, input_texts
from tl_reward.model.readout import accumulation_dtype
from tl_reward.model.scoring import sorted_batches
from tl_reward.model.steps import StepRow, StepSpec, step_indices
from tl_reward.results import ShortRepr

if TYPE_CHECKING:
    from tl_reward.model.protocol import RewardModelMixin


@dataclass(repr=False)
class StepRewardResult(ShortRepr):
    """Step rewards of N selected (input, step) rows.

    Attributes:
        rows: the (input, step) of each row, in input then step order.
        rewards: ``[N, K]`` the head's outputs at each step's tag.
        objectives: the K output names.
        score: ``[N]`` the linear step reward the analyses decompose (class-1 minus class-0
            logit, good minus bad token logit, or the head's single output).
        probability: ``[N]`` the step's probability (``sigmoid(score)``), or ``None`` where
            the format has none.
        steps: each row's step text (``None`` for token-id inputs).
        n_tokens: ``[N]`` ids up to and including the step's tag.
        labels: optional names of the inputs (one per input).
    """

    rows: list[StepRow]
    rewards: Float[torch.Tensor, "n K"]
    objectives: list[str]
    score: Float[torch.Tensor, " n"] | None
    probability: Float[torch.Tensor, " n"] | None
    steps: list[str | None]
    n_tokens: torch.Tensor
    labels: list[str] | None = None
    texts: dict[str, list[str | None]] | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def values(self, objective: int | str = "score") -> Float[torch.Tensor, " n"]:
        """``[N]`` the linear step reward (``"score"``), ``"probability"``, or one output."""
        if objective == "probability":
            if self.probability is None:
                raise UnknownObjectiveError("this step format reports no probability")
            return self.probability
        if objective != "score":
            return self.rewards[:, objective_slot(self.objectives, objective)]
        if self.score is None:
            raise UnknownObjectiveError(f"this head has outputs {self.objectives} and no "
                                        "combined score; pass objective=<name>")
        return self.score

    def to_dataframe(self) -> pd.DataFrame:
        """One row per (input, step): input, label, step, its text, token count, the linear
        reward (``score``), the probability, each output, then the input's texts."""
        df = pd.DataFrame({"input": [r.item for r in self.rows],
                           "step": [r.step for r in self.rows]})
        if self.labels is not None:
            df.insert(1, "label", [self.labels[r.item] for r in self.rows])
        df["step_text"] = self.steps
        df["n_tokens"] = self.n_tokens.tolist()
        if self.score is not None:
            df["score"] = self.score.tolist()
        if self.probability is not None:
            df["probability"] = self.probability.tolist()
        for k, name in enumerate(self.objectives):
            df[name if name not in df else f"output_{name}"] = self.rewards[:, k].tolist()
        for name, values in (self.texts or {}).items():
            df[name if name not in df else f"input_{name}"] = [values[r.item] for r in self.rows]
        return df

    def plot(self) -> Any:
        """A plotly line per input: each step's probability (or linear reward) by step."""
        import plotly.express as px

        df = self.to_dataframe()
        y = "probability" if self.probability is not None else "score"
        df["input"] = df["label"] if "label" in df else df["input"].astype(str)
        return px.line(df, x="step", y=y, color="input", markers=True, hover_data=["step_text"],
                       title=f"Step rewards ({y})")


def score_steps(
    model: RewardModelMixin,
    inputs: Any,
    step: StepSpec = "all",
    batch_size: int = 8,
    padding_side: str = "right",
    progress: bool | None = None,
    labels: Sequence[str] | None = None,
    names: Sequence[str] | None = None,
) -> StepRewardResult:
    """Each selected step's reward of each solution: one forward per batch of solutions, read
    at the selected tags (``pooled_outputs(..., read_at=)``)."""
    fmt = model.step_format
    items = as_items(inputs)
    encoded = encode_inputs(model, items, names)
    chosen = [step_indices(e, step) for e in encoded]
    k, acc = model.cfg.d_vocab_out, accumulation_dtype(model)
    where = {(i, s): n for n, (i, s) in enumerate((i, s) for i in range(len(encoded))
                                                   for s in chosen[i])}
    rewards = torch.zeros(len(where), k, dtype=acc)
    scores: torch.Tensor | None = torch.zeros(len(where), dtype=acc)
    for idx, batch in sorted_batches(model, encoded, batch_size, padding_side, progress,
                                     "scoring steps", whole=True):
        offsets = batch.offsets().tolist()
        pairs = [(r, offsets[r] + encoded[i].read_at[s], where[i, s])
                 for r, i in enumerate(idx) for s in chosen[i]]
        rows_at = torch.tensor([p[0] for p in pairs])
        pos = torch.tensor([p[1] for p in pairs])
        r, s, _ = model.pooled_outputs(batch.tokens, batch.attention_mask, read_at=(rows_at, pos))
        out = [p[2] for p in pairs]
        rewards[out] = r.to(acc).cpu()
        if s is None:
            scores = None
        elif scores is not None:
            scores[out] = s.to(acc).cpu()
    rows = [StepRow(i, s) for i in range(len(encoded)) for s in chosen[i]]
    probability = (torch.sigmoid(scores) if scores is not None and fmt is not None
                   and fmt.probability == "sigmoid" else None)
    steps = [encoded[r.item].steps[r.step] if encoded[r.item].steps else None for r in rows]
    n_tokens = torch.tensor([encoded[r.item].read_at[r.step] + 1 for r in rows])
    return StepRewardResult(rows, rewards, list(model.objectives), scores, probability, steps,
                            n_tokens, list(labels) if labels is not None else None,
                            input_texts(items, model.tokenizer))
