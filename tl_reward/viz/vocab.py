"""Plotly figures for vocabulary sweeps and their analyses (optimal and pessimal tokens)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
from plotly.subplots import make_subplots

if TYPE_CHECKING:
    from tl_reward.sweep.agreement import ModelAgreement
    from tl_reward.sweep.distribution import ScoreDistribution
    from tl_reward.sweep.extremes import TokenExtremes
    from tl_reward.sweep.framing import PromptFraming
    from tl_reward.sweep.frequency import FrequencyBias
    from tl_reward.sweep.identity import IdentityAudit
    from tl_reward.sweep.roundtrip import RoundTripReport
    from tl_reward.sweep.valence import ValenceAsymmetry


def plot_extremes(extremes: TokenExtremes) -> Any:
    """Top (green) and bottom (red) tokens, one panel per prompt."""
    n = len(extremes.labels)
    fig = make_subplots(rows=1, cols=n, subplot_titles=extremes.labels, shared_xaxes=False)
    df = extremes.to_dataframe()
    for p, lab in enumerate(extremes.labels):
        part = df[df["prompt"] == lab]
        top = part[part["side"] == "top"].iloc[::-1]  # tokens by repr: spaces, \n visible
        bottom = part[part["side"] == "bottom"]
        for side, rows, colour in (("top", top, "#2a9d8f"), ("bottom", bottom, "#e76f51")):
            fig.add_bar(x=rows["value"], y=[f"{t!r} #{i}" for t, i in
                                            zip(rows["token"], rows["token_id"], strict=True)],
                        orientation="h", marker_color=colour, name=side, showlegend=p == 0,
                        row=1, col=p + 1)
    k = len(extremes.top_ids[0]) if len(extremes.top_ids) else 0
    fig.update_layout(title=f"Top and bottom {k} of {extremes.n} tokens ({extremes.objective})",
                      height=max(400, 28 * 2 * k), barmode="overlay")
    return fig


def plot_distribution(dist: ScoreDistribution, bins: int = 80) -> Any:
    """Overlaid histograms of each prompt's values."""
    fig = go.Figure()
    for p, lab in enumerate(dist.labels):
        s = dist.stats.loc[lab]
        fig.add_histogram(x=dist.values[:, p].numpy(), nbinsx=bins, opacity=0.55,
                          name=f"{lab} (skew {s['skew']:.2f})")
    fig.update_layout(barmode="overlay", title=f"Distribution of {dist.objective} over the "
                      "vocabulary", xaxis_title=dist.objective, yaxis_title="tokens")
    return fig


def plot_agreement(agree: ModelAgreement, metric: str = "kendall_tau_b") -> Any:
    """Heatmap of one agreement measure and the MDS map of the models."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=(metric, "MDS of 1 - " + metric))
    mat = getattr(agree, metric).numpy()
    fig.add_heatmap(z=mat, x=agree.models, y=agree.models, zmin=-1, zmax=1,
                    colorscale="RdBu", text=np.round(mat, 3), texttemplate="%{text}",
                    row=1, col=1)
    xy = agree.mds(metric)
    fig.add_scatter(x=xy["x"], y=xy["y"], text=xy["model"], mode="markers+text",
                    textposition="top center", showlegend=False, row=1, col=2)
    fig.update_layout(title="Agreement between reward models on the shared vocabulary")
    return fig


def plot_framing(framing: PromptFraming, a: int | str = 0, b: int | str = -1) -> Any:
    """Heatmap of Kendall's tau-b between prompts, and percentiles under ``a`` against ``b``."""
    i, j = (framing.labels.index(x) if isinstance(x, str) else x % len(framing.labels)
            for x in (a, b))
    fig = make_subplots(rows=1, cols=2, subplot_titles=(
        "Kendall tau-b", f"percentile: {framing.labels[i]} vs {framing.labels[j]}"))
    mat = framing.kendall_tau_b.numpy()
    fig.add_heatmap(z=mat, x=framing.labels, y=framing.labels, zmin=-1, zmax=1,
                    colorscale="RdBu", text=np.round(mat, 3), texttemplate="%{text}",
                    row=1, col=1)
    fig.add_scattergl(x=framing.percentiles[:, i].numpy(), y=framing.percentiles[:, j].numpy(),
                      mode="markers", marker={"size": 3, "opacity": 0.4},
                      text=[repr(t) for t in framing.tokens], showlegend=False, row=1, col=2)
    fig.update_layout(title="Framing: one model across prompts")
    return fig


def plot_valence(asym: ValenceAsymmetry) -> Any:
    """Value against valence per word, with the positive and negative fits."""
    w = asym.words
    rng = np.random.default_rng(0)
    fig = go.Figure()
    fig.add_scattergl(x=w["valence"] + rng.uniform(-0.15, 0.15, len(w)), y=w["value"],
                      mode="markers", text=w["word"], marker={"size": 4, "opacity": 0.5},
                      name="words")
    for side, fit, xs in (("positive", asym.positive, np.array([1, 5])),
                          ("negative", asym.negative, np.array([-5, -1]))):
        fig.add_scatter(x=xs, y=fit["intercept"] + fit["valence"] * xs, mode="lines",
                        name=f"{side}: slope {fit['valence']:.3f}")
    fig.add_hline(y=asym.neutral_mean, line_dash="dot", annotation_text="words not in lexicon")
    fig.update_layout(title=f"Valence asymmetry ({asym.prompt}; slope ratio neg/pos "
                      f"{asym.slope_ratio:.2f})", xaxis_title="AFINN valence",
                      yaxis_title=f"{asym.objective} ({asym.scale})")
    return fig


def plot_frequency(freq: FrequencyBias) -> Any:
    """Value against Zipf frequency, coloured by valence, with the controlled slope."""
    w = freq.words
    fig = px.scatter(w, x="zipf", y="value", color="valence", hover_name="word",
                     color_continuous_scale="RdBu", render_mode="webgl", opacity=0.5)
    xs = np.array([w["zipf"].min(), w["zipf"].max()])
    c = freq.controlled
    fig.add_scatter(x=xs, y=c["intercept"] + c["zipf"] * xs, mode="lines",
                    name=f"slope {c['zipf']:.3f} per Zipf (valence 0)")
    fig.update_layout(title=f"Frequency bias ({freq.prompt})", xaxis_title="Zipf frequency",
                      yaxis_title=f"{freq.objective} ({freq.scale})")
    return fig


def plot_identity(audit: IdentityAudit) -> Any:
    """Percentile of each term's tokens, by group and prompt."""
    df = audit.by_term()
    fig = px.strip(df, x="group", y="mean", color="prompt", hover_name="term",
                   labels={"mean": "percentile (0 = worst, 100 = best)"})
    fig.add_hline(y=50, line_dash="dot")
    fig.update_layout(title="Identity terms: percentile among all swept tokens",
                      yaxis_range=[0, 100])
    return fig


def plot_roundtrip(report: RoundTripReport) -> Any:
    """How many tokens survive the text path; scores of both paths when computed."""
    s = report.summary()
    counts = s.loc[["text path identical to id path", "BOS duplicated",
                    "token did not survive"]].reset_index(names="outcome")
    fig = px.bar(pd.DataFrame(counts), x="outcome", y="share", text="count",
                 title=f"Round trip via the {report.path!r} text path "
                       f"({len(report.tokens)} tokens)")
    fig.update_yaxes(range=[0, 1])
    return fig
