"""Which SAE features drive a reward model's preferences, and what each one is.

* :func:`top_features`: rank features by their chosen-minus-rejected contribution over a set of
  preference pairs, per objective (exact at the final residual, gradient elsewhere).
* :func:`feature_views`: for chosen features, in one pass over a corpus:

  - **reward alignment**: the cosine between the feature's decoder direction ``d_i`` and the
    objective's reward direction ``w`` (centred for LayerNorm; ArmoRM's ``w_eff(x)`` averaged
    over the corpus), and its direct effect per unit activation at the pooled token,
    ``d_i . w / s`` (median over the corpus). For an SAE before the last block this is the
    direct path only; later blocks can amplify or cancel it, which the ablation measures;
  - **top-activating tokens** over the corpus, with context (circuitsvis ``topk_samples``);
  - **effect when ablated**: the measured reward change when the feature is zeroed at every
    position (error node on) in each corpus item where it fires.

Example:
    >>> top = top_features(model, sae, pairs, k=10)
    >>> views = feature_views(model, sae, top.features[:5], corpus)
    >>> views[0].summary(); views.dashboard()
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from tl_reward.model.inputs import as_items, cached_batches, encode_inputs
from tl_reward.model.readout import ObjectiveSpec, resolve_objectives, reward_readout
from tl_reward.results import ShortRepr
from tl_reward.sae.ablation import ablate_rows
from tl_reward.sae.attribution import PairSAEAttribution, differential_sae_attribution
from tl_reward.sae.splice import (
    SAEError,
    as_sae_model,
    check_affine_sae,
    check_sae,
    decoder_directions,
    final_hook,
)


@dataclass(repr=False)
class TopFeatures(ShortRepr):
    """Features ranked by how much they separate chosen from rejected replies.

    Attributes:
        table: one row per (objective, rank): feature, mean |difference|, mean difference,
            share of pairs (where active) in which it favours chosen, pairs active.
        attribution: the full :class:`~tl_reward.sae.attribution.PairSAEAttribution`.
    """

    table: pd.DataFrame
    attribution: PairSAEAttribution

    @property
    def features(self) -> list[int]:
        """Feature ids of the first objective, best first."""
        first = self.table[self.table.objective == self.table.objective.iloc[0]]
        return [int(f) for f in first.feature]

    def to_dataframe(self) -> pd.DataFrame:
        return self.table.copy()

    def plot(self, objective: int | str = 0) -> Any:
        """Bars of each top feature's mean chosen-minus-rejected contribution."""
        return self.attribution.plot(k=len(self.features), objective=objective)


def top_features(
    model: Any, sae: Any, pairs: Any, k: int = 20, objectives: ObjectiveSpec = None,
    method: str = "auto", batch_size: int = 8, progress: bool | None = None,
) -> TopFeatures:
    """The ``k`` features with the largest mean ``|a_i(chosen) - a_i(rejected)|`` over
    ``pairs``, for every requested objective (see :func:`differential_sae_attribution`)."""
    pa = differential_sae_attribution(model, sae, pairs, objectives=objectives, method=method,
                                      batch_size=batch_size, progress=progress)
    tables = {obj: pa.top_features(k, obj) for obj in pa.objectives}
    return TopFeatures(pd.concat(tables, names=["objective", "rank"]).reset_index(), pa)


