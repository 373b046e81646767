"""The browser-use harness: the PyPI agent, provisioned into the node's tool dir, drives Debian's
Chromium in a bwrap box against the scripted ``agent`` model through the interception. The page
is served by a real HTTP server on the host's 127.0.0.1, bridged into the box by ``host_url``;
it shows its answer only after a click runs its JavaScript, so only a real browser finds it.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_tools import check_ended_after_refusal, need_registry
from docker_engine import runtime_options

import vfray as vf
from vfray.errors import ConfigError
from vfray.harnesses import make_harness
from vfray.harnesses.browser_use import BrowserUseConfig, BrowserUseHarness
from vfray.interception import Limits
from vfray.models.scripted.browser import decide_browser, find_element, is_browser_use, plan
from vfray.models.scripted.conversation import Conversation
from vfray.rollout import Timeouts
from vfray.runtimes.base import Runtime
from vfray.runtimes.provision import ensure_tool

PAGE = b"""<!doctype html><html><head><title>Vault</title></head><body>
<h1>The vault</h1>
<button id="reveal" onclick="document.getElementById('out').textContent='The code is KIWI-'+(6*7)">
Reveal</button><p id="out"></p></body></html>"""


class VaultData(vf.TaskData):
    url: str


class Vault(vf.Task[VaultData]):
    """Solved when the agent's final answer is the code the page reveals."""

    async def setup(self, trace: vf.Trace, runtime: Runtime) -> None:
        await runtime.host_url(self.data.url)  # the host's page, at the same URL in the box

    @vf.reward
    def found(self, trace: vf.Trace) -> bool:
        actions = json.loads(trace.last_reply or "{}").get("action") or [{}]
        return actions[-1].get("done", {}).get("text") == "KIWI-42"


@pytest.fixture(scope="module")
def page_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    site = tmp_path_factory.mktemp("site")
    (site / "index.html").write_bytes(PAGE)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    thread.join()


@pytest.fixture(scope="module")
def browser_use_installed() -> None:
    if shutil.which("chromium") is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    need_registry("pypi")
    harness = make_harness("browser-use")
    assert isinstance(harness, BrowserUseHarness)
    tool = ensure_tool(harness.tool_spec(), harness.tools_root)
    print(f"browser-use: tool dir {tool.path} ready in {tool.seconds:.1f}s")
    # Compiled at install: the box mounts the dir read-only, so nothing could cache it later.
    assert next(Path(tool.path).rglob("browser_use/agent/__pycache__/service*.pyc"), None)


def _task(url: str, image: str | None = None) -> Vault:
    prompt = f"open: {url}\nclick: Reveal\nanswer: The code is (\\S+)"
    return Vault(VaultData(prompt=prompt, url=url, workdir="/box", image=image))


@pytest.fixture(scope="module")
def chromium_image() -> str:
    """The offline Debian image with Debian's ``chromium`` in it (vfray.runtimes.debian_image,
    as the ``debian_image`` fixture's but with ``chromium``): built once per machine into
    ``$VFRAY_CI_IMAGES`` and kept; a cold build took 4.6 min (56 CPU-s) and 1.4 GB here."""
    from vfray.runtimes import debian_image as base

    missing = base.missing_tools()
    if missing or os.geteuid() != 0:
        pytest.skip(f"no image: {', '.join(missing) or 'mmdebstrap as root'} needed")
    cache = Path(os.environ.get("VFRAY_CI_IMAGES", "/var/cache/vfray-ci/images"))
    try:
        return base.build(cache, packages=(*base.PACKAGES, "chromium")).oci
    except (OSError, RuntimeError) as exc:
        pytest.skip(f"no image: {exc}")


def _state(url: str, body: str) -> str:
    return (
        "<user_request>\nopen: {u}\nclick: Reveal\nanswer: The code is (\\S+)\n</user_request>\n"
        "<agent_history>{h}</agent_history>\n<browser_state>\nCurrent tab: 1A2B\n"
        "Available tabs:\nTab 1A2B: {u} - Vault\n\nInteractive elements:\n{b}\n</browser_state>"
    ).format(u=url, h="{h}", b=body)


def _conv(last_user: str) -> Conversation:
    return Conversation(
        texts=(last_user,), last_user=last_user, tool_names=frozenset(), tool_output=None
    )


