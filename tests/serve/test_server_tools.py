"""Tool calls in `specllm serve`, with the real `openai` client: validation and rendering on tiny
models (one with Qwen2.5's chat template, one whose ChatML template renders no tools: the generic
format), and real calls from the default pair (slow)."""

import json

import openai
import pytest
import tiny_models as tm
import tool_templates
from serving import Server

import specllm
from specllm.llama.templates import compile_chat_template, render_bounded
from specllm.models.hub import resolve_models

CTX = 2048
WEATHER = "What is the weather in Paris right now? Use the tool."


def function(name: str, argument: str, description: str) -> dict:
    parameters = {"type": "object", "properties": {argument: {"type": "string"}}, "required": [argument]}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


GET_WEATHER = function("get_weather", "city", "Get the current weather in a city")
GET_TIME = function("get_time", "timezone", "Get the current time in a timezone")
NAMED = {"type": "function", "function": {"name": "get_weather"}}
ASK = [{"role": "user", "content": WEATHER}]
CALL = {"id": "abc123XYZ", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
ANSWERED = ASK + [
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "abc123XYZ", "content": '{"temperature_c": 18, "sky": "cloudy"}'},
]


def serve(path):
    engine = specllm.load(str(path), n_ctx=CTX, n_threads=1)
    return engine, Server(engine)


@pytest.fixture(scope="module")
def qwen_templated(tmp_path_factory):
    """The tiny target with Qwen2.5's chat template, served (its replies are noise: no real calls)."""
    path = tm.write_model(
        tmp_path_factory.mktemp("tools") / "qwen_templated.gguf", seed=0, chat_template=tool_templates.QWEN25
    )
    engine, srv = serve(path)
    yield engine, srv
    srv.stop()
    engine.close()


@pytest.fixture(scope="module")
def chatml(tiny_models):
    engine, srv = serve(tiny_models.target)
    yield srv
    srv.stop()
    engine.close()


def test_a_model_whose_template_renders_no_tools_takes_them_in_the_generic_format(chatml):
    # (test_server_generic_tools.py tests the format itself)
    client = chatml.client()
    offered = client.chat.completions.create(model="x", messages=ASK, tools=[GET_WEATHER], max_tokens=4)
    assert offered.choices[0].message.content.startswith("{")  # the reply's JSON, cut short
    none = client.chat.completions.create(
        model="x", messages=ASK, tools=[GET_WEATHER], tool_choice="none", max_tokens=4
    )
    assert none.choices[0].message.tool_calls is None and none.usage.completion_tokens == 4
    answered = client.chat.completions.create(model="x", messages=ANSWERED, max_tokens=4)
    assert answered.usage.completion_tokens == 4


BAD_TOOL_REQUESTS = [
    ({"tools": [{"type": "function"}]}, "tools.0.function"),
    ({"tools": [{"type": "function", "function": {"name": "two words"}}]}, "tools.0.function.name"),
    ({"tools": [{"type": "retrieval", "function": {"name": "a"}}]}, "tools.0.type"),
    (
        {"tools": [{"type": "function", "function": {"name": "a", "parameters": "a string"}}]},
        "tools.0.function.parameters",
    ),
    ({"tools": "get_weather"}, "tools"),
    ({"tools": [GET_WEATHER, GET_WEATHER]}, "tools"),
    ({"tools": [GET_WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [GET_WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [GET_WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"messages": ASK + [{"role": "tool", "content": "18 C"}]}, "messages.1"),  # no tool_call_id
    ({"messages": ASK + [{"role": "assistant", "content": None}]}, "messages.1"),
    (
        {"messages": ASK + [{"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f"}}]}]},
        "messages.1.tool_calls.0.function.arguments",
    ),
    ({"functions": [GET_WEATHER["function"]]}, "functions"),  # the deprecated form
]


@pytest.mark.parametrize("fields,param", BAD_TOOL_REQUESTS, ids=range(len(BAD_TOOL_REQUESTS)))
def test_bad_tool_requests_get_one_line_400s(qwen_templated, fields, param):
    _, srv = qwen_templated
    status, data = srv.post("/v1/chat/completions", json.dumps({"messages": ASK, "max_tokens": 2} | fields).encode())
    assert (status, data["error"]["param"]) == (400, param), data
    assert data["error"]["message"] and "\n" not in data["error"]["message"]


