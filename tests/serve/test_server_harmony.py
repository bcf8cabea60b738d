"""gpt-oss (OpenAI's harmony format) in `specllm serve`, with the real `openai` client, on the tiny
target with gpt-oss's markup tokens and its whole chat template: llama.cpp writes the markup as text,
the template takes reasoning and calls back, a forced call begins as gpt-oss writes one, and
reasoning_effort reaches the template. ChatReply reads fixed gpt-oss replies, split anywhere."""

import json

import pytest
import tiny_models as tm
import tool_templates
from serving import ASK, CALL, GET_WEATHER, GREEDY, NAMED, PARAMETERS, Server, read_reply, templated_server

from specllm.engine.harmony import CALL_CLOSE, CALL_HEADER, CALL_OPEN

# A gpt-oss reply as llama.cpp writes it (<|call|> ends generation and is left out of the text)
REPLY = (
    "<|channel|>analysis<|message|>The user wants the weather. Use the tool.<|end|>"
    "<|start|>assistant<|channel|>commentary<|message|>Let me check.<|end|>"
    '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'
)


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    """(engine, server) of a tiny model with gpt-oss's markup tokens and chat template."""
    yield from templated_server(tmp_path_factory, "gpt-oss", tool_templates.GPT_OSS, vocab="harmony")


def test_llama_cpp_writes_the_markup_as_text_and_ends_at_return_and_call(gpt_oss):
    """What reading a gpt-oss reply rests on: its markers are in the generated text, <|end|>
    between two messages does not end generation, <|return|> and <|call|> do."""
    engine, _ = gpt_oss
    target = engine.target
    for marker in tm.HARMONY_PIECES:
        [token] = target.tokenize(marker, add_special=False)
        written = target.piece(token).decode()
        ends = target.is_eog(token)
        if marker in ("<|return|>", "<|call|>"):
            assert ends, marker
        else:
            assert (written, ends) == (marker, False)


