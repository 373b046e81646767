"""Reading Harbor task folders (no engine): task.toml schemas 1.0 to 1.4, the instruction's
canary lines, the box a task asks for, local manifests and the registry refused in one line,
the verifier's reward files, sidecars refused off docker. The fixture tasks are run for real
in tests/test_harbor_docker.py."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from vfray.errors import ConfigError, TaskError, TasksetError
from vfray.harnesses.registry import harness_class
from vfray.runtimes.subprocess import SubprocessRuntime
from vfray.tasksets import harbor, load_taskset
from vfray.tasksets._harbor_compose import Sidecar, start_sidecars
from vfray.tasksets._harbor_steps import below_min_reward, task_rewards
from vfray.tasksets._harbor_toml import read_config
from vfray.tasksets._harbor_verify import parse_rewards
from vfray.tasksets.harbor_tasks import HarborData, HarborTaskset, strip_canary

FIXTURES = Path(__file__).parent / "fixtures" / "harbor"
SOLVABLE = {
    "edit-file", "python-bug", "vfray/multi-metric", "compose-sidecar", "vfray/multi-step",
    "network-setup-only", "prebuilt-image", "vfray/canary-instruction", "verifier-env",
    "tests-hidden", "verifier-user", "agent-user",
}  # fmt: skip
UNSOLVABLE = {"broken-dockerfile", "verifier-timeout"}


def _task(root: Path, toml: str, *, dockerfile: bool = True) -> Path:
    root.mkdir(parents=True)
    (root / "task.toml").write_text(toml)
    (root / "instruction.md").write_text("Do the thing.\n")
    (root / "tests").mkdir()
    (root / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    if dockerfile:
        (root / "environment").mkdir()
        (root / "environment" / "Dockerfile").write_text("FROM scratch\nWORKDIR /srv/app\n")
    return root


def _data(path: Path) -> HarborData:
    (task,) = list(HarborTaskset(str(path)))
    return task.data


def test_the_fixture_tasks_load(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        tasks = {t.key: t for t in load_taskset(f"harbor:{FIXTURES}")}
    assert set(tasks) == SOLVABLE | UNSOLVABLE
    assert "unknown key 'future_setting' ignored" in caplog.text
    canary = tasks["vfray/canary-instruction"].data
    assert canary.prompt == 'Write the word "lighthouse" to /app/word.txt.\n'
    assert canary.schema_version == "1.1"
    assert canary.metadata["difficulty"] == "easy"
    assert canary.metadata["authors"][0]["name"] == "vfray tests"
    assert canary.resources.memory == 1.0 and canary.resources.disk == 2.0
    edit = tasks["edit-file"].data
    assert edit.image is not None and edit.image.startswith("dockerfile:")
    assert edit.image.endswith("edit-file/environment")
    assert edit.workdir == "/app"
    assert edit.timeout.agent == 120.0 and edit.verifier_timeout == 60.0
    assert edit.metadata["tags"] == ["edit"]
    assert any("build_timeout_sec" in note for note in edit.notes)
    assert tasks["prebuilt-image"].data.image == "vfray-base:bookworm"
    assert tasks["network-setup-only"].data.network_allow == []
    assert tasks["verifier-env"].data.verifier_env == {"EXPECTED_SUM": "42"}
    (sidecar,) = tasks["compose-sidecar"].data.sidecars
    assert sidecar.name == "api" and sidecar.image.startswith("dockerfile:")
    assert sidecar.command == ["python3", "-m", "http.server", "8080", "--directory", "/srv"]
    steps = tasks["vfray/multi-step"].data.steps
    assert [s.name for s in steps] == ["01-create", "02-extend"]
    assert tasks["vfray/multi-step"].data.prompt == steps[0].instruction
    assert steps[0].verifier_timeout == 30.0 and steps[1].verifier_timeout == 60.0
    # The data crosses processes as JSON and lands on every trace: metadata included.
    again = HarborData.model_validate_json(canary.model_dump_json())
    assert again == canary


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2", "1.3", "1.4"])
def test_task_toml_schema_versions(tmp_path: Path, version: str) -> None:
    key = "version" if version == "1.0" else "schema_version"
    data = _data(
        _task(
            tmp_path / "t",
            f'{key} = "{version}"\n'
            "[agent]\ntimeout_sec = 30\n"
            '[verifier]\ntimeout_sec = 15\nuser = "tester"\nenv = { A = "1" }\n'
            "[environment]\ncpus = 2\nmemory_mb = 2048\nstorage_mb = 4096\ngpus = 1\n"
            "allow_internet = false\n",
        )
    )
    assert data.schema_version == version
    assert data.timeout.agent == 30.0 and data.verifier_timeout == 15.0
    assert data.verifier_user == "tester" and data.verifier_env == {"A": "1"}
    assert data.resources.cpu == 2.0 and data.resources.memory == 2.0
    assert data.resources.disk == 4.0 and data.resources.gpu == "1"
    assert data.network_allow == []
    assert data.workdir == "/srv/app"


def test_an_unknown_schema_version_and_key_are_warnings(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _task(tmp_path / "t", 'version = "9.9"\n[verifier]\nflavour = "x"\n')
    with caplog.at_level(logging.WARNING):
        _data(path)
    assert "schema version '9.9'" in caplog.text
    assert "unknown key [verifier] 'flavour' ignored" in caplog.text


@pytest.mark.parametrize(
    ("toml", "said"),
    [
        ("version = ", "cannot read task.toml"),
        ('[environment]\nmemory = "lots"\n', "cannot read the size 'lots'"),
        ("agent = 3\n", "[agent] must be a table"),
        ('multi_step_reward_strategy = "best"\n', "'mean' or 'final'"),
    ],
)
def test_a_bad_task_toml_is_one_line(tmp_path: Path, toml: str, said: str) -> None:
    with pytest.raises(TasksetError) as caught:
        _data(_task(tmp_path / "t", toml))
    assert said in str(caught.value) and "\n" not in str(caught.value)


def test_a_task_with_no_box_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(TasksetError, match="no environment/Dockerfile"):
        _data(_task(tmp_path / "t", 'version = "1.0"\n', dockerfile=False))


def test_canary_lines_are_dropped() -> None:
    text = "<!-- canary GUID 1 -->\n# BENCHMARK canary GUID 1\n\n# Title\nbody\n"
    assert strip_canary(text) == "# Title\nbody\n"
    assert strip_canary("# Setup\nbody\n") == "# Setup\nbody\n"


def test_a_local_manifest_lists_tasks(tmp_path: Path) -> None:
    manifest = tmp_path / "registry.json"
    tasks = [{"name": n, "path": str(FIXTURES / n)} for n in ("edit-file", "python-bug")]
    manifest.write_text(json.dumps([{"name": "mine", "version": "1", "tasks": tasks}]))
    assert [t.key for t in harbor(str(manifest))] == ["edit-file", "python-bug"]
    toml = tmp_path / "dataset.toml"
    toml.write_text(f'[[tasks]]\nname = "edit-file"\npath = "{FIXTURES / "edit-file"}"\n')
    assert [t.key for t in harbor(str(toml))] == ["edit-file"]


@pytest.mark.parametrize("where", ["manifest", "name"])
def test_the_registry_is_refused_in_one_line(tmp_path: Path, where: str) -> None:
    spec = "terminal-bench@2.0"
    if where == "manifest":
        manifest = tmp_path / "registry.json"
        entry = {"name": "t", "git_url": "https://github.com/x/y.git", "path": "tasks/t"}
        manifest.write_text(json.dumps({"name": "d", "tasks": [entry]}))
        spec = str(manifest)
    with pytest.raises(TasksetError) as caught:
        load_taskset(f"harbor:{spec}")
    message = str(caught.value)
    assert "needs the internet" in message and "\n" not in message


def test_harbor_takes_no_taskset_args() -> None:
    with pytest.raises(ConfigError, match="takes no arguments"):
        load_taskset(f"harbor:{FIXTURES}", {"n": 1})


def test_reward_files() -> None:
    assert parse_rewards(b"0.5\n", None) == {"reward": 0.5}
    assert parse_rewards(None, b'{"reward": 1, "style": 0.25, "note": "x"}') == {
        "reward": 1.0,
        "style": 0.25,
    }
    for text, js, said in [
        (None, None, "wrote no"),
        (b"yes", None, "holds no number"),
        (None, b"[1]", "object of named numbers"),
        (None, b'{"a": "b"}', "no numeric value"),
    ]:
        with pytest.raises(TaskError, match=said):
            parse_rewards(text, js)


async def test_sidecars_are_refused_off_docker() -> None:
    with pytest.raises(TaskError) as caught:
        await start_sidecars(SubprocessRuntime(), (Sidecar(name="db", image="x"),), "t")
    assert "only on the docker runtime, not 'subprocess'" in str(caught.value)


def test_the_oracle_is_a_harness() -> None:
    cls = harness_class("oracle")
    assert cls.SUPPORTS_RESUME and not cls.NEEDS_CONTAINER


def test_only_multi_step_tasks_need_a_harness_that_resumes() -> None:
    # A single-step task ends after its agent's one segment: codex (no resume) may run it, as
    # Harbor's own codex agent does; a multi-step task is refused for it before the run.
    from vfray.run.environment import LocalEnvironment

    spec = LocalEnvironment("scripted:echo", harness="openclaw").spec
    single = HarborTaskset(str(FIXTURES / "edit-file"))
    spec.check_task_type(single.task_type, 1)
    (task,) = single.load()
    spec.check_task_type(type(task), 1)
    stepped = HarborTaskset(str(FIXTURES / "multi-step"))
    with pytest.raises(ConfigError, match="cannot resume"):
        spec.check_task_type(stepped.task_type, 1)
    assert HarborTaskset(str(FIXTURES)).task_type is type(next(iter(stepped.load())))


def test_a_step_s_own_settings_are_read(tmp_path: Path) -> None:
    (task,) = HarborTaskset(str(FIXTURES / "multi-step")).load()
    first, second = task.data.steps
    assert first.min_reward == 1.0 and second.min_reward is None
    assert second.verifier_env == {"STEP_MARK": "second"} and first.verifier_env == {}
    assert second.workdir_dir is not None and second.workdir_dir.endswith("02-extend/workdir")
    assert first.workdir_dir is None
    path = _task(
        tmp_path / "t",
        'schema_version = "1.4"\n[verifier]\nuser = "grader"\nenv = { A = "1", B = "1" }\n'
        'environment_mode = "separate"\n'
        '[[steps]]\nname = "a"\nmin_reward = { reward = 1, style = 0.5 }\n'
        'healthcheck = { command = "true" }\n'
        '[steps.agent]\nuser = "dev"\n[steps.verifier]\nuser = 1001\nenv = { B = "2" }\n'
        '[[steps]]\nname = "b"\n',
    )
    (path / "steps" / "a").mkdir(parents=True)
    (path / "steps" / "a" / "instruction.md").write_text("a\n")
    (path / "steps" / "b").mkdir(parents=True)
    (path / "steps" / "b" / "instruction.md").write_text("b\n")
    data = _data(path)
    a, b = data.steps
    assert a.min_reward == {"reward": 1.0, "style": 0.5}
    assert (a.verifier_user, a.agent_user, a.verifier_env) == ("1001", "dev", {"A": "1", "B": "2"})
    assert (b.verifier_user, b.agent_user, b.verifier_env) == ("grader", None, {"A": "1", "B": "1"})
    assert any("step 'a' healthcheck: not run" in n for n in data.notes)
    assert not any("[agent] user" in n for n in data.notes)  # honoured: no note
    assert any("runs the verifier in the agent's box" in n for n in data.notes)


def test_a_bad_min_reward_is_one_line(tmp_path: Path) -> None:
    path = _task(tmp_path / "t", '[[steps]]\nname = "a"\nmin_reward = "high"\n')
    with pytest.raises(TasksetError) as caught:
        read_config(path / "task.toml")
    assert "step 'a'" in str(caught.value) and "\n" not in str(caught.value)


def test_steps_end_early_and_add_up_as_harbor_s_do() -> None:
    assert below_min_reward({"reward": 1.0}, 1.0) is None
    assert below_min_reward({"reward": 0.5}, 1.0) == "reward=0.5 below min_reward 1"
    assert below_min_reward({"reward": 1.0}, {"style": 0.5}) == "style=-inf below min_reward 0.5"
    assert below_min_reward({"reward": 0.0}, None) is None
    assert below_min_reward(None, None) == "was not verified"
    # mean: per named value, over the steps verified only (a step not verified is left out;
    # a value a step lacks counts 0); final: the last step run's, verified or not.
    run = {"a": {"reward": 1.0, "style": 0.5}, "b": None, "c": {"reward": 0.0}}
    assert task_rewards(run, "mean") == {"reward": 0.5, "style": 0.25}
    assert task_rewards(run, "final") == {"reward": 0.0}
    assert task_rewards({"a": {"reward": 1.0}, "b": None}, "final") is None
    assert task_rewards({"a": None}, "mean") is None and task_rewards({}, "mean") is None
