"""The run spec: the config tree resolved once into a frozen record — the model endpoint, the
harness and runtime with typed options, the rollout plan, the scoring overrides and every
concurrency knob — after every check that needs no machine (for the CLI and the Python API
alike). Backends, the driver and the hosts read it; none of them re-derives or re-checks it.
"""

from __future__ import annotations

import difflib
import os
import urllib.parse
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from vfray.config import EvalConfig, format_validation_error
from vfray.endpoints.retry import RetryPolicy
from vfray.errors import ConfigError
from vfray.harnesses.base import Harness, HarnessConfig, check_compatibility
from vfray.harnesses.registry import harness_class, resumable_harnesses
from vfray.harnesses.users import declared_user
from vfray.models.local import check_installed, parse_local_model
from vfray.rollout import RolloutPlan
from vfray.runtimes.images import parse_image
from vfray.runtimes.network_policy import check_task_network
from vfray.runtimes.registry import (
    RuntimeOptions,
    image_runtimes,
    preflight_runtime,
    runtime_class,
)
from vfray.runtimes.registry import runtime_options as typed_runtime_options
from vfray.scoring import validate_group_config
from vfray.task import Task

SCRIPTED_PREFIX = "scripted:"


def parse_scripted_model(model: str) -> tuple[str, dict[str, float]] | None:
    """``scripted:arithmetic?latency=1`` → ("arithmetic", {"latency": 1.0}); None otherwise."""
    if not model.startswith(SCRIPTED_PREFIX):
        return None
    policy, _, query = model[len(SCRIPTED_PREFIX) :].partition("?")
    options: dict[str, float] = {}
    for name, value in urllib.parse.parse_qsl(query, strict_parsing=False):
        try:
            options[name] = float(value)
        except ValueError as exc:
            raise ConfigError(f"scripted model option {name}={value!r} is not a number") from exc
    return policy, options


