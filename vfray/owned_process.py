"""What vfray sets in the processes it owns, and only there: the ``vfray`` command's own process
(the console script, ``python -m vfray``) and its Ray actors' processes (each actor has a worker
process of its own). A process vfray is imported into (a trainer, a notebook, a test) is left as
its owner set it.

The one setting: the garbage collector's thresholds. The interception allocates a few thousand
container objects per model call, so with Python's default ``(700, 10, 10)`` a young-generation
pass runs several times per call. Measured with ``benchmarks/token_in.py`` at 64 sessions (this
2-core VM, three alternated pairs of runs): CPU per turn 1.007 -> 0.819, 0.841 -> 0.682 and
0.722 -> 0.689 ms with ``(20000, 20, 10)``; an earlier session measured 5-13% over ten pairs.
Where the interception is not most of the work it moves nothing beyond the run-to-run spread:
one rollout at a time (``benchmarks/agents.py``, c=1, two pairs) and a whole ``vfray eval
arithmetic -n 200 -r 4 --harness null -c 64`` (CPU 4.9 s either way, three pairs). The cycles it
leaves for longer are request and reply garbage, a few MB at most.

Internal: importable, but not the public API (:mod:`vfray`, :mod:`vfray.testing`,
:mod:`vfray.train`, :mod:`vfray.compat.v1`); names here may move.
"""

from __future__ import annotations

import gc

GC_THRESHOLDS = (20000, 20, 10)
"""Allocations before a young-generation pass, then passes before each older one."""


def tune_owned_process() -> None:
    """Set what :mod:`vfray.owned_process` names in this process: call it only in a process
    vfray owns."""
    gc.set_threshold(*GC_THRESHOLDS)
