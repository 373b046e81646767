"""TaskData hashing and subclass fields; Task identity (key, hash, record) and hooks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pydantic
import pytest

from vfray.task import Task, TaskData, call_maybe_async

REPO = Path(__file__).resolve().parents[1]


class MathData(TaskData):
    answer: int


class OtherMathData(TaskData):
    answer: int


def test_hash_is_stable_for_equal_data() -> None:
    a = MathData(prompt="What is 1 + 1?", answer=2)
    b = MathData(answer=2, prompt="What is 1 + 1?")
    assert a.hash == b.hash
    assert len(a.hash) == 64


def test_hash_is_stable_across_processes() -> None:
    code = (
        "from vfray.task import TaskData\n"
        "class MathData(TaskData):\n"
        "    answer: int\n"
        "print(MathData(prompt='What is 1 + 1?', answer=2).hash)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PYTHONHASHSEED": "123"},
    )
    assert out.stdout.strip() == MathData(prompt="What is 1 + 1?", answer=2).hash


def test_hash_changes_with_any_field_and_with_the_type() -> None:
    base = MathData(prompt="q", answer=2)
    assert base.hash != MathData(prompt="q", answer=3).hash
    assert base.hash != MathData(prompt="q", answer=2, system_prompt="s").hash
    assert base.hash != MathData(prompt="q", answer=2, network_allow=[]).hash
    assert base.hash != OtherMathData(prompt="q", answer=2).hash


def test_subclass_fields_are_typed_and_frozen() -> None:
    data = MathData(prompt="q", answer="7")
    assert data.answer == 7
    with pytest.raises(pydantic.ValidationError):
        MathData(prompt="q", answer="seven")
    with pytest.raises(pydantic.ValidationError):
        data.answer = 8  # type: ignore[misc]


def test_defaults_and_prompt_messages() -> None:
    data = TaskData(prompt="hi", system_prompt="be brief")
    assert data.network_allow == ["*"]
    assert data.network_block == []
    assert [(m.role, m.text) for m in data.prompt_messages] == [
        ("system", "be brief"),
        ("user", "hi"),
    ]
    assert data.prompt_text == "hi"
    assert TaskData().prompt_messages == []  # a user speaks first


def test_key_defaults_to_hash_and_can_be_given() -> None:
    data = MathData(prompt="q", answer=1)
    assert Task(data).key == data.hash
    assert Task(data, key="gsm8k/17").key == "gsm8k/17"
    assert Task(data, key="gsm8k/17").hash == data.hash


def test_key_can_be_overridden_by_a_subclass() -> None:
    class IdTask(Task[MathData]):
        @property
        def key(self) -> str:
            return f"math-{self.data.answer}"

    task = IdTask(MathData(prompt="q", answer=5))
    assert task.key == "math-5"
    record = task.record()
    assert record.key == "math-5"
    assert record.hash == task.hash
    assert record.type.endswith(":MathData")
    assert record.data["answer"] == 5
    assert MathData.model_validate(record.data) == task.data


def test_task_rejects_non_taskdata() -> None:
    with pytest.raises(TypeError):
        Task({"prompt": "q"})  # type: ignore[type-var]


async def test_hooks_may_be_sync_or_async() -> None:
    calls: list[str] = []

    class Both(Task[TaskData]):
        def setup(self, trace: object, runtime: object) -> None:
            calls.append("setup")

        async def finalize(self, trace: object, runtime: object) -> None:
            calls.append("finalize")

    task = Both(TaskData(prompt="q"))
    await call_maybe_async(task.setup, None, None)
    await call_maybe_async(task.finalize, None, None)
    await call_maybe_async(task.validate, None)
    assert calls == ["setup", "finalize"]
