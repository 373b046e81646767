"""A verifiers v1 taskset exercising scoring, runtime use, stops and group-style scoring (and,
with `odd = true`, the hooks where v1 and vfray differ)."""

from .taskset import CmpTaskset

__all__ = ["CmpTaskset"]
