"""``vfray validate TASKSET``: load the first tasks, check their keys and that their data
round-trips through JSON, and run each task's ``validate`` hook inside a started runtime.

Every problem is collected (one bad task does not hide the next) and printed as a table;
the exit code is 1 when there is any. For Harbor tasks (``harbor:PATH``) it also runs the
``oracle`` harness (each task's ``solution/solve.sh``, no model) on the docker runtime by
default, and lists every task the oracle does not solve (reward below 1.0) as a problem.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vfray.errors import ConfigError
from vfray.runtimes.registry import make_runtime, runtime_class, task_spec
from vfray.task import Task, call_maybe_async
from vfray.tasksets import load_taskset

if TYPE_CHECKING:
    from rich.table import Table


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one task (``index`` is None when the taskset itself failed)."""

    index: int | None
    key: str
    check: str
    message: str


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "validate",
        allow_abbrev=False,
        help="check a taskset's tasks (keys, serialization, Task.validate in a runtime)",
    )
    parser.add_argument("taskset", help="taskset id, module:Class or file.py:Class")
    parser.add_argument(
        "-n", "--num-tasks", type=int, default=20, help="check the first N tasks (default 20)"
    )
    parser.add_argument(
        "--runtime",
        default=None,
        help="runtime type for validate() (default: subprocess; docker for harbor:PATH)",
    )
    parser.add_argument(
        "--runtime-options", default="{}", metavar="JSON", help="runtime options, a JSON object"
    )
    parser.add_argument(
        "--taskset-args", default="{}", metavar="JSON", help="taskset constructor arguments"
    )
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds per task for runtime + validate"
    )
    parser.set_defaults(run=run)
    return parser


def _json_object(text: str, flag: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{flag} must be a JSON object: {exc}") from exc
    if not isinstance(value, dict):
        raise ConfigError(f"{flag} must be a JSON object, got {type(value).__name__}")
    return value


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300]


def check_data(index: int, task: Task[Any]) -> list[Problem]:
    """The task's data must survive ``model_dump_json`` → ``model_validate_json`` unchanged,
    since that is how it crosses to Ray workers and lands in traces."""
    data = task.data
    cls = type(data)
    try:
        text = data.model_dump_json()
    except Exception as exc:
        return [Problem(index, task.key, "serialize", _describe(exc))]
    try:
        again = cls.model_validate_json(text)
    except Exception as exc:
        return [Problem(index, task.key, "round-trip", _describe(exc))]
    if again != data or again.hash != data.hash:
        return [
            Problem(
                index,
                task.key,
                "round-trip",
                f"{cls.__name__} changes through JSON (a field that JSON cannot carry exactly?)",
            )
        ]
    return []


def collect(
    taskset_spec: str, args: dict[str, Any], limit: int
) -> tuple[list[Task[Any]], list[Problem]]:
    """Load up to ``limit`` tasks, reporting non-Task items, duplicate keys and load errors."""
    taskset = load_taskset(taskset_spec, args)
    tasks: list[Task[Any]] = []
    problems: list[Problem] = []
    first_index: dict[str, int] = {}
    # load() rather than iteration: iteration stops at the first duplicate, we want them all.
    try:
        for index, item in enumerate(itertools.islice(taskset.load(), limit)):
            if not isinstance(item, Task):
                problems.append(
                    Problem(index, "-", "type", f"yielded {type(item).__name__}, not a vf.Task")
                )
                continue
            try:
                key = item.key
            except Exception as exc:
                problems.append(Problem(index, "-", "key", _describe(exc)))
                continue
            if key in first_index:
                problems.append(
                    Problem(index, key, "unique key", f"same key as task {first_index[key]}")
                )
            else:
                first_index[key] = index
            problems += check_data(index, item)
            tasks.append(item)
    except Exception as exc:
        problems.append(Problem(None, "-", "load", _describe(exc)))
    return tasks, problems


