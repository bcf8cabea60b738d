"""Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`) in `specllm
serve`, with the real `anthropic` client and raw requests, on tiny models: Qwen2.5's chat template
(its replies are noise: text, no finished call), Qwen3.5's (its generation prompt opens a think
block the noise never closes: all of it is reasoning) and the plain ChatML one, which renders no
tools, so that tools are offered in the generic format and a grammar makes the reply a real call
(generic_tools.py). A request is translated into a chat request, so a reply is compared with the
chat endpoint's to the same conversation, token for token; a call on a template that renders
tools, which the tiny models never finish, is read from a fixed reply by serve's own reader."""

import dataclasses
import http.client
import inspect
import json
import re
from urllib.parse import urlsplit

import anthropic
import pytest
import tiny_models as tm
import tool_templates
from serving import (
    ASK,
    CALL,
    GET_WEATHER,
    PARAMETERS,
    Server,
    leave_a_stream,
    replayed,
    templated_server,
)

import specllm
from specllm.serve.messages_api import MessageReply, parse_messages, steady_billing_header
from specllm.serve.openai_api import ApiError, ChatReply

GREEDY = dict(model="x", temperature=0)
WEATHER = {"name": "get_weather", "description": "The weather in a city", "input_schema": PARAMETERS}
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def qwen25(tmp_path_factory):
    yield from templated_server(tmp_path_factory, "qwen25", tool_templates.QWEN25, vocab="code")


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory):
    yield from templated_server(tmp_path_factory, "qwen35", tool_templates.QWEN35)


