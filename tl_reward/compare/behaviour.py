"""Do two reward models behave alike? Rank, preference, vocabulary and readability agreement.

For every pair of models (A, B):

* **Rank agreement over a corpus**: :func:`~tl_reward.stats.agreement.rank_agreement` of their
  rewards on the same inputs (Kendall's tau-b, Spearman's rho, top-weighted rank-biased overlap).
* **Pairwise-preference agreement**: :func:`preference_agreement` on preference pairs (a zero
  margin is its own side), beside each model's accuracy (chosen preferred).
* **Vocabulary agreement**: :func:`tl_reward.sweep.agreement.model_agreement` of their sweeps.
* **Reward readability**: :func:`ridge_readability`, held-out R^2 (can be negative) of B's reward
  from A's activations at the pooled token; both directions, and each model from itself.

Agreement of rewards is behavioural; readability says B's reward is *linearly available* in A's
representation, not that A computes it.

Example:
    >>> rep = compare_models({"a": model_a, "b": model_b}, corpus, pairs=pairs)
    >>> rep.to_dataframe(); rep.plot()
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations, permutations
from typing import Any

import numpy as np
import pandas as pd
from jaxtyping import Float

from tl_reward.compare.layers import activations, model_label
from tl_reward.data.preference import PreferencePair, pair_rows
from tl_reward.errors import TLRewardError
from tl_reward.results import ShortRepr, result_type
from tl_reward.scale.executors import Executor, LocalExecutor, Spec, Worker, as_spec
from tl_reward.scale.jobs import run_chunked
from tl_reward.stats.agreement import RankAgreement, rank_agreement
from tl_reward.stats.estimate import Estimate
from tl_reward.stats.paired import share_interval
from tl_reward.stats.ranks import paired_arrays
from tl_reward.sweep.agreement import model_agreement

DEFAULT_ALPHAS: tuple[float, ...] = tuple(float(a) for a in np.logspace(-3, 5, 17))


@result_type
@dataclass
class PreferenceAgreement:
    """Share of preference pairs on which two models prefer the same reply."""

    model_a: str
    model_b: str
    agreement: Estimate
    accuracy_a: float
    accuracy_b: float


@result_type
@dataclass
class Readability:
    """Held-out R^2 of a ridge from ``source``'s activations (``hook``) to ``target``'s reward.

    Attributes:
        alphas: the penalty chosen on each outer fold's training part.
        predicted: ``[n]`` held-out predictions, in input order.
    """

    source: str
    target: str
    hook: str
    r2: float
    alphas: list[float]
    n: int
    predicted: np.ndarray = field(repr=False)


def preference_agreement(margin_a: np.ndarray, margin_b: np.ndarray,
                         names: tuple[str, str] = ("a", "b"), confidence: float = 0.95
                         ) -> PreferenceAgreement:
    """Share of pairs with ``sign(margin_a) == sign(margin_b)``, with its exact binomial
    (Clopper-Pearson) interval."""
    ma, mb = paired_arrays(margin_a, margin_b, 2, "margin")
    same = (np.sign(ma) == np.sign(mb)).astype(np.float64)
    lo, hi = share_interval(int(same.sum()), 0, len(same), confidence)
    return PreferenceAgreement(names[0], names[1], Estimate(
        float(same.mean()), lo, hi, n=len(same), method="exact binomial (Clopper-Pearson)",
        confidence=confidence), float((ma > 0).mean()), float((mb > 0).mean()))


def ridge_readability(
    x: Float[np.ndarray, "n d"], y: Float[np.ndarray, " n"],
    alphas: Sequence[float] = DEFAULT_ALPHAS, n_splits: int = 5, seed: int = 0,
) -> tuple[float, list[float], np.ndarray]:
    """Held-out R^2 of ridge from ``x`` to ``y``: outer K-fold (shuffled, seeded); on each
    training part features are standardised and ``RidgeCV`` picks the penalty by efficient
    leave-one-out; R^2 of the pooled held-out predictions. Returns ``(r2, alphas, predicted)``."""
    from sklearn.linear_model import RidgeCV
    from sklearn.model_selection import KFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(x) < 2 * n_splits:
        raise TLRewardError(f"reward readability needs at least {2 * n_splits} inputs for "
                            f"{n_splits}-fold cross-validation, got {len(x)}")
    pred = np.zeros_like(y)
    chosen = []
    for train, test in KFold(n_splits, shuffle=True, random_state=seed).split(x):
        fit = make_pipeline(StandardScaler(), RidgeCV(alphas=list(alphas))).fit(x[train],
                                                                                 y[train])
        pred[test] = fit.predict(x[test])
        chosen.append(float(fit[-1].alpha_))
    sst = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(((y - pred) ** 2).sum()) / sst if sst > 0 else float("nan")
    return r2, chosen, pred


@dataclass(repr=False)
class BehaviourComparison(ShortRepr):
    """Behavioural agreement of several reward models (:func:`compare_models`).

    Attributes:
        models: model names.
        rewards: per model, ``[n]`` rewards over the corpus (or ``None`` without one).
        rank: one :class:`RankAgreement` per model pair.
        preference: one :class:`PreferenceAgreement` per model pair (pairs given).
        readability: one :class:`Readability` per ordered model pair and per model itself.
        vocabulary: the :class:`~tl_reward.sweep.agreement.ModelAgreement` of the sweeps.
    """

    models: list[str]
    rewards: dict[str, np.ndarray] = field(repr=False)
    rank: list[RankAgreement]
    preference: list[PreferenceAgreement]
    readability: list[Readability]
    vocabulary: Any = None

    def to_dataframe(self) -> pd.DataFrame:
        """One row per model pair and measure: value, CI, p-value, n, method."""
        rows: list[dict[str, Any]] = [r for ra in self.rank for r in ra.to_dataframe().to_dict(
            "records")]
        rows += [{"model_a": p.model_a, "model_b": p.model_b, "measure": "preference_agreement",
                  **p.agreement.to_dict()} for p in self.preference]
        rows += [{"model_a": r.source, "model_b": r.target,
                  "measure": f"readability_r2 ({r.hook})",
                  **Estimate(r.r2, n=r.n, method="ridge, held-out R^2").to_dict()}
                 for r in self.readability]
        vocab = [] if self.vocabulary is None else self.vocabulary.to_dataframe().itertuples()
        rows += [{"model_a": v.model_a, "model_b": v.model_b, "measure": f"vocabulary_{m}",
                  **Estimate(float(getattr(v, m)), n=int(v.n_shared),
                             method="vocabulary sweep").to_dict()}
                 for v in vocab for m in ("kendall_tau_b", "spearman_rho", "rbo_top", "rbo_bottom")]
        return pd.DataFrame(rows)

    def plot(self) -> Any:
        """Bar chart of every measure per model pair with its CI, beside a reward scatter."""
        from tl_reward.viz.compare import plot_behaviour

        return plot_behaviour(self.to_dataframe(), self.rewards)


def _scores(model: Any, inputs: Sequence[Any], objective: str, batch_size: int,
            names: Sequence[str] | None = None) -> np.ndarray:
    res = model.rewards(list(inputs), batch_size=batch_size, names=names)
    return res.values(objective).double().numpy()


@dataclass
class ModelFeatures:
    """What :func:`compare_models` reads from one model (:func:`model_features`).

    Attributes:
        rewards: ``[n]`` rewards over the corpus (``None`` without one).
        acts: ``[n, d]`` activations at ``hook`` for readability (``None`` if skipped).
        hook: the resolved readability hook point.
        margins: ``[n_pairs]`` chosen minus rejected reward (``None`` without pairs).
    """

    rewards: np.ndarray | None
    acts: np.ndarray | None
    hook: str | None
    margins: np.ndarray | None


def split_data(data: Sequence[Any] | None, pairs: Sequence[PreferencePair] | None
               ) -> tuple[list[Any] | None, list[PreferencePair] | None]:
    """The corpus and the pairs of :func:`compare_models`' ``data`` and ``pairs``."""
    corpus: list[Any] | None = None
    if data is not None:
        data = list(data)
        if data and all(isinstance(d, PreferencePair) for d in data):
            pairs = data if pairs is None else pairs
            corpus = [p.chosen_conversation() for p in data]
        else:
            corpus = data
    return corpus, None if pairs is None else list(pairs)


