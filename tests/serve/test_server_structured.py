"""Structured output over HTTP: OpenAI's response_format on chat, llama-server's grammar and
json_schema on every generating endpoint, and one-line 400s for what cannot be done."""

import json
import re
import threading
import time

import numpy as np
import pytest
import tiny_models as tm
import tool_templates
from serving import CTX, Server, serve_log, templated_server

import specllm
from specllm.engine.constrained import where_it_applies
from specllm.engine.loop import GenerationConfig, output_grammar
from specllm.llama.grammar import schema_grammar
from specllm.serve.openai_api import ChatReply, ChatRequest, ToolReply, validated
from specllm.serve.tool_calls import inspect_template

MESSAGES = [{"role": "user", "content": "Hello"}]
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "tag": {"enum": ["red", "green"]}},
    "required": ["ok", "tag"],
}


@pytest.fixture(scope="module")
def engine(tiny_models):
    engine = specllm.load(str(tiny_models.target), str(tiny_models.draft), n_ctx=CTX, n_threads=1, defer_draft=True)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def srv(engine):
    with serve_log():
        s = Server(engine)
        yield s
        s.stop()


def post(srv, path, **body):
    return srv.post(path, json.dumps(body).encode())


def chat(srv, **body):
    status, data = post(srv, "/v1/chat/completions", messages=MESSAGES, temperature=0, max_tokens=100, **body)
    assert status == 200, data
    return data["choices"][0]["message"]["content"], data["choices"][0]["finish_reason"]


def check_schema(text):
    value = json.loads(text)
    assert set(value) == {"ok", "tag"} and isinstance(value["ok"], bool) and value["tag"] in ("red", "green")


@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}},
        {"type": "json_object", "schema": SCHEMA},  # llama-server's json_object with a schema
    ],
)
def test_chat_response_format_json_schema(srv, response_format):
    text, finish = chat(srv, response_format=response_format, drafter="model", gamma=3)
    check_schema(text)
    assert finish == "stop"  # the grammar ended it


def test_chat_response_format_json_object_is_any_object(srv, engine):
    text, finish = chat(srv, response_format={"type": "json_object"})
    assert json.loads(text) == {} and finish == "stop"  # this model's greedy object: "{ }"
    prompt = engine.chat_prompt("Hello")
    assert text == engine.generate(prompt, max_tokens=100, temperature=0, json_schema={}).text
    assert chat(srv, response_format={"type": "json_schema", "json_schema": {"name": "any"}})[0] == text


def test_chat_response_format_text_is_plain_text(srv):
    assert chat(srv, response_format={"type": "text"}) == chat(srv)


def test_chat_takes_llama_servers_fields(srv):
    check_schema(chat(srv, json_schema=SCHEMA)[0])
    assert chat(srv, grammar='root ::= "yes" | "no"')[0] in ("yes", "no")


@pytest.mark.parametrize("path", ["/v1/completions", "/completion"])
def test_completions_take_grammar_and_json_schema(srv, path):
    for body, check in [
        ({"json_schema": SCHEMA}, check_schema),
        ({"grammar": 'root ::= [0-9] [0-9]? "."'}, lambda text: text[:-1].isdigit() and text.endswith(".")),
    ]:
        status, data = post(srv, path, prompt="x", temperature=0, max_tokens=60, **body)
        assert status == 200, data
        text = data["choices"][0]["text"] if path == "/v1/completions" else data["content"]
        assert check(text) is not False, text


