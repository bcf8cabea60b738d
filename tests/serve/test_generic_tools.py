"""The generic tool format's parts on their own (serve/generic_tools.py): the reply schema, the
conversation written as text, and the reply read back, whole and split at every point."""

import json

import pytest

from specllm.llama.grammar import schema_grammar
from specllm.serve.generic_tools import GenericReader, in_text, reply_schema, with_system_text
from specllm.serve.tool_calls import ToolCall

NAMES = ["get_weather", "get_time"]
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": ""}},  # no parameters: any object
]


def read(pieces: list[str]) -> list:
    """The parts read from the reply fed in `pieces`, texts joined as a client joins them."""
    reader, parts = GenericReader(NAMES), []
    for piece in pieces:
        parts += reader.feed_in_order(piece)
    parts += reader.finish_in_order()
    return ["".join(p for p in parts if isinstance(p, str)) or None, [p for p in parts if isinstance(p, ToolCall)]]


REPLIES = [
    ('{"response": "Hello"}', ["Hello", []]),
    (
        '{ "response" :\n "a\\"b\\\\n\\n\\u00e9 \\ud83d\\ude00 \\ud800 x\\/" }',
        ['a"b\\n\né \U0001f600 \ufffd x/', []],  # escapes, a surrogate pair, a lone surrogate
    ),
    (
        '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}',
        [None, [ToolCall("get_weather", '{"city": "Paris"}')]],
    ),
    (
        '{"tool_calls": [{"name": "get_time", "arguments": {}}, '
        '{"name": "get_weather", "arguments": {"city": "Été"}}]}',
        [None, [ToolCall("get_time", "{}"), ToolCall("get_weather", '{"city": "Été"}')]],
    ),
    ('{"response": {"n": [1, 2]}}', ['{"n": [1, 2]}', []]),  # a structured answer: its JSON as written
    ('{"response": "cut short \\u00', ["cut short ", []]),  # max_tokens: the string so far
    ('{"tool_call": {"name": "get_weather", "argum', ['{"tool_call": {"name": "get_weather", "argum', []]),
    ("", [None, []]),
]


@pytest.mark.parametrize("reply,expected", REPLIES, ids=range(len(REPLIES)))
def test_a_reply_is_read_the_same_whole_and_split_anywhere(reply, expected):
    assert read([reply]) == expected
    for i in range(len(reply) + 1):
        assert read([reply[:i], reply[i:]]) == expected, i
    assert read(list(reply)) == expected  # a character at a time


def test_an_answer_is_handed_out_as_it_grows():
    reader = GenericReader(NAMES)
    assert reader.feed_in_order('{"response": "Hel') == ["Hel"]
    assert reader.feed_in_order("lo \\") == ["lo "]  # an escape only once whole
    assert reader.feed_in_order('ud83d\\ude00"') == ["\U0001f600"]
    assert reader.feed_in_order("}") == [] and reader.finish_in_order() == []


def test_a_call_is_handed_out_at_the_end():
    reader = GenericReader(NAMES)
    assert reader.feed_in_order('{"tool_call": {"name": "get_time", "arguments": {}}}') == []
    assert reader.finish_in_order() == [ToolCall("get_time", "{}")]


def test_the_reply_schema_allows_what_the_request_does():
    def called(name: str, arguments: dict) -> dict:
        properties = {"name": {"type": "string", "const": name}, "arguments": arguments}
        return {"type": "object", "properties": properties, "required": ["name", "arguments"]}

    call = {"anyOf": [called("get_weather", WEATHER), called("get_time", {"type": "object"})]}
    calls = {
        "type": "object",
        "properties": {"tool_calls": {"type": "array", "items": call, "minItems": 1}},
        "required": ["tool_calls"],
    }
    answer = {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"]}
    assert reply_schema(TOOLS, None, False, True, None) == {"anyOf": [calls, answer]}
    assert reply_schema(TOOLS, None, True, True, None) == calls
    one = {"type": "object", "properties": {"tool_call": call["anyOf"][1]}, "required": ["tool_call"]}
    assert reply_schema(TOOLS, "get_time", True, False, None) == one
    structured = reply_schema(TOOLS, None, False, False, WEATHER)["anyOf"][1]
    assert structured == {"type": "object", "properties": {"response": WEATHER}, "required": ["response"]}
    for schema in (reply_schema(TOOLS, None, False, True, None), one, structured):
        assert schema_grammar(schema)  # each makes a grammar


def test_parameters_and_an_answer_that_refer_within_themselves_keep_their_refs():
    """pydantic's schemas (the OpenAI client's pydantic_function_tool) refer into their own $defs,
    a recursive one to its root: embedded in the reply's schema, they still point at them."""
    city = {"type": "string", "maxLength": 8}
    nested = {"$defs": {"City": city}, "properties": {"city": {"$ref": "#/$defs/City"}}, "required": ["city"]}
    tree = {"properties": {"kids": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}}, "required": ["kids"]}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": nested}}, TOOLS[1]]
    schema = reply_schema(tools, None, False, True, tree)
    weather = "tools.0.function.parameters"
    assert schema["$defs"] == {
        weather: nested | {"properties": {"city": {"$ref": f"#/$defs/{weather}/$defs/City"}}},
        "response_format": tree
        | {"properties": {"kids": tree["properties"]["kids"] | {"items": {"$ref": "#/$defs/response_format"}}}},
    }
    calls = schema["anyOf"][0]["properties"]["tool_calls"]["items"]["anyOf"]
    assert calls[0]["properties"]["arguments"] == {"$ref": f"#/$defs/{weather}"}
    assert calls[1]["properties"]["arguments"] == {"type": "object"}  # no $ref: as it is
    assert schema["anyOf"][1]["properties"]["response"] == {"$ref": "#/$defs/response_format"}
    assert schema_grammar(schema)
    assert schema_grammar(reply_schema(tools, "get_weather", True, False, None))


def test_earlier_calls_and_results_are_written_as_text():
    call = {"id": "a1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Looking.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "a1", "content": "18 C"},
        {"role": "tool", "tool_call_id": "zz", "content": "?", "name": "get_time"},
        {"role": "assistant", "content": "18 C."},
    ]
    written = {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}], "content": "Looking."}
    results = (
        '{"tool_response": {"tool": "get_weather", "content": "18 C"}}\n'
        '{"tool_response": {"tool": "get_time", "content": "?"}}'
    )
    assert in_text(messages, True) == [
        messages[0],
        messages[1],
        {"role": "assistant", "content": json.dumps(written)},
        {"role": "user", "content": results},
        messages[5],
    ]
    single = in_text(messages[1:3], False)[1]["content"]
    assert json.loads(single) == {"tool_call": written["tool_calls"][0], "content": "Looking."}


def test_the_tools_go_after_the_system_message_s_text_or_in_a_new_one():
    user = {"role": "user", "content": "Hi"}
    assert with_system_text([user], "T") == [{"role": "system", "content": "T"}, user]
    assert with_system_text([{"role": "system", "content": "S"}, user], "T") == [
        {"role": "system", "content": "S\n\nT"},
        user,
    ]
    assert with_system_text([{"role": "system", "content": ""}, user], "T") == [
        {"role": "system", "content": "T"},
        user,
    ]
