"""Harbor task folders as a vfray taskset: ``vfray eval harbor:PATH``, ``harbor(path)`` in
Python.

``PATH`` is one task folder (it holds ``task.toml``), a folder of them (searched up to six
levels down, hidden folders skipped), or a local dataset manifest (a JSON or TOML file listing
tasks by ``path``, relative to it). A task folder is read as Harbor lays it out:

- ``instruction.md`` is the prompt, leading canary lines (an HTML comment or ``#`` line that
  says "canary") dropped;
- ``task.toml`` (schema 1.0 to 1.4, :mod:`vfray.tasksets._harbor_toml`) gives the agent's and
  the verifier's timeouts, the box's cpus, memory, storage and gpus, ``allow_internet``, the
  verifier's env and user, and metadata, which is kept on the task (so on every trace);
- the box is ``environment/Dockerfile`` built through the node's image store (a
  ``dockerfile:`` image), or a ``docker-compose.yaml``'s service ``main`` whose other services
  run as sidecars (docker runtime only), or the prebuilt ``[environment] docker_image``;
- after the agent, :meth:`HarborTask.finalize` uploads ``tests/`` to ``/tests`` (the agent
  never sees it) and runs ``tests/test.sh`` in the same box under the verifier's timeout; the
  reward hooks read ``/logs/verifier/reward.txt`` or ``reward.json``. ``reward`` is its
  ``reward`` value (else the mean of its named values); every other named value is a reward
  of its own at weight 0 (``verifier_rewards``). Files under ``/logs/agent`` are kept as
  artifacts;
- ``solution/solve.sh`` is what the ``oracle`` harness runs instead of an agent;
- a multi-step task (``[[steps]]``, ``steps/<name>/``) runs each step as one segment of the
  same session in the same box, verified between segments (the step's ``tests/`` over the
  task's); ``reward`` is the mean of the steps' (or the final one's, per
  ``multi_step_reward_strategy``), and each step's is a reward named after it.

Harbor's registry (``harbor datasets download``) needs the internet, so vfray never fetches:
a registry name, or a manifest entry with a ``git_url``, is refused in one line saying to
download the dataset and pass its folder.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from vfray import scoring
from vfray.errors import RolloutError, TaskError, TasksetError
from vfray.runtimes.base import Runtime
from vfray.task import Artifact, Task, TaskData, TaskResources, TaskTimeout
from vfray.taskset import Taskset
from vfray.tasksets._harbor_compose import Sidecar, read_environment, start_sidecars
from vfray.tasksets._harbor_folders import find_task_dirs, read_manifest, registry_refusal
from vfray.tasksets._harbor_steps import (
    StepRewards,
    below_min_reward,
    prepare_step,
    reset_verifier_dirs,
    task_rewards,
)
from vfray.tasksets._harbor_toml import HarborConfig, read_config
from vfray.tasksets._harbor_verify import (
    AGENT_LOGS,
    VERIFIER_LOGS,
    keep_agent_logs,
    parse_rewards,
    primary,
    shell,
    verify,
)
from vfray.trace import Trace

logger = logging.getLogger(__name__)

VERIFY_MARGIN = 120.0
"""Seconds the finalize phase gets beyond the verifier's own timeout (uploads, artifacts)."""
_CANARY = re.compile(r"^\s*(<!--.*-->|#.*)\s*$")


class HarborStep(BaseModel):
    """One step of a multi-step task."""

    model_config = ConfigDict(frozen=True)

    name: str
    instruction: str
    verifier_timeout: float
    tests_dir: str | None = None
    solution_dir: str | None = None
    workdir_dir: str | None = None
    """``steps/<name>/workdir/``: uploaded into the box's work dir before the step's agent,
    its ``setup.sh`` run there."""
    verifier_env: dict[str, str] = Field(default_factory=dict)
    """The task's verifier env with the step's over it."""
    verifier_user: str | None = None
    agent_user: str | None = None
    min_reward: float | dict[str, float] | None = None


