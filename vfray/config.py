"""The one config tree shared by the ``vfray`` command, TOML files and the Python API.

``EvalConfig`` reads, in increasing precedence: defaults, ``VFRAY_*`` environment variables
(nested with ``__``: ``VFRAY_ENV__HARNESS__ID=null``), a TOML file, then dotted overrides such as
``env.harness.id=bash`` (which the command line produces from ``--env.harness.id bash``).

Internal: importable, but not the public API (:mod:`vfray`, :mod:`vfray.testing`,
:mod:`vfray.train`, :mod:`vfray.compat.v1`); names here may move.
"""

from __future__ import annotations

import difflib
import json
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from vfray.endpoints.retry import RetryPolicy
from vfray.episode import AdvantageEstimator
from vfray.errors import ConfigError
from vfray.interception.limits import Limits
from vfray.interception.settings import InterceptionSettings
from vfray.rollout import Timeouts
from vfray.runtimes.tunnels import TunnelSettings


class ModelConfig(BaseModel):
    """The model endpoint: a built-in ``scripted:<policy>``, or a name served at ``base_url``."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        "scripted:arithmetic", description="model name, scripted:<policy>, or local:smollm2"
    )
    base_url: str | None = Field(None, description="OpenAI-compatible endpoint, e.g. vLLM's /v1")
    api_key_var: str | None = Field(None, description="environment variable holding the API key")


class SamplingConfig(BaseModel):
    """Sampling parameters imposed on every forwarded request; extra keys pass through."""

    model_config = ConfigDict(extra="allow")

    temperature: float | None = Field(None, description="sampling temperature")
    top_p: float | None = Field(None, description="nucleus sampling")
    max_tokens: int | None = Field(None, description="completion tokens per call")
    seed: int | None = Field(None, description="sampling seed, when the endpoint honours it")
    return_tokens: bool | Literal["required"] | None = Field(
        None,
        description="ask the endpoint for token ids and logprobs, in each wire dialect's way "
        "(vLLM: logprobs + return_token_ids); 'required' (Farm.stream's): a call answered "
        "without them stops its rollout with a ConfigError",
    )

    def as_params(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class HarnessSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field("bash", description="harness id: null, bash, ...")
    options: dict[str, Any] = Field(default_factory=dict, description="harness config fields")


class RuntimeSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: str = Field(
        "subprocess", description="runtime: subprocess (no isolation), bwrap, docker, modal"
    )
    options: dict[str, Any] = Field(default_factory=dict, description="runtime options")


class EnvConfig(BaseModel):
    """How each rollout runs: harness, runtime, limits, phase deadlines, scoring overrides."""

    model_config = ConfigDict(extra="forbid")

    harness: HarnessSettings = Field(default_factory=HarnessSettings)
    runtime: RuntimeSettings = Field(default_factory=RuntimeSettings)
    max_turns: int | None = Field(None, description="model calls per rollout")
    max_input_tokens: int | None = Field(None, description="prompt tokens of one call")
    max_output_tokens: int | None = Field(None, description="completion tokens per rollout")
    max_total_tokens: int | None = Field(None, description="all tokens per rollout")
    max_user_turns: int | None = Field(
        None, description="user messages per rollout (a task's user or next_message)"
    )
    timeouts: Timeouts = Field(default_factory=Timeouts)
    scoring: dict[str, str] = Field(
        default_factory=dict, description="hook name -> 'pkg.mod:fn' or 'file.py:fn'"
    )
    count_failed: bool = Field(
        False,
        description="rollouts that failed for infrastructure reasons (box, endpoint, agent "
        "crash) count in group rewards, means and advantages",
    )
    advantage: AdvantageEstimator = Field(
        "mean",
        description="how a group's rewards become advantages: mean (r - mean), grpo "
        "((r - mean) / std), dr_grpo (r - mean, no std), rloo (leave-one-out baseline)",
    )
    on_prefix_break: Literal["drop", "per_turn"] = Field(
        "drop",
        description="a branch whose later prompt does not extend its earlier prompt + "
        "completion (re-tokenised history; interception.token_in prevents it): drop (kept "
        "as a row with token_error, left out of batches) or per_turn (one sample per call, "
        "SkyRL's step-wise samples); never repaired",
    )

    def limits(self) -> Limits:
        return Limits(
            max_turns=self.max_turns,
            max_input_tokens=self.max_input_tokens,
            max_output_tokens=self.max_output_tokens,
            max_total_tokens=self.max_total_tokens,
            max_user_turns=self.max_user_turns,
        )


class FarmConfig(BaseModel):
    """How the farm runs: retries and row flushing, and on the Ray backend the layout of its
    SandboxHosts and interception on the nodes (the local backend is one host in-process)."""

    model_config = ConfigDict(extra="forbid")

    interception: Literal["host", "serve"] = Field(
        "host",
        description="where the interception runs: host (inside each SandboxHost) or serve (a "
        "Ray Serve deployment, one replica per node)",
    )
    interception_replicas_per_node: int = Field(
        1,
        ge=1,
        description="with interception = serve: replicas on each node (one serves ~9,000 "
        "chat turns/s with a core to itself, so one suffices unless a node's rollouts make "
        "more than about half that; a node's SandboxHosts are spread over them, each host's "
        "sessions on one)",
    )
    hosts: int | None = Field(
        None, ge=1, description="SandboxHosts in all (default: per node, see hosts_per_node)"
    )
    hosts_per_node: int | None = Field(
        None, ge=1, description="SandboxHosts on each node (default: from its CPUs)"
    )
    cpus_per_host: float = Field(
        4.0,
        gt=0,
        description="by default one SandboxHost per this many CPUs of a node, at least one "
        "(16 cores: 1 host 50.8 rollouts/s, 4 hosts 115.7)",
    )
    host_concurrency: int = Field(4096, ge=1, description="rollouts one SandboxHost runs at once")
    launch_concurrency: int | None = Field(
        None,
        ge=0,
        description="harness programs starting at once per host (default 8 x its CPUs; 0: "
        "unthrottled); for runtimes that launch programs here (subprocess, bwrap)",
    )
    max_retries: int = Field(
        2, ge=0, description="retries of a rollout whose host or interception failed"
    )
    flush_rows: int = Field(1000, ge=1, description="trace rows buffered per Parquet part")
    flush_seconds: float = Field(5.0, gt=0, description="seconds before buffered rows are written")
    tunnel: TunnelSettings = Field(default_factory=TunnelSettings)
    event_loop: Literal["uvloop", "asyncio"] = Field(
        "uvloop",
        description="the event loop of the run's own process (the driver; on the local "
        "backend also every rollout): uvloop, as Ray's async actors run (11-14% less of vfray's "
        "CPU per agent rollout than asyncio's), or asyncio; asyncio's where uvloop is not "
        "installed",
    )


class EvalConfig(BaseSettings):
    """A whole evaluation run."""

    model_config = SettingsConfigDict(
        env_prefix="VFRAY_", env_nested_delimiter="__", extra="forbid", validate_default=True
    )

    taskset: str = Field("arithmetic", description="built-in id, module:Class or file.py:Class")
    taskset_args: dict[str, Any] = Field(default_factory=dict, description="taskset constructor")
    num_tasks: int | None = Field(None, ge=1, description="use only the first N tasks")
    rollouts_per_task: int = Field(1, ge=1, description="rollouts per task (group size)")
    max_concurrent: int = Field(32, ge=1, description="rollouts in flight at once")
    shuffle: bool = Field(False, description="shuffle tasks (seeded) before taking -n")
    seed: int = Field(0, description="shuffle seed")
    model: ModelConfig = Field(default_factory=ModelConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    output_dir: str = Field("outputs", description="parent folder of run folders")
    address: str | None = Field(None, description="Ray cluster address (default: local)")
    backend: Literal["ray", "local"] = Field(
        "ray", description="ray (a cluster, or a local Ray) or local (this process, no Ray)"
    )
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    interception: InterceptionSettings = Field(default_factory=InterceptionSettings)
    farm: FarmConfig = Field(default_factory=FarmConfig)

    def runtime_options(self) -> dict[str, Any]:
        """The runtime's options, with ``farm.launch_concurrency`` when it is set."""
        options = dict(self.env.runtime.options)
        if self.farm.launch_concurrency is not None:
            from vfray.runtimes.registry import options_type, runtime_class

            # Only runtimes that launch programs on this node (subprocess, bwrap) take it.
            fields = options_type(runtime_class(self.env.runtime.type)).model_fields
            if "launch_concurrency" in fields:
                options.setdefault("launch_concurrency", self.farm.launch_concurrency)
        return options

    @model_validator(mode="after")
    def _address_needs_ray(self) -> EvalConfig:
        if self.backend == "local" and self.address:
            raise ValueError(
                f"address {self.address!r} names a Ray cluster; backend 'local' runs without "
                "Ray (drop one of them)"
            )
        return self


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = [p.replace("-", "_") for p in dotted.split(".")]
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"cannot set {dotted!r}: {part!r} is not a section")
        node = child
    node[parts[-1]] = value


