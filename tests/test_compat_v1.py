"""verifiers v1 tasksets and configs on vfray (``vfray.compat.v1``), without verifiers: the v1
package in tests/v1_tasksets runs unchanged on the local farm with the values verifiers 0.4.0
gives it (measured by tests/test_compat_v1_vs_verifiers.py), v1's task model rules, configs and
flags mapped or refused in one line, traces exported in v1's format, datasets without a hub."""

from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import vfray as vf
import vfray.compat.v1 as v1
from vfray.cli.main import main
from vfray.compat.v1 import config as v1config
from vfray.compat.v1 import loader
from vfray.compat.v1.traces import export_run, read_v1_traces
from vfray.errors import ConfigError, TaskError, TasksetError
from vfray.models.scripted.server import scripted_server

HERE = Path(__file__).parent
PACKAGES = HERE / "v1_tasksets"
V1CMP = str(PACKAGES / "v1cmp")

# What verifiers 0.4.0 recorded for tests/v1_tasksets/v1cmp on the scripted arithmetic model
# (null harness, subprocess runtime): per kind, (key prefix, rewards, metrics, stop condition).
EXPECTED: dict[str, tuple[str, dict[str, float], dict[str, float], str]] = {
    "plain-3": (
        "079725dfdab2",
        {"correct": 1.0, "has_reply": 1.0, "even": 0.0},
        {"turns": 1.0, "box_sum": -1.0, "uv_double": -1.0},
        "agent_completed",
    ),
    "plain-8": (
        "0fc71069e2c2",
        {"correct": 1.0, "has_reply": 1.0, "even": 1.0},
        {"turns": 1.0, "box_sum": -1.0, "uv_double": -1.0},
        "agent_completed",
    ),
    "runtime": (
        "e5991f09dda7",
        {"correct": 1.0, "has_reply": 1.0, "even": 0.0},
        {"turns": 1.0, "box_sum": 5.0, "uv_double": 10.0},
        "agent_completed",
    ),
    "stop_trace": (
        "86557534a56f",
        {"correct": 0.0, "has_reply": 0.0, "even": 1.0},
        {"turns": 0.0, "box_sum": -1.0, "uv_double": -1.0},
        "stop_now",
    ),
    "stop_request": (
        "ccad7a60dffe",
        {"correct": 0.0, "has_reply": 0.0, "even": 1.0},
        {"turns": 0.0, "box_sum": -1.0, "uv_double": -1.0},
        "halt_request",
    ),
    "stop_response": (
        "960f6a32f4ef",
        {"correct": 1.0, "has_reply": 1.0, "even": 0.0},
        {"turns": 1.0, "box_sum": -1.0, "uv_double": -1.0},
        "seven_reply",
    ),
}


