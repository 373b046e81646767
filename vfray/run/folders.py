"""Where a run's folder is and what its ``config.json`` header says: a new run gets
``<output_dir>/<taskset>--<model>--<harness>/<run-id>``; a resumed run keeps its folder and id."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import platform
import re
import uuid
from pathlib import Path
from typing import Any

from vfray._version import __version__
from vfray.config import EvalConfig
from vfray.errors import ConfigError


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "x"


def run_folder(config: EvalConfig, name: str, resume: str | Path | None) -> tuple[Path, str]:
    """The run folder and run id: the resumed run's own, or a new, empty one."""
    if resume is not None:
        run_dir = Path(resume)
        if not (run_dir / "config.json").exists():
            raise ConfigError(f"cannot resume {run_dir}: it has no config.json")
        from vfray.run.results import RunResult

        result = RunResult(run_dir)
        return run_dir, str(result.config.get("run_id") or run_dir.name)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_id = f"{stamp}-{uuid.uuid4().hex[:6]}"
    folder = f"{_slug(name)}--{_slug(config.model.name)}--{_slug(config.env.harness.id)}"
    run_dir = Path(config.output_dir) / folder / run_id
    if run_dir.exists() and any(run_dir.iterdir()):
        raise ConfigError(f"run folder {run_dir} is not empty; resume it instead")
    return run_dir, run_id


def run_header(config: EvalConfig, run_id: str, name: str, n: int) -> dict[str, Any]:
    """The run's ``config.json``: resolved config and versions (resume reads it back)."""
    return {
        "run_id": run_id,
        "taskset": name,
        "rollouts_per_task": n,
        "config": config.model_dump(mode="json"),
        "versions": {
            "vfray": __version__,
            # From the package metadata: importing ray costs ~0.5 s a local run never needs.
            "ray": importlib.metadata.version("ray"),
            "python": platform.python_version(),
        },
        "created": dt.datetime.now(dt.UTC).isoformat(),
    }
