"""The ``verifiers.v1`` import path, served by this package, so that v1 taskset code that says
``import verifiers.v1 as vf`` runs unchanged without verifiers installed.

Installed on demand (``vfray eval`` of a v1 taskset, :func:`install`, and before a v1 task is
unpickled on a worker), never at import time, and only where the real ``verifiers`` is not
installed: two implementations under one name would be a silent mix, so with verifiers present
v1 code imports verifiers itself and vfray adapts those objects.
What it serves is :mod:`._surface`'s list; any other ``verifiers`` module, or a public v1 name
vfray does not implement, fails in one line naming it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

_OURS = "__vfray_compat__"


class _Unserved(importlib.abc.MetaPathFinder):
    """Ends the import of any ``verifiers`` module not served, naming it (without it, Python
    would say only that ``verifiers.v1`` is not a package, or that the name is missing)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".", 1)[0] != "verifiers" or fullname in sys.modules:
            return None
        from vfray.compat.v1._surface import missing_module

        raise missing_module(fullname)


def _refusing(module: str) -> Callable[[str], Any]:
    """A served module's ``__getattr__``: every name it does not serve is one line naming it
    (dunder probes stay plain ``AttributeError``s, as introspection expects)."""

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        from vfray.compat.v1._surface import missing_name

        raise missing_name(module, name)

    return __getattr__


def is_ours(module: types.ModuleType) -> bool:
    return bool(getattr(module, _OURS, False))


def install() -> None:
    """Make ``import verifiers.v1`` (and the v1 submodules in :mod:`._surface`) vfray's, unless
    the real ``verifiers`` is installed: then v1 tasksets import it, and vfray adapts its
    genuine objects (:mod:`._kinds`) instead of serving the name."""
    present = sys.modules.get("verifiers")
    if present is not None:
        return
    if importlib.util.find_spec("verifiers") is not None:
        return
    import vfray.compat.v1._image as _image
    import vfray.compat.v1._surface as _surface
    import vfray.compat.v1._task as _task
    import vfray.compat.v1._textarena as _textarena
    import vfray.compat.v1._user_sim as _user_sim

    # The layer served as ``verifiers.v1`` is this module's own package, loaded before any of its
    # modules: looked up, not imported, so the package and its parts do not import each other.
    layer = sys.modules[__package__ or ""]

    served: dict[str, types.ModuleType] = {"verifiers.v1": layer}
    root = types.ModuleType("verifiers", "vfray's verifiers v1 compatibility layer")
    root.__path__ = []
    setattr(root, _OURS, True)
    root.__getattr__ = _refusing("verifiers")  # type: ignore[method-assign]
    served["verifiers"] = root
    for name in _surface.PACKAGES:
        package = types.ModuleType(name)
        package.__path__ = []
        package.__getattr__ = _refusing(name)  # type: ignore[method-assign]
        served[name] = package
    # Names that live only in their own module, as in v1.
    extra: dict[str, Any] = {
        "UserSimEnv": _user_sim.UserSimEnv,
        "UserSimEnvConfig": _user_sim.UserSimEnvConfig,
        "image_data_url": _image.image_data_url,
        **{
            n: getattr(_textarena, n)
            for n in _surface.SUBMODULES["verifiers.v1.tasksets.textarena"]
        },
        "DataT": _task.DataT,  # typing a Task subclass generic in its data
    }
    for name, names in _surface.SUBMODULES.items():
        module = types.ModuleType(name)
        for attr in names:
            setattr(module, attr, extra[attr] if attr in extra else getattr(layer, attr))
        module.__getattr__ = _refusing(name)  # type: ignore[method-assign]
        served[name] = module
    for name, module in served.items():
        if name != "verifiers":
            parent, _, child = name.rpartition(".")
            setattr(served[parent], child, module)
    sys.modules.update(served)
    if not any(isinstance(f, _Unserved) for f in sys.meta_path):
        sys.meta_path.insert(0, _Unserved())
