"""Analyses: each a function ``analyse(model, inputs, ...) -> Result`` in its own module."""
