"""Models vfray can serve itself, next to the scripted test model: ``local:<name>`` runs a small
real chat model on this machine (the ``vfray[local]`` extra).

Internal: importable, but not the public API (:mod:`vfray`, :mod:`vfray.testing`,
:mod:`vfray.train`, :mod:`vfray.compat.v1`); names here may move."""

from vfray.models.local import (
    LOCAL_MODELS,
    LOCAL_PREFIX,
    LocalModel,
    LocalModelError,
    LocalModelMissingError,
    LocalModelServer,
    parse_local_model,
)

__all__ = [
    "LOCAL_MODELS",
    "LOCAL_PREFIX",
    "LocalModel",
    "LocalModelError",
    "LocalModelMissingError",
    "LocalModelServer",
    "parse_local_model",
]
