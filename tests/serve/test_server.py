"""`specllm serve`: a real server on a free loopback port, the real `openai` package as the client,
real llama.cpp on the tiny models. Greedy answers are compared with `specllm run --json`."""

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit

import llama_cpp
import openai
import pytest
from serving import CTX, Server, hold, serve_log, serving, wait_for_line

import specllm
from specllm.engine.loop import Generation
from specllm.errors import SpecllmError
from specllm.serve.openai_api import ApiError, ChatRequest, CompletionRequest, parse
from specllm.serve.server import ServeSettings, exposure_warning, listen

PROMPT = "def f(x):"
GREEDY = dict(temperature=0, max_tokens=24)
SPECLLM = [sys.executable, "-m", "specllm"]


@pytest.fixture(scope="module")
def log():
    with serve_log() as lines:
        yield lines


@pytest.fixture(scope="module")
def engine(tiny_models):
    engine = specllm.load(str(tiny_models.target), str(tiny_models.draft), n_ctx=CTX, n_threads=1, defer_draft=True)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def srv(engine, log):
    s = Server(engine)
    yield s
    s.stop()


def specllm_run(tiny_models, *args):
    models = ["--target", tiny_models.target, "--draft", tiny_models.draft, "--threads", 1, "--ctx-size", CTX]
    proc = subprocess.run(
        SPECLLM + ["run", *map(str, [*args, *models, "--json", "--temperature", 0])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def stream_text(chunks, chat=True):
    """The text of a stream, its finish_reason, its specllm object and its usage chunk."""
    text, finish, stats, usage = "", None, None, None
    for chunk in chunks:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += (choice.delta.content if chat else choice.text) or ""
            finish = choice.finish_reason or finish
        stats = chunk.to_dict().get("specllm", stats)
    return text, finish, stats, usage


def test_chat_streamed_and_not_equals_run_json(srv, tiny_models):
    expected = specllm_run(tiny_models, PROMPT, "-n", 24, "--drafter", "model", "--gamma", 3)
    client, messages = srv.client(), [{"role": "user", "content": PROMPT}]
    extensions = {"drafter": "model", "gamma": 3}
    whole = client.chat.completions.create(model="x", messages=messages, extra_body=extensions, **GREEDY)
    assert whole.choices[0].message.content == expected["text"] and whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == len(expected["tokens"]) == 24
    assert whole.usage.prompt_tokens == expected["stats"]["prompt_tokens"]
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + 24
    stats = whole.to_dict()["specllm"]
    assert stats["stop_reason"] == "max_tokens" and set(stats["stats"]) == set(expected["stats"])
    assert stats["stats"]["n_drafted"] > 0 and stats["stats"]["sources"].keys() <= {"model", "none"}
    assert whole.model == "tiny" and whole.id.startswith("chatcmpl-")
    chunks = client.chat.completions.create(
        model="x",
        messages=messages,
        extra_body=extensions,
        stream=True,
        stream_options={"include_usage": True},
        **GREEDY,
    )
    text, finish, stats, usage = stream_text(chunks)
    assert (text, finish) == (expected["text"], "length")
    assert usage.completion_tokens == 24 and usage.prompt_tokens == expected["stats"]["prompt_tokens"]
    assert stats["stats"]["generated_tokens"] == 24


def test_completions_streamed_and_not_equal_run_json(srv, tiny_models):
    expected = specllm_run(tiny_models, PROMPT, "-n", 24, "--raw", "--drafter", "ngram", "--gamma", 2)
    client, extensions = srv.client(), {"drafter": "ngram", "gamma": 2}
    whole = client.completions.create(model="x", prompt=PROMPT, extra_body=extensions, **GREEDY)
    assert whole.choices[0].text == expected["text"] and whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 24 and whole.usage.prompt_tokens == expected["stats"]["prompt_tokens"]
    chunks = client.completions.create(model="x", prompt=PROMPT, extra_body=extensions, stream=True, **GREEDY)
    text, finish, stats, usage = stream_text(chunks, chat=False)
    assert (text, finish, usage) == (expected["text"], "length", None)  # usage only when asked for
    assert stats["stats"]["generated_tokens"] == 24
    ids = client.completions.create(model="x", prompt=expected["tokens"][:5], **GREEDY)  # token ids as the prompt
    assert ids.usage.prompt_tokens == 5


def test_stop_strings_and_finish_reasons(srv):
    client = srv.client()
    full = client.completions.create(model="x", prompt=PROMPT, **GREEDY).choices[0].text
    stop = full[8:11]
    cut = full[: full.index(stop)]
    for stops in (stop, ["not in it", stop]):
        whole = client.completions.create(model="x", prompt=PROMPT, stop=stops, **GREEDY)
        assert (whole.choices[0].text, whole.choices[0].finish_reason) == (cut, "stop")
        assert whole.to_dict()["specllm"]["stop_reason"] == "stop"
        chunks = client.completions.create(model="x", prompt=PROMPT, stop=stops, stream=True, **GREEDY)
        assert stream_text(chunks, chat=False)[:2] == (cut, "stop")
    # End of text: near-uniform sampling reaches an end-of-generation token (2 of ~570 ids) soon.
    flat = dict(temperature=5, top_p=1, seed=7, extra_body={"top_k": 0, "min_p": 0})
    eos = client.completions.create(model="x", prompt=PROMPT, max_tokens=CTX // 2, **flat)
    assert eos.choices[0].finish_reason == "stop" and eos.to_dict()["specllm"]["stop_reason"] == "eos"
    assert eos.usage.completion_tokens == eos.to_dict()["specllm"]["stats"]["generated_tokens"] < CTX // 2
    # A full context: the room the prompt leaves, and one more token, which needs no room of its own.
    full_ctx = client.completions.create(model="x", prompt=[300] * (CTX - 3), max_tokens=100, temperature=0)
    assert (full_ctx.choices[0].finish_reason, full_ctx.usage.completion_tokens) == ("length", 4)


def test_top_p_0_and_min_p_1_keep_the_most_likely_token(srv):
    """OpenAI's API takes top_p 0; like llama.cpp, it keeps the single most likely token, so a
    sampled request gives the greedy text (min_p 1 the same: the tiny model has no ties)."""
    client = srv.client()
    greedy = client.completions.create(model="x", prompt=PROMPT, **GREEDY).choices[0].text
    for cut in (dict(top_p=0), dict(extra_body={"min_p": 1, "top_k": 0})):
        sampled = client.completions.create(model="x", prompt=PROMPT, max_tokens=24, temperature=1.5, seed=3, **cut)
        assert sampled.choices[0].text == greedy


def two_turns(client) -> tuple:
    """A greedy reply to PROMPT, and the conversation that follows it with a second question."""
    first = [{"role": "user", "content": PROMPT}]
    one = client.chat.completions.create(model="x", messages=first, **GREEDY)
    second = first + [
        {"role": "assistant", "content": one.choices[0].message.content},
        {"role": "user", "content": "and g(y)?"},
    ]
    return one, second


def test_a_growing_chat_prefills_only_its_new_tokens(srv):
    client = srv.client()
    one, second = two_turns(client)
    two = client.chat.completions.create(model="x", messages=second, **GREEDY)
    reused = one.usage.prompt_tokens + one.usage.completion_tokens
    stats = two.to_dict()["specllm"]["stats"]
    assert stats["prefill_tokens"] == two.usage.prompt_tokens - reused
    assert two.usage.prompt_tokens_details.cached_tokens == reused - 1  # the last one is evaluated with the reply
    client.completions.create(model="x", prompt="something else entirely", **GREEDY)
    # Cold, the same conversation is tokenized whole (the tiny model's replies hold broken UTF-8,
    # which tokenizes back differently: why the reply's own tokens are reused) and prefilled whole.
    cold = client.chat.completions.create(model="x", messages=second, **GREEDY)
    cold_stats = cold.to_dict()["specllm"]["stats"]
    # (BOS was left in the cache by another request: a reuse that is not reported, see
    # test_cached_tokens_do_not_tell_one_client_what_another_sent; the last token goes with the reply)
    assert cold_stats["prefill_tokens"] == cold.usage.prompt_tokens - 1
    assert cold.usage.prompt_tokens_details.cached_tokens == 0


def test_a_refused_request_does_not_forget_the_conversation_before_it(srv):
    """A request refused before it runs (a drafter this server cannot serve, which the chat page's
    Settings offer) leaves the KV cache as it was: the conversation goes on from the reply's own
    tokens, as if the refusal had not come between."""
    client = srv.client()
    one, second = two_turns(client)
    with pytest.raises(openai.BadRequestError, match="MTP layers"):
        client.chat.completions.create(model="x", messages=second, extra_body={"drafter": "mtp"}, **GREEDY)
    two = client.chat.completions.create(model="x", messages=second, **GREEDY)
    reused = one.usage.prompt_tokens + one.usage.completion_tokens
    assert two.usage.prompt_tokens_details.cached_tokens == reused - 1


def test_a_reply_cut_by_a_stop_string_is_not_continued_from_its_tokens(srv):
    """The conversation goes on from a reply cut by a stop string: its text ends before the stop
    string, its tokens do not, so the next prompt is tokenized whole (engine/prompt_cache.py) and
    reported as not continued; the same conversation after a whole reply is."""
    client = srv.client()
    first = [{"role": "user", "content": PROMPT}]
    whole = client.chat.completions.create(model="x", messages=first, **GREEDY).choices[0].message.content
    stop = whole[6:9]
    cut = client.chat.completions.create(model="x", messages=first, stop=stop, **GREEDY).choices[0]
    assert cut.finish_reason == "stop" and cut.message.content == whole[: whole.index(stop)]
    for reply, continued in ((cut.message.content, False), (whole, True)):
        if continued:
            client.chat.completions.create(model="x", messages=first, **GREEDY)  # the whole reply, again
        second = first + [{"role": "assistant", "content": reply}, {"role": "user", "content": "and g(y)?"}]
        r = client.chat.completions.create(model="x", messages=second, **GREEDY)
        assert (r.usage.prompt_tokens_details.cached_tokens > 0) == continued


def test_concurrent_clients_both_get_complete_answers(srv):
    client = srv.client()
    prompts = ["def f(x):", "class A:", "import os"]
    expected = [client.completions.create(model="x", prompt=p, **GREEDY).choices[0].text for p in prompts]
    got = [None] * len(prompts)

    def ask(i):
        chunks = client.completions.create(model="x", prompt=prompts[i], stream=i % 2 == 0, **GREEDY)
        got[i] = stream_text(chunks, chat=False)[0] if i % 2 == 0 else chunks.choices[0].text

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert got == expected


def test_waiting_requests_are_served_in_arrival_order(srv, log, engine, monkeypatch):
    client, before = srv.client(), len(log)
    release = hold(engine, monkeypatch, CTX - 16)

    def ask(max_tokens):
        client.completions.create(model="x", prompt=PROMPT, max_tokens=max_tokens, temperature=0)

    threads = [threading.Thread(target=ask, args=(CTX - 16,))]  # held under way while the others queue up
    threads[0].start()
    wait_for_health(srv, busy=True)
    for waiting, max_tokens in ((1, 8), (2, 9)):
        threads.append(threading.Thread(target=ask, args=(max_tokens,)))
        threads[-1].start()
        wait_for_health(srv, waiting=waiting)
    release.set()
    for t in threads:
        t.join(60)
    served = [re.search(r"· (\d+) tokens \(", line)[1] for line in log[before:] if "/v1/completions" in line]
    assert served == [str(CTX - 16), "8", "9"]
    wait_for_health(srv, busy=False)  # the engine thread frees the engine just after the last answer went out
    drafters = ["auto", "model", "ngram", "none"]  # a llama target has no MTP layers
    assert srv.get("/health") == {"status": "ok", "busy": False, "waiting": 0, "drafters": drafters}


def test_a_request_beyond_the_waiting_limit_gets_a_503_at_once(engine, log, monkeypatch):
    """Each waiting request holds its body: past the limit a request is refused, streamed or not,
    and the ones already waiting are served as before."""
    busy, answers = Server(engine, max_waiting=1), [{}, {}]
    try:
        release = hold(engine, monkeypatch, CTX - 16)
        long, short = (dict(model="x", prompt=PROMPT, max_tokens=n, temperature=0) for n in (CTX - 16, 8))
        threads = [
            threading.Thread(target=post_into, args=(answer, busy, body))
            for answer, body in zip(answers, (long, short))
        ]
        threads[0].start()
        wait_for_health(busy, busy=True)
        threads[1].start()
        wait_for_health(busy, waiting=1)
        for stream in (False, True):
            status, refused = busy.post("/v1/completions", json.dumps({**short, "stream": stream}).encode())
            assert status == 503 and refused["error"]["code"] == "server_busy", refused
            assert refused["error"]["message"] == "the server is busy, its queue full (1 waiting): try again later"
        release.set()
        for t in threads:
            t.join(60)
        assert [a["status"] for a in answers] == [200, 200]
        wait_for_health(busy, busy=False, waiting=0)
        assert busy.post("/v1/completions", json.dumps(short).encode())[0] == 200
    finally:
        busy.stop()


def test_a_client_that_goes_away_frees_the_server(srv, log, engine, monkeypatch):
    client, long = srv.client(), dict(model="x", prompt=PROMPT, max_tokens=CTX - 16, temperature=0)
    release = hold(engine, monkeypatch, CTX - 16)
    chunks = client.completions.create(stream=True, **long)
    next(iter(chunks))
    chunks.close()  # mid-stream
    stopped = wait_for_line(log, "client went away", 1)  # Starlette cancels the stream: no step needed
    release.set()
    assert len(stopped) == 1 and " 200 · " in stopped[0]
    assert int(re.search(r"stopped after (\d+) tokens", stopped[0])[1]) < CTX - 16
    release = hold(engine, monkeypatch, CTX - 16)
    with pytest.raises(openai.APITimeoutError):  # not streamed: gone before the answer (held: it cannot come)
        srv.client().with_options(timeout=0.3).completions.create(**long)
    release.set()  # its next step sees the client gone
    stopped = wait_for_line(log, "client went away", 2)
    assert len(stopped) == 2 and " 499 · " in stopped[1]
    assert int(re.search(r"stopped after (\d+) tokens", stopped[1])[1]) < CTX - 16
    again = client.completions.create(model="x", prompt=PROMPT, **GREEDY)  # served normally
    assert again.usage.completion_tokens == 24 and again.choices[0].finish_reason == "length"


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_during_a_long_prefill_stops_it_at_the_next_batch(srv, log, engine, monkeypatch, stream):
    """Not streamed, a client leaving was seen only once a step came: a long prompt's prefill (30 s
    for 15,000 tokens on a CPU) ran to its end first, for nobody, and every request behind it
    waited. The prompt's second batch is held until the server has cancelled the job."""
    piece = engine.target.tokenize(f"def g{stream}(y):\n    return y + 1\n", add_special=False)  # nothing cached
    prompt = (piece * CTX)[: int(3.5 * engine.target.n_batch)]
    decode, calls = llama_cpp.llama_decode, []

    def held(ctx, batch):
        calls.append(batch.n_tokens)
        if len(calls) == 2:
            srv.worker.job.cancelled.wait(30)
        return decode(ctx, batch)

    monkeypatch.setattr(llama_cpp, "llama_decode", held)
    before = len(wait_for_line(log, "client went away", 0))
    body = {"prompt": prompt, "max_tokens": 4, "temperature": 0, "drafter": "none", "stream": stream}
    conn = http.client.HTTPConnection(urlsplit(srv.url).netloc, timeout=30)
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    deadline = time.time() + 30
    while len(calls) < 2 and time.time() < deadline:
        time.sleep(0.01)
    conn.close()  # during the prefill
    assert len(wait_for_line(log, "client went away", before + 1)) == before + 1
    assert len(calls) == 2  # no batch after the one under way
    monkeypatch.undo()
    again = srv.client().completions.create(model="x", prompt=PROMPT, **GREEDY)  # served normally
    assert again.usage.completion_tokens == 24


def test_a_client_that_leaves_while_it_waits_gets_nothing_generated(srv, log, engine, monkeypatch):
    """Gone before its turn: its prompt is not prefilled, no step is taken for it, and it stops
    counting as waiting when it leaves, not when its turn would have come."""
    client, before = srv.client(), len(log)
    release = hold(engine, monkeypatch, CTX - 16)
    busy = threading.Thread(
        target=lambda: client.completions.create(model="x", prompt=PROMPT, max_tokens=CTX - 16, temperature=0)
    )
    busy.start()
    deadline = time.time() + 10
    while not srv.get("/health")["busy"] and time.time() < deadline:
        time.sleep(0.005)
    with pytest.raises(openai.APITimeoutError):  # waits behind the held generation, then gives up
        srv.client().with_options(timeout=0.5).completions.create(model="x", prompt="other words", max_tokens=8)
    [line] = wait_for_line(log, "before its turn", 1)  # the engine still busy
    assert " 499 · " in line
    assert srv.get("/health") == {
        "status": "ok",
        "busy": True,
        "waiting": 0,
        "drafters": ["auto", "model", "ngram", "none"],
    }
    release.set()
    busy.join(60)
    served = [line for line in log[before:] if "/v1/completions 200" in line]
    assert len(served) == 1 and f"{CTX - 16} tokens" in served[0]
    assert not [line for line in log[before:] if "stopped after" in line]  # no step was taken for it


LONG_PROMPT = json.dumps({"prompt": "word " * (2 * CTX)}).encode()
BAD_REQUESTS = [
    (b'{"prompt": "x", ', 400, None, None),  # malformed JSON
    (b'["prompt"]', 400, None, None),
    (b'{"prompt": "x", "max_tokens": "8"}', 400, "max_tokens", None),  # a string, not a number
    (b'{"prompt": "x", "temperature": -1}', 400, "temperature", None),
    (b'{"prompt": "x", "stop": [1]}', 400, "stop", None),
    (b'{"prompt": "x", "n": 2}', 400, "n", None),
    (b'{"prompt": "x", "drafter": "magic"}', 400, "drafter", None),
    (b'{"prompt": "x", "gamma": 0}', 400, "gamma", None),
    (b'{"prompt": "x", "gamma": 5000}', 400, "gamma", None),  # longer than a verify batch holds
    (b'{"prompt": "x", "drafter": "mtp"}', 400, "drafter", None),  # the target has no MTP layers
    (b'{"prompt": "x", "temperature": Infinity}', 400, "temperature", None),
    (b'{"prompt": "x", "logprobs": true}', 400, "logprobs", None),
    (b'{"prompt": "x", "stream_options": {"include_usage": true}}', 400, "stream_options", None),  # as OpenAI
    (b'{"prompt": "x", "specllm_steps": true}', 400, "specllm_steps", None),  # steps of a reply sent whole
    (b'{"prompt": "x", "logprobs": 0}', 400, "logprobs", None),  # a count: 0 asks for the chosen tokens'
    (b'{"prompt": "x", "best_of": 0}', 400, "best_of", None),
    (b'{"prompt": "x", "echo": "none"}', 400, "echo", None),  # not a boolean, let alone false
    (b'{"prompt": "x", "modalities": ["text", "audio"], "audio": {"voice": "alloy"}}', 400, "modalities", None),
    (b'{"prompt": [99999]}', 400, "prompt", None),  # a token id outside the vocabulary
    (b'{"prompt": ["a", "b"]}', 400, "prompt", None),
    (b'{"prompt": []}', 400, "prompt", None),
    (b'{"prompt": [[1, 2], [3]]}', 400, "prompt", None),
    (b'{"prompt": [[]]}', 400, "prompt", None),
    (b'{"max_tokens": 8}', 400, "prompt", None),
    (LONG_PROMPT, 400, "prompt", "context_length_exceeded"),
    (json.dumps({"prompt": "x" * 2**21}).encode(), 413, None, "request_too_large"),
]


ASKED = [{"role": "user", "content": "x"}]
NO_TEXT = [{"role": "user", "content": [{"type": "text"}]}]  # a text part without its text
INSIDE_A_FIELD_OF_SEVERAL_TYPES = [
    ({"tool_choice": {"function": {"name": "f"}}}, "tool_choice", "tool_choice.type: Field required"),
    ({"messages": NO_TEXT}, "messages.0.content", "messages.0.content.0.text: Field required"),
    ({"stop": ["a", 1]}, "stop", "stop.1: Input should be a valid string"),
    ({"tool_choice": "always"}, "tool_choice", "tool_choice: Input should be 'none', 'auto' or 'required'"),
]


@pytest.mark.parametrize("fields,param,message", INSIDE_A_FIELD_OF_SEVERAL_TYPES)
def test_a_field_of_several_types_is_told_what_is_wrong_inside_it(fields, param, message):
    """A field that may be a string or an object (tool_choice, content, stop) is told what is wrong
    in what was sent: an object without its "type" is not told that a string was expected."""
    with pytest.raises(ApiError) as refused:
        parse(ChatRequest, json.dumps({"messages": ASKED} | fields).encode())
    assert refused.value.param == param and refused.value.message.startswith(message), refused.value.message


def test_a_prompt_is_a_string_token_ids_or_a_list_of_one_of_them():
    assert parse(CompletionRequest, b'{"prompt": ["Once upon"]}').prompt == "Once upon"
    assert parse(CompletionRequest, b'{"prompt": "Once upon"}').prompt == "Once upon"
    assert parse(CompletionRequest, b'{"prompt": [1, 2]}').prompt == [1, 2]
    assert parse(CompletionRequest, b'{"prompt": [[1, 2]]}').prompt == [1, 2]


@pytest.mark.parametrize("body,status,param,code", BAD_REQUESTS, ids=range(len(BAD_REQUESTS)))
def test_bad_input_gets_an_openai_error_and_one_log_line(srv, log, body, status, param, code):
    before = len(log)
    got, data = srv.post("/v1/completions", body)
    assert got == status, data
    assert set(data["error"]) == {"message", "type", "param", "code"} and data["error"]["message"]
    assert (data["error"]["param"], data["error"]["code"]) == (param, code)
    assert len(log) == before + 1 and f"/v1/completions {status} · " in log[-1]
    assert srv.client().completions.create(model="x", prompt=PROMPT, max_tokens=2).usage.completion_tokens == 2


def test_an_unknown_drafter_is_offered_the_drafters_this_server_has(srv):
    """It was offered every drafter, mtp included, which this server's target does not have."""
    status, data = srv.post("/v1/completions", b'{"prompt": "x", "drafter": "magic"}')
    assert (status, data["error"]["param"]) == (400, "drafter")
    assert data["error"]["message"] == "unknown drafter 'magic': ask for drafter auto, model, ngram or none"


def test_a_lone_surrogate_escape_is_told_as_such_and_a_pair_is_text(srv, log):
    """JSON allows "\\ud800" alone (a JavaScript string cut inside an emoji), but it is no text: it
    was refused as "not valid JSON: unexpected end of hex escape"."""
    status, data = srv.post("/v1/completions", b'{"prompt": "\\ud800 lone", "max_tokens": 2}')
    assert status == 400 and "lone UTF-16 surrogate" in data["error"]["message"], data
    status, data = srv.post("/v1/completions", b'{"prompt": "\\ud83d\\ude00", "max_tokens": 2}')  # an emoji's pair
    assert status == 200, data
    for body in (b'{"prompt": "x", ', b"[" * 100_000):  # not JSON for Python either, or too deep for it
        status, data = srv.post("/v1/completions", body)
        assert status == 400 and data["error"]["message"].startswith("the body is not valid JSON"), data


def test_unsupported_fields_at_their_defaults_ask_nothing_and_are_accepted(srv):
    defaults = {"best_of": 1, "echo": False, "presence_penalty": 0.0, "frequency_penalty": 0, "logit_bias": {}}
    status, data = srv.post("/v1/completions", json.dumps({"prompt": PROMPT, "max_tokens": 2} | defaults).encode())
    assert status == 200, data
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "logprobs": False, "top_logprobs": 0}
    chat |= {"modalities": ["text"]}
    status, data = srv.post("/v1/chat/completions", json.dumps(chat).encode())
    assert status == 200, data


def test_a_bad_chat_request_is_a_400_naming_the_field(srv):
    cases = [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "messages.0.content",
        ),
        ({"messages": [{"role": "user", "content": "word " * (2 * CTX)}]}, "messages"),
    ]
    for body, param in cases:
        status, data = srv.post("/v1/chat/completions", json.dumps(body).encode())
        assert (status, data["error"]["param"]) == (400, param), data
    image = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": "x"}}]
    with_image = {"messages": [{"role": "user", "content": image}]}
    status, data = srv.post("/v1/chat/completions", json.dumps(with_image).encode())
    assert "content parts of type 'image_url' are not supported" in data["error"]["message"], data
    client = srv.client()
    with pytest.raises(openai.BadRequestError, match="only n = 1"):
        client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], n=2)
    parts = [{"type": "text", "text": PROMPT}]  # content as a list of text parts
    whole = client.chat.completions.create(model="x", messages=[{"role": "user", "content": parts}], **GREEDY)
    assert whole.usage.completion_tokens == 24
    as_text = client.chat.completions.create(model="x", messages=[{"role": "user", "content": PROMPT}], **GREEDY)
    assert whole.choices[0].message.content == as_text.choices[0].message.content
    developer = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": PROMPT}]
    as_system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}]
    newer = client.chat.completions.create(model="x", messages=developer, max_completion_tokens=5, temperature=0)
    older = client.chat.completions.create(model="x", messages=as_system, max_tokens=5, temperature=0)
    assert newer.usage.completion_tokens == 5 and newer.choices[0].message.content == older.choices[0].message.content
    assert newer.usage.prompt_tokens == older.usage.prompt_tokens


