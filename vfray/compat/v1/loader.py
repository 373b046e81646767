"""Loading a v1 taskset package as v1 does: by id (``my-taskset`` imports ``my_taskset``; hub
``owner/name@version`` ids strip to ``name``) or by path (a package folder or a ``.py`` file),
exporting exactly one ``Taskset`` subclass via ``__all__`` and optionally a default ``Env`` or
``Harness``; its config validated from ``--env.taskset.*``.

Internal: importable, but not the public API (:mod:`vfray`, :mod:`vfray.testing`,
:mod:`vfray.train`, :mod:`vfray.compat.v1`); names here may move."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import cloudpickle
from pydantic import ValidationError

from vfray.compat.v1._adapt import AdaptedTask, AdaptedTaskset
from vfray.compat.v1._alias import install
from vfray.compat.v1._env import Env
from vfray.compat.v1._kinds import kinds, real_module, taskset_config_type
from vfray.compat.v1._legacy import HARNESS, NO_CLASSIC, LegacyTaskset, is_legacy
from vfray.compat.v1._seated import runs_itself, seat_configs, to_agent
from vfray.compat.v1._user_sim import UserSimEnv
from vfray.compat.v1.config import PREFIX
from vfray.errors import ConfigError, TasksetError

LEGACY_HARNESS = HARNESS
"""The harness a classic verifiers env's run uses (its own rollout loop, :mod:`._legacy`)."""


@dataclass(frozen=True)
class V1Package:
    """What a v1 taskset package exports."""

    module: ModuleType
    taskset: type[Any]
    env: type[Any] | None
    harness: type[Any] | None


def is_v1(spec: str) -> bool:
    return spec.startswith(PREFIX)


def looks_like_v1_package(spec: str) -> bool:
    """Whether a bare taskset id or path names a v1 package (for ``vfray eval <id>``)."""
    if ":" in spec:
        return False
    path = Path(spec)
    if not (path.suffix == ".py" and path.is_file()) and not (path / "__init__.py").is_file():
        try:
            if importlib.util.find_spec(module_name(spec)) is None:
                return False  # no such module: vfray's own taskset lookup says "unknown"
        except (ImportError, ValueError):
            return False
    # The package exists: whatever stops its import (a verifiers module vfray does not serve,
    # a dependency not installed) is the cause to report, not "unknown taskset".
    return is_legacy(_import(spec)) or import_package(spec) is not None


def is_legacy_spec(spec: str) -> bool:
    """Whether ``spec`` (``v1:`` prefix optional) names a classic verifiers environment
    package (``load_environment``), run through the legacy bridge (:mod:`._legacy`) with
    the ``LEGACY_HARNESS``."""
    target = spec[len(PREFIX) :] if is_v1(spec) else spec
    return is_legacy(_import(target))


def module_name(spec: str) -> str:
    return spec.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()


def _import(spec: str) -> ModuleType:
    install()
    path = Path(spec)
    if path.suffix == ".py" and path.is_file():
        name = f"_vfray_v1_{path.stem}"
        found = importlib.util.spec_from_file_location(name, path)
        if found is None or found.loader is None:
            raise ConfigError(f"cannot import {spec}")
        module = importlib.util.module_from_spec(found)
        sys.modules[name] = module
        with _import_errors(spec, name):
            found.loader.exec_module(module)
    elif (path / "__init__.py").is_file():
        sys.path.insert(0, str(path.resolve().parent))
        with _import_errors(spec, path.resolve().name):
            module = importlib.import_module(path.resolve().name)
    else:
        name = module_name(spec)
        with _import_errors(spec, name):
            try:
                return importlib.import_module(name)
            except ModuleNotFoundError as exc:
                if exc.name != name or isinstance(exc, ConfigError):
                    raise
            raise ConfigError(
                f"v1 taskset {spec!r} not found (tried to import {name!r}): install "
                "the package, put it on PYTHONPATH, or give its folder's path"
            )
    # Imported from a path: workers may not see that path, so ship its code by value.
    cloudpickle.register_pickle_by_value(module)
    return module


@contextmanager
def _import_errors(spec: str, name: str) -> Iterator[None]:
    """What stops a found package's import, as one line naming that cause: a dependency not
    installed is not "taskset not found", and a verifiers module vfray does not serve says so
    itself."""
    try:
        yield
    except ConfigError:
        raise
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"v1 taskset {spec!r}: importing {name!r} failed: {exc} (the package is there; "
            "what it imports is not installed here)"
        ) from None
    except Exception as exc:
        # A classic env package on verifiers 0.4.0, which has no classic classes.
        classic = isinstance(exc, AttributeError) and "module 'verifiers'" in str(exc)
        raise ConfigError(
            f"v1 taskset {spec!r}: importing {name!r} failed: {type(exc).__name__}: {exc}"
            + NO_CLASSIC * classic
        ) from None


