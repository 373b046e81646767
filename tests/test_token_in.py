"""Token-in/token-out through the interception, with a real tokenizer and chat template.

The tokenizer is a byte-level BPE trained here with HF ``tokenizers``; the template renders the
history the way reasoning models' templates do (earlier ``<think>`` blocks dropped, content
trimmed), and the scripted server serves it as vLLM serves a model (prompts rendered by the
template, replies closed by the stop token, ``/v1/chat/completions/tokens`` and ``/tokenize``).
Re-rendering then breaks every multi-turn branch; sending the branch's own ids does not.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from vfray.endpoints.chat_template import ChatTemplate
from vfray.endpoints.serving import serve_in_thread
from vfray.interception import Interception, Upstream
from vfray.interception._echo import without_echo
from vfray.interception.settings import InterceptionSettings
from vfray.models.scripted.server import ScriptedModel, scripted_server
from vfray.trace import TaskRecord, Trace
from vfray.traces.samples import PREFIX_BREAK, to_samples

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
NL = '{{ "\\n" }}'  # a newline that the next tag's whitespace control cannot strip
TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>" + NL + "{% endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}"
    "<|im_start|>assistant\n{{ (m.content or '') | trim }}"
    "{%- for c in m.tool_calls or [] -%}"
    '<tool_call>\n{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments }}}'
    + NL
    + "</tool_call>"
    "{%- endfor -%}"
    "<|im_end|>" + NL + "{%- elif m.role == 'tool' -%}"
    "<|im_start|>user\n<tool_response>\n{{ m.content }}"
    + NL
    + "</tool_response><|im_end|>"
    + NL
    + "{%- else -%}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>" + NL + "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}"
)
CORPUS = [
    "What is 2 + 3? The answer is 5. Let me think about it.",
    "user assistant system tool_call tool_response arguments name command bash",
    'echo hello world {"command": "ls -la"} and again, once more please.',
]
THINK = "the user wants the same words back"
BASH_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "bash",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model folder as a hub download has it: tokenizer.json and tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    folder = tmp_path_factory.mktemp("model")
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"chat_template": TEMPLATE, "eos_token": "<|im_end|>", "bos_token": None}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def template(model_dir: Path) -> ChatTemplate:
    return ChatTemplate.load(model_dir)


@pytest.fixture
def server(template: ChatTemplate) -> Iterator[tuple[ScriptedModel, str]]:
    scripted = ScriptedModel("echo", chat_template=template, think=THINK)
    with scripted_server(scripted) as url:
        yield scripted, url


def new_trace() -> Trace:
    return Trace(task=TaskRecord(key="k", hash="h"))


async def two_turns(
    url: str,
    settings: InterceptionSettings,
    *,
    stream: bool = False,
    first: dict[str, Any] | None = None,
    whole_reply: bool = True,
) -> Trace:
    """A user turn, the reply sent back (whole, reasoning included, as the OpenAI SDK's message
    dumps it; or its content only, as most agents send it), then a second user turn."""
    upstream = Upstream(url, model="m", sampling={"return_tokens": True})
    async with Interception(upstream, settings=settings) as icpt:
        trace = new_trace()
        secret = icpt.app.register(trace)
        client = openai.AsyncOpenAI(base_url=icpt.url, api_key=secret, max_retries=0)
        messages: list[Any] = [{"role": "user", "content": "echo hello world"}]
        reply = await client.chat.completions.create(model="x", messages=messages, **(first or {}))
        message = reply.choices[0].message
        if whole_reply:
            messages.append(message.model_dump(exclude_none=True))
        else:
            messages.append({"role": "assistant", "content": message.content})
        messages.append({"role": "user", "content": "and again"})
        if stream:
            chunks = await client.chat.completions.create(model="x", messages=messages, stream=True)
            async for _ in chunks:
                pass
        else:
            await client.chat.completions.create(model="x", messages=messages)
        return icpt.app.conclude(secret)


def test_template_renders_like_transformers(template: ChatTemplate) -> None:
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": " hello ", "reasoning_content": "r"},
    ]
    text = template.render(messages, add_generation_prompt=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n"
    ids = template.encode(text)
    assert template.decode(ids) == text
    assert template.eos_token_id == template.tokenizer.token_to_id("<|im_end|>")
    assert ids.count(template.eos_token_id) == 2


def test_encode_gives_the_tokenizers_own_ids(template: ChatTemplate, model_dir: Path) -> None:
    """``ChatTemplate.encode`` goes through ``encode_batch_fast`` (no character offsets) where
    the tokenizers package has it: the ids must be those of the plain ``encode``, added tokens,
    wide characters and runs of whitespace included."""
    assert template._encode_batch_fast is not None, "tokenizers without encode_batch_fast"
    texts = [
        "",
        "hi",
        "<|im_end|>\n<|im_start|>user\nand again, once more 7<|im_end|>\n<|im_start|>assistant\n",
        "naïve café — 数字 🙂\t\t  spaced   out\n\n",
        "<|im_start|><|im_end|><|im_start|>",
        "x" * 3000,
    ]
    for text in texts:
        plain = template.tokenizer.encode(text, add_special_tokens=False).ids
        assert template.encode(text) == plain, text[:40]
    older = ChatTemplate.load(model_dir)
    older._encode_batch_fast = None  # tokenizers before 0.21: the plain encode
    assert older.encode(texts[2]) == template.encode(texts[2])


async def test_re_rendered_history_breaks_the_branch(server: tuple[ScriptedModel, str]) -> None:
    """Without token-in, the template drops the earlier <think> block: the sample is lost."""
    trace = await two_turns(server[1], InterceptionSettings())
    assert len(trace.calls) == 2 and len(trace.branch_list) == 1
    (row,) = to_samples([trace]).to_pylist()
    assert row["token_error"] == PREFIX_BREAK
    assert row["completion_token_ids"] is None and row["turn"] is None
    # The fallback: each turn as its own sample, exactly as the model saw and sampled it.
    rows = to_samples([trace], on_prefix_break="per_turn").to_pylist()
    assert [r["turn"] for r in rows] == [0, 1]
    for r, call in zip(rows, trace.calls, strict=True):
        assert r["token_error"] is None and r["branch"] == 0
        assert r["prompt_token_ids"] == call.prompt_token_ids
        assert r["completion_token_ids"] == call.completion_token_ids
        assert r["completion_mask"] == [1] * len(call.completion_token_ids or [])
        assert r["completion_logprobs"] == call.completion_logprobs
        assert [m["id"] for m in r["messages"]] == [*call.request_ids, call.response_id]
    with pytest.raises(ValueError, match="on_prefix_break"):
        to_samples([trace], on_prefix_break="repair")


@pytest.mark.parametrize(
    ("bridge", "stream", "whole_reply"),
    [("local", False, True), ("local", True, False), ("endpoint", False, False)],
)
async def test_token_in_keeps_the_branch(
    server: tuple[ScriptedModel, str],
    template: ChatTemplate,
    model_dir: Path,
    bridge: str,
    stream: bool,
    whole_reply: bool,
) -> None:
    """The second turn extends the first's exact ids, whether the client sent the reply back
    whole or without its reasoning (the branch is then recorded as the model saw it)."""
    scripted, url = server
    tokenizer = str(model_dir) if bridge == "local" else None
    settings = InterceptionSettings(token_in=True, tokenizer=tokenizer)
    trace = await two_turns(url, settings, stream=stream, whole_reply=whole_reply)
    assert len(trace.branch_list) == 1
    first, second = trace.calls
    assert first.prompt_token_ids is not None and first.completion_token_ids is not None
    # The second turn went to the tokens route with the first turn's exact ids, then the bridge.
    sent = scripted.history[-1]
    assert sent.route == "/v1/chat/completions/tokens"
    context = first.prompt_token_ids + first.completion_token_ids
    assert sent.body["tokens"][: len(context)] == context
    bridge_text = template.decode(sent.body["tokens"][len(context) :])
    assert bridge_text == "\n<|im_start|>user\nand again<|im_end|>\n<|im_start|>assistant\n"
    assert second.prompt_token_ids == sent.body["tokens"]
    assert template.decode(first.completion_token_ids).startswith(f"<think>{THINK}</think>")
    (row,) = to_samples([trace]).to_pylist()
    assert row["token_error"] is None
    completion = row["completion_token_ids"]
    assert completion[: len(first.completion_token_ids)] == first.completion_token_ids
    assert completion[-len(second.completion_token_ids) :] == second.completion_token_ids
    inserted = len(completion) - len(first.completion_token_ids) - len(second.completion_token_ids)
    assert row["completion_mask"].count(0) == inserted > 0
    assert not [n for n in trace.notes if n.startswith("token-in")]


@pytest.mark.parametrize("mixed", [False, True], ids=["every-reply", "every-other-reply"])
async def test_replies_sent_back_without_reasoning_keep_one_branch_over_many_turns(
    server: tuple[ScriptedModel, str], model_dir: Path, mixed: bool
) -> None:
    """An agent that sends every reply back without its reasoning, turn after turn, in two
    rollouts with the same conversation: each call after the first extends the branch's exact
    ids (a reply's id without reasoning, worked out once, must match on every later call and in
    the other trace too, as content addresses do). ``mixed``: every other reply goes back with
    its reasoning, so the history matches neither the branch as sampled nor as all stripped."""
    scripted, url = server
    upstream = Upstream(url, model="m", sampling={"return_tokens": True})
    settings = InterceptionSettings(token_in=True, tokenizer=str(model_dir))
    async with Interception(upstream, settings=settings) as icpt:
        for _ in range(2):
            trace = new_trace()
            secret = icpt.app.register(trace)
            client = openai.AsyncOpenAI(base_url=icpt.url, api_key=secret, max_retries=0)
            messages: list[Any] = [{"role": "user", "content": "echo hello world"}]
            for turn in range(5):
                reply = await client.chat.completions.create(model="x", messages=messages)
                sent = scripted.history[-1]
                expected = "/v1/chat/completions" + ("/tokens" if turn else "")
                assert sent.route == expected, (turn, trace.notes)
                if turn:
                    last = trace.calls[-2]
                    context = [*(last.prompt_token_ids or []), *(last.completion_token_ids or [])]
                    assert sent.body["tokens"][: len(context)] == context
                said = reply.choices[0].message
                if mixed and turn % 2:
                    assert said.model_dump()["reasoning_content"]
                    messages.append(said.model_dump(exclude_none=True))
                else:
                    messages.append({"role": "assistant", "content": said.content})
                messages.append({"role": "user", "content": f"and again {turn}"})
            trace = icpt.app.conclude(secret)
            assert len(trace.branch_list) == 1 and len(trace.calls) == 5
            assert not [n for n in trace.notes if n.startswith("token-in")]
            (row,) = to_samples([trace]).to_pylist()
            assert row["token_error"] is None


async def test_token_in_bridges_tool_results(template: ChatTemplate, model_dir: Path) -> None:
    scripted = ScriptedModel("bash", chat_template=template)
    with scripted_server(scripted) as url:
        upstream = Upstream(url, model="m", sampling={"return_tokens": True})
        settings = InterceptionSettings(token_in=True, tokenizer=str(model_dir))
        async with Interception(upstream, settings=settings) as icpt:
            trace = new_trace()
            secret = icpt.app.register(trace)
            client = openai.AsyncOpenAI(base_url=icpt.url, api_key=secret, max_retries=0)
            messages: list[Any] = [{"role": "user", "content": "run: ls -la"}]
            reply = await client.chat.completions.create(
                model="x", messages=messages, tools=[BASH_TOOL]
            )
            call = reply.choices[0].message.tool_calls[0]  # type: ignore[index]
            messages.append(reply.choices[0].message.model_dump(exclude_none=True))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "a b"})
            await client.chat.completions.create(model="x", messages=messages, tools=[BASH_TOOL])
            trace = icpt.app.conclude(secret)
    assert scripted.history[-1].route == "/v1/chat/completions/tokens"
    (row,) = to_samples([trace]).to_pylist()
    assert row["token_error"] is None
    first = trace.calls[0]
    assert first.completion_token_ids is not None
    bridge = scripted.history[-1].body["tokens"][
        len(first.prompt_token_ids or []) + len(first.completion_token_ids) :
    ]
    assert template.decode(bridge) == (
        "\n<|im_start|>user\n<tool_response>\na b\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


async def test_a_turn_cut_at_max_tokens_goes_as_messages_and_says_so(
    server: tuple[ScriptedModel, str], model_dir: Path
) -> None:
    settings = InterceptionSettings(token_in=True, tokenizer=str(model_dir))
    trace = await two_turns(server[1], settings, first={"max_tokens": 3})
    assert trace.calls[0].finish_reason == "length"
    assert server[0].history[-1].route == "/v1/chat/completions"
    (note,) = [n for n in trace.notes if n.startswith("token-in")]
    assert "call 1 sent as messages" in note and "max_tokens" in note


async def test_an_endpoint_without_the_tokens_route_is_used_as_chat(
    template: ChatTemplate, model_dir: Path
) -> None:
    scripted = ScriptedModel("echo", chat_template=template, token_routes=False)
    settings = InterceptionSettings(token_in=True, tokenizer=str(model_dir))
    with scripted_server(scripted) as url:
        trace = await two_turns(url, settings)
    # The tokens route answered 404 (it never reached the model); the call went as chat.
    assert [r.route for r in scripted.history] == ["/v1/chat/completions"] * 2
    assert "tokens" not in scripted.history[-1].body
    assert len(trace.calls) == 2 and trace.calls[1].error is None
    assert trace.calls[1].completion_token_ids
    assert any("answered 404" in n for n in trace.notes)


class _EchoWithBos:
    """ASGI wrapper of the scripted model: its tokens route echoes the prompt with one more id
    in front (as an endpoint that adds a BOS token would), so the echo is not what was sent."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("/tokens"):
            await self.app(scope, receive, send)
            return

        async def rewritten(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message["headers"] if h[0] != b"content-length"]
                message = {**message, "headers": headers}
            elif message["type"] == "http.response.body":
                body = message.get("body", b"")
                body = body.replace(b'"prompt_token_ids":[', b'"prompt_token_ids":[0,')
                message = {**message, "body": body}
            await send(message)

        await self.app(scope, receive, rewritten)