def test_an_assistant_message_with_neither_content_nor_calls_is_told_what_it_needs(qwen_templated):
    _, srv = qwen_templated
    empty = {"messages": ASK + [{"role": "assistant", "content": None, "tool_calls": []}]}
    status, data = srv.post("/v1/chat/completions", json.dumps(empty).encode())
    assert (status, data["error"]["message"]) == (
        400,
        "messages.1: Value error, an assistant message needs content or tool_calls",
    )


def test_tools_on_the_completions_endpoint_get_a_400(qwen_templated):
    _, srv = qwen_templated
    status, data = srv.post("/v1/completions", json.dumps({"prompt": "x", "tools": [GET_WEATHER]}).encode())
    assert (status, data["error"]["param"]) == (400, "tools")


def prompt_length(engine, messages, tools=None, prefill=""):
    return len(engine.prompt_tokens(engine.target.render_chat(messages, tools=tools) + prefill))


def test_tools_and_tool_messages_go_through_the_models_template(qwen_templated):
    """The prompt is the template's rendering with the tools, the call's arguments as an object
    (Qwen's template writes them with tojson), and a forced call begun after it."""
    engine, srv = qwen_templated
    client = srv.client()
    asked = client.chat.completions.create(model="x", messages=ASK, tools=[GET_WEATHER], max_tokens=2)
    assert asked.usage.prompt_tokens == prompt_length(engine, ASK, [GET_WEATHER])
    assert asked.usage.prompt_tokens > prompt_length(engine, ASK) + 40  # the tool's JSON is in it
    as_object = (
        ANSWERED[:1]
        + [dict(ANSWERED[1], tool_calls=[dict(CALL, function={"name": "get_weather", "arguments": {"city": "Paris"}})])]
        + ANSWERED[2:]
    )
    answered = client.chat.completions.create(model="x", messages=ANSWERED, tools=[GET_WEATHER], max_tokens=2)
    assert answered.usage.prompt_tokens == prompt_length(engine, as_object, [GET_WEATHER])
    named = client.chat.completions.create(
        model="x", messages=ASK, tools=[GET_WEATHER, GET_TIME], tool_choice=NAMED, max_tokens=2
    )
    prefill = '<tool_call>\n{"name": "get_weather", "arguments": '
    assert named.usage.prompt_tokens == prompt_length(engine, ASK, [GET_WEATHER, GET_TIME], prefill)
    required = client.chat.completions.create(
        model="x", messages=ASK, tools=[GET_WEATHER, GET_TIME], tool_choice="required", max_tokens=2
    )
    assert required.usage.prompt_tokens == prompt_length(
        engine, ASK, [GET_WEATHER, GET_TIME], '<tool_call>\n{"name": "'
    )
    none = client.chat.completions.create(
        model="x", messages=ASK, tools=[GET_WEATHER], tool_choice="none", max_tokens=2
    )
    assert none.usage.prompt_tokens == prompt_length(engine, ASK)


def test_a_forced_call_begins_as_a_template_with_xml_calls_writes_one(tmp_path):
    """Qwen3.5's calls are XML: a named call begins with its function's tag, after the think
    block the prompt opened, and what the model goes on with follows it (held back while it may
    still become the call). The empty think block is no part of the content."""
    path = tm.write_model(tmp_path / "qwen35_templated.gguf", seed=0, chat_template=tool_templates.QWEN35)
    engine, srv = serve(path)
    try:
        named = srv.client().chat.completions.create(
            model="x", messages=ASK, tools=[GET_WEATHER], tool_choice=NAMED, temperature=0, max_tokens=2
        )
        prefill = "\n</think>\n\n<tool_call>\n<function=get_weather>\n"
        assert named.usage.prompt_tokens == prompt_length(engine, ASK, [GET_WEATHER], prefill)
        assert named.choices[0].message.content.startswith("<tool_call>\n<function=get_weather>\n")
    finally:
        srv.stop()
        engine.close()


