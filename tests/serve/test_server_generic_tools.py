"""Tools for a model whose chat template renders none (serve/generic_tools.py), over HTTP with the
real `openai` client, on the tiny pair with a plain ChatML template: the tools told in the system
message, the reply a grammar's JSON read back as calls or content, earlier calls and results as
text, streamed as whole. (The tiny model's replies are noise: its strings are bounded by the
tools' schemas so that its calls end.)"""

import json

import openai
import pydantic
import pytest
from serving import Server

import specllm

CTX = 2048


def function(name: str, properties: dict) -> dict:
    parameters = {"type": "object", "properties": properties, "required": list(properties)}
    return {
        "type": "function",
        "function": {"name": name, "description": f"{name} of a place", "parameters": parameters},
    }


GET_WEATHER = function("get_weather", {"city": {"type": "string", "maxLength": 12}})
GET_TIME = function("get_time", {"offset": {"type": "integer", "minimum": -12, "maximum": 12}})
TOOLS = [GET_WEATHER, GET_TIME]
ASK = [{"role": "user", "content": "Weather in Paris?"}]  # the tiny model calls a tool here
GREETING = [{"role": "user", "content": "hi"}]  # the tiny model answers this one rather than call
GREEDY = {"model": "x", "temperature": 0, "max_tokens": 300}
CALL = {"id": "abc123XYZ", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
ANSWERED = ASK + [
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "abc123XYZ", "content": "18 C, cloudy"},
]


@pytest.fixture(scope="module")
def chatml(tiny_models):
    """The tiny pair (ChatML, which renders no tools) served."""
    engine = specllm.load(str(tiny_models.target), draft=str(tiny_models.draft), n_ctx=CTX, n_threads=1)
    srv = Server(engine)
    yield srv
    srv.stop()
    engine.close()


def follows_its_schema(call) -> bool:
    """Whether a call's arguments are what its tool's schema (GET_WEATHER's or GET_TIME's) takes."""
    arguments = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        return list(arguments) == ["city"] and isinstance(arguments["city"], str) and len(arguments["city"]) <= 12
    offset = arguments.get("offset")
    return list(arguments) == ["offset"] and type(offset) is int and -12 <= offset <= 12


def test_a_call_comes_back_as_tool_calls_with_arguments_its_schema_takes(chatml):
    whole = chatml.client().chat.completions.create(messages=ASK, tools=TOOLS, **GREEDY)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.function.name in ("get_weather", "get_time") and follows_its_schema(call)


def test_an_answer_comes_back_as_content(chatml):
    whole = chatml.client().chat.completions.create(messages=GREETING, tools=TOOLS, **GREEDY)
    choice = whole.choices[0]
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None
    assert choice.message.content and not choice.message.content.startswith("{")  # the response's string


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_required_and_a_named_tool_force_a_call(chatml, choice):
    whole = chatml.client().chat.completions.create(messages=GREETING, tools=TOOLS, tool_choice=choice, **GREEDY)
    calls = whole.choices[0].message.tool_calls
    assert whole.choices[0].finish_reason == "tool_calls" and calls and all(map(follows_its_schema, calls))
    if isinstance(choice, dict):
        assert {call.function.name for call in calls} == {"get_time"}


def test_tool_choice_none_leaves_the_tools_out(chatml):
    client = chatml.client()
    none = client.chat.completions.create(messages=ASK, tools=TOOLS, tool_choice="none", **GREEDY | {"max_tokens": 8})
    plain = client.chat.completions.create(messages=ASK, **GREEDY | {"max_tokens": 8})
    assert none.choices[0].message.tool_calls is None
    assert none.choices[0].message.content == plain.choices[0].message.content
    assert prompt(chatml, ASK, tools=TOOLS, tool_choice="none") == prompt(chatml, ASK)


def prompt(srv, messages, **fields) -> str:
    status, data = srv.post("/apply-template", json.dumps({"messages": messages} | fields).encode())
    assert status == 200, data
    return data["prompt"]


