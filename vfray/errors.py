"""The one error tree of vfray, rooted at :class:`VfrayError`.

::

    VfrayError
    ├── ConfigError            bad configuration, caught before anything runs
    │   └── IncompatibleError  a harness/runtime/taskset pairing that cannot work
    ├── TasksetError           a taskset that cannot be loaded (duplicate keys, bad shuffle)
    ├── MissingExtraError      an optional dependency is not installed (says the pip line)
    ├── RunFolderError         a run folder's Parquet file cannot be read (names the file)
    │   └── SinkError          rows could not be written to the run folder; the run stops
    └── RolloutError           anything that fails one rollout; recorded on its trace as data
        ├── TaskError          the task's own code failed (setup, finalize, validate, a score hook)
        │   └── JudgeError     a judge's model gave no usable verdict (after its retries)
        ├── HarnessError       the agent program crashed or misbehaved
        ├── SandboxError       the box died or could not be started
        ├── ProviderError      the model endpoint failed (after the SDK's retries)
        ├── InterceptionError  the interception lost the session or could not record a turn
        ├── PhaseTimeoutError  a phase ran past its deadline
        ├── ToolError          a tool server did not start, or a tool call failed (on its record)
        └── InfrastructureError  an actor or node died under the rollout (retried elsewhere)

Internal: importable, but not the public API (:mod:`vfray`, :mod:`vfray.testing`,
:mod:`vfray.train`, :mod:`vfray.compat.v1`); names here may move.
"""

from __future__ import annotations


class VfrayError(Exception):
    """Base class of every error vfray raises on purpose."""


class ConfigError(VfrayError):
    """The configuration is invalid; raised before any rollout starts."""


class IncompatibleError(ConfigError):
    """A harness, runtime and taskset combination that cannot work together."""


class TasksetError(VfrayError):
    """A taskset could not be loaded or iterated as asked."""


class MissingExtraError(VfrayError, ImportError):
    """An optional dependency is missing; the message carries the exact install line."""

    def __init__(self, extra: str, module: str) -> None:
        self.extra = extra
        self.module = module
        super().__init__(
            f"{module!r} is not installed; install it with: pip install 'vfray[{extra}]'"
        )

    def __reduce__(self) -> tuple[type, tuple[str, ...]]:
        # Rebuild from the constructor's arguments: raised in a Ray actor, it is pickled.
        return (type(self), (self.extra, self.module))


class RunFolderError(VfrayError):
    """A file of a run folder cannot be read (a truncated or corrupt Parquet part)."""


class SinkError(RunFolderError):
    """Rows could not be written to the run folder (disk full, a write error, a lost sink).

    The run stops starting rollouts; the rows it could not write are not in the folder, so
    ``vfray resume`` runs them again."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __reduce__(self) -> tuple[type, tuple[str]]:
        # Raised in the sink actor, it is pickled.
        return (type(self), (self.message,))


class RolloutError(VfrayError):
    """Base of the errors that fail a single rollout and are stored on its trace."""


class TaskError(RolloutError):
    """The task's own code (setup, finalize, validate or scoring) raised."""


class JudgeError(TaskError):
    """A judge (a reward computed by a model) got no usable verdict: its endpoint failed or
    its answers did not parse, after its retries."""


class HarnessError(RolloutError):
    """The harness program exited badly or broke the harness contract."""


class SandboxError(RolloutError):
    """The runtime box could not start, died, or refused an operation."""


class ProviderError(RolloutError):
    """The upstream model endpoint failed in a way the rollout cannot absorb."""


class InterceptionError(RolloutError):
    """The interception layer lost or could not serve the rollout's session."""


class PhaseTimeoutError(RolloutError):
    """A rollout phase ran past its deadline."""


class ToolError(RolloutError):
    """A task's tool server could not start (the rollout's setup fails), or one tool call
    raised, timed out or returned too much (recorded on that call, the rollout goes on)."""


class InfrastructureError(RolloutError):
    """An actor or node failed under the rollout; the farm retries it elsewhere."""


ROLLOUT_ERROR_TYPES: dict[str, type[RolloutError]] = {
    cls.__name__: cls
    for cls in (
        RolloutError,
        TaskError,
        JudgeError,
        HarnessError,
        SandboxError,
        ProviderError,
        InterceptionError,
        PhaseTimeoutError,
        ToolError,
        InfrastructureError,
    )
}
"""Error classes by name, so a recorded ``error_type`` string maps back to its class."""


def no_token_ids(model: str) -> str:
    """The one line a training stream stops with when ``model`` answers without token ids."""
    return (
        f"model {model!r} returned no token ids, so its samples cannot be trained on: serve it "
        "with vLLM (which returns them when asked) or pass tokens=False to stream() to evaluate"
    )


def optional_import(module: str, extra: str) -> object:
    """Import an optional dependency or raise :class:`MissingExtraError` naming the extra."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(extra, module) from exc