@dataclass(repr=False)
class FeatureView(ShortRepr):
    """One SAE feature: what it reads, how it bears on the reward, what ablating it does.

    Attributes:
        feature, hook_name, objective: what is described.
        reward_alignment: cosine of the decoder direction with the reward direction.
        direct_effect_per_unit: ``d_i . w / s`` at the pooled token (median over the corpus):
            the reward change per unit of activation through the direct path.
        frequency: share of corpus tokens where the feature fires.
        mean_activation: mean activation where it fires.
        examples: top-activating tokens: item, position, token, activation, context tokens and
            their activations.
        ablation: per corpus item where it fires: max activation, reward change when ablated.
    """

    feature: int
    hook_name: str
    objective: str
    reward_alignment: float
    direct_effect_per_unit: float
    frequency: float
    mean_activation: float
    examples: pd.DataFrame
    ablation: pd.DataFrame

    @property
    def mean_ablation_effect(self) -> float:
        """Mean reward change when ablated, over the items where the feature fires."""
        return float(self.ablation.reward_change.mean()) if len(self.ablation) else 0.0

    def summary(self) -> pd.DataFrame:
        """One-row table of the scalar facts."""
        return pd.DataFrame([{
            "feature": self.feature, "hook": self.hook_name, "objective": self.objective,
            "reward_alignment": self.reward_alignment,
            "direct_effect_per_unit": self.direct_effect_per_unit,
            "frequency": self.frequency, "mean_activation": self.mean_activation,
            "mean_ablation_effect": self.mean_ablation_effect,
            "n_items_ablated": len(self.ablation),
            "top_tokens": ", ".join(repr(t) for t in self.examples.token.head(5)),
        }])

    def to_dataframe(self) -> pd.DataFrame:
        """The top-activating examples."""
        return self.examples.copy()

    def dashboard(self) -> Any:
        """circuitsvis view of the top-activating contexts."""
        from tl_reward.viz.sae_views import feature_dashboard

        return feature_dashboard([self])

    def plot(self) -> Any:
        """Reward change when ablated against the feature's max activation, per item."""
        from tl_reward.viz.sae_views import ablation_effect_scatter

        return ablation_effect_scatter(self)


class FeatureViews(list[FeatureView]):
    """Several :class:`FeatureView` s with a combined summary and dashboard."""

    def summary(self) -> pd.DataFrame:
        return pd.concat([v.summary() for v in self], ignore_index=True)

    def to_dataframe(self) -> pd.DataFrame:
        return self.summary()

    def dashboard(self) -> Any:
        """One circuitsvis ``topk_samples`` view with a tab per feature."""
        from tl_reward.viz.sae_views import feature_dashboard

        return feature_dashboard(list(self))

    def plot(self) -> Any:
        """Bars: reward alignment, direct effect per unit and mean ablation effect."""
        from tl_reward.viz.sae_views import feature_summary_bars

        return feature_summary_bars(self.summary())


@dataclass
class _Acc:
    """Running per-feature statistics over the corpus."""

    n_tokens: int = 0
    fired: torch.Tensor | None = None
    act_sum: torch.Tensor | None = None
    top: list[list[tuple[float, int, int]]] = field(default_factory=list)
    item_max: list[dict[int, float]] = field(default_factory=list)
    traces: dict[int, torch.Tensor] = field(default_factory=dict)
    rewards: dict[int, float] = field(default_factory=dict)
    cos: list[torch.Tensor] = field(default_factory=list)
    per_unit: list[torch.Tensor] = field(default_factory=list)