@pytest.mark.parametrize("stream", [False, True])
async def test_an_echo_that_differs_from_the_ids_sent_is_recorded_as_echoed(
    template: ChatTemplate, model_dir: Path, stream: bool
) -> None:
    """A call sent as tokens records the ids the endpoint says it saw: an echo equal to what was
    sent is checked as bytes and not parsed; one that differs is parsed and kept."""
    scripted = ScriptedModel("echo", chat_template=template, think=THINK)
    settings = InterceptionSettings(token_in=True, tokenizer=str(model_dir))
    with serve_in_thread(_EchoWithBos(scripted)) as root:
        trace = await two_turns(f"{root}/v1", settings, stream=stream)
    first, second = trace.calls
    sent = scripted.history[-1]
    assert sent.route == "/v1/chat/completions/tokens"
    assert second.prompt_token_ids == [0, *sent.body["tokens"]]
    # The first call went as chat: its echo is the model's own, parsed as ever.
    asked = scripted.history[0].body["messages"]
    assert first.prompt_token_ids == template.tokenize_chat(asked)


def test_an_echo_equal_to_the_ids_sent_is_cut_before_parsing() -> None:
    sent = "[1,22,333]"
    compact = b'{"id":"x","prompt_token_ids":[1,22,333],"choices":[]}'
    assert json.loads(without_echo(compact, sent)) == {
        "id": "x",
        "prompt_token_ids": None,
        "choices": [],
    }
    spaced = b'{"prompt_token_ids" : [1, 22, 333]}'
    assert json.loads(without_echo(spaced, sent)) == {"prompt_token_ids": None}
    # Another list, none at all, or the key only inside a string: parsed as it came.
    for data in (
        b'{"prompt_token_ids":[0,1,22,333]}',
        b'{"prompt_token_ids":null}',
        b'{"content":"\\"prompt_token_ids\\":[1,22,333]"}',
    ):
        assert without_echo(data, sent) is data