def import_package(spec: str) -> V1Package | None:
    """The package ``spec`` names, or None when it exports no v1 Taskset."""
    module = _import(spec)
    exported = [getattr(module, n, None) for n in getattr(module, "__all__", [])]
    classes = [c for c in exported if isinstance(c, type)]
    k = kinds()  # verifiers' own classes, when it is installed
    tasksets = [c for c in classes if issubclass(c, k.Taskset) and c is not k.Taskset]
    if not tasksets:
        return None
    if len(tasksets) > 1:
        names = ", ".join(c.__name__ for c in tasksets)
        raise ConfigError(
            f"v1 package {module.__name__!r} exports {len(tasksets)} Tasksets ({names}); export one"
        )
    bases = (k.Env, k.SingleAgentEnv, k.BestOfNEnv)
    envs = [c for c in classes if issubclass(c, k.Env) and c not in bases]
    harnesses = [c for c in classes if issubclass(c, k.Harness) and c is not k.Harness]
    return V1Package(
        module, tasksets[0], envs[0] if envs else None, harnesses[0] if harnesses else None
    )


def build_env(
    package: V1Package,
    env_id: str | None,
    env_args: dict[str, Any],
    taskset: dict[str, Any] | None = None,
) -> Env[Any] | None:
    """The env a run uses: ``--env.id`` (``best-of-n``), else the package's own, else none
    (single agent). Envs vfray cannot run yet are refused in one line. ``taskset`` is the
    run's taskset config (``id`` and ``--env.taskset.*``): verifiers' own ``Env`` loads its
    seed taskset from its config's ``taskset``, as vf-eval fills it from the positional id."""
    genuine = kinds().genuine
    if env_id in ("best-of-n", "best_of_n"):
        cls: type[Env[Any]] | None = kinds().BestOfNEnv
    elif env_id in ("user-sim", "user_sim"):
        real = real_module("verifiers.v1.envs.user_sim") if genuine else None
        cls = UserSimEnv if real is None else real.UserSimEnv
    elif env_id:
        raise ConfigError(
            f"v1 env {env_id!r} is not supported: vfray runs best-of-n, user-sim and a "
            "package's own env"
        )
    else:
        cls = package.env
    if cls is None:
        if env_args:
            raise ConfigError(f"v1 options not supported by vfray: {_env_keys(env_args)} (no env)")
        return None
    config_type = _env_config_type(cls)
    if genuine and taskset is not None and "taskset" in config_type.model_fields:
        env_args = {**env_args, "taskset": {**taskset, **(env_args.get("taskset") or {})}}
    try:
        config = config_type.model_validate(env_args)
    except ValidationError as exc:
        raise ConfigError(f"v1 env {cls.__name__}: {_first_error(exc, 'env')}") from None
    if config.model_extra:
        raise ConfigError(
            f"v1 options not supported by vfray: {_env_keys(config.model_extra)} "
            f"({cls.__name__}'s config has no such field)"
        )
    env = cls(config)
    if runs_itself(env):
        seats = seat_configs(env)
        if not seats:
            raise ConfigError(
                f"v1 env {cls.__name__} has its own run() but its config declares no agents "
                "(AgentConfig fields): vfray plays those as its seats"
            )
        for name, agent in seats.items():
            to_agent(name, agent)  # refuse what a seat cannot honour now, not mid-run
    return env


def _env_keys(args: dict[str, Any]) -> str:
    return ", ".join(f"env.{k}" for k in sorted(args))


def _env_config_type(cls: type[Env[Any]]) -> Any:
    from vfray.compat.v1._kinds import concrete_type, of

    base = of(cls).EnvConfig
    return concrete_type(cls, base) or base


def _first_error(exc: ValidationError, prefix: str) -> str:
    err = exc.errors()[0]
    where = ".".join([prefix, *(str(p) for p in err["loc"])])
    return f"--{where}: {err['msg']} (got {err.get('input')!r})"


def load(
    spec: str,
    config: dict[str, Any] | None = None,
    select: dict[str, Any] | None = None,
    env_id: str | None = None,
    env_args: dict[str, Any] | None = None,
    harness_chosen: bool = False,
) -> AdaptedTaskset | LegacyTaskset:
    """The vfray taskset running v1 taskset ``spec`` (``v1:`` prefix optional) with its config
    (``--env.taskset.*``), selection (``--select.*``) and env."""
    target = spec[len(PREFIX) :] if is_v1(spec) else spec
    module = _import(target)
    if is_legacy(module):
        return _load_legacy(module, target, config, select, env_id, env_args, harness_chosen)
    package = import_package(target)
    if package is None:
        raise ConfigError(f"{target!r} exports no v1 Taskset subclass via __all__")
    if package.harness is not None and not harness_chosen:
        raise ConfigError(
            f"v1 package {target!r} exports its own Harness ({package.harness.__name__}) as its "
            "default; vfray does not run v1 harness classes: choose one with "
            "--env.agent.harness.id (bash, null, mini_swe_agent, claude_code, codex)"
        )
    config_type = taskset_config_type(package.taskset)
    try:
        v1_config = config_type.model_validate({"id": target, **(config or {})})
    except ValidationError as exc:
        raise ConfigError(f"v1 taskset {target!r}: {_first_error(exc, 'env.taskset')}") from None
    taskset = package.taskset(v1_config)
    shared = list(package.taskset.toolsets(v1_config))  # served once for the run
    if select:
        taskset = taskset.select(kinds().SelectConfig.model_validate(select))
    env = build_env(package, env_id, dict(env_args or {}), {"id": target, **(config or {})})
    return HubGuarded(taskset, env, name=module_name(target), shared=shared)


