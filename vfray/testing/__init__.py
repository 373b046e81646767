"""Helpers users may run too: the scripted model server, serving helpers, conformance checks."""

from vfray.serving import serve_in_loop, serve_in_thread
from vfray.testing.conformance import check_runtime
from vfray.testing.scripted import ReceivedRequest, ScriptedModel, scripted_server

__all__ = [
    "ReceivedRequest",
    "ScriptedModel",
    "check_runtime",
    "scripted_server",
    "serve_in_loop",
    "serve_in_thread",
]
