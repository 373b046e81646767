"""The config tree: precedence (flags > TOML > VFRAY_* environment > defaults), readable
validation errors, ``iter_fields`` coverage, the example configs and the generated reference."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vfray.config import EvalConfig, iter_fields, load_config
from vfray.errors import ConfigError
from vfray.harnesses.registry import make_harness
from vfray.runtimes.registry import make_runtime

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples" / "configs").glob("*.toml"))


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No VFRAY_* variable from the calling shell may leak into these tests."""
    import os

    for name in list(os.environ):
        if name.startswith("VFRAY_"):
            monkeypatch.delenv(name)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_defaults() -> None:
    config = load_config()
    assert config.taskset == "arithmetic"
    assert config.model.name.startswith("scripted:")
    assert config.env.harness.id == "bash"
    assert config.env.runtime.type == "subprocess"


def test_precedence_flags_over_toml_over_env_over_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VFRAY_SAMPLING__TEMPERATURE", "0.9")
    monkeypatch.setenv("VFRAY_ENV__HARNESS__ID", "bash")
    monkeypatch.setenv("VFRAY_MAX_CONCURRENT", "7")
    monkeypatch.setenv("VFRAY_ENV__MAX_TURNS", "3")
    toml = write(
        tmp_path,
        '[env]\nmax_turns = 5\n[env.harness]\nid = "null"\n[sampling]\ntemperature = 0.2\n',
    )
    from_env = load_config()
    assert from_env.sampling.temperature == 0.9
    assert from_env.max_concurrent == 7
    assert from_env.env.max_turns == 3

    from_toml = load_config(toml)
    assert from_toml.sampling.temperature == 0.2  # TOML beats env
    assert from_toml.env.harness.id == "null"
    assert from_toml.env.max_turns == 5
    assert from_toml.max_concurrent == 7  # env still beats the default
    assert from_toml.rollouts_per_task == 1  # untouched default

    flags = load_config(
        toml, {"sampling.temperature": "0.7", "env.max-turns": "8", "env.harness.id": "bash"}
    )
    assert flags.sampling.temperature == 0.7  # flags beat TOML
    assert flags.env.max_turns == 8  # kebab-case accepted
    assert flags.env.harness.id == "bash"


def test_sections_merge_across_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A section set partly by env, partly by TOML and partly by flags keeps every part."""
    monkeypatch.setenv("VFRAY_MODEL__API_KEY_VAR", "MY_KEY")
    toml = write(tmp_path, '[model]\nname = "m"\n')
    config = load_config(toml, {"model.base_url": "http://127.0.0.1:9/v1"})
    assert config.model.name == "m"
    assert config.model.api_key_var == "MY_KEY"
    assert config.model.base_url == "http://127.0.0.1:9/v1"


def test_open_sections_take_any_key(tmp_path: Path) -> None:
    toml = write(
        tmp_path, '[sampling]\nstop = ["x"]\n[env.runtime.options]\nshare_network = false\n'
    )
    config = load_config(toml, {"taskset_args.num_tasks": 5, "env.harness.options.max_steps": 3})
    assert config.sampling.as_params() == {"stop": ["x"]}
    assert config.env.runtime.options == {"share_network": False}
    assert config.taskset_args == {"num_tasks": 5}
    assert config.env.harness.options == {"max_steps": 3}


@pytest.mark.parametrize(
    ("toml", "overrides", "expected"),
    [
        ("", {"env.max_turns": "abc"}, ["env.max_turns", "valid integer", "'abc'"]),
        ("[env]\nmax_turn = 3\n", {}, ["env.max_turn", "unknown key", "env.max_turns"]),
        ("", {"rollouts_per_task": 0}, ["rollouts_per_task", "greater than or equal to 1"]),
        ('[model]\nname = "m"\n', {"model.name.x": 1}, ["model.name", "not a section"]),
        ("this is not toml", {}, ["invalid TOML"]),
    ],
)
def test_validation_errors_are_readable(
    tmp_path: Path, toml: str, overrides: dict[str, Any], expected: list[str]
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, toml), overrides)
    message = str(info.value)
    for part in expected:
        assert part in message, message
    assert "Traceback" not in message and "pydantic" not in message


def test_bad_env_var_is_reported_with_its_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VFRAY_NUM_TASKS", "many")
    with pytest.raises(ConfigError, match=r"num_tasks: .*'many'"):
        load_config()


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.toml")


def _leaves(tree: dict[str, Any], prefix: str = "") -> set[str]:
    found: set[str] = set()
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            found |= _leaves(value, f"{prefix}{key}.")
        else:
            found.add(f"{prefix}{key}")
    return found


def test_iter_fields_covers_every_leaf() -> None:
    # Every default dict is empty, so the dumped defaults show exactly the leaves.
    dumped = EvalConfig.model_construct().model_dump()
    names = [dotted for dotted, _, _ in iter_fields(EvalConfig)]
    assert len(names) == len(set(names))
    assert set(names) == _leaves(dumped)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_configs_parse_and_name_real_options(path: Path) -> None:
    config = load_config(path)
    # Harness and runtime options must be ones their classes accept (nothing is started).
    make_harness(config.env.harness.id, dict(config.env.harness.options))
    make_runtime(config.env.runtime.type, None, **config.env.runtime.options)


def test_examples_cover_the_documented_setups() -> None:
    configs = {p.stem: load_config(p) for p in EXAMPLES}
    assert configs["scripted"].model.name.startswith("scripted:")
    assert configs["vllm"].model.base_url and not configs["vllm"].model.api_key_var
    assert configs["openai"].model.api_key_var == "OPENAI_API_KEY"
    assert configs["bwrap"].env.runtime.type == "bwrap"
    assert configs["docker"].env.runtime.type == "docker"


def test_config_reference_lists_every_leaf() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_config_reference.py")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.startswith("| key |")
    for dotted, _, _ in iter_fields(EvalConfig):
        assert f"| `{dotted}` |" in out
        assert "VFRAY_" + dotted.upper().replace(".", "__") in out
