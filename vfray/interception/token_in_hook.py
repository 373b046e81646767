"""Token-in's hook on one model call: which dialect's call goes as token ids, and the switch.

With ``interception.token_in`` the app hands each call's :class:`~vfray.interception.turns.Turn`
to :func:`send_as_tokens` before the turn starts: a chat call, or an Anthropic or Responses call
made the chat call it stands for (:mod:`~vfray.interception.token_in_dialects`), goes to the
endpoint's tokens route when it continues a branch that has token ids
(:mod:`~vfray.interception.token_in`); another dialect's call goes as it came, noted once.
"""

from __future__ import annotations

from typing import Any

from vfray.interception.dialects import Dialect, ParsedRequest
from vfray.interception.sessions import Session
from vfray.interception.token_in import (
    TOKENS_PATH,
    CannotBridge,
    SentTokens,
    TokenIn,
    note,
    unsupported_dialect,
)
from vfray.interception.token_in_dialects import DIALECTS as AS_CHAT_DIALECTS
from vfray.interception.token_in_dialects import as_chat
from vfray.interception.turns import Turn


async def send_as_tokens(
    token_in: TokenIn,
    turn: Turn,
    session: Session,
    dialect: Dialect,
    parsed: ParsedRequest,
    body: dict[str, Any],
) -> None:
    """Route ``turn`` (a call of ``dialect`` whose request is ``parsed``) through token-in."""
    if dialect.name == "chat":
        await _send_tokens(token_in, turn, session, parsed, body)
    elif dialect.name in AS_CHAT_DIALECTS:
        chat = as_chat(turn, session.trace)
        if chat is not None:
            await _send_tokens(token_in, turn, session, parsed, chat)
    else:
        unsupported_dialect(session.trace, dialect.name)


async def _send_tokens(
    token_in: TokenIn,
    turn: Turn,
    session: Session,
    parsed: ParsedRequest,
    body: dict[str, Any],
) -> None:
    """Send ``turn`` as token ids when it continues a branch that has them (token-in)."""
    turn.token_in = token_in
    # Token-in needs every reply's token ids, asked for whatever the sampling config says.
    for key, value in turn.dialect.token_fields(body).items():
        turn.upstream_body.setdefault(key, value)
    try:
        bridged = await token_in.prompt(session.trace, parsed, body, session.sent_tokens)
    except CannotBridge as exc:
        note(session.trace, f"call {len(session.trace.calls)} sent as messages: {exc}")
        return
    if bridged is not None:
        turn.upstream_body["tokens"] = bridged.tokens
        turn.path = TOKENS_PATH
        turn.sent_tokens = bridged.tokens
        turn.tokens_json = bridged.json
        session.sent_tokens = SentTokens(bridged.tokens, bridged.json)
        # Recorded as what the model saw, so the call stays on the branch it extends.
        turn.plain_request = parsed
        turn.request = ParsedRequest(bridged.messages, parsed.tools, parsed.stream)
