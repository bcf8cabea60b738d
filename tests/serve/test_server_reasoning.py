"""A thinking model's reasoning in `specllm serve`, with the real `openai` client, on the tiny
target with Qwen3.5's chat template (its generation prompt opens a think block, which the tiny
model's noise never closes: all of it is reasoning). What the model writes after a closed block,
and calls in it, come from a forced call's prefill, which the reply is read as beginning with;
and ChatReply reads a fixed reply, split into chunks anywhere."""

import json

import pytest
import tool_templates
from serving import ASK, CALL, GET_WEATHER, GREEDY, NAMED, read_reply, templated_server

from specllm.engine.reasoning import split_reasoning
from specllm.serve.openai_api import ChatReply, ToolReply

NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory):
    yield from templated_server(tmp_path_factory, "qwen35", tool_templates.QWEN35)


def raw(srv, engine, messages, **variables) -> str:
    """The reply to `messages` as text, greedy, from /v1/completions: the tokens as they are."""
    prompt = engine.target.render_chat(messages, variables=variables)
    return srv.client().completions.create(prompt=prompt, **GREEDY).choices[0].text


def streamed(chunks) -> tuple[str, str, list]:
    """The reasoning, the content and the calls of a stream."""
    reasoning, content, calls = "", "", []
    for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta.to_dict()
            reasoning += delta.get("reasoning_content") or ""
            content += delta.get("content") or ""
            calls += delta.get("tool_calls") or []
    return reasoning, content, calls


def test_a_reply_in_an_open_think_block_is_reasoning_streamed_or_not(qwen35):
    """The prompt ends with "<think>\\n"; the reply never closes it (max_tokens): all of it is
    reasoning, the same tokens as the raw completion's, and no content."""
    engine, srv = qwen35
    client = srv.client()
    text = raw(srv, engine, ASK)
    whole = client.chat.completions.create(messages=ASK, **GREEDY)
    message = whole.choices[0].message.to_dict()
    assert message["reasoning_content"] == split_reasoning(text, opened=True).reasoning == text.strip()
    assert message["content"] == "" and whole.usage.completion_tokens == 12
    assert whole.choices[0].finish_reason == "length"
    for steps in (False, True):
        chunks = list(
            client.chat.completions.create(messages=ASK, stream=True, **GREEDY, extra_body={"specllm_steps": steps})
        )
        assert streamed(chunks) == (text.strip(), "", [])


def test_a_stop_string_in_the_reasoning_ends_the_reply_there(qwen35):
    """Stop strings are looked for in the whole reply, reasoning too, as llama-server does."""
    engine, srv = qwen35
    text = raw(srv, engine, ASK).strip()
    stop = text[len(text) // 2 :][:3]
    reply = srv.client().chat.completions.create(messages=ASK, stop=[stop], **GREEDY)
    message = reply.choices[0].message.to_dict()
    assert reply.choices[0].finish_reason == "stop" and message["content"] == ""
    assert message["reasoning_content"] == text[: text.index(stop)].strip()


def test_chat_template_kwargs_reach_the_template(qwen35):
    """enable_thinking false: Qwen3.5's template closes the think block in the prompt, and the
    reply is all content, exactly as generated."""
    engine, srv = qwen35
    client = srv.client()
    text = raw(srv, engine, ASK, enable_thinking=False)
    reply = client.chat.completions.create(messages=ASK, **GREEDY, extra_body=NO_THINKING)
    closed = engine.target.render_chat(ASK, variables={"enable_thinking": False})
    assert closed.endswith("<think>\n\n</think>\n\n")
    assert reply.usage.prompt_tokens == len(engine.prompt_tokens(closed))
    message = reply.choices[0].message.to_dict()
    assert message["content"] == text and "reasoning_content" not in message
    chunks = client.chat.completions.create(messages=ASK, stream=True, **GREEDY, extra_body=NO_THINKING)
    assert streamed(chunks) == ("", text, [])


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ("no", "chat_template_kwargs: Input should be an object"),
        ([{"enable_thinking": False}], "chat_template_kwargs: Input should be an object"),
        ({"messages": []}, "chat_template_kwargs: messages is set by the server, not the request"),
        ({"tools": [], "range": 1}, "chat_template_kwargs: range, tools are set by the server, not the request"),
    ],
)
def test_chat_template_kwargs_that_are_no_object_of_variables_get_a_400(qwen35, kwargs, message):
    _, srv = qwen35
    body = {"messages": ASK, "max_tokens": 2, "chat_template_kwargs": kwargs}
    status, data = srv.post("/v1/chat/completions", json.dumps(body).encode())
    assert (status, data["error"]["param"], data["error"]["message"]) == (400, "chat_template_kwargs", message)