def test_a_model_whose_logits_are_nan_is_a_500_in_the_errors_own_words(tiny_models, log, tmp_path):
    """A generation that fails once under way is the server's fault: an OpenAI-shaped 500, in the
    body or in the stream (whose 200 was sent), and the engine is free for the next request."""
    import tiny_models as tm

    broken = tm.with_nan_in(tiny_models.target, tmp_path / "broken.gguf", "output_norm.weight")
    engine = specllm.load(str(broken), n_ctx=CTX, n_threads=1)
    server = Server(engine)
    expected = (
        "generation failed: the target model (broken.gguf) gave logits that are not finite numbers (NaN or infinite)"
    )
    try:
        before = len(log)
        status, data = server.post("/v1/completions", json.dumps({"prompt": PROMPT, "max_tokens": 4}).encode())
        assert status == 500 and data["error"]["type"] == "server_error", data
        assert data["error"]["message"].startswith(expected) and str(tmp_path) not in data["error"]["message"]
        assert len(log) == before + 1 and "/v1/completions 500 · generation failed" in log[-1], log[before:]
        stream = server.client().completions.create(model="x", prompt=PROMPT, max_tokens=4, stream=True)
        with pytest.raises(openai.APIError, match=re.escape(expected)):
            list(stream)
    finally:
        server.stop()
        engine.close()