async def test_on_prefix_break_from_config_reaches_the_loaders(
    server: tuple[ScriptedModel, str], tmp_path: Path
) -> None:
    """``env.on_prefix_break`` decides what the batches get of a broken branch: nothing (drop,
    counted) or its turns, each token-exact; ``read_samples`` follows the run's own config."""
    from vfray.config import EvalConfig
    from vfray.episode import Episode
    from vfray.run.outcomes import EpisodeGroup
    from vfray.traces.io import write_traces
    from vfray.train import iter_batches, read_samples, stream_batches

    broken = await two_turns(server[1], InterceptionSettings())
    traces = [broken.model_copy(update={"advantage": 0.5, "rollout_index": 0})]
    write_traces(traces, tmp_path / "traces")
    for choice, used in (("drop", 0), ("per_turn", 2)):
        config = EvalConfig.model_validate({"env": {"on_prefix_break": choice}})
        (tmp_path / "config.json").write_text(config.model_dump_json())
        (batch,) = iter_batches(read_samples(tmp_path), 8)
        assert batch.stats.used == used
        assert batch.stats.token_errors == ({PREFIX_BREAK: 1} if choice == "drop" else {})

        async def groups() -> Any:
            yield EpisodeGroup(Episode(task=traces[0].task, traces=traces))

        found = [b async for b in stream_batches(groups(), 1, on_prefix_break=choice)]
        assert sum(b.stats.used for b in found) == used

        async def configured(run_choice: str) -> Any:  # as Farm.stream yields them
            yield EpisodeGroup(Episode(task=traces[0].task, traces=traces), run_choice)

        found = [b async for b in stream_batches(configured(choice), 1)]
        assert sum(b.stats.used for b in found) == used
    # The per-turn batch holds each call's exact prompt + completion, its sampled tokens masked in.
    for i, call in enumerate(broken.calls):
        ids = [*(call.prompt_token_ids or []), *(call.completion_token_ids or [])]
        assert batch.input_ids[i, : len(ids)].tolist() == ids
        assert int(batch.loss_mask[i].sum()) == len(call.completion_token_ids or [])
    assert read_samples(tmp_path, on_prefix_break="drop").num_rows == 1
    with pytest.raises(ValueError, match="on_prefix_break"):
        [b async for b in stream_batches(groups(), 1, on_prefix_break="repair")]