# ChatML, but a system message anywhere but first is refused, as Qwen3.5's template refuses it
STRICT_SYSTEM = (
    "{% for message in messages %}{% if message['role'] == 'system' and not loop.first %}"
    "{{ raise_exception('System message must be at the beginning.') }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def strict(tmp_path_factory):
    yield from templated_server(tmp_path_factory, "strict", STRICT_SYSTEM)


@pytest.fixture(scope="module")
def chatml(tiny_models):
    """The tiny target with its ChatML template, which renders no tools: calls in the generic format."""
    engine = specllm.load(str(tiny_models.target), n_ctx=2048, n_threads=1)
    srv = Server(engine)
    yield engine, srv
    srv.stop()
    engine.close()


def client(srv, **key) -> anthropic.Anthropic:
    """The anthropic SDK's client of `srv` (`key`: api_key or auth_token; any key by default)."""
    return anthropic.Anthropic(base_url=srv.url, max_retries=0, timeout=60, **(key or {"api_key": "-"}))


SDK_FIELDS = inspect.signature(anthropic.resources.messages.Messages.create).parameters


def sdk(body: dict) -> dict:
    """A request's fields as the SDK takes them: those it has no parameter for (temperature: the
    API's newest models take no sampler settings, serve does) in its extra_body."""
    extra = {name: value for name, value in body.items() if name not in SDK_FIELDS}
    return {name: value for name, value in body.items() if name in SDK_FIELDS} | {"extra_body": extra}


def create(srv, **body) -> anthropic.types.Message:
    return client(srv).messages.create(**sdk(body))


def events(srv, body: dict, path: str = "/v1/messages") -> list[dict]:
    """A streamed message's events, raw: each one's `event:` line must name its data's type."""
    return srv.post_named_events(path, body)


def kinds(streamed: list[dict]) -> list[str]:
    """The events' types (a delta's with its own type), a run of the same delta as one."""
    names = [e["type"] if e["type"] != "content_block_delta" else e["delta"]["type"] for e in streamed]
    return [name for i, name in enumerate(names) if not (name.endswith("_delta") and i and names[i - 1] == name)]


def streamed_text(streamed: list[dict], kind: str = "text_delta", field: str = "text") -> str:
    return "".join(
        e["delta"][field] for e in streamed if e["type"] == "content_block_delta" and e["delta"]["type"] == kind
    )


def prompt_tokens(srv, messages: list[dict], **chat) -> int:
    """The chat endpoint's prompt tokens for `messages` (and the chat fields `chat`)."""
    status, data = srv.post("/v1/chat/completions", json.dumps({"messages": messages, "max_tokens": 1} | chat).encode())
    assert status == 200, data
    return data["usage"]["prompt_tokens"]


def test_a_text_reply_is_the_chat_endpoints_streamed_or_not(qwen25):
    """system and messages are the chat's system and user messages: the same greedy reply, cut by
    max_tokens; its usage is the chat's; the stream's events come in the API's order and hold the
    whole message, which the SDK's own stream reads back."""
    _, srv = qwen25
    messages = [{"role": "system", "content": "Be brief."}, *ASK]
    chat = srv.client().chat.completions.create(messages=messages, max_tokens=12, **GREEDY)
    request = dict(system="Be brief.", messages=ASK, max_tokens=12, **GREEDY)
    whole = create(srv, **request)
    assert whole.id.startswith("msg_") and (whole.type, whole.role, whole.model) == ("message", "assistant", "tiny")
    assert [block.type for block in whole.content] == ["text"]
    assert whole.content[0].text == chat.choices[0].message.content
    assert (whole.stop_reason, whole.stop_sequence) == ("max_tokens", None)
    usage = whole.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == chat.usage.prompt_tokens
    assert (usage.output_tokens, usage.cache_creation_input_tokens) == (12, 0)
    with client(srv).messages.stream(**sdk(request)) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text
    assert final.model_dump(exclude={"id", "specllm"}) == whole.model_dump(exclude={"id", "specllm"})
    raw = events(srv, request)
    assert kinds(raw) == [
        "message_start", "content_block_start", "text_delta", "content_block_stop", "message_delta", "message_stop",
    ]  # fmt: skip
    assert streamed_text(raw) == whole.content[0].text
    start = raw[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["id"].startswith("msg_")
    assert start["usage"]["input_tokens"] == chat.usage.prompt_tokens and start["usage"]["output_tokens"] == 0
    assert {e["index"] for e in raw if "index" in e} == {0}
    assert raw[-2]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert raw[-2]["usage"] == usage.model_dump(exclude_none=True)


def test_a_stop_sequence_ends_the_reply_and_is_named(qwen25):
    _, srv = qwen25
    text = create(srv, messages=ASK, max_tokens=12, **GREEDY).content[0].text
    stop = text[4:7]
    request = dict(messages=ASK, max_tokens=12, stop_sequences=["never written", stop], **GREEDY)
    whole = create(srv, **request)
    assert (whole.stop_reason, whole.stop_sequence) == ("stop_sequence", stop)
    assert whole.content[0].text == text[: text.index(stop)]
    raw = events(srv, request)
    assert raw[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": stop}
    assert streamed_text(raw) == whole.content[0].text


# Claude Code's system prompt: text blocks with cache_control, its billing header first
SYSTEM = [
    {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.101.e51; cc_entrypoint=cli; cch=a5145;"},
    {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
]


def test_count_tokens_is_the_chat_prompts_tokens(qwen25):
    """count_tokens (no max_tokens) is the tokens of the prompt the chat endpoint renders for the
    conversation: the system's blocks and a message's text blocks as text parts, the custom tools
    (a server tool left out, as the chat endpoint has none); and a reply's own input tokens."""
    _, srv = qwen25
    parts = [{"type": "text", "text": "What is"}, {"type": "text", "text": " the weather in Paris?"}]
    server_tool = {"type": "web_search_20250305", "name": "web_search", "max_uses": 5}
    counted = client(srv).messages.count_tokens(
        model="x", system=SYSTEM, messages=[{"role": "user", "content": parts}], tools=[WEATHER, server_tool]
    )
    system = [{"type": "text", "text": steady_billing_header(block["text"])} for block in SYSTEM]
    chat = [{"role": "system", "content": system}, {"role": "user", "content": parts}]
    assert counted.input_tokens == prompt_tokens(srv, chat, tools=[GET_WEATHER])
    assert counted.input_tokens != prompt_tokens(srv, chat)
    whole = create(
        srv, system=SYSTEM, messages=[{"role": "user", "content": parts}], tools=[WEATHER], max_tokens=2, **GREEDY
    )
    assert whole.usage.input_tokens + whole.usage.cache_read_input_tokens == counted.input_tokens


def test_a_reply_that_fills_the_context_ends_with_model_context_window_exceeded(qwen25):
    """Asked for more than the context holds (Claude Code asks for 32000 tokens), the reply ends
    where the context does, as Anthropic's API says: not max_tokens, which was not reached."""
    _, srv = qwen25
    words = [client(srv).messages.count_tokens(model="x", messages=[{"role": "user", "content": "weather " * n}])
             for n in (100, 200)]  # fmt: skip
    per_word = (words[1].input_tokens - words[0].input_tokens) / 100
    n = 100 + int((2048 - 6 - words[0].input_tokens) / per_word)
    request = dict(messages=[{"role": "user", "content": "weather " * n}], max_tokens=32000, **GREEDY)
    whole = create(srv, **request)
    assert whole.stop_reason == "model_context_window_exceeded" and 0 < whole.usage.output_tokens < 32000
    assert whole.usage.input_tokens + whole.usage.output_tokens in (2048, 2049)  # its last token needs no room
    assert events(srv, request)[-2]["delta"]["stop_reason"] == "model_context_window_exceeded"


def test_claude_codes_billing_stamp_leaves_the_conversation_in_the_kv_cache(qwen25):
    """Claude Code's system prompt begins with a stamp that changes with every request: the next
    turn, stamped anew, still continues the previous request's conversation (its reuse reported)."""
    _, srv = qwen25
    first = create(srv, system=SYSTEM, messages=ASK, max_tokens=8, **GREEDY)
    restamped = [dict(SYSTEM[0], text=SYSTEM[0]["text"].replace("a5145", "9c0d2")), SYSTEM[1]]
    turn = [*ASK, {"role": "assistant", "content": first.content[0].text}, {"role": "user", "content": "And Oslo?"}]
    second = create(srv, system=restamped, messages=turn, max_tokens=8, **GREEDY)
    assert second.usage.cache_read_input_tokens == first.usage.input_tokens + 8 - 1  # the last with the reply
    stats = second.model_extra["specllm"]["stats"]  # input_tokens are those prefilled, and the last one
    assert (second.usage.input_tokens, second.usage.cache_read_input_tokens) == (
        stats["prefill_tokens"] + 1, stats["prompt_tokens"] - stats["prefill_tokens"] - 1)  # fmt: skip
    assert steady_billing_header(SYSTEM[0]["text"]).endswith("cch=fffff;")
    for text in ("You are Claude Code.", "x-anthropic-billing-header: cc_version=1; cch=a5145", "cch=a5145;"):
        assert steady_billing_header(text) == text  # no header, or a stamp not as Claude Code writes it


# The generic format's tools (test_server_generic_tools.py): bounded arguments, so the calls end
def tool(name: str, properties: dict) -> dict:
    schema = {"type": "object", "properties": properties, "required": list(properties)}
    return {"name": name, "description": f"{name} of a place", "input_schema": schema}


TOOLS = [
    tool("get_weather", {"city": {"type": "string", "maxLength": 12}}),
    tool("get_time", {"offset": {"type": "integer", "minimum": -12, "maximum": 12}}),
]


def as_function(tool: dict) -> dict:
    """A tool as the chat endpoint takes it."""
    function = {"name": tool["name"], "description": tool["description"], "parameters": tool["input_schema"]}
    return {"type": "function", "function": function}


CHAT_TOOLS = [as_function(tool) for tool in TOOLS]
ASK_GENERIC = [{"role": "user", "content": "Weather in Paris?"}]
GREETING = [{"role": "user", "content": "hi"}]
# Whether the tiny model calls a tool or answers is its logits' choice, which another CPU's
# kernels may turn where two are near (testing.md): a test looks for a question that takes its path
QUESTIONS = ["Weather in Paris?", "hi", "What time is it in Oslo?", "Hello there", "Is it raining?", "Thanks!"]


def first_question(srv, takes_the_path, **chat) -> tuple[list[dict], object]:
    """The first of QUESTIONS whose greedy chat reply (with the chat fields `chat`) takes the path:
    the conversation, and the chat endpoint's reply. Fails, saying what each did, where none does."""
    seen = []
    for question in QUESTIONS:
        messages = [{"role": "user", "content": question}]
        reply = srv.client().chat.completions.create(messages=messages, **GREEDY, **chat)
        if takes_the_path(reply.choices[0]):
            return messages, reply
        seen.append(f"{question!r}: {reply.choices[0].finish_reason}")
    pytest.fail("no question takes the path:\n" + "\n".join(seen))


def calls(choice) -> bool:
    return choice.finish_reason == "tool_calls"


def answers(choice) -> bool:
    return choice.finish_reason == "stop"


def as_tool_use(call) -> tuple[str, dict]:
    return call.function.name, json.loads(call.function.arguments)


def test_a_call_is_a_tool_use_block_as_the_chat_endpoints_call_streamed_or_not(chatml):
    """The model calls a tool: the chat endpoint's calls, each a tool_use block whose input is the
    call's arguments as an object and whose id is the call's (as serve makes them); stop_reason
    tool_use. Streamed, a call's block starts with an empty input and gets it whole as JSON."""
    _, srv = chatml
    asked, chat = first_question(srv, calls, tools=CHAT_TOOLS, max_tokens=300)
    request = dict(messages=asked, tools=TOOLS, max_tokens=300, **GREEDY)
    whole = create(srv, **request)
    assert whole.stop_reason == "tool_use" and {block.type for block in whole.content} == {"tool_use"}
    assert [(b.name, b.input) for b in whole.content] == list(map(as_tool_use, chat.choices[0].message.tool_calls))
    assert all(re.fullmatch(r"[A-Za-z0-9]{9}", block.id) for block in whole.content)
    assert whole.usage.output_tokens == chat.usage.completion_tokens
    with client(srv).messages.stream(**sdk(request)) as stream:
        final = stream.get_final_message()
    assert [b.model_dump(exclude={"id"}) for b in final.content] == [
        b.model_dump(exclude={"id"}) for b in whole.content
    ]
    raw = events(srv, request)
    starts = [e for e in raw if e["type"] == "content_block_start"]
    assert [e["content_block"] | {"id": "-"} for e in starts] == [
        {"type": "tool_use", "id": "-", "name": b.name, "input": {}} for b in whole.content
    ]
    assert [json.loads(e["delta"]["partial_json"]) for e in raw if e["type"] == "content_block_delta"] == [
        b.input for b in whole.content
    ]
    assert raw[-2]["delta"]["stop_reason"] == "tool_use"


def test_an_answer_beside_tools_ends_the_turn(chatml):
    _, srv = chatml
    asked, chat = first_question(srv, answers, tools=CHAT_TOOLS, max_tokens=300)
    whole = create(srv, messages=asked, tools=TOOLS, max_tokens=300, **GREEDY)
    assert [block.type for block in whole.content] == ["text"] and whole.stop_reason == "end_turn"
    assert whole.content[0].text == chat.choices[0].message.content


def test_tool_choice_any_tool_none_and_one_call_only(chatml):
    """tool_choice any is chat's required, tool a named function, none no tools (the reply the
    chat endpoint gives without them); disable_parallel_tool_use is parallel_tool_calls false."""
    _, srv = chatml
    chat = srv.client().chat.completions.create(
        messages=GREETING, tools=CHAT_TOOLS, tool_choice="required", max_tokens=300, **GREEDY
    )
    forced = create(srv, messages=GREETING, tools=TOOLS, tool_choice={"type": "any"}, max_tokens=300, **GREEDY)
    assert [(b.name, b.input) for b in forced.content] == list(map(as_tool_use, chat.choices[0].message.tool_calls))
    other = next(tool["name"] for tool in TOOLS if tool["name"] != forced.content[0].name)  # not the model's pick
    named = create(srv, messages=GREETING, tools=TOOLS, tool_choice={"type": "tool", "name": other},
                   max_tokens=300, **GREEDY)  # fmt: skip
    assert named.stop_reason == "tool_use" and {block.name for block in named.content} == {other}
    chat_named = {"type": "function", "function": {"name": other}}
    assert named.usage.input_tokens == prompt_tokens(srv, GREETING, tools=CHAT_TOOLS, tool_choice=chat_named)
    plain = srv.client().chat.completions.create(messages=ASK_GENERIC, max_tokens=8, **GREEDY)
    none = create(srv, messages=ASK_GENERIC, tools=TOOLS, tool_choice={"type": "none"}, max_tokens=8, **GREEDY)
    assert [block.type for block in none.content] == ["text"]
    assert none.content[0].text == plain.choices[0].message.content
    one_call = {"type": "auto", "disable_parallel_tool_use": True}
    one = client(srv).messages.count_tokens(model="x", messages=ASK_GENERIC, tools=TOOLS, tool_choice=one_call)
    assert one.input_tokens == prompt_tokens(srv, ASK_GENERIC, tools=CHAT_TOOLS, parallel_tool_calls=False)
    assert one.input_tokens != prompt_tokens(srv, ASK_GENERIC, tools=CHAT_TOOLS)


REASONING = "Paris: ask the tool."
ANSWERED = [
    ASK[0],
    {"role": "assistant", "content": [
        {"type": "thinking", "thinking": REASONING, "signature": "c2ln"},
        {"type": "tool_use", "id": "abc123XYZ", "name": "get_weather", "input": {"city": "Paris"}},
    ]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "abc123XYZ", "is_error": False,
         "content": [{"type": "text", "text": "18 C"}, {"type": "text", "text": "cloudy"}]},
    ]},
]  # fmt: skip
CHAT_ANSWERED = [
    ASK[0],
    {"role": "assistant", "content": "", "reasoning_content": REASONING, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "abc123XYZ", "content": "18 C\ncloudy"},
]


def test_calls_thinking_and_tool_results_go_back_as_the_chat_endpoints_messages(qwen35):
    """An assistant's thinking and tool_use blocks are one assistant message with its reasoning
    and call; a user's tool_result is a tool message (its text blocks joined as chat's): the
    prompt the chat endpoint renders for those, its reply the same; the thinking is in the prompt,
    as llama-server tests it."""
    _, srv = qwen35
    counted = client(srv).messages.count_tokens(model="x", messages=ANSWERED, tools=[WEATHER])
    assert counted.input_tokens == prompt_tokens(srv, CHAT_ANSWERED, tools=[GET_WEATHER])
    without = [ANSWERED[0], dict(ANSWERED[1], content=ANSWERED[1]["content"][1:]), ANSWERED[2]]
    assert (
        client(srv).messages.count_tokens(model="x", messages=without, tools=[WEATHER]).input_tokens
        < counted.input_tokens
    )
    chat = srv.client().chat.completions.create(messages=CHAT_ANSWERED, tools=[GET_WEATHER], max_tokens=12, **GREEDY)
    whole = create(srv, messages=ANSWERED, tools=[WEATHER], max_tokens=12, **GREEDY)
    assert whole.content[0].thinking == chat.choices[0].message.to_dict()["reasoning_content"]
    prompt = srv.post("/apply-template", json.dumps({"messages": CHAT_ANSWERED, "tools": [GET_WEATHER]}).encode())[1]
    assert f"<think>\n{REASONING}\n</think>" in prompt["prompt"]


def test_thinking_is_a_thinking_block_streamed_or_not_and_can_be_turned_off(qwen35):
    """Qwen3.5's prompt opens a think block the tiny model never closes: the reply is one thinking
    block, its text the chat endpoint's reasoning_content, its signature empty, streamed as
    thinking deltas and a signature before its end. thinking disabled is enable_thinking false."""
    _, srv = qwen35
    chat = srv.client().chat.completions.create(messages=ASK, max_tokens=12, **GREEDY)
    request = dict(messages=ASK, max_tokens=12, thinking={"type": "enabled", "budget_tokens": 1024}, **GREEDY)
    whole = create(srv, **request)
    assert [block.type for block in whole.content] == ["thinking"] and whole.content[0].signature == ""
    assert whole.content[0].thinking == chat.choices[0].message.to_dict()["reasoning_content"]
    with client(srv).messages.stream(**sdk(request)) as stream:
        assert stream.get_final_message().content == whole.content
    raw = events(srv, request)
    assert kinds(raw) == [
        "message_start", "content_block_start", "thinking_delta", "signature_delta", "content_block_stop",
        "message_delta", "message_stop",
    ]  # fmt: skip
    assert raw[1]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    assert streamed_text(raw, "thinking_delta", "thinking") == whole.content[0].thinking
    off = srv.client().chat.completions.create(messages=ASK, max_tokens=12, extra_body=NO_THINKING, **GREEDY)
    disabled = create(srv, messages=ASK, max_tokens=12, thinking={"type": "disabled"}, **GREEDY)
    assert [block.type for block in disabled.content] == ["text"]
    assert disabled.content[0].text == off.choices[0].message.content


CALL_JSON = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
TEXT_CALL_TEXT = f"Let me check.\n<tool_call>\n{CALL_JSON}\n</tool_call>\nIt may rain: take a coat."


def read_in(srv, pieces: list[str], result) -> tuple[list[dict], ChatReply]:
    """A reply in these pieces, read by the reader serve makes for a Messages request offering
    get_weather, and streamed as the generation of `result`: the events, and the reader."""
    chat = parse_messages(json.dumps({"messages": ASK, "tools": [WEATHER], "max_tokens": 9}).encode())
    _, read = srv.worker.render_chat(chat)
    return replayed(MessageReply(True, "tiny"), read, pieces, result), read


def blocks_of(streamed: list[dict]) -> list[dict]:
    """The content blocks a stream makes, as Anthropic's clients put them together."""
    blocks: list[dict] = []
    for e in streamed:
        if e["type"] == "content_block_start":
            assert e["index"] == len(blocks)
            blocks.append(dict(e["content_block"]))
        elif e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta":
            blocks[e["index"]]["text"] += e["delta"]["text"]
        elif e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta":
            blocks[e["index"]]["input"] = json.loads(e["delta"]["partial_json"])
    return blocks


def test_text_after_a_call_is_a_new_text_block_streamed_or_not(qwen25):
    """Text, a call in Qwen2.5's markup, text: a text block, the call's tool_use block (its input
    the reader's call's arguments), a new text block, in that order, at any split of the reply;
    each block stopped before the next starts; the whole message's blocks are the stream's."""
    engine, srv = qwen25
    result = engine.generate("x", max_tokens=2, temperature=0, drafter="none")
    result = dataclasses.replace(result, stop_reason="eos")
    text = TEXT_CALL_TEXT
    for pieces in [[text], list(text)] + [[text[:cut], text[cut:]] for cut in range(len(text) + 1)]:
        streamed, read = read_in(srv, pieces, result)
        (call,) = read.message()["tool_calls"]
        arguments = json.loads(call["function"]["arguments"])
        blocks = blocks_of(streamed)
        assert blocks == [
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": call["id"], "name": "get_weather", "input": arguments},
            {"type": "text", "text": "It may rain: take a coat."},
        ], pieces  # fmt: skip
        assert kinds(streamed) == [
            "message_start", "content_block_start", "text_delta", "content_block_stop",
            "content_block_start", "input_json_delta", "content_block_stop",
            "content_block_start", "text_delta", "content_block_stop", "message_delta", "message_stop",
        ], pieces  # fmt: skip
        assert streamed[-2]["delta"]["stop_reason"] == "tool_use"
        whole = MessageReply(True, "tiny").complete(result, 0, read)
        assert whole["content"] == blocks and whole["stop_reason"] == "tool_use"


OUTPUT_SCHEMA = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Oslo"]}, "sunny": {"type": "boolean"}},
    "required": ["city", "sunny"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("field", ["output_config", "output_format"])
def test_a_json_schema_output_format_is_chats_response_format(qwen25, field):
    _, srv = qwen25
    response_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": OUTPUT_SCHEMA}}
    chat = srv.client().chat.completions.create(messages=ASK, max_tokens=80, response_format=response_format, **GREEDY)
    output_format = {"type": "json_schema", "schema": OUTPUT_SCHEMA}
    given = (
        {"output_config": {"format": output_format}} if field == "output_config" else {"output_format": output_format}
    )
    body = dict(messages=ASK, max_tokens=80, **GREEDY) | given
    status, whole = srv.post("/v1/messages", json.dumps(body).encode())
    assert status == 200 and whole["content"][0]["text"] == chat.choices[0].message.content
    assert set(json.loads(whole["content"][0]["text"])) == {"city", "sunny"}


TOO_MANY = [str(i) for i in range(65)]
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}}
DOCUMENT = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}
IMAGE_RESULT = {"type": "tool_result", "tool_use_id": "abc123XYZ", "content": [IMAGE]}
REFERENCE = {"type": "tool_reference", "tool_name": "get_weather"}  # Claude Code's tool search gives these
NOT_AN_OBJECT = {"type": "tool_use", "id": "a", "name": "get_weather", "input": "Paris"}
BAD_SCHEMA = {"type": "json_schema", "schema": {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}}


def user(*blocks: dict) -> dict:
    return {"role": "user", "content": list(blocks)}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"messages": ASK}, "max_tokens: Field required"),
        ({"max_tokens": 4}, "messages: Field required"),
        ({"max_tokens": 4, "messages": []}, "messages: give at least one message"),
        ({"max_tokens": 0, "messages": ASK}, "max_tokens: Input should be greater than or equal to 1"),
        ({"max_tokens": 4, "messages": ASK, "temperature": "hot"}, "temperature: Input should be a valid number"),
        (
            {"max_tokens": 4, "messages": [{"role": "tool", "content": "x"}]},
            "messages.0.role: Input should be 'user', 'assistant' or 'system'",
        ),
        (
            {"max_tokens": 4, "messages": [user({"type": "text", "text": "What is this?"}, IMAGE)]},
            "messages.0.content: Value error, content blocks of type 'image' are not supported by specllm serve: "
            "text only",
        ),
        (
            {"max_tokens": 4, "messages": [user(DOCUMENT)]},
            "messages.0.content: Value error, content blocks of type 'document' are not supported by specllm "
            "serve: text only",
        ),
        (
            {"max_tokens": 4, "messages": [ASK[0], ANSWERED[1], user(IMAGE_RESULT)]},
            "messages.2.content.0.content: Value error, content blocks of type 'image' are not supported by "
            "specllm serve: text only",
        ),
        (
            {"max_tokens": 4, "messages": [ASK[0], ANSWERED[1], user(dict(IMAGE_RESULT, content=[REFERENCE]))]},
            "messages.2.content.0.content: Value error, content blocks of type 'tool_reference' are not supported "
            "by specllm serve: text only",
        ),
        ({"max_tokens": 4, "messages": [user()]}, "messages.0.content: Value error, give at least one content block"),
        (
            {"max_tokens": 4, "messages": [user({"type": "search_result"})]},
            "messages.0.content: Value error, block 0 is a 'search_result' block, which specllm serve does not "
            "take (only text, tool_result, thinking, redacted_thinking, tool_use)",
        ),
        (
            {"max_tokens": 4, "messages": [{"role": "user", "content": [{"text": "no type"}]}]},
            "messages.0.content: Value error, block 0 has no type",
        ),
        (
            {"max_tokens": 4, "messages": [{"role": "user", "content": ANSWERED[1]["content"]}]},
            "messages.0: Value error, content.0: a thinking block belongs in a message of role assistant",
        ),
        (
            {"max_tokens": 4, "messages": [ASK[0], {"role": "assistant", "content": ANSWERED[2]["content"]}, ASK[0]]},
            "messages.1: Value error, content.0: a tool_result block belongs in a message of role user",
        ),
        (
            {"max_tokens": 4, "messages": [ASK[0], {"role": "assistant", "content": "It is"}]},
            "messages: the last message is the assistant's, which specllm serve does not continue (prefill): "
            "end with a user message",
        ),
        (
            {"max_tokens": 4, "messages": [ASK[0], {"role": "assistant", "content": [NOT_AN_OBJECT]}, ASK[0]]},
            "messages.1.content.0.input: Input should be an object",
        ),
        (
            {"max_tokens": 4, "messages": ASK, "tools": [dict(WEATHER, name="get weather")]},
            "tools.0.name: String should match pattern '^[A-Za-z0-9_-]{1,64}$'",
        ),
        ({"max_tokens": 4, "messages": ASK, "tools": [{"name": "f"}]}, "tools.0.input_schema: Field required"),
        ({"max_tokens": 4, "messages": ASK, "tools": [WEATHER, WEATHER]}, "tools: two tools have the same name"),
        (
            {"max_tokens": 4, "messages": ASK, "tools": [WEATHER], "tool_choice": {"type": "tool"}},
            "tool_choice: Value error, a tool_choice of type tool names the tool: give its name",
        ),
        (
            {"max_tokens": 4, "messages": ASK, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}},
            "tool_choice: no tool is named 'nope'",
        ),
        (
            {"max_tokens": 4, "messages": ASK, "tool_choice": {"type": "any"}},
            "tool_choice: a call is asked for but no tools are given",
        ),
        (
            {"max_tokens": 4, "messages": ASK, "tool_choice": {"type": "required"}},
            "tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'",
        ),
        (
            {"max_tokens": 4, "messages": ASK, "thinking": {"type": "maybe"}},
            "thinking.type: Input should be 'enabled', 'adaptive', 'disabled' or 'between_tools'",
        ),
        (
            {"max_tokens": 4, "messages": ASK, "thinking": {"type": "enabled", "budget_tokens": "lots"}},
            "thinking.budget_tokens: Input should be a valid integer",
        ),
        (
            {"max_tokens": 4, "messages": ASK, "stop_sequences": TOO_MANY},
            "stop_sequences: List should have at most 64 items after validation, not 65",
        ),
        (
            {"max_tokens": 4, "messages": ASK, "mcp_servers": [{"type": "url", "url": "https://x", "name": "x"}]},
            "mcp_servers is not supported by specllm serve",
        ),
        (
            {"max_tokens": 4, "messages": ASK, "output_config": {"format": BAD_SCHEMA}},
            "output_config.format.schema: the JSON schema's /properties/a/$ref #/$defs/missing points at nothing "
            'in it: no "$defs"',
        ),
        (
            {"max_tokens": 4, "messages": ASK, "output_format": BAD_SCHEMA, "output_config": {"format": BAD_SCHEMA}},
            "give output_config.format or output_format, not both",
        ),
        (
            {"max_tokens": 4, "messages": ASK, "drafter": "fast"},
            "unknown drafter 'fast': ask for drafter auto, ngram or none",
        ),
    ],
)
def test_bad_requests_get_one_anthropic_400(qwen25, body, message):
    _, srv = qwen25
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        if path.endswith("count_tokens") and message.startswith("max_tokens: Field"):
            continue  # count_tokens takes no max_tokens
        status, data = srv.post(path, json.dumps(body).encode())
        assert (status, data["type"], data["error"]["type"]) == (400, "error", "invalid_request_error"), data
        assert data["error"]["message"] == message
        assert set(data) == {"type", "error"} and set(data["error"]) == {"type", "message"}


