"""A verifiers v1 taskset exercising scoring, runtime use, stops and group-style scoring."""

from .taskset import CmpTaskset

__all__ = ["CmpTaskset"]
