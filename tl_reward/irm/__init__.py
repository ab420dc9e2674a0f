"""Implicit reward models: a tuned policy against its reference (DPO identity)."""
