"""Why seats cannot be played, and what a refused seat leaves: :func:`shared_box_conflict`
(two rollouts of one shared box whose agents would overwrite each other's files) is checked
before a game starts; :func:`unseatable` is the trace of a seat, or a whole game, that could not
be seated. Used by :mod:`vfray.run.seating`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vfray.harnesses.base import Harness
from vfray.harnesses.seats import Seat, SeatedTask, run_name
from vfray.rollout import RolloutPlan
from vfray.trace import StopCondition, Trace


def shared_box_conflict(seats: Sequence[Seat], default: type[Harness]) -> str | None:
    """Why these seats cannot be played, or None: two rollouts of one shared box (its owner's
    first run, every run of a seat that borrows it) whose harnesses keep the same files in the
    box's one agent folder (:meth:`~vfray.harnesses.base.Harness.agent_files`: the same agent
    program's home and transcript), which would overwrite each other's and let a resume pick up
    the other's session. ``default`` is the run's harness, for seats whose agent names none; a
    harness that does not load is left to the seat's own seating to report."""
    from vfray.harnesses.registry import harness_class

    for owner in sorted({s.box for s in seats if s.box is not None}):
        holders: dict[str, list[str]] = {}
        for seat in seats:
            # An owner's further runs get boxes of their own; a borrower's runs all share it.
            runs = 1 if seat.name == owner else seat.runs if seat.box == owner else 0
            if not runs:
                continue
            try:
                cls = default if seat.agent.harness is None else harness_class(seat.agent.harness)
            except Exception:
                continue
            for files in sorted(cls.agent_files()):
                holders.setdefault(files, []).extend(
                    run_name(seat.name, run) for run in range(1, runs + 1)
                )
        for files, names in holders.items():
            if len(names) > 1:
                return (
                    f"seats {', '.join(map(repr, names))} run in the box of seat {owner!r} "
                    f"with harnesses that keep the same agent files ({files!r} under "
                    f".vfray/agent: home, session, transcript), which would overwrite each "
                    f"other's; give them separate boxes (no Seat.box) or different agent programs"
                )
    return None


def unseatable(
    task: SeatedTask[Any],
    plan: RolloutPlan,
    error: Exception,
    seat: Seat | None = None,
    name: str | None = None,
    **ids: Any,
) -> Trace:
    """The trace of a seat (run ``name``) that could not be seated (its agent is misconfigured),
    or the one trace of a game that could not seat anyone."""
    name = name or (None if seat is None else seat.name)
    trace = Trace(task=task.record(), seat=name, **ids)
    agent = None if seat is None else seat.agent
    trace.agent = trace.agent.model_copy(
        update={
            "harness": (agent and agent.harness) or plan.harness_id,
            "runtime": (agent and agent.runtime) or plan.runtime_type,
            "model": (agent and agent.model) or plan.model,
            "name": agent and agent.name,
        }
    )
    trace.add_error(error, "seating")
    trace.stop(StopCondition.ERROR)
    return trace
