"""A local run's Ray is private to the machine: during a real ``vf.Farm`` run every listening
socket of the driver's process tree (GCS, raylet, agents, workers, the SandboxHost's interception,
the scripted model) is on loopback, and Ray's token auth is on — an unauthenticated gRPC call to
the GCS or the raylet is refused, the same call with the cluster's token is served. The same holds
with the interception as a Serve deployment (``farm.interception = "serve"``): its replica,
whose Serve gRPC server unpickles what it is sent, listens on no network address of its own.

The run happens in a subprocess with a clean environment (no RAY_* variables), as a user's
``vfray eval`` or notebook would have it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import grpc
import pytest
from ray_head import is_loopback

ROOT = Path(__file__).resolve().parent.parent

# The child: a real Farm run; a thread samples LISTEN sockets of the whole process tree while
# it runs; then it prints what it saw and keeps the cluster up until told to close.
CHILD = textwrap.dedent(
    """
    import json, sys, threading, time
    import psutil
    import ray
    import vfray as vf
    from vfray.tasksets import load_taskset

    seen = {}
    stop = threading.Event()

    def sample():
        me = psutil.Process()
        while not stop.is_set():
            for proc in [me, *me.children(recursive=True)]:
                try:
                    cmd = " ".join(proc.cmdline())[:160]
                    for conn in proc.net_connections(kind="inet"):
                        if conn.status == psutil.CONN_LISTEN:
                            key = (proc.pid, conn.laddr.ip, conn.laddr.port)
                            seen[key] = {"pid": proc.pid, "cmd": cmd, "ip": conn.laddr.ip,
                                         "port": conn.laddr.port}
                except psutil.Error:
                    pass
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    config = vf.EvalConfig()
    config.farm.interception = sys.argv[2]
    farm = vf.Farm(config=config, model="scripted:arithmetic?latency=1", harness="null",
                   output_dir=sys.argv[1], progress=False, num_cpus=2)
    result = farm.run(load_taskset("arithmetic").head(4), rollouts_per_task=2)
    time.sleep(0.5)
    stop.set()
    sampler.join()
    node = [n for n in ray.nodes() if n["Alive"]][0]
    print(json.dumps({
        "listeners": list(seen.values()),
        "rows": len(result.final_traces),
        "gcs": ray.get_runtime_context().gcs_address,
        "raylet": f"{node['NodeManagerAddress']}:{node['NodeManagerPort']}",
    }), flush=True)
    sys.stdin.readline()
    farm.close()
    """
)


def token_of(pid: int) -> str:
    """The auth token a Ray process was started with (its environment; same user)."""
    for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        if item.startswith(b"RAY_AUTH_TOKEN="):
            return item.split(b"=", 1)[1].decode()
    raise AssertionError(f"process {pid} has no RAY_AUTH_TOKEN")


def call_gcs(address: str, token: str | None) -> grpc.StatusCode:
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    metadata = [("authorization", f"Bearer {token}")] if token else []
    with grpc.insecure_channel(address) as channel:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        try:
            stub.GetAllNodeInfo(
                gcs_service_pb2.GetAllNodeInfoRequest(), metadata=metadata, timeout=30
            )
        except grpc.RpcError as exc:
            return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def call_raylet(address: str, token: str | None) -> grpc.StatusCode:
    from ray.core.generated import node_manager_pb2, node_manager_pb2_grpc

    metadata = [("authorization", f"Bearer {token}")] if token else []
    with grpc.insecure_channel(address) as channel:
        stub = node_manager_pb2_grpc.NodeManagerServiceStub(channel)
        try:
            stub.GetSystemConfig(
                node_manager_pb2.GetSystemConfigRequest(), metadata=metadata, timeout=30
            )
        except grpc.RpcError as exc:
            return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


@pytest.fixture(params=["host", "serve"])
def local_run(tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "VFRAY_"))}
    env["PYTHONPATH"] = str(ROOT)
    child = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "outputs"), request.param],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert child.stdout is not None and child.stdin is not None
    try:
        line = child.stdout.readline()
        if not line:
            child.wait(timeout=60)
            pytest.fail(f"the run failed:\n{child.stderr.read()[-5000:] if child.stderr else ''}")
        yield {**json.loads(line), "interception": request.param}
    finally:
        with contextlib.suppress(BrokenPipeError):
            child.stdin.write("\n")
            child.stdin.flush()
        try:
            child.wait(timeout=120)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def test_local_run_is_on_loopback_with_ray_auth_on(local_run: dict[str, Any]) -> None:
    assert local_run["rows"] == 8
    listeners = local_run["listeners"]
    commands = " ".join(row["cmd"] for row in listeners)
    # The check saw the servers that matter (it has teeth): Ray's core, the agents, our actors.
    servers = ["gcs_server", "raylet", "DashboardAgent", "SandboxHost", "ScriptedModelServer"]
    if local_run["interception"] == "serve":
        servers.append("ServeReplica")
    for name in servers:
        assert name in commands, (name, listeners)
    exposed = [row for row in listeners if not is_loopback(row["ip"])]
    assert not exposed, f"listening beyond loopback: {exposed}"
    for address in (local_run["gcs"], local_run["raylet"]):
        assert address.startswith("127.0.0.1:"), address

    gcs_pid = next(row["pid"] for row in listeners if "gcs_server" in row["cmd"])
    token = token_of(gcs_pid)
    assert call_gcs(local_run["gcs"], None) == grpc.StatusCode.UNAUTHENTICATED
    assert call_gcs(local_run["gcs"], "0" * 64) == grpc.StatusCode.UNAUTHENTICATED
    assert call_gcs(local_run["gcs"], token) == grpc.StatusCode.OK
    assert call_raylet(local_run["raylet"], None) == grpc.StatusCode.UNAUTHENTICATED
    assert call_raylet(local_run["raylet"], token) == grpc.StatusCode.OK
