"""Plotly figures of concept analyses: alignment bars and steering curves (arrays in)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go


def concept_alignment_figure(rows: Sequence[dict[str, Any]],
                             title: str = "Concept alignment at the head") -> Any:
    """Bars of the mean slope (reward change per unit of concept spread) with its CI, one per
    (concept, objective); hover shows the cosines and the separability."""
    labels = [f"{r['concept']} / {r['objective']}" for r in rows]
    slope = np.array([r["slope"] for r in rows])
    lo = np.array([r["slope_ci_low"] for r in rows])
    hi = np.array([r["slope_ci_high"] for r in rows])
    hover = [f"cos(head) {r['cosine_head']:+.3f}<br>cos(local) {r['cosine_local']:+.3f}<br>"
             + (f"separability {r['separability']:.3f} [{r['separability_ci_low']:.3f}, "
                f"{r['separability_ci_high']:.3f}]" if "separability" in r else "") for r in rows]
    fig = go.Figure(go.Bar(x=labels, y=slope, hovertext=hover,
                           error_y={"type": "data", "symmetric": False, "array": hi - slope,
                                    "arrayminus": slope - lo}))
    fig.update_layout(title=title, yaxis_title="reward change per unit of concept spread")
    return fig


def steering_figure(alphas: np.ndarray, change: np.ndarray, predicted_slope: np.ndarray,
                    concept: str, objective: str) -> Any:
    """Mean reward change (with the 10-90% band over inputs) against the steering strength,
    and the first-order prediction ``alpha * mean slope``."""
    order = np.argsort(alphas)
    a = np.asarray(alphas)[order]
    c = np.asarray(change)[order]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=a, y=np.quantile(c, 0.9, axis=1), mode="lines",
                             line={"width": 0}, showlegend=False))
    fig.add_trace(go.Scatter(x=a, y=np.quantile(c, 0.1, axis=1), mode="lines", fill="tonexty",
                             line={"width": 0}, name="10-90% of inputs"))
    fig.add_trace(go.Scatter(x=a, y=c.mean(1), mode="lines+markers", name="mean change"))
    fig.add_trace(go.Scatter(x=a, y=a * float(np.mean(predicted_slope)), mode="lines",
                             line={"dash": "dot"}, name="first-order prediction"))
    fig.update_layout(title=f"Steering '{concept}' -> {objective}",
                      xaxis_title="alpha (units of the concept's spread)",
                      yaxis_title="reward change")
    return fig
