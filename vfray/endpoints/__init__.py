"""The endpoint side (internal): vfray's own model calls and their retries, and serving ASGI
apps (the interception, tool servers, the scripted model) with uvicorn on loopback.

Internal: importable, but not the public API (:mod:`vfray`, :mod:`vfray.testing`,
:mod:`vfray.train`, :mod:`vfray.compat.v1`); names here may move."""