@pytest.mark.parametrize(
    ("path", "body", "param", "message"),
    [
        ("/v1/chat/completions", {"grammar": "root ::= foo"}, "grammar", "the grammar does not parse: Undefined rule identifier 'foo'"),  # noqa: E501
        ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}}}, "response_format", "response_format: the JSON schema's /type \"nope\" is no JSON type"),  # noqa: E501
        ("/v1/chat/completions", {"response_format": {"type": "xml"}}, "response_format.type", "Input should be"),
        ("/v1/chat/completions", {"response_format": {"type": "json_object"}, "json_schema": {}}, "response_format", "not two of them"),  # noqa: E501
        ("/v1/chat/completions", {"grammar": 'root ::= "x"', "json_schema": {}}, "grammar", "not both"),
        ("/v1/completions", {"prompt": "x", "json_schema": {"$ref": "#/nowhere"}}, "json_schema", 'json_schema: the JSON schema\'s /$ref #/nowhere points at nothing in it: no "nowhere"'),  # noqa: E501
        ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": []}}}}, "response_format", "response_format: the JSON schema's /type is an empty list"),  # noqa: E501
        ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {"schema": {"properties": {"a": {"type": "array", "items": {"type": "strng"}}}}}}}, "response_format", "response_format: the JSON schema's /properties/a/items/type \"strng\" is no JSON type"),  # noqa: E501
        ("/v1/completions", {"prompt": "x", "json_schema": {"properties": []}}, "json_schema", "json_schema: the JSON schema's /properties must be an object of schemas by name, not []"),  # noqa: E501
        ("/v1/completions", {"prompt": "x", "json_schema": {"allOf": [{"enum": ["a"]}, {"const": "b"}]}}, "json_schema", "json_schema: the JSON schema's /allOf admits no value"),  # noqa: E501
        ("/completion", {"prompt": "x", "json_schema": {"type": "number", "minimum": 2, "maximum": 1}}, "json_schema", "json_schema: the JSON schema's number bounds at the root admit no number"),  # noqa: E501
        ("/completion", {"prompt": "x", "json_schema": {"properties": {"x": True}}}, "json_schema", "json_schema: the JSON schema has true at /properties/x, where a schema is expected"),  # noqa: E501
        ("/v1/completions", {"prompt": "x", "response_format": {"type": "json_object"}}, "response_format", "not supported"),  # noqa: E501
        ("/completion", {"prompt": "x", "json_schema": {"type": "array", "maxItems": 100000}}, "json_schema", "/maxItems 100000 is past the 2000 repetitions"),  # noqa: E501
        ("/completion", {"prompt": "x", "grammar": 'root ::= "x'}, "grammar", "unexpected end of input"),
        # found only while generating: a token the vocabulary lacks is the request's fault, not a 500
        ("/completion", {"prompt": "x", "grammar": "root ::= <[999999]>"}, "grammar", "the grammar allows no token"),
        ("/v1/chat/completions", {"grammar": 'root ::= "a" <[999999]>'}, "grammar", "the grammar allows no token"),
    ],
)  # fmt: skip
def test_a_bad_grammar_or_schema_is_a_400(srv, path, body, param, message):
    if path == "/v1/chat/completions":
        body = {"messages": MESSAGES, **body}
    status, data = post(srv, path, **body)
    assert status == 400, data
    error = data["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert message in error["message"] and "\n" not in error["message"]


def test_a_slow_schema_holds_no_other_request(srv):
    """Converting a schema of many optional properties takes seconds (the converter's grammar for
    an object grows with their square): meanwhile the server answers others. Its fault, a pattern
    that is no regular expression, is found only when the converter reaches it."""
    many = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(900)}}
    schema = {
        "type": "object",
        "properties": {"a": many, "b": many, "c": many, "z": {"type": "string", "pattern": "^(a$"}},
    }
    refused = []
    slow = threading.Thread(target=lambda: refused.append(post(srv, "/completion", prompt="x", json_schema=schema)))
    started = time.monotonic()
    slow.start()
    time.sleep(0.3)
    assert srv.get("/health")["status"] == "ok"
    answered = time.monotonic() - started
    slow.join()
    took = time.monotonic() - started
    assert refused[0][0] == 400 and took > 2 * answered, (answered, took)


# Thinking models: the reasoning is free and the answer follows the schema. A template that opens
# the think block with Magistral's [THINK], on a tiny model that writes [/THINK] (a control token
# of its vocabulary) and then JSON; Qwen3.5's, whose "<think>\n" the tiny model never closes.
THINK_CONTROL_TEMPLATE = (
    "{% for m in messages %}[INST]{{ m['content'] }}[/INST]{% endfor %}{% if add_generation_prompt %}[THINK]{% endif %}"
)
JSON_SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}


@pytest.fixture(scope="module")
def thinker(tmp_path_factory):
    yield from templated_server(
        tmp_path_factory, "thinker", THINK_CONTROL_TEMPLATE, vocab="markup", extra_scale=1.5, seed=2
    )


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory):
    yield from templated_server(tmp_path_factory, "qwen35", tool_templates.QWEN35)


def streamed(chunks) -> dict:
    reasoning, content = "", ""
    for chunk in chunks:
        delta = chunk.choices[0].delta.to_dict() if chunk.choices else {}
        reasoning += delta.get("reasoning_content") or ""
        content += delta.get("content") or ""
    return {"reasoning_content": reasoning, "content": content}