def test_the_sdk_raises_a_refusal_as_a_bad_request(qwen25):
    _, srv = qwen25
    with pytest.raises(anthropic.BadRequestError, match="content blocks of type 'image' are not supported") as refused:
        create(srv, max_tokens=4, messages=[user(IMAGE)], model="x")
    assert refused.value.body["error"]["type"] == "invalid_request_error"


def test_the_http_layers_errors_are_in_anthropics_shape(qwen25):
    """A path or method the API lacks, a prompt longer than the context (said as Anthropic says it,
    which Claude Code reads to compact the conversation), a body too large; other paths keep
    OpenAI's shape."""
    engine, srv = qwen25
    status, data = srv.post("/v1/messages/batches", b"{}")
    assert (status, data["error"]["type"], data["error"]["message"]) == (
        404, "not_found_error", "Not Found: POST /v1/messages/batches")  # fmt: skip
    conn = http.client.HTTPConnection(urlsplit(srv.url).netloc, timeout=60)
    conn.request("GET", "/v1/messages")
    response = conn.getresponse()
    data = json.loads(response.read())
    assert (response.status, data["type"], data["error"]["type"]) == (405, "error", "invalid_request_error")
    long = [{"role": "user", "content": "weather " * 3000}]
    status, data = srv.post("/v1/messages", json.dumps({"messages": long, "max_tokens": 4}).encode())
    assert (status, data["error"]["type"]) == (400, "invalid_request_error")
    assert re.fullmatch(
        r"prompt is too long: the prompt is \d+ tokens but the context holds 2048", data["error"]["message"]
    )
    small = Server(engine, max_body_bytes=100)
    try:
        status, data = small.post("/v1/messages", json.dumps({"messages": long, "max_tokens": 4}).encode())
        assert (status, data["error"]["type"]) == (413, "request_too_large")
        assert data["error"]["message"] == "the request body is larger than 100 bytes"
    finally:
        small.stop()
    assert srv.post("/v1/nothing", b"{}")[1]["error"]["type"] == "invalid_request_error"  # OpenAI's shape
    assert "code" in srv.post("/v1/nothing", b"{}")[1]["error"]


