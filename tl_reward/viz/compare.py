"""Plotly figures for model comparisons: permutation nulls and layer x layer similarity maps."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots


def plot_permutation_null(null: np.ndarray, observed: float, measure: str, p_value: float
                          ) -> Any:
    """Histogram of a permutation null with the observed value as a vertical line."""
    fig = go.Figure()
    fig.add_histogram(x=np.asarray(null), nbinsx=40, name="null (rows of Y permuted)")
    fig.add_vline(x=observed, line_color="#e76f51", line_width=3,
                  annotation_text=f"observed {observed:.3f}, p = {p_value:.3g}")
    fig.update_layout(title=f"{measure}: permutation null", xaxis_title=measure,
                      yaxis_title="permutations", showlegend=False)
    return fig


def plot_layer_maps(maps: dict[str, np.ndarray], rows: Sequence[str], cols: Sequence[str],
                    row_title: str, col_title: str, title: str,
                    zmin: float | None = -1.0, zmax: float | None = 1.0) -> Any:
    """One heatmap per named ``[rows, cols]`` matrix, side by side, shared colour scale."""
    names = list(maps)
    fig = make_subplots(rows=1, cols=len(names), subplot_titles=names,
                        horizontal_spacing=0.08)
    for i, name in enumerate(names):
        fig.add_heatmap(z=np.asarray(maps[name], dtype=float), x=list(cols), y=list(rows),
                        zmin=zmin, zmax=zmax, colorscale="RdBu_r", showscale=i == len(names) - 1,
                        hovertemplate=f"{row_title} %{{y}}<br>{col_title} %{{x}}<br>"
                                      f"{name} %{{z:.3f}}<extra></extra>",
                        row=1, col=i + 1)
        fig.update_xaxes(title_text=col_title, type="category", row=1, col=i + 1)  # whole layers
        fig.update_yaxes(title_text=row_title, type="category", row=1, col=i + 1)
    fig.update_layout(title=title, height=450, width=max(500, 420 * len(names)))
    return fig


def plot_behaviour(table: Any, rewards: dict[str, np.ndarray]) -> Any:
    """The first two models' rewards against each other (left) and agreement measures per model
    pair with CIs (right, beside the legend of model pairs)."""
    names = list(rewards)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.4, 0.6],
                        subplot_titles=[f"Rewards: {names[0]} vs {names[1]}"
                                        if len(names) > 1 else "Rewards",
                                        "Agreement between models"])
    if len(table):
        for (a, b), part in table.groupby(["model_a", "model_b"], sort=False):
            lo = (part["value"] - part["ci_low"]).fillna(0).clip(lower=0)
            hi = (part["ci_high"] - part["value"]).fillna(0).clip(lower=0)
            fig.add_bar(x=part["measure"], y=part["value"], name=f"{a} / {b}",
                        error_y={"type": "data", "array": hi, "arrayminus": lo}, row=1, col=2)
    if len(names) > 1:
        fig.add_scatter(x=rewards[names[0]], y=rewards[names[1]], mode="markers",
                        name="corpus items", showlegend=False, row=1, col=1)
        fig.update_xaxes(title_text=names[0], row=1, col=1)
        fig.update_yaxes(title_text=names[1], row=1, col=1)
    fig.update_layout(title="Behavioural agreement", height=480, width=1100, barmode="group",
                      legend_title_text="model pair")
    return fig
