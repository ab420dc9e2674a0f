"""The seed paper's pipeline (arXiv 2310.08164): from a tuned policy's SAE features back to the
per-token utilities of the reward it was tuned on.

1. Rank layers by how far tuning moved their parameters (:func:`~tl_reward.irm.layers.
   parameter_change`) and keep the top ones.
2. Train SAELens TopK SAEs separately on the reference's and the policy's MLP outputs
   (``blocks.L.hook_mlp_out``) there, on a local corpus (the offline trainer of
   :mod:`tl_reward.sae.training`).
3. Contrastive texts: every token whose word has a known utility (e.g. the VADER lexicon) as
   the whole assistant reply to one prompt; read each model's MLP output at that token and
   encode it with that model's SAE.
4. Ridge regression (penalty chosen by inner cross-validation) from SAE features to the
   utility, predicted out of fold (folds grouped by word, so ``"love"`` and ``" Love"`` never
   straddle train and test); reconstructed vs true utilities by Kendall tau-b with its interval
   clustered by word (the folds' unit: a word's tokens are near-duplicates, not independent
   items), for the policy's features, the reference's, and both.

The seed validated with histograms and an LLM's feature labels; the Kendall tau here is the
quantitative check. A high tau for the reference's features too says the utilities were
readable before tuning: compare the feature sets, not one tau alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float

from tl_reward import tl_backend
from tl_reward.errors import TLRewardError
from tl_reward.irm.layers import LayerChange, parameter_change
from tl_reward.model.inputs import EncodedInput, collate
from tl_reward.model.response_template import Prompt, response_template
from tl_reward.sae.training import train_topk_sae
from tl_reward.stats.agreement import RankAgreement, rank_agreement
from tl_reward.sweep.lexicon import token_word
from tl_reward.sweep.vocab_sweep import vocabulary_ids


def mlp_hook(layer: int) -> str:
    """The MLP-output hook of ``layer``."""
    return f"blocks.{layer}.hook_mlp_out"


@torch.no_grad()
def corpus_activations(
    model: Any, encoded: Sequence[EncodedInput], layers: Sequence[int], batch_size: int = 8,
    exclude_special_tokens: bool = True,
) -> dict[int, Float[torch.Tensor, "n d"]]:
    """MLP outputs of a ``HookedTransformer`` at ``layers`` over every real token (float32, CPU).

    Special tokens are dropped by default (their outlier norms would dominate an SAE's loss).
    """
    names = [mlp_hook(la) for la in layers]
    tok = getattr(model, "tokenizer", None)
    special = torch.tensor(sorted(set(getattr(tok, "all_special_ids", []) or [])),
                           dtype=torch.long)
    pad = getattr(tok, "pad_token_id", None) or 0
    out: dict[int, list[torch.Tensor]] = {la: [] for la in layers}
    for s in range(0, len(encoded), batch_size):
        batch = collate(encoded[s:s + batch_size], pad, "right")
        keep = batch.attention_mask.bool()
        if exclude_special_tokens and special.numel():
            keep &= ~torch.isin(batch.tokens, special)
        dev = model.cfg.device
        _, cache = model.run_with_cache(batch.tokens.to(dev),
                                        attention_mask=batch.attention_mask.to(dev),
                                        names_filter=lambda n: n in names,
                                        stop_at_layer=max(layers) + 1, return_type=None)
        for la in layers:
            out[la].append(cache[mlp_hook(la)][keep.to(dev)].float().cpu())
    return {la: torch.cat(v) for la, v in out.items()}


@torch.no_grad()
def reply_token_activations(
    model: Any, tokenizer: Any, prompt: Prompt, token_ids: Sequence[int], layers: Sequence[int],
    batch_size: int = 256,
) -> dict[int, Float[torch.Tensor, "n d"]]:
    """MLP outputs at the reply token when each of ``token_ids`` is the whole reply to
    ``prompt`` (the prefix runs once; float32, CPU)."""
    tpl = response_template(tokenizer, prompt)
    dev = model.cfg.device
    cache = tl_backend.build_prefix_cache(model, torch.tensor(tpl.prefix, device=dev))
    names = {mlp_hook(la): la for la in layers}
    out: dict[int, list[torch.Tensor]] = {la: [] for la in layers}
    ids = torch.tensor([int(i) for i in token_ids])
    got: dict[str, torch.Tensor] = {}

    def keep(act: torch.Tensor, hook: Any) -> None:
        got[hook.name] = act[:, 0].float().cpu()

    for s in range(0, len(ids), batch_size):
        with model.hooks(fwd_hooks=[(n, keep) for n in names]):
            tl_backend.run_after_prefix(model, cache, ids[s:s + batch_size, None])
        for n, la in names.items():
            out[la].append(got[n])
    return {la: torch.cat(v) for la, v in out.items()}


@torch.no_grad()
def sae_features(sae: Any, acts: Float[torch.Tensor, "n d"], batch_size: int = 4096
                 ) -> Float[torch.Tensor, "n d_sae"]:
    """SAE feature activations of ``acts`` (float32, CPU)."""
    parts = [sae.encode(acts[s:s + batch_size].to(sae.device, sae.dtype)).float().cpu()
             for s in range(0, acts.shape[0], batch_size)]
    return torch.cat(parts)


@dataclass
class UtilityReconstruction:
    """Utilities predicted out of fold from features, against the true ones.

    Attributes:
        feature_set: which features were used (e.g. ``"policy"``, ``"reference"``, ``"both"``).
        words: the word of each item; ``utilities``: true values; ``reconstructed``: ridge
            predictions made without the item's word in training.
        agreement: Kendall tau-b (CI clustered by word, the folds' unit) and
            Spearman rho.
        alphas: the ridge penalty chosen in each outer fold; ``r2``: out-of-fold R^2.
    """

    feature_set: str
    words: list[str]
    utilities: np.ndarray
    reconstructed: np.ndarray
    agreement: RankAgreement
    alphas: list[float]
    r2: float
    n_features: int

    def to_dataframe(self) -> pd.DataFrame:
        """One row per item: word, true and reconstructed utility."""
        return pd.DataFrame({"word": self.words, "utility": self.utilities,
                             "reconstructed": self.reconstructed})

    def plot(self) -> Any:
        """Reconstructed vs true utility (plotly)."""
        from tl_reward.viz.irm import plot_reward_scatter

        return plot_reward_scatter(self.utilities, self.reconstructed, "true utility",
                                   "reconstructed utility",
                                   f"{self.feature_set}: Kendall {self.agreement}",
                                   text=self.words)


def reconstruct_utilities(
    features: np.ndarray | torch.Tensor, utilities: np.ndarray, groups: Sequence[str],
    feature_set: str = "features", n_folds: int = 5, alphas: Sequence[float] | None = None,
    seed: int = 0,
) -> UtilityReconstruction:
    """Ridge from ``features [n, F]`` to ``utilities [n]``, predicted out of fold.

    Outer folds are grouped by ``groups`` (the word); inside each, ``RidgeCV`` (efficient
    leave-one-out) picks the penalty from ``alphas`` on standardised features. Kendall's interval
    treats each group as one unit (cluster-robust).
    """
    from sklearn.linear_model import RidgeCV
    from sklearn.model_selection import GroupKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x = features.numpy() if isinstance(features, torch.Tensor) else np.asarray(features)
    y = np.asarray(utilities, dtype=np.float64)
    g = np.asarray(groups)
    if x.shape[0] != y.shape[0] or y.shape[0] != g.shape[0]:
        raise TLRewardError("features, utilities and groups need the same number of rows")
    if len(set(g.tolist())) < n_folds:
        raise TLRewardError(f"need at least {n_folds} distinct words for {n_folds} folds")
    x = x[:, x.std(0) > 0]  # dead features carry nothing
    grid = np.logspace(-1, 5, 13) if alphas is None else np.asarray(alphas)
    pred = np.empty_like(y)
    chosen = []
    perm = np.random.default_rng(seed).permutation(len(y))
    for tr, te in GroupKFold(n_splits=n_folds).split(x[perm], y[perm], g[perm]):
        tr, te = perm[tr], perm[te]
        model = make_pipeline(StandardScaler(), RidgeCV(alphas=grid)).fit(x[tr], y[tr])
        pred[te] = model.predict(x[te])
        chosen.append(float(model[-1].alpha_))
    r2 = 1 - float(((y - pred) ** 2).sum() / ((y - y.mean()) ** 2).sum())
    agr = rank_agreement(pred, y, ("reconstructed utility", "true utility"), units=g,
                         unit="word")
    return UtilityReconstruction(feature_set, [str(w) for w in g], y, pred, agr, chosen, r2,
                                 int(x.shape[1]))


@dataclass
class IrmPipelineResult:
    """The seed pipeline's outputs.

    Attributes:
        layer_change: parameter change per layer; ``layers``: the layers used.
        sae_metrics: held-out explained variance, L0 and dead share of each SAE
            (``(model, layer)`` rows).
        reconstructions: one :class:`UtilityReconstruction` per feature set.
    """

    layer_change: LayerChange
    layers: list[int]
    sae_metrics: pd.DataFrame
    reconstructions: dict[str, UtilityReconstruction] = field(default_factory=dict)
    saes: dict[tuple[str, int], Any] = field(default_factory=dict, repr=False)

    def to_dataframe(self) -> pd.DataFrame:
        """One row per feature set: Kendall tau-b with CI, Spearman, out-of-fold R^2."""
        return pd.DataFrame([{
            "features": name, "layers": ",".join(map(str, self.layers)), "n_words":
            len(set(rec.words)), "n_tokens": len(rec.words), "n_features": rec.n_features,
            "kendall_tau_b": (tau := rec.agreement.kendall_tau_b).value, "ci_low": tau.ci_low,
            "ci_high": tau.ci_high, "spearman_rho": rec.agreement.spearman_rho.value, "r2": rec.r2}
            for name, rec in self.reconstructions.items()])

    def plot(self) -> Any:
        """Kendall tau-b with CI per feature set (plotly)."""
        import plotly.graph_objects as go

        df = self.to_dataframe()
        fig = go.Figure(go.Bar(x=df["features"], y=df["kendall_tau_b"], error_y=dict(
            type="data", symmetric=False, array=df["ci_high"] - df["kendall_tau_b"],
            arrayminus=df["kendall_tau_b"] - df["ci_low"])))
        fig.update_layout(title="Reconstructed vs true utility (Kendall tau-b, 95% CI)",
                          yaxis_title="Kendall tau-b")
        return fig


def lexicon_tokens(tokenizer: Any, lexicon: dict[str, float], vocab: int | None = None
                   ) -> tuple[list[int], list[str], np.ndarray]:
    """Token ids whose decoded word is in ``lexicon``: ids, words and utilities."""
    spelled = ((i, token_word(tokenizer.decode([i])))
               for i in vocabulary_ids(tokenizer, vocab or len(tokenizer)))
    hits = [(i, w) for i, w in spelled if w is not None and w in lexicon]
    ids, words = [i for i, _ in hits], [w for _, w in hits]
    return ids, words, np.asarray([float(lexicon[w]) for w in words])


def run_seed_pipeline(
    policy: Any, reference: Any, corpus: Sequence[EncodedInput], lexicon: dict[str, float],
    prompt: Prompt = "Describe how you feel in one word.", n_layers: int = 2,
    layer_change: LayerChange | None = None, d_sae: int | None = None, k: int = 32,
    sae_epochs: float = 4.0, batch_size_tokens: int = 1024, n_folds: int = 5,
    seed: int = 0,
) -> IrmPipelineResult:
    """Layers by parameter change, SAEs on both models there, ridge from features to utilities.

    Args:
        policy, reference: ``HookedTransformer`` causal LMs sharing a tokenizer.
        corpus: encoded texts for SAE training (e.g. chat conversations).
        lexicon: word -> utility (e.g. :func:`tl_reward.irm.vader.vader_lexicon`).
        prompt: the prompt that each lexicon token answers in the contrastive texts.
        layer_change: a precomputed ranking (e.g. on the HF models); computed from the two
            models otherwise.
    """
    change = layer_change or parameter_change(policy, reference)
    layers = sorted(change.top(n_layers))
    tok = policy.tokenizer
    ids, words, utils = lexicon_tokens(tok, lexicon, policy.cfg.d_vocab)
    if len(ids) < 2 * n_folds:
        raise TLRewardError(f"only {len(ids)} vocabulary tokens are lexicon words")
    metrics, saes, feats = [], {}, {}
    for name, model in (("reference", reference), ("policy", policy)):
        acts = corpus_activations(model, corpus, layers)
        word_acts = reply_token_activations(model, tok, prompt, ids, layers)
        parts = []
        for la in layers:
            trained = train_topk_sae(model, None, mlp_hook(la), activations=acts[la],
                                     d_sae=d_sae, k=k, epochs=sae_epochs,
                                     batch_size_tokens=min(batch_size_tokens,
                                                           int(0.8 * acts[la].shape[0])),
                                     seed=seed, progress=False)
            saes[(name, la)] = trained.sae
            metrics.append({"model": name, "layer": la, **trained.held_out})
            parts.append(sae_features(trained.sae, word_acts[la]))
        feats[name] = torch.cat(parts, 1)
    feats["both"] = torch.cat([feats["policy"], feats["reference"]], 1)
    recs = {name: reconstruct_utilities(f, utils, words, name, n_folds, None, seed)
            for name, f in feats.items()}
    return IrmPipelineResult(change, layers, pd.DataFrame(metrics), recs, saes)
