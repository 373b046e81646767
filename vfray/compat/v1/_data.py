"""verifiers v1's task row, mirrored field for field (same defaults, same content hash), and its
run-time task config: what a v1 taskset builds its tasks from."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

MAX_ARTIFACT_BYTES = 32 * 1024 * 1024
"""v1's default ``artifact_max_bytes``; part of every row's hash, so it must match v1's."""


def task_key(data: Mapping[str, Any]) -> str:
    """v1's content identity of a row: SHA-256 of its JSON dump with sorted keys."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


class TaskResources(BaseModel):
    model_config = ConfigDict(frozen=True)

    cpu: float | None = None
    memory: float | None = None
    gpu: str | None = None
    disk: float | None = None


class TaskTimeout(BaseModel):
    model_config = ConfigDict(frozen=True)

    setup: float | None = None
    agent: float | None = None
    finalize: float | None = None
    scoring: float | None = None


class Artifact(BaseModel):
    source: str
    exclude: list[str] = Field(default_factory=list)
    required: bool = True


class TaskData(BaseModel):
    """A v1 task row (``verifiers.v1.TaskData``); subclass it to add fields."""

    model_config = ConfigDict(frozen=True)

    idx: int | None = None
    id: str | None = None
    name: str | None = None
    description: str | None = None
    prompt: str | list[Any] | None = None
    system_prompt: str | None = None
    image: str | None = None
    workdir: str | None = None
    agent_user: str | None = None
    skills: list[Path | dict[str, str]] = Field(default_factory=list)
    network_allow: list[str] = Field(default_factory=lambda: ["*"])
    network_block: list[str] = Field(default_factory=list)
    artifacts: list[Artifact] = Field(default_factory=list)
    artifact_max_bytes: int = Field(MAX_ARTIFACT_BYTES, gt=0)
    timeout: TaskTimeout = TaskTimeout()
    resources: TaskResources = TaskResources()

    @property
    def prompt_text(self) -> str:
        if isinstance(self.prompt, str):
            return self.prompt
        texts = [_content_text(_field(m, "content")) for m in self.prompt or []]
        return "\n\n".join(text for text in texts if text)


class WireTaskData(TaskData):
    """A row read back without its task class: unknown fields are kept."""

    model_config = ConfigDict(extra="allow")


def _field(message: Any, name: str) -> Any:
    return message.get(name) if isinstance(message, Mapping) else getattr(message, name, None)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = content or []
    return "".join(str(_field(p, "text") or "") for p in parts if _field(p, "type") == "text")


class DecoratedFunctionConfig(BaseModel):
    """A function plugged in for a decorated task method (``fn`` unset: metadata only)."""

    model_config = ConfigDict(extra="forbid")

    fn: str | None = None
    priority: int | None = None


class RewardFunctionConfig(DecoratedFunctionConfig):
    weight: float | None = None


class TaskConfig(BaseModel):
    """Run-time task knobs (``--env.taskset.task.*``); subclass to add fields."""

    model_config = ConfigDict(extra="forbid")

    judges: list[Any] = Field(default_factory=list)
    stops: dict[str, DecoratedFunctionConfig] = Field(default_factory=dict)
    metrics: dict[str, DecoratedFunctionConfig] = Field(default_factory=dict)
    rewards: dict[str, RewardFunctionConfig] = Field(default_factory=dict)


class TasksetConfig(BaseModel):
    """A taskset's config (``--env.taskset.*``); subclass to add load-time fields."""

    model_config = ConfigDict(extra="forbid")

    id: str = ""
    task: TaskConfig = Field(default_factory=TaskConfig)
    system_prompt: Path | None = None

    @property
    def name(self) -> str:
        return self.id