def test_the_policy_answers_browser_use_one_action_a_step() -> None:
    url = "http://127.0.0.1:9/"
    assert plan("open: http://x/\nclick: Reveal\ntype: 'ab' into Name\nanswer: (\\d+)") == [
        ("open", "http://x/", ""),
        ("click", "Reveal", ""),
        ("type", "ab", "Name"),
        ("answer", "(\\d+)", ""),
    ]
    elements = "The vault\n[3]<a href=/>Home</a>\n[4]<button id=reveal />\n\tReveal"
    before = _state(url, elements)
    assert find_element(before, "reveal") == 4
    first = _conv(before.replace("{h}", "Agent initialized"))
    assert is_browser_use(first)
    step = json.loads(decide_browser(first).text)
    # The page is already open (browser-use opens the task's URL itself): the click comes first.
    assert step["action"] == [{"click": {"index": 4}}]
    assert step["memory"] == "[browser steps done: 2]"
    after = _state(url, elements + "\nThe code is KIWI-42")
    second = _conv(after.replace("{h}", "Memory: [browser steps done: 2]"))
    done = json.loads(decide_browser(second).text)["action"][0]["done"]
    assert done == {"text": "KIWI-42", "success": True, "files_to_display": []}
    elsewhere = _conv(before.replace("{h}", "").replace(f"Tab 1A2B: {url}", "Tab 1A2B: about:"))
    assert json.loads(decide_browser(elsewhere).text)["action"] == [
        {"navigate": {"url": url, "new_tab": False}}
    ]


def test_browser_use_config_is_typed() -> None:
    harness = make_harness("browser-use", {"max_steps": 5, "vision": True})
    assert isinstance(harness.config, BrowserUseConfig) and harness.config.version == "0.13.14"
    assert harness.EXECUTES_CODE and not harness.NEEDS_CONTAINER
    assert "--vision" in harness.argv("python", "m", "http://127.0.0.1:9")  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="browser-use"):
        make_harness("browser-use", {"max_steps": 0})


@pytest.mark.slow
@pytest.mark.bwrap
async def test_browser_use_finds_the_answer_in_bwrap(
    browser_use_installed: None, page_url: str
) -> None:
    trace = await vf.run_rollout(
        _task(page_url), model="scripted:agent", harness="browser-use", runtime="bwrap"
    )
    assert trace.errors == [], trace.errors
    assert trace.stop_condition is vf.StopCondition.COMPLETED
    assert trace.reward == 1.0
    # The click, then done: browser-use opened the page before its first step.
    assert len(trace.calls) == 2 and all(c.error is None for c in trace.calls)
    (artifact,) = trace.artifacts
    summary = json.loads(artifact.content)
    assert summary["final_result"] == "KIWI-42" and summary["is_successful"]


@pytest.mark.slow
@pytest.mark.bwrap
async def test_browser_use_in_an_image_that_brings_its_own_chromium(
    browser_use_installed: None, page_url: str, chromium_image: str
) -> None:
    """The box's root is the Debian image: its Chromium, not the node's, with the node's
    Python and the agent's tool dir mounted in and started through the node's loader."""
    trace = await vf.run_rollout(
        _task(page_url, image=chromium_image),
        model="scripted:agent",
        harness="browser-use",
        runtime="bwrap",
    )
    assert trace.errors == [], trace.errors
    assert trace.reward == 1.0 and len(trace.calls) == 2


@pytest.mark.slow
@pytest.mark.docker
async def test_browser_use_finds_the_answer_in_docker(
    browser_use_installed: None, page_url: str, docker_url: str
) -> None:
    """The test engine's image mounts the host's /usr: Debian's Chromium included."""
    trace = await vf.run_rollout(
        _task(page_url),
        model="scripted:agent",
        harness="browser-use",
        runtime="docker",
        runtime_options=runtime_options(docker_url),
    )
    assert trace.errors == [], trace.errors
    assert trace.reward == 1.0 and len(trace.calls) == 2


@pytest.mark.slow
@pytest.mark.bwrap
async def test_a_refused_call_ends_browser_use_and_its_browser(
    browser_use_installed: None, page_url: str
) -> None:
    trace = await vf.run_rollout(
        _task(page_url),
        model="scripted:agent",
        harness="browser-use",
        runtime="bwrap",
        limits=Limits(max_turns=1),
        timeouts=Timeouts(agent=120),
    )
    check_ended_after_refusal(trace, "browser-use")
    assert _browsers() == []  # the box's Chromium went with the program


def _browsers() -> list[int]:
    """PIDs of live Chromium processes of a browser-use box (their profile is in /box)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if b"--user-data-dir=/box/.vfray/agent/browser" in cmdline:
            found.append(int(proc.name))
    return found