def _load_legacy(
    module: ModuleType,
    target: str,
    config: dict[str, Any] | None,
    select: dict[str, Any] | None,
    env_id: str | None,
    env_args: dict[str, Any] | None,
    harness_chosen: bool = False,
) -> LegacyTaskset:
    """A classic env's taskset: ``--env.taskset.*`` are its ``load_environment`` arguments."""
    refused = [f"--select.{k}" for k in sorted(select or {})]
    # Its rollout loop is its own (the legacy harness plays it): no v1 harness can.
    refused += ["--env.agent.harness.id"] if harness_chosen else []
    refused += [f"--env.id={env_id}"] if env_id else []
    refused += [f"--env.{k}" for k in sorted(env_args or {})]
    if refused:
        raise ConfigError(
            f"classic env {target!r}: not supported by vfray's legacy bridge: {', '.join(refused)}"
        )
    return LegacyTaskset(module, dict(config or {}), module_name(target))


class HubGuarded(AdaptedTaskset):
    """Turns a dataset that cannot be fetched (no hub here, not cached) into one line, both
    where the run reads its tasks and where the CLI's checks read the first one
    (``task_type``), with the hub client's retry chatter kept off the terminal meanwhile."""

    def load(self) -> Iterator[AdaptedTask]:
        tasks = super().load()
        while True:
            try:
                with _hub_quiet():
                    task = next(tasks)
            except StopIteration:
                return
            except Exception as exc:
                raise self._hub_refusal(exc) from None
            yield task

    @property
    def task_type(self) -> type[Any]:
        try:
            with _hub_quiet():
                return super().task_type
        except Exception as exc:
            raise self._hub_refusal(exc) from None

    def _hub_refusal(self, exc: Exception) -> Exception:
        line = hub_error(exc)
        if line is None:
            return exc
        return TasksetError(f"v1 taskset {self.name!r}: {line}")


@contextmanager
def _hub_quiet() -> Iterator[None]:
    """``huggingface_hub`` logs each of its retries (about 17 lines before an offline fetch
    fails): only errors get through while a dataset is read; the failure itself is our line."""
    loggers = [logging.getLogger(name) for name in _HUB_MODULES]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def hub_error(exc: BaseException) -> str | None:
    """One line for a Hugging Face dataset that could not be loaded from the hub, else None."""
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and len(chain) < 10:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    hub = [e for e in chain if _from_hub_code(e)]
    if not hub:
        return None
    first = str(hub[0]).strip().splitlines()[0] if str(hub[0]).strip() else type(hub[0]).__name__
    return (
        f"a Hugging Face dataset could not be loaded ({type(hub[0]).__name__}: {first[:300]}); "
        "the hub is not reachable from here: give a local path, or a dataset already in the "
        "local cache (HF_DATASETS_OFFLINE=1 reads the cache only)"
    )


def load_from_args(spec: str, args: dict[str, Any]) -> AdaptedTaskset | LegacyTaskset:
    """:func:`load` from vfray's ``taskset_args`` (``config``, ``select``, ``env``)."""
    unknown = set(args) - {"config", "select", "env", "harness"}
    if unknown:
        raise ConfigError(
            f"v1 taskset {spec!r}: taskset_args takes config, select, env, harness; "
            f"got {sorted(unknown)}"
        )
    env = dict(args.get("env") or {})
    env_id = env.pop("id", None)
    chosen = bool(args.get("harness"))
    return load(spec, args.get("config"), args.get("select"), env_id, env, chosen)


_HUB_MODULES = ("datasets", "huggingface_hub")


def _from_hub_code(exc: BaseException) -> bool:
    """Raised by ``datasets`` / ``huggingface_hub`` (their errors are often builtin types, so
    the class alone does not tell): its class lives there, or its raising frame does."""
    if type(exc).__module__.split(".")[0] in _HUB_MODULES:
        return True
    if not isinstance(exc, OSError):  # ConnectionError, FileNotFoundError: a fetch that failed
        return False
    tb = exc.__traceback__
    last = None
    while tb is not None:
        last = tb.tb_frame
        tb = tb.tb_next
    name = str(last.f_globals.get("__name__", "")) if last is not None else ""
    return name.split(".")[0] in _HUB_MODULES
