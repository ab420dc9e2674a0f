"""Which layers did tuning move: the sum of Frobenius norms of parameter differences per layer."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from tl_reward.errors import TLRewardError

_LAYER = re.compile(r"(?:^|\.)(?:layers|blocks|h)\.(\d+)\.")


@dataclass
class LayerChange:
    """Per-layer parameter change of a tuned model against its reference.

    Attributes:
        layers: layer indices, ascending.
        change: ``sum_p ||W_p(tuned) - W_p(ref)||_F`` over the layer's parameters.
        relative: ``change / sum_p ||W_p(ref)||_F``.
        by_parameter: one row per changed parameter (name, layer, Frobenius norm of the change).
    """

    layers: list[int]
    change: np.ndarray
    relative: np.ndarray
    by_parameter: pd.DataFrame

    def top(self, k: int = 2) -> list[int]:
        """The ``k`` layers that moved most (largest first)."""
        return [self.layers[i] for i in np.argsort(-self.change, kind="stable")[:k]]

    def to_dataframe(self) -> pd.DataFrame:
        """One row per layer: change, relative change, rank (1 = moved most)."""
        rank = np.empty(len(self.layers), dtype=int)
        rank[np.argsort(-self.change, kind="stable")] = np.arange(1, len(self.layers) + 1)
        return pd.DataFrame({"layer": self.layers, "change": self.change,
                             "relative_change": self.relative, "rank": rank})

    def plot(self) -> Any:
        """Bar chart of the per-layer change (plotly)."""
        import plotly.graph_objects as go

        fig = go.Figure(go.Bar(x=self.layers, y=self.change))
        fig.update_layout(title="Parameter change per layer (sum of Frobenius norms)",
                          xaxis_title="layer", yaxis_title="sum ||dW||_F")
        return fig


def parameter_change(policy: Any, reference: Any) -> LayerChange:
    """Per-layer ``sum ||W(policy) - W(reference)||_F`` over parameters named ``...layers.L...``.

    Both models must have the same parameter names and shapes (two HF models, or two
    TransformerLens models built the same way). Differences are taken in float64.
    """
    ref = dict(reference.named_parameters())
    rows = []
    for name, p in policy.named_parameters():
        m = _LAYER.search(name)
        if m is None:
            continue
        if name not in ref or ref[name].shape != p.shape:
            raise TLRewardError(f"parameter {name!r} differs in name or shape between the "
                                "models; compare a tuned model with its own reference")
        q = ref[name].detach().to(p.device)
        with torch.no_grad():
            diff = float((p.detach().double() - q.double()).norm())
            norm = float(q.double().norm())
        rows.append({"parameter": name, "layer": int(m.group(1)), "change": diff, "norm": norm})
    if not rows:
        raise TLRewardError("no per-layer parameters found (names with layers.<i> / blocks.<i>)")
    df = pd.DataFrame(rows)
    agg = df.groupby("layer")[["change", "norm"]].sum().sort_index()
    return LayerChange(agg.index.tolist(), agg["change"].to_numpy(),
                       (agg["change"] / agg["norm"]).to_numpy(), df.drop(columns="norm"))
