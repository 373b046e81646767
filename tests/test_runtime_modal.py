"""The modal runtime's ``Sandbox.create`` arguments, offline: the network policy built for the
node's tunnel (only its host reachable where the task asks for no network), checked against the
installed Modal SDK's own signature and network-access builder; and the agent programs as
layers of the SDK's own ``Image`` (their build commands also run here, as a builder would). No
Modal cloud is reached."""

from __future__ import annotations

import inspect
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from agent_tools import need_registry

from vfray.errors import ConfigError, SandboxError
from vfray.harnesses import make_harness
from vfray.harnesses.base import check_compatibility
from vfray.harnesses.provisioned import ProvisionedHarness
from vfray.runtimes.base import RuntimeSpec
from vfray.runtimes.modal import ModalRuntime
from vfray.runtimes.provision import (
    NODE_BOOTSTRAP,
    TOOLS_DIR_ENV,
    ToolSpec,
    find_tool,
    image_build_commands,
    planned_tool,
)
from vfray.runtimes.registry import make_runtime

TUNNEL = "http://203.0.113.7:40123/v1"
AGENT_HARNESSES = ("mini-swe-agent", "codex", "claude-code", "claude-code-acp", "codex-acp")
NAMED_TUNNEL = "https://abc.trycloudflare.example/v1"


def modal_runtime(spec: RuntimeSpec | None = None, **options: Any) -> ModalRuntime:
    rt = make_runtime("modal", spec, **options)
    assert isinstance(rt, ModalRuntime)
    return rt


def sdk() -> Any:
    return pytest.importorskip("modal")


def binds_to_the_sdk(options: dict[str, Any]) -> inspect.BoundArguments:
    """The options as ``modal.Sandbox.create`` takes them: a renamed or dropped parameter fails
    here instead of on the first real sandbox."""
    modal = sdk()
    signature = inspect.signature(modal.Sandbox.create)
    return signature.bind("sleep", "infinity", app=None, image=None, **options)


async def test_a_tunnel_address_is_the_only_egress() -> None:
    rt = modal_runtime(RuntimeSpec(cpu=2, memory_gb=1.5, gpu="A100:2"))
    rt.plan_routes([TUNNEL])
    options = rt.create_options(await rt.resolve_routes())
    assert options == {
        "timeout": 3600,
        "workdir": "/work",
        "cpu": (2.0, 2.0),  # (request, limit): the task's resources are hard limits
        "memory": (1536, 1536),
        "gpu": "A100:2",
        "outbound_cidr_allowlist": ["203.0.113.7/32"],
    }
    bound = binds_to_the_sdk(options)
    assert "block_network" not in bound.arguments  # blocked would cut the tunnel off too
    # The box is then handed that same URL (host_url passes a public one through).
    endpoint = await rt.host_url(TUNNEL)
    await rt.prepare_execution([endpoint])


async def test_a_named_tunnel_is_allowed_by_name_and_by_its_addresses() -> None:
    rt = modal_runtime()
    rt.plan_routes([NAMED_TUNNEL, NAMED_TUNNEL + "/chat/completions"])
    assert rt.route_hosts == ("abc.trycloudflare.example",)
    # As resolve_routes would answer (an IPv4 and an IPv6 address), without a resolver.
    resolved = {"abc.trycloudflare.example": ["198.51.100.2", "2001:db8::5"]}
    options = rt.create_options(resolved)
    assert options["outbound_cidr_allowlist"] == ["198.51.100.2/32", "2001:db8::5/128"]
    assert options["outbound_domain_allowlist"] == ["abc.trycloudflare.example"]
    binds_to_the_sdk(options)
    await rt.prepare_execution([NAMED_TUNNEL])


async def test_an_unresolvable_tunnel_name_keeps_the_domain_allowlist() -> None:
    rt = modal_runtime()
    rt.plan_routes(["http://no-such-host.invalid:9/v1"])
    resolved = await rt.resolve_routes()
    assert resolved == {"no-such-host.invalid": []}
    options = rt.create_options(resolved)
    assert options["outbound_cidr_allowlist"] == []
    assert options["outbound_domain_allowlist"] == ["no-such-host.invalid"]


