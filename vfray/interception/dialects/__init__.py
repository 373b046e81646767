"""Wire dialects the interception speaks: OpenAI chat completions, OpenAI Responses, Anthropic."""

from vfray.interception.dialects.anthropic import AnthropicDialect
from vfray.interception.dialects.base import Dialect, DialectError, ParsedRequest, ParsedResponse
from vfray.interception.dialects.chat import ChatDialect
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
    "ParsedRequest",
    "ParsedResponse",
    "ResponsesDialect",
]
