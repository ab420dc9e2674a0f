"""Views of the audit results (probes, distortion, cascade). They take result objects and
arrays, never run an analysis.

Example:
    >>> probe_forest(report).show()
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _fmt_p(p: float) -> str:
    return "n/a" if p != p else (f"{p:.2g}" if p >= 1e-3 else f"{p:.1e}")


def probe_forest(report: Any, standardised: bool = False, title: str | None = None) -> Any:
    """Forest plot: per dimension the mean delta and its bootstrap CI (or, ``standardised``,
    in units of the natural-reply sd), labelled with n, effect size and adjusted p."""
    import plotly.graph_objects as go

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
        error_x={"type": "data", "symmetric": False, "array": hi - mean, "arrayminus": mean - lo},
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
    """Paired effect sizes (mean / sd, ddof 1) with bootstrap CIs; undefined ones marked."""
    import plotly.graph_objects as go

    stats = list(report.stats)
    es = np.array([s.effect_size for s in stats])
    lo = np.array([s.effect_ci_low for s in stats])
    hi = np.array([s.effect_ci_high for s in stats])
    labels = [f"{s.dimension} (n={s.n})" for s in stats]
    fig = go.Figure(go.Scatter(
        x=np.nan_to_num(es), y=labels, mode="markers",
        marker={"symbol": ["circle" if e == e else "x" for e in es], "size": 10},
        error_x={"type": "data", "symmetric": False, "array": np.nan_to_num(hi - es),
                 "arrayminus": np.nan_to_num(es - lo)},
        text=[s.effect_reason or "" for s in stats],
        hovertemplate="%{y}: %{x:.3f} %{text}<extra></extra>"))
    fig.add_vline(x=0, line_dash="dash", line_color="black")
    fig.update_layout(title=title or "Paired effect size (mean / sd, ddof 1) with 95% bootstrap "
                                     "CI; x = undefined (zero spread or n < 2)",
                      xaxis_title="effect size", yaxis={"autorange": "reversed"},
                      height=120 + 50 * len(stats))
    return fig
