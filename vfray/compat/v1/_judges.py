"""v1's plugged judges (``TaskConfig.judges``, ``[[env.taskset.task.judges]]``) as vfray judges:
``reference`` is asked through vfray's :class:`~vfray.judges.ReferenceJudge` (its call kept on
``trace.side_calls``) as a reward named by the judge's ``name`` or ``id``, scored after the
task's own rewards. Other judge ids and options vfray has no equivalent for are refused."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from pydantic import BaseModel

from vfray.endpoints.client import ModelEndpoint
from vfray.errors import ConfigError
from vfray.judges.base import VIEWS, View, response_text
from vfray.judges.reference import ReferenceJudge
from vfray.trace import Trace

_OPTIONS = frozenset(
    {"id", "name", "weight", "model", "base_url", "api_key_var", "sampling"}
    | {"answer_field", "question_field", "view", "choices"}
)


@dataclass(frozen=True)
class PluggedJudge:
    """One ``reference`` judge entry, checked."""

    name: str
    weight: float
    answer_field: str
    question_field: str
    view: View
    choices: tuple[str, str]
    endpoint: ModelEndpoint | None
    prompt: str | None = None
    """A package's own reference prompt (its ``ReferenceJudge`` subclass's), else vfray's."""


def _entry(raw: Any) -> dict[str, Any]:
    from vfray.compat.v1._judge import JudgeConfig

    if isinstance(raw, JudgeConfig):  # this layer's: its class defaults count (a package's id)
        return {k: v for k, v in raw.model_dump().items() if v not in (None, {})}
    if isinstance(raw, BaseModel):
        return raw.model_dump(exclude_unset=True)
    if isinstance(raw, Mapping):
        return dict(raw)
    raise ConfigError(f"v1 judge entry {raw!r} is not a table of options")


def plugged_judges(config: Any) -> list[PluggedJudge]:
    """The task config's judges; one line naming what vfray cannot run."""
    judges = []
    for raw in getattr(config, "judges", None) or []:
        entry = _entry(raw)
        kind = str(entry.get("id", ""))
        if kind != "reference" and not _is_reference(raw):
            raise ConfigError(
                f"v1 judge {kind or '(no id)'!r} is not supported by vfray: it runs the "
                "'reference' judge (env.taskset.task.judges)"
            )
        extra = sorted(set(entry) - _OPTIONS)
        if extra:
            raise ConfigError(f"v1 judge options not supported by vfray: {', '.join(extra)}")
        view = entry.get("view", "last_reply")
        if view not in VIEWS:
            raise ConfigError(f"v1 judge view {view!r} is not one of {', '.join(VIEWS)}")
        choices = tuple(entry.get("choices", ("yes", "no")))
        if len(choices) != 2:
            raise ConfigError(f"v1 judge choices must be two labels, got {list(choices)}")
        endpoint = None
        if any(entry.get(k) for k in ("model", "base_url", "api_key_var", "sampling")):
            endpoint = ModelEndpoint(
                model=entry.get("model"),
                base_url=entry.get("base_url"),
                api_key_var=entry.get("api_key_var"),
                sampling=dict(entry.get("sampling") or {}),
            )
        judges.append(
            PluggedJudge(
                name=str(entry.get("name") or kind),
                weight=float(entry.get("weight", 1.0)),
                answer_field=str(entry.get("answer_field", "answer")),
                question_field=str(entry.get("question_field", "")),
                view=cast(View, view),
                choices=(str(choices[0]), str(choices[1])),
                endpoint=endpoint,
                prompt=_package_prompt(raw),
            )
        )
    return judges


def _is_reference(raw: Any) -> bool:
    from vfray.compat.v1._judge import ReferenceJudgeConfig

    return isinstance(raw, ReferenceJudgeConfig)


def _package_prompt(raw: Any) -> str | None:
    """The prompt of the ``ReferenceJudge`` subclass a package defines beside its config
    subclass (v1 resolves the judge of a package's id from that module), if it sets one."""
    from vfray.compat.v1._judge import ReferenceJudge

    if not _is_reference(raw):
        return None
    module = sys.modules.get(type(raw).__module__)
    found = (
        {
            c.prompt
            for c in vars(module).values()
            if isinstance(c, type) and issubclass(c, ReferenceJudge) and c.prompt is not None
        }
        if module is not None
        else set()
    )
    if len(found) > 1:
        raise ConfigError(
            f"v1 judge {raw.id!r}: {type(raw).__module__} defines more than one ReferenceJudge "
            "prompt; vfray cannot tell which is this id's"
        )
    return next(iter(found), None)


async def judge(plugged: PluggedJudge, data: Any, trace: Trace) -> float:
    """v1's reference judge on one rollout: 1.0 when the judge says the response matches the
    task's reference answer, 0.0 when not (and without a call when there is no response)."""
    answer = getattr(data, plugged.answer_field, None)
    if answer is None:
        raise ValueError(f"reference judge found no {plugged.answer_field!r} field on the task")
    if isinstance(answer, list | tuple):
        answer = "\n".join(str(a) for a in answer)
    response = response_text(trace, plugged.view)
    if not response.strip():
        return 0.0
    question = data.prompt_text
    if plugged.question_field:
        found = getattr(data, plugged.question_field, None)
        if found is None:
            raise ValueError(f"judge found no {plugged.question_field!r} field on the task")
        question = str(found)
    asker = ReferenceJudge(
        prompt=plugged.prompt,
        choices=plugged.choices,
        endpoint=plugged.endpoint,
        view=plugged.view,
        name=plugged.name,
        weight=plugged.weight,
    )
    positive, negative = plugged.choices
    verdict = await asker.evaluate(
        trace=trace,
        prompt=question,
        question=question,  # a package prompt's name for it (v1's)
        answer=answer,
        response=response,
        positive=positive,
        negative=negative,
    )
    return 1.0 if verdict.parsed else 0.0
