"""One rollout of a task, as a phased state machine: boot → setup → agent → finalize → scoring →
teardown, each phase under its own deadline, failures recorded on the trace as typed errors.

The package re-exports what the rest of vfray uses: the plan a rollout runs under
(:mod:`~vfray.rollout.plan`), the state machine (:mod:`~vfray.rollout.machine`), whose agent phase
is :mod:`~vfray.rollout.agent_phase`. Its modules import each other directly, never this package.

Internal: importable, but not the public API (:mod:`vfray`, :mod:`vfray.testing`,
:mod:`vfray.train`, :mod:`vfray.compat.v1`); names here may move.
"""

from vfray.rollout.machine import execute_rollout, run_planned_rollout
from vfray.rollout.plan import PHASES, RolloutPlan, SessionBroker, Timeouts

__all__ = [
    "PHASES",
    "RolloutPlan",
    "SessionBroker",
    "Timeouts",
    "execute_rollout",
    "run_planned_rollout",
]
