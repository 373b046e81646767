"""A vfray run as Harbor's job folder (``vfray export RUN_DIR --format harbor``), so Harbor's
viewer (``harbor view``) and its other job tools read vfray runs.

Harbor 0.26.0 lays a job out as ``JOB/config.json`` (its ``JobConfig``), ``JOB/result.json``
(``JobResult``: counts and per-eval reward statistics) and one folder per trial,
``JOB/<task>__<id>/``, holding ``config.json`` (``TrialConfig``), ``result.json``
(``TrialResult``), ``agent/`` (the agent's logs) and ``verifier/`` (``reward.txt`` or
``reward.json``, the verifier's output). This writes each final trace of the run as one trial:

- the task's name and folder (a Harbor task's own; another taskset's task key, with no path);
- the harness as the agent (``oracle``, ``codex``, ...), the model as ``model_info``, the
  runtime as the environment type, token counts as the agent's usage;
- the rewards as ``verifier_result.rewards`` (a weight-0 reward whose value is None is left
  out, as Harbor has no null reward), written to ``verifier/reward.json`` too;
- the first error as ``exception_info`` (vfray's type name, ``phase: message``), the
  rollout's phases as the trial's timings (boot+setup as environment setup, agent as agent
  execution, finalize as verifier);
- artifacts named ``agent/...`` (a Harbor task's ``/logs/agent``) into ``agent/``, those named
  ``verifier/...`` into ``verifier/``, any other (a harness's transcript) into ``agent/``.

Only what the traces hold is written: Harbor's lock files, trial logs and trajectories (ATIF)
are not, so tools that need those (``harbor jobs resume``, trajectory views) find them absent.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from vfray.trace import Trace

SCHEMA_VERSION = 1


def _when(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, tz=UTC).isoformat().replace("+00:00", "Z")


def _span(trace: Trace, *phases: str) -> dict[str, str | None] | None:
    found = [trace.timing[p] for p in phases if p in trace.timing]
    if not found:
        return None
    ends = [t.end for t in found if t.end is not None]
    return {
        "started_at": _when(min(t.start for t in found)),
        "finished_at": _when(max(ends) if ends else None),
    }


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "task"


def _task_name(trace: Trace) -> str:
    return str(trace.task.data.get("name") or trace.task.key)


def _rewards(trace: Trace) -> dict[str, float] | None:
    values = {k: r.value for k, r in trace.rewards.items() if r.value is not None}
    return values or None


def _model(model: str) -> dict[str, str | None] | None:
    if not model:
        return None
    provider, _, name = model.rpartition("/") if "/" in model else ("", "", model)
    return {"name": name, "provider": provider or None}


def trial_result(trace: Trace, job_dir: Path, job_id: str) -> dict[str, Any]:
    """One trace as Harbor's ``TrialResult`` (a JSON-ready dict)."""
    name = _task_name(trace)
    trial = f"{_safe(name)}__{trace.trace_id[:7]}"
    task_dir = trace.task.data.get("task_dir")
    task_id = {"path": str(task_dir or name)}
    agent = trace.agent
    tokens_in = sum(c.usage.input_tokens for c in trace.calls)
    tokens_out = sum(c.usage.output_tokens for c in trace.calls)
    error = trace.errors[0] if trace.errors else None
    config = {
        "task": {"path": task_id["path"], "source": "vfray"},
        "trial_name": trial,
        "trials_dir": str(job_dir),
        "agent": {"name": agent.harness or "vfray", "model_name": agent.model or None},
        "environment": {"type": agent.runtime or "docker"},
        "job_id": job_id,
    }
    rewards = _rewards(trace)
    return {
        "schema_version": SCHEMA_VERSION,
        "id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"vfray:{trace.trace_id}")),
        "task_name": name,
        "trial_name": trial,
        "trial_uri": (job_dir / trial).resolve().as_uri(),
        "task_id": task_id,
        "source": "vfray",
        "task_checksum": trace.task.hash or hashlib.sha256(name.encode()).hexdigest(),
        "config": config,
        "agent_info": {
            "name": agent.harness or "vfray",
            "version": "vfray",
            "model_info": _model(agent.model),
        },
        "agent_result": {
            "n_input_tokens": tokens_in if trace.calls else None,
            "n_output_tokens": tokens_out if trace.calls else None,
        },
        "verifier_result": None if rewards is None else {"rewards": rewards},
        "exception_info": None
        if error is None
        else {
            "exception_type": error.type,
            "exception_message": f"{error.phase or 'rollout'}: {error.message}",
            "exception_traceback": error.detail or "",
            "occurred_at": _when(trace.created_at),
        },
        "started_at": _when(min((t.start for t in trace.timing.values()), default=None)),
        "finished_at": _when(
            max((t.end for t in trace.timing.values() if t.end is not None), default=None)
        ),
        "environment_setup": _span(trace, "boot", "setup"),
        "agent_execution": _span(trace, "agent"),
        "verifier": _span(trace, "finalize"),
        "reward_valid": rewards is not None and error is None,
    }


