"""verifiers v1 on vfray: the ``verifiers.v1`` surface that taskset packages use (task model,
configs, decorators, views, envs), the adapter that runs them as vfray tasksets, their loading by
id or path, v1 eval configs and flags, and v1's on-disk traces.

``vfray eval <v1 id or path>`` serves ``import verifiers.v1`` from this package; in Python call
:func:`install` before importing a v1 taskset (or import this module as ``vf`` directly), then
``vf.Farm(...).run(taskset)`` takes the v1 taskset as it is.
"""

from vfray.compat.v1._adapt import AdaptedTask, AdaptedTaskset, adapt
from vfray.compat.v1._alias import install
from vfray.compat.v1._data import (
    Artifact,
    DecoratedFunctionConfig,
    RewardFunctionConfig,
    TaskConfig,
    TaskData,
    TaskResources,
    TasksetConfig,
    TaskTimeout,
    WireTaskData,
)
from vfray.compat.v1._env import (
    AgentConfig,
    BestOfNEnv,
    BestOfNEnvConfig,
    Env,
    EnvConfig,
    Episode,
    Harness,
    HarnessConfig,
    SharedToolsetConfig,
    SingleAgentEnv,
    SingleAgentEnvConfig,
    Toolset,
    ToolsetConfig,
)
from vfray.compat.v1._hooks import intercept, metric, reward, stop, tool
from vfray.compat.v1._seated import Agents
from vfray.compat.v1._task import State, Task
from vfray.compat.v1._taskset import SelectConfig, TaskMatchConfig, Taskset
from vfray.compat.v1._trace import Trace, TraceTask
from vfray.compat.v1._types import (
    AssistantMessage,
    ContentPart,
    ImageUrlContentPart,
    ImageUrlSource,
    MessageContent,
    Messages,
    Request,
    Response,
    Reward,
    SystemMessage,
    TextContentPart,
    ToolMessage,
    UserMessage,
)
from vfray.errors import (
    HarnessError,
    InterceptionError,
    ProviderError,
    SandboxError,
    TaskError,
)
from vfray.runtimes.base import ProgramResult, Runtime

__all__ = [
    "AdaptedTask",
    "AdaptedTaskset",
    "AgentConfig",
    "Agents",
    "Artifact",
    "AssistantMessage",
    "BestOfNEnv",
    "BestOfNEnvConfig",
    "ContentPart",
    "DecoratedFunctionConfig",
    "Env",
    "EnvConfig",
    "Episode",
    "Harness",
    "HarnessConfig",
    "HarnessError",
    "ImageUrlContentPart",
    "ImageUrlSource",
    "InterceptionError",
    "MessageContent",
    "Messages",
    "ProgramResult",
    "ProviderError",
    "Request",
    "Response",
    "Reward",
    "RewardFunctionConfig",
    "Runtime",
    "SandboxError",
    "SelectConfig",
    "SharedToolsetConfig",
    "SingleAgentEnv",
    "SingleAgentEnvConfig",
    "State",
    "SystemMessage",
    "Task",
    "TaskConfig",
    "TaskData",
    "TaskError",
    "TaskMatchConfig",
    "TaskResources",
    "TaskTimeout",
    "Taskset",
    "TasksetConfig",
    "TextContentPart",
    "ToolMessage",
    "Toolset",
    "ToolsetConfig",
    "Trace",
    "TraceTask",
    "UserMessage",
    "WireTaskData",
    "adapt",
    "install",
    "intercept",
    "metric",
    "reward",
    "stop",
    "tool",
]


def __getattr__(name: str) -> object:
    # A public v1 name vfray does not implement: one line naming it (and what is served),
    # rather than "module 'vfray.compat.v1' has no attribute" from inside a taskset's code.
    from vfray.compat.v1._surface import V1_PUBLIC, missing_name

    if name in V1_PUBLIC:
        raise missing_name("verifiers.v1", name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