def test_a_thinking_model_reasons_first_and_answers_json(thinker):
    """The prompt opens a think block: the reasoning is reasoning_content, the JSON the content,
    streamed or not; the reply is the text the engine generates under the schema."""
    engine, srv = thinker
    request = dict(messages=MESSAGES, model="x", temperature=0, max_tokens=100, response_format=JSON_SCHEMA_FORMAT)
    reply = srv.client().chat.completions.create(**request)
    message = reply.choices[0].message.to_dict()
    check_schema(message["content"])
    assert reply.choices[0].finish_reason == "stop"  # the end came after the JSON
    text = engine.generate(engine.target.render_chat(MESSAGES), max_tokens=100, temperature=0, json_schema=SCHEMA).text
    reasoning, _, answer = text.partition("[/THINK]")
    assert message["reasoning_content"] == reasoning.strip() and reasoning.strip()
    assert message["content"] == answer.lstrip()
    chunks = srv.client().chat.completions.create(stream=True, **request)
    assert streamed(chunks) == {k: message[k] for k in ("reasoning_content", "content")}


def test_the_reasoning_tokens_are_those_up_to_the_end_of_the_block(thinker):
    """usage counts as reasoning the generated tokens up to the one that closes the think block
    (a control token here), exactly: the chat's, streamed or not, and the Responses API's."""
    engine, srv = thinker
    result = engine.generate(engine.target.render_chat(MESSAGES), max_tokens=100, temperature=0, json_schema=SCHEMA)
    (close,) = engine.target.tokenize("[/THINK]", add_special=False)
    thought = result.tokens.index(close) + 1
    assert 1 < thought < len(result.tokens)
    client = srv.client()
    request = dict(messages=MESSAGES, model="x", temperature=0, max_tokens=100, response_format=JSON_SCHEMA_FORMAT)
    reply = client.chat.completions.create(**request)
    assert reply.usage.completion_tokens == len(result.tokens)
    assert reply.usage.completion_tokens_details.reasoning_tokens == thought
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **request))
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == thought
    text = {"format": {"type": "json_schema", "name": "answer", "schema": SCHEMA, "strict": True}}
    response = client.responses.create(input=MESSAGES, model="x", temperature=0, max_output_tokens=100, text=text)
    assert response.usage.output_tokens_details.reasoning_tokens == thought


def test_a_reply_cut_in_its_reasoning_is_reasoning_alone(qwen35):
    """Qwen3.5's prompt opens "<think>\\n" and the tiny model never closes it: max_tokens cuts the
    reasoning, the same as without a schema (it was the JSON, in reasoning_content)."""
    _, srv = qwen35
    request = dict(messages=MESSAGES, model="x", temperature=0, max_tokens=12)
    free = srv.client().chat.completions.create(**request).choices[0]
    reply = srv.client().chat.completions.create(response_format=JSON_SCHEMA_FORMAT, **request).choices[0]
    assert reply.message.to_dict() == free.message.to_dict() and reply.message.content == ""
    assert reply.finish_reason == "length"


def test_with_thinking_off_the_answer_is_json_from_the_first_token(qwen35):
    engine, srv = qwen35
    off = {"enable_thinking": False}
    request = dict(messages=MESSAGES, model="x", temperature=0, max_tokens=100, response_format=JSON_SCHEMA_FORMAT)
    reply = srv.client().chat.completions.create(**request, extra_body={"chat_template_kwargs": off})
    message = reply.choices[0].message.to_dict()
    check_schema(message["content"])
    assert "reasoning_content" not in message
    prompt = engine.target.render_chat(MESSAGES, variables=off)
    assert message["content"] == engine.generate(prompt, max_tokens=100, temperature=0, json_schema=SCHEMA).text


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    """A tiny gpt-oss (its markup's rows scaled up) whose greedy reply to GPT_OSS_ASK under SCHEMA
    writes an analysis message, then the final one."""
    yield from templated_server(
        tmp_path_factory, "gpt-oss", tool_templates.GPT_OSS, vocab="harmony", extra_scale=10.0, seed=3
    )


GPT_OSS_ASK = [{"role": "user", "content": "What is the weather"}]


