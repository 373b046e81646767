"""Internal: where a ``harbor:PATH`` taskset's task folders are: the folder itself, the task
folders under it (up to six levels down, hidden folders and symlinks skipped), or the ones a
local dataset manifest lists; and the one-line refusal of anything that would need Harbor's
registry (the internet)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from vfray.errors import TasksetError

MAX_DEPTH = 6


def registry_refusal(spec: str) -> TasksetError:
    return TasksetError(
        f"harbor:{spec}: fetching from Harbor's registry needs the internet, and vfray reads "
        "local task folders and manifests only; download the dataset (harbor datasets "
        "download NAME) and pass its folder"
    )


def find_task_dirs(root: Path, depth: int = MAX_DEPTH) -> list[Path]:
    """``root`` when it is a task folder, else the task folders under it, sorted."""
    if (root / "task.toml").is_file():
        return [root]
    if depth == 0:
        return []
    found: list[Path] = []
    for child in sorted(root.iterdir()):
        if child.is_dir() and not child.name.startswith(".") and not child.is_symlink():
            found += find_task_dirs(child, depth - 1)
    return found


def read_manifest(path: Path) -> list[Path]:
    """The task folders a local dataset manifest lists (JSON: a list of datasets, or one, with
    ``tasks``; TOML: ``[[tasks]]``), each entry's ``path`` relative to the manifest."""
    try:
        text = path.read_text()
        raw: Any = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (OSError, ValueError) as exc:
        raise TasksetError(f"{path}: cannot read the manifest: {exc}") from exc
    datasets = raw if isinstance(raw, list) else [raw]
    folders: list[Path] = []
    for dataset in datasets:
        tasks = dataset.get("tasks") if isinstance(dataset, dict) else None
        if not isinstance(tasks, list):
            raise TasksetError(f"{path}: a manifest lists its tasks under 'tasks'")
        for entry in tasks:
            if not isinstance(entry, dict):
                raise TasksetError(f"{path}: each task entry must be a table")
            git_url = entry.get("git_url")
            if git_url and not Path(str(git_url)).is_dir():
                raise registry_refusal(f"{path} ({entry.get('name', '?')} from {git_url})")
            base = Path(str(git_url)) if git_url else path.parent
            folders.append(base / str(entry.get("path", entry.get("name", ""))))
    return folders
