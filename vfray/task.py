"""Tasks: the serializable :class:`TaskData` row and the :class:`Task` that adds behaviour.

``TaskData`` is the only part of a task that crosses process boundaries and lands in a trace;
``Task`` holds one and carries the hooks (setup, finalize, validate, and the scoring methods
decorated in :mod:`vfray.scoring`).

Internal: importable, but not the public API (:mod:`vfray`, :mod:`vfray.testing`,
:mod:`vfray.train`, :mod:`vfray.compat.v1`); names here may move.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)

from vfray.trace import Message, TaskRecord, canonical_json
from vfray.trace.messages import UserContent

if TYPE_CHECKING:
    from vfray.runtimes.base import Runtime
    from vfray.trace import Trace


class TaskTimeout(BaseModel):
    """Per-phase deadlines in seconds (None: the run's default applies)."""

    model_config = ConfigDict(frozen=True)

    setup: float | None = None
    agent: float | None = None
    finalize: float | None = None
    scoring: float | None = None


class TaskResources(BaseModel):
    """What one rollout's box needs. They become the box's limits (cpus, memory, pids, and disk
    where the runtime can cap it) and decide where the rollout is placed: a task that asks for
    a GPU runs on a node that has one free, and a task no node can ever fit is refused before
    the run."""

    model_config = ConfigDict(frozen=True)

    cpu: float = 1.0
    """CPU cores: the box's CPU quota, and how many of a node's CPUs the rollout takes."""
    memory: float | None = None
    """Memory in GB: the box's memory limit (a program past it is killed, and the rollout is a
    ``SandboxError``)."""
    gpu: str | None = None
    """GPUs: ``"A100:2"`` (type and count), ``"A100"`` (one of that type) or ``"2"`` (a count).
    The type is a Ray custom resource a node must have (``--resources '{"A100": 2}'``)."""
    disk: float | None = None
    """Disk in GB: the box's writable layer where the runtime can cap it (docker on an
    overlay2/xfs-pquota data root, modal); advisory elsewhere."""
    pids: int | None = None
    """Most processes and threads alive in the box at once (None: the runtime's default)."""

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # pids came later: leaving it out while unset keeps every older task's key (its hash).
        dumped: dict[str, Any] = handler(self)
        if dumped.get("pids") is None:
            dumped.pop("pids", None)
        return dumped

    @property
    def gpu_count(self) -> float:
        """How many GPUs :attr:`gpu` asks for (0 when none)."""
        if not self.gpu:
            return 0.0
        count = self.gpu.rpartition(":")[2] if ":" in self.gpu else self.gpu
        try:
            return float(count)
        except ValueError:
            return 1.0  # a bare type: one of it

    @property
    def gpu_type(self) -> str | None:
        """The GPU type :attr:`gpu` names (``"A100"``), or None for any GPU."""
        if not self.gpu:
            return None
        head = self.gpu.partition(":")[0] if ":" in self.gpu else self.gpu
        try:
            float(head)
        except ValueError:
            return head
        return None


class Artifact(BaseModel):
    """A file in the box kept on the trace (``trace.artifacts``, so in the run folder) after
    ``finalize``; a ``required`` one that is missing fails the rollout's finalize phase."""

    model_config = ConfigDict(frozen=True)

    path: str
    required: bool = True


class TaskData(BaseModel):
    """One task as data. Subclass it to add typed fields, e.g. ``answer: int``."""

    model_config = ConfigDict(frozen=True)

    prompt: str | list[dict[str, Any]] | None = None
    """A user message, a list of chat messages, or None when a user speaks first."""
    system_prompt: str | None = None
    image: str | None = None
    workdir: str | None = None
    network_allow: list[str] = Field(default_factory=lambda: ["*"])
    network_block: list[str] = Field(default_factory=list)
    artifacts: list[Artifact] = Field(default_factory=list)
    timeout: TaskTimeout = Field(default_factory=TaskTimeout)
    resources: TaskResources = Field(default_factory=TaskResources)

    @property
    def hash(self) -> str:
        """SHA-256 of the canonical JSON of the data (type name included)."""
        payload = {"type": type(self).__qualname__, "data": self.model_dump(mode="json")}
        # surrogatepass: a dataset row holding a lone UTF-16 surrogate (a broken scrape) still
        # has an identity; its rollout then fails on its own, not the whole run at planning.
        return hashlib.sha256(canonical_json(payload).encode("utf-8", "surrogatepass")).hexdigest()

    @property
    def prompt_messages(self) -> list[Message]:
        """The prompt as chat messages, with the system prompt first when there is one."""
        messages: list[Message] = []
        if self.system_prompt:
            messages.append(Message(role="system", content=self.system_prompt))
        if isinstance(self.prompt, str):
            messages.append(Message(role="user", content=self.prompt))
        elif isinstance(self.prompt, list):
            messages.extend(Message.model_validate(m) for m in self.prompt)
        return messages

    @property
    def prompt_text(self) -> str:
        """The prompt flattened to text (the user-visible parts only)."""
        return "\n".join(m.text for m in self.prompt_messages if m.role != "system")


DataT = TypeVar("DataT", bound=TaskData)


async def call_maybe_async(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Call a sync or async callable and await the result when it is awaitable."""
    result = fn(*args, **kwargs)
    if inspect.isawaitable(result):
        return await result
    return result


class Task(Generic[DataT]):
    """A task's behaviour around its :class:`TaskData`.

    Override ``setup``/``finalize``/``validate`` (sync or async) and add scoring methods with
    ``@vf.reward``, ``@vf.metric``, ``@vf.stop`` and ``@vf.group_reward``.
    """

    data_type: ClassVar[type[TaskData]] = TaskData

    def __init__(self, data: DataT, key: str | None = None) -> None:
        if not isinstance(data, TaskData):
            raise TypeError(f"Task data must be a TaskData, got {type(data).__name__}")
        self.data: DataT = data
        self._key = key

    @property
    def hash(self) -> str:
        return self.data.hash

    @property
    def key(self) -> str:
        """Durable identity used by resume; defaults to the data hash."""
        return self._key if self._key is not None else self.hash

    def record(self) -> TaskRecord:
        cls = type(self.data)
        return TaskRecord(
            key=self.key,
            hash=self.hash,
            type=f"{cls.__module__}:{cls.__qualname__}",
            data=self.data.model_dump(mode="json"),
        )

    def setup(self, trace: Trace, runtime: Runtime) -> Awaitable[None] | None:
        """Prepare the box before the agent runs (copy files, install things)."""
        return None

    def finalize(self, trace: Trace, runtime: Runtime) -> Awaitable[None] | None:
        """Run after the agent, before scoring (collect artifacts, run a test suite)."""
        return None

    def next_message(self, trace: Trace) -> Awaitable[UserContent | None] | UserContent | None:
        """What the user says once the agent's segment has ended (text, or a list of chat
        content parts: images too), or None to end the exchange.

        Each message starts one more segment of the same agent session (a harness with
        ``SUPPORTS_RESUME``), recorded on the same trace; ``trace`` holds the calls so far. Time
        spent here is not charged to the agent. When the task has no prompt it is asked first.
        """
        return None

    def toolsets(self) -> Sequence[Any]:
        """The tool servers this task gives its agent over MCP: ``vfray.Toolset`` instances
        (a fresh one per rollout for per-rollout toolsets) and ``vfray.McpServer`` records.
        Called once per rollout; a task that overrides it needs a harness with
        ``SUPPORTS_MCP``."""
        return ()

    def validate(self, runtime: Runtime) -> Awaitable[None] | None:
        """Check that the task can run at all in this runtime; raise to reject it."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(key={self.key[:12]!r})"
