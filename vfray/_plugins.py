"""Load objects named by an import path, so config can plug in code without editing a package.

A spec is ``"pkg.mod:attr"`` (an importable module) or ``"path/to/file.py:attr"`` (a file,
loaded under a unique module name derived from its absolute path); dotted attributes such as
``"pkg.mod:Class.method"`` are followed. :class:`Registry` is the one lookup rule every plugin
family (harnesses, runtimes, tasksets) shares, and :func:`options_model` the one way their
options are typed from a constructor.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import importlib
import importlib.util
import inspect
import sys
import sysconfig
import traceback
import typing
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from vfray.errors import ConfigError


def parse_spec(spec: str) -> tuple[str, str]:
    """Split ``"module_or_file:attr"`` into its two parts, or raise :class:`ConfigError`."""
    if not isinstance(spec, str) or ":" not in spec:
        raise ConfigError(
            f"bad import spec {spec!r}: expected 'pkg.module:name' or 'path/to/file.py:name'"
        )
    # rsplit so a Windows drive letter ("C:\\x.py:fn") still parses.
    target, attr = spec.rsplit(":", 1)
    if not target or not attr or not all(part.isidentifier() for part in attr.split(".")):
        raise ConfigError(
            f"bad import spec {spec!r}: expected 'pkg.module:name' or 'path/to/file.py:name'"
        )
    return target, attr


def is_file_target(target: str) -> bool:
    return target.endswith(".py") or "/" in target or "\\" in target


def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple({paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths})


def failure_site(exc: BaseException) -> str:
    """``file:line`` where importing user code failed: the innermost frame outside Python's
    own library and installed packages (the user's line, not importlib's), or the line a
    SyntaxError points at."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}"
    frames = traceback.extract_tb(exc.__traceback__)
    libraries = _library_dirs()
    own = [
        f
        for f in frames
        if not f.filename.startswith("<")
        and not f.filename.startswith(libraries)
        and f.filename != __file__
    ]
    candidates = own or [f for f in frames if not f.filename.startswith("<")]
    return f"{candidates[-1].filename}:{candidates[-1].lineno}" if candidates else "?"


def _describe(exc: BaseException) -> str:
    if isinstance(exc, SyntaxError):
        return f"{type(exc).__name__}: {exc.msg}"
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def load_module(target: str, base_dir: str | Path | None = None) -> ModuleType:
    """Import a module by dotted name, or load a ``.py`` file (relative to ``base_dir``)."""
    if is_file_target(target):
        return _load_file(Path(target), base_dir)
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (target == exc.name or target.startswith(exc.name + ".")):
            raise ConfigError(f"cannot import module {target!r}: {exc}") from exc
        # The module exists; something it imports does not.
        raise ConfigError(
            f"importing module {target!r} failed at {failure_site(exc)}: {_describe(exc)}"
        ) from exc
    except Exception as exc:
        raise ConfigError(
            f"importing module {target!r} failed at {failure_site(exc)}: {_describe(exc)}"
        ) from exc


def _load_file(path: Path, base_dir: str | Path | None) -> ModuleType:
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    path = path.resolve()
    if not path.is_file():
        raise ConfigError(f"plugin file {str(path)!r} does not exist")
    # One stable name per file: loading the same file twice yields the same module, and two
    # files called scoring.py never clobber each other in sys.modules.
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    name = f"vfray_plugin_{path.stem}_{digest}"
    existing = sys.modules.get(name)
    if existing is not None:
        return existing
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise ConfigError(f"cannot load {str(path)!r} as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    # Registered before exec because dataclasses and pickling look the module up by name.
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise ConfigError(
            f"loading {str(path)!r} failed at {failure_site(exc)}: {_describe(exc)}"
        ) from exc
    return module


def load_object(spec: str, base_dir: str | Path | None = None) -> Any:
    """Return the object a spec names; every failure is a :class:`ConfigError` saying why."""
    target, attr = parse_spec(spec)
    obj: Any = load_module(target, base_dir)
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"{spec!r}: {target!r} has no attribute {attr!r}") from None
    return obj