def model_features(model: Any, corpus: Sequence[Any] | None,
                   pairs: Sequence[PreferencePair] | None, objective: str = "score",
                   readability_hook: str | None = "blocks.{layer}.hook_resid_post",
                   readability_layer: int = -1, batch_size: int = 8) -> ModelFeatures:
    """One model's rewards, readability activations and pair margins (the forward passes of
    :func:`compare_models`; :func:`compare_features` does the statistics)."""
    rewards = acts = margins = hook = None
    if corpus is not None:
        rewards = _scores(model, corpus, objective, batch_size)
        if readability_hook is not None:
            hook = (readability_hook.format(layer=readability_layer % model.cfg.n_layers)
                    if "{layer}" in readability_hook else readability_hook)
            acts = activations(model, corpus, hook, batch_size=batch_size)
    if pairs is not None:
        convs, names = pair_rows(pairs)
        s = _scores(model, convs, objective, batch_size, names)
        margins = s[0::2] - s[1::2]
    return ModelFeatures(rewards, acts, hook, margins)


def compare_features(
    features: Mapping[str, ModelFeatures], sweeps: Mapping[str, Any] | None = None, *,
    confidence: float = 0.95, seed: int = 0, rbo_p: float = 0.9,
) -> BehaviourComparison:
    """:func:`compare_models`' statistics from each model's :class:`ModelFeatures`."""
    names = list(features)
    if len(names) < 2:
        raise TLRewardError("compare_models needs at least two models")
    rewards: dict[str, np.ndarray] = {}
    rank, pref, read = [], [], []
    if all(f.rewards is not None for f in features.values()):
        rewards = {n: f.rewards for n, f in features.items()}  # type: ignore[misc]
        for a, b in combinations(names, 2):
            rank.append(rank_agreement(rewards[a], rewards[b], (a, b), confidence, rbo_p))
        if all(f.acts is not None for f in features.values()):
            for a, b in [*((n, n) for n in names), *permutations(names, 2)]:
                r2, alphas, pred = ridge_readability(features[a].acts, rewards[b], seed=seed)
                read.append(Readability(a, b, str(features[a].hook), r2, alphas,
                                        len(rewards[b]), pred))
    if all(f.margins is not None for f in features.values()):
        for a, b in combinations(names, 2):
            pref.append(preference_agreement(features[a].margins, features[b].margins, (a, b),
                                             confidence))
    vocabulary = None if sweeps is None else model_agreement(dict(sweeps), p=rbo_p)
    return BehaviourComparison(names, rewards, rank, pref, read, vocabulary)