def test_a_draft_that_went_bad_after_startup_is_dropped_by_auto_and_a_503_for_the_model_drafter(
    tiny_models, log, tmp_path
):
    """A deferred draft is loaded by the first request that needs it: its file, damaged since the
    server started, failed every auto request (a 500, the load tried again each time). Auto now goes
    on without it, greedy equal to target-only, says so once in the log and in /health; a request
    that asks for the model drafter gets a 503 naming the server's draft, not a 400 for the request."""
    draft = tmp_path / "draft.gguf"
    draft.write_bytes(tiny_models.draft.read_bytes())
    engine = specllm.load(str(tiny_models.target), str(draft), n_ctx=CTX, n_threads=1, defer_draft=True)
    server = Server(engine)
    try:
        draft.write_bytes(tiny_models.draft.read_bytes()[:300_000])
        before = len(log)
        for _ in range(2):
            body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0}
            status, auto = server.post("/v1/completions", json.dumps(body).encode())
            assert status == 200, auto
            status, alone = server.post("/v1/completions", json.dumps({**body, "drafter": "none"}).encode())
            assert auto["choices"][0]["text"] == alone["choices"][0]["text"]
        dropped = [line for line in log[before:] if "could not be loaded" in line]
        assert len(dropped) == 1 and "drafter auto goes on without it (cannot load" in dropped[0], log[before:]
        health = server.get("/health")
        assert health["draft_unavailable"].startswith("cannot load draft.gguf: ") and str(tmp_path) not in str(health)
        assert health["drafters"] == ["auto", "model", "ngram", "none"]

        body = json.dumps({"prompt": PROMPT, "max_tokens": 4, "drafter": "model"}).encode()
        status, data = server.post("/v1/completions", body)
        assert (status, data["error"]["type"], data["error"]["code"]) == (
            503,
            "server_error",
            "draft_model_unavailable",
        )
        message = data["error"]["message"]
        assert message.startswith("the server's draft model could not be loaded: cannot load draft.gguf: "), data
        assert message.endswith("; ask for drafter auto, ngram or none") and str(tmp_path) not in message
        assert data["error"]["param"] == "drafter"
    finally:
        server.stop()
        engine.close()


