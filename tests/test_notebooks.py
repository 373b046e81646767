"""Executes each notebook in ``notebooks/`` with nbclient in a fresh kernel, as CI does, and
checks that every cell ran and showed what the notebook promises. Each notebook's Farm starts
its own local Ray inside the kernel process."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import nbformat
import pytest
from ipykernel.kernelspec import install as install_kernelspec
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
KERNEL = "vfray-notebooks"


@pytest.fixture(scope="module")
def kernel_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A kernelspec for this interpreter in a temp prefix, so the test never depends on one
    installed by hand; its env keeps the kernel's Ray on loopback."""
    prefix = tmp_path_factory.mktemp("jupyter")
    install_kernelspec(
        kernel_name=KERNEL,
        prefix=str(prefix),
        env={"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"},
    )
    return prefix / "share" / "jupyter"


def execute(
    name: str, kernel_path: Path, monkeypatch: pytest.MonkeyPatch, parameters: str | None = None
) -> Any:
    """Run notebook ``name``; ``parameters`` replaces its cell tagged ``parameters`` (the
    papermill convention), so a long notebook runs in a short mode."""
    monkeypatch.setenv("JUPYTER_PATH", str(kernel_path))
    # The kernel inherits our environment: never let it join a cluster RAY_ADDRESS points at.
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    book = nbformat.read(NOTEBOOKS / name, as_version=4)  # type: ignore[no-untyped-call]
    if parameters is not None:
        (cell,) = [c for c in book.cells if "parameters" in c.metadata.get("tags", [])]
        cell.source = parameters
    client = NotebookClient(
        book,
        kernel_name=KERNEL,
        # Per cell; generous because a loaded CI machine starts the kernel's Ray slowly.
        timeout=600,
        resources={"metadata": {"path": str(NOTEBOOKS)}},
    )
    client.execute()  # raises CellExecutionError, with the cell's traceback, on any error
    return book


def text_of(book: Any) -> str:
    """Everything the cells printed or displayed as text, in order."""
    parts: list[str] = []
    for cell in book.cells:
        for output in cell.get("outputs", []):
            if output.output_type == "error":
                pytest.fail(f"cell errored: {output.ename}: {output.evalue}")
            if output.output_type == "stream":
                parts.append(output.text)
            elif "data" in output:
                parts.append(output.data.get("text/plain", ""))
    return "\n".join(parts)


def assert_quiet_progress(book: Any) -> int:
    """Each cell shows at most one progress output (one display updated in place, not a line
    every few seconds) and no warning on stderr (tqdm's "IProgress not found", Ray's "Missing
    packages: ['ipywidgets']"); returns how many cells showed progress."""
    cells = 0
    for cell in book.cells:
        shown = 0
        for output in cell.get("outputs", []):
            if output.output_type == "stream":
                if output.name == "stderr":
                    assert not re.search(r"warn|missing packages|iprogress", output.text, re.I), (
                        output.text
                    )
                shown += output.text.count("rollouts ")
            elif "data" in output:
                shown += output.data.get("text/plain", "").startswith("rollouts ")
        assert shown <= 1, cell.get("outputs")
        cells += shown
    return cells


@pytest.mark.parametrize("name", ["quickstart.ipynb", "training_stream.ipynb", "grpo.ipynb"])
def test_committed_notebooks_have_no_outputs(name: str) -> None:
    book = nbformat.read(NOTEBOOKS / name, as_version=4)  # type: ignore[no-untyped-call]
    nbformat.validate(book)
    code = [cell for cell in book.cells if cell.cell_type == "code"]
    assert code
    assert all(not cell.outputs and cell.execution_count is None for cell in code)
    assert book.metadata.kernelspec.name == "python3"


@pytest.mark.timeout(900)
def test_quickstart_runs_end_to_end(kernel_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    book = execute("quickstart.ipynb", kernel_path, monkeypatch)
    text = text_of(book)
    assert "'rollouts': 24" in text  # 6 tasks x 4 rollouts, the summary dict
    assert "'reward_mean':" in text and "'pass@4':" in text
    assert "'errors': {}" in text
    assert "agrees_with_majority" in text and "task_key" in text  # the DataFrame
    assert "user: What is" in text and "assistant:" in text  # the transcript
    images = [
        output
        for cell in book.cells
        for output in cell.get("outputs", [])
        if output.output_type == "display_data" and "image/png" in output.data
    ]
    assert len(images) == 1  # the reward distribution plot
    # The one run shows one live progress output, ending at its total.
    assert assert_quiet_progress(book) == 1
    assert "rollouts 24/24" in text


@pytest.mark.timeout(900)
def test_training_stream_yields_groups_with_tokens(
    kernel_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    book = execute("training_stream.ipynb", kernel_path, monkeypatch)
    text = text_of(book)
    for step in range(4):
        assert f"step {step}  task " in text
    assert text.count("advantages [") == 4
    assert "loss " in text
    assert text.count("completion tokens [") == 4  # token ids came back with every group
    assert "completion_token_ids" in text  # the last batch as a DataFrame
    assert_quiet_progress(book)


@pytest.mark.timeout(900)
def test_grpo_runs_a_few_steps(
    kernel_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    parameters = f"steps, groups_per_step = 3, 2\noutput_dir = {str(tmp_path)!r}"
    book = execute("grpo.ipynb", kernel_path, monkeypatch, parameters)
    text = text_of(book)
    for step in range(3):
        assert f"step {step:3d}  reward " in text
    assert "logprob mismatch before the first update: " in text
    assert "rollouts in " in text
    assert list(tmp_path.glob("*/*/config.json"))  # the run folder went where it was told
    images = [
        output
        for cell in book.cells
        for output in cell.get("outputs", [])
        if output.output_type == "display_data" and "image/png" in output.data
    ]
    assert len(images) == 1  # the reward curve


def test_the_documented_jupyter_lab_command_is_installed() -> None:
    """notebooks/README.md says `jupyter lab notebooks/` after `pip install -e '.[notebooks]'`:
    where that extra is installed, JupyterLab must be there, not only nbclient. `[dev]` leaves it
    out (see pyproject.toml); .ci/run checks it in a virtualenv of its own."""
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("jupyterlab") is None:
        pytest.skip("the notebooks extra is not installed here (.ci/run checks it on its own)")
    done = subprocess.run(
        [sys.executable, "-m", "jupyterlab", "--version"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().split(".")[0].isdigit()
