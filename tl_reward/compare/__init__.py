"""Comparing models: representational similarity and behavioural agreement.

* :mod:`~tl_reward.compare.similarity`: RV, RV2, linear CKA, debiased CKA on ``[n, p]`` matrices,
  and their permutation nulls.
* :mod:`~tl_reward.compare.layers`: layer x layer similarity maps within a model and between two
  models (streamed per batch, bounded memory).
* :mod:`~tl_reward.compare.behaviour`: rank agreement of rewards, pairwise-preference agreement,
  vocabulary-sweep agreement and reward readability between reward models.

A similarity of representational geometry is not evidence of a shared mechanism.
"""
