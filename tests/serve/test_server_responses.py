"""The Responses API (`POST /v1/responses`) in `specllm serve`, with the real `openai` client and
raw requests, on tiny models with Qwen2.5's chat template (its replies are noise: text, no
finished call) and Qwen3.5's (its generation prompt opens a think block the noise never closes:
all of it is reasoning). A request is translated into a chat request, so a reply is compared with
the chat endpoint's to the same conversation, token for token; a call, which the tiny models never
finish, is read from a fixed reply. Codex CLI's and the Agents SDK's requests are replayed as their
code builds them."""

import dataclasses
import json

import pytest
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

from specllm.serve.openai_api import ApiError, ChatReply, ChatRequest, Reply, ToolReply
from specllm.serve.responses_api import ResponseReply, parse_responses

GREEDY = dict(model="x", temperature=0)
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city", "parameters": PARAMETERS}
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def qwen25(tmp_path_factory):
    yield from templated_server(tmp_path_factory, "qwen25", tool_templates.QWEN25, vocab="code")


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory):
    yield from templated_server(tmp_path_factory, "qwen35", tool_templates.QWEN35)


def events(srv, body: dict, path: str = "/v1/responses") -> list[dict]:
    """A streamed response's events, raw: each one's `event:` line must name its data's type."""
    read = srv.post_named_events(path, body)
    assert [e["sequence_number"] for e in read] == list(range(len(read)))
    return read


def kinds(streamed: list[dict]) -> list[str]:
    """The events' types, a run of deltas as one."""
    types = [e["type"] for e in streamed]
    return [t for i, t in enumerate(types) if not (t.endswith(".delta") and i and types[i - 1] == t)]


TEXT_EVENTS = [
    "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
    "response.output_text.delta", "response.output_text.done", "response.content_part.done",
    "response.output_item.done",
]  # fmt: skip


def test_a_text_reply_is_the_chat_endpoints_streamed_or_not(qwen25):
    """instructions and input are the chat's system and user messages: the same greedy reply, cut
    by max_output_tokens, which makes the response incomplete; its usage is the chat's."""
    _, srv = qwen25
    client = srv.client()
    messages = [{"role": "system", "content": "Be brief."}, *ASK]
    chat = client.chat.completions.create(messages=messages, max_tokens=12, **GREEDY)
    request = dict(instructions="Be brief.", input=ASK[0]["content"], max_output_tokens=12, **GREEDY)
    whole = client.responses.create(**request)
    assert whole.id.startswith("resp_") and whole.object == "response" and whole.model == "tiny"
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
    (message,) = whole.output
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert message.content[0].type == "output_text" and whole.output_text == chat.choices[0].message.content
    usage = whole.usage
    assert (usage.input_tokens, usage.output_tokens) == (chat.usage.prompt_tokens, 12)
    assert usage.total_tokens == usage.input_tokens + 12 and usage.output_tokens_details.reasoning_tokens == 0
    streamed = list(client.responses.create(**request, stream=True))
    assert [e.type for e in streamed][-1] == "response.incomplete"
    assert "".join(e.delta for e in streamed if e.type == "response.output_text.delta") == whole.output_text
    assert streamed[-1].response.output_text == whole.output_text
    assert streamed[-1].response.output[0].status == "incomplete"
    raw = events(srv, request)
    assert kinds(raw) == [*TEXT_EVENTS, "response.incomplete"]
    added, done = raw[2], raw[-2]
    assert added["item"]["id"] == done["item"]["id"] and added["output_index"] == done["output_index"] == 0


OUTPUT_TYPE = {  # the Agents SDK's output_type, a pydantic model, as its schema reaches text.format
    "type": "json_schema",
    "name": "final_output",
    "schema": {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Oslo"]}, "sunny": {"type": "boolean"}},
        "required": ["city", "sunny"],
        "additionalProperties": False,
    },
    "strict": True,
}


