"""Code shipping: make task classes defined in a notebook cell, a test file or a file passed by
path unpicklable-proof on Ray workers, by registering their module for pickling by value."""

from __future__ import annotations


def ship_by_value(cls: type) -> None:
    """Let Ray workers unpickle ``cls`` even when its module is not importable there (a
    notebook cell, a test file, a taskset passed by path): pickle that module by value."""
    import sys
    import sysconfig

    from ray import cloudpickle

    module = sys.modules.get(cls.__module__)
    if module is None or cls.__module__ == "__main__":
        return  # __main__ is pickled by value already
    top = cls.__module__.split(".")[0]
    if top in ("vfray", "actors"):
        return
    origin = getattr(module, "__file__", None) or ""
    installed = any(
        origin.startswith(p)
        for p in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    )
    if not installed:
        cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]
