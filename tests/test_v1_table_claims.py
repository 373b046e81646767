"""The verifiers v1 table (docs/guides/v1.md), row by row, where the comparison runs
(tests/test_compat_v1_vs_verifiers.py) do not reach: the same taskset code evaluated by
verifiers 0.4.0 and by vfray's layer (keys, ``idx``, views, plugged hooks), and what the table
says vfray maps or refuses (flags, harness ids, runtimes, best-of-n's group size, task fields)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from agent_tools import need_registry

import vfray as vf
from vfray.cli.main import main
from vfray.compat.v1 import loader
from vfray.compat.v1.config import HARNESSES
from vfray.errors import ConfigError
from vfray.models.scripted.server import scripted_server
from vfray.runtimes.provision import ToolSpec, ensure_tool
from vfray.traces import read_traces
from vfray.traces.convert import table_to_traces

PACKAGES = Path(__file__).parent / "v1_tasksets"
V1CMP = str(PACKAGES / "v1cmp")
ROOT = Path(vf.__file__).resolve().parents[1]

# Rows 1, 2 and 4 of the table: one script, run under each implementation of verifiers.v1.
_PROBE = textwrap.dedent("""
    import json, sys
    {prelude}
    import verifiers.v1 as vf
    from v1cmp.taskset import CmpConfig, CmpTaskset

    ts = CmpTaskset(CmpConfig())
    plugged = CmpConfig(task={{"rewards": {{"correct": {{"fn": "json.dumps", "weight": 3.0}},
                                            "parts": {{"weight": 2.0}}}}}})
    task = next(iter(CmpTaskset(plugged)))
    select = vf.SelectConfig(shuffle=True, seed=3, skip=1, limit=2)
    print(json.dumps({{
        "keys": [t.key for t in ts],
        "hashes": [t.hash for t in ts],
        "idx": [t.data.idx for t in ts],
        "skip_take": [t.data.idx for t in ts.skip(1).take(2)],
        "include": [t.data.idx for t in ts.include(idx=["1:3", "5"])],
        "exclude": [t.data.idx for t in ts.exclude(names=["x"], idx=["0"])],
        "shuffle": [t.data.idx for t in ts.shuffle(3)],
        "select": [t.data.idx for t in ts.select(select)],
        "plugged": {{fn.__name__: fn._vf_weight for fn in task.hooks("reward")}},
        "stops": [fn.__name__ for fn in task.hooks("stop")],
        "metrics": [fn.__name__ for fn in task.hooks("metric")],
    }}))