def feature_views(
    model: Any,
    sae: Any,
    features: Sequence[int],
    corpus: Sequence[Any],
    objective: int | str | None = None,
    n_examples: int = 10,
    context: int = 8,
    ablate_items: int = 16,
    batch_size: int = 8,
    progress: bool | None = None,
) -> FeatureViews:
    """Describe ``features`` of ``sae`` over ``corpus`` (see the module docstring).

    Args:
        objective: the objective for alignment and ablation (default: the model's first).
        n_examples: top-activating tokens kept per feature; ``context``: tokens either side.
        ablate_items: ablate each feature in up to this many items where it fires most.
    """
    model = as_sae_model(model)
    hook = check_sae(model, sae)
    check_affine_sae(sae)
    feats = [int(f) for f in features]
    if not feats or max(feats) >= sae.cfg.d_sae or min(feats) < 0:
        raise SAEError(f"features must be ids in [0, {sae.cfg.d_sae}), got {feats}")
    name = resolve_objectives(model, objective)[0]
    items = as_items(corpus)
    if not items:
        raise SAEError("the corpus is empty")
    encoded = encode_inputs(model, items)
    tokens = [model.tokenizer.convert_ids_to_tokens(e.ids) for e in encoded]
    d = decoder_directions(sae).detach()[feats]  # [F, d_in]
    acc = _Acc(fired=torch.zeros(len(feats)), act_sum=torch.zeros(len(feats)),
               top=[[] for _ in feats], item_max=[{} for _ in feats])
    final = final_hook(model)
    for k, (batch, cache) in enumerate(cached_batches(model, encoded, batch_size, (hook, final),
                                                      "feature views", progress)):
        s = k * batch_size
        with torch.no_grad():
            f = sae.encode(cache[hook].to(sae.dtype))[..., feats].float().cpu()  # [b, pos, F]
            ro = reward_readout(model, cache[final], batch.tokens, batch.attention_mask, [name])
        w = ro.directions[:, 0].float().cpu()  # [b, d_model]
        real = batch.attention_mask.bool().cpu()
        f = f * real[..., None]
        acc.n_tokens += int(real.sum())
        acc.fired += (f > 0).sum((0, 1)).float()
        acc.act_sum += f.sum((0, 1))
        if d.shape[1] == w.shape[1]:
            dc = d.float().cpu()
            acc.cos.append(torch.nn.functional.cosine_similarity(dc[None], w[:, None], dim=-1))
            acc.per_unit.append((w @ dc.T) / ro.scale.float().cpu()[:, None])
        for b, n in enumerate(batch.lengths.tolist()):
            acc.traces[s + b] = f[b, :n].clone()
            acc.rewards[s + b] = float(ro.reward[b, 0])
        for j in range(len(feats)):
            vals, idx = f[..., j].flatten().topk(min(n_examples, f[..., j].numel()))
            for v, i in zip(vals.tolist(), idx.tolist(), strict=True):
                if v > 0:
                    acc.top[j].append((v, s + i // f.shape[1], i % f.shape[1]))
            acc.top[j] = sorted(acc.top[j], reverse=True)[:n_examples]
            for b, m in enumerate(f[..., j].amax(1).tolist()):
                if m > 0:
                    acc.item_max[j][s + b] = m
    views = FeatureViews()
    cos = torch.cat(acc.cos).mean(0) if acc.cos else torch.full((len(feats),), float("nan"))
    per_unit = (torch.cat(acc.per_unit).median(0).values if acc.per_unit
                else torch.full((len(feats),), float("nan")))
    for j, feat in enumerate(feats):
        examples = _examples(acc.top[j], acc.traces, tokens, j, context)
        chosen = sorted(acc.item_max[j].items(), key=lambda kv: -kv[1])[:ablate_items]
        rows = []
        for c in range(0, len(chosen), batch_size):
            part = chosen[c : c + batch_size]
            batch = model.collate([encoded[i] for i, _ in part], "right")
            vals = ablate_rows(model, sae, batch.tokens, batch.attention_mask,
                               [[feat]] * len(part), [name])[:, 0]
            rows += [(i, m, acc.rewards[i], float(v) - acc.rewards[i])
                     for (i, m), v in zip(part, vals.tolist(), strict=True)]
        fired = float(acc.fired[j])
        views.append(FeatureView(
            feature=feat, hook_name=hook, objective=name,
            reward_alignment=float(cos[j]), direct_effect_per_unit=float(per_unit[j]),
            frequency=fired / max(acc.n_tokens, 1),
            mean_activation=float(acc.act_sum[j]) / fired if fired else 0.0,
            examples=examples,
            ablation=pd.DataFrame(rows, columns=["item", "max_activation", "reward",
                                                 "reward_change"]),
        ))
    return views


def _examples(top: list[tuple[float, int, int]], traces: dict[int, torch.Tensor],
              tokens: list[list[str]], j: int, context: int) -> pd.DataFrame:
    """Top-activating tokens with ``context`` tokens either side and their activations."""
    rows = []
    for v, i, p in top:
        lo, hi = max(0, p - context), min(len(tokens[i]), p + context + 1)
        rows.append((i, p, tokens[i][p], v, tokens[i][lo:hi], traces[i][lo:hi, j].tolist()))
    return pd.DataFrame(rows, columns=["item", "position", "token", "activation",
                                       "context_tokens", "context_activations"])