def test_gpt_oss_reasons_in_its_analysis_channel_and_answers_json_in_its_final_one(gpt_oss):
    """The analysis is free and is reasoning_content; the final channel's message is the JSON
    and the content, streamed or not; the reply is the text the engine generates under the schema."""
    engine, srv = gpt_oss
    request = dict(messages=GPT_OSS_ASK, model="x", temperature=0, max_tokens=120, response_format=JSON_SCHEMA_FORMAT)
    reply = srv.client().chat.completions.create(**request)
    message = reply.choices[0].message.to_dict()
    check_schema(message["content"])
    assert reply.choices[0].finish_reason == "stop"  # the end came after the JSON
    prompt = engine.target.render_chat(GPT_OSS_ASK)
    text = engine.generate(prompt, max_tokens=120, temperature=0, json_schema=SCHEMA).text
    assert text.startswith("<|channel|>analysis<|message|>") and "<|end|><|start|>assistant<|channel|>final" in text
    analysis = text.removeprefix("<|channel|>analysis<|message|>").partition("<|end|>")[0]
    assert message["reasoning_content"] == analysis.strip() and analysis.strip()
    assert message["content"] == text.partition("<|message|>")[2].rpartition("<|message|>")[2]
    chunks = srv.client().chat.completions.create(stream=True, **request)
    assert streamed(chunks) == {k: message[k] for k in ("reasoning_content", "content")}


@pytest.mark.parametrize("cut", [{"max_tokens": 4}, {"max_tokens": 120, "stop": ["lysis"]}])
def test_gpt_oss_cut_inside_its_first_header_has_no_content(gpt_oss, cut):
    """A reply cut inside its first header ("<|channel|>ana", by max_tokens or a stop string)
    shows no markup: no content and no reasoning, streamed or not, as llama-server's parser
    reads a header it has only a part of."""
    engine, srv = gpt_oss
    request = dict(messages=GPT_OSS_ASK, model="x", temperature=0, response_format=JSON_SCHEMA_FORMAT) | cut
    prompt = engine.target.render_chat(GPT_OSS_ASK)
    assert engine.generate(prompt, temperature=0, json_schema=SCHEMA, **cut).text == "<|channel|>ana"
    choice = srv.client().chat.completions.create(**request).choices[0]
    assert choice.message.to_dict() == {"role": "assistant", "content": ""}
    assert choice.finish_reason == ("length" if "stop" not in cut else "stop")
    chunks = list(srv.client().chat.completions.create(stream=True, **request))
    assert streamed(chunks) == {"reasoning_content": "", "content": ""}
    assert chunks[-1].choices[0].finish_reason == choice.finish_reason


@pytest.mark.parametrize(
    ("path", "opened"),
    [
        ("/completion", "<|channel|>commentary<|message|>"),  # a preamble
        ("/v1/completions", "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"),
        ("/completion", "<|channel|>analysis<|message|>" + "Let me think about it. " * 12),  # past 64 tokens
    ],
)
def test_gpt_oss_goes_on_with_a_message_the_prompt_opened(gpt_oss, path, opened):
    """A raw prompt that opened a commentary message (a preamble, a call's body) or a long analysis
    goes on in it free, not with the schema's JSON from the first token: the text the engine
    generates so, whose message ends and whose final message (or the call's end) follows."""
    engine, srv = gpt_oss
    prompt = engine.target.render_chat(GPT_OSS_ASK) + opened
    status, data = post(srv, path, prompt=prompt, temperature=0, max_tokens=120, json_schema=SCHEMA)
    assert status == 200, data
    text = data["choices"][0]["text"] if path == "/v1/completions" else data["content"]
    assert text == engine.generate(prompt, max_tokens=120, temperature=0, json_schema=SCHEMA).text
    assert not text.startswith("{") and "<|end|>" in text, text


# Tools beside a schema: the answer follows the schema or is a call, which begins as the template
# writes one ("<tool_call>" for Qwen2.5's). The tiny model's greedy reply to CALLS, offered
# TERSE_WEATHER, begins a call (noise follows, which the tool reader leaves as text); to ANSWERS,
# offered GET_WEATHER, it answers JSON.
GET_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TERSE_WEATHER = {"type": "function", "function": GET_WEATHER["function"] | {"description": "Get the weather"}}
CALLS = [{"role": "user", "content": "Hello"}]
ANSWERS = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def qwen25(tmp_path_factory):
    """Qwen2.5's template on a model whose greedy reply beside a schema answers ANSWERS with JSON and
    CALLS with a call (seed 0's writes a fenced call, of noise, to both)."""
    yield from templated_server(tmp_path_factory, "qwen25", tool_templates.QWEN25, seed=6)


