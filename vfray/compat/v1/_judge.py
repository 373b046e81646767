"""v1's judge called from task code (``vf.Judge(config).complete(...)``, ``vf.JudgeConfig``,
``vf.Judges``, ``vf.JudgeResponse``): asked through vfray's judge call, so the call is on the
trace's ``side_calls``, retried and limited as vfray's judges are. Its endpoint is the config's
``base_url`` / ``api_key_var`` / ``model``; unset (v1's default is Prime's inference service),
the rollout's own model endpoint and model. Plugged judges (``[[env.taskset.task.judges]]``,
a package's ``ReferenceJudgeConfig`` subclass with its ``ReferenceJudge``'s prompt) are run by
:mod:`._judges`."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Generic, Literal, cast

from pydantic import BaseModel, ConfigDict
from typing_extensions import TypeVar

from vfray.compat.v1._types import Usage
from vfray.endpoints.client import ModelEndpoint
from vfray.trace import Message

ParsedT = TypeVar("ParsedT", default=Any)


class JudgeConfig(BaseModel):
    """A judge's endpoint and prompt/scoring knobs (v1's fields; ``model`` unset is the
    rollout's model, where v1 defaults to its own hosted one)."""

    model_config = ConfigDict(extra="forbid")

    base_url: str | None = None
    api_key_var: str | None = None
    id: str = ""
    name: str = ""
    weight: float = 1.0
    model: str | None = None
    sampling: dict[str, Any] = {}
    prompt: Path | None = None
    """A file whose text replaces the judge's prompt template."""


Judges = list[JudgeConfig]
"""A task config's plugged judges (v1's alias)."""

JudgeView = Literal["last_reply", "full_trace"]

ConfigT = TypeVar("ConfigT", bound=JudgeConfig, default=JudgeConfig)


class JudgeResponse(BaseModel, Generic[ParsedT]):
    text: str
    parsed: ParsedT | None = None
    usage: Usage | None = None


class Judge(Generic[ParsedT, ConfigT]):
    """A model asked to grade: ``prompt`` is a template of ``{field}`` placeholders
    (:meth:`build_messages`), :meth:`complete` asks it, :meth:`parse` reads the verdict."""

    prompt: str | None = None
    schema: type[BaseModel] | None = None

    def __init__(self, config: ConfigT | None = None) -> None:
        self.config = cast(ConfigT, config if config is not None else JudgeConfig())
        if self.config.prompt is not None:
            self.prompt = self.config.prompt.read_text()

    @property
    def reward_name(self) -> str:
        own = re.sub(r"(?<!^)(?=[A-Z])", "_", type(self).__name__.removesuffix("Judge")).lower()
        return self.config.name or self.config.id or own or "judge"

    def build_messages(self, **fields: Any) -> str:
        """The prompt with this call's placeholders filled in one pass (other braces stay)."""
        if self.prompt is None:
            name = type(self).__name__
            raise ValueError(f"{name} has no `prompt`; set it or override build_messages")
        if not fields:
            return self.prompt
        pattern = re.compile(r"\{(" + "|".join(map(re.escape, fields)) + r")\}")
        return pattern.sub(lambda m: str(fields[m.group(1)]), self.prompt)

    def parse(self, response: JudgeResponse[ParsedT]) -> ParsedT:
        if self.schema is not None:
            return cast(ParsedT, response.parsed)
        return cast(ParsedT, response.text)

    async def score(self, task: Any, trace: Any) -> float | Mapping[str, float]:
        raise NotImplementedError(f"{type(self).__name__} implements no `score`")

    async def complete(
        self,
        messages: str | list[Any],
        *,
        trace: Any = None,
        schema: type[BaseModel] | None = None,
        parse: Callable[[JudgeResponse[Any]], Any] | None = None,
        **sampling: Any,
    ) -> JudgeResponse[Any]:
        """Ask the judge once (vfray's judge retries a failed call); with ``trace`` (v1's or
        vfray's), the call is kept on the trace's ``side_calls``."""
        from vfray.judges.base import Judge as VfrayJudge

        cfg = self.config
        endpoint = None
        if cfg.base_url or cfg.model or cfg.sampling or sampling:
            endpoint = ModelEndpoint(
                model=cfg.model,
                base_url=cfg.base_url,
                api_key_var=cfg.api_key_var,
                sampling={**cfg.sampling, **sampling},
            )
        asker: VfrayJudge[Any] = VfrayJudge(schema=schema, endpoint=endpoint, name=self.reward_name)
        if isinstance(messages, str):
            wire = [Message(role="user", content=messages)]
        else:
            wire = [
                Message(role=str(_get(m, "role")), content=_get(m, "content")) for m in messages
            ]
        own = getattr(trace, "vfray", trace)  # v1's trace view carries vfray's trace
        got = await asker.complete(wire, trace=own)
        response: JudgeResponse[Any] = JudgeResponse(
            text=got.text,
            parsed=got.parsed if schema is not None else None,
            usage=Usage(
                prompt_tokens=got.usage.input_tokens, completion_tokens=got.usage.output_tokens
            ),
        )
        if parse is not None:
            response.parsed = parse(response)
        return response

    async def evaluate(self, *, trace: Any = None, **fields: Any) -> JudgeResponse[ParsedT]:
        messages = self.build_messages(**fields)
        return await self.complete(messages, trace=trace, schema=self.schema, parse=self.parse)


def _get(message: Any, key: str) -> Any:
    return message.get(key) if isinstance(message, Mapping) else getattr(message, key)


class ReferenceJudgeConfig(JudgeConfig):
    """v1's reference-answer judge, plugged on a task config's ``judges``: a package may
    subclass it under its own ``id`` and give a :class:`ReferenceJudge` subclass in the same
    module its prompt (``{question}``, ``{answer}``, ``{response}``, ``{positive}``,
    ``{negative}``)."""

    id: str = "reference"
    answer_field: str = "answer"
    question_field: str = ""
    view: JudgeView = "last_reply"
    choices: tuple[str, str] = ("yes", "no")


class ReferenceJudge(Judge[float, ReferenceJudgeConfig]):
    """Plugged, it is scored by vfray's reference judge with this class's ``prompt`` (None:
    vfray's own reference prompt)."""
