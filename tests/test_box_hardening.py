"""What a program in a box cannot do, on real boxes: a bwrap box cannot create a nested user
namespace (``unshare -U`` fails there, while it works on the host)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess

import pytest

from vfray.runtimes.bwrap import BwrapRuntime


@pytest.mark.skipif(
    shutil.which("bwrap") is None or shutil.which("unshare") is None, reason="no bwrap/unshare"
)
def test_a_bwrap_box_cannot_create_a_user_namespace() -> None:
    # The host can (so the refusal below is the box's, not the machine's).
    assert subprocess.run(["unshare", "-U", "true"], timeout=30).returncode == 0

    async def main() -> tuple[int, str, int]:
        async with BwrapRuntime() as rt:
            nested = await rt.run(["unshare", "-U", "true"], timeout=60)
            plain = await rt.run(["true"], timeout=60)
        return nested.exit_code, nested.stderr, plain.exit_code

    nested_rc, stderr, plain_rc = asyncio.run(main())
    assert plain_rc == 0
    assert nested_rc != 0, stderr
    assert "unshare failed" in stderr, stderr