@pytest.mark.parametrize("text_format", [OUTPUT_TYPE, {"type": "json_object"}])
def test_text_format_is_chats_response_format(qwen25, text_format):
    """Structured output: text.format is the chat endpoint's response_format, the same reply token
    for token; the response repeats the format it was given."""
    _, srv = qwen25
    client = srv.client()
    response_format = (
        {"type": "json_schema", "json_schema": {k: text_format[k] for k in ("name", "schema", "strict")}}
        if text_format["type"] == "json_schema"
        else text_format
    )
    chat = client.chat.completions.create(messages=ASK, max_tokens=80, response_format=response_format, **GREEDY)
    request = dict(input=ASK[0]["content"], text={"format": text_format}, **GREEDY)
    whole = client.responses.create(max_output_tokens=80, **request)
    assert whole.status == "completed" and whole.output_text == chat.choices[0].message.content
    value = json.loads(whole.output_text)
    assert isinstance(value, dict)
    if text_format is OUTPUT_TYPE:
        assert set(value) == {"city", "sunny"} and value["city"] in ("Paris", "Oslo")
        assert isinstance(value["sunny"], bool)
    assert whole.text.format.type == text_format["type"]
    streamed = list(client.responses.create(max_output_tokens=80, stream=True, **request))
    assert streamed[-1].response.output_text == whole.output_text


def test_a_reply_ended_by_a_stop_string_is_completed(qwen25):
    """A reply that ends before its limit (here at a stop string, which the chat endpoint takes
    and the translation passes on) is completed, its items too."""
    _, srv = qwen25
    text = srv.client().responses.create(input="Hi", max_output_tokens=12, **GREEDY).output_text
    request = dict(input="Hi", max_output_tokens=12, stop=[text[4:7]], **GREEDY)
    status, whole = srv.post("/v1/responses", json.dumps(request).encode())
    assert status == 200 and whole["status"] == "completed" and whole["incomplete_details"] is None
    assert whole["output_text"] == text[: text.index(text[4:7])] and whole["output"][0]["status"] == "completed"
    raw = events(srv, request)
    assert kinds(raw) == [*TEXT_EVENTS, "response.completed"]
    assert raw[-1]["response"]["output"] == [dict(whole["output"][0], id=raw[2]["item"]["id"])]


def test_reasoning_is_a_reasoning_item_streamed_or_not(qwen35):
    """The prompt opens a think block the reply never closes: the reply is one reasoning item,
    its text the chat endpoint's reasoning_content, streamed as reasoning_text deltas."""
    _, srv = qwen35
    client = srv.client()
    chat = client.chat.completions.create(messages=ASK, max_tokens=12, **GREEDY)
    request = dict(input=ASK, max_output_tokens=12, **GREEDY)
    whole = client.responses.create(**request)
    (item,) = whole.output
    assert item.type == "reasoning" and item.id.startswith("rs_") and item.summary == []
    assert item.content[0].text == chat.choices[0].message.to_dict()["reasoning_content"]
    assert whole.output_text == "" and item.status == "incomplete"  # cut in its reasoning
    raw = events(srv, request)
    (streamed,) = raw[-1]["response"]["output"]
    assert streamed == dict(whole.to_dict()["output"][0], id=streamed["id"])
    assert kinds(raw) == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done",
        "response.output_item.done", "response.incomplete",
    ]  # fmt: skip
    assert "".join(e["delta"] for e in raw if e["type"] == "response.reasoning_text.delta") == item.content[0].text


