"""vfray: run agentic LLM rollouts at cluster scale on Ray, for evaluation and RL training.

``import vfray`` never imports Ray: :class:`Farm` is loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vfray.endpoints.client import ModelEndpoint
from vfray.episode import Episode, finalize_episode
from vfray.errors import (
    ConfigError,
    HarnessError,
    InterceptionError,
    ProviderError,
    SandboxError,
    TaskError,
    TasksetError,
    VfrayError,
)
from vfray.harnesses.base import Harness, HarnessConfig
from vfray.harnesses.users import SimulatedUser, user
from vfray.judges import Judge
from vfray.runtimes.base import Runtime
from vfray.runtimes.registry import make_runtime
from vfray.scoring import group_reward, metric, reward, stop
from vfray.task import Task, TaskData
from vfray.taskset import Taskset
from vfray.tools.toolset import McpServer, Toolset, intercept, tool
from vfray.trace import Branch, Message, ModelCall, StopCondition, Trace

if TYPE_CHECKING:
    from vfray.config import EvalConfig
    from vfray.farm import Farm
    from vfray.harnesses.seats import Agent, Seat, SeatedTask, Turn
    from vfray.run.environment import LocalEnvironment, run_episode, run_rollout
    from vfray.run.results import RunResult
    from vfray.traces import read_traces, to_samples, write_traces

from vfray._version import __version__ as __version__

__all__ = [
    "Agent",
    "Branch",
    "ConfigError",
    "Episode",
    "EvalConfig",
    "Farm",
    "Harness",
    "HarnessConfig",
    "HarnessError",
    "InterceptionError",
    "Judge",
    "LocalEnvironment",
    "McpServer",
    "Message",
    "ModelCall",
    "ModelEndpoint",
    "ProviderError",
    "RunResult",
    "Runtime",
    "SandboxError",
    "Seat",
    "SeatedTask",
    "SimulatedUser",
    "StopCondition",
    "Task",
    "TaskData",
    "TaskError",
    "Taskset",
    "TasksetError",
    "Toolset",
    "Trace",
    "Turn",
    "VfrayError",
    "finalize_episode",
    "group_reward",
    "intercept",
    "make_runtime",
    "metric",
    "read_traces",
    "reward",
    "run_episode",
    "run_rollout",
    "stop",
    "to_samples",
    "tool",
    "user",
    "write_traces",
]

_LAZY = {
    "EvalConfig": "vfray.config",
    "Farm": "vfray.farm",
    "LocalEnvironment": "vfray.run.environment",
    "RunResult": "vfray.run.results",
    # The Parquet functions pull in pyarrow: a third of the CLI's import time.
    "read_traces": "vfray.traces",
    "to_samples": "vfray.traces",
    "write_traces": "vfray.traces",
    "run_episode": "vfray.run.environment",
    # Seats carry interception limits, whose package pulls in the HTTP stack.
    "Agent": "vfray.harnesses.seats",
    "Seat": "vfray.harnesses.seats",
    "SeatedTask": "vfray.harnesses.seats",
    "Turn": "vfray.harnesses.seats",
    "run_rollout": "vfray.run.environment",
}


def __getattr__(name: str) -> Any:
    # Farm pulls in Ray and the local environment the HTTP stack: load them when asked for,
    # so `import vfray` (and every `vfray` command) stays quick.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'vfray' has no attribute {name!r}")