def compare_models(
    models: Mapping[str, Any] | Sequence[Any], data: Sequence[Any] | None = None, *,
    pairs: Sequence[PreferencePair] | None = None, sweeps: Mapping[str, Any] | None = None,
    readability_hook: str | None = "blocks.{layer}.hook_resid_post", readability_layer: int = -1,
    objective: str | Mapping[str, str] = "score", confidence: float = 0.95, seed: int = 0,
    batch_size: int = 8, rbo_p: float = 0.9,
) -> BehaviourComparison:
    """Behavioural agreement of reward models (``{name: HookedRewardModel}`` or a list).

    Args:
        data: the corpus (any reward inputs), or preference pairs (then used as ``pairs``, and
            their chosen conversations as the corpus).
        pairs: preference pairs for pairwise-preference agreement.
        sweeps: ``{name: VocabSweep}`` for vocabulary agreement (names as in ``models``).
        readability_hook, readability_layer: where A's activations are read for the ridge to
            B's reward (default: the last block's residual stream; ``None`` skips readability).
        objective: ``"score"`` or an objective name present in every model, or
            ``{name: objective}`` with one per model (e.g. a single-reward RM against one
            objective of a multi-objective RM).

    The forward passes are :func:`model_features`, the statistics :func:`compare_features`
    (:func:`run_compare_models` runs the former on workers).
    """
    named = dict(models) if isinstance(models, Mapping) else {}
    if not isinstance(models, Mapping):
        for i, m in enumerate(models):  # named by the model's label (repeats get _i)
            name = model_label(m)
            named[name if name not in named else f"{name}_{i}"] = m
    return run_compare_models(named, data, pairs=pairs, sweeps=sweeps,
                              readability_hook=readability_hook,
                              readability_layer=readability_layer, objective=objective,
                              confidence=confidence, seed=seed,
                              batch_size=batch_size, rbo_p=rbo_p, progress=False)


