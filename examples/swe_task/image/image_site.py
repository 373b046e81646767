"""Stands for a dependency installed into the task image's own Python environment."""

ROUNDING = 6
