"""Plotly heatmap of a reward-term conflict matrix (arrays in, figure out)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go


def conflict_matrix_figure(matrix: np.ndarray, terms: Sequence[str], view: str,
                           labels: dict[tuple[str, str], str] | None = None) -> Any:
    """Symmetric ``[T, T]`` matrix on a diverging scale centred at 0 (cosines and correlations
    in [-1, 1]; a disagreement share in [0, 1] is shown on the same scale); ``labels[(a, b)]``
    (e.g. verdict and interval) appear on hover."""
    labels = labels or {}
    t = list(terms)
    text = [[labels.get((a, b)) or labels.get((b, a)) or "" for b in t] for a in t]
    fig = go.Figure(go.Heatmap(z=np.asarray(matrix), x=t, y=t, zmin=-1, zmax=1,
                               colorscale="RdBu", text=text,
                               texttemplate="%{z:.2f}",
                               hovertemplate="%{y} vs %{x}: %{z:.3f}<br>%{text}<extra></extra>"))
    fig.update_layout(title=f"Reward-term conflict: {view}", yaxis={"autorange": "reversed"})
    return fig