def test_the_api_key_is_taken_as_x_api_key_or_a_bearer_token(qwen25):
    """With --api-key, the SDK's api_key (x-api-key, Claude Code's ANTHROPIC_API_KEY) and its
    auth_token (a bearer token, ANTHROPIC_AUTH_TOKEN) both work; a missing or wrong key is a 401
    in Anthropic's shape. Other endpoints take x-api-key too, as llama-server does."""
    engine, _ = qwen25
    keyed = Server(engine, api_key="s3cret")
    body = json.dumps({"messages": ASK, "max_tokens": 1}).encode()
    try:
        for key in ({"api_key": "s3cret"}, {"auth_token": "s3cret"}):
            assert client(keyed, **key).messages.create(messages=ASK, max_tokens=1, model="x").usage.output_tokens == 1
            assert client(keyed, **key).messages.count_tokens(messages=ASK, model="x").input_tokens > 0
        for key in ({"api_key": "wrong"}, {"auth_token": "wrong"}):
            with pytest.raises(anthropic.AuthenticationError):
                client(keyed, **key).messages.create(messages=ASK, max_tokens=1, model="x")
        message = "missing or wrong API key: send the header Authorization: Bearer KEY (or x-api-key: KEY)"
        for headers in ({}, {"x-api-key": "s3cret-not"}, {"Authorization": "Bearer s3cret-not"}):
            status, data = keyed.post("/v1/messages", body, headers)
            assert (status, data) == (
                401,
                {"type": "error", "error": {"type": "authentication_error", "message": message}},
            )
        assert keyed.post("/v1/messages", body, {"x-api-key": "s3cret", "Authorization": "Bearer -"})[0] == 200
        chat = json.dumps({"messages": ASK, "max_tokens": 1}).encode()
        assert keyed.post("/v1/chat/completions", chat, {"x-api-key": "s3cret"})[0] == 200
        status, data = keyed.post("/v1/chat/completions", chat)
        assert (status, data["error"]["code"]) == (401, "invalid_api_key")
    finally:
        keyed.stop()


