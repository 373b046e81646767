"""Token-in/token-out: a later turn of a branch is sent as the branch's exact token ids plus the
bridge tokens of the new messages, so a branch's tokens only ever grow.

A chat endpoint renders the whole history again on every call. A chat template that renders an
earlier reply differently from how it was sampled (reasoning models drop earlier ``<think>``
blocks; templates strip or re-space content; a stop token differs from the turn separator) makes
the next prompt disagree with the previous prompt + completion, and the branch can no longer be
trained on token-exactly (``token_error = "prefix_break"``). Here, once a branch has a call with
token ids, the next call on it goes to vLLM's ``POST /v1/chat/completions/tokens`` (vLLM >= 0.20:
the chat request plus ``tokens``, the prompt ids; the reply is parsed as chat, tool calls and
reasoning included) with ``tokens`` = previous prompt + previous completion + bridge.

The bridge is what the template puts after an assistant turn for the new messages (tool results,
a user message) up to the generation prompt, found as vLLM's TITO clients find it (verifiers'
``OpenAIChatCompletionsTokenClient``): render ``[dummy assistant] + new`` with the generation
prompt and ``[dummy assistant]`` without; the difference, started right after the stop token the
template closes an assistant turn with, is the bridge. It is rendered by a local
:class:`~vfray.endpoints.chat_template.ChatTemplate` (``interception.tokenizer``) or by the
endpoint's ``POST /tokenize`` (vLLM's, at the server root).

When a call cannot be sent this way (the earlier turn was cut at ``max_tokens`` and has no stop
token, the new messages are not tool/user messages, the template's bridge is not a clean suffix,
the endpoint has no tokens route) it is sent as plain chat and the trace says why, in a note:
never a silent repair. Its branch may then break, and the samples view drops it or splits it
into per-turn samples (``env.on_prefix_break``). Calls of the Responses and Anthropic dialects
are sent as chat the same way and answered in their own dialect
(:mod:`~vfray.interception.token_in_dialects`); Gemini's go as they came, noted once per trace.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from vfray.endpoints.chat_template import ChatTemplate
from vfray.interception._bridge_wrappers import (
    BridgeWrappers,
    answers_calls,
    dummy_assistant,
    tail_key_of,
)
from vfray.interception.dialects import ParsedRequest
from vfray.interception.dialects.base import int_list
from vfray.interception.upstream import Forwarder
from vfray.trace import Branch, Message, Trace

TOKENS_PATH = "/chat/completions/tokens"
"""vLLM's chat route that takes the prompt as token ids (``tokens``)."""
TOKENIZE_PATH = "/tokenize"
"""vLLM's tokenizer route, at the server root (not under ``/v1``)."""
NOTE_PREFIX = "token-in:"
_MAX_NOTES = 5
_MAX_BRIDGES = 4096
"""Bridges kept (per interception app), keyed by the new messages, tools and stop token."""
_MAX_ID_TEXTS = 1 << 18
"""Token ids whose text is kept (more than a model's vocabulary: the bound is for garbage)."""
_MAX_STRIPPED = 1 << 16
"""Replies whose id without reasoning is kept."""
_MAX_BRIDGE_KEY = 8192
"""Longer new messages (a long tool output) are rendered each time rather than kept."""
_TAIL_ROLES = frozenset({"tool", "user"})

Tokenize = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None, bool], Awaitable[list[int]]]
"""``(messages, tools, add_generation_prompt) -> token ids``: a chat template, applied."""


@dataclass
class Bridged:
    """A call sent as token ids: the ids, and the request's messages as the model saw them (the
    branch's own replies, reasoning included, where the client sent them back without it)."""

    tokens: list[int]
    messages: list[Message]
    json: str
    """``tokens`` as JSON, built from the previous call's where the session kept it."""


@dataclass
class SentTokens:
    """The ids a session last sent as tokens and their JSON: the next call on that branch sends
    them again plus a few new ids, so only the new ids are encoded (a long branch's prompt is
    thousands of ids; encoding them all again on every turn was most of token-in's cost)."""

    ids: list[int]
    json: str


