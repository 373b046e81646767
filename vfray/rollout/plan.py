"""What a rollout runs under, fixed for a whole run: the :class:`RolloutPlan` (model, harness,
runtime, sampling, limits), its per-phase :class:`Timeouts`, and the :class:`SessionBroker` through
which a rollout opens and closes its interception session."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from vfray.interception.limits import Limits
from vfray.scoring import STOP_TIMEOUT
from vfray.task import TaskData
from vfray.trace import Trace

PHASES = ("boot", "setup", "agent", "finalize", "scoring", "teardown")
"""The phases of a rollout, in order; each one's timestamps are in ``trace.timing``. A task with
an image has one more first, ``image`` (:data:`IMAGE_PHASE`)."""
IMAGE_PHASE = "image"
"""The phase before ``boot`` in which a task's image is pulled, built or unpacked on the node
(``Runtime.prepare_image``), under its own deadline ``timeouts.image``: a long SWE image build is
not the box's boot. Its timestamps are ``trace.timing["image"]`` (near zero once the node has
the image); only rollouts of tasks that name an image, on runtimes that run images, have it."""


class Timeouts(BaseModel):
    """Default per-phase deadlines in seconds; a task's own ``TaskData.timeout`` wins."""

    model_config = ConfigDict(frozen=True)

    image: float = Field(
        1800.0,
        gt=0,
        description="seconds to pull, build or unpack a task's image on the node, before boot "
        "(the first rollout that needs it waits for the build; later ones find it ready)",
    )
    boot: float = Field(120.0, gt=0, description="seconds to start the runtime box")
    setup: float = Field(600.0, gt=0, description="seconds for task.setup + harness.setup")
    agent: float = Field(1800.0, gt=0, description="agent budget in seconds (all segments)")
    user: float = Field(
        600.0, gt=0, description="seconds the task's user may take per message (not agent time)"
    )
    finalize: float = Field(600.0, gt=0, description="seconds for task.finalize")
    scoring: float = Field(600.0, gt=0, description="seconds for reward and metric hooks")
    stop: float = Field(
        STOP_TIMEOUT,
        gt=0,
        description="seconds the @stop hooks may take before a model call; a hook past it is "
        "noted on the trace, taken as not stopping and not asked again in that rollout",
    )
    teardown: float = Field(60.0, gt=0, description="seconds to stop the box")
    stop_grace: float = Field(
        5.0,
        gt=0,
        description="seconds between the SIGTERM a harness program gets once the interception "
        "refused a call (a limit, a stop hook) and the SIGKILL of its process group",
    )

    def for_task(self, data: TaskData) -> Timeouts:
        own = data.timeout.model_dump(exclude_none=True)
        return self.model_copy(update=own) if own else self


class SessionBroker(Protocol):
    """Where rollouts open and close interception sessions: the in-process app, or (on Ray)
    the node's interception deployment. ``conclude`` returns the recorded trace."""

    async def register(
        self,
        trace: Trace,
        limits: Limits,
        stop_check: Callable[[Trace], Awaitable[str | None]] | None,
        sampling: Mapping[str, Any] | None,
    ) -> str: ...

    async def conclude(self, secret: str) -> Trace: ...

    async def snapshot(self, secret: str) -> Trace:
        """The session's trace as recorded so far (in this process: the live object; across
        processes: a copy), for the task's user between segments."""
        ...

    def endpoint(self, secret: str) -> str | None:
        """The URL of the interception holding the session, when it is not the rollout's
        ``interception_url`` (a replica of a deployment answers for its own sessions)."""
        ...


class RolloutPlan(BaseModel):
    """Everything about a rollout other than its task, fixed for a whole run."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    model: str
    harness_id: str
    runtime_type: str
    sampling: dict[str, Any] = {}
    limits: Limits = Limits()
    timeouts: Timeouts = Timeouts()
    scoring_overrides: dict[str, str] = {}
    seat: str | None = None
    """The seat these rollouts play in a multi-agent episode (stamped on the trace)."""
    agent_name: str | None = None
