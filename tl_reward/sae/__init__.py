"""SAE features of reward models, with SAELens SAEs.

* :func:`sae_attribution` / :func:`differential_sae_attribution`: the reward (or a pair's
  margin) split over SAE features: exact at the final residual (features + ``b_dec`` + error,
  over the frozen norm scale), gradient-based at earlier hooks.
* :func:`ablation_check` / :func:`pair_ablation_check`: ablate the top features and compare the
  predicted with the actual reward change.
* :func:`top_features`, :func:`feature_views`: the features behind a set of preferences, and one
  feature's reward alignment, top-activating tokens over a corpus and ablation effect.
* :func:`saes_for`, :func:`load_sae`, :func:`prepare_sae`: the SAELens releases for an RM's base
  model (offline, from SAELens's registry), loaded and checked against the model's hooks,
  processing, normalisation and BOS convention.
* :func:`sae_fit`: how well an SAE reconstructs the RM's activations (all positions and the
  pooled token) and how much of the reward and the pair margins survive it spliced in.
* :func:`collect_activations`, :func:`train_topk_sae`: train a TopK SAE on the RM's own
  activations with SAELens's trainer, offline.

SAEs are SAELens objects: ``SAE.load_from_disk(path)``, ``SAE.from_pretrained(release, id)``
(needs the Hugging Face hub), or :func:`train_topk_sae`.
"""

from tl_reward.sae.ablation import AblationCheck, ablation_check, pair_ablation_check
from tl_reward.sae.attribution import (
    PairSAEAttribution,
    SAEAttribution,
    differential_sae_attribution,
    sae_attribution,
)
from tl_reward.sae.features import (
    FeatureView,
    FeatureViews,
    TopFeatures,
    feature_views,
    top_features,
)
from tl_reward.sae.fit import SAEFit, sae_fit
from tl_reward.sae.pretrained import PretrainedSAEs, load_sae, prepare_sae, saes_for
from tl_reward.sae.splice import SAEError, as_sae_model, check_sae, final_hook
from tl_reward.sae.training import TrainedSAE, collect_activations, train_topk_sae

__all__ = [
    "AblationCheck",
    "FeatureView",
    "FeatureViews",
    "TopFeatures",
    "TrainedSAE",
    "PairSAEAttribution",
    "PretrainedSAEs",
    "SAEFit",
    "SAEAttribution",
    "SAEError",
    "ablation_check",
    "as_sae_model",
    "check_sae",
    "collect_activations",
    "differential_sae_attribution",
    "feature_views",
    "load_sae",
    "final_hook",
    "pair_ablation_check",
    "prepare_sae",
    "sae_attribution",
    "sae_fit",
    "saes_for",
    "top_features",
    "train_topk_sae",
]
