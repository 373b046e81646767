"""``vfray view``: a read-only web viewer of run folders (summary, rollout list, rollouts,
episodes, run comparison), served by starlette from the package with no build step or CDN."""

from vfray.view.app import create_app

__all__ = ["create_app"]