class Endpoint(BaseModel):
    """The model endpoint: the built-in scripted model, a ``local:`` model server, or a remote
    OpenAI-compatible ``base_url``. The key itself is not held: it is read where the
    interception runs (:meth:`api_key`), so it never travels."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["scripted", "local", "remote"]
    model: str
    base_url: str | None = None
    api_key_var: str | None = None
    scripted_policy: str | None = None
    scripted_options: dict[str, float] = {}

    def api_key(self) -> str | None:
        """The key from ``api_key_var`` in this process's environment (None when no variable
        is named); an unset variable is a :class:`ConfigError` on every backend."""
        if not self.api_key_var:
            return None
        key = os.environ.get(self.api_key_var)
        if key is None:
            raise ConfigError(f"environment variable {self.api_key_var} (the API key) is not set")
        return key


class Concurrency(BaseModel):
    """How much runs at once and how rows are flushed."""

    model_config = ConfigDict(frozen=True)

    max_concurrent: int = 32
    """Rollouts in flight at once (the config's ``max_concurrent``)."""
    max_retries: int = 2
    """Immediate retries of a rollout whose machinery failed."""
    hosts: int | None = None
    """SandboxHost actors (Ray; default one per alive node)."""
    host_concurrency: int = 4096
    """Rollouts one SandboxHost may run at once (Ray)."""
    num_cpus: int | None = None
    """CPUs of a local Ray this farm starts."""
    flush_rows: int = 1000
    flush_seconds: float = 5.0


class RunSpec(BaseModel):
    """One run's resolved configuration; build it with :func:`resolve_run`."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    config: EvalConfig
    """The validated config tree it was resolved from (saved as the run's ``config.json``)."""
    endpoint: Endpoint
    harness_config: HarnessConfig
    """The harness's options, validated into its own ``config_type``."""
    runtime_options: RuntimeOptions
    """The runtime's options, typed from its constructor."""
    plan: RolloutPlan
    """Model, harness, runtime, sampling, limits, deadlines and scoring overrides."""
    concurrency: Concurrency
    retry: RetryPolicy
    backend: Literal["ray", "local"]
    address: str | None = None

    @property
    def scoring_overrides(self) -> dict[str, str]:
        return self.plan.scoring_overrides

    def make_harness(self) -> Harness:
        return harness_class(self.plan.harness_id)(self.harness_config)

    def check_task_type(self, task_cls: type, rollouts_per_task: int) -> None:
        """Refuse a task class whose group rewards (overrides included) need more rollouts,
        whose user is malformed, whose user needs a harness that can resume, or whose tools
        need a harness that speaks MCP."""
        validate_group_config(task_cls, rollouts_per_task, self.scoring_overrides)
        # A declared user, or next_message overridden: the task continues after segment 1.
        has_user = declared_user(task_cls) is not None or (
            getattr(task_cls, "next_message", Task.next_message) is not Task.next_message
        )
        # A task with tools and a harness that cannot speak MCP: refused before anything runs.
        has_tools = getattr(task_cls, "toolsets", Task.toolsets) is not Task.toolsets
        if has_user or has_tools:
            harness = harness_class(self.plan.harness_id)
            check_compatibility(
                harness,
                runtime_class(self.plan.runtime_type),
                has_user=has_user,
                taskset_has_tools=has_tools,
                resumable=resumable_harnesses() if has_user and not harness.SUPPORTS_RESUME else (),
            )

    def check_task(self, task: Task[Any]) -> None:
        """Refuse one task whose image is malformed, or that names an image this run's runtime
        cannot box it in (naming the runtimes that can), or whose image's archive, layout or
        Dockerfile is not on this machine (a run on a cluster names paths every node shares),
        or (where the runtime enforces a network policy) whose ``network_allow`` names a host
        that does not resolve, before any of its rollouts runs."""
        if runtime_class(self.plan.runtime_type).isolates_network:
            data = task.data
            where = f"task {task.key[:16]}"
            check_task_network(data.network_allow, data.network_block, where)
        image = task.data.image
        if image is None:
            return
        try:
            ref = parse_image(image)
        except ConfigError as exc:
            raise ConfigError(f"task {task.key[:16]}: {exc}") from None
        runtime = runtime_class(self.plan.runtime_type)
        check_compatibility(
            harness_class(self.plan.harness_id),
            runtime,
            needs_image=True,
            image_runtimes=image_runtimes(),
        )
        why = runtime.image_refusal(ref) or ref.missing()
        if why is not None:
            raise ConfigError(f"task {task.key[:16]}: {why}")

    def preflight(self, *, boxes_here: bool = True) -> None:
        """At start: refuse a runtime that cannot start boxes on this machine (``boxes_here``
        False only warns), a harness that cannot install its agent here (no npm, node or uv:
        :meth:`Harness.preflight`) and a ``local:`` model whose extra is missing."""
        local = parse_local_model(self.endpoint.model)
        if local is not None:
            check_installed(local.spec)
        if boxes_here:
            self.make_harness().preflight(self.plan.runtime_type)
        preflight_runtime(
            harness_class(self.plan.harness_id),
            self.plan.runtime_type,
            self.runtime_options.as_kwargs(),
            boxes_here=boxes_here,
        )


def resolve_endpoint(config: EvalConfig) -> Endpoint:
    m = config.model
    scripted = parse_scripted_model(m.name)
    if scripted is not None:
        _check_policy(scripted[0])
        endpoint = Endpoint(
            kind="scripted",
            model=m.name,
            api_key_var=m.api_key_var,
            scripted_policy=scripted[0],
            scripted_options=scripted[1],
        )
    elif parse_local_model(m.name) is not None:
        endpoint = Endpoint(kind="local", model=m.name, api_key_var=m.api_key_var)
    elif m.base_url:
        endpoint = Endpoint(
            kind="remote", model=m.name, base_url=m.base_url, api_key_var=m.api_key_var
        )
    else:
        raise ConfigError(
            f"model {m.name!r} needs a base_url (an OpenAI-compatible endpoint such as "
            "vLLM's http://host:8000/v1), or use a built-in 'scripted:<policy>' or "
            "'local:smollm2' model"
        )
    endpoint.api_key()  # an unset key variable is refused here, for both backends
    return endpoint


def _check_policy(policy: str) -> None:
    """A misspelt ``scripted:<policy>`` is one line here, before Ray or a server starts."""
    from vfray.models.scripted.policies import POLICIES

    if policy not in POLICIES:
        close = difflib.get_close_matches(policy, POLICIES, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(
            f"unknown scripted policy {policy!r}{hint}; expected one of {', '.join(POLICIES)}"
        )


def resolve_run(config: EvalConfig, concurrency: dict[str, Any] | None = None) -> RunSpec:
    """Validate ``config`` (and the concurrency knobs not in it) once, into a :class:`RunSpec`:
    the endpoint and its key variable, the harness and runtime ids and options, and whether
    they can work together. Raises :class:`ConfigError` (one line) otherwise."""
    knobs = {k: v for k, v in (concurrency or {}).items() if v is not None}
    num_cpus = knobs.pop("num_cpus", None)
    dumped = config.model_dump()
    # The farm knobs live in the config tree (farm.*); the Python API's arguments override it.
    dumped["farm"] = {**dumped.get("farm", {}), **knobs}
    try:
        config = EvalConfig.model_validate(dumped)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from exc
    env = config.env
    farm = config.farm
    endpoint = resolve_endpoint(config)
    harness_cls = harness_class(env.harness.id)
    harness_config = harness_cls.parse_config(env.harness.options)
    if endpoint.api_key_var and endpoint.api_key_var in harness_config.forward_env:
        raise ConfigError(
            f"harness option forward_env names {endpoint.api_key_var}, the model's API key "
            "variable: the interception holds that key and boxes never see it"
        )
    runtime_cls = runtime_class(env.runtime.type)
    options = typed_runtime_options(env.runtime.type, config.runtime_options())
    # Refuse an impossible pairing (e.g. a container-only harness on subprocess) now, not as
    # one failed rollout after another.
    check_compatibility(harness_cls, runtime_cls)
    return RunSpec(
        config=config,
        endpoint=endpoint,
        harness_config=harness_config,
        runtime_options=options,
        plan=RolloutPlan(
            model=config.model.name,
            harness_id=env.harness.id,
            runtime_type=env.runtime.type,
            sampling=config.sampling.as_params(),
            limits=env.limits(),
            timeouts=env.timeouts,
            scoring_overrides=dict(env.scoring),
        ),
        concurrency=Concurrency(
            max_concurrent=config.max_concurrent,
            max_retries=farm.max_retries,
            hosts=farm.hosts,
            host_concurrency=farm.host_concurrency,
            num_cpus=num_cpus,
            flush_rows=farm.flush_rows,
            flush_seconds=farm.flush_seconds,
        ),
        retry=config.retry,
        backend=config.backend,
        address=config.address,
    )