def with_tools(srv, messages, **body) -> dict:
    tool = TERSE_WEATHER if messages is CALLS else GET_WEATHER
    body = dict(messages=messages, tools=[tool], temperature=0, max_tokens=60) | body
    status, data = post(srv, "/v1/chat/completions", **body)
    assert status == 200, data
    return data["choices"][0]


def generated(engine, srv, messages, **structure) -> str:
    """The text the engine generates from the prompt the server renders for `messages` with the tool."""
    tool = TERSE_WEATHER if messages is CALLS else GET_WEATHER
    status, data = post(srv, "/apply-template", messages=messages, tools=[tool])
    assert status == 200, data
    return engine.generate(data["prompt"], max_tokens=60, temperature=0, **structure).text


def test_with_tools_the_reply_follows_the_schema_or_is_a_call(qwen25):
    engine, srv = qwen25
    answer = with_tools(srv, ANSWERS, response_format=JSON_SCHEMA_FORMAT, drafter="ngram", gamma=3)
    check_schema(answer["message"]["content"])
    assert answer["message"].get("tool_calls") is None and answer["finish_reason"] == "stop"
    call = with_tools(srv, CALLS, response_format=JSON_SCHEMA_FORMAT, drafter="auto")
    text = call["message"]["content"]
    assert text.startswith("<tool_call>") and call["finish_reason"] == "length"
    for messages, choice in ((ANSWERS, answer), (CALLS, call)):
        assert (
            choice["message"]["content"]
            == generated(
                engine, srv, messages, json_schema=SCHEMA, call_opening="<tool_call>", call_names=NAMES
            ).strip()
        )
    # a grammar beside tools likewise, and the answer streamed is the same
    worded = with_tools(srv, ANSWERS, grammar='root ::= "yes" | "no"')
    assert worded["message"]["content"] in ("yes", "no")
    client = srv.client()
    request = dict(model="x", messages=ANSWERS, tools=[GET_WEATHER], temperature=0, max_tokens=60)
    chunks = client.chat.completions.create(stream=True, response_format=JSON_SCHEMA_FORMAT, **request)
    assert streamed(chunks)["content"] == answer["message"]["content"]


NAMES = ("get_weather",)
FENCED_CALL = '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```'


def test_beside_a_schema_a_fenced_call_naming_a_tool_is_read_as_tool_calls(qwen25):
    """The default pair's Qwen2.5-Coder writes its calls as fenced JSON, which the reply reader
    reads as calls: beside a schema the server asks for that form too (the offered tools' names),
    under whose grammar such a call written whole is allowed, may end, and is read as tool_calls."""
    engine, srv = qwen25
    body = dict(messages=ANSWERS, tools=[GET_WEATHER], response_format=JSON_SCHEMA_FORMAT)
    structure = srv.worker.chat_structure(validated(ChatRequest, json.dumps(body).encode()))
    assert structure["call_opening"] == "<tool_call>" and structure["call_names"] == NAMES
    target = engine.target
    prompt = target.tokenize(target.render_chat(ANSWERS, tools=[GET_WEATHER]))
    grammar = output_grammar(target, GenerationConfig(**structure), prompt)
    assert grammar is not None
    for token in target.tokenize(FENCED_CALL, add_special=False):
        assert grammar.allowed(np.array([token]))[0]
        grammar.accept(token)
    assert grammar.allowed(np.array([target.eos]))[0]
    grammar.close()
    reply = ChatReply(False, ToolReply(["get_weather"]))
    reply.feed(FENCED_CALL), reply.finish()
    message = reply.message()
    assert [c["function"] for c in message["tool_calls"]] == [{"name": "get_weather", "arguments": '{"city": "Paris"}'}]
    assert message["content"] is None


def test_a_forced_call_is_not_held_to_the_schema(qwen25):
    """tool_choice "required" or a named tool: the call is made as without a schema."""
    _, srv = qwen25
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in ("required", named):
        free = with_tools(srv, ANSWERS, tool_choice=choice)
        held = with_tools(srv, ANSWERS, tool_choice=choice, response_format=JSON_SCHEMA_FORMAT)
        assert held == free and held["message"]["content"].startswith('<tool_call>\n{"name": "get_weather"')


