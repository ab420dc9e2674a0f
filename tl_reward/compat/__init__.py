"""Compatibility: the published reward-lens v1.0.0 definitions (:mod:`.published`; the "Cohen's
d" the probe report shows beside ours in :mod:`.effect_size`)."""