def test_a_reply_gives_its_reasoning_its_preamble_and_its_call_however_it_comes():
    message, _ = read_reply([REPLY])
    [call] = message["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert message["reasoning_content"] == "The user wants the weather. Use the tool."
    assert message["content"] == "Let me check."
    for cut in range(0, len(REPLY) + 1, 3):
        again, streamed = read_reply([REPLY[:cut], REPLY[cut:]])
        assert [c["function"] for c in again["tool_calls"]] == [call["function"]]
        assert (again["content"], again["reasoning_content"]) == (message["content"], message["reasoning_content"])
        assert (streamed["text"], streamed["reasoning"]) == (message["content"], message["reasoning_content"])


def test_a_call_to_a_tool_not_offered_stays_text_and_an_answer_is_content():
    other = REPLY.replace("get_weather", "get_time")
    message, _ = read_reply([other])
    assert "tool_calls" not in message
    assert (
        message["content"]
        == "Let me check.\n\n" + CALL_OPEN + "functions.get_time" + CALL_HEADER + '{"city": "Paris"}' + CALL_CLOSE
    )
    final = "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>It is sunny."
    assert read_reply([final])[0] == {"role": "assistant", "content": "It is sunny.", "reasoning_content": "Easy."}


def test_a_forced_call_begins_as_gpt_oss_writes_one(gpt_oss):
    """A named call is begun in the prompt as the template writes a call (the recipient in the
    role header); the tiny model's noise never finishes its arguments, so the message holds the
    call's text, with no reasoning; the model going on with JSON makes it a call."""
    engine, srv = gpt_oss
    client = srv.client()
    request = dict(messages=ASK, tools=[GET_WEATHER], tool_choice=NAMED, **GREEDY)
    whole = client.chat.completions.create(**request)
    message = whole.choices[0].message.to_dict()
    begun = CALL_OPEN + "functions.get_weather" + CALL_HEADER
    assert message["content"].startswith(begun) and "reasoning_content" not in message
    prompt = engine.target.render_chat(ASK, tools=[GET_WEATHER])
    prefill = " to=functions.get_weather<|channel|>commentary json<|message|>"
    assert prompt.endswith("<|start|>assistant")
    assert whole.usage.prompt_tokens == len(engine.prompt_tokens(prompt + prefill))
    message, _ = read_reply(['{"city": "Paris"}'], prefill=prefill)
    assert [c["function"]["arguments"] for c in message["tool_calls"]] == ['{"city": "Paris"}']


def test_a_tool_without_a_description_is_rendered_with_an_empty_one(gpt_oss):
    """gpt-oss's template writes "// " + the tool's description, which fails without one: serve
    passes an empty one, as llama-server does."""
    engine, srv = gpt_oss
    bare = {"type": "function", "function": {"name": "get_weather", "parameters": PARAMETERS}}
    reply = srv.client().chat.completions.create(messages=ASK, tools=[bare], **GREEDY)
    described = {"type": "function", "function": {"name": "get_weather", "description": "", "parameters": PARAMETERS}}
    prompt = engine.target.render_chat(ASK, tools=[described])
    assert "type get_weather = (_: {" in prompt
    assert reply.usage.prompt_tokens == len(engine.prompt_tokens(prompt))


def test_reasoning_and_calls_sent_back_reach_the_template(gpt_oss):
    """gpt-oss's template reads an assistant's reasoning as `thinking`, and refuses a call's
    message with content and thinking both: the reasoning of the call is rendered, the content
    left out, and the call and its result follow."""
    engine, srv = gpt_oss
    turns = ASK + [
        {"role": "assistant", "content": "Let me check.", "reasoning_content": "Ask the tool.", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "abc123XYZ", "content": "18 C"},
    ]
    reply = srv.client().chat.completions.create(messages=turns, tools=[GET_WEATHER], **GREEDY)
    assert reply.choices[0].finish_reason in ("length", "stop", "tool_calls")
    call = dict(CALL, function={"name": "get_weather", "arguments": {"city": "Paris"}})
    prompt = engine.target.render_chat([ASK[0], dict(turns[1], tool_calls=[call]), turns[2]], tools=[GET_WEATHER])
    assert "<|start|>assistant<|channel|>analysis<|message|>Ask the tool.<|end|>" in prompt
    assert "Let me check." not in prompt
    assert '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}' in prompt
    assert '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"18 C"<|end|>' in prompt
    assert reply.usage.prompt_tokens == len(engine.prompt_tokens(prompt))


def test_reasoning_effort_reaches_the_template(gpt_oss):
    engine, srv = gpt_oss
    client = srv.client()
    for effort in ("low", "high"):
        reply = client.chat.completions.create(messages=ASK, reasoning_effort=effort, **GREEDY)
        prompt = engine.target.render_chat(ASK, variables={"reasoning_effort": effort})
        assert f"Reasoning: {effort}" in prompt
        assert reply.usage.prompt_tokens == len(engine.prompt_tokens(prompt))
    # the request's field wins over chat_template_kwargs, as llama-server has it
    reply = client.chat.completions.create(
        messages=ASK,
        reasoning_effort="high",
        extra_body={"chat_template_kwargs": {"reasoning_effort": "low"}},
        **GREEDY,
    )
    high = engine.target.render_chat(ASK, variables={"reasoning_effort": "high"})
    assert reply.usage.prompt_tokens == len(engine.prompt_tokens(high))


@pytest.mark.parametrize("effort", [" ", 3, ["high"]])
def test_a_reasoning_effort_that_is_no_level_gets_a_400(gpt_oss, effort):
    _, srv = gpt_oss
    body = {"messages": ASK, "max_tokens": 2, "reasoning_effort": effort}
    status, data = srv.post("/v1/chat/completions", json.dumps(body).encode())
    assert (status, data["error"]["param"]) == (400, "reasoning_effort")


def test_a_costly_grammar_is_timed_though_the_reply_begins_in_analysis(gpt_oss):
    """gpt-oss's reply begins with free analysis messages, its final message under the grammar:
    the grammar is timed as that message's, and a costly one refused before anything is generated
    (its first steps' masks, the header's, were cheap)."""
    engine, _ = gpt_oss
    srv = Server(engine, grammar_budget=0.2)
    costly = "root ::= " + " ".join(['"x"?'] * 1200)  # over a second a mask on the tiny vocabulary
    body = {"messages": [{"role": "user", "content": "Hi"}], "grammar": costly, "max_tokens": 4}
    try:
        status, data = srv.post("/v1/chat/completions", json.dumps(body).encode())
    finally:
        srv.stop()
        srv.worker.grammar_cost.join()
    assert status == 400 and data["error"]["code"] == "grammar_too_costly", data
