"""Replies whose reading depends on how serve's prompt ends, read as llama.cpp reads them
(tests/test-chat.cpp's replies): functionary v3.2's, whose prompt writes the first recipient's
">>>"; a call made inside the think block the prompt opened (Ling 3.0, Qwen3.5, Nemotron 3,
DeepSeek V3.2), and MiniMax M3's bare "</mm:think>". Each template is the real one, rendered by
serve for a tiny model, and each reply is read by the reader serve builds for that prompt, whole
and split at every character."""

import pytest
import tool_templates
from serving import ASK, GET_WEATHER, GREEDY, NAMED, templated_server

from specllm.serve.openai_api import ChatRequest

GET_TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TOOLS = [GET_WEATHER, GET_TIME]
PARIS = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
TIME_IN_PARIS = {"name": "get_time", "arguments": '{"city": "Paris"}'}


def rendered(srv, **fields):
    """The prompt serve renders for a chat request of ASK and `fields`, and the reader of its reply."""
    return srv.worker.render_chat(ChatRequest.model_validate({"model": "x", "messages": ASK, **fields}))


def read(srv, pieces: list[str], **fields) -> tuple[tuple, tuple]:
    """A reply in these pieces read by serve's reader: (reasoning, content, calls) of the message,
    and of the deltas a stream sends, joined."""
    _, reply = rendered(srv, **fields)
    deltas = [reply.feed(piece) for piece in pieces] + [reply.finish()]
    message = reply.message()
    calls = [call["function"] for call in message.get("tool_calls", [])]
    whole = (message.get("reasoning_content", ""), message["content"] or "", calls)
    joined: dict = {"reasoning": "", "text": "", "tool_calls": []}
    for part in (part for delta in deltas for part in delta):
        for key, value in part.items():
            joined[key] += value
    streamed = (joined["reasoning"], joined["text"], [call["function"] for call in joined["tool_calls"]])
    return whole, streamed


def assert_read(srv, reply: str, expected: tuple, **fields):
    """The reply, whole, split in two at every character and character by character, gives the
    message `expected` (reasoning, content, calls), streamed and not."""
    for pieces in ([reply], list(reply), *([reply[:cut], reply[cut:]] for cut in range(len(reply) + 1))):
        assert read(srv, pieces, **fields) == (expected, expected), pieces


# --- functionary v3.2 -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def functionary(tmp_path_factory):
    yield from templated_server(tmp_path_factory, "functionary", tool_templates.FUNCTIONARY_V32)


def test_functionarys_prompt_writes_the_first_recipients_mark(functionary):
    """Its prompt ends with ">>>": the reply begins with the recipient alone."""
    _, srv = functionary
    prompt, _ = rendered(srv, tools=TOOLS)
    assert prompt.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n>>>")


FUNCTIONARY_REPLIES = [
    ("all\nHello, world!\nWhat's up?", ("", "Hello, world!\nWhat's up?", [])),  # text to the user
    ('get_weather\n{"city": "Paris"}', ("", "", [PARIS])),  # a call, its arguments as JSON
    (
        'all\nLet me check.\n>>>get_weather\n{"city": "Paris"}\n>>>get_time\n{"city": "Paris"}',
        ("", "Let me check.", [PARIS, TIME_IN_PARIS]),
    ),
    ('get_weather\n{"city": "a >>> b"}', ("", "", [{"name": "get_weather", "arguments": '{"city": "a >>> b"}'}])),
    ('get_weather\n{"city": "Paris"}>>>all\nDone.', ("", "Done.", [PARIS])),
    ('get_weather\n{"city": "Paris"}>>>get_ti', ("", "", [PARIS])),  # a recipient line the end cut short
    ("Hello, world!", ("", "Hello, world!", [])),  # no recipient: as written
]


@pytest.mark.parametrize("reply,expected", FUNCTIONARY_REPLIES, ids=range(len(FUNCTIONARY_REPLIES)))
def test_functionarys_replies_are_read_after_its_prompts_recipient_mark(functionary, reply, expected):
    """ "all" is text to the user, any other recipient a call: they were the content as written,
    "all\\n" and the calls' names and arguments in it."""
    _, srv = functionary
    assert_read(srv, reply, expected, tools=TOOLS)


def test_functionarys_text_without_tools_is_read_the_same(functionary):
    _, srv = functionary
    assert_read(srv, "all\nHello, world!\nWhat's up?", ("", "Hello, world!\nWhat's up?", []))


def test_functionarys_call_without_tools_is_content_as_it_writes_one(functionary):
    """As llama-server's content has a call after "all\\n": as written, ">>>" before its name (a
    reply that begins with one was a 500 there); it was the content in gpt-oss's markup."""
    _, srv = functionary
    call = '>>>get_weather\n{"city": "Paris"}'
    assert_read(srv, call.removeprefix(">>>"), ("", call, []))
    assert_read(srv, "all\nLet me check.\n" + call, ("", "Let me check.\n" + call, []))


def test_a_call_to_functionary_that_must_be_made_begins_with_its_recipient(functionary):
    """A named tool_choice begins the reply with the tool's recipient line (after the prompt's
    ">>>"), and the model goes on with the arguments: a call. It began with the generic JSON call."""
    _, srv = functionary
    prompt, _ = rendered(srv, tools=TOOLS, tool_choice=NAMED)
    assert prompt.endswith("\n\n>>>get_weather\n")
    assert_read(srv, '{"city": "Paris"}', ("", "", [PARIS]), tools=TOOLS, tool_choice=NAMED)


# --- a call inside the think block the prompt opened --------------------------------------------


@pytest.fixture(scope="module")
def ling3(tmp_path_factory):
    yield from templated_server(tmp_path_factory, "ling3", tool_templates.LING3)


