"""The ``goose`` harness: Block's goose agent (the AAIF's since), whose native CLI binary ships on
npm (``@aaif/goose-binary-linux-x64``, ``-linux-arm64``), provisioned into the node's tool dir
and run as ``goose run --no-session --no-profile`` with only its ``developer`` extension (a
``shell`` tool) and the task's MCP servers (streamable HTTP), against the interception as its
``openai`` provider; its ``stream-json`` event stream is kept on the trace.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import os
import platform
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

from vfray.errors import ConfigError
from vfray.harnesses.base import HarnessConfig, LaunchContext
from vfray.harnesses.chat import openai_base_url
from vfray.harnesses.provisioned import (
    AGENT_DIR,
    AgentHarnessConfig,
    ProvisionedHarness,
    prompt_text,
)
from vfray.runtimes.base import ProgramResult, Runtime
from vfray.runtimes.provision import ToolSpec

GOOSE_HOME = f"{AGENT_DIR}/goose-home"
"""goose's ``HOME``: its config, sessions database and logs (XDG dirs under it)."""
EVENTS_PATH = f"{AGENT_DIR}/goose-events.jsonl"
CA_PATH = f"{GOOSE_HOME}/ca.pem"
NO_TELEMETRY = "GOOSE_TELEMETRY_ENABLED: false\n"
ARCHES = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}


class GooseConfig(AgentHarnessConfig):
    """Options of the goose harness."""

    version: str = "1.52.0"
    extensions: tuple[str, ...] = ("developer",)
    """goose's built-in extensions to load (``--with-builtin``); ``developer`` has its shell."""


@functools.cache
def one_ca_certificate() -> bytes:
    """The first certificate of certifi's bundle (httpx's dependency): enough for goose's
    client to start, a few kB per box rather than the whole bundle."""
    import certifi

    pem = Path(certifi.where()).read_bytes()
    end = b"-----END CERTIFICATE-----"
    start = pem.index(b"-----BEGIN CERTIFICATE-----")
    return pem[start : pem.index(end, start) + len(end)] + b"\n"


def node_ca_certificate(root: Path) -> Path:
    """:func:`one_ca_certificate` in a read-only file under the tools root, written once per
    node (boxes that see the tools root read it there rather than each getting a copy)."""
    pem = one_ca_certificate()
    path = root / f"goose-ca-{hashlib.sha256(pem).hexdigest()[:16]}.pem"
    if not path.is_file():
        root.mkdir(parents=True, exist_ok=True)
        staging = root / f".staging-{path.name}-{uuid.uuid4().hex[:8]}"
        staging.write_bytes(pem)
        staging.chmod(0o444)
        os.replace(staging, path)
    return path


def binary_package(machine: str | None = None) -> str:
    """The npm package holding the goose binary for this node's CPU."""
    machine = machine or platform.machine()
    arch = ARCHES.get(machine.lower())
    if arch is None:
        raise ConfigError(f"harness 'goose' has no binary for CPU {machine!r} (x86_64, aarch64)")
    return f"@aaif/goose-binary-linux-{arch}"


def provider_env(base_url: str) -> dict[str, str]:
    """goose's ``openai`` provider pointed at ``base_url``: a host, and the path of the chat
    completions route under it (``OPENAI_BASE_PATH``)."""
    parts = urlsplit(base_url.rstrip("/"))
    host = urlunsplit((parts.scheme, parts.netloc, "", "", ""))
    return {
        "GOOSE_PROVIDER": "openai",
        "OPENAI_HOST": host,
        "OPENAI_BASE_PATH": f"{parts.path.strip('/')}/chat/completions".lstrip("/"),
    }


class GooseHarness(ProvisionedHarness):
    """goose run, headless: no session file, no user profile, no keyring."""

    id = "goose"
    config_type: ClassVar[type[HarnessConfig]] = GooseConfig
    config: GooseConfig
    ARTIFACTS = (EVENTS_PATH,)
    APPENDS_SYSTEM_PROMPT = False
    SUPPORTS_MCP = True

    def __init__(self, config: HarnessConfig | Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        self._ca: Path | None = None

    def tool_spec(self) -> ToolSpec:
        return ToolSpec(
            name="goose", kind="npm", package=binary_package(), version=self.config.version
        )

    async def launch(self, ctx: LaunchContext, runtime: Runtime) -> ProgramResult:
        tool = await self.box_tool(runtime)
        c = self.config
        # Its config file (which also makes the agent dir the event stream goes to): no
        # telemetry, the provider and model as the environment below says them too.
        config = f"GOOSE_PROVIDER: openai\nGOOSE_MODEL: {json.dumps(ctx.model)}\n{NO_TELEMETRY}"
        await runtime.write(f"{GOOSE_HOME}/.config/goose/config.yaml", config.encode())
        # goose's HTTP client will not build without a CA certificate to load (a minimal image
        # has none: "Error builder error"); it only ever speaks plain HTTP to the interception.
        # The node's copy where the box sees the tools root, else one in the box.
        box_paths: tuple[str, ...] = ("HOME",)
        if runtime.TOOLS_IN_IMAGE:
            await runtime.write(CA_PATH, one_ca_certificate())
            ca, box_paths = CA_PATH, ("HOME", "SSL_CERT_FILE")
        else:
            if self._ca is None:
                self._ca = await asyncio.to_thread(node_ca_certificate, Path(self.tools_root))
            ca = str(self._ca)
        argv = [
            tool.executable(tool.spec.package.rsplit("/", 1)[-1]),
            "run",
            "--no-session",
            "--no-profile",
            *(["--with-builtin", ",".join(c.extensions)] if c.extensions else []),
            *(
                a
                for url in ctx.mcp_servers.values()
                for a in ("--with-streamable-http-extension", url)
            ),
            "--output-format",
            "stream-json",
            "--max-turns",
            str(c.max_steps),
            "--model",
            ctx.model,
            *c.extra_args,
            "-t",
            prompt_text(self.resolve_prompt(ctx.data)),
        ]
        env = {
            "PATH": tool.path_env(),
            "HOME": GOOSE_HOME,
            **provider_env(openai_base_url(ctx.endpoint)),
            "GOOSE_MODEL": ctx.model,
            "OPENAI_API_KEY": ctx.secret,
            # No keyring daemon in a box: secrets come from the environment.
            "GOOSE_DISABLE_KEYRING": "1",
            "SSL_CERT_FILE": ca,
            **c.env,
        }
        return await self.run_logged(
            runtime,
            argv,
            env,
            stdout_path=EVENTS_PATH,
            timeout=ctx.timeout,
            box_paths=box_paths,
        )