def features_unit(worker: Worker, spec: Spec, corpus: Sequence[Any] | None,
                  pairs: Sequence[PreferencePair] | None, objective: str,
                  readability_hook: str | None, readability_layer: int, batch_size: int
                  ) -> list[tuple[str, ModelFeatures]]:
    """The model's name and :class:`ModelFeatures`, as the unit's one result (run on a
    worker)."""
    model = worker.model(spec)
    return [(model_label(model), model_features(model, corpus, pairs, objective,
                                                readability_hook, readability_layer,
                                                batch_size))]


def run_compare_models(
    models: Mapping[str, Any] | Sequence[Any], data: Sequence[Any] | None = None, *,
    pairs: Sequence[PreferencePair] | None = None, sweeps: Mapping[str, Any] | None = None,
    readability_hook: str | None = "blocks.{layer}.hook_resid_post", readability_layer: int = -1,
    objective: str | Mapping[str, str] = "score", confidence: float = 0.95, seed: int = 0,
    batch_size: int = 8, rbo_p: float = 0.9, executor: Executor | None = None,
    progress: bool | None = None,
) -> BehaviourComparison:
    """:func:`compare_models` with every model's forward passes on ``executor`` (one unit per
    model; the statistics here, so the driver never loads a model). ``models``: loaded models,
    hub names, local directories or :class:`~tl_reward.scale.executors.ModelSpec` s, as
    ``{name: model}`` or a list; the other arguments as there."""
    named = dict(models) if isinstance(models, Mapping) else None
    specs = [as_spec(m) for m in (named.values() if named is not None else models)]
    if len(specs) < 2:
        raise TLRewardError("compare_models needs at least two models")
    corpus, pairs = split_data(data, pairs)
    if corpus is None and pairs is None and sweeps is None:
        raise TLRewardError("give a corpus (data=...), preference pairs or sweeps to compare")
    if isinstance(objective, str):
        objectives = [objective] * len(specs)
    elif named is None:
        raise TLRewardError("one objective per model needs the models as {name: model}")
    elif set(objective) != set(named):
        raise TLRewardError(f"objective names models {sorted(objective)}; the models are "
                            f"{list(named)} (give one objective per model)")
    else:
        objectives = [objective[n] for n in named]
    results: dict[int, tuple[str, ModelFeatures]] = {}
    with (executor or LocalExecutor()).session() as pool:
        run_chunked(pool, features_unit, range(len(specs)),
                    lambda u: (specs[u[0]], corpus, pairs, objectives[u[0]], readability_hook,
                               readability_layer, batch_size),
                    lambda i, result, new: results.__setitem__(i, result),
                    desc="compare", unit="model", progress=progress)
    if named is not None:
        names = list(named)
    else:  # a list: each model named by its label, repeats with _i
        names = []
        for i in range(len(specs)):
            name = results[i][0]
            names.append(name if name not in names else f"{name}_{i}")
    features = {n: results[i][1] for i, n in enumerate(names)}
    return compare_features(features, sweeps, confidence=confidence, seed=seed, rbo_p=rbo_p)
