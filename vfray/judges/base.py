"""The :class:`Judge`: one chat call built from a prompt template and the task's fields, its
answer parsed (a pydantic schema, a parser, or the text), retried when the endpoint fails or the
answer does not parse, every attempt kept on ``trace.side_calls`` (kind ``judge``).

A judge set as a Task class attribute is a reward of that name (weight and priority as
``@vf.reward``'s); plugged from config (``[env.scoring] name = "pkg.mod:judge"``) it is one too.
It can also be called from any hook: ``await judge.evaluate(trace=trace, answer=...)``. A judge
that gets no usable answer raises :class:`~vfray.errors.JudgeError`, so as a reward its value is
None with that error, like any failing hook.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from pydantic import BaseModel

from vfray.endpoints.client import ModelEndpoint, Unusable, chat
from vfray.errors import JudgeError, ProviderError
from vfray.harnesses.users import fill, task_fields
from vfray.scoring import HOOK_ATTR, HookKind, HookSpec
from vfray.trace import Message, Trace, Usage

if TYPE_CHECKING:
    from vfray.task import Task

ParsedT = TypeVar("ParsedT")

_JSON_OBJECT = re.compile(r"\{.*\}", re.DOTALL)


@dataclass(frozen=True)
class JudgeResponse(Generic[ParsedT]):
    """A judge's usable answer: its text, what it parsed to, the usage of the attempt that
    gave it, and how many attempts that took."""

    text: str
    parsed: ParsedT
    usage: Usage
    attempts: int


def json_object(text: str) -> Any:
    """The JSON object in ``text`` (the whole text, else its outermost ``{...}``: models wrap
    JSON in prose or fences). Raises ValueError when there is none."""
    try:
        return json.loads(text)
    except ValueError:
        match = _JSON_OBJECT.search(text)
        if match is None:
            raise ValueError(f"no JSON object in the answer: {text[:200]!r}") from None
        return json.loads(match.group())


View = Literal["last_reply", "replies", "transcript"]
VIEWS: tuple[View, ...] = ("last_reply", "replies", "transcript")


def response_text(trace: Trace, view: View) -> str:
    """What a judge grades: the agent's last reply, all its replies (a dialogue), or the
    whole exchange with each message's role (tool calls and the system prompt left out)."""
    if view == "last_reply":
        return trace.last_reply or ""
    said = [m for m in trace.messages if m.role in ("user", "assistant") and m.text.strip()]
    if view == "replies":
        return "\n\n".join(m.text.strip() for m in said if m.role == "assistant")
    return "\n\n".join(f"{m.role}: {m.text.strip()}" for m in said)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name.removesuffix("Judge")).lower() or "judge"