async def test_a_repeated_follow_up_is_bridged_from_the_cache(
    server: tuple[ScriptedModel, str], model_dir: Path
) -> None:
    """Two rollouts send the same follow-up after the same stop token: one render, the same
    exact tokens for both (the cache changes the cost, never the ids)."""
    scripted, url = server
    upstream = Upstream(url, model="m", sampling={"return_tokens": True})
    settings = InterceptionSettings(token_in=True, tokenizer=str(model_dir))
    async with Interception(upstream, settings=settings) as icpt:
        traces = []
        for _ in range(2):
            secret = icpt.app.register(new_trace())
            client = openai.AsyncOpenAI(base_url=icpt.url, api_key=secret, max_retries=0)
            messages: list[Any] = [{"role": "user", "content": "echo hello world"}]
            reply = await client.chat.completions.create(model="x", messages=messages)
            messages.append(reply.choices[0].message.model_dump(exclude_none=True))
            messages.append({"role": "user", "content": "and again"})
            await client.chat.completions.create(model="x", messages=messages)
            traces.append(icpt.app.conclude(secret))
        assert icpt.app.token_in is not None and icpt.app.token_in.bridges_rendered == 1
    sent = [r.body["tokens"] for r in scripted.history if r.route.endswith("/tokens")]
    assert len(sent) == 2 and sent[0] == sent[1]
    assert [r["token_error"] for r in to_samples(traces).to_pylist()] == [None, None]


