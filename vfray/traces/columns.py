"""Builders for the nested Arrow columns (message lists, score lists) of the trace tables.

They fill flat child arrays and offsets directly instead of converting a dict per message,
which is the slow path of ``pa.array`` on nested data.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa
import pydantic_core

from vfray.trace import Trace, canonical_json, content_text
from vfray.traces.schema import MESSAGE_TYPE, MESSAGES_TYPE, SCORES_TYPE


def _json(value: Any) -> str:
    return pydantic_core.to_json(value, inf_nan_mode="constants").decode()


class MessagesColumn:
    """Accumulates one ``list<MESSAGE_TYPE>`` value per row."""

    def __init__(self) -> None:
        self._offsets = [0]
        self._children: dict[str, list[Any]] = {field.name: [] for field in MESSAGE_TYPE}

    def append(self, trace: Trace, message_ids: Sequence[str]) -> None:
        c = self._children
        for mid in message_ids:
            message = trace.graph[mid]
            content = message.content
            flat = content is None or isinstance(content, str)
            c["id"].append(mid)
            c["role"].append(message.role)
            c["content"].append(content if flat else content_text(content))
            c["name"].append(message.name)
            c["tool_call_id"].append(message.tool_call_id)
            tool_calls = message.tool_calls
            c["tool_calls_json"].append(None if tool_calls is None else _json(tool_calls))
            c["reasoning_content"].append(message.reasoning_content)
            # The flattened text loses structured parts and provider extras: keep the whole
            # message then, and only then, so plain-text rows stay small.
            plain = flat and not message.model_extra
            c["raw_json"].append(
                None if plain else canonical_json(message.model_dump(exclude_none=True))
            )
        self._offsets.append(len(c["id"]))

    def finish(self) -> pa.Array:
        children = [pa.array(self._children[f.name], type=f.type) for f in MESSAGE_TYPE]
        values = pa.StructArray.from_arrays(children, fields=list(MESSAGE_TYPE))
        offsets = pa.array(self._offsets, type=pa.int32())
        return pa.ListArray.from_arrays(offsets, values, type=MESSAGES_TYPE)


class ScoresColumn:
    """Accumulates one ``list<struct<key, value>>`` (name → score) value per row."""

    def __init__(self) -> None:
        self._offsets = [0]
        self._keys: list[str] = []
        self._values: list[float | None] = []

    def append(self, items: Iterable[tuple[str, float | None]]) -> None:
        for key, value in items:
            self._keys.append(key)
            self._values.append(value)
        self._offsets.append(len(self._keys))

    def finish(self) -> pa.Array:
        item = SCORES_TYPE.value_type
        values = pa.StructArray.from_arrays(
            [pa.array(self._keys, type=pa.string()), pa.array(self._values, type=pa.float64())],
            fields=list(item),
        )
        offsets = pa.array(self._offsets, type=pa.int32())
        return pa.ListArray.from_arrays(offsets, values, type=SCORES_TYPE)