def test_chat_template_kwargs_named_as_the_renderers_own_arguments_are_variables_too(qwen35):
    """ "template" and "self" are no variables serve sets, but named the arguments of the Python
    functions that render the template: they were a 400 saying that the model's template failed
    ("render_bounded() got multiple values for argument 'template'")."""
    engine, srv = qwen35
    variables = {"template": "x", "self": 1, "enable_thinking": False}
    prompt = engine.target.render_chat(ASK, variables=variables)
    assert prompt == engine.target.render_chat(ASK, variables={"enable_thinking": False})
    body = {"messages": ASK, "max_tokens": 2, "chat_template_kwargs": variables}
    status, data = srv.post("/v1/chat/completions", json.dumps(body).encode())
    assert status == 200 and data["usage"]["prompt_tokens"] == len(engine.prompt_tokens(prompt))


def test_reasoning_sent_back_reaches_the_template(qwen35):
    """An assistant message after the last user message (a call, then its result) keeps its
    reasoning_content: Qwen3.5's template writes it in the think block."""
    engine, srv = qwen35
    turns = ASK + [
        {"role": "assistant", "content": "", "reasoning_content": "Paris: ask the tool.", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "abc123XYZ", "content": "18 C"},
    ]
    reply = srv.client().chat.completions.create(messages=turns, tools=[GET_WEATHER], **GREEDY)
    rendered = dict(turns[1], tool_calls=[dict(CALL, function={"name": "get_weather", "arguments": {"city": "Paris"}})])
    prompt = engine.target.render_chat([ASK[0], rendered, turns[2]], tools=[GET_WEATHER])
    assert "<think>\nParis: ask the tool.\n</think>" in prompt
    assert reply.usage.prompt_tokens == len(engine.prompt_tokens(prompt))


def test_calls_are_read_from_the_answer_after_the_think_block(qwen35):
    """A named call begins after the think block the prompt opened ("\\n</think>\\n\\n<tool_call>
    ..."): the block is empty reasoning, and the call's markup begins the content (the tiny model
    leaves the call unfinished). Without thinking, the prompt closed the block itself: the call
    begins right after it, with no second </think>."""
    assert_a_named_call_follows_the_think_block(*qwen35, closing="\n</think>\n\n")


CALL_START = "<tool_call>\n<function=get_weather>\n"


def assert_a_named_call_follows_the_think_block(engine, srv, closing: str) -> None:
    """A named call's reply, whole and streamed, is content that begins with the call; its prompt
    is the rendered one, then `closing` (the think block the prompt opened ended as the template
    writes it; nothing without thinking, where the prompt closed it) and the call's start."""
    client = srv.client()
    for extra in ({}, NO_THINKING):
        request = dict(messages=ASK, tools=[GET_WEATHER], tool_choice=NAMED, **GREEDY, extra_body=extra)
        whole = client.chat.completions.create(**request)
        message = whole.choices[0].message.to_dict()
        assert message["content"].startswith(CALL_START) and "</think>" not in message["content"]
        assert "reasoning_content" not in message
        assert streamed(client.chat.completions.create(**request, stream=True)) == ("", message["content"], [])
        prompt = engine.target.render_chat(ASK, tools=[GET_WEATHER], variables=extra.get("chat_template_kwargs"))
        prefill = CALL_START if extra else closing + CALL_START
        assert whole.usage.prompt_tokens == len(engine.prompt_tokens(prompt + prefill))


@pytest.fixture(scope="module")
def nemotron3(tmp_path_factory):
    yield from templated_server(tmp_path_factory, "nemotron3", tool_templates.NEMOTRON3)


