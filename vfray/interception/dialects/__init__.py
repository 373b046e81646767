"""Wire dialects the interception speaks: OpenAI chat completions, OpenAI Responses, Anthropic,
and Gemini (translated to chat completions upstream, routed by its own paths, so not in
:data:`DIALECTS`)."""

from vfray.interception.dialects.anthropic import AnthropicDialect
from vfray.interception.dialects.base import Dialect, DialectError, ParsedRequest, ParsedResponse
from vfray.interception.dialects.chat import ChatDialect
from vfray.interception.dialects.gemini import GeminiDialect
from vfray.interception.dialects.responses import ResponsesDialect

DIALECTS: dict[str, Dialect] = {
    d.name: d for d in (ChatDialect(), ResponsesDialect(), AnthropicDialect())
}

__all__ = [
    "DIALECTS",
    "AnthropicDialect",
    "ChatDialect",
    "Dialect",
    "DialectError",
    "GeminiDialect",
    "ParsedRequest",
    "ParsedResponse",
    "ResponsesDialect",
]