async def test_the_sdk_builds_an_allowlist_from_these_options() -> None:
    # Modal's own translation of the options into its network-access message (a private helper
    # of the installed SDK; skipped where it is gone): an allowlist of exactly the tunnel.
    sdk()
    common = pytest.importorskip("modal.sandbox._common")
    build = getattr(common, "_build_outbound_network_access", None)
    if build is None:
        pytest.skip("this modal SDK has no _build_outbound_network_access")
    rt = modal_runtime()
    rt.plan_routes([TUNNEL])
    options = rt.create_options(await rt.resolve_routes())
    access = build(
        options.get("block_network", False),
        options.get("outbound_cidr_allowlist"),
        options.get("outbound_domain_allowlist"),
    )
    from modal_proto import api_pb2

    assert access.network_access_type == api_pb2.NetworkAccess.NetworkAccessType.ALLOWLIST
    assert list(access.allowed_cidrs) == ["203.0.113.7/32"]
    assert list(access.allowed_domains) == []
    # And with nothing to reach: blocked.
    blocked = modal_runtime().create_options()
    assert blocked["block_network"] is True
    none = build(True, None, None)
    assert none.network_access_type == api_pb2.NetworkAccess.NetworkAccessType.BLOCKED


async def test_no_route_blocks_the_network_and_ports_keep_an_empty_allowlist() -> None:
    rt = modal_runtime()
    assert rt.create_options()["block_network"] is True
    # Modal refuses open ports with block_network: an empty allowlist denies egress instead.
    exposing = modal_runtime(exposed_ports=[8000])
    options = exposing.create_options()
    assert options["outbound_cidr_allowlist"] == []
    assert "block_network" not in options
    assert options["encrypted_ports"] == [8000]
    binds_to_the_sdk(options)
    # A loopback URL with no public_base_url plans no route (host_url refuses it).
    loopback = modal_runtime()
    loopback.plan_routes(["http://127.0.0.1:8000/v1"])
    assert loopback.route_hosts == ()
    with pytest.raises(ConfigError, match="tunnel"):
        await loopback.host_url("http://127.0.0.1:8000/v1")
    with pytest.raises(SandboxError, match="blocked"):
        await loopback.prepare_execution(["https://elsewhere.example/v1"])


async def test_public_base_url_is_the_allowed_host() -> None:
    rt = modal_runtime(public_base_url="https://ingress.example/p")
    rt.plan_routes(["http://127.0.0.1:8000/v1"])
    assert rt.route_hosts == ("ingress.example",)
    options = rt.create_options({"ingress.example": ["192.0.2.9"]})
    assert options["outbound_cidr_allowlist"] == ["192.0.2.9/32"]
    assert options["outbound_domain_allowlist"] == ["ingress.example"]
    await rt.prepare_execution([await rt.host_url("http://127.0.0.1:8000/v1")])


async def test_a_task_naming_hosts_gets_the_default_network() -> None:
    rt = modal_runtime(RuntimeSpec(network_allow=("pypi.org",)))
    rt.plan_routes([TUNNEL])
    options = rt.create_options(await rt.resolve_routes())
    assert not {"block_network", "outbound_cidr_allowlist", "outbound_domain_allowlist"} & set(
        options
    )
    await rt.prepare_execution(["https://anything.example/v1"])


async def test_a_route_outside_the_allowlist_is_refused() -> None:
    # The tunnel reopened at another address after this box was created.
    rt = modal_runtime()
    rt.plan_routes([TUNNEL])
    rt.create_options(await rt.resolve_routes())
    with pytest.raises(SandboxError, match=r"does not cover http://203\.0\.113\.8"):
        await rt.prepare_execution(["http://203.0.113.8:40123/v1"])


async def test_start_passes_the_allowlist_to_sandbox_create(monkeypatch: Any) -> None:
    # start() through a stand-in SDK, its call bound to the real SDK's signature.
    sdk()
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    class Aio:
        def __init__(self, fn: Any) -> None:
            self.aio = fn

    async def create(*args: Any, **kwargs: Any) -> Any:
        calls.append((args, kwargs))
        raise RuntimeError("no cloud here")

    async def lookup(name: str, create_if_missing: bool = False) -> Any:
        return SimpleNamespace(name=name)

    fake = SimpleNamespace(
        App=SimpleNamespace(lookup=Aio(lookup)),
        Image=SimpleNamespace(from_registry=lambda ref: SimpleNamespace(ref=ref)),
        Sandbox=SimpleNamespace(create=Aio(create)),
    )
    monkeypatch.setattr("vfray.runtimes.modal.optional_import", lambda *a: fake)
    rt = modal_runtime()
    rt.plan_routes([TUNNEL])
    with pytest.raises(SandboxError, match="no cloud here"):
        await rt.start()
    ((args, kwargs),) = calls
    assert kwargs["outbound_cidr_allowlist"] == ["203.0.113.7/32"]
    signature = inspect.signature(sdk().Sandbox.create)
    signature.bind(*args, **kwargs)


