"""vfray.config's file reading and merging at the edges: a file that is not UTF-8, a folder
given as the file, kebab-case overrides, sections merged key by key over the environment, and an
unknown key without a near name. tests/test_config.py covers precedence and the common errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from vfray.config import load_config
from vfray.errors import ConfigError


def test_a_file_that_is_not_utf8_or_not_a_file_is_one_line(tmp_path: Path) -> None:
    latin = tmp_path / "latin.toml"
    latin.write_bytes('model = "caf\xe9"\n'.encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin.toml: not UTF-8 text \(byte 12: .*TOML files"):
        load_config(latin)
    with pytest.raises(ConfigError, match=f"cannot read config file {tmp_path}: Is a directory"):
        load_config(tmp_path)


def test_kebab_case_overrides_and_sections_merge_key_by_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VFRAY_MODEL__BASE_URL", "http://env-host/v1")
    toml = tmp_path / "eval.toml"
    toml.write_text('[model]\nname = "from-file"\n[env.harness]\nid = "null"\n')
    config = load_config(toml, {"env.max-turns": 7, "env.harness.options.max-steps": 2})
    assert config.model.name == "from-file"
    assert config.model.base_url == "http://env-host/v1"  # the environment's key survives
    assert config.env.max_turns == 7 and config.env.harness.id == "null"
    assert config.env.harness.options == {"max_steps": 2}


def test_an_unknown_key_far_from_every_name_says_only_that(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, {"qqqqqqqq": 1})
    assert str(info.value).splitlines() == [
        "invalid configuration:",
        "  qqqqqqqq: Extra inputs are not permitted (unknown key)",
    ]
