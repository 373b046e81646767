"""``vfray view``: a read-only web viewer of run folders (summary, rollout list, rollouts,
episodes, run comparison), served by starlette from the package with no build step or CDN.

Internal: importable, but not the public API (:mod:`vfray`, :mod:`vfray.testing`,
:mod:`vfray.train`, :mod:`vfray.compat.v1`); names here may move."""

from vfray.view.app import create_app

__all__ = ["create_app"]
