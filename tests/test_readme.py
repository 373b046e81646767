"""The README's Python blocks run as written, in order (the taskset, the run, the RL loop), so a
newcomer copying them never meets an undefined name."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def python_blocks() -> list[str]:
    text = (REPO / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_readme_python_blocks_run_as_written(tmp_path: Path) -> None:
    blocks = python_blocks()
    assert len(blocks) >= 2, "the README lost its taskset and RL examples"
    script = tmp_path / "readme.py"
    # A block that hangs prints every thread's stack before the test gives up on it.
    watchdog = "import faulthandler\nfaulthandler.dump_traceback_later(200, exit=True)\n"
    script.write_text(watchdog + "\n\n".join(blocks))
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        # The local backend: the blocks' logic is what is checked here, not Ray's start-up.
        env={**__import__("os").environ, "VFRAY_BACKEND": "local"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
