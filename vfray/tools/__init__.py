"""Tools over MCP: ``Toolset`` classes with ``@tool`` methods (or external ``McpServer``s) that a
task gives its agent, served per rollout or shared, on the host or in the box.

Internal: importable, but not the public API (:mod:`vfray`, :mod:`vfray.testing`,
:mod:`vfray.train`, :mod:`vfray.compat.v1`); names here may move."""

from vfray.tools.toolset import (
    McpServer,
    Placement,
    Scope,
    ToolFailed,
    Toolset,
    ToolSource,
    intercept,
    tool,
)

__all__ = [
    "McpServer",
    "Placement",
    "Scope",
    "ToolFailed",
    "ToolSource",
    "Toolset",
    "intercept",
    "tool",
]