async def three_turns(icpt: Interception, dialect: str, stream: bool, **extra: Any) -> Trace:
    """Three turns of an Anthropic or a Responses chat through the SDK, each reply sent back
    whole (thinking/reasoning included), as Claude Code and Codex send them."""
    import anthropic

    trace = new_trace()
    secret = icpt.app.register(trace)
    if dialect == "anthropic":
        claude = anthropic.AsyncAnthropic(base_url=icpt.root_url, api_key=secret, max_retries=0)
        history: Any = [{"role": "user", "content": "echo hello world"}]
        for turn in range(3):
            if stream:
                async with claude.messages.stream(
                    model="x", max_tokens=50, messages=history, **extra
                ) as events:
                    message = await events.get_final_message()
            else:
                message = await claude.messages.create(
                    model="x", max_tokens=50, messages=history, **extra
                )
            said = message.content[-1].text  # type: ignore[union-attr]
            assert said.strip() == history[-1]["content"]  # the scripted model echoes
            blocks = [b.model_dump(exclude_none=True) for b in message.content]
            history += [{"role": "assistant", "content": blocks}]
            history.append({"role": "user", "content": f"and again {turn}"})
    else:
        openai_client = openai.AsyncOpenAI(base_url=icpt.url, api_key=secret, max_retries=0)
        items: Any = [{"role": "user", "content": "echo hello world"}]
        for turn in range(3):
            if stream:
                response = None
                async for event in await openai_client.responses.create(
                    model="x", input=items, stream=True
                ):
                    if event.type == "response.completed":
                        response = event.response
                assert response is not None
            else:
                response = await openai_client.responses.create(model="x", input=items)
            assert response.output_text.strip() == items[-1]["content"]
            items += [o.model_dump(exclude_none=True) for o in response.output]
            items.append({"role": "user", "content": f"and again {turn}"})
    return icpt.app.conclude(secret)