""")


def _probe(python: str, prelude: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGES), str(ROOT)] if prelude else [str(PACKAGES)])
    done = subprocess.run(
        [python, "-c", _PROBE.format(prelude=prelude)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_keys_idx_views_and_plugged_hooks_are_verifiers_own() -> None:
    need_registry("pypi")
    spec = ToolSpec(name="verifiers", kind="pypi", package="verifiers", version="0.4.0")
    theirs = _probe(ensure_tool(spec).executable("python"), "")
    ours = _probe(sys.executable, "import vfray.compat.v1 as layer; layer.install()")
    assert ours == theirs
    assert theirs["plugged"] == {"correct": 3.0, "parts": 2.0} and len(theirs["keys"]) == 6


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["eval", V1CMP, *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--resume"], "--resume (use: vfray resume RUN_DIR"),
        (["--run.name", "x"], "run.name='x'"),
        (["--push"], "push=True"),
        (["--client.headers", '{"a": "b"}'], "client.headers"),
        (["--env.retries.max-retries", "2"], "env.retries.max_retries=2"),
        (["--env.timeout.rollout", "3"], "env.timeout.rollout=3"),
        (["--env.interception.port", "1"], "env.interception.port=1"),
        (["--env.agent.harness.version", "2"], "env.agent.harness.version"),
        (["--env.agent.runtime.image", "x"], "env.agent.runtime.image"),
        (["--env.agent.retries.max-retries", "1"], "env.agent.retries.max_retries"),
        (["--env.agent.harness.id", "opencode"], "env.agent.harness.id=opencode"),
        (["--env.agent.runtime.type", "prime"], "env.agent.runtime.type=prime"),
        (["--env.agent.runtime.type", "podman"], "env.agent.runtime.type=podman"),
        (["--env.agent.runtime.type", "apptainer"], "env.agent.runtime.type=apptainer"),
        (["--env.id", "best-of-n", "--num-rollouts", "2"], "num_rollouts > 1 with env.id"),
    ],
)
def test_v1_options_vfray_does_not_run_are_refused_in_one_line(
    capsys: pytest.CaptureFixture[str], flags: list[str], named: str
) -> None:
    code, out, err = _cli(capsys, *flags, "--dry-run")
    assert code == 2 and out == ""
    line = err.strip()
    assert "\n" not in line and line.startswith("vfray: error: v1 options not supported by vfray:")
    assert named in line


@pytest.mark.parametrize(("v1_id", "ours"), sorted(HARNESSES.items()))
def test_v1_harness_ids_map_onto_vfrays_harnesses(
    capsys: pytest.CaptureFixture[str], v1_id: str, ours: str
) -> None:
    code, out, _ = _cli(capsys, "--env.agent.harness.id", v1_id, "--dry-run")
    assert code == 0 and json.loads(out)["env"]["harness"]["id"] == ours
    named = {  # the table's row (v1's ids; their dashed spellings map the same)
        "bash": "bash",
        "null": "null",
        "mini_swe_agent": "mini-swe-agent",
        "claude_code": "claude-code-acp",
        "codex": "codex-acp",
    }
    assert {k: HARNESSES[k] for k in named} == named


def test_v1s_default_runtime_is_said_to_be_vfrays_subprocess(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = _cli(capsys, "--dry-run")
    assert code == 0 and json.loads(out)["env"]["runtime"]["type"] == "subprocess"
    assert "v1's default runtime (prime) is not available: vfray's default (subprocess)" in err
    for runtime in ("subprocess", "docker", "modal"):
        code, out, _ = _cli(capsys, "--env.agent.runtime.type", runtime, "--dry-run")
        assert code == 0 and json.loads(out)["env"]["runtime"]["type"] == runtime


def test_best_of_n_sets_the_group_size_and_a_mismatched_group_is_recorded(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, _ = _cli(capsys, "--env.id", "best-of-n", "--env.n", "3", "--dry-run")
    assert code == 0 and json.loads(out)["rollouts_per_task"] == 3
    # vfray's own -r overrides it: BestOfNEnv's finalize refuses a group of another size, so
    # the group's v1_env_finalize is left unset and best / pass_at_n are not recorded.
    code, out, _ = _cli(capsys, "--env.id", "best-of-n", "--env.n", "3", "-r", "2", "--dry-run")
    assert code == 0 and json.loads(out)["rollouts_per_task"] == 2
    taskset = loader.load(V1CMP, {"kinds": ["stop_trace"]}, env_id="best-of-n", env_args={"n": 3})
    with (
        scripted_server("arithmetic") as url,
        vf.Farm(
            model="scripted",
            base_url=url,
            harness="null",
            backend="local",
            progress=False,
            output_dir=str(tmp_path),
        ) as farm,
    ):
        result = farm.run(taskset, 2)
    traces = table_to_traces(read_traces(Path(result.run_dir) / "traces"))
    assert len(traces) == 2
    for trace in traces:
        assert trace.rewards["v1_env_finalize"].value is None
        assert "best" not in trace.metrics and "pass_at_n" not in trace.metrics


@pytest.mark.parametrize(
    ("row", "match"),
    [
        ('vf.TaskData(prompt="p", skills=["s"])', "TaskData.skills / agent_user"),
        ('vf.TaskData(prompt="p", agent_user="u")', "TaskData.skills / agent_user"),
    ],
)
def test_task_fields_vfray_cannot_honour_are_one_line(tmp_path: Path, row: str, match: str) -> None:
    pkg = tmp_path / f"v1fields_{abs(hash(row)) % 10_000}"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "import verifiers.v1 as vf\n"
        "class Tasks(vf.Taskset):\n"
        "    def load(self):\n"
        f"        yield vf.Task({row}, self.config.task)\n"
        "__all__ = ['Tasks']\n"
    )
    with pytest.raises(ConfigError, match=match):
        list(loader.load(str(pkg)).tasks())


def test_intercept_hooks_are_refused_naming_them(tmp_path: Path) -> None:
    pkg = tmp_path / "v1intercepts"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "import verifiers.v1 as vf\n"
        "class Hooked(vf.Task):\n"
        "    @vf.intercept\n"
        "    async def rewrite(self, request):\n"
        "        return request\n"
        "class Tasks(vf.Taskset):\n"
        "    def load(self):\n"
        "        yield Hooked(vf.TaskData(prompt='p'), self.config.task)\n"
        "__all__ = ['Tasks']\n"
    )
    with pytest.raises(ConfigError, match=r"@intercept hooks \(rewrite\) are not supported"):
        loader.load(str(pkg)).tasks()


async def test_a_prompt_less_task_outside_an_env_fails_with_a_task_error() -> None:
    from vfray.compat import v1

    task = v1.adapt([v1.Task(v1.TaskData(prompt=None))]).tasks()[0]
    trace = await vf.run_rollout(task, model="scripted:arithmetic", harness="null")
    error = trace.error()
    assert error is not None and error.type == "TaskError", trace.errors