@pytest.fixture
def v1cmp(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The v1 package, imported through vfray's ``verifiers.v1``; uv on the boxes' PATH."""
    if shutil.which("uv") is None:
        monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    if shutil.which("uv") is None:
        pytest.skip("uv is not installed (pip install uv)")
    monkeypatch.syspath_prepend(str(PACKAGES))
    v1.install()
    import v1cmp

    return v1cmp


def _by_kind(outcomes: list[Any]) -> dict[str, Any]:
    return {
        kind: next(o for o in outcomes if o.key.startswith(prefix))
        for kind, (prefix, *_rest) in EXPECTED.items()
    }


def test_a_v1_taskset_runs_unchanged_with_v1s_rewards_metrics_and_stops(
    v1cmp: Any, tmp_path: Path
) -> None:
    taskset = v1cmp.CmpTaskset(v1cmp.taskset.CmpConfig())
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
        result = farm.run(taskset)  # the v1 Taskset instance, as it is
    exported = export_run(result.run_dir)
    outcomes = _by_kind(read_v1_traces(exported))
    for kind, (_, rewards, metrics, stop) in EXPECTED.items():
        got = outcomes[kind]
        assert (got.rewards, got.metrics, got.stop_condition) == (rewards, metrics, stop), kind
        assert got.reward == sum(v * (0.5 if k != "correct" else 1.0) for k, v in rewards.items())


def test_task_keys_are_v1s_content_hash_and_views_compose_like_v1s(v1cmp: Any) -> None:
    taskset = v1cmp.CmpTaskset(v1cmp.taskset.CmpConfig())
    keys = [t.key for t in taskset]
    assert keys[0] == "079725dfdab27783173cef25c255d15cbc7ea1c2d14ef1c806f051db095bcf3d"
    assert [t.data.idx for t in taskset] == list(range(6))  # stamped on iteration
    assert [t.data.idx for t in taskset.skip(1).take(2)] == [1, 2]
    assert [t.data.idx for t in taskset.include(idx=["1:3", "5"])] == [1, 2, 5]
    assert [t.data.idx for t in taskset.exclude(names=["x"], idx=["0"])] == [1, 2, 3, 4, 5]
    import random

    order = list(range(6))
    random.Random(3).shuffle(order)
    assert [t.data.idx for t in taskset.shuffle(3)] == order
    select = v1.SelectConfig(shuffle=True, seed=3, skip=1, limit=2)
    assert [t.data.idx for t in taskset.select(select)] == order[1:3]
    adapted = v1.adapt(taskset.take(2))
    assert [t.key for t in adapted] == keys[:2] and not adapted.is_infinite


class _Gold(v1.Task[v1.TaskData]):
    async def validate(self, runtime: Any) -> bool:
        return self.data.name == "good"


async def test_validate_returning_false_rejects_the_task() -> None:
    good, bad = (
        v1.adapt([_Gold(v1.TaskData(name=n, prompt="p"))]).tasks()[0] for n in ("good", "bad")
    )
    await good.validate(None)
    with pytest.raises(TaskError, match="validate returned False"):
        await bad.validate(None)


def test_stop_boundary_is_chosen_by_type_annotation_and_ambiguity_is_refused() -> None:
    from vfray.compat.v1._hooks import boundary

    async def by_request(self: Any, req: v1.Request) -> bool: ...
    async def by_response(self: Any, whatever: v1.Response, t: v1.Trace) -> bool: ...
    async def by_trace(self: Any, trace: v1.Trace) -> bool: ...
    async def both(self: Any, a: v1.Request, b: v1.Response) -> bool: ...

    assert [boundary(f) for f in (by_request, by_response, by_trace)] == [
        "request",
        "response",
        "trace",
    ]
    with pytest.raises(ConfigError, match="exactly one Request, Response, or Trace"):
        boundary(both)


def test_plugged_reward_replaces_a_decorated_one_with_its_weight(v1cmp: Any) -> None:
    config = v1cmp.taskset.CmpConfig(
        task={"rewards": {"correct": {"fn": "json.dumps", "weight": 3.0}, "parts": {"weight": 2.0}}}
    )
    task = next(iter(v1cmp.CmpTaskset(config)))
    weights = {fn.__name__: fn._vf_weight for fn in task.hooks("reward")}
    assert weights == {"correct": 3.0, "parts": 2.0}
    hooks = vf.scoring.scoring_hooks(v1.adapt([task]).task_type)
    assert {h.name: h.spec.weight for h in hooks if h.spec.kind.value == "reward"} == weights


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_vf_eval_flags_and_a_v1_toml_map_onto_vfrays_config(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    toml = tmp_path / "eval.toml"
    toml.write_text(
        textwrap.dedent(f"""
        model = "scripted"
        num_rollouts = 2
        [env.taskset]
        id = "{V1CMP}"
        kinds = ["plain"]
        [env.agent]
        max_turns = 3
        [env.agent.harness]
        id = "null"
        [env.agent.runtime]
        type = "subprocess"
        [client]
        base_url = "http://127.0.0.1:9/v1"
    """)
    )
    code, out, err = _cli(
        capsys,
        "eval",
        "@",
        str(toml),
        "-s",
        "--select.seed",
        "7",
        "--env.agent.timeout.rollout",
        "30",
        "--no-push",
        "--dry-run",
    )
    assert code == 0, err
    config = json.loads(out)
    assert config["taskset"] == f"v1:{V1CMP}"
    assert config["taskset_args"] == {"config": {"kinds": ["plain"]}, "harness": "null"}
    assert (config["rollouts_per_task"], config["shuffle"], config["seed"]) == (2, True, 7)
    assert config["env"]["harness"]["id"] == "null" and config["env"]["max_turns"] == 3
    assert config["env"]["timeouts"]["agent"] == 30
    assert config["model"] == {
        "name": "scripted",
        "base_url": "http://127.0.0.1:9/v1",
        "api_key_var": None,
    }
    assert "v1 env.agent.harness.id = 'null' -> env.harness.id = 'null'" in err


def test_unsupported_v1_options_are_refused_in_one_line_naming_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = _cli(
        capsys,
        "eval",
        V1CMP,
        "--env.agent.runtime.type",
        "prime",
        "--env.agent.harness.version",
        "2",
        "--run.name",
        "x",
        "--resume",
    )
    assert code == 2 and out == ""
    line = err.strip()
    assert "\n" not in line and line.startswith("vfray: error: v1 options not supported by vfray:")
    for name in (
        "env.agent.runtime.type=prime",
        "env.agent.harness.version",
        "run.name",
        "--resume",
    ):
        assert name in line


def test_v1_options_parse_like_vf_eval() -> None:
    flags, rest = v1config.v1_tokens(
        ["-s", "--env.taskset.kinds", '["a"]', "--backend", "local", "--no-rich", "--group-size=3"]
    )
    assert rest == ["--backend", "local"]
    assert v1config.parse_flags(flags) == {
        "select.shuffle": True,
        "env.taskset.kinds": ["a"],
        "rich": False,
        "num_rollouts": 3,
    }


def _write_pkg(root: Path, body: str, exports: str = "'Tasks'") -> Path:
    pkg = root / f"v1pkg_{root.name}"  # one module name per test: imports are cached
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "import verifiers.v1 as vf\n" + textwrap.dedent(body) + f"\n__all__ = [{exports}]\n"
    )
    return pkg


_TASKS = """
class Tasks(vf.Taskset):
    def load(self):
        yield vf.Task(vf.TaskData(prompt="What is 1 + 1?"), self.config.task)
"""


@pytest.mark.parametrize(
    ("body", "exports", "match"),
    [
        (
            _TASKS + "\nclass Duet(vf.Env):\n    async def run(self, task, agents): ...\n",
            "'Tasks', 'Duet'",
            "declares no agents",
        ),
        (
            _TASKS + "\nclass Mine(vf.Harness):\n    pass\n",
            "'Tasks', 'Mine'",
            "exports its own Harness",
        ),
    ],
)
def test_what_vfray_cannot_run_yet_is_refused_naming_it(
    tmp_path: Path, body: str, exports: str, match: str
) -> None:
    pkg = _write_pkg(tmp_path, body, exports)
    with pytest.raises(ConfigError, match=match):
        loader.load(str(pkg)).tasks()


def test_a_local_dataset_loads_and_an_unreachable_hub_one_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"q": "What is 2 + 2?"}\n{"q": "What is 3 + 3?"}\n')
    body = f"""
    import datasets

    class Tasks(vf.Taskset):
        def load(self):
            source = {str(rows)!r} if self.config.id.endswith("local") else "org/not-cached"
            if source.endswith(".jsonl"):
                ds = datasets.load_dataset("json", data_files=source, split="train")
            else:
                ds = datasets.load_dataset(source, split="train")
            for row in ds:
                yield vf.Task(vf.TaskData(prompt=row["q"]), self.config.task)
    """
    pkg = _write_pkg(tmp_path, body)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    local = loader.load(str(pkg), {"id": "rows-local"})
    assert [t.data.prompt for t in local] == ["What is 2 + 2?", "What is 3 + 3?"]
    with pytest.raises(TasksetError) as refused:
        loader.load(str(pkg)).tasks()
    line = str(refused.value)
    assert "\n" not in line and "hub is not reachable from here" in line


def test_a_v1_taskset_loaded_by_path_runs_on_ray_workers(
    ray_local: None, v1cmp: Any, tmp_path: Path
) -> None:
    # Workers do not have tests/v1_tasksets on their path, nor `verifiers.v1` installed: the
    # package ships by value and each worker serves verifiers.v1 from vfray before unpickling.
    kinds = ["plain", "stop_request", "stop_response"]
    taskset = loader.load(V1CMP, {"kinds": kinds}, env_id="best-of-n", env_args={"n": 2})
    with (
        scripted_server("arithmetic") as url,
        vf.Farm(
            model="scripted", base_url=url, harness="null", progress=False, output_dir=str(tmp_path)
        ) as farm,
    ):
        result = farm.run(taskset, 2)
    outcomes = read_v1_traces(export_run(result.run_dir))
    assert len(outcomes) == 8
    # Filtering by kind renumbers idx, so keys differ from EXPECTED's: match by outcome.
    for kind in ("plain-3", "plain-8", "stop_request", "stop_response"):
        _, rewards, metrics, stop = EXPECTED[kind]
        mine = [o for o in outcomes if o.rewards == rewards and o.stop_condition == stop]
        assert len(mine) == 2, kind
        assert all({k: o.metrics[k] for k in metrics} == metrics for o in mine)
        assert all(o.metrics["best"] == 1.0 for o in mine)


def test_a_packages_own_best_of_n_env_judges_the_group_with_its_finalize(tmp_path: Path) -> None:
    body = """
    from verifiers.v1.envs.best_of_n import BestOfNEnv

    class Tasks(vf.Taskset):
        def load(self):
            for q in ("What is 1 + 1?", "What is 2 + 5?"):
                yield vf.Task(vf.TaskData(prompt=q), self.config.task)

    class Pairs(BestOfNEnv):
        async def finalize(self, task, episode):
            replies = sorted(t.last_reply for t in episode.traces)
            for trace in episode.traces:
                trace.record_metric("siblings", len(episode.traces))
                trace.record_reward("agree", float(replies[0] == replies[-1]), 0.5)
    """
    pkg = _write_pkg(tmp_path, body, "'Tasks', 'Pairs'")
    taskset = loader.load(str(pkg), env_args={"n": 2})
    with (
        scripted_server("arithmetic") as url,
        vf.Farm(
            model="scripted",
            base_url=url,
            harness="null",
            backend="local",
            progress=False,
            output_dir=str(tmp_path / "out"),
        ) as farm,
    ):
        result = farm.run(taskset, 2)
    outcomes = read_v1_traces(export_run(result.run_dir))
    assert len(outcomes) == 4
    assert all(o.metrics["siblings"] == 2.0 and o.rewards["agree"] == 1.0 for o in outcomes)
    assert all(o.reward == 0.5 for o in outcomes)  # no task rewards: only finalize's, weighted
