"""Helpers users may run too: the scripted model server, serving helpers, conformance checks."""

from vfray.endpoints.serving import serve_in_loop, serve_in_thread
from vfray.models.scripted.server import ReceivedRequest, ScriptedModel, scripted_server
from vfray.testing.conformance import check_runtime

__all__ = [
    "ReceivedRequest",
    "ScriptedModel",
    "check_runtime",
    "scripted_server",
    "serve_in_loop",
    "serve_in_thread",
]