def test_the_api_key_is_enforced(engine, log, srv):
    keyed = Server(engine, api_key="s3cret")
    try:
        with pytest.raises(openai.AuthenticationError):
            keyed.client("wrong").models.list()
        with pytest.raises(openai.AuthenticationError):
            keyed.client("wrong").completions.create(model="x", prompt=PROMPT, max_tokens=2)
        status, data = keyed.post("/v1/completions", b'{"prompt": "x"}')
        assert (status, data["error"]["code"]) == (401, "invalid_api_key")
        assert keyed.post("/v1/completions", b'{"prompt": "x"}', {"Authorization": "Bearer s3cret-not"})[0] == 401
        assert [m.id for m in keyed.client("s3cret").models.list()] == ["tiny"]
        unicode = Server(engine, api_key="clé-ключ")
        try:  # a key that is not ASCII, sent as UTF-8 as clients send it
            headers = {"Authorization": "Bearer clé-ключ".encode().decode("latin-1")}
            assert unicode.post("/v1/completions", b'{"prompt": "x", "max_tokens": 1}', headers)[0] == 200
            headers = {"Authorization": "Bearer clé-ключ-not".encode().decode("latin-1")}
            assert unicode.post("/v1/completions", b'{"prompt": "x", "max_tokens": 1}', headers)[0] == 401
        finally:
            unicode.stop()
        assert (
            keyed.client("s3cret").completions.create(model="x", prompt=PROMPT, max_tokens=2).usage.completion_tokens
            == 2
        )
    finally:
        keyed.stop()
    assert [m.id for m in srv.client("anything").models.list()] == ["tiny"]  # no key set: none needed


