"""One lookup rule for every plugin family (harnesses, runtimes, tasksets): built-in ids, ids
registered at run time, installed entry points, ``module:Class`` and ``file.py:Class``, and a
did-you-mean; runtime options typed from the runtime's constructor."""

from __future__ import annotations

import importlib.metadata
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from vfray._plugins import Registry
from vfray.errors import ConfigError
from vfray.harnesses.null import NullHarness
from vfray.harnesses.registry import available_harnesses, harness_class
from vfray.runtimes.bwrap import BwrapRuntime
from vfray.runtimes.registry import runtime_class, runtime_options
from vfray.runtimes.subprocess import SubprocessRuntime
from vfray.tasksets import load_taskset
from vfray.tasksets.arithmetic import ArithmeticTaskset

PLUGIN = textwrap.dedent(
    """
    from vfray.harnesses.null import NullHarness
    from vfray.runtimes.subprocess import SubprocessRuntime
    from vfray.tasksets.arithmetic import ArithmeticTaskset


    class MyHarness(NullHarness):
        id = "my-harness"


    class MyRuntime(SubprocessRuntime):
        type = "my-runtime"


    class MyTasks(ArithmeticTaskset):
        pass


    NOT_A_PLUGIN = 3
    """
)


@pytest.fixture
def plugin_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_plugins.py"
    path.write_text(PLUGIN)
    return path


@pytest.fixture
def installed(tmp_path: Path, plugin_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real installed distribution (a .dist-info on sys.path) declaring entry points."""
    dist = tmp_path / "site" / "my_plugins-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-plugins\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[vfray.harnesses]\nep-harness = my_plugins:MyHarness\n\n"
        "[vfray.runtimes]\nep-runtime = my_plugins:MyRuntime\n\n"
        "[vfray.tasksets]\nep-tasks = my_plugins:MyTasks\n"
    )
    (tmp_path / "site" / "my_plugins.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    yield
    sys.modules.pop("my_plugins", None)


def test_every_family_takes_builtins_entry_points_module_and_file_paths(
    plugin_file: Path, installed: None
) -> None:
    assert harness_class("null") is NullHarness
    assert runtime_class("bwrap") is BwrapRuntime
    assert isinstance(load_taskset("arithmetic"), ArithmeticTaskset)
    # Installed entry points.
    assert harness_class("ep-harness").__name__ == "MyHarness"
    assert "ep-harness" in available_harnesses()
    assert runtime_class("ep-runtime").__name__ == "MyRuntime"
    assert type(load_taskset("ep-tasks")).__name__ == "MyTasks"
    # module:Class and file.py:Class.
    assert harness_class("my_plugins:MyHarness").__name__ == "MyHarness"
    assert harness_class(f"{plugin_file}:MyHarness").__name__ == "MyHarness"
    assert issubclass(runtime_class(f"{plugin_file}:MyRuntime"), SubprocessRuntime)
    assert type(load_taskset(f"{plugin_file}:MyTasks")).__name__ == "MyTasks"


def test_every_family_refuses_the_same_way(plugin_file: Path) -> None:
    for lookup, typo, meant in (
        (harness_class, "nul", "null"),
        (runtime_class, "subproces", "subprocess"),
        (load_taskset, "arithmetc", "arithmetic"),
    ):
        with pytest.raises(ConfigError, match=f"did you mean '{meant}'") as info:
            lookup(typo)
        assert str(info.value).startswith("unknown ")
    with pytest.raises(ConfigError, match="is not a vfray harness"):
        harness_class(f"{plugin_file}:MyRuntime")
    with pytest.raises(ConfigError, match="is not a vfray runtime"):
        runtime_class(f"{plugin_file}:NOT_A_PLUGIN")
    with pytest.raises(ConfigError, match="has no attribute"):
        runtime_class(f"{plugin_file}:Missing")


def test_a_registry_sees_builtins_added_after_it_was_made() -> None:
    builtins = {"a": "vfray.harnesses.null:NullHarness"}
    registry = Registry("thing", builtins, group="vfray.none", check=callable, example="m:C")
    builtins["b"] = "vfray.harnesses.bash:BashHarness"
    assert registry.names() == ["a", "b"]
    registry.register("c", NullHarness)
    assert registry.load("c") is NullHarness and registry.names() == ["a", "b", "c"]


def test_runtime_options_are_typed_from_the_constructor() -> None:
    options = runtime_options("bwrap", {"cpu_seconds": "5", "ro_binds": ["/opt"]})
    assert options.as_kwargs() == {"cpu_seconds": 5, "ro_binds": ["/opt"]}
    assert runtime_options("subprocess").as_kwargs() == {}
    with pytest.raises(ConfigError, match="bad options for runtime 'subprocess': cpu_second"):
        runtime_options("subprocess", {"cpu_second": 5})
    with pytest.raises(ConfigError, match="bad options for runtime 'bwrap': use_cgroups"):
        runtime_options("bwrap", {"use_cgroups": "perhaps"})
    with pytest.raises(Exception, match="frozen"):
        options.cpu_seconds = 3  # type: ignore[attr-defined]


def test_a_runtime_taking_any_options_keeps_the_unknown_ones() -> None:
    """A runtime whose constructor takes ``**options`` gets every option it was given."""
    from vfray.runtimes.registry import options_type
    from vfray.runtimes.subprocess import SubprocessRuntime

    class Open(SubprocessRuntime):
        def __init__(self, spec: Any = None, *, depth: int = 1, **options: Any) -> None:
            super().__init__(spec)

    options = options_type(Open).model_validate({"depth": 2, "endpoint": "ssh://x"})
    assert options.as_kwargs() == {"depth": 2, "endpoint": "ssh://x"}


def test_taskset_arguments_are_typed_from_the_constructor() -> None:
    """Taskset arguments are checked like harness and runtime options: a misspelt or mistyped
    one is a one-line ConfigError naming it; a string from the command line is coerced."""
    from vfray.tasksets import load_taskset

    assert len(list(load_taskset("arithmetic", {"num_tasks": "3"}).head(10))) == 3
    with pytest.raises(ConfigError, match=r"taskset 'arithmetic': num_task: Extra inputs"):
        load_taskset("arithmetic", {"num_task": 3})
    with pytest.raises(ConfigError, match=r"num_tasks: Input should be a valid integer"):
        load_taskset("arithmetic", {"num_tasks": "many"})