class _IdTexts(dict[int, str]):
    """Each token id's decimal text, made the first time it is asked for (bounded: a model's
    ids are its vocabulary's)."""

    def __missing__(self, key: int) -> str:
        if len(self) >= _MAX_ID_TEXTS:
            self.clear()
        text = self[key] = str(key)
        return text


class CannotBridge(Exception):
    """This call cannot be sent as tokens; the message says why (noted on the trace)."""


class TokenIn:
    """Builds the ``tokens`` of the next call on a branch (one per interception app).

    ``tokenize`` renders and tokenizes a chat (a local template, or the endpoint's
    ``/tokenize``); the render of the dummy assistant turn alone is cached per tools.
    """

    def __init__(self, tokenize: Tokenize, template: ChatTemplate | None = None) -> None:
        self._tokenize = tokenize
        self._template = template
        self._bases: dict[str, list[int]] = {}
        self._base_texts: dict[str, str] = {}
        self._stop_texts: dict[int, str | None] = {}
        self._checked: set[tuple[bool, str]] = set()
        self._last_tools: tuple[list[dict[str, Any]], str] | None = None
        self.text_bridges = template is not None
        """A local template's bridge is cut from the rendered text and only it is encoded
        (see :meth:`_text_bridge`); False once that disagreed with encoding the whole render."""
        self.wrappers = BridgeWrappers(template) if template is not None else None
        """A new user turn or tool result's bridge text joined from the template's text around
        its content, found once per shape, instead of rendered (see
        :mod:`~vfray.interception._bridge_wrappers`)."""
        self._bridges: OrderedDict[tuple[Any, str, int], tuple[int, ...]] = OrderedDict()
        self.cache_bridges = True
        self.bridges_rendered = 0
        """Bridges rendered (the others came from the cache: the same new messages after the
        same stop token, as a group's rollouts send the task's next user turn or tool output)."""
        self.supported = True
        """False once the endpoint answered the tokens route 404: later calls go as chat."""
        self._id_texts = _IdTexts()
        self._without_reasoning = _WithoutReasoning()

    @classmethod
    def local(cls, template: ChatTemplate) -> TokenIn:
        async def tokenize(
            messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, gen: bool
        ) -> list[int]:
            return template.tokenize_chat(messages, tools=tools, add_generation_prompt=gen)

        return cls(tokenize, template)

    @classmethod
    def endpoint(cls, forwarder: Forwarder) -> TokenIn:
        """Bridges rendered by the endpoint's own template: vLLM's ``POST /tokenize``."""
        upstream = forwarder.upstream

        async def tokenize(
            messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, gen: bool
        ) -> list[int]:
            body: dict[str, Any] = {
                "model": upstream.model,
                "messages": messages,
                "add_generation_prompt": gen,
            }
            if tools:
                body["tools"] = tools
            headers = {"content-type": "application/json"}
            if upstream.api_key:
                headers["authorization"] = f"Bearer {upstream.api_key}"
            data = json.dumps(body).encode()
            async with forwarder.post(TOKENIZE_PATH, data, headers, root=True) as response:
                if response.status != 200:
                    text = (await response.text())[:300]
                    status = response.status
                    raise CannotBridge(f"the endpoint's /tokenize answered {status}: {text}")
                answer = await response.json(content_type=None)
            tokens = int_list(answer.get("tokens")) if isinstance(answer, dict) else None
            if tokens is None:
                raise CannotBridge("the endpoint's /tokenize answered without a 'tokens' list")
            return tokens

        return cls(tokenize)

    async def prompt(
        self,
        trace: Trace,
        request: ParsedRequest,
        body: dict[str, Any],
        sent: SentTokens | None = None,
    ) -> Bridged | None:
        """The token ids to send for this request, with the history they stand for; None when
        it opens a branch (the first turn goes as chat). Raises :class:`CannotBridge` when the
        branch has tokens to extend but this call cannot extend them. ``sent``: what the
        session last sent as tokens, whose JSON is reused when the branch's prompt is it."""
        if not self.supported:
            raise CannotBridge("the endpoint has no tokens route (404)")
        found = _extended_branch(trace, request.messages, self._without_reasoning)
        if found is None:
            return None
        branch, history = found
        last = trace.calls[branch.call_indices[-1]]
        if last.prompt_token_ids is None or not last.completion_token_ids:
            raise CannotBridge(f"call {last.index} came back without token ids")
        if last.finish_reason == "length":
            raise CannotBridge(
                f"call {last.index} was cut at max_tokens: no stop token to continue from"
            )
        raw = body.get("messages")
        tail = raw[len(history) :] if isinstance(raw, list) else []
        roles = [m.get("role") if isinstance(m, dict) else None for m in tail]
        if not tail or any(role not in _TAIL_ROLES for role in roles):
            raise CannotBridge(f"the new messages are not tool results or a user turn: {roles}")
        tools = body.get("tools") if isinstance(body.get("tools"), list) else None
        bridge = await self._bridge(tail, tools, last.completion_token_ids[-1])
        prompt = last.prompt_token_ids
        new = [*last.completion_token_ids, *bridge]
        tokens = [*prompt, *new]
        # The recorded prompt is what was sent (or the endpoint's echo of it): equal lists
        # compare in C at a fraction of encoding them. Every id is an int (a ModelCall's
        # validated ids, the tokenizer's, /tokenize's checked): the list's JSON is each id's
        # text, made once, joined compact as the endpoint echoes it (:mod:`._echo` compares
        # the two as bytes); repr made a new str per id every time, at twice the cost.
        texts = self._id_texts.__getitem__
        if sent is not None and sent.json != "[]" and sent.ids == prompt:
            text = f"{sent.json[:-1]},{','.join(map(texts, new))}]"
        else:
            text = f"[{','.join(map(texts, tokens))}]"
        messages = [*history, *request.messages[len(history) :]]
        return Bridged(tokens, messages, text)

    async def _bridge(
        self, tail: list[dict[str, Any]], tools: list[dict[str, Any]] | None, stop: int
    ) -> Sequence[int]:
        # The bridge depends only on the new messages, the tools and the stop token: rendering
        # it is most of what token-in costs per turn, so a repeat is served from the cache.
        # Tools (often tens of KB of schemas) enter the key as a digest, so entries stay small.
        tools_key = self._tools_key(tools) if tools else ""
        tail_key, size = tail_key_of(tail)
        key = (tail_key, tools_key, stop)
        cached = self._bridges.get(key) if self.cache_bridges else None
        if cached is not None:
            return cached
        self.bridges_rendered += 1
        bridge = self._joined_bridge(tail, tools, tools_key, stop)
        if bridge is None:
            bridge = await self._rendered_bridge(tail, tools, tools_key, stop)
        if size <= _MAX_BRIDGE_KEY:
            if len(self._bridges) >= _MAX_BRIDGES:
                self._bridges.popitem(last=False)  # the oldest
            # A tuple of ints (its key is tuples of strings) leaves the garbage collector's
            # lists at its first pass: thousands of cached bridges are not traversed again.
            self._bridges[key] = kept = tuple(bridge)
            return kept
        return bridge

    def _tools_key(self, tools: list[dict[str, Any]]) -> str:
        # An agent sends the same tools on every call: compared (in C, no copy) with the last
        # ones seen before their JSON is digested again.
        last = self._last_tools
        if last is not None and (last[0] is tools or last[0] == tools):
            return last[1]
        key = hashlib.blake2b(json.dumps(tools).encode()).hexdigest()
        self._last_tools = (tools, key)
        return key

    def _joined_bridge(
        self,
        tail: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        tools_key: str,
        stop: int,
    ) -> list[int] | None:
        """Once the text bridges agreed with the whole render, a common shape of turn is joined
        from the template's text around its content, rendering nothing; None: render it."""
        if self.wrappers is None or not self.text_bridges:
            return None
        stop_text = self._stop_text(stop)
        if stop_text is None or (answers_calls(tail), tools_key) not in self._checked:
            return None

        def real() -> str:
            dummy = dummy_assistant(tail)
            key = self._dummy_key(dummy, tools_key)
            return self._bridge_text(dummy, tail, tools, key, stop)

        try:
            ids = self.wrappers.ids(tail, tools, tools_key, stop_text, real)
        except CannotBridge:
            raise
        except Exception as exc:
            message = f"rendering the bridge failed: {type(exc).__name__}: {exc}"
            raise CannotBridge(message) from exc
        return ids[1:] if ids and ids[0] == stop else None

    async def _render_bridge(
        self,
        tail: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        tools_key: str,
        stop: int,
    ) -> list[int]:
        """A new bridge: joined where it can be, else rendered."""
        joined = self._joined_bridge(tail, tools, tools_key, stop)
        if joined is not None:
            return joined
        return await self._rendered_bridge(tail, tools, tools_key, stop)

    async def _rendered_bridge(
        self,
        tail: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        tools_key: str,
        stop: int,
    ) -> list[int]:
        check = (answers_calls(tail), tools_key)
        stop_text = self._stop_text(stop) if self.text_bridges else None
        dummy = dummy_assistant(tail)
        key = self._dummy_key(dummy, tools_key)
        if stop_text is not None:
            try:
                bridge = self._text_bridge(dummy, tail, tools, key, stop)
            except CannotBridge:
                raise
            except Exception as exc:
                message = f"rendering the bridge failed: {type(exc).__name__}: {exc}"
                raise CannotBridge(message) from exc
            if bridge is not None and check in self._checked:
                return bridge
            # The first bridge per tools (and kind of turn) is also cut from the encoded whole
            # render: a tokenizer whose pieces after the stop token depend on the text before it
            # turns the text bridges off.
            self._checked.add(check)
            if bridge is not None and bridge == await self._token_bridge(
                dummy, tail, tools, key, stop
            ):
                return bridge
            self.text_bridges = False
        return await self._token_bridge(dummy, tail, tools, key, stop)

    @staticmethod
    def _dummy_key(dummy: dict[str, Any], tools_key: str) -> str:
        return json.dumps(dummy) + "\0" + tools_key

    def _stop_text(self, stop: int) -> str | None:
        """The text of ``stop`` when it is an added token the tokenizer splits the text at
        (matched as written, stripping no whitespace around it), else None."""
        if stop not in self._stop_texts:
            assert self._template is not None
            added = self._template.tokenizer.get_added_tokens_decoder().get(stop)
            clean = added is not None and not (added.lstrip or added.rstrip or added.normalized)
            self._stop_texts[stop] = added.content if clean else None
        return self._stop_texts[stop]

    def _text_bridge(
        self,
        dummy: dict[str, Any],
        tail: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        key: str,
        stop: int,
    ) -> list[int] | None:
        """The bridge encoded from the text after the stop token; None where that text does not
        start with the stop token once encoded (then the whole render is encoded)."""
        # The tokenizer splits its input at added tokens and encodes the pieces apart, so the
        # tokens after the stop token are those of the text after it: encoding just that text
        # (from the stop token on, so a piece's position reads as in the whole render) skips
        # the tools' system prompt and the dummy turn, most of the text when there are tools.
        assert self._template is not None
        ids = self._template.encode(self._bridge_text(dummy, tail, tools, key, stop))
        return ids[1:] if ids and ids[0] == stop else None

    def _bridge_text(
        self,
        dummy: dict[str, Any],
        tail: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        key: str,
        stop: int,
    ) -> str:
        """The rendered text of the bridge, from the stop token on."""
        template = self._template
        assert template is not None
        base = self._base_texts.get(key)
        if base is None:
            base = template.render([dummy], tools=tools, add_generation_prompt=False)
            if len(self._base_texts) >= 256:  # keyed by the tool call ids answered: many
                self._base_texts.pop(next(iter(self._base_texts)))
            self._base_texts[key] = base
        full = template.render([dummy, *tail], tools=tools, add_generation_prompt=True)
        if not full.startswith(base):
            raise CannotBridge("the chat template renders the earlier turns differently")
        stop_text = self._stop_text(stop)
        assert stop_text is not None
        at = base.rfind(stop_text)
        if at < 0:
            raise CannotBridge(
                f"the last sampled token ({stop}) is not the template's end of an assistant turn"
            )
        return full[at:]

    async def _token_bridge(
        self,
        dummy: dict[str, Any],
        tail: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        key: str,
        stop: int,
    ) -> list[int]:
        base = self._bases.get(key)
        try:
            if base is None:
                base = await self._tokenize([dummy], tools, False)
                if len(self._bases) >= 256:
                    self._bases.pop(next(iter(self._bases)))
                self._bases[key] = base
            full = await self._tokenize([dummy, *tail], tools, True)
        except CannotBridge:
            raise
        except Exception as exc:
            raise CannotBridge(f"rendering the bridge failed: {type(exc).__name__}: {exc}") from exc
        if full[: len(base)] != base:
            raise CannotBridge("the chat template renders the earlier turns differently")
        # The completion ends at the stop token; the template may put more after it (Qwen's
        # "\n"), which belongs to the bridge. Without the stop token in the rendered turn, the
        # sampled turn cannot be told where it ends.
        if stop not in base:
            raise CannotBridge(
                f"the last sampled token ({stop}) is not the template's end of an assistant turn"
            )
        gap = len(base) - 1 - max(i for i, t in enumerate(base) if t == stop)
        bridge = full[len(base) - gap :]
        if bridge and bridge[0] == stop:
            bridge = bridge[1:]
        return bridge