class Judge(Generic[ParsedT]):
    """A reward computed by a model.

    ``prompt`` is a template whose ``{field}`` placeholders are filled from the task's data
    fields, ``prompt`` (the task's prompt as text) and ``response`` (the agent's last reply);
    other braces stay as written. The answer is parsed by ``parser`` when given, else validated
    against ``schema`` (a pydantic model, also sent as the request's JSON-schema response
    format when ``structured`` is true), else kept as text; a parser that raises ValueError
    makes the judge ask again, up to ``retries`` more times. :meth:`to_score` turns the parsed
    answer into the reward. ``endpoint`` defaults to the rollout's model endpoint.
    """

    # Defaults a subclass may set; the constructor's arguments shadow them per instance.
    prompt: str | None = None
    system_prompt: str | None = None
    schema: type[BaseModel] | None = None

    def __init__(
        self,
        prompt: str | None = None,
        *,
        system_prompt: str | None = None,
        schema: type[BaseModel] | None = None,
        parser: Callable[[str], ParsedT] | None = None,
        structured: bool = True,
        endpoint: ModelEndpoint | None = None,
        retries: int = 2,
        view: View = "last_reply",
        weight: float = 1.0,
        priority: int = 0,
        name: str | None = None,
    ) -> None:
        if retries < 0:
            raise ValueError("retries must be >= 0")
        if view not in VIEWS:
            raise ValueError(f"view must be one of {', '.join(VIEWS)}, got {view!r}")
        self.view = view
        if prompt is not None:
            self.prompt = prompt
        if system_prompt is not None:
            self.system_prompt = system_prompt
        if schema is not None:
            self.schema = schema
        self.parser = parser
        self.structured = structured
        self.endpoint = endpoint
        self.retries = retries
        self.name = name
        setattr(self, HOOK_ATTR, HookSpec(HookKind.REWARD, float(weight), int(priority)))

    def __set_name__(self, owner: type, name: str) -> None:
        if self.name is None:
            self.name = name

    @property
    def reward_name(self) -> str:
        return self.name or _snake(type(self).__name__)

    # -- building and parsing ------------------------------------------------------------

    def build_messages(self, **fields: Any) -> list[Message]:
        if self.prompt is None:
            raise JudgeError(f"{type(self).__name__} has no prompt; set one")
        messages = [Message(role="user", content=fill(self.prompt, fields))]
        if self.system_prompt:
            messages.insert(0, Message(role="system", content=fill(self.system_prompt, fields)))
        return messages

    def parse(self, text: str) -> ParsedT:
        """The answer parsed; raise ValueError to have the judge ask again."""
        if self.parser is not None:
            return self.parser(text)
        if self.schema is not None:
            # pydantic's ValidationError is a ValueError: a wrong shape is asked again too.
            parsed: Any = self.schema.model_validate(json_object(text))
            return parsed  # type: ignore[no-any-return]
        return text  # type: ignore[return-value]

    def request_fields(self) -> dict[str, Any]:
        """Extra request fields: the JSON-schema response format when there is a schema."""
        if self.schema is None or not self.structured:
            return {}
        return {
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": self.schema.__name__,
                    "schema": self.schema.model_json_schema(),
                },
            }
        }

    # -- calling -------------------------------------------------------------------------

    async def complete(
        self, messages: list[Message], *, trace: Trace | None = None
    ) -> JudgeResponse[ParsedT]:
        """Ask the model, with retries; every attempt lands on ``trace.side_calls``."""
        try:
            reply, parsed = await chat(
                messages,
                kind="judge",
                name=self.reward_name,
                endpoint=self.endpoint,
                trace=trace,
                retries=self.retries,
                extra=self.request_fields(),
                accept=self.parse,
            )
        except (ProviderError, Unusable, ValueError) as exc:
            tries = self.retries + 1
            raise JudgeError(
                f"judge {self.reward_name!r} got no usable answer in {tries} "
                f"attempt{'s' if tries > 1 else ''}: {type(exc).__name__}: {exc}"
            ) from exc
        except Exception as exc:  # no endpoint, a parser that broke: still the judge's failure
            raise JudgeError(
                f"judge {self.reward_name!r} failed: {type(exc).__name__}: {exc}"
            ) from exc
        return JudgeResponse(reply.text, parsed, reply.usage, reply.attempts)

    async def evaluate(
        self, *, trace: Trace | None = None, **fields: Any
    ) -> JudgeResponse[ParsedT]:
        """Fill the template with ``fields`` and ask."""
        return await self.complete(self.build_messages(**fields), trace=trace)

    def fields(self, task: Task[Any], trace: Trace) -> dict[str, Any]:
        """The template's fields for one rollout: the task's data fields, ``prompt``, and
        ``response`` (what :attr:`view` shows of the agent's conversation)."""
        return {**task_fields(task), "response": response_text(trace, self.view)}

    def to_score(self, parsed: ParsedT) -> float | Mapping[str, float]:
        """The reward: a number or bool as it is, a mapping of them (several keys), or a
        schema object's ``score`` field."""
        value: Any = parsed
        if isinstance(value, BaseModel) and hasattr(value, "score"):
            value = value.score
        if isinstance(value, bool | int | float | Mapping):
            return value
        raise JudgeError(
            f"judge {self.reward_name!r}: cannot score a {type(value).__name__}; "
            "override to_score or parse"
        )

    async def score(self, task: Task[Any], trace: Trace) -> float | Mapping[str, float]:
        """The reward for one rollout (override for other fields or a shortcut)."""
        answer = await self.evaluate(trace=trace, **self.fields(task, trace))
        return self.to_score(answer.parsed)

    async def __call__(self, trace: Trace, task: Task[Any]) -> float | Mapping[str, float]:
        return await self.score(task, trace)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.reward_name!r})"
