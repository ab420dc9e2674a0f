"""Plotly figures of the reward lens: per-layer curves, differential lens, tuned-lens R^2."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
import torch


def lens_figure(values: dict[str, torch.Tensor], layer_names: Sequence[str],
                title: str = "Reward lens", labels: Sequence[str] | None = None) -> Any:
    """One line per input and convention: ``values[conv]`` is ``[N, L + 1]``."""
    fig = go.Figure()
    dash = {"frozen": "solid", "recompute": "dot"}
    for conv, vals in values.items():
        for i in range(vals.shape[0]):
            name = f"{labels[i] if labels else f'input {i}'} ({conv})"
            fig.add_trace(go.Scatter(x=list(layer_names), y=vals[i].tolist(), mode="lines",
                                     name=name, line={"dash": dash.get(conv, "dash")}))
    fig.update_layout(title=title, xaxis_title="residual stream after", yaxis_title="reward")
    return fig


def differential_figure(diff: torch.Tensor, crystallisation: torch.Tensor,
                        layer_names: Sequence[str], title: str = "Differential reward lens"
                        ) -> Any:
    """``D_l`` per pair (``[N, L + 1]``) with each pair's crystallisation layer marked."""
    fig = go.Figure()
    for i in range(diff.shape[0]):
        fig.add_trace(go.Scatter(x=list(layer_names), y=diff[i].tolist(), mode="lines",
                                 name=f"pair {i}"))
        c = int(crystallisation[i])
        if c >= 0:
            fig.add_trace(go.Scatter(x=[layer_names[c]], y=[float(diff[i, c])], mode="markers",
                                     marker={"symbol": "star", "size": 12}, showlegend=False,
                                     name=f"pair {i} crystallises"))
    fig.add_hline(y=0, line={"color": "grey", "width": 1})
    fig.update_layout(title=title, xaxis_title="residual stream after",
                      yaxis_title="r(chosen) - r(rejected)")
    return fig


def r2_figure(curves: dict[str, torch.Tensor], layer_names: Sequence[str],
              title: str = "Held-out R^2") -> Any:
    """R^2 per layer for several lenses (clipped below at -1 for readability)."""
    fig = go.Figure()
    for name, vals in curves.items():
        fig.add_trace(go.Scatter(x=list(layer_names), y=vals.clamp(min=-1).tolist(),
                                 mode="lines+markers", name=name))
    fig.update_layout(title=title, xaxis_title="residual stream after",
                      yaxis_title="R^2 (held out, clipped at -1)", yaxis_range=[-1.05, 1.05])
    return fig
