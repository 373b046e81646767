"""``run_uv_script``: run a PEP 723 script (inline dependencies) with ``uv run`` inside a box.

The script's dependencies are installed by uv inside the box, so scorer dependencies never touch
the farm process. uv must be on the box's PATH; its cache lives in the box's ``/tmp``. A box
without network (bwrap/docker default-deny) can only run scripts whose dependencies are none or
already in that cache; ``UV_OFFLINE`` is set there so uv fails fast instead of retrying.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence

from vfray.runtimes.base import ProgramResult, Runtime

UV_CACHE_DIR = ".vfray/uv-cache"
"""uv's cache, relative to the box's work dir (always writable, removed with the box)."""


async def run_uv_script(
    runtime: Runtime,
    script: str,
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    offline: bool | None = None,
) -> ProgramResult:
    """Write ``script`` into the box and run it with ``uv run --script``; ``offline`` defaults
    to whether the runtime isolates the network."""
    name = f".vfray/scripts/{uuid.uuid4().hex[:12]}.py"
    await runtime.write(name, script.encode(), mode=0o755)
    uv_env = {"UV_CACHE_DIR": UV_CACHE_DIR, "UV_NO_PROGRESS": "1", "UV_PYTHON_DOWNLOADS": "never"}
    if offline if offline is not None else runtime.isolates_network:
        uv_env["UV_OFFLINE"] = "1"
    uv_env.update(env or {})
    return await runtime.run(
        ["uv", "run", "--quiet", "--no-project", "--script", name, *args],
        uv_env,
        timeout=timeout,
    )