@pytest.mark.parametrize("key", ["", " ", "s3cret ", "s3cret\n", "s3 cret"])
def test_a_key_no_client_could_send_is_refused(key):
    """An empty key would leave the server open ("--api-key $KEY" with KEY unset); one with spaces
    or a line break (read from a file) would lock every client out."""
    from specllm.serve.server import ServeSettings

    with pytest.raises(specllm.SpecllmError, match="API key"):
        ServeSettings(model="tiny", api_key=key)


def test_the_api_schema_pages_are_not_served(engine):
    """FastAPI's /docs, /redoc and /openapi.json would answer without the key and load scripts
    from elsewhere."""
    keyed = Server(engine, api_key="s3cret")
    try:
        for path in ("/docs", "/redoc", "/openapi.json"):
            for headers in ({}, {"Authorization": "Bearer s3cret"}):
                conn = http.client.HTTPConnection(urlsplit(keyed.url).netloc, timeout=60)
                conn.request("GET", path, headers=headers)
                assert conn.getresponse().status == 404, (path, headers)
                conn.close()
    finally:
        keyed.stop()


def test_an_unknown_path_or_method_gets_an_openai_error(srv):
    """A known path with a slash added was a bare 307 redirect, to the host the client named."""
    conn = http.client.HTTPConnection(urlsplit(srv.url).netloc, timeout=60)
    unknown = [("GET", "/v1/files", 404), ("POST", "/v1/chat/completions/", 404), ("GET", "/health/", 404)]
    for method, path, status in [*unknown, ("GET", "/v1/chat/completions", 405)]:
        conn.request(method, path)
        response = conn.getresponse()
        error = json.loads(response.read())["error"]
        assert (response.status, error["message"]) == (status, f"{response.reason}: {method} {path}")
    assert response.getheader("Allow") == "POST"  # a 405 says which methods the path takes
    conn.close()