CALL_ITEM = {"type": "function_call", "call_id": "abc123XYZ", "name": "get_weather", "arguments": '{"city": "Paris"}'}
ANSWERED = [
    {"role": "user", "content": [{"type": "input_text", "text": ASK[0]["content"]}]},
    {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Paris: ask the tool."}]},
    CALL_ITEM,
    {"type": "function_call_output", "call_id": "abc123XYZ", "output": "18 C"},
]


def test_a_call_its_reasoning_and_its_output_go_back_to_the_template(qwen35):
    """An assistant's reasoning and call items are one assistant message, with its reasoning and
    its call, and the call's output a tool message: the prompt the chat endpoint renders for
    them, its reply the same."""
    engine, srv = qwen35
    client = srv.client()
    messages = [
        ASK[0],
        {"role": "assistant", "content": "", "reasoning_content": "Paris: ask the tool.", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "abc123XYZ", "content": "18 C"},
    ]  # fmt: skip
    chat = client.chat.completions.create(messages=messages, tools=[GET_WEATHER], max_tokens=12, **GREEDY)
    whole = client.responses.create(input=ANSWERED, tools=[WEATHER], max_output_tokens=12, **GREEDY)
    assert whole.usage.input_tokens == chat.usage.prompt_tokens
    assert whole.output[0].content[0].text == chat.choices[0].message.to_dict()["reasoning_content"]
    rendered = dict(messages[1], tool_calls=[{**messages[1]["tool_calls"][0], "function": {
        "name": "get_weather", "arguments": {"city": "Paris"}}}])  # fmt: skip
    prompt = engine.target.render_chat([ASK[0], rendered, messages[2]], tools=[GET_WEATHER])
    assert "<think>\nParis: ask the tool.\n</think>" in prompt
    assert whole.usage.input_tokens == len(engine.prompt_tokens(prompt))


def test_an_assistants_reasoning_items_in_a_row_are_all_its_reasoning():
    """A turn that reasoned, answered and reasoned again before its call (a stream gives a new
    reasoning item after text) is one assistant message: no reasoning item is lost."""
    reasoning = [{"type": "reasoning", "content": [{"type": "reasoning_text", "text": text}]} for text in ("A", "B")]
    turn = [reasoning[0], {"role": "assistant", "content": "Let me check."}, reasoning[1], CALL_ITEM]
    chat = parse_responses(json.dumps({"input": [ASK[0], *turn]}).encode())
    assistant = chat.model_dump(exclude_none=True)["messages"][1]
    assert (assistant["reasoning_content"], assistant["content"]) == ("A\nB", "Let me check.")
    assert [call["id"] for call in assistant["tool_calls"]] == ["abc123XYZ"]


@pytest.mark.parametrize("arguments", ["not json", "[1]"])
def test_a_call_whose_arguments_its_template_cannot_read_is_named_as_sent(qwen35, arguments):
    """Qwen3.5's template reads a call's arguments as an object: the 400 names the input item,
    not the chat request's field it was translated into (messages.1.tool_calls.0...)."""
    _, srv = qwen35
    bad = dict(CALL_ITEM, call_id="second", arguments=arguments)
    body = {"input": [*ANSWERED, bad, {"type": "function_call_output", "call_id": "second", "output": "?"}]}
    status, data = srv.post("/v1/responses", json.dumps(body | {"tools": [WEATHER]}).encode())
    assert status == 400 and data["error"]["param"] == "input.4.arguments"
    assert data["error"]["message"].startswith("input.4.arguments must be a JSON object for this model's chat template")


def test_a_named_call_begins_the_reply_as_the_chat_endpoints_does(qwen25):
    """tool_choice naming a function begins the call in the prompt; the tiny model leaves it
    unfinished, so it comes back as the text it is, as from the chat endpoint. Tools the model
    cannot call through its template (web_search) are left out of what it is shown."""
    _, srv = qwen25
    client = srv.client()
    named = {"type": "function", "function": {"name": "get_weather"}}
    chat = client.chat.completions.create(messages=ASK, tools=[GET_WEATHER], tool_choice=named, max_tokens=12, **GREEDY)
    whole = client.responses.create(
        input=ASK, tools=[WEATHER, {"type": "web_search"}], tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=12, **GREEDY,
    )  # fmt: skip
    assert whole.output_text == chat.choices[0].message.content
    assert whole.output_text.startswith('<tool_call>\n{"name": "get_weather", "arguments": ')
    assert whole.usage.input_tokens == chat.usage.prompt_tokens
    assert [tool.type for tool in whole.tools] == ["function", "web_search"]


CALL_JSON = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
REPLY_WITH_A_CALL = f"Let me check.\n<tool_call>\n{CALL_JSON}\n</tool_call>"


def test_a_call_is_a_function_call_item_streamed_or_not(qwen25):
    """A reply with text and a call, read as the chat endpoint reads it: a message item, then a
    function_call item whose call_id is the call's id, streamed with its arguments' events; the
    whole response's items are the stream's."""
    engine, _ = qwen25
    result = engine.generate("x", max_tokens=2, temperature=0, drafter="none")
    result = dataclasses.replace(result, stop_reason="eos")
    read = ChatReply(False, ToolReply(["get_weather"]))
    reply = ResponseReply(True, "tiny")
    streamed = reply.opening()
    for cut in range(0, len(REPLY_WITH_A_CALL), 9):
        streamed += reply.deltas(read.feed(REPLY_WITH_A_CALL[cut : cut + 9]))
    streamed += reply.deltas(read.finish()) + reply.closing(result, 0, read, False)
    assert [e["sequence_number"] for e in streamed] == list(range(len(streamed)))
    assert kinds(streamed) == [
        *TEXT_EVENTS, "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed",
    ]  # fmt: skip
    message, call = streamed[-1]["response"]["output"]
    assert message["content"][0]["text"] == "Let me check."
    call_id = read.message()["tool_calls"][0]["id"]
    assert call == {
        "id": f"fc_{call_id}", "type": "function_call", "status": "completed", "call_id": call_id,
        "name": "get_weather", "arguments": '{"city": "Paris"}',
    }  # fmt: skip
    assert streamed[-2]["item"] == call and streamed[-3]["arguments"] == call["arguments"]
    whole = ResponseReply(True, "tiny").complete(result, 0, read)
    assert whole["status"] == "completed" and [item["type"] for item in whole["output"]] == ["message", "function_call"]
    assert whole["output"][1] == call and whole["output_text"] == "Let me check."


TEXT_CALL_TEXT = f"Let me check.\n<tool_call>\n{CALL_JSON}\n</tool_call>\nIt may rain: take a coat."
CALL_EVENTS = [
    "response.output_item.added", "response.function_call_arguments.delta",
    "response.function_call_arguments.done", "response.output_item.done",
]  # fmt: skip


def without_ids(output: list[dict]) -> list[dict]:
    return [{k: v for k, v in item.items() if k != "id"} for item in output]


def read_in(srv, pieces: list[str], result) -> tuple[list[dict], ChatReply]:
    """A reply in these pieces, read by the reader serve makes for a Responses request offering
    get_weather, and streamed as the generation of `result`: the events, and the reader."""
    chat = parse_responses(json.dumps({"input": ASK[0]["content"], "tools": [WEATHER]}).encode())
    _, read = srv.worker.render_chat(chat)
    return replayed(ResponseReply(True, "tiny"), read, pieces, result), read


def test_text_after_a_call_is_a_new_message_item_streamed_or_not(qwen25):
    """Text, a call, text: a message item, the call's item, a new message item, in that order, at
    any split of the reply; the whole response lists the items the stream does."""
    engine, srv = qwen25
    result = engine.generate("x", max_tokens=2, temperature=0, drafter="none")
    result = dataclasses.replace(result, stop_reason="eos")
    text = TEXT_CALL_TEXT
    splits = [[text], list(text)] + [[text[:cut], text[cut:]] for cut in range(len(text) + 1)]
    for pieces in splits:
        streamed, read = read_in(srv, pieces, result)
        assert kinds(streamed) == [*TEXT_EVENTS, *CALL_EVENTS, *TEXT_EVENTS[2:], "response.completed"], pieces
        output = streamed[-1]["response"]["output"]
        assert [item["type"] for item in output] == ["message", "function_call", "message"]
        texts = [item["content"][0]["text"] for item in output if item["type"] == "message"]
        assert texts == ["Let me check.", "It may rain: take a coat."]
        assert [e["output_index"] for e in streamed if e["type"] == "response.output_text.delta"][-1] == 2
        whole = ResponseReply(True, "tiny").complete(result, 0, read)
        assert without_ids(whole["output"]) == without_ids(output) and whole["output"][1] == output[1]
        assert whole["output_text"] == "Let me check.It may rain: take a coat."


def test_a_chat_stream_keeps_text_after_a_call_after_it(qwen25):
    """The chat endpoint's chunks, where one step decides text, a call and text after it: a chunk
    of the text and the call (a chunk's content comes before its calls), then one of the text
    after the call; joined, they are the message."""
    _, srv = qwen25
    request = ChatRequest.model_validate({"model": "x", "messages": ASK, "tools": [GET_WEATHER]})
    _, read = srv.worker.render_chat(request)
    chunks = Reply(True, "tiny").deltas(read.feed(TEXT_CALL_TEXT) + read.finish())
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks]
    assert [list(delta) for delta in deltas] == [["content", "tool_calls"], ["content"]]
    message = read.message()
    assert deltas[0]["content"] + deltas[1]["content"] == message["content"]
    assert message["content"] == "Let me check.\n\nIt may rain: take a coat."  # the whitespace around the call kept
    assert deltas[0]["tool_calls"] == [dict(call, index=0) for call in message["tool_calls"]]