LING_CALL = "<tool_call>get_time\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>"
LING_REPLIES = [
    # before the block is closed: the call ends it, the text before it reasoning
    ("I need to check the time first.\n" + LING_CALL, ("I need to check the time first.", "", [TIME_IN_PARIS])),
    (
        "Let me check the time.\n</think>\nChecking it now.\n" + LING_CALL,
        ("Let me check the time.", "Checking it now.", [TIME_IN_PARIS]),
    ),
    ("</think>\n" + LING_CALL + "\n" + LING_CALL, ("", "", [TIME_IN_PARIS, TIME_IN_PARIS])),
    ("Still thinking about <tool_ca", ("Still thinking about <tool_ca", "", [])),
]


@pytest.mark.parametrize("reply,expected", LING_REPLIES, ids=range(len(LING_REPLIES)))
def test_ling3s_call_ends_the_think_block_its_prompt_opened(ling3, reply, expected):
    """Ling 3.0's prompt opens a think block ("<role>ASSISTANT</role>\\n<think>") and the model
    may call before it closes it: llama.cpp reads the call as one. It was reasoning."""
    _, srv = ling3
    prompt, _ = rendered(srv, tools=TOOLS)
    assert prompt.endswith("<role>ASSISTANT</role>\n<think>")
    assert_read(srv, reply, expected, tools=TOOLS)


def test_ling3s_reply_stops_where_it_spells_its_turns_end(ling3, ling3_turn_end):
    """ "<|role_end|>" in text tokens ends no generation: a stop string of every chat request, as
    llama-server adds it. It ran on to max_tokens."""
    engine, srv = ling3
    client = srv.client()
    raw = client.completions.create(prompt=engine.target.render_chat(ASK), **GREEDY).choices[0].text
    at = len(raw) // 2
    ling3_turn_end(raw[at : at + 3])
    assert raw.find(raw[at : at + 3]) == at
    choice = client.chat.completions.create(messages=ASK, **GREEDY).choices[0]
    message = choice.message.model_dump()
    assert (message.get("reasoning_content", "") + (message["content"] or ""), choice.finish_reason) == (
        raw[:at].strip(),
        "stop",
    )
    unended = client.completions.create(prompt=engine.target.render_chat(ASK), **GREEDY).choices[0]
    assert (unended.text, unended.finish_reason) == (raw, "length")  # a prompt of the caller's own: as llama-server


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory):
    yield from templated_server(tmp_path_factory, "qwen35", tool_templates.QWEN35)


@pytest.fixture(scope="module")
def nemotron3(tmp_path_factory):
    yield from templated_server(tmp_path_factory, "nemotron3", tool_templates.NEMOTRON3)


@pytest.fixture(scope="module")
def deepseek_v32(tmp_path_factory):
    yield from templated_server(tmp_path_factory, "deepseek_v32", tool_templates.DEEPSEEK_V32)


XML_CALL = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
DSML_CALL = (
    '<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">'
    "Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>"
)


@pytest.mark.parametrize(
    "name,call,variables",
    [("qwen35", XML_CALL, {}), ("nemotron3", XML_CALL, {}), ("deepseek_v32", DSML_CALL, {"thinking": True})],
)
def test_the_neighbours_calls_end_the_think_block_as_llama_cpp_reads_them(request, name, call, variables):
    """Qwen3.5's and Nemotron 3's calls (llama.cpp's Qwen3-Coder parser) and DeepSeek V3.2's
    (with thinking) end a think block left open, as Ling 3.0's do; the reasoning stays apart."""
    _, srv = request.getfixturevalue(name)
    fields = {"tools": TOOLS, "chat_template_kwargs": variables}
    assert rendered(srv, **fields)[0].rstrip().endswith("<think>")
    assert_read(srv, "I should look it up.\n\n" + call, ("I should look it up.", "", [PARIS]), **fields)


@pytest.fixture(scope="module")
def glm47(tmp_path_factory):
    yield from templated_server(tmp_path_factory, "glm47", tool_templates.GLM47)


def test_other_models_reasoning_may_write_a_call(glm47):
    """GLM 4.7's calls are Ling's, but llama.cpp ends its reasoning at "</think>" only: a call its
    reasoning writes is reasoning."""
    _, srv = glm47
    call = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"
    reply = f"Maybe {call} would do.</think>Sunny."
    assert_read(srv, reply, (f"Maybe {call} would do.", "Sunny.", []), tools=TOOLS)


# --- MiniMax M3: a bare closing marker ----------------------------------------------------------


@pytest.fixture(scope="module")
def minimax_m3(tmp_path_factory):
    yield from templated_server(tmp_path_factory, "minimax_m3", tool_templates.MINIMAX_M3)


M3 = "]<]minimax[>["
M3_CALL = f'{M3}<tool_call>\n{M3}<invoke name="get_weather">{M3}<city>Paris{M3}</city>{M3}</invoke>\n{M3}</tool_call>'


@pytest.mark.parametrize("tools", [None, TOOLS], ids=["text", "tools"])
def test_minimax_m3s_turn_without_reasoning_begins_with_a_bare_closing_marker(minimax_m3, tools):
    """Its prompt ("]~b]ai\\n") opens no think block, and a turn without reasoning begins with
    "</mm:think>" alone: no part of the answer (it was in the content)."""
    _, srv = minimax_m3
    fields = {"tools": tools} if tools else {}
    prompt, _ = rendered(srv, **fields)
    assert prompt.endswith("]~b]ai\n")
    assert_read(srv, "</mm:think>Hello, world!\nWhat's up?", ("", "Hello, world!\nWhat's up?", []), **fields)
    if tools:
        assert_read(srv, "</mm:think>" + M3_CALL, ("", "", [PARIS]), **fields)
