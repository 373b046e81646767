"""One v1 environment scored by ``vf-eval`` and by ``vfray eval`` from ONE virtualenv (vfray,
verifiers 0.4.0 and the environment packages installed side by side), against the same scripted
model server: vfray runs verifiers' genuine objects there. Prints, as JSON, which ``verifiers``
vfray's side imported and both sides' rollouts (:class:`vfray.compat.v1.traces.Outcome`).

    python genuine_side.py OUT_DIR POLICY -- <vf-eval flags, without -m/--client/-o>

Run by tests/test_v1_genuine.py with the side-by-side virtualenv's python.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import subprocess
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    out, policy, _, *flags = argv
    from vfray.cli.main import main as vfray_main
    from vfray.compat.v1.traces import export_run, read_v1_traces
    from vfray.models.scripted.server import scripted_server

    os.environ["VFK"] = "unused"
    with scripted_server(policy) as url:
        argv_ = [*flags, "-m", "scripted", "--client.base-url", url, "--client.api-key-var", "VFK"]
        argv_ += ["--no-push", "--no-rich"]
        vf_eval = str(Path(sys.executable).parent / "vf-eval")
        theirs = subprocess.run(
            [vf_eval, *argv_, "-o", f"{out}/v1"], capture_output=True, text=True, timeout=900
        )
        log = io.StringIO()
        with contextlib.redirect_stdout(log):
            ours = vfray_main(["eval", *argv_, "-o", f"{out}/vfray", "--backend", "local"])
    if theirs.returncode != 0 or ours != 0:
        print(json.dumps({"error": theirs.stderr[-3000:], "vf_rc": theirs.returncode, "rc": ours}))
        return 1
    import verifiers

    [v1_file] = Path(out, "v1").glob("*/traces.jsonl")
    [run_dir] = Path(out, "vfray").glob("*/*")

    def rows(path: Path) -> list[dict[str, object]]:
        return [dataclasses.asdict(o) for o in read_v1_traces(path)]

    print(
        json.dumps(
            {
                "verifiers": verifiers.__file__,
                "theirs": rows(v1_file),
                "ours": rows(export_run(run_dir)),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
