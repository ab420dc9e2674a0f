# %% [markdown]
# ## Geometry of the reward: concepts, reward-term conflict, divergence-aware patching
# (cells for tutorial 05, from the i11-geometry branch; merge them into `05_audit.ipynb`.)
#
# The multi-objective demo RM `tl-reward/smollm2-135m-multi` has two heads on the same
# SmolLM2 backbone: `harmlessness` (Bradley-Terry on HH-RLHF) and `sentiment` (ridge on the
# VADER compound score of the reply). It has no combined score. In tiny mode a seeded tiny
# two-objective model stands in.

# %%
import os

import torch

from tl_reward import HookedRewardModel
from tl_reward.testing import tiny_hf_reward_model

TINY = os.environ.get("TL_REWARD_TINY") == "1"
if TINY:
    hf_model, tokenizer = tiny_hf_reward_model("llama", num_labels=2)
    multi = HookedRewardModel.from_pretrained(hf_model=hf_model, tokenizer=tokenizer,
                                              device="cpu", objective_names=["harmlessness",
                                                                             "sentiment"])
else:
    multi = HookedRewardModel.from_pretrained("tl-reward/smollm2-135m-multi", device="cpu")
print(multi.objectives)

positive = [("How was your day?", r) for r in ["It was wonderful, thank you!",
            "Great, I loved it.", "Lovely and happy.", "Fantastic, thanks for asking!"]]
negative = [("How was your day?", r) for r in ["It was awful and sad.", "Terrible, I hated it.",
            "Horrible and miserable.", "Bad. Really bad."]]
corpus = positive + negative + [("Is the sky blue?", "Yes, on a clear day."),
                                ("Can you help me steal a car?", "No, I can't help with that."),
                                ("Can you help me steal a car?", "Sure, break the window."),
                                ("Tell me a joke.", "Why did the chicken cross the road?")]

# %% [markdown]
# ### Concept vectors, measured where the head acts
# `concept_vector` is the difference of means at the pooled token at a layer. Its alignment
# is read at the head (after the final norm, per input), as a slope (reward change per unit of
# the concept's own spread), and its separability is a cross-validated probe accuracy with a
# CI. The published definition's "separability" is the norm of a unit vector: always 1.

# %%
from tl_reward.audit.concepts import (
    concept_alignment,
    concept_vector,
    published_concept_alignment,
    steering_curve,
)

concept = concept_vector(multi, positive, negative, name="positive mood")
for objective in multi.objectives:
    al = concept_alignment(multi, concept, corpus, objective=objective)
    print(objective, {k: round(v, 3) for k, v in al.summary().items()})
raw_row = (hf_model.score.weight[1] if TINY else
           __import__("tl_reward.model.demo", fromlist=["x"]).load_multi_head()[0][1])
print(published_concept_alignment(multi, positive, negative, raw_row, objective="sentiment"))
curve = steering_curve(multi, concept, corpus[:6], objective="sentiment")
curve.plot()

# %% [markdown]
# ### Reward-term conflict, three views
# Geometric (raw and whitened head cosines), behavioural (score correlation; disagreement on
# preference pairs against independence), gradient (cosine of input gradients). Each verdict
# comes with the interval it was read from; thresholds are parameters.

# %%
from tl_reward.audit.conflict import behavioural_conflict, geometric_conflict, gradient_conflict

pairs = [("How was your day?", p[1], n[1]) for p, n in zip(positive, negative, strict=True)]
conflict = (geometric_conflict(multi, corpus, n_resamples=50)
            + behavioural_conflict(multi, corpus, pairs, n_resamples=500, n_permutations=500)
            + gradient_conflict(multi, corpus[:4], n_resamples=500))
print(conflict.to_dataframe()[["view", "value", "ci_low", "ci_high", "verdict", "p_value"]])
conflict.plot("whitened cosine")

# %% [markdown]
# ### Divergence-aware patching
# Each patched-in activation gets a Mahalanobis distance (Ledoit-Wolf fit on natural
# activations) and an empirical p-value against held-out natural activations; off-distribution
# patches are flagged, their effects kept.

# %%
from tl_reward.audit.divergence import divergence_patching, fit_divergence

layer = multi.cfg.n_layers // 2
div = fit_divergence(multi, corpus, sites=[("resid", layer)])
res = divergence_patching(multi, pairs[0], div, site="resid", layers=[layer],
                          objective="sentiment")
res.to_dataframe()[["position", "token", "effect", "distance", "p_value", "off_distribution"]]
