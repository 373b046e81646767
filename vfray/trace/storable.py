"""Values made UTF-8 encodable, for content addresses and Parquet.

JSON may carry UTF-16 surrogates as escapes: an emoji split between two stream events
(``"\\ud83d"`` then ``"\\ude00"``: Python joins the halves but never makes them one character
again), or a broken writer's lone half. UTF-8 cannot encode either, so such text could be
neither hashed nor written. :func:`storable` joins split pairs into their character and makes
a lone half U+FFFD, as a UTF-8 decoder replaces a broken byte; :func:`storable_message` does so
for a reply the interception records (the agent's own copy is the upstream's bytes, untouched).
"""

from __future__ import annotations

from typing import Any

from vfray.trace.messages import Message


def storable(value: Any) -> tuple[Any, int]:
    """``value`` (str, and lists and dicts of them, keys included) with every string UTF-8
    encodable, and how many lone surrogates became U+FFFD. Strings that need nothing are the
    same objects."""
    replaced = 0

    def fixed(item: Any) -> Any:
        nonlocal replaced
        if isinstance(item, str):
            try:
                item.encode()
            except UnicodeEncodeError:
                text = item.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
                replaced += text.count("\ufffd") - item.count("\ufffd")
                return text
            return item
        if isinstance(item, list):
            return [fixed(v) for v in item]
        if isinstance(item, dict):
            return {fixed(k): fixed(v) for k, v in item.items()}
        return item

    return fixed(value), replaced


def storable_message(message: Message) -> tuple[Message, int]:
    """``message`` made storable as :func:`storable` makes values, and how many lone
    surrogates became U+FFFD (0 also when only split pairs were joined). The same message when
    nothing needs it: its content address is computed to tell, as recording needs it anyway."""
    try:
        message.id  # noqa: B018 - raises UnicodeEncodeError on a surrogate, else cached
    except UnicodeEncodeError:
        pass
    else:
        return message, 0
    data, replaced = storable(message.model_dump())
    return Message.model_validate(data), replaced