def test_with_tool_choice_none_only_the_schema_applies(qwen25):
    engine, srv = qwen25
    none = with_tools(srv, CALLS, tool_choice="none", response_format=JSON_SCHEMA_FORMAT)
    check_schema(none["message"]["content"])
    prompt = engine.target.render_chat(CALLS)  # no tools offered: none rendered
    assert none["message"]["content"] == engine.generate(prompt, max_tokens=60, temperature=0, json_schema=SCHEMA).text


def test_the_responses_api_takes_text_format_beside_tools(qwen25):
    _, srv = qwen25
    text_format = {"type": "json_schema", "name": "answer", "schema": SCHEMA, "strict": True}
    for messages, offered in ((ANSWERS, GET_WEATHER), (CALLS, TERSE_WEATHER)):
        tool = {"type": "function", **offered["function"]}
        body = dict(input=messages, tools=[tool], text={"format": text_format}, temperature=0, max_output_tokens=60)
        status, data = post(srv, "/v1/responses", **body)
        assert status == 200, data
        chat = with_tools(srv, messages, response_format=JSON_SCHEMA_FORMAT)
        [item] = data["output"]
        assert item["content"][0]["text"] == chat["message"]["content"]


@pytest.fixture(scope="module")
def llama31(tmp_path_factory):
    # (seed 0's reply beside a schema is a fenced call, of noise: this one's is a bare one)
    yield from templated_server(tmp_path_factory, "llama31", tool_templates.LLAMA31, seed=4)


def test_calls_an_answer_could_begin_as_are_a_400(llama31, tmp_path_factory):
    """Llama 3.1's calls are bare JSON: beside any JSON object an answer could be either; beside a
    schema that cannot begin so, they are told apart."""
    _, srv = llama31
    status, data = post(
        srv, "/v1/chat/completions", messages=ANSWERS, tools=[GET_WEATHER], response_format={"type": "json_object"}
    )
    assert status == 400 and data["error"]["param"] == "tools"
    assert data["error"]["message"] == (
        "tools cannot be offered with this response_format or grammar: a tool call begins with "
        '\'{"name": "\', which the grammar also takes as the start of an answer'
    )
    reply = with_tools(srv, ANSWERS, response_format=JSON_SCHEMA_FORMAT)["message"]["content"]
    assert reply.startswith('{"name": "')  # a call (of noise), which SCHEMA's answers cannot begin as
    # functionary v3.2's calls have no opening; gpt-oss's template on a vocabulary without
    # harmony's markup tokens writes no harmony messages a grammar could tell apart
    for template, why in ((tool_templates.FUNCTIONARY_V32, "to this model: its calls have no opening of their own"),
                          (tool_templates.GPT_OSS, "only in a gpt-oss reply (its markup tokens in the vocabulary, "
                                                   "the prompt ending where a reply begins)")):  # fmt: skip
        for _, other in templated_server(tmp_path_factory, "refused", template):
            status, data = post(
                other, "/v1/chat/completions", messages=ANSWERS, tools=[GET_WEATHER], response_format=JSON_SCHEMA_FORMAT
            )
            assert status == 400 and data["error"]["param"] == "tools", data
            assert data["error"]["message"].endswith(why)


@pytest.fixture(scope="module")
def qwen35_calls(tmp_path_factory):
    """Qwen3.5's template on a vocabulary holding its markers as tokens it writes often: its
    greedy reasoning for ANSWERS, offered GET_WEATHER, begins a call ("<tool_call>") before it
    writes "</think>"."""
    yield from templated_server(
        tmp_path_factory, "qwen35-calls", tool_templates.QWEN35, vocab="qwen", extra_scale=1.5, seed=1
    )


