"""Plotly figures of direct reward attribution: layer x head heatmaps, top components."""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.express as px
import torch

from tl_reward.viz.patching import heatmap


def head_heatmap(values: torch.Tensor, title: str = "Per-head contribution",
                 zlabel: str = "reward") -> Any:
    """A ``[layer, head]`` heatmap on a diverging scale centred at 0, a tick per layer."""
    return heatmap(values, "head", "layer", title, zlabel=zlabel)


def component_bar(table: pd.DataFrame, title: str = "Top components",
                  value: str = "contribution") -> Any:
    """Horizontal bars of a ``component`` / ``value`` table (e.g. ``top_components``)."""
    df = table.iloc[::-1]
    fig = px.bar(df, x=value, y="component", orientation="h", title=title,
                 color=df[value] > 0, color_discrete_map={True: "#2166ac", False: "#b2182b"})
    fig.update_layout(showlegend=False)
    return fig
