"""What Harbor does around each step of a multi-step task (``steps/<name>/``), besides the
step's instruction and verifier: the step's ``workdir/`` uploaded into the box's work dir
before its agent runs, with its ``workdir/setup.sh`` run there (a failure ends the task: no
later step runs); the verifier's ``/tests`` and ``/logs/verifier`` emptied before the next
step's agent, so it never sees them; ``min_reward`` ending the remaining steps; and the task's
reward from the steps' rewards as Harbor's ``MultiStepTrial`` derives it.

Internal: importable, but not the public API; names here may move.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from vfray.errors import TaskError
from vfray.runtimes.base import Runtime
from vfray.tasksets._harbor_verify import TESTS, VERIFIER_LOGS, shell, upload_dir

StepRewards = dict[str, float] | None
"""One step's verifier rewards; None when it was not verified (its setup or verifier failed)."""


async def box_workdir(runtime: Runtime) -> str:
    """The box's work dir, as Harbor finds it (``pwd`` in the box)."""
    done = await runtime.run(["pwd"], timeout=60)
    return (done.stdout.strip() or "/") if done.ok else "/"


async def prepare_step(
    runtime: Runtime, name: str, workdir_dir: str | None, user: str | None
) -> None:
    """Upload the step's ``workdir/`` into the box's work dir and run its ``setup.sh`` there
    (as ``user``, the step's agent user). Raises :class:`TaskError` in one line when
    ``setup.sh`` fails."""
    if workdir_dir is None:
        return
    workdir = (await box_workdir(runtime)).rstrip("/")
    await upload_dir(runtime, Path(workdir_dir), workdir)
    if not (Path(workdir_dir) / "setup.sh").is_file():
        return
    done = await runtime.run(["bash", f"{workdir}/setup.sh"], timeout=600, user=user)
    if not done.ok:
        said = " ".join((done.stderr or done.stdout).split())[-200:]
        raise TaskError(f"step {name!r}: setup.sh exited with code {done.exit_code}: {said}")


async def reset_verifier_dirs(runtime: Runtime) -> None:
    """Empty ``/tests`` and ``/logs/verifier`` after a step's verifier, before the next agent."""
    await shell(
        runtime,
        f"rm -rf {TESTS} {VERIFIER_LOGS} && mkdir -p {VERIFIER_LOGS} && chmod 777 {VERIFIER_LOGS}",
    )


def below_min_reward(
    rewards: StepRewards, min_reward: float | Mapping[str, float] | None
) -> str | None:
    """Why the remaining steps must not run after a step with ``rewards``, or None. A step
    not verified always ends the task; ``min_reward`` (a number: the ``reward`` value; a
    table: each named value, a missing one as -inf) ends it when not met."""
    if rewards is None:
        return "was not verified"
    if min_reward is None:
        return None
    thresholds = {"reward": min_reward} if isinstance(min_reward, int | float) else min_reward
    for key, threshold in thresholds.items():
        value = rewards.get(key, float("-inf"))
        if value < threshold:
            return f"{key}={value:g} below min_reward {threshold:g}"
    return None


def task_rewards(results: Mapping[str, StepRewards], strategy: str) -> dict[str, float] | None:
    """The task's rewards from the steps run, in order (Harbor's ``_select_multi_step_reward``):
    ``final``: the last step's; ``mean``: each named value's mean over the steps that were
    verified (a value a step lacks counts 0). None when there is nothing to take."""
    if not results:
        return None
    if strategy == "final":
        return list(results.values())[-1]
    verified = [r for r in results.values() if r is not None]
    keys = {key for rewards in verified for key in rewards}
    if not keys:
        return None
    return {key: sum(r.get(key, 0.0) for r in verified) / len(verified) for key in sorted(keys)}