def test_reasoning_tokens_are_counted_in_usage(qwen35):
    """Qwen3.5's prompt opens a think block the tiny model never closes: every token is reasoning,
    in the chat's usage and the response's, streamed or not; without thinking, or with a call the
    prompt begins after closing the block (tool_choice required), none is."""
    _, srv = qwen35
    client = srv.client()
    chat = client.chat.completions.create(messages=ASK, max_tokens=12, **GREEDY)
    assert chat.usage.completion_tokens == chat.usage.completion_tokens_details.reasoning_tokens == 12
    chunks = list(client.chat.completions.create(messages=ASK, max_tokens=12, stream=True,
                                                 stream_options={"include_usage": True}, **GREEDY))  # fmt: skip
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == 12
    whole = client.responses.create(input=ASK, max_output_tokens=12, **GREEDY)
    assert whole.usage.output_tokens == whole.usage.output_tokens_details.reasoning_tokens == 12
    raw = events(srv, dict(input=ASK, max_output_tokens=12, **GREEDY))
    assert raw[-1]["response"]["usage"]["output_tokens_details"] == {"reasoning_tokens": 12}
    off = client.chat.completions.create(messages=ASK, max_tokens=12, extra_body=NO_THINKING, **GREEDY)
    assert off.usage.completion_tokens == 12 and off.usage.completion_tokens_details.reasoning_tokens == 0
    forced = client.responses.create(
        input=ASK, tools=[WEATHER], tool_choice="required", max_output_tokens=12, **GREEDY
    )  # fmt: skip
    assert forced.usage.output_tokens == 12 and forced.usage.output_tokens_details.reasoning_tokens == 0
    assert [item.type for item in forced.output] == ["message"]  # the unfinished call, as text


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"model": "x"}, "input", "input: Field required"),
        ({"input": 5}, "input", "input: Input should be a valid string"),
        ({"input": []}, "input", "input: give at least one item"),
        (
            {"input": [{"type": "web_search_call", "id": "ws_1"}]},
            "input",
            "input: Value error, input.0 is a 'web_search_call' item, which specllm serve does not take "
            "(only message, function_call, function_call_output, reasoning)",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]},
            "input",
            "input.0.content: Value error, content parts of type 'input_image' are not supported by specllm serve: "
            "text only",
        ),
        (
            {"input": [{"role": "tool", "content": "x"}]},
            "input",
            "input.0.role: Input should be 'user', 'system', 'developer' or 'assistant'",
        ),  # fmt: skip
        ({"input": [{"type": "function_call", "name": "f"}]}, "input", "input.0.call_id: Field required"),
        (
            {"input": "x", "previous_response_id": "resp_1"},
            "previous_response_id",
            "previous_response_id is not supported by specllm serve: it keeps no responses; send the whole "
            "conversation as input",
        ),
        ({"input": "x", "conversation": "conv_1"}, "conversation", "conversation is not supported by specllm serve"),
        ({"input": "x", "background": True}, "background", "background is not supported by specllm serve"),
        ({"input": "x", "truncation": "auto"}, "truncation", "truncation is not supported by specllm serve"),
        (
            {"input": "x", "text": {"format": {"type": "grammar"}}},
            "text.format.type",
            "text.format.type: Input should be 'text', 'json_object' or 'json_schema'",
        ),
        (
            {"input": "x", "include": ["message.output_text.logprobs"]},
            "include",
            "include: message.output_text.logprobs is not supported by specllm serve",
        ),
        (
            {"input": "x", "max_output_tokens": 0},
            "max_output_tokens",
            "max_output_tokens: Input should be greater than or equal to 1",
        ),  # fmt: skip
        ({"input": "x", "temperature": "hot"}, "temperature", "temperature: Input should be a valid number"),
        (
            {"input": "x", "reasoning": {"effort": " "}},
            "reasoning.effort",
            "reasoning.effort: give a level (low, medium, high) or none",
        ),  # fmt: skip
        ({"input": "x", "tools": [WEATHER, WEATHER]}, "tools", "tools: two tools have the same name"),
        (
            {"input": "x", "tool_choice": {"type": "function", "name": "nope"}, "tools": [WEATHER]},
            "tool_choice",
            "tool_choice: no tool is named 'nope'",
        ),
        (
            {"input": "x", "tools": [{"type": "function", "name": "a b"}]},
            "tools.0.name",
            "tools.0.name: String should match pattern '^[A-Za-z0-9_-]{1,64}$'",
        ),  # fmt: skip
        ({"input": "x", "drafter": "fast"}, "drafter", "unknown drafter 'fast': ask for drafter auto, ngram or none"),
    ],
)
def test_bad_requests_get_one_line_400s(qwen25, body, param, message):
    _, srv = qwen25
    status, data = srv.post("/v1/responses", json.dumps(body).encode())
    assert status == 400 and data["error"]["type"] == "invalid_request_error"
    assert (data["error"]["param"], data["error"]["message"]) == (param, message)