def test_a_failure_under_way_is_an_error_event_or_a_500(tiny_models, tmp_path):
    """A model whose logits are NaN fails once under way: a 500 of type api_error, or, once the
    stream has begun, an `error` event that ends it, which the SDK raises."""
    broken = tm.with_nan_in(tiny_models.target, tmp_path / "broken.gguf", "output_norm.weight")
    engine = specllm.load(str(broken), n_ctx=2048, n_threads=1)
    srv = Server(engine)
    expected = "generation failed: the target model (broken.gguf) gave logits that are not finite numbers"
    try:
        status, data = srv.post("/v1/messages", json.dumps({"messages": ASK, "max_tokens": 4}).encode())
        assert (status, data["type"], data["error"]["type"]) == (500, "error", "api_error")
        assert data["error"]["message"].startswith(expected) and str(tmp_path) not in data["error"]["message"]
        raw = events(srv, {"messages": ASK, "max_tokens": 4})
        assert [e["type"] for e in raw] == ["message_start", "error"]
        assert raw[-1]["error"]["type"] == "api_error" and raw[-1]["error"]["message"].startswith(expected)
        stream = client(srv).messages.stream(messages=ASK, max_tokens=4, model="x")
        with pytest.raises(anthropic.APIStatusError, match=re.escape(expected)), stream as events_read:
            events_read.get_final_message()
    finally:
        srv.stop()
        engine.close()