def test_a_call_begun_inside_the_reasoning_ends_it_and_is_free(qwen35_calls):
    """Qwen3.5 may call before it closes its think block (the reply reader ends the reasoning at
    "<tool_call>"): under a schema the call is then free, the "</think>" it writes later no longer
    bringing the schema (the reasoning refused the end and never ended: max_tokens)."""
    engine, srv = qwen35_calls
    choice = with_tools(srv, ANSWERS, response_format=JSON_SCHEMA_FORMAT, drafter="ngram", gamma=3)
    structure = dict(json_schema=SCHEMA, call_opening="<tool_call>", calls_in_reasoning=("<tool_call>",))
    text = generated(engine, srv, ANSWERS, **structure)
    reasoning, opening, call = text.partition("<tool_call>")
    assert opening and "</think>" not in reasoning and "</think>" in call
    assert choice["message"]["reasoning_content"] == reasoning.strip() and reasoning.strip()
    assert choice["message"]["content"] == (opening + call).strip()
    held = generated(engine, srv, ANSWERS, json_schema=SCHEMA, call_opening="<tool_call>")
    # as it was: "<tool_call>" was reasoning, and after "</think>" came the schema's answer or a call
    assert "<tool_call>" in held.partition("</think>")[0] and held != text


def test_a_whole_call_inside_the_reasoning_may_end_and_is_read(qwen35_calls):
    """A call Qwen3.5 writes whole inside its reasoning: every token allowed under the schema, as
    the server asks for it, the end of generation after it too, and the reply read as tool_calls."""
    engine, srv = qwen35_calls
    target = engine.target
    form = inspect_template(lambda m, tools, prompt: target.render_chat(m, tools=tools, add_generation_prompt=prompt))
    assert form.call_openings == ("<tool_call>",) and form.call_marker == "<tool_call>"
    call = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
    written = "Let me look.\n" + call
    grammar = where_it_applies(target, schema_grammar(SCHEMA), "<think>\n", form.call_marker, form.call_openings)
    for token in target.tokenize(written, add_special=False):
        assert grammar.allowed(np.array([token]))[0]
        grammar.accept(token)
    assert grammar.allowed(np.array([target.eos]))[0]
    grammar.close()
    reply = ChatReply("</think>", ToolReply(["get_weather"]), call_openings=form.call_openings)
    reply.feed(written), reply.finish()
    message = reply.message()
    assert [c["function"] for c in message["tool_calls"]] == [{"name": "get_weather", "arguments": '{"city": "Paris"}'}]
    assert message["reasoning_content"] == "Let me look."


HARMONY_CALL = "<|channel|>commentary json<|message|>"


def test_gpt_oss_beside_tools_calls_or_answers_json(gpt_oss):
    """gpt-oss with tools and a schema (a 400 before): a header may be a commentary call's, its
    body free; the tiny model's greedy reply is a call (to a tool of noise's name), the text the
    engine generates so. A call written whole is allowed, may end, and is read as tool_calls."""
    engine, srv = gpt_oss
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    choice = with_tools(srv, messages, response_format=JSON_SCHEMA_FORMAT, max_tokens=120)
    status, data = post(srv, "/apply-template", messages=messages, tools=[GET_WEATHER])
    assert status == 200, data
    text = engine.generate(
        data["prompt"], max_tokens=120, temperature=0, json_schema=SCHEMA, call_opening="to=functions."
    ).text
    header, _, body = text.partition("<|message|>")  # a call at once, its tool's name noise
    assert header.startswith("<|channel|>commentary to=functions.") and choice["finish_reason"] == "stop"
    recipient = header.removeprefix("<|channel|>commentary to=").partition("<|constrain|>")[0]
    # the call, which names no offered tool, left as text in harmony.py's one form
    assert choice["message"]["content"] == f"<|start|>assistant to={recipient}{HARMONY_CALL}{body}<|call|>"
    # A call written whole under that grammar: every token allowed, then its end, and read as tool_calls
    target = engine.target
    written = (
        "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'
    )
    grammar = where_it_applies(target, schema_grammar(SCHEMA), data["prompt"], "to=functions.")
    for part in re.split(r"(<\|[a-z]+\|>)", written):  # markup as its tokens, the rest a byte token a byte
        tokens = (
            target.tokenize(part, add_special=False) if part.startswith("<|") else map(tm.byte_token_id, part.encode())
        )
        for token in tokens:
            assert grammar.allowed(np.array([token]))[0]
            grammar.accept(token)
    assert grammar.allowed(np.array([t for t in range(target.n_vocab) if target.is_eog(t)])).all()
    grammar.close()
    reply = ChatReply(False, ToolReply(["get_weather"]))
    reply.feed(written), reply.finish()
    message = reply.message()
    assert [c["function"] for c in message["tool_calls"]] == [{"name": "get_weather", "arguments": '{"city": "Paris"}'}]
    assert message["reasoning_content"] == "Need the weather."