@pytest.mark.parametrize(
    ("dialect", "stream"), [("anthropic", False), ("anthropic", True), ("responses", True)]
)
async def test_anthropic_and_responses_calls_go_token_in(
    server: tuple[ScriptedModel, str], model_dir: Path, dialect: str, stream: bool
) -> None:
    """An Anthropic or Responses chat goes as chat: its first call to /v1/chat/completions,
    the later ones with the branch's exact ids to the tokens route, answered in the client's
    dialect (JSON or its event stream) and recorded as the client sends it back: one branch
    whose tokens only grow, no sample lost."""
    scripted, url = server
    upstream = Upstream(url, model="m", sampling={"return_tokens": True})
    settings = InterceptionSettings(token_in=True, tokenizer=str(model_dir))
    async with Interception(upstream, settings=settings) as icpt:
        trace = await three_turns(icpt, dialect, stream)
    tokens = "/v1/chat/completions/tokens"
    assert [r.route for r in list(scripted.history)[-3:]] == [
        "/v1/chat/completions",
        tokens,
        tokens,
    ]
    assert len(trace.branch_list) == 1 and all(c.error is None for c in trace.calls)
    assert [c.dialect for c in trace.calls] == [dialect] * 3
    for before, call in zip(trace.calls, trace.calls[1:], strict=False):
        context = [*(before.prompt_token_ids or []), *(before.completion_token_ids or [])]
        assert (call.prompt_token_ids or [])[: len(context)] == context
    # The third call's ids were sent as the second's JSON plus the new ids: the same ids.
    assert scripted.history[-1].body["tokens"] == trace.calls[-1].prompt_token_ids
    (row,) = to_samples([trace]).to_pylist()
    assert row["token_error"] is None
    assert not [n for n in trace.notes if n.startswith("token-in")]