def test_a_client_that_leaves_a_stream_stops_its_generation(qwen25, monkeypatch):
    """The chat endpoint's machinery serves the Messages API's streams: a client that goes away
    stops the generation (held after its first step here, so it cannot end first)."""
    engine, srv = qwen25
    body = {"messages": ASK, "max_tokens": 1000, "stream": True, **GREEDY}
    line = leave_a_stream(engine, srv, monkeypatch, "/v1/messages", body, b"event: message_start")
    assert "the client went away" in line and "stopped after" in line


def test_a_failure_event_is_anthropics_error():
    reply = MessageReply(True, "tiny")
    stopping = ApiError(503, "the server is shutting down")
    streamed = reply.opening() + reply.deltas([{"text": "Hel"}]) + reply.failure(stopping)
    assert streamed[-1] == {"type": "error", "error": {"type": "overloaded_error", "message": stopping.message}}
    assert reply.sse(streamed[-1]).startswith("event: error\ndata: {")


def test_a_users_text_after_its_tool_results_is_a_user_message_after_the_tool_messages(qwen25):
    """Anthropic has a user's tool_result blocks first, then its text: tool messages, then a user
    message, each in its place, as the chat endpoint renders them."""
    _, srv = qwen25
    result = ANSWERED[2]["content"][0]
    two = dict(result, tool_use_id="second", content="21 C")
    calls = [dict(CALL, id="second"), CALL]
    messages = [ASK[0], dict(ANSWERED[1], content=[dict(ANSWERED[1]["content"][1], id="second"),
                                                   ANSWERED[1]["content"][1]]),  # fmt: skip
                {"role": "user", "content": [two, result, {"type": "text", "text": "And tomorrow?"}]}]  # fmt: skip
    chat = [
        ASK[0], {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "second", "content": "21 C"}, CHAT_ANSWERED[2],
        {"role": "user", "content": "And tomorrow?"},
    ]  # fmt: skip
    whole = create(srv, messages=messages, tools=[WEATHER], max_tokens=12, **GREEDY)
    reply = srv.client().chat.completions.create(messages=chat, tools=[GET_WEATHER], max_tokens=12, **GREEDY)
    assert whole.content[0].text == reply.choices[0].message.content
    assert whole.usage.input_tokens == reply.usage.prompt_tokens
    user_first = [chat[0], chat[1], chat[4], chat[2], chat[3]]  # llama-server's order: the text before the results
    other = srv.client().chat.completions.create(messages=user_first, tools=[GET_WEATHER], max_tokens=12, **GREEDY)
    assert whole.content[0].text != other.choices[0].message.content


