"""Code shipping: make task classes defined in a notebook cell, a test file or a file passed by
path loadable on Ray workers, by registering their modules for pickling by value."""

from __future__ import annotations

import sys
import sysconfig

from ray import cloudpickle

_INSTALLED = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}


def _ship_module(name: str) -> None:
    module = sys.modules.get(name)
    if module is None or name == "__main__":
        return  # __main__ is pickled by value already
    if name.split(".")[0] in ("vfray", "actors", "builtins", "typing", "abc", "pydantic"):
        return
    origin = getattr(module, "__file__", None) or ""
    if origin and not any(origin.startswith(p) for p in _INSTALLED):
        cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]


def ship_by_value(*classes: type) -> None:
    """Let Ray workers unpickle ``classes`` (and their bases) even when their modules are not
    importable there: those modules are pickled by value. Installed packages are left alone."""
    for cls in classes:
        for base in cls.__mro__:
            _ship_module(base.__module__)
