"""Internal: a model's reply made storable before it is recorded: text that UTF-8 can encode.

A reply's JSON may hold UTF-16 surrogates (an emoji split between two stream events as escapes,
or a broken server's lone half): such a reply could not be content-addressed, and the call was
dropped from the trace with no error while the agent got its reply. The reply is recorded with
split pairs joined and a lone half as U+FFFD (:mod:`vfray.trace.storable`); the agent's own copy
is the upstream's bytes, untouched.
"""

from __future__ import annotations

from vfray.trace import Message
from vfray.trace.storable import storable


def storable_reply(message: Message) -> tuple[Message, int]:
    """``message`` with every string UTF-8 encodable, and how many lone surrogates became
    U+FFFD (0 also when only split pairs were joined). The same message when nothing needs it
    (its content address computed, as recording needs it anyway)."""
    try:
        message.id  # noqa: B018 - raises UnicodeEncodeError on a surrogate, else cached
    except UnicodeEncodeError:
        pass
    else:
        return message, 0
    data, replaced = storable(message.model_dump())
    return Message.model_validate(data), replaced