def test_consecutive_messages_of_one_role_are_one_turn(qwen25):
    """Anthropic combines consecutive messages of one role: two user messages are one, its texts
    joined as a message's text blocks are."""
    _, srv = qwen25
    split = [{"role": "user", "content": "What is the weather"}, {"role": "user", "content": "in Paris?"}]
    counted = client(srv).messages.count_tokens(model="x", messages=split).input_tokens
    joined = [{"role": "user", "content": [{"type": "text", "text": "What is the weather"},
                                           {"type": "text", "text": "in Paris?"}]}]  # fmt: skip
    assert counted == prompt_tokens(srv, joined) != prompt_tokens(srv, split)


# Claude Code's request (2.1.332, `claude -p "Say hello"`, as it sent it to a server of serve's):
# the system prompt in blocks (its billing header first, without a stamp in this version), the
# environment as a message of role system after the first user message, custom tools with JSON
# schemas of draft 2020-12, adaptive thinking to be omitted, effort, context management, metadata;
# the tools and texts cut short here.
CLAUDE_CODE = {
    "model": "specllm",
    "messages": [
        {"role": "user", "content": [
            {"type": "text", "text": "<system-reminder>\nAttribution for git commits ...\n</system-reminder>"},
            {"type": "text", "text": "Say hello"},
        ]},
        {"role": "system", "content": [{"type": "text", "text": "# Environment\n - Platform: linux"}]},
    ],
    "system": [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332.1c9; cc_entrypoint=sdk-cli;"},
        {"type": "text", "text": "You are a Claude agent, built on Anthropic's Claude Agent SDK.",
         "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "\nYou are an agent working with the user toward their goals.",
         "cache_control": {"type": "ephemeral"}},
    ],
    "tools": [
        {"name": "Bash", "description": "Executes a bash command and returns its output.", "input_schema": {
            "$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
            "properties": {"command": {"description": "The command to execute", "type": "string"},
                           "timeout": {"description": "Optional timeout in milliseconds", "type": "number"}},
            "required": ["command"], "additionalProperties": False}},
        {"name": "Read", "description": "Reads a file from the local filesystem.", "input_schema": {
            "$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
            "properties": {"file_path": {"description": "The absolute path to the file to read", "type": "string"},
                           "limit": {"type": "integer", "exclusiveMinimum": 0, "maximum": 9007199254740991}},
            "required": ["file_path"], "additionalProperties": False}},
    ],
    "metadata": {"user_id": '{"device_id":"01db","account_uuid":"","session_id":"0c4b"}'},
    "max_tokens": 32000,
    "thinking": {"type": "adaptive", "display": "omitted"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "output_config": {"effort": "high"},
    "stream": True,
}  # fmt: skip


def test_claude_codes_request_gets_the_stream_it_reads(strict):
    """Claude Code's request, on a template that takes a system message at the start only: its
    environment, sent as a message of role system, is the system message's last part (the chat
    endpoint refuses it where it was sent, in the template's words); the streamed reply is the chat
    endpoint's (greedy here, to compare: Claude Code sends no temperature), words or calls."""
    _, srv = strict
    raw = events(srv, CLAUDE_CODE | {"temperature": 0})
    system = [{"type": "text", "text": block["text"]} for block in CLAUDE_CODE["system"]]
    environment = CLAUDE_CODE["messages"][1]
    as_chat = [{"role": "system", "content": system + environment["content"]}, CLAUDE_CODE["messages"][0]]
    tools = [as_function(tool) for tool in CLAUDE_CODE["tools"]]
    chat = srv.client().chat.completions.create(messages=as_chat, tools=tools, max_tokens=32000, **GREEDY)
    message = chat.choices[0].message
    expected = [{"type": "text", "text": message.content}] if message.content else []
    expected += [{"type": "tool_use", "name": n, "input": i} for n, i in map(as_tool_use, message.tool_calls or ())]
    assert [{k: v for k, v in block.items() if k != "id"} for block in blocks_of(raw)] == expected
    reasons = {"stop": "end_turn", "tool_calls": "tool_use", "length": "model_context_window_exceeded"}
    assert raw[-2]["delta"]["stop_reason"] == reasons[chat.choices[0].finish_reason]
    assert raw[-1] == {"type": "message_stop"}
    tokens = chat.usage.prompt_tokens
    assert raw[0]["message"]["usage"]["input_tokens"] == tokens
    counted = srv.post("/v1/messages/count_tokens", json.dumps(CLAUDE_CODE).encode())
    assert counted == (200, {"input_tokens": tokens})
    in_place = [{"role": "system", "content": system}, *CLAUDE_CODE["messages"]]
    status, data = srv.post("/v1/chat/completions", json.dumps({"messages": in_place, "max_tokens": 1}).encode())
    assert status == 400 and "System message must be at the beginning." in data["error"]["message"]