class HarborData(TaskData):
    """A Harbor task as data: the prompt and box of :class:`TaskData`, plus where its files are
    on this node and what its verifier needs."""

    name: str
    task_dir: str
    tests_dir: str | None = None
    solution_dir: str | None = None
    """The folder the ``oracle`` harness runs ``solve.sh`` from."""
    solution_env: dict[str, str] = Field(default_factory=dict)
    verifier_timeout: float
    verifier_env: dict[str, str] = Field(default_factory=dict)
    verifier_user: str | None = None
    agent_user: str | None = None
    """``[agent] user``: the harness's programs run as this user of the box
    (:attr:`vfray.runtimes.Runtime.program_user`); None: as the box's user."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    schema_version: str = "1.0"
    sidecars: list[Sidecar] = Field(default_factory=list)
    steps: list[HarborStep] = Field(default_factory=list)
    reward_strategy: str = "mean"
    notes: list[str] = Field(default_factory=list)
    """Settings of the task vfray could not honour, one line each (also on every trace)."""


def strip_canary(text: str) -> str:
    """``text`` without its leading canary lines (comments saying "canary") and the blank
    lines after them."""
    lines = text.splitlines()
    while lines and (not lines[0].strip() or (
        _CANARY.match(lines[0]) and "canary" in lines[0].lower()
    )):  # fmt: skip
        lines.pop(0)
    return "\n".join(lines).strip() + "\n"


def _instruction(path: Path) -> str:
    try:
        return strip_canary(path.read_text())
    except OSError as exc:
        raise TasksetError(f"{path.parent}: cannot read {path.name}: {exc}") from exc


def _dir(path: Path) -> str | None:
    return str(path.resolve()) if path.is_dir() else None


def _solution(path: Path) -> str | None:
    return str(path.resolve()) if (path / "solve.sh").is_file() else None


def read_task(folder: Path, key: str | None = None) -> HarborTask:
    """One task folder as a :class:`HarborTask` (its key: ``key``, else its name)."""
    config: HarborConfig = read_config(folder / "task.toml")
    name = config.name or folder.name
    for warning in config.warnings:
        logger.warning("harbor task %s: %s", name, warning)
    box = read_environment(folder / "environment", config.docker_image)
    steps = [
        HarborStep(
            name=step.name,
            instruction=_instruction(folder / "steps" / step.name / "instruction.md"),
            verifier_timeout=step.verifier_timeout or config.verifier_timeout,
            tests_dir=_dir(folder / "steps" / step.name / "tests"),
            solution_dir=_solution(folder / "steps" / step.name / "solution"),
            workdir_dir=_dir(folder / "steps" / step.name / "workdir"),
            verifier_env={**config.verifier_env, **step.verifier_env},
            verifier_user=step.verifier_user or config.verifier_user,
            agent_user=step.agent_user or config.agent_user,
            min_reward=step.min_reward,
        )
        for step in config.steps
    ]
    if steps:
        prompt = steps[0].instruction
        agent = sum(s.agent_timeout or config.agent_timeout for s in config.steps)
        verifying = sum(s.verifier_timeout for s in steps)
    else:
        prompt = _instruction(folder / "instruction.md")
        agent, verifying = config.agent_timeout, config.verifier_timeout
        if not (folder / "tests" / "test.sh").is_file():
            raise TasksetError(f"{folder}: no tests/test.sh (the verifier)")
    notes = list(config.unhonoured)
    if steps:
        notes.append("steps: one agent budget for all steps (the sum of theirs)")
    gb = 1024.0
    data = HarborData(
        prompt=prompt,
        image=box.image,
        workdir=box.workdir,
        network_allow=["*"] if config.allow_internet else [],
        artifacts=[Artifact(path=f"{VERIFIER_LOGS}/reward.json", required=False)],
        timeout=TaskTimeout(agent=agent, finalize=verifying + VERIFY_MARGIN),
        resources=TaskResources(
            cpu=float(config.cpus or 1.0),
            memory=None if config.memory_mb is None else config.memory_mb / gb,
            disk=None if config.storage_mb is None else config.storage_mb / gb,
            gpu=str(config.gpus) if config.gpus else None,
        ),
        name=name,
        task_dir=str(folder.resolve()),
        tests_dir=_dir(folder / "tests"),
        solution_dir=_solution(folder / "solution"),
        solution_env=config.solution_env,
        verifier_timeout=config.verifier_timeout,
        verifier_env=config.verifier_env,
        verifier_user=config.verifier_user,
        agent_user=config.agent_user,
        metadata=config.metadata,
        schema_version=config.schema_version,
        sidecars=list(box.sidecars),
        steps=steps,
        reward_strategy=config.reward_strategy,
        notes=notes,
    )
    for note in notes:
        logger.info("harbor task %s: %s", name, note)
    return (HarborStepsTask if steps else HarborTask)(data, key=key or name)


class HarborTask(Task[HarborData]):
    """A Harbor task: sidecars at setup, the verifier at finalize (or between steps), rewards
    read back from the box."""

    data_type = HarborData

    def __init__(self, data: HarborData, key: str | None = None) -> None:
        super().__init__(data, key)
        self._live: dict[str, dict[str, Any]] = {}
        """Per rollout of a multi-step task (by trace id): its box, the step it is on, the
        steps' rewards in the order run (kept here, not in the box, where a later step's
        agent could write), and whether no further step runs."""
        self._unverified: set[str] = set()
        """Rollouts (trace ids) whose verifier failed: its error is the trace's one error,
        and the reward hooks give no value rather than a second error."""

    async def setup(self, trace: Trace, runtime: Runtime) -> None:
        trace.notes.extend(self.data.notes)
        # /logs/agent open to any user, as Harbor's empty_dirs(chmod=True) leaves it: the
        # agent's user is often not the box's.
        await shell(
            runtime,
            f"mkdir -p {AGENT_LOGS} {VERIFIER_LOGS} && chmod 777 {AGENT_LOGS} "
            "&& rm -rf /tests /solution",
        )
        await start_sidecars(runtime, tuple(self.data.sidecars), self.data.name)
        runtime.program_user = self.data.agent_user
        if self.data.steps:
            first = self.data.steps[0]
            runtime.program_user = first.agent_user
            # A first step whose setup.sh fails leaves nothing to run: the rollout's error.
            await prepare_step(runtime, first.name, first.workdir_dir, first.agent_user)
            self._live[trace.trace_id] = {
                "runtime": runtime, "step": 0, "results": {}, "done": False
            }  # fmt: skip

    def _tests(self, step: HarborStep | None) -> list[Path]:
        found = [self.data.tests_dir] + ([step.tests_dir] if step is not None else [])
        return [Path(p) for p in found if p]

    async def _verify_step(self, trace: Trace, state: dict[str, Any]) -> str | None:
        """Verify the step the agent just did; why no further step runs, or None."""
        step: HarborStep = self.data.steps[state["step"]]
        rewards: StepRewards = None
        try:
            rewards = await verify(
                state["runtime"],
                self._tests(step),
                timeout=step.verifier_timeout,
                env=step.verifier_env,
                user=step.verifier_user,
                trace=trace,
                label=f"verifier/{step.name}",
            )
        except RolloutError as exc:
            trace.notes.append(f"step {step.name!r}: {type(exc).__name__}: {exc}")
        state["results"][step.name] = rewards
        stop = below_min_reward(rewards, step.min_reward)
        if stop is None and state["step"] + 1 >= len(self.data.steps):
            stop = "was the last"
        if stop is not None:
            state["done"] = True
        return stop

    async def finalize(self, trace: Trace, runtime: Runtime) -> None:
        await keep_agent_logs(runtime, trace)
        state = self._live.get(trace.trace_id)
        if state is not None:
            if not state["done"]:
                await self._verify_step(trace, state)  # the agent stopped inside this step
            state.pop("runtime", None)  # nothing more runs in the box: let it go
            return
        try:
            await verify(
                runtime,
                self._tests(None),
                timeout=self.data.verifier_timeout,
                env=self.data.verifier_env,
                user=self.data.verifier_user,
                trace=trace,
            )
        except RolloutError:
            self._unverified.add(trace.trace_id)
            raise

    async def _rewards(self, trace: Trace, runtime: Runtime) -> dict[str, float] | None:
        state = self._live.get(trace.trace_id)
        if trace.trace_id in self._unverified:
            return None
        if state is None:
            return parse_rewards(
                await _read(runtime, f"{VERIFIER_LOGS}/reward.txt"),
                await _read(runtime, f"{VERIFIER_LOGS}/reward.json"),
            )
        results: dict[str, StepRewards] = state["results"]
        total = task_rewards(results, self.data.reward_strategy)
        if total is None:
            raise TaskError(f"no reward: no step was verified (steps run: {', '.join(results)})")
        # Each step's reward under its name; 0 for one not verified or not reached (left out
        # of the task's mean, as Harbor leaves it).
        steps = {
            s.name: 0.0 if results.get(s.name) is None else primary(results[s.name] or {})
            for s in self.data.steps
        }
        return {"reward": primary(total), **steps}

    @scoring.reward
    async def reward(self, trace: Trace, runtime: Runtime) -> float | None:
        """The verifier's reward (a multi-step task's: from its steps', as Harbor derives it:
        the mean over the steps verified, or the final step's); None when the verifier
        failed (its error is on the trace)."""
        rewards = await self._rewards(trace, runtime)
        return None if rewards is None else primary(rewards)

    @scoring.reward(weight=0.0)
    async def verifier_rewards(self, trace: Trace, runtime: Runtime) -> dict[str, float] | None:
        """Every other named value of ``reward.json`` (a multi-step task's: each step's
        reward), each a reward of its own; None when the verifier wrote just one number."""
        rewards = await self._rewards(trace, runtime) or {}
        named = {k: v for k, v in rewards.items() if k != "reward"}
        return named or None


class HarborStepsTask(HarborTask):
    """A multi-step Harbor task: each step after the first is the next segment's message. A
    class of its own, so only these need a harness that can resume a conversation (the run's
    up-front check reads ``next_message`` off the class)."""

    async def next_message(self, trace: Trace) -> str | None:
        """Verify the step just done; then, unless it ends the task (not verified, below its
        ``min_reward``, the last), set up the next step and give its instruction."""
        state = self._live.get(trace.trace_id)
        if state is None or state["done"]:
            return None
        done = self.data.steps[state["step"]].name
        stop = await self._verify_step(trace, state)
        if stop is not None:
            if stop != "was the last":
                trace.notes.append(f"step {done!r} {stop}: the remaining steps were not run")
            return None
        state["step"] += 1
        step: HarborStep = self.data.steps[state["step"]]
        runtime: Runtime = state["runtime"]
        try:
            await reset_verifier_dirs(runtime)
            await prepare_step(runtime, step.name, step.workdir_dir, step.agent_user)
            runtime.program_user = step.agent_user
        except RolloutError as exc:
            state["results"][step.name] = None
            state["done"] = True
            trace.notes.append(f"{exc}: the remaining steps were not run")
            return None
        return str(step.instruction)


async def _read(runtime: Runtime, path: str) -> bytes | None:
    try:
        return await runtime.read(path)
    except Exception:  # absent: parse_rewards says which file is missing
        return None


class HarborTaskset(Taskset[HarborTask]):
    """The Harbor tasks at ``path`` (a task folder, a folder of them, or a local manifest)."""

    name = "harbor"

    def __init__(self, path: str) -> None:
        self.path = path
        root = Path(path).expanduser()
        if not root.exists():
            if "/" not in path or "@" in path:
                raise registry_refusal(path)
            raise TasksetError(f"harbor:{path}: no such folder or manifest")
        folders = read_manifest(root) if root.is_file() else find_task_dirs(root)
        if not folders:
            raise TasksetError(f"harbor:{path}: no task folder (with a task.toml) in it")
        missing = [f for f in folders if not (f / "task.toml").is_file()]
        if missing:
            raise TasksetError(f"harbor:{path}: {missing[0]} is not a task folder (no task.toml)")
        self.folders = folders

    @property
    def task_type(self) -> type[Task[Any]]:
        """:class:`HarborStepsTask` when any task has steps (its harness must resume), else
        :class:`HarborTask`."""
        stepped = any(read_config(f / "task.toml").steps for f in self.folders)
        return HarborStepsTask if stepped else HarborTask

    def load(self) -> Iterator[HarborTask]:
        seen: set[str] = set()
        for folder in self.folders:
            task = read_task(folder)
            if task.key in seen:  # two datasets' tasks of one name: the folder tells them apart
                task = type(task)(task.data, key=str(folder))
            seen.add(task.key)
            yield task


def harbor(path: str) -> HarborTaskset:
    """The Harbor tasks at ``path``: ``vf.tasksets.harbor("tasks/")``."""
    return HarborTaskset(path)
