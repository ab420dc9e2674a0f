"""Views of the audit results (probes, distortion, cascade). They take result objects and
arrays, never run an analysis.

Example:
    >>> probe_forest(report).show()
"""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go


def _fmt_p(p: float) -> str:
    return "n/a" if p != p else (f"{p:.2g}" if p >= 1e-3 else f"{p:.1e}")


def probe_forest(report: Any, standardised: bool = False, title: str | None = None) -> Any:
    """Forest plot: per dimension the mean delta and its sign-flip interval (``standardised``:
    in units of the natural-reply sd, no interval), labelled with n, effect size and adjusted p."""
    stats = list(report.stats)
    suffix = "_std" if standardised else ""
    mean = np.array([getattr(s, "mean" + suffix) for s in stats])
    lo = np.array([getattr(s, "ci_low" + suffix) for s in stats])
    hi = np.array([getattr(s, "ci_high" + suffix) for s in stats])
    labels = [f"{s.dimension} (n={s.n})" for s in stats]
    text = [(f"d={s.effect_size:+.2f}" if s.effect_size == s.effect_size else "d undefined")
            + f", p_adj={_fmt_p(s.p_adjusted)}" for s in stats]
    colour = ["#c0392b" if s.p_adjusted <= 0.05 else "#7f8c8d" for s in stats]
    fig = go.Figure(go.Scatter(
        x=mean, y=labels, mode="markers+text", text=text, textposition="top center",
        marker={"color": colour, "size": 10},
        error_x={"type": "data", "symmetric": False, "array": hi - mean, "arrayminus": mean - lo,
                 "color": "#555"},  # the bars would inherit the per-point colour list
        textfont={"color": "#333"}, cliponaxis=False,  # the top label is not cut off
        hovertemplate="%{y}: %{x:.4f}<extra></extra>"))
    fig.add_vline(x=0, line_dash="dash", line_color="black")
    unit = "natural-reply sd" if standardised else "reward units"
    fig.update_layout(
        title=title or f"Probe effects: r(perturbed) - r(neutral), mean and 95% CI ({unit}); "
                       "red: BH-adjusted p <= 0.05",
        xaxis_title=f"mean delta ({unit})", yaxis={"autorange": "reversed"},
        height=120 + 60 * len(stats))
    return fig


def effect_size_forest(report: Any, title: str | None = None) -> Any:
    """Paired effect sizes (mean / sd, ddof 1; no interval); undefined ones marked."""
    stats = list(report.stats)
    es = np.array([s.effect_size for s in stats])
    labels = [f"{s.dimension} (n={s.n})" for s in stats]
    fig = go.Figure(go.Scatter(
        x=np.nan_to_num(es), y=labels, mode="markers",
        marker={"symbol": ["circle" if e == e else "x" for e in es], "size": 10},
        text=[s.effect_reason or "" for s in stats],
        hovertemplate="%{y}: %{x:.3f} %{text}<extra></extra>"))
    fig.add_vline(x=0, line_dash="dash", line_color="black")
    fig.update_layout(title=title or "Paired effect size (mean / sd, ddof 1; no interval); "
                                     "x = undefined (zero spread or n < 2)",
                      xaxis_title="effect size", yaxis={"autorange": "reversed"},
                      height=120 + 50 * len(stats))
    return fig


def distortion_chart(result: Any, title: str | None = None) -> Any:
    """Sensitivity per dimension (natural-sd units, no interval); the Gini index in the title."""
    fig = go.Figure(go.Bar(x=list(result.dimensions), y=np.asarray(result.sensitivity)))
    fig.update_layout(
        title=title or (f"Sensitivity per dimension (mean delta / natural sd); "
                        f"distortion index (Gini of |s|) = {result.index:.3f}, noise floor "
                        f"(null median) {result.null_median:.3f}, excess {result.excess:+.3f}, "
                        f"p = {result.p_value:.3g}, n = {result.n_items} items"),
        yaxis_title="sensitivity (natural-reply sd)")
    return fig


def cascade_heatmap(result: Any, title: str | None = None) -> Any:
    """Heatmap of the pairwise correlations, each cell labelled with r, n and adjusted p."""
    dims = list(result.dimensions)
    k = len(dims)
    z = np.eye(k)
    text = [["" for _ in dims] for _ in dims]
    for row in result.pairs.itertuples():
        i, j = dims.index(row.dim_a), dims.index(row.dim_b)
        z[i, j] = z[j, i] = row.r
        text[i][j] = text[j][i] = f"r={row.r:+.2f}<br>n={row.n}<br>p_adj={_fmt_p(row.p_adjusted)}"
    fig = go.Figure(go.Heatmap(z=z, x=dims, y=dims, zmin=-1, zmax=1, colorscale="RdBu",
                               text=text, texttemplate="%{text}", hoverinfo="text"))
    fig.update_layout(title=title or f"Cascade: {result.kind} r of per-{result.units[:-1]} "
                                     "deltas between dimensions (matched units only)",
                      height=200 + 60 * k, yaxis={"autorange": "reversed"})
    return fig
