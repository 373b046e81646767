"""The typed boundaries a v1 ``@stop`` watches (``Request``, ``Response``), v1's ``Reward``, its
chat message classes and content parts, and a view of a vfray runtime with v1's call shapes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

from vfray.runtimes.base import ProgramResult

if TYPE_CHECKING:
    from vfray.runtimes.base import Runtime


class TextContentPart(BaseModel):
    """A text part of a message's content (OpenAI's ``{"type": "text", "text": ...}``)."""

    type: Literal["text"] = "text"
    text: str


class ImageUrlSource(BaseModel):
    url: str
    """An ``https:`` URL or a ``data:image/...;base64,`` one."""


class ImageUrlContentPart(BaseModel):
    """An image part (OpenAI's ``{"type": "image_url", "image_url": {"url": ...}}``)."""

    type: Literal["image_url"] = "image_url"
    image_url: ImageUrlSource


ContentPart = TextContentPart | ImageUrlContentPart
MessageContent = str | list[ContentPart]


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    content: Any = None


class SystemMessage(_Message):
    role: Literal["system"] = "system"


class UserMessage(_Message):
    role: Literal["user"] = "user"


class ToolCall(BaseModel):
    """A tool call in an assistant message: ``arguments`` is the JSON text the model wrote."""

    id: str
    name: str
    arguments: str


class Tool(BaseModel):
    """A tool offered to the model (a request's ``tools``)."""

    name: str
    description: str
    parameters: dict[str, Any]
    strict: bool | None = None


class AssistantMessage(_Message):
    role: Literal["assistant"] = "assistant"
    tool_calls: list[Any] | None = None
    reasoning_content: str | None = None


class ToolMessage(_Message):
    role: Literal["tool"] = "tool"
    tool_call_id: str | None = None


Messages = list[Any]
Message = Any
"""Any of the four message classes (v1's is a union on ``role``; vfray's messages are read
duck-typed, so a value of any of them passes)."""
ID = str
"""A plugin id (a judge's, a harness's): v1's alias of ``str``."""


class Request(BaseModel):
    """The conversation about to be sent to the model (a request ``@stop`` sees it)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    messages: list[Any]
    tools: list[Any] | None = None


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_input_tokens: int | None = None
    reasoning_tokens: int | None = None
    cost: float | None = None


class Response(BaseModel):
    """One sampled reply (a response ``@stop`` sees it)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    id: str = ""
    created: int = 0
    model: str = ""
    message: Any = None
    finish_reason: str | None = None
    usage: Usage | None = None


class Reward(BaseModel):
    score: float
    weight: float = 1.0

    @property
    def value(self) -> float:
        return self.score * self.weight


class RuntimeView:
    """A vfray runtime answering v1's call shapes (``run_uv_script(script, args, env)``,
    ``read(path, max_bytes)``); everything else is the runtime itself."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    async def run(self, argv: Sequence[str], env: dict[str, str] | None = None) -> ProgramResult:
        return await self._runtime.run(list(argv), env)

    async def run_uv_script(
        self,
        script: str | bytes,
        args: Sequence[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> ProgramResult:
        return await self._runtime.run_uv_script(script, list(args or ()), env=env)

    async def prepare_uv_script(self, script: str | bytes) -> None:
        await self._runtime.prepare_uv_script(script)

    async def read(self, path: str, max_bytes: int | None = None) -> bytes:
        data = await self._runtime.read(path)
        return data if max_bytes is None else data[:max_bytes]

    async def write(self, path: str, data: bytes) -> None:
        await self._runtime.write(path, data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)