async def validate_in_runtime(
    index: int, task: Task[Any], runtime_type: str, options: dict[str, Any], timeout: float
) -> list[Problem]:
    """Start a runtime shaped by the task (image, workdir, network), run ``task.validate``."""
    runtime = make_runtime(runtime_type, task_spec(task.data), **options)
    try:
        async with asyncio.timeout(timeout):
            await runtime.start()
            await call_maybe_async(task.validate, runtime)
    except TimeoutError:
        return [Problem(index, task.key, "validate", f"timed out after {timeout:g} s")]
    except Exception as exc:
        return [Problem(index, task.key, "validate", _describe(exc))]
    finally:
        await runtime.stop()
    return []


async def validate_all(
    tasks: list[Task[Any]], runtime_type: str, options: dict[str, Any], timeout: float
) -> list[Problem]:
    problems: list[Problem] = []
    # One at a time: a validate hook may be heavy (build an image, run a test suite).
    for index, task in enumerate(tasks):
        problems += await validate_in_runtime(index, task, runtime_type, options, timeout)
    return problems


def problems_table(problems: list[Problem]) -> Table:
    from rich.table import Table

    table = Table(title="problems", show_header=True, header_style="bold")
    for column in ("task", "key", "check", "problem"):
        table.add_column(column)
    for p in problems:
        table.add_row("-" if p.index is None else str(p.index), p.key[:40], p.check, p.message)
    return table


ORACLE_AT_ONCE = 4
"""Oracle rollouts of ``harbor:`` tasks run at once (each builds and starts a box)."""


async def oracle_problems(
    tasks: list[Task[Any]], runtime_type: str, options: dict[str, Any]
) -> list[Problem]:
    """Run the ``oracle`` harness on every task: a task it does not solve (reward below 1.0,
    or none) is a problem, with the rollout's first error."""
    from vfray.run.environment import LocalEnvironment

    slots = asyncio.Semaphore(ORACLE_AT_ONCE)
    async with LocalEnvironment(
        harness="oracle", runtime=runtime_type, runtime_options=options
    ) as env:

        async def one(index: int, task: Task[Any]) -> list[Problem]:
            async with slots:
                trace = await env.rollout(task)
            if trace.reward is not None and trace.reward >= 1.0:
                return []
            why = (
                f"{trace.errors[0].type} in {trace.errors[0].phase}: {trace.errors[0].message}"
                if trace.errors
                else "; ".join(trace.notes)
            )
            said = f"oracle scored {trace.reward}" + (f" ({why})" if why else "")
            return [Problem(index, task.key, "oracle", " ".join(said.split())[:300])]

        found = await asyncio.gather(*(one(i, t) for i, t in enumerate(tasks)))
    return [p for problems in found for p in problems]


def run(args: argparse.Namespace) -> int:
    if args.num_tasks < 1:
        raise ConfigError("-n must be at least 1")
    runtime_options = _json_object(args.runtime_options, "--runtime-options")
    taskset_args = _json_object(args.taskset_args, "--taskset-args")
    harbor = args.taskset.startswith("harbor:")
    if args.runtime is None:
        args.runtime = "docker" if harbor else "subprocess"
    runtime_class(args.runtime)  # an unknown runtime is a usage error, before any work
    tasks, problems = collect(args.taskset, taskset_args, args.num_tasks)
    if harbor:  # the oracle's rollouts start each task's box: validate() would do it twice
        problems += asyncio.run(oracle_problems(tasks, args.runtime, runtime_options))
    else:
        problems += asyncio.run(validate_all(tasks, args.runtime, runtime_options, args.timeout))
    problems.sort(key=lambda p: -1 if p.index is None else p.index)
    from rich.console import Console  # imported here: every `vfray` call builds this parser

    console = Console()
    if problems:
        console.print(problems_table(problems))
    console.print(
        f"{len(tasks)} tasks checked in runtime {args.runtime!r}: "
        + (f"{len(problems)} problem(s)" if problems else "no problems")
    )
    return 1 if problems else 0
