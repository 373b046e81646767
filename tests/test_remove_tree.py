"""A stopped box's dir tree removed (vfray/runtimes/_remove.py): everything under it, never what
a symlink in it points to; a symlink or a missing path given is left alone, as
``shutil.rmtree(..., ignore_errors=True)`` leaves it."""

from __future__ import annotations

import os
from pathlib import Path

from vfray.runtimes._remove import remove_tree


def test_a_tree_goes_and_what_its_symlinks_point_to_stays(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "kept").mkdir(parents=True)
    (outside / "kept" / "file").write_text("keep me")
    box = tmp_path / "box"
    deep = box / "a" / "b" / "c"
    deep.mkdir(parents=True)
    for i in range(5):
        (deep / f"f{i}").write_bytes(b"x" * 1000)
    (box / "a" / "to-dir").symlink_to(outside / "kept")
    (box / "to-file").symlink_to(outside / "kept" / "file")
    (box / "dangling").symlink_to(tmp_path / "nowhere")
    os.mkfifo(box / "fifo")
    (box / "a" / "b").chmod(0o500)  # read-only to its owner: root removes it all the same

    remove_tree(box)

    assert not box.exists() or os.geteuid() != 0
    assert (outside / "kept" / "file").read_text() == "keep me"
    link = tmp_path / "link"
    link.symlink_to(outside)
    remove_tree(link)
    remove_tree(tmp_path / "missing")
    assert link.is_symlink() and (outside / "kept" / "file").exists()