def _deep_merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_config(
    toml_path: str | Path | None = None, overrides: Mapping[str, Any] | None = None
) -> EvalConfig:
    """Build an :class:`EvalConfig` from env vars, an optional TOML file and dotted overrides."""
    data: dict[str, Any] = {}
    if toml_path is not None:
        path = Path(toml_path)
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise ConfigError(f"config file not found: {path}") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason}); TOML files are UTF-8"
            ) from exc
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: invalid TOML: {exc}") from exc
    for dotted, value in (overrides or {}).items():
        _set_dotted(data, dotted, value)
    try:
        # Environment variables sit under the file and the flags: init kwargs win in
        # pydantic-settings, so merge env-derived values first.
        env_values = EvalConfig().model_dump(exclude_unset=True)
        return EvalConfig(**_deep_merge(env_values, data))
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from exc


def format_validation_error(exc: ValidationError) -> str:
    """One line per problem: the dotted field, what is wrong, the value given, and for an
    unknown key the closest real names (a typo is the usual cause)."""
    lines = ["invalid configuration:"]
    leaves = [dotted for dotted, _, _ in iter_fields(EvalConfig)]
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(root)"
        line = f"  {where}: {err['msg']}"
        if err["type"] == "extra_forbidden":
            near = difflib.get_close_matches(where, leaves, n=3)
            line += f" (unknown key; did you mean {', '.join(near)}?)" if near else " (unknown key)"
        elif not isinstance(err.get("input"), dict | list):
            line += f" (got {err.get('input')!r})"
        lines.append(line)
    return "\n".join(lines)


def iter_fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, Any, str]]:
    """Yield (dotted name, annotation, description) for every leaf field of the tree."""
    for name, field in model.model_fields.items():
        dotted = f"{prefix}{name}"
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from iter_fields(annotation, dotted + ".")
        else:
            yield dotted, annotation, field.description or ""


def parse_literal(raw: str) -> Any:
    """A value under an open section (no declared type), from a command line or a v1 config:
    JSON literals (numbers, true, null, lists, objects) as such, anything else as a string."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw
