"""Per-turn overhead of the interception: N concurrent chat sessions against the zero-latency
scripted model, directly (the baseline), through a bare aiohttp pass-through, through vfray's
``Interception`` app and through verifiers v1's ``InterceptionServer``; p50/p99 latency added over
the direct path, turns/s, and the ratios vfray / verifiers.

Reuses ``benchmarks/interception.py`` (its served processes and its load generator); the
verifiers server runs in the verifiers virtualenv (``vf_side/interception_server.py``).

    python benchmarks/vs_verifiers/interception_overhead.py [--seconds 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from benchmarks import interception as base
from benchmarks.vs_verifiers import common

TURNS = 8
"""Turns per conversation before a session starts over (as in every earlier run of this table)."""


class VerifiersServed(base.Served):
    """verifiers' own InterceptionServer with ``sessions`` registered rollouts (same protocol)."""

    def __init__(self, upstream: str, sessions: int) -> None:
        script = common.VF_SIDE / "interception_server.py"
        argv = [str(common.ensure_venv()), str(script), "--upstream", upstream]
        self.proc = subprocess.Popen(
            [*argv, "--sessions", str(sessions)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        info = json.loads(self.proc.stdout.readline())
        self.url, self.secrets = info["url"], info["secrets"]


def _run(kind: str, model_url: str, sessions: int, seconds: float) -> dict[str, float]:
    if kind == "direct":
        return asyncio.run(base._load(model_url, [], sessions, seconds, TURNS))
    if kind == "verifiers":
        proxy: base.Served = VerifiersServed(f"{model_url}/v1", sessions)
    else:
        proxy = base.Served(kind, f"{model_url}/v1", sessions)
    try:
        return asyncio.run(base._load(proxy.url, proxy.secrets, sessions, seconds, TURNS))
    finally:
        proxy.close()


def measure(seconds: float, latency_sessions: int = 64, rate_sessions: int = 32) -> dict[str, Any]:
    """Added p50/p99 at ``latency_sessions`` and turns/s at ``rate_sessions``, per proxy."""
    kinds = ("direct", "bare-aiohttp", "vfray", "verifiers")
    model = base.Served("model")
    results: dict[str, dict[str, Any]] = {}
    try:
        for sessions in (latency_sessions, rate_sessions):
            for kind in kinds:
                results[f"{kind}@{sessions}"] = _run(kind, model.url, sessions, seconds)
    finally:
        model.close()
    out: dict[str, Any] = {"seconds": seconds, "raw": results}
    direct = results[f"direct@{latency_sessions}"]
    for kind in kinds[1:]:
        r = results[f"{kind}@{latency_sessions}"]
        out[kind] = {
            "added_p50_ms": max(0.0, r["p50"] - direct["p50"]),
            "added_p99_ms": max(0.0, r["p99"] - direct["p99"]),
            "turns_s_latency_sessions": r["turns_s"],
            "turns_s": results[f"{kind}@{rate_sessions}"]["turns_s"],
            "errors": r["errors"] + results[f"{kind}@{rate_sessions}"]["errors"],
        }
    v, f = out["vfray"], out["verifiers"]
    out["ratio_added_p50"] = common.ratio(v["added_p50_ms"], f["added_p50_ms"])
    out["ratio_added_p99"] = common.ratio(v["added_p99_ms"], f["added_p99_ms"])
    out["ratio_turns_s"] = common.ratio(v["turns_s"], f["turns_s"])
    out["sessions"] = {"latency": latency_sessions, "rate": rate_sessions}
    return out


def report(out: dict[str, Any]) -> None:
    s = out["sessions"]
    print(f"\nzero-latency model, {out['seconds']:g} s per row, non-streaming chat turns")
    print(
        f"{'proxy':<14}{'+p50 ms':>9}{'+p99 ms':>9}  turns/s@{s['latency']:<4} turns/s@{s['rate']}"
    )
    for kind in ("bare-aiohttp", "vfray", "verifiers"):
        r = out[kind]
        print(
            f"{kind:<14}{r['added_p50_ms']:>9.2f}{r['added_p99_ms']:>9.2f}"
            f"{r['turns_s_latency_sessions']:>14.0f}{r['turns_s']:>11.0f}"
            f"   errors {r['errors']:.0f}"
        )
    print(
        f"vfray / verifiers: added p50 {out['ratio_added_p50']:.2f}x, added p99"
        f" {out['ratio_added_p99']:.2f}x,"
        f" turns/s at {s['rate']} sessions {out['ratio_turns_s']:.1f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds per row")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    out = measure(args.seconds)
    report(out)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
