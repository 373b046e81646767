"""The README's and the docs' Python blocks run as written: each page's ```python blocks, in order,
as one script (the README's taskset and RL loop; each docs page on its own), so a newcomer
copying them never meets an undefined name. A block fenced ```python {.notest} is shown (the
attribute is a CSS class to mkdocs) but not run: it needs what this machine lacks (a real
endpoint, a cluster), and its page says so."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"

# A fence at the start of a line; the info string after the language may carry `{.notest}`.
FENCE = re.compile(r"^```python([^\n]*)\n(.*?)^```", flags=re.S | re.M)
NOTEST = re.compile(r"\{[^}]*\.notest\b[^}]*\}")


def python_blocks(page: Path) -> list[str]:
    """The page's runnable Python blocks, in order."""
    return [code for info, code in FENCE.findall(page.read_text()) if not NOTEST.search(info)]


def skipped_blocks(page: Path) -> list[str]:
    return [code for info, code in FENCE.findall(page.read_text()) if NOTEST.search(info)]


def run_blocks(blocks: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "page.py"
    # A block that hangs prints every thread's stack before the test gives up on it.
    watchdog = "import faulthandler\nfaulthandler.dump_traceback_later(200, exit=True)\n"
    script.write_text(watchdog + "\n\n".join(blocks))
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        # The local backend: the blocks' logic is what is checked here, not Ray's start-up.
        env={**os.environ, "VFRAY_BACKEND": "local"},
    )


def doc_pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if FENCE.search(p.read_text()))


def test_readme_python_blocks_run_as_written(tmp_path: Path) -> None:
    blocks = python_blocks(REPO / "README.md")
    assert len(blocks) >= 2, "the README lost its taskset and RL examples"
    done = run_blocks(blocks, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: str(p.relative_to(DOCS)))
def test_docs_page_python_blocks_run_as_written(page: Path, tmp_path: Path) -> None:
    blocks = python_blocks(page)
    if not blocks:
        pytest.skip("every Python block of this page is marked notest")
    done = run_blocks(blocks, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr


def test_the_pages_that_teach_the_api_have_blocks_that_run() -> None:
    """The runner sees the pages it should: losing a page's blocks (a renamed fence, a moved
    page) would turn its test into nothing."""
    pages = {str(p.relative_to(DOCS)) for p in doc_pages() if python_blocks(p)}
    for page in ("learn/taskset.md", "learn/seats.md", "learn/tools.md", "guides/training.md"):
        assert page in pages


def test_notest_blocks_are_few() -> None:
    """`{.notest}` is for blocks that need a real endpoint or a cluster, not a way to skip one."""
    skipped = sum(len(skipped_blocks(p)) for p in [REPO / "README.md", *doc_pages()])
    assert skipped <= 3, f"{skipped} blocks marked notest"


def test_a_broken_block_fails_its_page(tmp_path: Path) -> None:
    """The runner has teeth: a block that raises, after one that runs, fails the script."""
    done = run_blocks(["x = 1", "raise ValueError(f'broken block {x}')"], tmp_path)
    assert done.returncode != 0
    assert "ValueError: broken block 1" in done.stderr