def told(choice: str, parallel: bool = True) -> str:
    """What the system message says after the tools (generic_tools.instructions)."""
    call = '{"name": "...", "arguments": {...}}'
    calling = f'{{"tool_calls": [{call}, ...]}}' if parallel else f'{{"tool_call": {call}}}'
    if choice == "required":
        return f"Respond in JSON format with a request to call tools: {calling}"
    key = "tool_calls" if parallel else "tool_call"
    return (
        f"Respond in JSON format, either with `{key}` (a request to call tools: {calling}) or with `response` "
        f'(your reply to the user\'s request: {{"response": "..."}})'
    )


def described(tools) -> str:
    return "You can call any of the following tools to satisfy the user's requests: " + json.dumps(tools, indent=2)


def test_the_tools_are_told_in_the_system_message(chatml):
    assert prompt(chatml, ASK, tools=[GET_WEATHER]) == (
        f"<|im_start|>system\n{described([GET_WEATHER])}\n\n{told('auto')}<|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n"
    )
    system = [{"role": "system", "content": "Be brief."}]
    assert prompt(chatml, system + ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False) == (
        f"<|im_start|>system\nBe brief.\n\n{described(TOOLS)}\n\n{told('required', False)}<|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n"
    )
    named = {"type": "function", "function": {"name": "get_time"}}
    assert prompt(chatml, ASK, tools=TOOLS, tool_choice=named).startswith(
        f"<|im_start|>system\n{described(TOOLS)}\n\nRespond in JSON format with a call to the tool `get_time`: "
        '{"tool_calls": [{"name": "...", "arguments": {...}}, ...]}<|im_end|>\n'
    )


def test_a_follow_up_renders_the_call_and_its_result_and_answers(chatml):
    second = {"id": "def456XYZ", "type": "function", "function": {"name": "get_time", "arguments": '{"offset": 1}'}}
    both = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [CALL, second]},
        {"role": "tool", "tool_call_id": "abc123XYZ", "content": "18 C, cloudy"},
        {"role": "tool", "tool_call_id": "def456XYZ", "content": "14:00"},
    ]
    calls = (
        '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "get_time", "arguments": {"offset": 1}}]}'
    )
    results = (
        '{"tool_response": {"tool": "get_weather", "content": "18 C, cloudy"}}\n'
        '{"tool_response": {"tool": "get_time", "content": "14:00"}}'
    )
    conversation = (
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        f"<|im_start|>assistant\n{calls}<|im_end|>\n<|im_start|>user\n{results}<|im_end|>\n<|im_start|>assistant\n"
    )
    assert prompt(chatml, both) == conversation  # no tools offered: the earlier turns still as text
    offered = prompt(chatml, both, tools=TOOLS)
    assert offered == f"<|im_start|>system\n{described(TOOLS)}\n\n{told('auto')}<|im_end|>\n" + conversation
    # One call without parallel calls is written as the reply would write it
    single = prompt(chatml, ANSWERED, tools=TOOLS, parallel_tool_calls=False)
    assert '<|im_start|>assistant\n{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}' in single
    answer = chatml.client().chat.completions.create(messages=both, tools=TOOLS, **GREEDY)
    message = answer.choices[0].message
    assert message.content or message.tool_calls  # an answer (the tiny model's may be cut by max_tokens) or calls


def streamed_message(chunks) -> tuple:
    content, calls, finish = "", {}, None
    for chunk in chunks:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                calls[delta.index] = (delta.function.name, delta.function.arguments)  # each call whole, at once
            finish = choice.finish_reason or finish
    return content or None, [calls[i] for i in sorted(calls)] or None, finish


def whole_message(response) -> tuple:
    choice = response.choices[0]
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or ()] or None
    return choice.message.content, calls, choice.finish_reason