def test_control_characters_a_client_sends_reach_the_log_escaped(srv, log):
    """A URL's path may hold any character: an escape sequence must not reach the terminal."""
    conn = http.client.HTTPConnection(urlsplit(srv.url).netloc, timeout=60)
    conn.request("GET", "/v1/a%1B[2Jb")
    assert conn.getresponse().status == 404
    conn.close()
    [line] = wait_for_line(log, "GET /v1/a", 1)
    assert "\x1b" not in line and line.endswith("GET /v1/a\\x1b[2Jb 404 · Not Found: GET /v1/a\\x1b[2Jb")


def test_a_reply_ended_by_a_full_context_says_so(srv, tiny_models, log):
    """A reply fills the context as run's and the library's do: the room the prompt leaves and one
    token more, whose KV slot is never needed. It is context_full, not max_tokens, unless the
    client asked for exactly that many. (It stopped one token short of theirs.)"""
    prompt = [5] * (CTX - 6)
    client = srv.client()
    uncapped = client.completions.create(model="x", prompt=prompt, temperature=0)
    asked_more = client.completions.create(model="x", prompt=prompt, temperature=0, max_tokens=CTX)
    asked_exactly = client.completions.create(model="x", prompt=prompt, temperature=0, max_tokens=7)
    library = specllm.load(str(tiny_models.target), n_ctx=CTX, n_threads=1)
    expected = library.generate(prompt, max_tokens=CTX, temperature=0, drafter="none")
    library.close()
    assert (len(expected.tokens), expected.stop_reason) == (7, "context_full")
    for reply, reason in ((uncapped, "context_full"), (asked_more, "context_full"), (asked_exactly, "max_tokens")):
        assert (reply.choices[0].text, reply.choices[0].finish_reason) == (expected.text, "length")
        assert (reply.usage.completion_tokens, reply.to_dict()["specllm"]["stop_reason"]) == (7, reason)
    assert "· 7 tokens (context_full) ·" in log[-2]  # the log says what the client is told