# Schemas are the client's JSON, which serve passes to the template unchecked: these are odd, not
# wrong enough for a 400 (the chat endpoint took them too), and no reason for a 500.
ODD_PARAMETERS = [
    {"type": "object", "properties": ["city"]},
    {"type": "object", "properties": "city"},
    {"type": "object", "properties": {"city": {"type": ["string", {"format": "x"}]}}},
    {"type": "object", "properties": {"city": {"type": [["string"]]}}},
]


@pytest.mark.parametrize("parameters", ODD_PARAMETERS)
def test_a_tool_of_an_odd_schema_is_offered_as_the_chat_endpoint_offers_it(qwen25, parameters):
    _, srv = qwen25
    tool = {"type": "function", "name": "get_weather", "parameters": parameters}
    chat_tool = {"type": "function", "function": {"name": "get_weather", "parameters": parameters}}
    chat = {"messages": ASK, "tools": [chat_tool], "max_tokens": 2, **GREEDY}
    status, chatted = srv.post("/v1/chat/completions", json.dumps(chat).encode())
    body = {"input": ASK[0]["content"], "tools": [tool], "max_output_tokens": 2, **GREEDY}
    status_r, responded = srv.post("/v1/responses", json.dumps(body).encode())
    assert (status, status_r) == (200, 200)
    assert responded["output_text"] == chatted["choices"][0]["message"]["content"]


