"""Plotly views of implicit rewards (per-token contributions, IRM-vs-explicit scatter)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go

from tl_reward.viz.tokens import token_label


def plot_token_contributions(tokens: Sequence[str], contributions: np.ndarray,
                             reward: float) -> Any:
    """Bars of ``beta * (log pi - log pi_ref)`` per response token; they sum to ``reward``."""
    labels = [f"{i}:{token_label(t)}" for i, t in enumerate(tokens)]
    vals = np.asarray(contributions, dtype=float)
    fig = go.Figure(go.Bar(x=labels, y=vals,
                           marker_color=["#2c7bb6" if v >= 0 else "#d7191c" for v in vals]))
    fig.update_layout(title=f"Implicit reward {reward:.3f} by response token",
                      xaxis_title="response token", yaxis_title="beta * log-ratio")
    return fig


def plot_reward_scatter(x: np.ndarray, y: np.ndarray, x_label: str, y_label: str,
                        title: str, text: Sequence[str] | None = None) -> Any:
    """Scatter of two rewards (or reward and utility) over the same items."""
    fig = go.Figure(go.Scatter(x=np.asarray(x), y=np.asarray(y), mode="markers",
                               text=list(text) if text is not None else None, opacity=0.7))
    fig.update_layout(title=title, xaxis_title=x_label, yaxis_title=y_label)
    return fig
