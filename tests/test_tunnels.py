"""Tunnels for boxes off the node, tested without internet: the "remote" boxes live in a network
namespace that can reach nothing but a local sshd (``tests/netns_box.py``), so a rollout only
succeeds through the node's ssh reverse tunnel. One tunnel per node, shared, restarted when it
dies, closed with the run; the ``command`` family reads any program's printed URL."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.responses import PlainTextResponse
from starlette.types import Receive, Scope, Send

import vfray as vf
from tests.netns_box import Island, island
from vfray.endpoints.serving import serve_in_loop
from vfray.errors import ConfigError
from vfray.runtimes.registry import make_runtime
from vfray.runtimes.tunnels import ProcessTunnel, TunnelKeeper, TunnelSettings, make_tunnel
from vfray.tasksets.arithmetic import ArithmeticTaskset

needs_root_net = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip") or not os.path.exists("/usr/sbin/sshd"),
    reason="needs root, iproute2 and openssh-server (apt-get install openssh-server)",
)


@pytest.fixture(scope="module")
def isle() -> Iterator[Island]:
    with island() as made:
        yield made


async def hello(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "http":
        await PlainTextResponse("node endpoint")(scope, receive, send)


def fetch_in(netns: str, url: str) -> tuple[int, str]:
    code = f"import urllib.request; print(urllib.request.urlopen({url!r}, timeout=5).read())"
    proc = subprocess.run(
        ["ip", "netns", "exec", netns, sys.executable, "-c", code], capture_output=True, text=True
    )
    return proc.returncode, proc.stdout.strip()


@needs_root_net
async def test_ssh_tunnel_is_opened_once_shared_restarted_and_closed(isle: Island) -> None:
    async with serve_in_loop(hello) as local:
        # The box cannot reach the node's endpoint on its own.
        assert (await asyncio.to_thread(fetch_in, isle.netns, local + "/x"))[0] != 0
        accepted = isle.accepted()
        keeper = TunnelKeeper(TunnelSettings(type="ssh", options=isle.tunnel_options()), local)
        first = await keeper.public_url(local + "/v1/models")
        again = await keeper.public_url(local + "/v1/chat")
        assert first.startswith(f"http://{isle.gateway}:") and first.endswith("/v1/models")
        assert again.rsplit("/v1", 1)[0] == first.rsplit("/v1", 1)[0]  # shared
        assert keeper.opened == 1 and isle.accepted() == accepted + 1
        assert await asyncio.to_thread(fetch_in, isle.netns, first) == (0, "b'node endpoint'")
        # Its program dies: the next box's request opens a new one.
        assert isinstance(keeper.tunnel, ProcessTunnel) and keeper.tunnel.proc is not None
        os.killpg(keeper.tunnel.proc.pid, signal.SIGKILL)
        await asyncio.sleep(0.2)
        restarted = await keeper.public_url(local + "/v1/models")
        assert keeper.opened == 2
        assert await asyncio.to_thread(fetch_in, isle.netns, restarted) == (0, "b'node endpoint'")
        assert isinstance(keeper.tunnel, ProcessTunnel) and keeper.tunnel.proc is not None
        proc = keeper.tunnel.proc
        await keeper.close()
        assert proc.returncode is not None  # closed with the run


async def test_command_tunnel_reads_the_url_the_program_prints(tmp_path: Path) -> None:
    script = tmp_path / "fake_tunnel.py"
    script.write_text(
        "import sys, time\n"
        "print('starting', flush=True)\n"
        "print(f'INF |  https://{sys.argv[1]}-x.trycloudflare.com  |', flush=True)\n"
        "time.sleep(60)\n"
    )
    settings = TunnelSettings(
        type="command",
        options={
            "command": [sys.executable, str(script), "{port}"],
            "pattern": r"https://\S+\.trycloudflare\.com",
        },
    )
    keeper = TunnelKeeper(settings, "http://127.0.0.1:4321/v1")
    url = await keeper.public_url("http://127.0.0.1:4321/v1/responses")
    assert url == "https://4321-x.trycloudflare.com/v1/responses"
    await keeper.close()


async def test_a_tunnel_program_that_prints_no_url_fails_with_its_output() -> None:
    settings = TunnelSettings(
        type="command", options={"command": [sys.executable, "-c", "print('auth failed')"]}
    )
    with pytest.raises(vf.errors.InterceptionError, match="auth failed"):
        await TunnelKeeper(settings, "http://127.0.0.1:1/v1").public_url()


async def test_bad_tunnel_settings_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="unknown tunnel"):
        make_tunnel(TunnelSettings(type="ngrokk"))
    with pytest.raises(ConfigError, match="bad options"):
        make_tunnel(TunnelSettings(type="ssh", options={"hostname": "x"}))
    # Modal boxes take the tunnel's public URL as it is; a loopback one cannot reach them.
    modal = make_runtime("modal")
    assert await modal.host_url("https://t.example/v1") == "https://t.example/v1"
    with pytest.raises(ConfigError, match=r"farm\.tunnel"):
        await modal.host_url("http://127.0.0.1:1/v1")


def netns_farm(
    isle: Island, out: Path, interception: str, address: str | None = None, per_node: int = 2
) -> vf.Farm:
    config = vf.EvalConfig()
    config.address = address
    config.env.runtime.type = "tests.netns_box:NetnsRuntime"
    config.env.runtime.options = {"netns": isle.netns}
    config.farm.interception = interception  # type: ignore[assignment]
    config.farm.hosts_per_node = per_node
    config.farm.tunnel = TunnelSettings(type="ssh", options=isle.tunnel_options())
    return vf.Farm(
        config=config,
        model="scripted:arithmetic",
        harness="null",
        output_dir=str(out),
        progress=False,
        max_concurrent=6,
    )


@needs_root_net
@pytest.mark.parametrize("interception", ["serve", "host"])
def test_remote_boxes_reach_the_interception_through_one_tunnel_per_node(
    isle: Island, tmp_path: Path, interception: str, ray_local: None
) -> None:
    accepted = isle.accepted()
    with netns_farm(isle, tmp_path, interception) as farm:
        result = farm.run(ArithmeticTaskset(num_tasks=6), rollouts_per_task=2)
        if interception == "serve":
            from tests.test_interception_pool import replica_stats

            assert replica_stats(farm)["tunnels_opened"] == 1
    rows = result.traces.to_pylist()
    assert len(rows) == 12 and all(r["ok"] and r["num_calls"] >= 1 for r in rows), rows[0]
    # Serve: the node's one replica owns the tunnel; host: each SandboxHost owns one.
    assert isle.accepted() - accepted == (1 if interception == "serve" else 2)


@needs_root_net
@pytest.mark.slow
def test_three_node_cluster_has_one_replica_and_one_tunnel_per_node(
    isle: Island, tmp_path: Path, ray_fresh: None, caplog: pytest.LogCaptureFixture
) -> None:
    import ray
    from ray.cluster_utils import Cluster

    from actors._local_ray import patient_node_start, worker_system_config

    caplog.set_level(logging.INFO, logger="actors.cluster")
    with patient_node_start():  # a loaded machine starts nodes slowly
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False,
                "_system_config": worker_system_config(),
            },
        )  # fmt: skip
        for _ in range(2):
            cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    cluster.wait_for_nodes()
    try:
        accepted = isle.accepted()
        farm = netns_farm(isle, tmp_path, "serve", address=cluster.address, per_node=1)
        with farm:
            result = farm.run(ArithmeticTaskset(num_tasks=9), rollouts_per_task=2)
            hosts = farm.host_stats()
            from ray import serve

            app = serve.status().applications[farm._pool.app_name]
            replicas = app.deployments["Interception"].replica_states
        rows = result.traces.to_pylist()
        assert len(rows) == 18 and all(r["ok"] for r in rows)
        assert replicas == {"RUNNING": 3}  # one per node (at most one per node, three nodes)
        # Each node's hosts use their own node's replica, and each replica that served remote
        # boxes opened one tunnel: one sshd connection per node. Every host came up on its own
        # node the first time (HostLayout asks Ray for a resource, so it keeps the affinity),
        # and none had to be started again.
        assert not [r for r in caplog.records if "off their node" in r.getMessage()]
        nodes = {h["node_id"] for h in hosts}
        assert len({h["url"] for h in hosts}) == len(nodes) == 3
        assert isle.accepted() - accepted == len(nodes)
    finally:
        ray.shutdown()
        cluster.shutdown()
