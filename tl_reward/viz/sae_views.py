"""Views of SAE feature results: plotly bars and scatters, circuitsvis feature dashboards."""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tl_reward.viz.html import closed_view
from tl_reward.viz.tokens import token_labels


def attribution_bar(df: pd.DataFrame, b_dec: float, error: float, title: str) -> Any:
    """Horizontal bars: each top feature's contribution, then the ``b_dec`` and error terms."""
    return _bars([f"f{f}" for f in df.feature] + ["b_dec", "error"],
                 [*df.contribution, b_dec, error], title, "contribution to the reward", grey=2)


def pair_difference_bar(df: pd.DataFrame, title: str) -> Any:
    """Bars of each feature's mean chosen-minus-rejected contribution (sorted by magnitude)."""
    hover = [f"favours chosen in {p:.0%} of {n} pairs where active"
             for p, n in zip(df.frac_favours_chosen, df.n_pairs_active, strict=True)]
    return _bars([f"f{f}" for f in df.feature], list(df.mean_difference), title,
                 "mean contribution, chosen - rejected", hover=hover)


def _bars(labels: list[str], values: list[float], title: str, x_title: str, grey: int = 0,
          hover: list[str] | None = None) -> Any:
    """Horizontal bars, first on top: blue at or above 0, red below, the last ``grey`` grey."""
    colors = ["#1f77b4" if v >= 0 else "#d62728" for v in values[:len(values) - grey]]
    fig = go.Figure(go.Bar(x=values, y=labels, orientation="h", hovertext=hover,
                           marker_color=colors + ["#7f7f7f"] * grey))
    fig.update_layout(title=title, xaxis_title=x_title,
                      yaxis={"autorange": "reversed", "type": "category", "dtick": 1},
                      height=max(300, 22 * len(labels)))
    return fig


def ablation_scatter(check: Any) -> Any:
    """Predicted (attribution) against actual (ablation) change, with ``y = x``."""
    pred, act = check.predicted.tolist(), check.actual.tolist()
    lo, hi = min(pred + act + [0.0]), max(pred + act + [0.0])
    text = [f"{check.kind} {i}, feature {f}" for i, f in
            zip(check.item.tolist(), check.feature.tolist(), strict=True)]
    fig = go.Figure([
        go.Scatter(x=pred, y=act, mode="markers", text=text, name="single features"),
        go.Scatter(x=check.joint_predicted.tolist(), y=check.joint_actual.tolist(),
                   mode="markers", marker_symbol="diamond", name="top features together"),
        go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", line={"dash": "dash"}, name="y = x")])
    what = "margin" if check.kind == "pair" else "reward"
    fig.update_layout(
        title=(f"Ablation check at {check.hook_name}: Pearson {check.pearson:.3f}, "
               f"Spearman {check.spearman:.3f}"),
        xaxis_title=f"predicted {what} change ({check.method} attribution)",
        yaxis_title=f"actual {what} change (ablation)")
    return fig


def feature_dashboard(views: list[Any]) -> Any:
    """circuitsvis ``topk_samples``: each feature's top-activating contexts, coloured by its
    activation (one tab per feature)."""
    from circuitsvis.topk_samples import topk_samples

    if not views:
        raise ValueError("no feature views to show")
    toks = [[[token_labels(c) for c in v.examples.context_tokens] or [[""]] for v in views]]
    acts = [[list(v.examples.context_activations) or [[0.0]] for v in views]]
    labels = [f"{v.feature} (align {v.reward_alignment:+.2f}, ablation "
              f"{v.mean_ablation_effect:+.3f})" for v in views]
    return closed_view(topk_samples(tokens=toks, activations=acts, zeroth_dimension_name="SAE",
                                    first_dimension_name="Feature",
                                    zeroth_dimension_labels=[views[0].hook_name],
                                    first_dimension_labels=labels))


def ablation_effect_scatter(view: Any) -> Any:
    """Reward change when the feature is ablated against its max activation, per item."""
    df = view.ablation
    fig = go.Figure(go.Scatter(x=list(df.max_activation), y=list(df.reward_change),
                               mode="markers", text=[f"item {i}" for i in df.item]))
    fig.update_layout(title=f"Feature {view.feature} at {view.hook_name}: ablation effect "
                            f"({view.objective})",
                      xaxis_title="max activation in the item",
                      yaxis_title="reward change when ablated")
    return fig


def feature_summary_bars(summary: pd.DataFrame) -> Any:
    """Per feature: reward alignment (cosine), direct effect per unit, mean ablation effect."""
    labels = [f"f{f}" for f in summary.feature]
    cols = [("reward_alignment", "cosine with reward direction"),
            ("direct_effect_per_unit", "direct effect per unit"),
            ("mean_ablation_effect", "mean reward change, ablated")]
    fig = make_subplots(rows=1, cols=3, subplot_titles=[t for _, t in cols])
    for c, (key, _) in enumerate(cols, start=1):
        fig.add_trace(go.Bar(x=labels, y=list(summary[key]), showlegend=False), row=1, col=c)
    fig.update_layout(title="SAE features and the reward", height=350)
    fig.update_xaxes(type="category", tickmode="linear", dtick=1)  # every feature labelled
    return fig
