"""Compatibility: the published reward-lens v1.0.0 definitions (:mod:`.published`)."""
