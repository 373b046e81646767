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
from vfray.compat.v1._errors import EnvError, RolloutError, ToolsetError, TunnelError
from vfray.compat.v1._hooks import intercept, metric, reward, stop, tool
from vfray.compat.v1._judge import (
    Judge,
    JudgeConfig,
    JudgeResponse,
    Judges,
    JudgeView,
    ReferenceJudge,
    ReferenceJudgeConfig,
)
from vfray.compat.v1._score import (
    compare_stdout_results,
    extract_boxed_answer,
    parse_judge_choice,
    parse_pytest_outcomes,
    read_answer_file_or_last_reply,
    verify_boxed_math_answer,
)
from vfray.compat.v1._seated import Agents
from vfray.compat.v1._task import State, StateT, Task
from vfray.compat.v1._taskset import SelectConfig, TaskMatchConfig, Taskset
from vfray.compat.v1._trace import Trace, TraceTask
from vfray.compat.v1._types import (
    ID,
    AssistantMessage,
    ContentPart,
    ImageUrlContentPart,
    ImageUrlSource,
    Message,
    MessageContent,
    Messages,
    Request,
    Response,
    Reward,
    SystemMessage,
    TextContentPart,
    Tool,
    ToolCall,
    ToolMessage,
    Usage,
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
    "ID",
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
    "EnvError",
    "Episode",
    "Harness",
    "HarnessConfig",
    "HarnessError",
    "ImageUrlContentPart",
    "ImageUrlSource",
    "InterceptionError",
    "Judge",
    "JudgeConfig",
    "JudgeResponse",
    "JudgeView",
    "Judges",
    "Message",
    "MessageContent",
    "Messages",
    "ProgramResult",
    "ProviderError",
    "ReferenceJudge",
    "ReferenceJudgeConfig",
    "Request",
    "Response",
    "Reward",
    "RewardFunctionConfig",
    "RolloutError",
    "Runtime",
    "SandboxError",
    "SelectConfig",
    "SharedToolsetConfig",
    "SingleAgentEnv",
    "SingleAgentEnvConfig",
    "State",
    "StateT",
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
    "Tool",
    "ToolCall",
    "ToolMessage",
    "Toolset",
    "ToolsetConfig",
    "ToolsetError",
    "Trace",
    "TraceTask",
    "TunnelError",
    "Usage",
    "UserMessage",
    "WireTaskData",
    "adapt",
    "compare_stdout_results",
    "extract_boxed_answer",
    "install",
    "intercept",
    "metric",
    "parse_judge_choice",
    "parse_pytest_outcomes",
    "read_answer_file_or_last_reply",
    "reward",
    "stop",
    "tool",
    "verify_boxed_math_answer",
]


def __getattr__(name: str) -> object:
    # A public v1 name vfray does not implement: one line naming it (and what is served),
    # rather than "module 'vfray.compat.v1' has no attribute" from inside a taskset's code.
    from vfray.compat.v1._surface import V1_PUBLIC, missing_name

    if name in V1_PUBLIC:
        raise missing_name("verifiers.v1", name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
