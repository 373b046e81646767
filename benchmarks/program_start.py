"""What a built-in harness program costs to start, in CPU per rollout: a fresh ``python -I -S``
interpreter loading the program (its imports and definitions, not its first request) against
the same interpreter with nothing to load, and against forking a warmed interpreter that has
the program's imports already (a fork server / zygote).

Run: ``python benchmarks/program_start.py [--starts 60] [--program PATH]``. CPU time (user +
sys of the children, from ``getrusage``) rather than wall time, so a busy machine skews it less.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

PROGRAMS = Path(__file__).resolve().parent.parent / "vfray" / "harnesses" / "programs"

# Executes the file's top level (imports, definitions) under a name other than __main__, so the
# program's ``main()`` does not run.
LOAD = (
    "import importlib.util as u, sys; s = u.spec_from_file_location('p', sys.argv[1]); "
    "s.loader.exec_module(u.module_from_spec(s))"
)


def _children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def fresh_start_ms(program: Path, starts: int) -> float:
    before = _children_cpu()
    for _ in range(starts):
        subprocess.run([sys.executable, "-I", "-S", "-c", LOAD, str(program)], check=True)
    return (_children_cpu() - before) / starts * 1000


def forked_start_ms(program: Path, starts: int) -> float:
    """A warmed parent (the program's imports done) forks one child per rollout."""
    warm = (
        LOAD
        + "\nimport os\nfor _ in range(int(sys.argv[2])):\n"
        + "    pid = os.fork()\n    if pid == 0:\n        os._exit(0)\n    os.waitpid(pid, 0)\n"
    )

    def run_warm(children: int) -> float:
        before = _children_cpu()
        subprocess.run(
            [sys.executable, "-I", "-S", "-c", warm, str(program), str(children)], check=True
        )
        return _children_cpu() - before

    # getrusage(CHILDREN) counts the warm parent and its reaped children: take the parent out.
    return (run_warm(starts) - run_warm(0)) / starts * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--starts", type=int, default=60)
    parser.add_argument("--program", type=Path, default=PROGRAMS / "chat_loop.py")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        empty = Path(tmp) / "empty.py"
        empty.write_text("")
        bare = fresh_start_ms(empty, args.starts)
    fresh = fresh_start_ms(args.program, args.starts)
    forked = forked_start_ms(args.program, args.starts)
    print(f"program: {args.program.name}, {args.starts} starts, {os.cpu_count()} CPUs")
    print(f"  fresh interpreter, nothing loaded   {bare:7.1f} ms CPU")
    print(f"  fresh interpreter, program loaded   {fresh:7.1f} ms CPU  ({fresh / bare:.1f}x bare)")
    less = fresh / forked
    print(f"  fork of a warmed interpreter        {forked:7.2f} ms CPU  ({less:.0f}x less)")


if __name__ == "__main__":
    main()
