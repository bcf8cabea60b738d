"""Replies whose reading depends on how serve's prompt ends, read as llama.cpp reads them
(tests/test-chat.cpp's replies): MiniMax M3's bare "</mm:think>", where its prompt opened no block.
Each template is the real one, rendered by serve for a tiny model, and each reply is read by the
reader serve builds for that prompt, whole and split at every character."""

import pytest
import tool_templates
from serving import ASK, GET_WEATHER, templated_server

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
    for delta in deltas:
        for key, value in delta.items():
            joined[key] += value
    streamed = (joined["reasoning"], joined["text"], [call["function"] for call in joined["tool_calls"]])
    return whole, streamed


def assert_read(srv, reply: str, expected: tuple, **fields):
    """The reply, whole, split in two at every character and character by character, gives the
    message `expected` (reasoning, content, calls), streamed and not."""
    for pieces in ([reply], list(reply), *([reply[:cut], reply[cut:]] for cut in range(len(reply) + 1))):
        assert read(srv, pieces, **fields) == (expected, expected), pieces


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
