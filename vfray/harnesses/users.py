"""A task's user: a ``@vf.user`` method (a function of the trace returning the next user message,
or None to end) or a :class:`SimulatedUser` (a model with its own system prompt, its calls kept
on ``trace.side_calls``). Each message it says starts one more segment of the agent
(:mod:`vfray.harnesses.session`); a task with ``prompt=None`` is opened by it.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from vfray._hook_calls import run_in_hook_thread
from vfray.endpoints.client import ModelEndpoint, chat
from vfray.errors import ConfigError
from vfray.task import Task, call_maybe_async
from vfray.trace import Message, Trace

F = TypeVar("F", bound=Callable[..., Any])

USER_ATTR = "__vfray_user__"
INJECTABLE = frozenset({"trace", "task"})

DONE = "###DONE###"
"""What a simulated user says to end the conversation (by default)."""

OPENING = "Start the conversation: write your first message to the assistant."
"""The turn a simulated user is given when nothing has been said yet."""


def user(fn: F) -> F:
    """Mark a Task method as the task's user: it gets ``trace`` (and ``task``) by name, sync
    or async, and returns the next user message, or None to end the conversation."""
    target = fn.__func__ if isinstance(fn, staticmethod | classmethod) else fn
    if not callable(target):
        raise TypeError("@vf.user decorates a method")
    setattr(target, USER_ATTR, True)
    return fn


def fill(template: str, fields: Mapping[str, Any]) -> str:
    """Replace ``{name}`` for the given names only, in one pass: a literal brace elsewhere (a
    JSON example) stays, and a value holding ``{other}`` is not substituted again."""
    if not fields:
        return template
    pattern = re.compile(r"\{(" + "|".join(map(re.escape, fields)) + r")\}")
    return pattern.sub(lambda m: str(fields[m.group(1)]), template)


def task_fields(task: Task[Any]) -> dict[str, Any]:
    """A task's data as template fields, plus ``prompt`` as text."""
    fields = {k: v for k, v in task.data.model_dump().items() if not isinstance(v, dict | list)}
    fields["prompt"] = task.data.prompt_text
    return fields


class SimulatedUser:
    """A user played by a model: ``system_prompt`` (``{field}`` filled from the task's data)
    says who it is; it sees the agent's replies as the other side of the conversation and
    ends it by saying ``done`` (or nothing). Set it as a Task class attribute.

    ``endpoint`` defaults to the rollout's model endpoint. Each call (and each retry) is kept
    on ``trace.side_calls`` with kind ``user``, never among the agent's calls.
    """

    def __init__(
        self,
        system_prompt: str,
        *,
        endpoint: ModelEndpoint | None = None,
        done: str = DONE,
        opening: str = OPENING,
        retries: int = 2,
        name: str | None = None,
    ) -> None:
        if retries < 0:
            raise ValueError("retries must be >= 0")
        self.system_prompt = system_prompt
        self.endpoint = endpoint
        self.done = done
        self.opening = opening
        self.retries = retries
        self.name = name or "user"
        setattr(self, USER_ATTR, True)

    def __set_name__(self, owner: type, name: str) -> None:
        if self.name == "user":
            self.name = name

    def conversation(self, trace: Trace, task: Task[Any]) -> list[Message]:
        """The request: its system prompt, then the exchange as it saw it (its own lines as
        the assistant's, the agent's replies as the user's; tools and the agent's system
        prompt left out)."""
        own = [c.reply for c in trace.side_calls if c.kind == "user" and c.name == self.name]
        said = {line.strip() for line in own if line}
        turns: list[Message] = []
        pending: list[str] = []
        for message in trace.messages:
            text = message.text.strip()
            if message.role == "user" and text in said:
                if pending:
                    turns.append(Message(role="user", content="\n\n".join(pending)))
                    pending = []
                turns.append(Message(role="assistant", content=text))
            elif message.role == "assistant" and text:
                pending.append(text)
        if pending:
            turns.append(Message(role="user", content="\n\n".join(pending)))
        if not turns or turns[-1].role != "user":
            turns.append(Message(role="user", content=self.opening))
        system = fill(self.system_prompt, task_fields(task))
        return [Message(role="system", content=system), *turns]

    async def __call__(self, trace: Trace, task: Task[Any]) -> str | None:
        messages = self.conversation(trace, task)
        reply, _ = await chat(
            messages,
            kind="user",
            name=self.name,
            endpoint=self.endpoint,
            trace=trace,
            retries=self.retries,
        )
        text = reply.text.strip()
        if not text or self.done in text:
            return None
        return text

    def __repr__(self) -> str:
        return f"SimulatedUser(name={self.name!r})"


@dataclass(frozen=True)
class TaskUser:
    """The task's user resolved for one task: its name, whether the task declares one
    (``@vf.user`` or a :class:`SimulatedUser`; else it is ``Task.next_message``), and the
    call."""

    name: str
    declared: bool
    ask: Callable[[Trace], Awaitable[Any]]


@functools.cache
def declared_user(cls: type) -> tuple[str, Any] | None:
    """The user a Task class declares (its attribute name and the raw attribute), or None.
    Raises :class:`ConfigError` for two of them, or one beside an overridden next_message."""
    found: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        for name, raw in vars(klass).items():
            target = raw.__func__ if isinstance(raw, staticmethod | classmethod) else raw
            if getattr(target, USER_ATTR, False) is True:
                found[name] = raw
            elif name in found:
                found.pop(name)  # overridden without the decorator: no longer a user
    if len(found) > 1:
        raise ConfigError(f"{cls.__qualname__} declares several users: {', '.join(found)}")
    if not found:
        return None
    name, raw = next(iter(found.items()))
    if getattr(cls, "next_message", None) is not Task.next_message:
        raise ConfigError(
            f"{cls.__qualname__} declares the user {name!r} and overrides next_message; keep one"
        )
    if inspect.isfunction(raw):
        params = list(inspect.signature(raw).parameters.values())[1:]
        for p in params:
            if (
                p.name not in INJECTABLE
                and p.default is p.empty
                and p.kind
                not in (
                    p.VAR_POSITIONAL,
                    p.VAR_KEYWORD,
                )
            ):
                raise ConfigError(
                    f"{cls.__qualname__}.{name}: parameter {p.name!r} cannot be injected; a "
                    "user may take trace, task"
                )
    return name, raw


def task_user(task: Task[Any]) -> TaskUser:
    """The user of ``task``: its declared one, else its ``next_message``."""
    cls: type = type(task)
    declared = declared_user(cls)
    if declared is None:

        async def next_message(trace: Trace) -> Any:
            return await call_maybe_async(task.next_message, trace)

        return TaskUser("next_message", False, next_message)
    name, raw = declared
    if isinstance(raw, SimulatedUser):
        simulated = raw

        async def simulate(trace: Trace) -> Any:
            return await simulated(trace, task)

        return TaskUser(simulated.name, True, simulate)
    method = getattr(task, name)
    params = [p for p in inspect.signature(method).parameters if p in INJECTABLE]

    async def ask(trace: Trace) -> Any:
        available = {"trace": trace, "task": task}
        kwargs = {p: available[p] for p in params}
        if inspect.iscoroutinefunction(method):
            return await method(**kwargs)
        # A sync user runs on a hook thread of its own: a blocking one never stalls the loop
        # other rollouts share.
        result = await run_in_hook_thread(method, **kwargs)
        return await result if inspect.isawaitable(result) else result

    return TaskUser(name, True, ask)