async def test_an_anthropic_tool_loop_goes_token_in(
    template: ChatTemplate, model_dir: Path
) -> None:
    """Claude Code's loop: a tool_use answered as chat tool calls, its tool_result bridged as a
    chat tool message after the branch's exact ids, one branch."""
    import anthropic

    scripted = ScriptedModel("bash", chat_template=template)
    bash = {"name": "bash", "input_schema": BASH_TOOL["function"]["parameters"]}
    with scripted_server(scripted) as url:
        upstream = Upstream(url, model="m", sampling={"return_tokens": True})
        settings = InterceptionSettings(token_in=True, tokenizer=str(model_dir))
        async with Interception(upstream, settings=settings) as icpt:
            trace = new_trace()
            secret = icpt.app.register(trace)
            claude = anthropic.AsyncAnthropic(base_url=icpt.root_url, api_key=secret, max_retries=0)
            history: Any = [{"role": "user", "content": "run: ls -la"}]
            options: Any = {"tools": [bash], "tool_choice": {"type": "auto"}, "max_tokens": 50}
            reply = await claude.messages.create(model="x", messages=history, **options)
            assert reply.stop_reason == "tool_use"
            (use,) = [b for b in reply.content if b.type == "tool_use"]
            assert use.input == {"command": "ls -la"}
            history.append(
                {"role": "assistant", "content": [b.model_dump() for b in reply.content]}
            )
            result = {"type": "tool_result", "tool_use_id": use.id, "content": "a b"}
            history.append({"role": "user", "content": [result]})
            await claude.messages.create(model="x", messages=history, **options)
            trace = icpt.app.conclude(secret)
    sent = scripted.history[-1]
    assert sent.route == "/v1/chat/completions/tokens"
    assert (
        sent.body["tool_choice"] == "auto" and sent.body["tools"][0]["function"]["name"] == "bash"
    )
    first = trace.calls[0]
    context = [*(first.prompt_token_ids or []), *(first.completion_token_ids or [])]
    assert template.decode(sent.body["tokens"][len(context) :]) == (
        "\n<|im_start|>user\n<tool_response>\na b\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert len(trace.branch_list) == 1
    (row,) = to_samples([trace]).to_pylist()
    assert row["token_error"] is None


async def test_a_call_with_no_chat_form_goes_as_it_came_and_says_so(
    server: tuple[ScriptedModel, str], model_dir: Path
) -> None:
    """An Anthropic server tool has no chat form: the calls go to /v1/messages as the agent
    sent them, and the trace says why, never silently."""
    scripted, url = server
    upstream = Upstream(url, model="m", sampling={"return_tokens": True})
    settings = InterceptionSettings(token_in=True, tokenizer=str(model_dir))
    search = {"type": "web_search_20250305", "name": "web_search"}
    async with Interception(upstream, settings=settings) as icpt:
        trace = await three_turns(icpt, "anthropic", False, tools=[search])
    assert [r.route for r in list(scripted.history)[-3:]] == ["/v1/messages"] * 3
    notes = [n for n in trace.notes if n.startswith("token-in")]
    assert notes[0] == (
        "token-in: call 0 (anthropic) sent as it came: the tool 'web_search' "
        "(web_search_20250305) is not a function"
    )
    assert len(notes) == 3 and len(trace.calls) == 3


async def test_a_local_bridge_encodes_only_the_text_after_the_stop_token(
    template: ChatTemplate,
) -> None:
    """The local template's bridge is cut from the rendered text after the stop token and only
    that is encoded (not the tools' system prompt): the same ids as cutting it from the
    encoded whole render, for a user turn and for tool results, with tools or not."""
    from vfray.interception.token_in import TokenIn

    stop = template.eos_token_id
    assert stop is not None
    tails: list[list[dict[str, Any]]] = [
        [{"role": "user", "content": "and again, once more  "}],
        [
            {"role": "tool", "tool_call_id": "c1", "content": "a b"},
            {"role": "tool", "tool_call_id": "c2", "content": '{"x": 1}'},
        ],
    ]
    encoded: list[str] = []
    encode = template.encode

    def recorded(text: str) -> list[int]:
        encoded.append(text)
        return encode(text)

    for tools in (None, [BASH_TOOL]):
        for tail in tails:
            fast, whole = TokenIn.local(template), TokenIn.local(template)
            whole.text_bridges = False
            template.encode = recorded  # type: ignore[method-assign]
            try:
                for _ in range(2):  # the first is checked against the whole render, then not
                    ids = await fast._render_bridge(tail, tools, str(tools), stop)
            finally:
                del template.encode
            assert fast.text_bridges
            assert ids == await whole._render_bridge(tail, tools, str(tools), stop)
            assert ids and template.decode(ids).startswith("\n<|im_start|>user\n")
            assert encoded[-1].startswith("<|im_end|>\n<|im_start|>user")
            assert "Tools:" not in encoded[-1]


async def test_a_bridge_joined_around_its_content_equals_the_render(template: ChatTemplate) -> None:
    """A user turn's or tool results' bridge is joined from the template's text around the
    content (found once per shape with sentinels) instead of rendered: the same ids as the
    whole render, with tools or not; a template that transforms the content is rendered."""
    from vfray.endpoints.chat_template import ChatTemplate as Template
    from vfray.interception.token_in import TokenIn

    stop = template.eos_token_id
    assert stop is not None

    def tails(i: int) -> list[list[dict[str, Any]]]:
        return [
            [{"role": "user", "content": f"and again, once more {i}"}],
            [
                {"role": "tool", "tool_call_id": f"c{i}", "content": f'a "b" {i}\nc\\d'},
                {"role": "tool", "tool_call_id": f"d{i}", "content": f'{{"x": {i}}}'},
            ],
            # Rendered, not joined: whitespace at the ends (templates trim), a tag.
            [{"role": "user", "content": f"  edge {i}\n"}],
            [{"role": "user", "content": f"<tool_response> {i}"}],
        ]

    content = "{{ m.content }}"
    replaces = TEMPLATE.replace(content, "{{ m.content | replace('a', 'o') }}")
    branches = TEMPLATE.replace(content, "{{ 'A: ' if m.content[:3] == 'and' }}" + content)
    trims = TEMPLATE.replace(content, "{{ m.content | trim }}")
    templates = {
        "shipped": template,
        "trims": Template(template.tokenizer, trims, eos_token="<|im_end|>"),
        "replaces": Template(template.tokenizer, replaces, eos_token="<|im_end|>"),
        "branches on content": Template(template.tokenizer, branches, eos_token="<|im_end|>"),
    }
    for name, tmpl in templates.items():
        for tools in (None, [BASH_TOOL]):
            fast, whole = TokenIn.local(tmpl), TokenIn.local(tmpl)
            whole.text_bridges = False
            for i in range(3):
                for tail in tails(i):
                    ids = await fast._render_bridge(tail, tools, str(tools), stop)
                    assert ids == await whole._render_bridge(tail, tools, str(tools), stop)
            assert fast.text_bridges and fast.wrappers is not None
            # Turns 1 and 2 of both shapes (turn 0 of each kind is checked against encoding
            # the whole render). A template replacing characters: the sentinels show it. One
            # branching on what the content says: the first real render shows it for the user
            # turn ("and ..."); its tool results never take that branch and are joined.
            expected = {"shipped": 4, "trims": 4, "replaces": 0, "branches on content": 2}
            assert fast.wrappers.served == expected[name], (name, tools)


async def test_a_bridge_cut_at_its_constant_ends_equals_the_whole_encoding(
    template: ChatTemplate,
) -> None:
    """A joined bridge's constant ends are encoded once and each turn encodes only its middle:
    the same ids as encoding the whole text, also with added tokens made to span a cut token
    and a content's start or end (those contents are encoded whole; cut without that check,
    their ids would differ), and with stripping, single-word and normalized added tokens."""
    from dataclasses import replace

    from tokenizers import AddedToken, Tokenizer

    from vfray.endpoints.chat_template import ChatTemplate as Template
    from vfray.interception._bridge_ids import joined
    from vfray.interception.token_in import TokenIn

    tokenizer = Tokenizer.from_str(template.tokenizer.to_str())
    spans = [
        "\n<|im_start|>user\nevil",
        "omen<|im_end|>\n",
        "<|im_start|>user\nzap",
        "fin<|im_end|>",
    ]
    tokenizer.add_tokens([AddedToken(t, normalized=False) for t in spans])
    tokenizer.add_tokens(
        [
            AddedToken("again", lstrip=True, normalized=False),
            AddedToken("more", rstrip=True, normalized=False),
            AddedToken("once", single_word=True, normalized=False),
            AddedToken("hello", normalized=True),
        ]
    )
    tmpl = Template(tokenizer, TEMPLATE, eos_token="<|im_end|>")
    stop = tmpl.eos_token_id
    assert stop is not None
    safe = ["and again, once more", "hello there", "x once y", "more", "a b"]
    crossing = ["evil twin", "an omen", "zap it", "the fin", "evil omen"]
    fast, whole = TokenIn.local(tmpl), TokenIn.local(tmpl)
    whole.wrappers = None  # rendered, and the text after the stop token encoded whole
    cut = set()
    for i, content in enumerate(safe + crossing):
        user = [{"role": "user", "content": content}]
        tools = [
            {"role": "tool", "tool_call_id": f"c{i}", "content": content},
            {"role": "tool", "tool_call_id": f"d{i}", "content": f"{content} {i}"},
        ]
        for kind, tail in (("user", user), ("tool", tools)):
            assert fast.wrappers is not None
            before = fast.wrappers.cut
            ids = await fast._render_bridge(tail, None, "", stop)
            assert ids == await whole._render_bridge(tail, None, "", stop), (content, tail)
            if fast.wrappers.cut > before:
                cut.add((kind, content))
    assert fast.wrappers is not None and fast.text_bridges and whole.text_bridges
    # The first bridges of a shape are checked (against the render, then the whole encoding);
    # after "user\n" a crossing content is encoded whole, after "<tool_response>\n" none is.
    assert {c for kind, c in cut if kind == "user"} == {"more", "a b"}
    assert {c for kind, c in cut if kind == "tool"} == {"more", "a b", *crossing}
    # The crossing contents are real hazards: cut without the check, they encode differently.
    shape = next(s for s in fast.wrappers._shapes.values() if s and len(s.pieces) == 2)
    assert shape.ends is not None and shape.ends_checked
    assert shape.ends.starts and shape.ends.finishes
    unchecked = replace(shape.ends, starts=(), finishes=())
    for content in ["evil twin", "an omen"]:
        text = content.join(shape.pieces)
        assert joined(shape.ends, [content], tmpl.encode) is None
        assert joined(unchecked, [content], tmpl.encode) != tmpl.encode(text)
