"""Optimal and pessimal tokens: the exhaustive vocabulary sweep and the paper's analyses of it.

* :mod:`~tl_reward.sweep.vocab_sweep`: score every vocabulary token as the whole response.
* :mod:`~tl_reward.sweep.roundtrip`: how many tokens survive the published text round trip.
* :mod:`~tl_reward.sweep.store`: the resumable, shardable parquet store.
* analyses of a sweep: :mod:`~tl_reward.sweep.extremes`, :mod:`~tl_reward.sweep.distribution`,
  :mod:`~tl_reward.sweep.agreement`, :mod:`~tl_reward.sweep.framing`,
  :mod:`~tl_reward.sweep.valence`, :mod:`~tl_reward.sweep.frequency`,
  :mod:`~tl_reward.sweep.identity` (word lists in :mod:`~tl_reward.sweep.lexicon`).
"""