def test_a_call_that_must_be_made_is_begun_after_the_think_block_the_prompt_opened(nemotron3):
    """Nemotron 3's prompt opens a think block ("<think>\\n") that its own assistant turns write as
    "<think></think>": a named call begins by closing the block, so the call is the answer's (it
    was begun inside the block, in the generic JSON form, and read as reasoning: no call came).
    Without thinking, the prompt closed the block itself: the call follows it."""
    assert_a_named_call_follows_the_think_block(*nemotron3, closing="</think>\n")
    # The model goes on with the call as the template writes it: it is read as one.
    rest = "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
    reply = ChatReply(True, ToolReply(["get_weather"]), "</think>\n" + CALL_START)
    reply.feed(rest), reply.finish()
    message = reply.message()
    assert [call["function"] for call in message["tool_calls"]] == [
        {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    ]
    assert message["content"] is None and "reasoning_content" not in message


CALL_IN_REASONING = (
    'I could call <tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call> but no.\n'
    '</think>\n\nLet me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)


def test_calls_are_read_from_the_answer_only_however_the_reply_comes():
    """A call the reasoning writes is reasoning, as it was written; the answer's is a call."""
    text = CALL_IN_REASONING
    message, joined = read_reply([text], opened=True)
    [call] = message["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert message["content"] == "Let me check." and message["reasoning_content"] == text.split("\n</think>")[0]
    for cut in range(0, len(text) + 1, 7):
        again, streamed = read_reply([text[:cut], text[cut:]], opened=True)
        assert [c["function"] for c in again["tool_calls"]] == [call["function"]]
        assert (again["content"], again["reasoning_content"]) == (message["content"], message["reasoning_content"])
        assert (streamed["text"], streamed["reasoning"]) == (message["content"], message["reasoning_content"])


def test_reasoning_effort_none_turns_thinking_off(qwen35):
    """OpenAI's reasoning_effort "none" is enable_thinking false, as llama-server reads it."""
    engine, srv = qwen35
    reply = srv.client().chat.completions.create(messages=ASK, reasoning_effort="none", **GREEDY)
    prompt = engine.target.render_chat(ASK, variables={"enable_thinking": False})
    assert prompt != engine.target.render_chat(ASK)
    assert reply.usage.prompt_tokens == len(engine.prompt_tokens(prompt))
    assert "reasoning_content" not in reply.choices[0].message.to_dict()


# A template that opens the think block with Magistral's [THINK], a control token in its tokenizer
THINK_CONTROL_TEMPLATE = (
    "{% for m in messages %}[INST]{{ m['content'] }}[/INST]{% endfor %}{% if add_generation_prompt %}[THINK]{% endif %}"
)


@pytest.fixture(scope="module")
def magistral(tmp_path_factory):
    """A tiny model whose [THINK] and [/THINK] are control tokens it writes often (extra_scale)."""
    yield from templated_server(
        tmp_path_factory, "magistral", THINK_CONTROL_TEMPLATE, seed=1, vocab="markup", extra_scale=1.5
    )


def test_think_markers_held_as_control_tokens_are_shown_and_read(magistral):
    """Generated text shows [/THINK], though a control token (text leaves control tokens out):
    the reply's reasoning ends there and its answer follows, as for </think>."""
    engine, srv = magistral
    client = srv.client()
    request = dict(model="x", temperature=0, max_tokens=24)
    text = client.completions.create(prompt=engine.target.render_chat(ASK), **request).choices[0].text
    assert "[/THINK]" in text
    message = client.chat.completions.create(messages=ASK, **request).choices[0].message.to_dict()
    reasoning, _, answer = text.partition("[/THINK]")
    assert message["reasoning_content"] == reasoning.strip() and reasoning.strip()
    assert message["content"] == answer.lstrip() and answer.strip()


@pytest.fixture(scope="module")
def gemma4(tmp_path_factory):
    """A tiny model with Gemma 4's chat template, whose thought channel and call markers are
    control tokens."""
    yield from templated_server(tmp_path_factory, "gemma4", tool_templates.GEMMA4, vocab="markup")


def test_gemma4s_calls_are_begun_and_read_in_its_own_notation(gemma4):
    """A named call begins as Gemma 4's template writes one, after the empty thought channel its
    prompt ends with when thinking is off; the model going on with its notation makes a call,
    after a thought channel that is reasoning."""
    engine, srv = gemma4
    for marker in ("<|tool_call>", "<tool_call|>", '<|"|>', "<|channel>", "<channel|>"):
        [token] = engine.target.tokenize(marker, add_special=False)
        assert engine.target.piece(token).decode() == marker
    request = dict(messages=ASK, tools=[GET_WEATHER], tool_choice=NAMED, **GREEDY)
    whole = srv.client().chat.completions.create(**request)
    message = whole.choices[0].message.to_dict()
    prefill = "<|tool_call>call:get_weather"
    assert message["content"].startswith(prefill) and "reasoning_content" not in message
    prompt = engine.target.render_chat(ASK, tools=[GET_WEATHER])
    assert prompt.endswith("<|turn>model\n<|channel>thought\n<channel|>")
    assert whole.usage.prompt_tokens == len(engine.prompt_tokens(prompt + prefill))
    reply = ChatReply(False, ToolReply(["get_weather"]))
    thought = '<|channel>thought\nThe tool.<channel|><|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>'
    reply.feed(thought), reply.finish()
    message = reply.message()
    assert [c["function"] for c in message["tool_calls"]] == [{"name": "get_weather", "arguments": '{"city": "Paris"}'}]
    assert message["reasoning_content"] == "The tool." and message["content"] is None


def test_gemma4s_call_results_are_answered_inside_the_models_turn(gemma4):
    """Gemma 4's template writes a call's content after the call's results and closes the turn,
    so the model would answer outside one: the content goes, as llama-server drops it, and the
    prompt ends with the results, inside the model's turn."""
    engine, srv = gemma4
    turns = ASK + [
        {"role": "assistant", "content": "Let me check.", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "abc123XYZ", "content": "18 C"},
    ]
    reply = srv.client().chat.completions.create(messages=turns, tools=[GET_WEATHER], **GREEDY)
    rendered = [
        ASK[0],
        {
            "role": "assistant",
            "tool_calls": [dict(CALL, function={"name": "get_weather", "arguments": {"city": "Paris"}})],
        },
        turns[2],
    ]
    prompt = engine.target.render_chat(rendered, tools=[GET_WEATHER])
    assert prompt.endswith('<|tool_response>response:get_weather{value:<|"|>18 C<|"|>}<tool_response|>')
    assert "Let me check." not in prompt
    assert reply.usage.prompt_tokens == len(engine.prompt_tokens(prompt))


def test_call_markup_held_as_control_tokens_is_in_the_text_and_read(gemma4):
    """Generated text leaves control tokens out, but not a call's markers: Mistral's [TOOL_CALLS]
    and [ARGS] (control tokens of this vocabulary) are in a step's text, and the call is read."""
    engine, _ = gemma4
    written = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
    tokens = engine.target.tokenize(written, add_special=False)
    assert {engine.target.tokenize(m, add_special=False)[0] for m in ("[TOOL_CALLS]", "[ARGS]")} <= set(tokens)
    text = engine.target.detokenize(tokens).decode()
    assert text.replace(" ", "") == written.replace(" ", "")  # SentencePiece spaces a word after a control token
    reply = ChatReply(False, ToolReply(["get_weather"]))
    reply.feed(text), reply.finish()
    assert [c["function"]["arguments"] for c in reply.message()["tool_calls"]] == ['{"city": "Paris"}']


@pytest.fixture(scope="module")
def glm47(tmp_path_factory):
    yield from templated_server(tmp_path_factory, "glm47", tool_templates.GLM47)


def test_glm_calls_are_begun_after_the_think_block_and_read(glm47):
    """GLM 4.7's prompt opens a think block; a named call closes it as the template writes its
    calls ("</think><tool_call>NAME"), and the model going on with tagged arguments makes a call."""
    engine, srv = glm47
    request = dict(messages=ASK, tools=[GET_WEATHER], tool_choice=NAMED, **GREEDY)
    whole = srv.client().chat.completions.create(**request)
    message = whole.choices[0].message.to_dict()
    assert message["content"].startswith("<tool_call>get_weather") and "reasoning_content" not in message
    prompt = engine.target.render_chat(ASK, tools=[GET_WEATHER])
    assert prompt.endswith("<|assistant|><think>")
    assert whole.usage.prompt_tokens == len(engine.prompt_tokens(prompt + "</think><tool_call>get_weather"))
    reply = ChatReply(True, ToolReply(["get_weather"]), "</think><tool_call>get_weather")
    reply.feed("<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"), reply.finish()
    assert [c["function"]["arguments"] for c in reply.message()["tool_calls"]] == ['{"city": "Paris"}']


@pytest.fixture(scope="module")
def qwen35_not_thinking(tmp_path_factory):
    """Qwen3.5's template on a server started with --no-think and --reasoning-effort low."""
    defaults = {"template_variables": {"enable_thinking": False, "reasoning_effort": "low"}}
    yield from templated_server(tmp_path_factory, "qwen35-off", tool_templates.QWEN35, defaults)


def test_the_servers_template_variables_are_every_requests_but_its_own(qwen35_not_thinking):
    """serve --no-think (--reasoning-effort ...) sets a default a request's chat_template_kwargs
    or reasoning_effort overrides."""
    engine, srv = qwen35_not_thinking
    client = srv.client()

    def prompt_tokens(**extra) -> int:
        return client.chat.completions.create(messages=ASK, **GREEDY, **extra).usage.prompt_tokens

    def rendered(**variables) -> int:
        return len(engine.prompt_tokens(engine.target.render_chat(ASK, variables=variables)))

    assert rendered(enable_thinking=False) != rendered(enable_thinking=True)
    assert prompt_tokens() == rendered(enable_thinking=False, reasoning_effort="low")
    thinking = {"chat_template_kwargs": {"enable_thinking": True}}
    assert prompt_tokens(extra_body=thinking) == rendered(enable_thinking=True)
    assert prompt_tokens(reasoning_effort="none") == rendered(enable_thinking=False)