def _extended_branch(
    trace: Trace, messages: list[Message], without_reasoning: Callable[[Message], str | None]
) -> tuple[Branch, list[Message]] | None:
    """The longest answered branch this request continues, with its messages. A reply the
    client sent back without its reasoning (clients drop ``reasoning_content``; templates drop
    earlier ``<think>`` blocks) still continues it: the model's context holds the reasoning.
    ``without_reasoning``: a reply's id without its reasoning (None: it has none)."""
    ids = [m.id for m in messages]
    best: tuple[Branch, list[Message]] | None = None
    for branch in trace.branch_list:
        n = len(branch.message_ids)
        if not branch.call_indices or n >= len(ids):
            continue
        if best is not None and n <= len(best[0].message_ids):
            continue
        last = trace.calls[branch.call_indices[-1]]
        if last.response_id is None or last.response_id != branch.message_ids[-1]:
            continue  # the branch ends in a request that got no answer: nothing to extend
        if ids[:n] != branch.message_ids and not all(
            mine == theirs or without_reasoning(trace.graph[mine]) == theirs
            for mine, theirs in zip(branch.message_ids, ids[:n], strict=True)
        ):
            continue
        best = branch, [trace.graph[mid] for mid in branch.message_ids]
    return best


class _WithoutReasoning(dict[str, str]):
    """A reply's message id -> the id of the same reply without its reasoning, each worked out
    once (None where it has none). An agent that drops ``reasoning_content`` sends every
    earlier reply back without it on every call, so each call compares all of the branch's
    replies: rebuilding and hashing each one every time made a turn's cost grow with the
    conversation. Ids are content addresses, so an entry holds across traces (bounded)."""

    def __call__(self, message: Message) -> str | None:
        if message.role != "assistant" or not message.reasoning_content:
            return None  # nothing to strip: not kept
        key = message.id
        stripped = self.get(key)
        if stripped is None:
            if len(self) >= _MAX_STRIPPED:
                self.clear()
            fields = message.model_dump(exclude_none=True)
            fields.pop("reasoning_content")
            stripped = self[key] = Message(**fields).id
        return stripped


def unsupported_dialect(trace: Trace, dialect: str) -> None:
    """Say once on the trace that a call of a dialect token-in does not serve went as it came.

    vLLM's tokens route takes chat requests; the chat dialect's calls, and the Anthropic and
    Responses ones translated to chat (:mod:`~vfray.interception.token_in_dialects`), are
    served. Another dialect's branch may break like any re-rendered one
    (``env.on_prefix_break``)."""
    if trace.calls:  # the first call opens its branch: nothing to extend yet
        message = (
            f"{dialect} calls sent as they came: token-in serves the chat, anthropic and "
            "responses dialects (vLLM's tokens route takes chat requests); a multi-turn "
            "branch may break"
        )
        if f"{NOTE_PREFIX} {message}" not in trace.notes:
            note(trace, message)


def note(trace: Trace, message: str) -> None:
    """Say on the trace that a call went as messages, and why (the first few times)."""
    seen = sum(1 for n in trace.notes if n.startswith(NOTE_PREFIX))
    if seen < _MAX_NOTES:
        trace.notes.append(f"{NOTE_PREFIX} {message}")
