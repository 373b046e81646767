"""Harnesses by id: the built-ins, ones registered at run time, installed entry points (group
``vfray.harnesses``), and ``pkg.module:Class`` or ``file.py:Class`` paths."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vfray._plugins import Registry
from vfray.harnesses.base import Harness, HarnessConfig

_BUILTIN: dict[str, str] = {
    "bash": "vfray.harnesses.bash:BashHarness",
    "null": "vfray.harnesses.null:NullHarness",
    "compact": "vfray.harnesses.compact:CompactHarness",
    "rlm": "vfray.harnesses.rlm:RlmHarness",
    "oracle": "vfray.harnesses.oracle:OracleHarness",
    "mini-swe-agent": "vfray.harnesses.mini_swe_agent:MiniSweAgentHarness",
    "codex": "vfray.harnesses.codex:CodexHarness",
    "claude-code": "vfray.harnesses.claude_code:ClaudeCodeHarness",
    "claude-code-acp": "vfray.harnesses.acp.claude_code:ClaudeCodeAcpHarness",
    "codex-acp": "vfray.harnesses.acp.codex:CodexAcpHarness",
    "browser-use": "vfray.harnesses.browser_use:BrowserUseHarness",
    "pool": "vfray.harnesses.pool:PoolHarness",
    "hermes-agent": "vfray.harnesses.hermes_agent:HermesAgentHarness",
    "aider": "vfray.harnesses.aider:AiderHarness",
    "terminus-2": "vfray.harnesses.terminus_2:Terminus2Harness",
    "pi": "vfray.harnesses.pi:PiHarness",
    "qwen-code": "vfray.harnesses.qwen_code:QwenCodeHarness",
    "opencode": "vfray.harnesses.opencode:OpencodeHarness",
    "kimi-code": "vfray.harnesses.kimi_code:KimiCodeHarness",
    "openclaw": "vfray.harnesses.openclaw:OpenClawHarness",
    "gemini-cli": "vfray.harnesses.gemini_cli:GeminiCliHarness",
    "goose": "vfray.harnesses.goose:GooseHarness",
    "openhands": "vfray.harnesses.openhands:OpenHandsHarness",
    "swe-agent": "vfray.harnesses.swe_agent:SweAgentHarness",
}
HARNESSES = Registry(
    "harness",
    _BUILTIN,
    group="vfray.harnesses",
    check=lambda obj: isinstance(obj, type) and issubclass(obj, Harness),
    example="mypkg.agents:MyHarness",
)

DEFAULT_HARNESS = "bash"


def register_harness(cls: type[Harness]) -> type[Harness]:
    """Make ``cls`` available under ``cls.id`` (usable as a class decorator)."""
    if not (isinstance(cls, type) and issubclass(cls, Harness)):
        raise TypeError(f"{cls!r} is not a Harness subclass")
    HARNESSES.register(cls.id, cls)
    return cls


def available_harnesses() -> list[str]:
    """Every id :func:`harness_class` accepts without an import path, sorted."""
    return HARNESSES.names()


def resumable_harnesses() -> list[str]:
    """The ids of :func:`available_harnesses` whose harness can resume (``SUPPORTS_RESUME``),
    sorted; an entry point that does not load is left out."""
    found = []
    for name in available_harnesses():
        try:
            cls = harness_class(name)
        except Exception:
            continue
        if cls.SUPPORTS_RESUME:
            found.append(name)
    return found


def harness_class(harness_id: str) -> type[Harness]:
    """The class for ``harness_id``: a built-in, registered or entry-point id, or an import
    path (``pkg.module:Class``, ``file.py:Class``)."""
    cls: type[Harness] = HARNESSES.load(harness_id)
    return cls


def make_harness(
    harness_id: str = DEFAULT_HARNESS,
    config: HarnessConfig | Mapping[str, Any] | None = None,
) -> Harness:
    """Build the harness ``harness_id`` with ``config`` validated into its config type."""
    return harness_class(harness_id)(config)
