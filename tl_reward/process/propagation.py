"""How a changed step moves the rewards of the steps after it.

Two solutions with the same number of steps -- a clean one and one whose step ``j`` is
corrupted (a wrong number, a swapped word) -- are scored at every step, each in one forward.
Step ``k``'s reward change ``r_k(corrupt) - r_k(clean)`` is the total effect of the change on
step ``k``: zero before the first changed step (attention is causal), and after it what the
later steps read from the changed one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from jaxtyping import Float

from tl_reward.errors import TLRewardError
from tl_reward.model.steps import step_spans
from tl_reward.results import ShortRepr


@dataclass(repr=False)
class StepPropagation(ShortRepr):
    """Step rewards of a clean and a corrupted solution.

    Attributes:
        clean, corrupt: ``[n_steps]`` each step's linear reward.
        changed: the steps whose ids differ.
        steps: the clean solution's step texts.
        objective: what was read (``"score"``, ``"probability"`` or an output name).
    """

    clean: Float[torch.Tensor, " steps"]
    corrupt: Float[torch.Tensor, " steps"]
    changed: list[int]
    steps: list[str | None]
    objective: str

    @property
    def effect(self) -> Float[torch.Tensor, " steps"]:
        """``corrupt - clean`` per step."""
        return self.corrupt - self.clean

    def headline(self) -> dict[str, Any]:
        return {"changed": self.changed, "effect": self.effect}

    def to_dataframe(self) -> pd.DataFrame:
        """One row per step: its text, whether it changed, both rewards and the effect."""
        return pd.DataFrame({"step": range(len(self.clean)), "step_text": self.steps,
                             "changed": [k in self.changed for k in range(len(self.clean))],
                             "clean": self.clean.tolist(), "corrupt": self.corrupt.tolist(),
                             "effect": self.effect.tolist()})

    def plot(self) -> Any:
        """Bars of the effect per step, changed steps marked."""
        import plotly.express as px

        df = self.to_dataframe()
        df["kind"] = df["changed"].map({True: "changed step", False: "later/earlier step"})
        return px.bar(df, x="step", y="effect", color="kind", hover_data=["step_text"],
                      title=f"Effect of the change on each step's reward ({self.objective})")


def step_propagation(model: Any, clean: Any, corrupt: Any, objective: str = "score",
                     padding_side: str = "right") -> StepPropagation:
    """Score both solutions at every step and report the effect of the changed steps on each
    (see the module doc). The solutions must have the same prompt and number of steps."""
    a, b = model.encode_steps([clean, corrupt])[0]
    if len(a.read_at) != len(b.read_at):
        raise TLRewardError(f"the clean solution has {len(a.read_at)} steps and the corrupted "
                            f"one {len(b.read_at)}; change a step's text, not the step count")
    (pa, *sa), (pb, *sb) = step_spans(a), step_spans(b)
    if a.ids[slice(*pa)] != b.ids[slice(*pb)]:
        raise TLRewardError("the two solutions differ before the reply; they must share the "
                            "prompt")
    changed = [k for k, (x, y) in enumerate(zip(sa, sb, strict=True))
               if a.ids[slice(*x)] != b.ids[slice(*y)]]
    res = model.rewards([a, b], step="all", padding_side=padding_side)
    vals = res.values(objective)
    n = len(a.read_at)
    return StepPropagation(vals[:n], vals[n:], changed, list(a.steps) or [None] * n, objective)
