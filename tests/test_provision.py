"""Tool provisioning for real: tiny npm and PyPI packages installed into a fresh tools root by
concurrent processes (one install, the others reuse it), and the one-line install error."""

from __future__ import annotations

import json
import marshal
import os
import subprocess
import sys
from pathlib import Path

import pytest
from agent_tools import need_registry

from vfray.errors import HarnessError
from vfray.runtimes.provision import MANIFEST, ToolSpec, ensure_tool, find_tool, tools_root

NPM_TINY = ToolSpec(name="is-number", kind="npm", package="is-number", version="7.0.0")
PYPI_TINY = ToolSpec(name="six", kind="pypi", package="six", version="1.17.0")

_CHILD = """
import json, sys
from vfray.runtimes.provision import ToolSpec, ensure_tool
tool = ensure_tool(ToolSpec.model_validate_json(sys.argv[1]), sys.argv[2])
print(json.dumps({"now": tool.installed_now, "path": str(tool.path)}))
"""


def install_concurrently(spec: ToolSpec, root: Path, n: int = 2) -> list[dict[str, object]]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, spec.model_dump_json(), str(root)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(n)
    ]
    outs = []
    for child in children:
        stdout, stderr = child.communicate(timeout=600)
        assert child.returncode == 0, stderr
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    return outs


@pytest.mark.parametrize("spec", [NPM_TINY, PYPI_TINY], ids=["npm", "pypi"])
def test_concurrent_processes_install_once_then_reuse(spec: ToolSpec, tmp_path: Path) -> None:
    need_registry(spec.kind)
    outs = install_concurrently(spec, tmp_path)
    assert sorted(o["now"] for o in outs) == [False, True]  # one installed, one waited
    assert len({o["path"] for o in outs}) == 1
    path = Path(str(outs[0]["path"]))
    assert path.parent == tmp_path and path.name.startswith(f"{spec.name}-{spec.version}-")
    assert json.loads((path / MANIFEST).read_text())["version"] == spec.version
    # Nothing left behind but the tool, its lock and the shared download cache.
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([path.name, ".locks", ".cache"])
    assert not os.stat(path).st_mode & 0o222, "the finished tool dir is read-only"
    again = ensure_tool(spec, tmp_path)
    assert not again.installed_now and again.path == path
    assert find_tool(spec, tmp_path) == path
    if spec.kind == "npm":
        assert (path / "node_modules" / "is-number" / "package.json").is_file()
    else:
        python = again.executable("python")
        done = subprocess.run(
            [python, "-c", "import six; print(six.__version__)"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert done.stdout.strip() == "1.17.0"
        # Compiled at install (the dir is read-only from then on), naming the final path.
        (pyc,) = path.glob("venv/lib/python*/site-packages/__pycache__/six.*.pyc")
        code = marshal.loads(pyc.read_bytes()[16:])
        assert code.co_filename.startswith(f"{path}/venv/lib/")


def test_the_key_changes_with_version_and_extras() -> None:
    keys = {
        NPM_TINY.key,
        NPM_TINY.model_copy(update={"version": "7.0.1"}).key,
        NPM_TINY.model_copy(update={"packages": ("node@22",)}).key,
    }
    assert len(keys) == 3


def test_root_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("VFRAY_TOOLS_DIR", str(tmp_path / "t"))
    assert tools_root() == tmp_path / "t"
    assert tools_root(tmp_path / "u") == tmp_path / "u"
    monkeypatch.delenv("VFRAY_TOOLS_DIR")
    assert tools_root() == Path.home() / ".cache" / "vfray" / "tools"


def test_a_failed_npm_install_is_one_line_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An unreachable registry (a closed local port) stands for "no network".
    monkeypatch.setenv("npm_config_registry", "http://127.0.0.1:9/")
    monkeypatch.setenv("npm_config_fetch_retries", "0")
    with pytest.raises(HarnessError) as caught:
        ensure_tool(NPM_TINY, tmp_path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("cannot install is-number@7.0.0 for is-number (npm exit ")
    assert "ECONNREFUSED" in message or "127.0.0.1" in message, message
    assert find_tool(NPM_TINY, tmp_path) is None
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == []
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".staging")]


def test_a_failed_pypi_install_names_the_package(tmp_path: Path) -> None:
    need_registry("pypi")
    missing = PYPI_TINY.model_copy(update={"version": "999.0.0"})
    with pytest.raises(HarnessError) as caught:
        ensure_tool(missing, tmp_path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("cannot install six==999.0.0 for six (uv exit ")
    assert find_tool(missing, tmp_path) is None


def test_a_killed_installers_staging_dir_is_cleaned_up(tmp_path: Path) -> None:
    need_registry("npm")
    stale = tmp_path / f".staging-{NPM_TINY.key}-deadbeef"
    (stale / "node_modules").mkdir(parents=True)
    stale.chmod(0o555)  # as a finished-but-not-renamed install would be
    tool = ensure_tool(NPM_TINY, tmp_path)
    assert tool.installed_now
    assert not stale.exists()
