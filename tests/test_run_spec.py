"""The run spec: the config resolved and checked once, the same for the CLI, ``Farm`` on either
backend and ``LocalEnvironment``; and the bugs of hand-threaded arguments it removed (a config
override of a ``@stop`` hook ignored during the rollout, a group reward added by an override
not refused on the Python API, an unset API-key variable silently ``None`` on Ray, sampling
imposed twice on Ray)."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

import vfray as vf
from vfray.config import EvalConfig, load_config
from vfray.errors import ConfigError
from vfray.harnesses.chat import ChatLoopConfig
from vfray.models.scripted.server import scripted_server
from vfray.run.outcomes import RolloutJob
from vfray.run.spec import resolve_run

REPO = Path(__file__).resolve().parents[1]
UNSET = "VFRAY_TEST_KEY_THAT_IS_NOT_SET"


def always(trace: vf.Trace) -> bool:
    """A ``@stop`` override: stop before the first model call."""
    return True


@vf.group_reward
def ranked(traces: list[vf.Trace]) -> list[float]:
    """A group reward brought in by a config override."""
    return [0.0 for _ in traces]


class Watched(vf.Task[vf.TaskData]):
    setups: list[str] = []

    def setup(self, trace: vf.Trace, runtime: vf.Runtime) -> None:
        Watched.setups.append(trace.trace_id)

    @vf.stop
    def never(self, trace: vf.Trace) -> bool:
        return False

    @vf.reward
    def answered(self, trace: vf.Trace) -> float:
        return 1.0 if trace.last_reply else 0.0


def here(name: str) -> str:
    return f"{__file__}:{name}"


# -- the pinned bugs ---------------------------------------------------------------------------


async def test_a_config_override_of_a_stop_hook_applies_during_the_rollout() -> None:
    task = Watched(vf.TaskData(prompt="hi"))
    plain = await vf.run_rollout(task, harness="null")
    assert plain.stop_condition is vf.StopCondition.COMPLETED and plain.calls
    stopped = await vf.run_rollout(
        task, harness="null", scoring_overrides={"never": here("always")}
    )
    assert stopped.stop_condition is vf.StopCondition.STOP_HOOK
    assert not stopped.calls  # refused before the first model call reached the model


def test_a_group_reward_added_by_an_override_is_refused_before_any_rollout(
    tmp_path: Path,
) -> None:
    Watched.setups.clear()
    config = EvalConfig.model_validate(
        {"env": {"harness": {"id": "null"}, "scoring": {"rank": here("ranked")}}}
    )
    with (
        vf.Farm(config=config, backend="local", output_dir=str(tmp_path), progress=False) as farm,
        pytest.raises(ConfigError, match="group rewards \\(rank\\)"),
    ):
        farm.run([Watched(vf.TaskData(prompt=str(i))) for i in range(3)], 1)
    assert Watched.setups == []  # refused before the first rollout, not after the group


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_an_unset_api_key_variable_is_refused_on_both_backends(backend: str) -> None:
    with pytest.raises(ConfigError, match=f"{UNSET} \\(the API key\\) is not set"):
        vf.Farm(
            "some-model",
            base_url="http://127.0.0.1:9/v1",
            api_key_var=UNSET,
            backend=backend,
            progress=False,
        )


@pytest.fixture
def gc_thresholds_kept() -> Iterator[None]:
    """A SandboxHost built in this process (not as an actor) tunes it as its own: undone after."""
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


@pytest.mark.usefixtures("gc_thresholds_kept")
def test_a_sandbox_host_refuses_a_key_variable_its_node_lacks() -> None:
    from actors.sandbox_host import SandboxHost

    plan = resolve_run(EvalConfig.model_validate({"env": {"harness": {"id": "null"}}})).plan
    with pytest.raises(ConfigError, match=f"{UNSET} \\(the API key\\) is not set on the node"):
        SandboxHost(plan, base_url="http://127.0.0.1:9/v1", api_key_var=UNSET)


@pytest.mark.usefixtures("gc_thresholds_kept")
async def test_a_sandbox_host_imposes_the_sampling_once_per_session() -> None:
    from actors.sandbox_host import SandboxHost

    config = EvalConfig.model_validate(
        {"env": {"harness": {"id": "null"}}, "sampling": {"temperature": 0.3, "seed": 7}}
    )
    spec = resolve_run(config)
    with scripted_server("echo") as url:
        host = SandboxHost(spec.plan, base_url=url)
        try:
            job = RolloutJob(task=Watched(vf.TaskData(prompt="hi")))
            outcome, trace = await host.run_rollout(job)
        finally:
            await host.shutdown()
    assert outcome.ok, trace.errors
    assert host.app.upstream.sampling == {}  # the session, not the upstream, holds it
    assert trace.calls[0].sampling == {"temperature": 0.3, "seed": 7}


# -- one resolution ----------------------------------------------------------------------------


def test_the_spec_is_frozen_typed_and_carries_every_knob() -> None:
    config = load_config(
        overrides={
            "env.harness.id": "bash",
            "env.harness.options": {"max_steps": 3},
            "env.runtime.type": "bwrap",
            "env.runtime.options": {"cpu_seconds": "9"},
            "env.max_turns": 4,
            "env.scoring": {"answered": here("always")},
            "sampling.temperature": 0.5,
            "max_concurrent": 12,
        }
    )
    spec = resolve_run(config, {"hosts": 3, "flush_rows": 10})
    assert isinstance(spec.harness_config, ChatLoopConfig) and spec.harness_config.max_steps == 3
    assert spec.runtime_options.as_kwargs() == {"cpu_seconds": 9}
    assert spec.plan.limits.max_turns == 4 and spec.plan.sampling == {"temperature": 0.5}
    assert spec.scoring_overrides == {"answered": here("always")}
    assert (spec.concurrency.max_concurrent, spec.concurrency.hosts) == (12, 3)
    assert spec.endpoint.kind == "scripted" and spec.endpoint.scripted_policy == "arithmetic"
    with pytest.raises(ValidationError):
        spec.backend = "local"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"model.name": "gpt-4o"}, "needs a base_url"),
        ({"model.name": "scripted:echo?latency=soon"}, "is not a number"),
        ({"env.harness.id": "bsh"}, "did you mean 'bash'"),
        ({"env.harness.options": {"max_stpes": 1}}, "invalid config for harness"),
        ({"env.runtime.type": "bwarp"}, "did you mean 'bwrap'"),
        ({"env.runtime.options": {"nope": 1}}, "bad options for runtime"),
    ],
)
def test_every_config_mistake_is_refused_at_resolution(
    overrides: dict[str, Any], message: str
) -> None:
    config = load_config(overrides=overrides)
    with pytest.raises(ConfigError, match=message):
        resolve_run(config)
    # The Python API says the same, before anything starts.
    with pytest.raises(ConfigError, match=message):
        vf.Farm(config=config, backend="local", progress=False)


def test_local_environment_and_farm_resolve_to_the_same_plan() -> None:
    env = vf.LocalEnvironment(
        "scripted:echo",
        harness="null",
        sampling={"temperature": 0.1},
        scoring_overrides={"answered": here("always")},
    )
    farm = vf.Farm(
        "scripted:echo",
        config=load_config(overrides={"env.scoring": {"answered": here("always")}}),
        harness="null",
        sampling={"temperature": 0.1},
        backend="local",
        progress=False,
    )
    assert env.plan == farm.plan


# -- the seam ------------------------------------------------------------------------------------


# That no vfray module imports ray or actors is import-linter's contract (pyproject.toml),
# checked by tests/test_architecture.py and by lint-imports in CI.


def test_a_local_farm_runs_without_importing_ray(tmp_path: Path) -> None:
    code = textwrap.dedent(
        f"""
        import sys
        import vfray as vf
        from vfray.tasksets.arithmetic import ArithmeticTaskset
        with vf.Farm(harness="null", backend="local", output_dir={str(tmp_path)!r},
                     progress=False) as farm:
            result = farm.run(ArithmeticTaskset().head(2), 2)
            stats = farm.host_stats()
        print(result.summary()["rollouts"], "ray" in sys.modules)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["4", "False"]
