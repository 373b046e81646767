"""Toolsets: a class whose ``@tool`` methods an agent calls over MCP, and ``McpServer`` for a
server vfray does not implement (by URL, or a stdio command run in the box).

A tool's typed parameters become its JSON schema (through pydantic), its docstring its
description. ``scope`` says whether each rollout gets its own instance or one instance serves
the whole run (per-rollout state then lives in :attr:`Toolset.state`, keyed by the rollout);
``placement`` says whether it runs on the host or inside the rollout's box.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar, TypeVar, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

F = TypeVar("F", bound=Callable[..., Any])

TOOL_ATTR = "__vfray_tool__"
INTERCEPT_ATTR = "__vfray_intercept__"


class Scope(str, Enum):
    ROLLOUT = "rollout"
    """A fresh instance per rollout, started with it and dropped when it ends."""
    SHARED = "shared"
    """One instance per run on the local backend (the farm's process) and one per node on Ray
    (the node's ``ToolsetNode`` actor, whatever the hosts on it), kept while the farm lives;
    per-rollout state in ``self.state``. Host-placed only (refused in a box)."""


class Placement(str, Enum):
    HOST = "host"
    """Served by the farm process; the box reaches it the way it reaches the interception."""
    BOX = "box"
    """Served inside the rollout's box (``Runtime.run_background``), reached on loopback."""


class ToolFailed(Exception):
    """Raised by a tool to return an error result to the model (``isError``) with this text."""


def tool(fn: F | None = None, /, *, name: str | None = None) -> Any:
    """Mark a :class:`Toolset` method as a tool. Its parameters must carry type hints."""

    def mark(f: F) -> F:
        setattr(f, TOOL_ATTR, name or f.__name__)
        return f

    return mark(fn) if fn is not None else mark


def intercept(fn: F) -> F:
    """Mark a :class:`Toolset` method ``(self, name, arguments, result) -> str | None`` that may
    rewrite a tool's result before the agent (and so the model) sees it; None keeps it. The
    trace keeps the original result next to the rewritten one."""
    setattr(fn, INTERCEPT_ATTR, True)
    return fn


@dataclass(frozen=True)
class ToolSpec:
    """One tool as MCP lists it, plus how to call it."""

    name: str
    description: str
    input_schema: dict[str, Any]
    method: str
    params: type[BaseModel]

    def as_mcp(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "inputSchema": self.input_schema,
        }


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _spec_of(cls: type, attr: str, fn: Callable[..., Any], name: str) -> ToolSpec:
    hints = get_type_hints(fn)
    fields: dict[str, Any] = {}
    for pname, param in list(inspect.signature(fn).parameters.items())[1:]:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {cls.__name__}.{attr}: *args/**kwargs cannot be described")
        if pname not in hints:
            raise TypeError(f"tool {cls.__name__}.{attr}: parameter {pname!r} has no type hint")
        default = ... if param.default is param.empty else param.default
        fields[pname] = (hints[pname], default)
    params = create_model(
        f"{cls.__name__}_{attr}_params",
        __config__=ConfigDict(extra="forbid"),
        **fields,
    )
    schema = params.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    doc = inspect.getdoc(fn) or ""
    return ToolSpec(name, doc.split("\n\n")[0].strip(), schema, attr, params)


_STATE: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "vfray_tool_state", default=None
)


class Toolset:
    """Base of a toolset. Subclass it, add ``@vf.tool`` methods, and return an instance from
    ``Task.toolsets()``. Instances must pickle (they travel to Ray hosts and into boxes)."""

    name: ClassVar[str] = ""
    """The MCP server's name as the agent sees it (default: the class name in snake case)."""
    scope: ClassVar[Scope] = Scope.ROLLOUT
    placement: ClassVar[Placement] = Placement.HOST
    call_timeout: ClassVar[float] = 60.0
    """Seconds one call may run before the agent gets an error result (recorded as one)."""
    max_result_chars: ClassVar[int] = 1_000_000
    """A longer result is refused: the agent gets an error, the trace a ``ToolError``."""

    @classmethod
    def server_name(cls) -> str:
        return cls.name or _snake(cls.__name__)

    @classmethod
    def specs(cls) -> dict[str, ToolSpec]:
        """The class's tools by name (built once per class)."""
        cached = cls.__dict__.get("_vfray_specs")
        if cached is None:
            cached = {}
            for attr in dir(cls):
                fn = getattr(cls, attr, None)
                name = getattr(fn, TOOL_ATTR, None)
                if callable(fn) and isinstance(name, str):
                    cached[name] = _spec_of(cls, attr, fn, name)
            cls._vfray_specs = cached  # type: ignore[attr-defined]
        return dict(cached)

    @property
    def state(self) -> dict[str, Any]:
        """This rollout's own state: a dict no other rollout sees (in a shared toolset too)."""
        state = _STATE.get()
        if state is None:
            state = self.__dict__.setdefault("_vfray_state", {})
        return state

    async def call(
        self, name: str, arguments: Mapping[str, Any], state: dict[str, Any] | None = None
    ) -> str:
        """Run tool ``name``; returns its result as text. Raises :class:`ToolFailed` for a
        result the model should see as an error, ``asyncio.TimeoutError`` past
        ``call_timeout``."""
        spec = self.specs().get(name)
        if spec is None:
            raise ToolFailed(f"unknown tool {name!r}; available: {', '.join(self.specs())}")
        try:
            params = spec.params.model_validate(dict(arguments))
        except ValidationError as exc:
            raise ToolFailed(f"invalid arguments for {name}: {exc}") from None
        kwargs = {k: getattr(params, k) for k in type(params).model_fields}
        token = _STATE.set(state) if state is not None else None
        try:
            fn = getattr(self, spec.method)
            if inspect.iscoroutinefunction(fn):
                value = await asyncio.wait_for(fn(**kwargs), self.call_timeout)
            else:
                # A thread of its own: a slow sync tool must not stall the server's loop. The
                # context (this rollout's state) goes with it.
                ctx = contextvars.copy_context()
                value = await asyncio.wait_for(
                    asyncio.to_thread(lambda: ctx.run(fn, **kwargs)), self.call_timeout
                )
        finally:
            if token is not None:
                _STATE.reset(token)
        return value if isinstance(value, str) else _to_text(value)

    def intercept_result(self, name: str, arguments: Mapping[str, Any], result: str) -> str | None:
        """Apply the ``@intercept`` methods in name order; None when none rewrote ``result``."""
        rewritten: str | None = None
        for attr in sorted(dir(type(self))):
            fn = getattr(self, attr, None)
            if callable(fn) and getattr(fn, INTERCEPT_ATTR, False):
                out = fn(name, dict(arguments), rewritten if rewritten is not None else result)
                if isinstance(out, str):
                    rewritten = out
        return rewritten


def _to_text(value: Any) -> str:
    import json

    if isinstance(value, BaseModel):
        return value.model_dump_json()
    return json.dumps(value, ensure_ascii=False, default=str)


class McpServer(BaseModel):
    """An MCP server vfray does not implement: at ``url`` (streamable HTTP, reached from the box
    as given), or a ``command`` speaking MCP over stdio, started in the box for each rollout
    and served to the agent over HTTP by the farm, which records its calls."""

    model_config = ConfigDict(frozen=True)

    name: str
    url: str | None = None
    command: tuple[str, ...] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    call_timeout: float = 60.0
    start_timeout: float = 30.0
    """Seconds a ``command`` server may take to answer ``initialize``."""

    def model_post_init(self, _: Any) -> None:
        if (self.url is None) == (self.command is None):
            raise ValueError("McpServer needs exactly one of url= or command=")


ToolSource = Toolset | McpServer
"""What ``Task.toolsets()`` returns a sequence of."""


def task_toolsets(task: Any) -> Sequence[ToolSource]:
    """The tool sources a task declares (``Task.toolsets()``; none when it has no such method)."""
    fn = getattr(task, "toolsets", None)
    sources = list(fn()) if callable(fn) else []
    names = [s.server_name() if isinstance(s, Toolset) else s.name for s in sources]
    if len(set(names)) != len(names):
        raise ValueError(f"two tool servers share a name: {names}")
    return sources
