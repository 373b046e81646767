"""What of verifiers v1's import surface vfray's layer serves: the submodules v1 taskset code
imports from (each with the names vfray implements), and v1 0.4.0's public names; anything else
under ``verifiers`` fails in one line naming it, instead of a bare ``AttributeError`` or
``ModuleNotFoundError`` from deep inside a taskset's import."""

from __future__ import annotations

import sys

import vfray.compat.v1._errors as _errors
from vfray.errors import ConfigError


class NotServedError(ConfigError, ImportError):
    """A public v1 name vfray's layer does not implement. An ``ImportError`` so that
    ``from verifiers.v1 import X`` shows this line (Python replaces an ``AttributeError`` there
    with its own ``cannot import name``); a ``ConfigError`` as vfray refuses anything else."""


class NotServedModuleError(ConfigError, ModuleNotFoundError):
    """A ``verifiers`` module vfray's layer does not serve (what ``import`` raises for it)."""


V1_PUBLIC: tuple[str, ...] = (
    "ACPConfig",
    "ACPHarness",
    "ACPInfo",
    "ACPTurn",
    "ACP_SEMANTIC_EDGES_METADATA_KEY",
    "ARTIFACTS_DIR",
    "Agent",
    "AgentConfig",
    "AgentInfo",
    "AgentSpan",
    "Agents",
    "ApptainerConfig",
    "Artifact",
    "AssistantMessage",
    "BaseClientConfig",
    "BaseConfig",
    "Branch",
    "Client",
    "ClientConfig",
    "ContentPart",
    "Criterion",
    "DecisionJudge",
    "DecisionJudgeConfig",
    "DecoratedFunctionConfig",
    "DockerConfig",
    "ElasticPoolConfig",
    "Env",
    "EnvConfig",
    "EnvError",
    "EnvInfo",
    "Episode",
    "Error",
    "EvalClientConfig",
    "EvalRunInfo",
    "EvalWorkInfo",
    "GroupInfo",
    "Harness",
    "HarnessConfig",
    "HarnessError",
    "HarnessSession",
    "ID",
    "ImageUrlContentPart",
    "ImageUrlSource",
    "Interaction",
    "InterceptRecord",
    "InterceptionError",
    "Judge",
    "JudgeConfig",
    "JudgeResponse",
    "JudgeView",
    "Judges",
    "Message",
    "MessageContent",
    "MessageNode",
    "Messages",
    "ModelCall",
    "ModelContext",
    "PATCH_CAP_BYTES",
    "ParentLink",
    "PodmanConfig",
    "PolicyEvent",
    "PolicySpan",
    "PrimeConfig",
    "ProgramResult",
    "ProviderError",
    "ReferenceJudge",
    "ReferenceJudgeConfig",
    "Request",
    "Response",
    "RetryConfig",
    "RetryRule",
    "Reward",
    "RewardFunctionConfig",
    "RolloutError",
    "RubricJudge",
    "RubricJudgeConfig",
    "RunInfo",
    "Runtime",
    "RuntimeConfig",
    "RuntimeInfo",
    "RuntimeProcess",
    "Sampling",
    "SamplingConfig",
    "SamplingMask",
    "SandboxError",
    "Segment",
    "SelectCLIConfig",
    "SelectConfig",
    "SemanticEdge",
    "SemanticEdgeSet",
    "ServeConfig",
    "SharedEnvConfig",
    "SharedTasksetConfig",
    "SharedToolsetConfig",
    "SingleAgentEnv",
    "SingleAgentEnvConfig",
    "State",
    "StateT",
    "StaticPoolConfig",
    "SubprocessConfig",
    "SystemMessage",
    "TRACE_VERSION",
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
    "TimeSpan",
    "TimeSplit",
    "Timing",
    "Tool",
    "ToolCall",
    "ToolMessage",
    "Toolset",
    "ToolsetConfig",
    "ToolsetError",
    "Trace",
    "TraceTask",
    "TrainClientConfig",
    "TrainRunInfo",
    "TrainWorkInfo",
    "TunnelError",
    "TurnTokens",
    "Usage",
    "UserMessage",
    "VersionInfo",
    "WireEpisode",
    "WireTaskData",
    "WireTrace",
    "WorkInfo",
    "capture_patch",
    "collect",
    "compare_stdout_results",
    "default_agent_harness",
    "default_harness_id",
    "env_config_type",
    "environment_class",
    "extract_boxed_answer",
    "harness_config_type",
    "import_environment",
    "import_harness",
    "import_judge",
    "import_taskset",
    "intercept",
    "judge_config_type",
    "load_environment",
    "load_harness",
    "load_judge",
    "load_taskset",
    "make_agent",
    "merge_defaults",
    "metric",
    "narrowed_env_annotation",
    "parse_judge_choice",
    "parse_pytest_outcomes",
    "pool_serve_kwargs",
    "read_answer_file_or_last_reply",
    "resolve_client",
    "resolve_env_config",
    "resolve_env_field",
    "resolve_head",
    "restore",
    "reward",
    "stop",
    "task_type",
    "taskset_config_type",
    "tool",
    "verify_boxed_math_answer",
)
"""``verifiers.v1.__all__`` of verifiers 0.4.0 (tests/test_v1_import_surface.py checks it against
the real package where it can be installed)."""

