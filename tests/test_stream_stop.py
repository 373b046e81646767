"""A trainer that stops consuming ``Farm.stream()`` early — ``break`` in the ``async for``, then
leaving the ``with vf.Farm(...)`` block — exits cleanly and quickly on both backends: exit code
0, no traceback, every box torn down, and the rows written so far kept."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    import vfray as vf
    from vfray.tasksets.arithmetic import EndlessArithmetic

    async def train() -> None:
        with vf.Farm(model="scripted:arithmetic?latency=0.3", harness="null",
                     backend=sys.argv[1], output_dir=sys.argv[2], progress=False,
                     max_concurrent=16, num_cpus=2) as farm:
            seen = 0
            async for group in farm.stream(EndlessArithmetic(), rollouts_per_task=2):
                seen += 1
                if seen == 3:
                    break
        print("stopped after", seen, flush=True)

    asyncio.run(train())
    """
)


def _leftovers(root: Path) -> list[str]:
    """Processes still running whose command line, working directory or environment names
    ``root`` (the run's temp and output folders): boxes, harness programs, Ray's processes."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read()
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if str(root) in cmd or cwd.startswith(str(root)) or str(root).encode() in env:
            found.append(f"{entry}: {cmd[:120]}")
    return found


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_breaking_out_of_a_stream_exits_cleanly(tmp_path: Path, backend: str) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    # Ray's socket paths must stay under 108 bytes: a short temp root of the run's own.
    temp = Path(tempfile.mkdtemp(prefix="vfs-", dir="/tmp"))
    out = tmp_path / "out"
    env = {**os.environ, "TMPDIR": str(temp)}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        [sys.executable, str(script), backend, str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "stopped after 3" in done.stdout
    for noise in ("Traceback", "Task exception", "Unclosed", "might be dead", "aclose()"):
        assert noise not in done.stderr, done.stderr[-3000:]
    # The owner's reaper may still be finishing its last sweep for a moment.
    deadline = time.monotonic() + 30
    while (_leftovers(tmp_path) or _leftovers(temp)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _leftovers(tmp_path) == []
    assert _leftovers(temp) == []
    shutil.rmtree(temp, ignore_errors=True)

    import vfray as vf

    (run_dir,) = [p.parent for p in out.glob("*/*/config.json")]
    result = vf.RunResult(run_dir)
    # The three groups the trainer saw were written before it stopped; nothing is lost.
    assert result.episodes.num_rows >= 3
    assert result.traces.num_rows >= 6
