"""A verifiers v1 taskset whose task brings its own toolset (run with a harness that speaks MCP)."""

from .taskset import Tools, ToolTask
from .tools import Doubler

__all__ = ["Doubler", "ToolTask", "Tools"]