@functools.lru_cache(maxsize=32)
def _entry_points(group: str, path: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """The ``(name, module:attr)`` entry points of ``group`` installed on ``path``. Cached:
    a scan reads every installed distribution's metadata (~10 ms here), and runtimes are looked
    up once per rollout; keyed by ``sys.path`` so a distribution put on it later is seen."""
    return tuple((ep.name, ep.value) for ep in entry_points(group=group))


class Registry:
    """One plugin family (harnesses, runtimes, tasksets), looked up the same way everywhere:
    an id registered at run time, a built-in id, an installed entry point (``group``), then
    ``pkg.module:Class`` or ``path/to/file.py:Class``; anything else is a :class:`ConfigError`
    with the near misses and the known ids."""

    def __init__(
        self,
        kind: str,
        builtins: Mapping[str, str],
        *,
        group: str,
        check: Callable[[Any], bool],
        example: str,
    ) -> None:
        self.kind = kind
        self.builtins = builtins  # the module's own dict: entries added to it later count
        self.group = group
        self._check = check
        self.example = example
        self.registered: dict[str, Any] = {}

    def register(self, name: str, obj: Any) -> None:
        self.registered[name] = obj

    def targets(self) -> dict[str, str]:
        """Built-in and entry-point ids with their ``module:attr`` targets."""
        found = dict(self.builtins)
        for name, value in _entry_points(self.group, tuple(sys.path)):
            found.setdefault(name, value)
        return found

    def names(self) -> list[str]:
        return sorted({*self.targets(), *self.registered})

    def load(self, name: str) -> Any:
        """The object ``name`` stands for; a ConfigError says why when there is none."""
        if name in self.registered:
            return self.registered[name]
        # A built-in id needs no scan of the installed distributions (built-ins win anyway).
        target = self.builtins.get(name) or self.targets().get(name)
        if target is None:
            if ":" not in name:
                known = self.names()
                near = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
                hint = f"did you mean {' or '.join(repr(c) for c in near)}? " if near else ""
                raise ConfigError(
                    f"unknown {self.kind} {name!r}; {hint}known: {', '.join(known)} "
                    f"(or give an import path such as {self.example!r})"
                )
            target = name
        obj = load_object(target)
        if not self._check(obj):
            raise ConfigError(f"{name!r} is not a vfray {self.kind} ({target})")
        return obj


class PluginOptions(BaseModel):
    """A plugin's options, typed from its constructor's parameters (frozen; an unknown key is
    refused). ``as_kwargs()`` gives back only the options that were set."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    def as_kwargs(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.model_fields_set}


class OpenPluginOptions(PluginOptions):
    """The options of a constructor that takes ``**options``: unknown keys are kept."""

    model_config = ConfigDict(frozen=True, extra="allow", arbitrary_types_allowed=True)

    def as_kwargs(self) -> dict[str, Any]:
        return {**super().as_kwargs(), **(self.model_extra or {})}


@functools.cache
def options_model(
    factory: Callable[..., Any],
    *,
    skip: int = 0,
    keyword_only: bool = False,
    base: type[PluginOptions] = PluginOptions,
    open_base: type[PluginOptions] = OpenPluginOptions,
) -> type[PluginOptions]:
    """A :class:`PluginOptions` model with one field per parameter of ``factory`` (a class's
    ``__init__`` or a function) after the first ``skip`` ones, with its annotation and
    default; ``keyword_only`` takes only keyword-only parameters."""
    init = factory.__init__ if isinstance(factory, type) else factory  # type: ignore[misc]
    try:
        hints = typing.get_type_hints(init)
    except Exception:  # an annotation that names something not importable here
        hints = {}
    params = list(inspect.signature(init).parameters.values())
    if isinstance(factory, type):
        params = params[1:]  # self
    params = params[skip:]
    model_base = open_base if any(p.kind is p.VAR_KEYWORD for p in params) else base
    kinds = (
        (inspect.Parameter.KEYWORD_ONLY,)
        if keyword_only
        else (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    )
    fields: dict[str, Any] = {
        p.name: (hints.get(p.name, Any), ... if p.default is p.empty else p.default)
        for p in params
        if p.kind in kinds
    }
    name = getattr(factory, "__name__", "Plugin")
    return typing.cast(
        "type[PluginOptions]", create_model(f"{name}Options", __base__=model_base, **fields)
    )


def validate_options(
    model: type[PluginOptions], options: Mapping[str, Any] | None, what: str
) -> PluginOptions:
    """``options`` validated by ``model``; one-line :class:`ConfigError` naming ``what``."""
    try:
        return model.model_validate(dict(options or {}))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigError(f"bad options for {what}: {problems}") from None
