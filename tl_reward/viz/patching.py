"""Plotly figures of patching: effect maps, and the faithfulness summary."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
import torch

#: published reward-lens means (|DRA| vs |whole-sublayer noising|)
PUBLISHED = {"Skywork-Reward-Llama-3.1-8B-v0.2": -0.256, "ArmoRM": -0.027}


def heatmap(values: torch.Tensor, x_name: str, y_name: str, title: str,
            x_labels: Sequence[Any] | None = None, y_labels: Sequence[Any] | None = None,
            zlabel: str = "effect") -> Any:
    """A 2-D heatmap on a diverging scale centred at 0; both axes categorical (a tick per row or
    column index, never a half layer), labelled ``0..n-1`` where no labels are given."""
    vals = values.detach().float().numpy()
    lim = float(abs(vals).max()) or 1.0
    xs, ys = ([str(v) for v in (labels if labels is not None else range(n))]
              for labels, n in ((x_labels, vals.shape[1]), (y_labels, vals.shape[0])))
    fig = px.imshow(vals, color_continuous_scale="RdBu", zmin=-lim, zmax=lim, aspect="auto",
                    origin="lower", labels={"x": x_name, "y": y_name, "color": zlabel},
                    x=xs, y=ys, title=title)
    fig.update_xaxes(type="category" if len(set(xs)) == len(xs) else "-")
    fig.update_yaxes(type="category" if len(set(ys)) == len(ys) else "-")
    return fig


def patching_figure(result: Any) -> Any:
    """The figure of a :class:`~tl_reward.analysis.patching.PatchingResult`."""
    eff = result.effect
    title = (f"{result.mode} patching of {result.site} ({result.objective}; "
             f"clean margin {result.delta:+.3f})")
    layers = [str(x) for x in result.layers]
    if eff.ndim == 1:
        return px.bar(x=layers, y=eff.tolist(), labels={"x": "layer", "y": "normalised effect"},
                      title=title)
    if eff.ndim == 3:  # layer x head x position
        rows = [f"L{la}.H{h}" for la in result.layers for h in result.units]
        return heatmap(eff.reshape(-1, eff.shape[-1]), "position", "head", title,
                       result.position_labels, rows)
    x_name = result.dims[1]
    x_labels = result.position_labels if x_name == "position" else (
        [str(u) for u in result.units] if result.units is not None else None)
    return heatmap(eff, x_name, "layer", title, x_labels, layers)


def faithfulness_figure(summary: pd.DataFrame, title: str = "Faithfulness") -> Any:
    """Mean Spearman rho per (observational, causal) pairing with its sign-flip CI; the
    published reward-lens values are drawn as reference lines."""
    fig = go.Figure()
    for kind, sub in summary.groupby("kind", sort=False):
        x = [f"{o} vs {c}" for o, c in zip(sub.observational, sub.causal, strict=True)]
        fig.add_trace(go.Scatter(
            x=x, y=sub.mean_rho, mode="markers", name=f"{kind} scores",
            error_y={"type": "data", "symmetric": False,
                     "array": (sub.ci_high - sub.mean_rho).tolist(),
                     "arrayminus": (sub.mean_rho - sub.ci_low).tolist()}))
    for name, val in PUBLISHED.items():
        fig.add_hline(y=val, line={"dash": "dot", "color": "grey"},
                      annotation_text=f"published |DRA| vs |noising|, {name}: {val}")
    fig.add_hline(y=0, line={"color": "black", "width": 1})
    fig.update_layout(title=title, yaxis_title="mean Spearman rho (95% CI)",
                      yaxis_range=[-1.05, 1.05])
    return fig