# -- agent programs as image layers ------------------------------------------------------------


def _agent_specs() -> list[ToolSpec]:
    return [make_harness(h).box_tools()[0] for h in AGENT_HARNESSES]


def test_agent_tools_become_layers_of_the_sdks_image(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Each agent harness's program, planned for a modal box, is a chain of the real SDK's
    ``run_commands`` layers on the task's image, in key order (the same set, the same layers),
    and installs it where the harness will launch it."""
    modal = sdk()
    from modal_box import image_layers

    monkeypatch.setenv(TOOLS_DIR_ENV, str(tmp_path / "tools"))
    specs = _agent_specs()
    rt = modal_runtime(RuntimeSpec(image="python:3.12-slim"))
    rt.plan_tools([*reversed(specs[1:]), specs[1]])  # order and repeats do not matter
    rt.plan_tools(specs[:1])  # another seat sharing the box adds its harness's
    ordered = sorted(specs, key=lambda s: s.key)
    assert rt.tools == tuple(ordered)
    image = rt.build_image(modal)
    assert isinstance(image, modal.Image)
    base, *layers = image_layers(image)
    assert base == ["FROM python:3.12-slim"]
    assert layers == [
        ["FROM base", *(f"RUN {c}" for c in image_build_commands(s))] for s in ordered
    ]
    for spec in ordered:
        where = str(planned_tool(spec).path)
        assert where.startswith(str(tmp_path / "tools"))
        commands = image_build_commands(spec)
        assert commands[0] == f"mkdir -p {where}" and commands[-1].endswith(f"chmod -R a-w {where}")
        assert any(spec.requirement in c for c in commands)  # the pinned version, as on a node


async def test_an_agent_harness_on_modal_installs_nothing_on_the_node(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    sdk()
    root = tmp_path / "tools"
    monkeypatch.setenv(TOOLS_DIR_ENV, str(root))
    for harness_id in AGENT_HARNESSES:
        harness = make_harness(harness_id)
        assert isinstance(harness, ProvisionedHarness)
        check_compatibility(harness, ModalRuntime)
        rt = modal_runtime()
        rt.plan_tools(harness.box_tools())
        await harness.setup(rt)  # the image builds it: no install here
        tool = await harness.box_tool(rt)
        assert tool.path == planned_tool(harness.tool_spec()).path and not tool.installed_now
        assert str(tool.path) in image_build_commands(harness.tool_spec())[0]
    assert [p.name for p in root.iterdir()] == []


@pytest.mark.slow
async def test_the_image_build_commands_install_working_programs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The layers' shell commands, run here as Modal's builder would run them (``/bin/sh -c``
    each, in order), install an npm program with its own Node.js (not this host's) and a PyPI
    package in its own venv, at the planned paths, sealed read-only with a manifest."""
    need_registry("npm")
    need_registry("pypi")
    monkeypatch.setenv(TOOLS_DIR_ENV, str(tmp_path / "tools"))
    npm = ToolSpec(name="semver", kind="npm", package="semver", version="7.6.3")
    pypi = ToolSpec(name="six", kind="pypi", package="six", version="1.16.0")
    for spec in (npm, pypi):
        for command in image_build_commands(spec):
            done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True)
            assert done.returncode == 0, (command, done.stderr[-2000:])
        assert find_tool(spec) == planned_tool(spec).path  # its manifest is there
    tool = planned_tool(npm)
    env = {"PATH": tool.path_env(), "HOME": str(tmp_path)}
    node = subprocess.run(["node", "--version"], env=env, capture_output=True, text=True)
    assert node.stdout.strip() == "v" + NODE_BOOTSTRAP.split("==")[1]  # the tool's own node
    ran = subprocess.run(
        [tool.executable("semver"), "1.2.3"], env=env, capture_output=True, text=True
    )
    assert ran.returncode == 0 and ran.stdout.strip() == "1.2.3", ran.stderr
    python = planned_tool(pypi).executable("python")
    version = subprocess.run([python, "-c", "import six; print(six.__version__)"], **_out())
    assert version.stdout.strip() == "1.16.0"
    assert not os.access(tool.path, os.W_OK) or os.geteuid() == 0
    assert not (tool.path.stat().st_mode & 0o222)  # sealed read-only