STREAMED = [
    {"messages": ASK, "tools": TOOLS},
    {"messages": GREETING, "tools": TOOLS},
    {"messages": GREETING, "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False},
    {"messages": ANSWERED, "tools": TOOLS},
    {"messages": GREETING, "tools": TOOLS, "max_tokens": 26},  # cut inside the answer's string
    {"messages": GREETING, "tools": TOOLS, "max_tokens": 12},  # cut before it: the JSON as written
]


@pytest.mark.parametrize("request_", STREAMED, ids=["call", "answer", "required", "follow-up", "cut", "cut-early"])
def test_streaming_gives_the_same_message(chatml, request_):
    client = chatml.client()
    whole = whole_message(client.chat.completions.create(**GREEDY | request_))
    chunks = list(client.chat.completions.create(**GREEDY | request_, stream=True))
    assert streamed_message(chunks) == whole
    if request_ is STREAMED[1]:  # an answer streams as it grows, not in one piece at the end
        assert sum(bool(c.choices and c.choices[0].delta.content) for c in chunks) > 1
    if request_ is STREAMED[4]:  # its string so far
        assert (
            whole[2] == "length"
            and whole[0]
            and whole_message(client.chat.completions.create(**GREEDY | STREAMED[1]))[0].startswith(whole[0])
        )
    if request_ is STREAMED[5]:
        assert whole[2] == "length" and whole[0].startswith('{ "response"')


@pytest.mark.parametrize("request_", STREAMED[:3], ids=["call", "answer", "required"])
def test_speculative_greedy_output_equals_target_only(chatml, request_):
    client = chatml.client()
    alone = client.chat.completions.create(**GREEDY | request_, extra_body={"drafter": "none"})
    for drafter in ("model", "ngram"):
        drafted = client.chat.completions.create(**GREEDY | request_, extra_body={"drafter": drafter})
        assert whole_message(drafted) == whole_message(alone)
        assert drafted.usage.completion_tokens == alone.usage.completion_tokens


def one_digit(answer) -> bool:
    return list(answer) == ["n"] and type(answer["n"]) is int and 0 <= answer["n"] <= 9


def test_a_structured_answer_beside_tools_is_the_response_s_json(chatml):
    """The answer is the JSON the model wrote inside the generic format's "response" (which digit,
    or which object, is the tiny model's near-tie: CPUs' kernels differ on it)."""
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["n"]}
    client = chatml.client()
    for response_format, follows in (
        ({"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}, one_digit),
        ({"type": "json_object"}, lambda answer: isinstance(answer, dict) and "response" not in answer),
    ):
        request = GREEDY | {"messages": GREETING, "tools": TOOLS, "response_format": response_format}
        whole = whole_message(client.chat.completions.create(**request))
        assert whole[1:] == (None, "stop") and follows(json.loads(whole[0])), whole  # the JSON as the model wrote it
        assert streamed_message(client.chat.completions.create(**request, stream=True)) == whole
        called = client.chat.completions.create(**request | {"messages": ASK}).choices[0]  # or a call
        assert called.finish_reason == "tool_calls" and all(map(follows_its_schema, called.message.tool_calls))


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=8)


class Place(pydantic.BaseModel):
    city: City


def test_a_pydantic_tool_and_answer_with_defs_are_taken(chatml):
    """The OpenAI client's pydantic_function_tool and response_format write $defs: their $refs
    still point at them inside the reply's schema (were a 400, "points at nothing")."""
    client = chatml.client()
    tool = openai.pydantic_function_tool(Place, name="get_weather")
    ok = [{"role": "user", "content": "ok"}]  # the tiny model answers this one beside this tool
    message = (
        client.chat.completions.parse(messages=ok, tools=[tool], response_format=Place, **GREEDY).choices[0].message
    )
    assert message.tool_calls is None and isinstance(message.parsed, Place)
    called = client.chat.completions.parse(messages=ASK, tools=[tool], tool_choice="required", **GREEDY)
    [call] = called.choices[0].message.tool_calls
    assert isinstance(call.function.parsed_arguments, Place)  # the client parsed it against the model


BAD = [
    ({"grammar": 'root ::= "a"'}, "grammar"),
    ({"tools": [function("f", {"a": {"type": "string", "pattern": "^(a$"}})]}, "tools"),
]


@pytest.mark.parametrize("fields,param", BAD, ids=["grammar", "bad-parameters"])
def test_what_the_generic_format_cannot_take_is_a_one_line_400(chatml, fields, param):
    status, data = chatml.post("/v1/chat/completions", json.dumps({"messages": ASK, "tools": TOOLS} | fields).encode())
    assert (status, data["error"]["param"]) == (400, param), data
    assert "\n" not in data["error"]["message"]