def test_a_server_other_machines_reach_without_a_key_is_warned_of(tiny_models):
    """--host 0.0.0.0 with no API key: anyone on the network may use the models. Loopback, or a key,
    is not warned of."""
    args = ["serve", "--target", tiny_models.target, "--drafter", "ngram", "--host", "0.0.0.0", "--port", 0]
    proc = subprocess.Popen([sys.executable, "-m", "specllm", *map(str, args)], stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        while not lines or not lines[-1].startswith("specllm serve:"):  # the warning comes before it
            lines.append(proc.stderr.readline())
            assert lines[-1], "".join(lines)
    finally:
        proc.kill()
        proc.wait()
    warning = re.compile(r"warning: http://0\.0\.0\.0:\d+ takes requests from other machines and asks no API key")
    assert any(warning.match(line) for line in lines), "".join(lines)
    for host, key in (("127.0.0.1", None), ("0.0.0.0", "k")):
        sock = listen(host, 0)
        try:
            assert exposure_warning(sock, ServeSettings(model="m", api_key=key)) is None
        finally:
            sock.close()


def test_the_serve_command_starts_logs_each_request_needs_its_key_and_stops_on_ctrl_c(tiny_models):
    """The CLI: the startup line, SPECLLM_API_KEY, one access-log line per request, Ctrl-C."""
    # a context for a reply of minutes: Ctrl-C lands mid-stream whatever the model's speed
    args = [
        "serve",
        "--target",
        tiny_models.target,
        "--draft",
        tiny_models.draft,
        "--threads",
        1,
        "--ctx-size",
        65536,
        "--port",
        0,
    ]
    env = {**os.environ, "SPECLLM_API_KEY": "k"}
    with serving(args, env) as (proc, lines, url):
        assert "GPU offload" in lines[0]  # the backend, as -v says it
        startup = lines[-1]
        assert "target.gguf + draft.gguf" in startup and "drafter auto" in startup and "API key required" in startup
        client = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
        reply = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert reply.usage.completion_tokens == 4
        log_line = proc.stderr.readline()
        assert "POST /v1/chat/completions 200" in log_line and "4 tokens" in log_line and "tok/s" in log_line
        chunks = iter(client.completions.create(model="x", prompt=PROMPT, max_tokens=60000, temperature=0, stream=True))
        next(chunks)
        proc.send_signal(signal.SIGINT)  # Ctrl-C mid-stream: the stream ends with an error event
        with pytest.raises(openai.APIError, match="the server is shutting down"):
            for _ in chunks:
                pass
        rest = proc.stderr.read()
        assert proc.wait(30) == 130 and "Traceback" not in rest and "ERROR" not in rest
        assert re.fullmatch(
            r".* 200 · stopped after \d+ tokens: the server is shutting down\ninterrupted", rest.strip()
        )
    taken = listen("127.0.0.1", 0)
    try:
        port = taken.getsockname()[1]
        busy = subprocess.run(SPECLLM + list(map(str, args[:-1] + [port])), capture_output=True, text=True, timeout=60)
        assert busy.returncode == 1 and busy.stderr.strip().splitlines() == [
            f"error: cannot listen on 127.0.0.1:{port}: Address already in use"
        ]
    finally:
        taken.close()


def test_a_port_in_use_is_named_as_an_address_would_be():
    taken = listen("127.0.0.1", 0)
    port = taken.getsockname()[1]
    try:
        with pytest.raises(SpecllmError, match=f"^cannot listen on 127.0.0.1:{port}: "):
            listen("127.0.0.1", port)
    finally:
        taken.close()
    try:
        taken = listen("::1", 0)
    except SpecllmError:
        pytest.skip("no IPv6 loopback here")
    port = taken.getsockname()[1]
    try:
        with pytest.raises(SpecllmError, match=rf"^cannot listen on \[::1\]:{port}: "):  # not :::PORT
            listen("::1", port)
    finally:
        taken.close()


def test_shutting_down_during_a_long_prefill_answers_at_once(tiny_models, monkeypatch):
    """A long prompt's prefill is one step the engine cannot leave. Ctrl-C then answers its
    request (503, or an error event when streamed) at once, not when uvicorn gives up waiting for
    it (a 500 and a traceback after 5 s). The prefill is stood for by a first step held back."""
    engine = specllm.load(str(tiny_models.target), n_ctx=CTX, n_threads=1)
    prefilled, start = threading.Event(), engine.start

    def in_prefill(generation):
        with generation:
            prefilled.wait(60)
            yield from generation
            return generation.result

    monkeypatch.setattr(engine, "start", lambda *args, **kwargs: Generation(in_prefill(start(*args, **kwargs))))
    try:
        for stream in (False, True):
            prefilled.clear()
            srv, answer, waiter = Server(engine), {}, {}
            body = {"prompt": PROMPT, "max_tokens": 8, "stream": stream}
            asking = threading.Thread(target=post_into, args=(answer, srv, body))
            asking.start()
            wait_for_health(srv, busy=True)
            waiting = threading.Thread(target=post_into, args=(waiter, srv, body))  # waits its turn
            waiting.start()
            wait_for_health(srv, waiting=1)
            srv.uvicorn.handle_exit(signal.SIGINT, None)  # as Ctrl-C does
            asking.join(3)
            waiting.join(1)
            assert not asking.is_alive() and not waiting.is_alive()
            if stream:
                assert answer["status"] == 200 and '"code": "shutting_down"' in answer["text"]
            else:
                assert answer["status"] == 503 and '"code":"shutting_down"' in answer["text"]
            assert waiter["status"] == 503 and '"code":"shutting_down"' in waiter["text"]
            prefilled.set()
            srv.stop()
    finally:
        prefilled.set()
        engine.close()


def wait_for_health(srv, **status) -> None:
    deadline = time.time() + 10
    while not status.items() <= srv.get("/health").items() and time.time() < deadline:
        time.sleep(0.005)
    assert status.items() <= srv.get("/health").items()


def post_into(answer: dict, srv, body) -> None:
    """POST a completion request; its status and body (as text, streamed or not) go in `answer`."""
    conn = http.client.HTTPConnection(urlsplit(srv.url).netloc, timeout=30)
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    answer.update(status=response.status, text=response.read().decode())
    conn.close()


def test_no_answer_tells_a_client_where_the_servers_files_are(tiny_models, tmp_path):
    """Neither the calibration cache's path in auto's stats, nor a model's path in an error (a
    draft file removed after the server started, then wanted by drafter "model")."""
    draft = tmp_path / "draft.gguf"
    draft.write_bytes(tiny_models.draft.read_bytes())
    engine = specllm.load(str(tiny_models.target), str(draft), n_ctx=CTX, n_threads=1, defer_draft=True)
    srv = Server(engine)
    try:
        body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 4, "temperature": 0}
        draft.unlink()  # before the draft was ever loaded
        status, data = srv.post("/v1/completions", json.dumps(body | {"drafter": "model"}).encode())
        assert status == 503 and "draft.gguf" in data["error"]["message"]  # the server's file, not the request
        assert str(tmp_path) not in data["error"]["message"]
        status, data = srv.post("/v1/completions", json.dumps(body | {"drafter": "ngram"}).encode())
        assert status == 200
    finally:
        srv.stop()
        engine.close()
    engine = specllm.load(str(tiny_models.target), n_ctx=CTX, n_threads=1)
    srv = Server(engine)
    try:
        status, data = srv.post("/v1/completions", json.dumps(body).encode())
        assert status == 200 and data["specllm"]["stats"]["policy"]["calibration"]["measured"]
        assert os.environ["SPECLLM_CACHE"] not in json.dumps(data)
    finally:
        srv.stop()
        engine.close()