def _out() -> dict[str, Any]:
    return {"capture_output": True, "text": True, "check": True}


# -- the task's image through the SDK's builders -----------------------------------------------


def _dockerfile_source(image: Any) -> tuple[str, str]:
    """The Dockerfile path and build context a ``modal.Image.from_dockerfile`` image was made
    with, as the SDK keeps them for its builder (its lazy loader's closures)."""
    from modal._utils.async_utils import synchronizer

    scope = inspect.getclosurevars(synchronizer._translate_in(image)._load).nonlocals
    inner = inspect.getclosurevars(scope["dockerfile_image"]).nonlocals
    mount = inspect.getclosurevars(inner["context_mount_function"]).nonlocals
    return scope["path"], str(mount["context_dir"])


@pytest.mark.parametrize(
    ("image", "pulled"),
    [
        ("debian:bookworm", "debian:bookworm"),
        ("docker://ghcr.io/acme/swe-task:1", "ghcr.io/acme/swe-task:1"),  # the transport dropped
        (None, "python:3.11-slim"),  # the runtime's default image
    ],
)
def test_a_registry_image_goes_to_the_sdks_registry_builder(image: str | None, pulled: str) -> None:
    modal = sdk()
    from modal_box import image_layers

    rt = modal_runtime(RuntimeSpec(image=image))
    assert image_layers(rt.build_image(modal)) == [[f"FROM {pulled}"]]


def test_a_dockerfile_image_goes_to_the_sdks_dockerfile_builder(tmp_path: Path) -> None:
    modal = sdk()
    (tmp_path / "docker").mkdir()
    dockerfile = tmp_path / "docker" / "Dockerfile"
    dockerfile.write_text("FROM debian:bookworm\nCOPY repo /testbed\n")
    context = tmp_path / "context"
    (context / "repo").mkdir(parents=True)
    for text in (f"dockerfile:{dockerfile.parent}:{context}", f"dockerfile:{dockerfile}"):
        rt = modal_runtime(RuntimeSpec(image=text, workdir="/testbed"))
        image = rt.build_image(modal)
        assert isinstance(image, modal.Image)
        expected = str(context) if text.endswith(str(context)) else str(dockerfile.parent)
        assert _dockerfile_source(image) == (str(dockerfile), expected)
    # The agents' layers go on top of the built image, as on a registry one.
    rt.plan_tools([make_harness("codex").box_tools()[0]])
    from modal_box import image_layers

    *_, layer = image_layers(rt.build_image(modal))
    assert layer[0] == "FROM base" and layer[1].startswith("RUN mkdir -p ")


@pytest.mark.parametrize("transport", ["docker-archive", "oci", "oci-archive"])
async def test_an_image_in_a_file_is_refused_before_any_call(
    transport: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    modal = sdk()
    text = f"{transport}:{tmp_path / 'image'}"
    rt = modal_runtime(RuntimeSpec(image=text))
    with pytest.raises(SandboxError) as caught:
        rt.build_image(modal)
    message = str(caught.value)
    assert message.startswith(f"image {text!r}: the modal runtime takes a registry reference")
    assert f"no builder for {transport}: images" in message and "\n" not in message
    # start() refuses it before the service is asked for anything.
    looked_up: list[str] = []

    async def lookup(name: str, create_if_missing: bool = False) -> Any:
        looked_up.append(name)

    fake = SimpleNamespace(App=SimpleNamespace(lookup=SimpleNamespace(aio=lookup)))
    monkeypatch.setattr("vfray.runtimes.modal.optional_import", lambda *a: fake)
    with pytest.raises(SandboxError, match="no builder for"):
        await rt.prepare_image()  # the rollout's image phase
    with pytest.raises(SandboxError, match="no builder for"):
        await rt.start()
    await rt.stop()
    assert looked_up == []
