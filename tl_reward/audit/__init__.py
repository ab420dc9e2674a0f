"""Auditing a reward model: probes, concepts, reward-term conflict, divergence-aware patching.

One module per analysis; import them directly (e.g. ``from tl_reward.audit.concepts import
concept_vector``).
"""