def test_a_forced_call_begins_as_lfm25s_template_writes_its_python_calls(tmp_path):
    """LFM2.5 writes a call as Python, <|tool_call_start|>[name(key=value)]<|tool_call_end|>: a
    named call begins with the name after the list's bracket (it began as a JSON call, which
    LFM2.5 does not write), and an earlier call and its result go through its template."""
    path = tm.write_model(tmp_path / "lfm25_templated.gguf", seed=0, chat_template=tool_templates.LFM25)
    engine, srv = serve(path)
    try:
        client = srv.client()
        named = client.chat.completions.create(
            model="x", messages=ASK, tools=[GET_WEATHER], tool_choice=NAMED, temperature=0, max_tokens=2
        )
        prefill = "<|tool_call_start|>[get_weather"
        assert named.usage.prompt_tokens == prompt_length(engine, ASK, [GET_WEATHER], prefill)
        assert named.choices[0].message.content.startswith(prefill)
        answered = client.chat.completions.create(model="x", messages=ANSWERED, tools=[GET_WEATHER], max_tokens=2)
        # As serve passes it: the content empty beside the calls, the arguments an object
        call = CALL | {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
        as_object = [ANSWERED[0], ANSWERED[1] | {"content": "", "tool_calls": [call]}, ANSWERED[2]]
        rendered = engine.target.render_chat(as_object, tools=[GET_WEATHER])
        assert "<|tool_call_start|>[get_weather(city='Paris')]<|tool_call_end|>" in rendered
        assert answered.usage.prompt_tokens == len(engine.prompt_tokens(rendered))
    finally:
        srv.stop()
        engine.close()


def test_an_earlier_calls_arguments_that_qwen35s_template_cannot_read_are_named(tmp_path):
    """Qwen3.5's template reads a call's arguments as an object (|items): arguments sent back that
    are not a JSON object made it fail with "Can only get item pairs from a mapping" and no field
    named. The 400 names the field; JSON-object arguments still render."""
    path = tm.write_model(tmp_path / "qwen35_templated.gguf", seed=0, chat_template=tool_templates.QWEN35)
    engine, srv = serve(path)
    try:
        for arguments in ("not json", '["Paris"]'):
            call = CALL | {"function": CALL["function"] | {"arguments": arguments}}
            messages = [ANSWERED[0], ANSWERED[1] | {"tool_calls": [call]}, ANSWERED[2]]
            body = {"messages": messages, "tools": [GET_WEATHER], "max_tokens": 2}
            status, data = srv.post("/v1/chat/completions", json.dumps(body).encode())
            field = "messages.1.tool_calls.0.function.arguments"
            assert (status, data["error"]["param"]) == (400, field), data
            assert data["error"]["message"].startswith(f"{field} must be a JSON object for this model's chat template")
        body = {"messages": ANSWERED, "tools": [GET_WEATHER], "max_tokens": 2}
        assert srv.post("/v1/chat/completions", json.dumps(body).encode())[0] == 200
    finally:
        srv.stop()
        engine.close()


def test_tools_are_rendered_with_the_models_own_template_for_them(tmp_path):
    """A GGUF may carry a template for tools beside its default one (Hermes 3's and Command R's
    tokenizer.chat_template.tool_use): offered tools, the request is rendered with that one."""
    templates = [
        {"name": "default", "template": tm.CHATML_TEMPLATE},
        {"name": "tool_use", "template": tool_templates.QWEN25},
    ]
    engine, srv = serve(tm.write_model(tmp_path / "tool_use.gguf", seed=0, chat_template=templates))
    try:
        client = srv.client()
        asked = client.chat.completions.create(model="x", messages=ASK, tools=[GET_WEATHER], max_tokens=2)
        with_tools = tiny_rendering(tool_templates.QWEN25, ASK, [GET_WEATHER])
        assert asked.usage.prompt_tokens == len(engine.prompt_tokens(with_tools))
        plain = client.chat.completions.create(model="x", messages=ASK, max_tokens=2)
        assert plain.usage.prompt_tokens == len(engine.prompt_tokens(tiny_rendering(tm.CHATML_TEMPLATE, ASK)))
    finally:
        srv.stop()
        engine.close()


def tiny_rendering(source, messages, tools=None):
    """`source` rendered as serve renders it, with the tiny vocabulary's BOS and EOS."""
    template = compile_chat_template(source)
    return render_bounded(
        template, messages=messages, tools=tools, add_generation_prompt=True, bos_token="<s>", eos_token="</s>"
    )


def test_a_reply_read_for_calls_is_the_same_streamed_or_not(qwen_templated):
    """The tiny model writes noise: no call, and the same text either way; a forced call that
    the model leaves unfinished comes back as the text it is (held back until the end)."""
    _, srv = qwen_templated
    client = srv.client()
    for choice, steps in (("auto", False), (NAMED, False), (NAMED, True)):
        request = dict(model="x", messages=ASK, tools=[GET_WEATHER], tool_choice=choice, temperature=0, max_tokens=40)
        whole = client.chat.completions.create(**request)
        chunks = list(client.chat.completions.create(**request, stream=True, extra_body={"specllm_steps": steps}))
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert whole.choices[0].message.content == streamed and whole.choices[0].message.tool_calls is None
        assert whole.choices[0].finish_reason == chunks[-1].choices[0].finish_reason == "length"
    # With specllm_steps, a chunk per step (its content empty while held back), then the held text.
    assert len(chunks) > 4 and all("specllm" in c.to_dict() for c in chunks[1:-2])
    assert chunks[-2].choices[0].delta.content == streamed
    assert streamed.startswith('<tool_call>\n{"name": "get_weather", "arguments": ')


# --- the default pair: real calls -----------------------------------------------------------------


@pytest.fixture(scope="module")
def pair():
    target, draft, found = resolve_models(progress=False)
    assert found is not None and found.default
    engine = specllm.load(str(target), str(draft), n_ctx=CTX)
    srv = Server(engine)
    # The machine may be shared: a reply of ~100 tokens may take a while.
    yield openai.OpenAI(base_url=srv.url + "/v1", api_key="-", max_retries=0, timeout=600)
    srv.stop()
    engine.close()


GREEDY = dict(model="x", temperature=0, max_tokens=120)


def city(call) -> str:
    return json.loads(call.function.arguments)["city"]


def streamed_reply(chunks):
    """The content, the calls (id, name, arguments) and the finish_reason of a stream."""
    content, calls, finish = "", {}, None
    for chunk in chunks:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                call["id"] += delta.id or ""
                call["name"] += delta.function.name or ""
                call["arguments"] += delta.function.arguments or ""
            finish = choice.finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


@pytest.mark.slow
def test_the_default_pair_calls_the_tool_streamed_and_not(pair):
    whole = pair.chat.completions.create(messages=ASK, tools=[GET_WEATHER], **GREEDY)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert (call.type, call.function.name, city(call)) == ("function", "get_weather", "Paris") and call.id
    content, calls, finish = streamed_reply(
        pair.chat.completions.create(messages=ASK, tools=[GET_WEATHER], stream=True, **GREEDY)
    )
    assert (content, finish) == ("", "tool_calls")  # no markup streamed as text
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert calls[0]["id"]


@pytest.mark.slow
def test_the_tools_result_gets_a_text_answer(pair):
    """The follow-up with the tool's result, the tools still sent (tool_choice "none") or not.
    (With tool_choice "auto" the 1.5B model greedily calls the tool again.)"""
    for tools in (dict(tools=[GET_WEATHER], tool_choice="none"), {}):
        reply = pair.chat.completions.create(messages=ANSWERED, **tools, **GREEDY)
        choice = reply.choices[0]
        assert choice.finish_reason == "stop" and choice.message.tool_calls is None
        assert "18" in choice.message.content and "cloudy" in choice.message.content


@pytest.mark.slow
def test_tool_choice_none_required_and_named(pair):
    tools = [GET_WEATHER, GET_TIME]
    none = pair.chat.completions.create(messages=ASK, tools=tools, tool_choice="none", **GREEDY).choices[0]
    assert none.finish_reason == "stop" and none.message.tool_calls is None and none.message.content
    required = pair.chat.completions.create(messages=ASK, tools=tools, tool_choice="required", **GREEDY).choices[0]
    assert required.finish_reason == "tool_calls"
    assert [(c.function.name, city(c)) for c in required.message.tool_calls] == [("get_weather", "Paris")]
    # A tool the question does not call for, named: called all the same.
    named = {"type": "function", "function": {"name": "get_time"}}
    chunks = pair.chat.completions.create(messages=ASK, tools=tools, tool_choice=named, stream=True, **GREEDY)
    content, calls, finish = streamed_reply(chunks)
    assert finish == "tool_calls" and [c["name"] for c in calls] == ["get_time"]
    assert isinstance(json.loads(calls[0]["arguments"]), dict)


@pytest.mark.slow
def test_two_cities_give_two_calls_or_the_first_only_without_parallel_calls(pair):
    """Two cities: two calls (the model writes both in one fenced block), or the first only."""
    ask = [
        {
            "role": "user",
            "content": "What is the weather in Paris and in London right now? Call the tool once for each city.",
        }
    ]
    both = pair.chat.completions.create(messages=ask, tools=[GET_WEATHER, GET_TIME], **GREEDY).choices[0]
    assert [city(c) for c in both.message.tool_calls] == ["Paris", "London"]
    assert len({c.id for c in both.message.tool_calls}) == 2
    first = pair.chat.completions.create(
        messages=ask, tools=[GET_WEATHER, GET_TIME], parallel_tool_calls=False, **GREEDY
    ).choices[0]
    assert [city(c) for c in first.message.tool_calls] == ["Paris"] and first.finish_reason == "tool_calls"