SUBMODULES: dict[str, tuple[str, ...]] = {
    "verifiers.v1.configs.agent": ("AgentConfig",),
    "verifiers.v1.configs.env": ("EnvConfig",),
    "verifiers.v1.configs.harness": ("HarnessConfig",),
    "verifiers.v1.configs.judge": ("JudgeConfig", "Judges"),
    "verifiers.v1.configs.select": ("SelectConfig", "TaskMatchConfig"),
    "verifiers.v1.configs.task": ("DecoratedFunctionConfig", "RewardFunctionConfig", "TaskConfig"),
    "verifiers.v1.configs.taskset": ("TasksetConfig",),
    "verifiers.v1.env": ("Env",),
    "verifiers.v1.envs.best_of_n": ("BestOfNEnv", "BestOfNEnvConfig"),
    "verifiers.v1.envs.single_agent": ("SingleAgentEnv", "SingleAgentEnvConfig"),
    "verifiers.v1.envs.user_sim": ("UserSimEnv", "UserSimEnvConfig"),
    "verifiers.v1.episode": ("Episode",),
    "verifiers.v1.errors": tuple(_errors.__all__),
    "verifiers.v1.harness": ("Harness",),
    "verifiers.v1.judge": ("Judge", "JudgeResponse", "JudgeView"),
    "verifiers.v1.judges": ("ReferenceJudge", "ReferenceJudgeConfig"),
    "verifiers.v1.mcp": ("SharedToolsetConfig", "Toolset", "ToolsetConfig"),
    "verifiers.v1.runtimes": ("ProgramResult", "Runtime"),
    "verifiers.v1.state": ("State", "StateT"),
    "verifiers.v1.task": (
        "DataT",
        "Task",
        "TaskData",
        "TaskResources",
        "TaskTimeout",
        "WireTaskData",
    ),
    "verifiers.v1.taskset": ("Taskset",),
    "verifiers.v1.tasksets.textarena": (
        "TextArenaConfig",
        "TextArenaData",
        "TextArenaEnv",
        "TextArenaEnvConfig",
        "TextArenaTask",
        "TextArenaTaskset",
    ),
    "verifiers.v1.trace": ("Reward", "Trace", "TraceTask"),
    "verifiers.v1.types": (
        "AssistantMessage",
        "ContentPart",
        "ID",
        "ImageUrlContentPart",
        "ImageUrlSource",
        "Message",
        "MessageContent",
        "Messages",
        "Request",
        "Response",
        "SystemMessage",
        "TextContentPart",
        "Tool",
        "ToolCall",
        "ToolMessage",
        "Usage",
        "UserMessage",
    ),
    "verifiers.v1.utils.artifacts": ("Artifact",),
    "verifiers.v1.utils.decorators": ("intercept", "metric", "reward", "stop", "tool"),
    "verifiers.v1.utils.image": ("image_data_url",),
    "verifiers.v1.utils.score": (
        "compare_stdout_results",
        "extract_boxed_answer",
        "parse_judge_choice",
        "parse_pytest_outcomes",
        "read_answer_file_or_last_reply",
        "verify_boxed_math_answer",
    ),
}
"""The v1 submodules served, each with the names vfray serves from it (all also on
``verifiers.v1`` itself but the envs', as in v1); their parent packages are served empty."""

PACKAGES = (
    "verifiers.v1.configs",
    "verifiers.v1.envs",
    "verifiers.v1.tasksets",
    "verifiers.v1.utils",
)
"""Parents of served submodules, served as empty packages."""


def missing_name(module: str, name: str) -> NotServedError:
    """The one-line error for a name of v1's that vfray's layer does not serve."""
    if module == "verifiers":
        return NotServedError(
            f"verifiers.{name} is not served by vfray's verifiers v1 layer, which serves only "
            "verifiers.v1 (not the v0 API of `import verifiers as vf`)",
            name=module,
        )
    return NotServedError(
        f"{module}.{name} is not served by vfray's verifiers v1 layer (it serves "
        f"{served_names(module)} there); run code that needs {name} under verifiers itself",
        name=module,
    )


def missing_module(module: str) -> NotServedModuleError:
    """The one-line error for a ``verifiers`` module vfray's layer does not serve."""
    return NotServedModuleError(
        f"{module} is not served by vfray's verifiers v1 layer: it serves `verifiers.v1` "
        f"and {', '.join(sorted(SUBMODULES))}; run code that needs {module} under verifiers "
        "itself",
        name=module,
    )


def served_names(module: str) -> str:
    # The layer is this module's own package, loaded before any of its modules: looked up,
    # not imported, so the package and its parts do not import each other.
    layer = sys.modules[__package__ or ""]
    if module == "verifiers.v1":
        names = [n for n in V1_PUBLIC if n in layer.__all__]
    elif module in PACKAGES:  # a package served for its submodules
        names = sorted(m.rpartition(".")[2] for m in SUBMODULES if m.startswith(f"{module}."))
    else:
        names = list(SUBMODULES.get(module, ()))
    return ", ".join(names) if names else "nothing"
