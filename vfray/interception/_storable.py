"""Internal: a model's reply made storable before it is recorded: text that UTF-8 can encode.

A reply's JSON may hold UTF-16 surrogates: a stream that splits an emoji between two events
(``"\\ud83d"`` then ``"\\ude00"``: Python joins the two halves but never makes them one
character again), or a broken server's lone half. Such text cannot be hashed for the trace's
content address nor written to Parquet: the call was dropped from the trace with no error
while the agent got its reply. Pairs are joined into their character and a lone half becomes
U+FFFD, as a UTF-8 decoder replaces a broken byte; the agent's own copy is the upstream's
bytes, untouched.
"""

from __future__ import annotations

from typing import Any

from vfray.trace import Message


def storable(message: Message) -> tuple[Message, int]:
    """``message`` with every string UTF-8 encodable, and how many lone surrogates became
    U+FFFD (0 also when only split pairs were joined). The same message when nothing needs it
    (its content address computed, as recording needs it anyway)."""
    try:
        message.id  # noqa: B018 - raises UnicodeEncodeError on a surrogate, else cached
    except UnicodeEncodeError:
        pass
    else:
        return message, 0
    replaced = 0

    def fixed(value: Any) -> Any:
        nonlocal replaced
        if isinstance(value, str):
            try:
                value.encode()
            except UnicodeEncodeError:
                text = value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
                replaced += text.count("\ufffd") - value.count("\ufffd")
                return text
            return value
        if isinstance(value, list):
            return [fixed(v) for v in value]
        if isinstance(value, dict):
            return {fixed(k): fixed(v) for k, v in value.items()}
        return value

    return Message.model_validate(fixed(message.model_dump())), replaced