def test_a_failure_under_way_ends_the_stream_with_response_failed():
    """A generation that fails once under way ends the stream with response.failed, its error
    the message, the item under way closed as incomplete."""
    reply = ResponseReply(True, "tiny")
    streamed = reply.opening() + reply.deltas([{"text": "Hel"}])
    streamed += reply.failure(ApiError(500, "generation failed: out of memory"))
    assert kinds(streamed)[-4:] == [
        "response.output_text.done", "response.content_part.done", "response.output_item.done", "response.failed",
    ]  # fmt: skip
    failed = streamed[-1]["response"]
    assert failed["status"] == "failed" and failed["output"][0]["status"] == "incomplete"
    assert failed["error"] == {"code": "server_error", "message": "generation failed: out of memory"}


# Codex CLI's request: codex-rs/codex-api/src/common.rs (ResponsesApiRequest) with its items as
# codex-rs/protocol/src/models.rs serializes them (ResponseItem: a message's id is not sent, a
# reasoning item's content only when it holds reasoning_text, encrypted_content null), its tools
# as codex-rs/core/src/tools/spec.rs writes them (functions, web_search, the freeform apply_patch).
CODEX = {
    "model": "specllm",
    "instructions": "You are Codex, a coding agent.",
    "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<permissions/>"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is in a.py?"}]},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Read it."}],
         "encrypted_content": None},
        {"type": "function_call", "name": "shell", "arguments": '{"command": ["cat", "a.py"]}', "call_id": "call_1"},
        {"type": "function_call_output", "call_id": "call_1", "output": "x = 1\n"},
    ],
    "tools": [
        {"type": "function", "name": "shell", "description": "Runs a shell command", "strict": False,
         "parameters": {"type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}}},
                        "required": ["command"], "additionalProperties": False}},
        {"type": "web_search", "external_web_access": False},
        {"type": "custom", "name": "apply_patch", "description": "Edit files",
         "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
    ],
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "reasoning": {"effort": "medium", "summary": "auto"},
    "store": False,
    "stream": True,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "0199a0a0-0000-7000-8000-000000000000",
    "text": {"verbosity": "medium"},
}  # fmt: skip


