"""The farm's layout knobs: SandboxHosts per node follow each node's CPUs, and every farm knob
is in the config tree, so TOML, ``vfray eval`` flags and ``--dry-run`` all show it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from actors.cluster import hosts_per_node
from vfray.cli.main import main
from vfray.config import EvalConfig, load_config


def test_hosts_follow_each_nodes_cpus() -> None:
    cpus = {"big": 16.0, "small": 2.0, "mid": 8.0}
    # One host per 4 CPUs, at least one; interleaved so the first hosts land on every node.
    assert hosts_per_node(cpus) == ["big", "mid", "small", "big", "mid", "big", "big"]
    assert hosts_per_node(cpus, cpus_per_host=8) == ["big", "mid", "small", "big"]
    assert hosts_per_node(cpus, per_node=2) == ["big", "mid", "small"] * 2
    assert hosts_per_node(cpus, total=4) == ["big", "mid", "small", "big"]
    assert hosts_per_node({"two-cores": 2.0}) == ["two-cores"]


def test_farm_knobs_come_from_toml_flags_and_show_in_dry_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    toml = tmp_path / "farm.toml"
    toml.write_text('[farm]\ninterception = "serve"\nhosts_per_node = 3\nmax_retries = 4\n')
    code = main(
        [
            "eval", "arithmetic", f"@{toml}", "--dry-run", "--farm.cpus-per-host", "2",
            "--farm.host_concurrency", "64", "--farm.launch-concurrency", "5",
        ]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    farm = json.loads(out)["farm"]
    assert farm["interception"] == "serve" and farm["hosts_per_node"] == 3
    assert farm["max_retries"] == 4 and farm["cpus_per_host"] == 2.0
    assert farm["host_concurrency"] == 64 and farm["launch_concurrency"] == 5


def test_bad_farm_knobs_are_config_errors() -> None:
    from vfray.errors import ConfigError

    with pytest.raises(ConfigError, match=r"farm\.interception"):
        load_config(overrides={"farm.interception": "proxy"})
    with pytest.raises(ConfigError, match=r"farm\.hosts_per_node"):
        load_config(overrides={"farm.hosts_per_node": 0})


def test_launch_concurrency_knob_reaches_the_runtime_options() -> None:
    config = EvalConfig()
    assert "launch_concurrency" not in config.runtime_options()
    config.farm.launch_concurrency = 3
    assert config.runtime_options()["launch_concurrency"] == 3
    config.env.runtime.options = {"launch_concurrency": 9}  # the runtime's own option wins
    assert config.runtime_options()["launch_concurrency"] == 9
