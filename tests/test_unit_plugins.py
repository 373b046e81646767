"""vfray._plugins, the one lookup rule of every plugin family: import specs parsed, modules and
files loaded (once per file, by a name of its own), and every failure a one-line ConfigError
that points at the user's own line; options typed from a constructor; a registry's ids.
tests/test_plugins.py checks the three families use it alike."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from vfray._plugins import (
    Registry,
    is_file_target,
    load_module,
    load_object,
    options_model,
    parse_spec,
    validate_options,
)
from vfray.errors import ConfigError


@pytest.mark.parametrize(
    ("spec", "parts"),
    [
        ("pkg.mod:Name", ("pkg.mod", "Name")),
        ("pkg.mod:Class.method", ("pkg.mod", "Class.method")),
        ("path/to/file.py:fn", ("path/to/file.py", "fn")),
        ("C:\\work\\x.py:fn", ("C:\\work\\x.py", "fn")),  # a drive letter's colon is not the split
    ],
)
def test_a_spec_splits_into_its_target_and_attribute(spec: str, parts: tuple[str, str]) -> None:
    assert parse_spec(spec) == parts


@pytest.mark.parametrize(
    "spec", ["no_colon", ":Name", "pkg.mod:", "pkg.mod:1bad", "pkg.mod:a..b", "pkg:a-b", 42]
)
def test_a_malformed_spec_is_refused_with_the_expected_shapes(spec: Any) -> None:
    with pytest.raises(ConfigError, match=r"expected 'pkg.module:name' or 'path/to/file.py:name'"):
        parse_spec(spec)


@pytest.mark.parametrize(
    ("target", "is_file"),
    [
        ("pkg.mod", False),
        ("scoring.py", True),
        ("sub/mod", True),
        ("a\\b", True),
        ("mod_py", False),
    ],
)
def test_a_target_is_a_file_by_its_suffix_or_a_separator(target: str, is_file: bool) -> None:
    assert is_file_target(target) is is_file


def test_dotted_attributes_are_followed() -> None:
    import json

    assert load_object("json:JSONDecoder.decode") is json.JSONDecoder.decode
    with pytest.raises(ConfigError, match=r"'json:JSONDecoder.nope': 'json' has no attribute"):
        load_object("json:JSONDecoder.nope")


def _package(root: Path, name: str, init: str, **modules: str) -> None:
    pkg = root / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text(init)
    for module, body in modules.items():
        (pkg / f"{module}.py").write_text(body)


def test_a_missing_module_and_a_module_whose_import_fails_are_told_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    _package(
        tmp_path,
        "vfplug_a",
        "",
        needs="import vfplug_not_installed\n",
        breaks="X = 1\nraise RuntimeError('bad config\\nsecond line')\n",
        empty_error="raise KeyError\n",
    )
    with pytest.raises(ConfigError, match=r"^cannot import module 'vfplug_a.absent'"):
        load_module("vfplug_a.absent")
    with pytest.raises(ConfigError, match=r"^cannot import module 'vfplug_zz'"):
        load_module("vfplug_zz")
    with pytest.raises(ConfigError) as needs:
        load_module("vfplug_a.needs")
    assert str(needs.value) == (
        f"importing module 'vfplug_a.needs' failed at {tmp_path / 'vfplug_a' / 'needs.py'}:1: "
        "ModuleNotFoundError: No module named 'vfplug_not_installed'"
    )
    with pytest.raises(ConfigError) as breaks:
        load_module("vfplug_a.breaks")
    # The user's own line, and only the first line of the message.
    assert str(breaks.value).endswith("breaks.py:2: RuntimeError: bad config")
    with pytest.raises(ConfigError, match=r"empty_error.py:1: KeyError$"):
        load_module("vfplug_a.empty_error")


def test_a_plugin_file_loads_once_under_a_name_of_its_own(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    (one / "scoring.py").write_text("WHO = 'one'\n")
    (two / "scoring.py").write_text("WHO = 'two'\n")
    first = load_module(str(one / "scoring.py"))
    assert load_module(str(one / "scoring.py")) is first
    # Relative to a base dir (a config file's folder).
    assert load_module("scoring.py", base_dir=one) is first
    second = load_module("two/scoring.py", base_dir=tmp_path)
    assert (first.WHO, second.WHO) == ("one", "two")
    assert first.__name__ != second.__name__ and first.__name__.startswith("vfray_plugin_scoring_")
    assert sys.modules[first.__name__] is first  # pickling looks it up by name


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("def f(:\n    pass\n", r"broken.py:1: SyntaxError: "),
        ("A = 1\nB = undefined_name\n", r"broken.py:2: NameError: name 'undefined_name'"),
    ],
)
def test_a_plugin_file_that_fails_is_one_line_at_its_line(
    tmp_path: Path, body: str, message: str
) -> None:
    path = tmp_path / "broken.py"
    path.write_text(body)
    before = set(sys.modules)
    with pytest.raises(ConfigError, match=message) as info:
        load_module(str(path))
    assert str(info.value).startswith(f"loading '{path}' failed at {path}:")
    assert "\n" not in str(info.value)
    assert set(sys.modules) - before == set()  # not left half-loaded
    path.write_text("A = 1\n")  # fixed: loads now (the failed one was not cached)
    assert load_module(str(path)).A == 1


def test_a_missing_plugin_file_is_named() -> None:
    with pytest.raises(ConfigError, match=r"plugin file '/nowhere/x.py' does not exist"):
        load_object("/nowhere/x.py:f")


# --- options typed from a constructor -----------------------------------------------------------


class _Box:
    def __init__(self, spec: object, label: str, *, size: int = 1, ratio: float = 0.5) -> None:
        pass


def _factory(a: int, b: str = "x", *rest: int, c: bool = False) -> None:
    pass


def _unresolvable(a: NotImportable, *, b: int = 2) -> None:  # type: ignore[name-defined]  # noqa: F821
    pass


def test_options_are_fields_of_the_constructors_parameters() -> None:
    everything = options_model(_Box)
    assert list(everything.model_fields) == ["spec", "label", "size", "ratio"]
    assert list(options_model(_Box, skip=1).model_fields) == ["label", "size", "ratio"]
    keyword = options_model(_Box, skip=1, keyword_only=True)
    assert list(keyword.model_fields) == ["size", "ratio"]
    assert keyword.model_validate({"size": "3"}).as_kwargs() == {"size": 3}
    assert list(options_model(_factory).model_fields) == ["a", "b", "c"]  # *rest is no option
    assert options_model(_Box) is everything  # built once per constructor


def test_an_annotation_that_cannot_be_resolved_takes_any_value() -> None:
    model = options_model(_unresolvable)
    typed = model.model_validate({"a": object(), "b": "5"})
    assert typed.as_kwargs()["b"] == "5"  # no hints at all then: not converted either


def test_every_bad_option_is_named_in_one_line() -> None:
    model = options_model(_Box, skip=1, keyword_only=True)
    with pytest.raises(ConfigError) as info:
        validate_options(model, {"size": "big", "ratio": "half", "colour": 1}, "runtime 'box'")
    message = str(info.value)
    assert message.startswith("bad options for runtime 'box': size: Input should be")
    assert "; ratio: " in message and "; colour: Extra inputs are not permitted" in message
    assert validate_options(model, None, "x").as_kwargs() == {}


# --- a registry ---------------------------------------------------------------------------------


def test_a_registered_id_wins_and_is_listed() -> None:
    builtins = {"plain": "json:dumps"}
    registry = Registry(
        "codec", builtins, group="vfray.test-codecs", check=callable, example="pkg:Codec"
    )
    assert registry.load("plain").__name__ == "dumps"
    registry.register("plain", len)
    registry.register("fancy", repr)
    assert registry.load("plain") is len and registry.load("fancy") is repr
    assert registry.names() == ["fancy", "plain"]
    builtins["late"] = "json:loads"  # the module's own dict: added later, still seen
    assert registry.load("late").__name__ == "loads"
    assert registry.load("json:JSONDecoder").__name__ == "JSONDecoder"  # a path, checked too
    with pytest.raises(ConfigError, match=r"'json:__doc__' is not a vfray codec \(json:__doc__\)"):
        registry.load("json:__doc__")
    with pytest.raises(
        ConfigError,
        match=r"unknown codec 'plane'; did you mean 'plain' or 'late'\? known: fancy, late, plain",
    ):
        registry.load("plane")