def _write_trial(trace: Trace, job_dir: Path, job_id: str) -> dict[str, Any]:
    result = trial_result(trace, job_dir, job_id)
    folder = job_dir / result["trial_name"]
    (folder / "agent").mkdir(parents=True, exist_ok=True)
    (folder / "verifier").mkdir(exist_ok=True)
    for artifact in trace.artifacts:
        where, _, rest = artifact.name.partition("/")
        if where in ("agent", "verifier") and rest:
            path = folder / where / rest
        else:
            path = folder / "agent" / artifact.name
        if ".." in Path(artifact.name).parts:
            continue  # a name that would leave the trial's folder
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(artifact.content)
    if result["verifier_result"] is not None:
        rewards = result["verifier_result"]["rewards"]
        (folder / "verifier" / "reward.json").write_text(json.dumps(rewards))
    (folder / "config.json").write_text(json.dumps(result["config"], indent=2))
    (folder / "result.json").write_text(json.dumps(result, indent=2))
    return result


def _stats(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Harbor's ``JobStats`` of these trials: reward values to trial names, per eval."""
    evals: dict[str, dict[str, Any]] = {}
    errored = 0
    for result in results:
        model = result["agent_info"]["model_info"]
        key = result["agent_info"]["name"] + (f"__{model['name']}" if model else "") + "__vfray"
        stats = evals.setdefault(
            key,
            {"n_trials": 0, "n_errors": 0, "reward_stats": defaultdict(dict),
             "exception_stats": defaultdict(list)},
        )  # fmt: skip
        verifier = result["verifier_result"]
        if result["reward_valid"] and verifier is not None:
            stats["n_trials"] += 1
            for name, value in verifier["rewards"].items():
                stats["reward_stats"][name].setdefault(str(value), []).append(result["trial_name"])
        if result["exception_info"] is not None:
            stats["n_errors"] += 1
            errored += 1
            kind = result["exception_info"]["exception_type"]
            stats["exception_stats"][kind].append(result["trial_name"])
    return {"n_completed_trials": len(results), "n_errored_trials": errored, "evals": evals}


def export_job(traces: list[Trace], out: Path, job_name: str) -> Path:
    """Write ``traces`` as Harbor's job folder ``out/job_name``; returns it."""
    job_dir = out / job_name
    job_dir.mkdir(parents=True, exist_ok=True)
    job_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"vfray-job:{job_name}"))
    results = [_write_trial(trace, job_dir, job_id) for trace in traces]
    starts = [r["started_at"] for r in results if r["started_at"]]
    ends = [r["finished_at"] for r in results if r["finished_at"]]
    now = _when(datetime.now(tz=UTC).timestamp())
    job = {
        "schema_version": SCHEMA_VERSION,
        "id": job_id,
        "started_at": min(starts, default=now),
        "updated_at": max(ends, default=now),
        "finished_at": max(ends, default=now),
        "n_total_trials": len(results),
        "stats": _stats(results),
    }
    (job_dir / "result.json").write_text(json.dumps(job, indent=2))
    config = {"job_name": job_name, "jobs_dir": str(out), "n_attempts": 1}
    (job_dir / "config.json").write_text(json.dumps(config, indent=2))
    return job_dir


def export_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """A vfray run folder's final traces as a Harbor job under ``out`` (default
    ``RUN_DIR/harbor``), named after the run folder; returns the job folder."""
    from vfray.run.results import final_rows
    from vfray.traces.convert import table_to_traces
    from vfray.traces.io import read_traces

    run = Path(run_dir)
    traces = table_to_traces(final_rows(read_traces(run / "traces")))
    return export_job(traces, Path(out) if out is not None else run / "harbor", run.name)