def test_head_requests_are_answered(srv):
    for path in ("/health", "/v1/models"):
        conn = http.client.HTTPConnection(urlsplit(srv.url).netloc, timeout=10)
        conn.request("HEAD", path)
        response = conn.getresponse()
        assert response.status == 200 and response.read() == b""
        conn.close()


def test_cached_tokens_do_not_tell_one_client_what_another_sent(srv):
    """Client A's prompt stays in the KV cache; client B guesses at it. B's cached_tokens (and
    the prefill it is told of) must not depend on how far its guess matches A's prompt."""
    secret = "Alice: the secret code is 4729, and the vault opens at noon"
    a, b = srv.client(), srv.client()
    a.completions.create(model="x", prompt=secret, **GREEDY)
    told = []
    for guess in ("0", "4", "47", "472", "4729"):
        r = b.completions.create(model="x", prompt=f"Alice: the secret code is {guess}, and so on", **GREEDY)
        stats = r.to_dict()["specllm"]["stats"]
        told.append((r.usage.prompt_tokens_details.cached_tokens, stats["prompt_tokens"] - stats["prefill_tokens"]))
        a.completions.create(model="x", prompt=secret, **GREEDY)  # A's prompt back in the cache
    assert set(told) == {(0, 1)}


def test_library_errors_reach_a_client_in_api_terms_naming_no_cli_flag():
    """The server's 400 for an engine error says which request field to change, never a CLI flag,
    and offers only the drafters the server has."""
    from specllm.errors import CannotTakeBack, ContextFull, DraftTooLong, GammaTooLong, NeedsDraftModel, NoMtpLayers
    from specllm.serve.openai_api import ApiError

    errors = [
        ContextFull(300, 256),
        NeedsDraftModel(),
        NoMtpLayers("t.gguf"),
        DraftTooLong(12, 8, "h.gguf", 1),
        CannotTakeBack("cannot take them back: install llama-cpp-python 0.3.36 or later"),
        GammaTooLong(600, 512),
    ]
    replies = [ApiError.of(e, ("auto", "ngram", "none")) for e in errors]
    assert not [r for r in replies if "--" in r.message]
    assert [r.param for r in replies] == [None, "drafter", "drafter", "gamma", "drafter", "gamma"]
    assert replies[0].code == "context_length_exceeded"
    assert replies[1].message == (
        "drafter 'model' needs a draft model: this server has none; ask for drafter auto, ngram or none"
    )
    assert replies[2].message.endswith("has none: ask for drafter auto, ngram or none")
    assert replies[3].message.endswith("keeps to take back rejected tokens: ask for gamma 8 or less")
    assert ApiError.of(NoMtpLayers("t.gguf"), ("auto", "model", "ngram", "none")).message.endswith(
        "ask for drafter auto, model, ngram or none"
    )
