# mypy: disable-error-code="import-not-found,import-untyped,misc,untyped-decorator"
# (verifiers ships no type information; this file runs in its virtualenv, not ours.)
"""Time verifiers v1's own trace store on a run folder: ``read_episodes`` (typed, the way resume
and replay read), a plain ``json.loads`` per line, and ``write_episode`` (the eval's per-episode
append). Runs inside the verifiers virtualenv; prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from verifiers.v1.trace import WireTrace
from verifiers.v1.utils.trace_store import TRACES_FILE, read_episodes, write_episode


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("results_dir", type=Path)
    args = parser.parse_args()
    path = args.results_dir / TRACES_FILE

    start = time.perf_counter()
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    read_json = time.perf_counter() - start

    start = time.perf_counter()
    episodes = read_episodes(args.results_dir, WireTrace)
    read_typed = time.perf_counter() - start

    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        for episode in episodes:
            write_episode(Path(out), episode)
        write = time.perf_counter() - start
        written = (Path(out) / TRACES_FILE).stat().st_size
    traces = sum(len(row["traces"]) for row in rows)
    print(
        json.dumps(
            {
                "traces": traces,
                "bytes": path.stat().st_size,
                "written_bytes": written,
                "read_json_s": read_json,
                "read_typed_s": read_typed,
                "write_s": write,
            }
        )
    )


if __name__ == "__main__":
    main()