def test_codex_clis_request_gets_the_events_it_reads(qwen25):
    """What Codex reads (codex-rs/codex-api/src/sse/responses.rs, process_sse): response.created,
    each output_item.done's item as a ResponseItem (a message: role and output_text parts),
    output_text deltas, and the terminal event's response with its id and usage. It sends no
    max_output_tokens; one here ends the tiny model's noise."""
    _, srv = qwen25
    raw = events(srv, CODEX | {"max_output_tokens": 8})
    assert raw[0]["type"] == "response.created" and raw[0]["response"]["id"].startswith("resp_")
    done = [e["item"] for e in raw if e["type"] == "response.output_item.done"]
    assert [(item["type"], item["role"], item["content"][0]["type"]) for item in done] == [
        ("message", "assistant", "output_text")
    ]
    last = raw[-1]["response"]
    assert last["id"] == raw[0]["response"]["id"] and last["usage"]["output_tokens"] == 8
    assert set(last["usage"]) >= {"input_tokens", "input_tokens_details", "output_tokens", "total_tokens"}
    assert [tool["type"] for tool in last["tools"]] == ["function", "web_search", "custom"]


# The Agents SDK's request: src/agents/models/openai_responses.py (_build_response_create_kwargs),
# its function tools as Converter.convert_tools writes them (strict, additionalProperties false),
# the next turn's input the previous response's output items as the SDK gives them back
# (model_dump: ids, statuses, annotations) and the call's output; include an empty list.
AGENT_TOOL = {
    "name": "get_weather", "parameters": PARAMETERS | {"additionalProperties": False}, "strict": True,
    "type": "function", "description": "The weather in a city",
}  # fmt: skip
AGENTS_SDK = {
    "instructions": "You are a helpful agent.",
    "model": "specllm",
    "input": [
        {"content": ASK[0]["content"], "role": "user"},
        CALL_ITEM | {"id": "fc_abc123XYZ", "status": "completed"},
        {"call_id": "abc123XYZ", "output": "18 C", "type": "function_call_output"},
    ],
    "include": [],
    "tools": [AGENT_TOOL],
    "max_output_tokens": 8,
}


# Its next turn: the answer it was given back as the SDK keeps it (model_dump), then the user's
ANSWER_ITEM = {
    "id": "msg_1", "content": [{"annotations": [], "text": "18 C.", "type": "output_text", "logprobs": []}],
    "role": "assistant", "status": "completed", "type": "message",
}  # fmt: skip
AGENTS_NEXT_TURN = AGENTS_SDK | {"input": [*AGENTS_SDK["input"], ANSWER_ITEM, {"content": "Thanks", "role": "user"}]}


def test_the_agents_sdks_request_gets_the_response_it_reads(qwen25):
    """The SDK reads the response's output items, its usage and its id (ModelResponse), streamed
    or not, through the openai client; the message item it was given back, with its id and
    annotations, is taken too."""
    _, srv = qwen25
    client = srv.client()
    for body in (AGENTS_SDK, AGENTS_NEXT_TURN):
        last = list(client.responses.create(**body, stream=True))[-1]
        assert last.type == "response.incomplete"
        for response in (last.response, client.responses.create(**body)):
            assert response.id.startswith("resp_") and response.output[0].type == "message"
            assert response.usage.output_tokens == 8 and response.usage.input_tokens > 0
            assert response.output_text == response.output[0].content[0].text


def test_the_responses_path_without_v1_is_llama_servers_too(qwen25):
    _, srv = qwen25
    status, data = srv.post("/responses", json.dumps({"input": "Hi", "max_output_tokens": 2}).encode())
    assert status == 200 and data["object"] == "response" and data["usage"]["output_tokens"] == 2


def test_a_client_that_leaves_a_stream_stops_its_generation(qwen25, monkeypatch):
    """The chat endpoint's machinery serves the Responses API's streams: a client that goes away
    stops the generation (held after its first step here, so it cannot end first)."""
    engine, srv = qwen25
    body = {"input": "Hi", "max_output_tokens": 1000, "stream": True, **GREEDY}
    line = leave_a_stream(engine, srv, monkeypatch, "/v1/responses", body, b"event: response.created")
    assert "the client went away" in line and "stopped after" in line


def test_the_api_key_is_asked_for(qwen25):
    engine, _ = qwen25
    keyed = Server(engine, api_key="secret")
    try:
        status, data = keyed.post("/v1/responses", json.dumps({"input": "Hi"}).encode())
        assert status == 401 and data["error"]["code"] == "invalid_api_key"
    finally:
        keyed.stop()
