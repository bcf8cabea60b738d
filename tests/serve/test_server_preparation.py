"""A generating request is prepared before it waits for the engine, beside it: its chat template
rendered, its prompt tokenized, its grammar made. A heavy request (a huge conversation, a large
grammar) delays only itself, and its answer is the one it got when all this ran on the engine's
thread."""

import http.client
import json
import math
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import pytest
from serving import CTX, Server, hold, serving

import specllm
import specllm.serve.server as server_module
from specllm.engine.loop import prepare_grammar, prompt_end
from specllm.errors import SpecllmError
from specllm.llama.grammar import Grammar
from specllm.serve.server import GIVEN_UP_MASKS, ServeSettings, listen, serve

# Far past the context (2048 tokens): its 400 comes once it is all tokenized, seconds on 2 cores
CONVERSATION = [{"role": "user" if i % 2 == 0 else "assistant", "content": "word"} for i in range(8000)]
SMALL = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8, "temperature": 0}
GBNF = 'root ::= "{" [a-z]{1,6} "}"'
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


@pytest.fixture(scope="module")
def engine(tiny_models):
    engine = specllm.load(str(tiny_models.target), n_ctx=CTX, n_threads=1)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def srv(engine):
    s = Server(engine)
    yield s
    s.stop()


def post(srv, path: str, body: dict) -> tuple[int, dict]:
    return srv.post(path, json.dumps(body).encode())


def answered(srv, path: str, body: dict, into: dict, name: str) -> None:
    """Post, and keep the answer with the time it came."""
    status, data = post(srv, path, body)
    into[name] = (status, data, time.monotonic())


def long_text_tokenizing(engine, monkeypatch) -> threading.Event:
    """An event set when the target begins to tokenize a text of over 100,000 characters, on
    whichever thread that is."""
    begun, tokenize = threading.Event(), engine.target.tokenize

    def observed(text, *args, **kwargs):
        if len(text) > 100_000:
            begun.set()
        return tokenize(text, *args, **kwargs)

    monkeypatch.setattr(engine.target, "tokenize", observed)
    return begun


def test_a_huge_conversation_delays_only_itself(srv, engine, monkeypatch):
    """A small chat request sent while a huge conversation is being tokenized is answered before
    the huge one's 400: the engine was not held meanwhile. The 400 is the one it always was."""
    tokenizing, answers = long_text_tokenizing(engine, monkeypatch), {}
    heavy = threading.Thread(
        target=answered, args=(srv, "/v1/chat/completions", {"messages": CONVERSATION}, answers, "heavy")
    )
    heavy.start()
    assert tokenizing.wait(60)
    answered(srv, "/v1/chat/completions", SMALL, answers, "small")
    heavy.join(120)
    (small_status, _, small_at), (heavy_status, heavy_data, heavy_at) = answers["small"], answers["heavy"]
    assert (small_status, heavy_status) == (200, 400)
    assert small_at < heavy_at
    prompt = post(srv, "/apply-template", {"messages": CONVERSATION})[1]["prompt"]
    n = len(engine.prompt_tokens(prompt))
    assert heavy_data["error"]["message"] == f"the prompt is {n} tokens but the context holds {CTX}"
    assert heavy_data["error"]["code"] == "context_length_exceeded"


def test_a_request_past_the_waiting_limit_is_refused_before_it_is_prepared(engine, monkeypatch):
    """A request counts as waiting from its preparation on (it holds its body): past --max-waiting
    the next one is refused at once, a 503, its conversation never tokenized."""
    busy, answers = Server(engine, max_waiting=1), {}
    release = hold(engine, monkeypatch, CTX - 16)
    threads = [
        threading.Thread(target=answered, args=(busy, "/completion", body, answers, name))
        for name, body in (
            ("long", {"prompt": "x", "max_tokens": CTX - 16}),
            ("small", {"prompt": "x", "max_tokens": 8}),
        )
    ]
    try:
        for thread, state in zip(threads, ({"busy": True}, {"waiting": 1})):
            thread.start()
            deadline = time.monotonic() + 10
            while not state.items() <= busy.get("/health").items() and time.monotonic() < deadline:
                time.sleep(0.005)
        tokenizing = long_text_tokenizing(engine, monkeypatch)
        status, data = post(busy, "/v1/chat/completions", {"messages": CONVERSATION})
        assert status == 503 and data["error"]["code"] == "server_busy", data
        assert not tokenizing.is_set()
    finally:
        release.set()
        for thread in threads:
            thread.join(60)
        busy.stop()
    assert answers["long"][0] == answers["small"][0] == 200


def grammar_threads(monkeypatch) -> list[str]:
    """The names of the threads llama.cpp's grammars are parsed on, from now on."""
    names: list[str] = []
    init = Grammar.__init__

    def observed(self, model, text, *, root="root", _sampler=None):
        if _sampler is None:  # not a clone
            names.append(threading.current_thread().name)
        init(self, model, text, root=root, _sampler=_sampler)

    monkeypatch.setattr(Grammar, "__init__", observed)
    return names


# The threads a grammar is made on: a request's preparation, and its answer grammar's timing (check_cost)
BESIDE = ("specllm-prepare", "specllm-grammar-cost")


def test_a_grammar_is_made_beside_the_engine_and_generates_the_same(srv, engine, monkeypatch):
    """A grammar's parse (an exponential one takes seconds: 17 rules of nested optional symbols
    took 4 s) runs before the request's turn, not on the engine's thread, and the text is what
    the engine generates under the grammar by itself."""
    names = grammar_threads(monkeypatch)
    body = {"prompt": "x", "grammar": GBNF, "max_tokens": 16, "temperature": 0}
    status, data = post(srv, "/completion", body)
    assert status == 200 and names and all(name.startswith(BESIDE) for name in names), (status, names)
    assert data["content"] == engine.generate("x", grammar=GBNF, max_tokens=16, temperature=0).text
    names.clear()
    response_format = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
    status, data = post(srv, "/v1/chat/completions", {**SMALL, "max_tokens": 40, "response_format": response_format})
    assert status == 200 and names and all(name.startswith(BESIDE) for name in names), (status, names)


def test_a_grammar_made_for_another_prompt_end_is_made_again(engine):
    """The engine uses a grammar made ahead only for the config and prompt end it was made for:
    a prompt that ends otherwise (a think block it opens, say) gets its own."""
    config = specllm.GenerationConfig(max_tokens=4, grammar=GBNF)
    target = engine.target
    prepared = prepare_grammar(target, target.tokenize("x"), config)
    assert prepared is not None and prepared.made is not None
    made, end = prepared.made, prompt_end(target, target.tokenize("x"))
    assert prepared.take(config, end) is made
    assert prepared.take(config, end) is None  # used once
    again = prepare_grammar(target, target.tokenize("x"), config)
    assert again is not None and again.take(config, "<think>\n") is None


# "x"? repeated: llama.cpp's grammar keeps a stack for every optional it may skip, and each token's
# check walks them all: a mask's cost grows about as N^3. On the tiny models' 569 tokens 900 of
# them take about 1 s a mask (1200: 1.5-1.8 s); on Qwen2.5's 152k tokens 200 take 3.8 s, 500 over
# 100 s. Parsing it takes milliseconds: only timing a mask tells it from a real schema.
COSTLY = "root ::= " + " ".join(['"x"?'] * 1200)
LOW_BUDGET = 0.2  # seconds: the tiny vocabulary's real schemas take well under a millisecond


def grammar_masks(monkeypatch) -> list[tuple[str, float]]:
    """The grammars' first masks the server times from now on: (thread name, when it ended)."""
    masks: list[tuple[str, float]] = []
    measure = server_module.first_mask_seconds

    def observed(*args):
        seconds = measure(*args)
        masks.append((threading.current_thread().name, time.monotonic()))
        return seconds

    monkeypatch.setattr(server_module, "first_mask_seconds", observed)
    return masks


@pytest.fixture
def budgeted(engine):
    s = Server(engine, grammar_budget=LOW_BUDGET)
    yield s
    s.stop()
    s.worker.grammar_cost.join()  # a mask under way reads the vocabulary: ended before it closes


def assert_too_costly(status: int, data: dict) -> None:
    assert status == 400, data
    error = data["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", "grammar", "grammar_too_costly")
    assert error["message"] == (
        "the grammar is too costly to follow: masking the vocabulary once took more than 0.2 s, past this "
        "server's budget of 0.2 s a mask (serve --grammar-budget)"
    )


def test_a_grammar_too_costly_to_follow_is_refused_and_holds_no_one(budgeted, monkeypatch):
    """A grammar whose first mask takes past the budget gets its 400 once the budget has passed,
    not once llama.cpp is done with the mask (which cannot be stopped): its thread goes on alone,
    and a small request sent then is answered before that mask ends. Nothing was generated."""
    masks = grammar_masks(monkeypatch)
    asked = time.monotonic()
    status, data = post(budgeted, "/completion", {"prompt": "x", "grammar": COSTLY, "max_tokens": 4})
    refused_at = time.monotonic()
    assert_too_costly(status, data)
    assert refused_at - asked < 1.0 and not masks  # answered while the mask went on
    small: dict = {}
    answered(budgeted, "/v1/chat/completions", SMALL, small, "small")
    assert small["small"][0] == 200 and budgeted.get("/health")["waiting"] == 0
    deadline = time.monotonic() + 60
    while not masks and time.monotonic() < deadline:
        time.sleep(0.01)
    ((thread, ended),) = masks
    assert thread.startswith("specllm-grammar-cost") and small["small"][2] < ended


@pytest.mark.parametrize(
    "prompt",
    [
        pytest.param("x<think>\n", id="a think block the prompt opened"),  # the answer's masks come after it
        pytest.param([1, 120, 121], id="token ids"),  # no text prompt: its grammar was made in its turn alone
    ],
)
def test_a_costly_grammar_is_timed_whatever_the_prompt(budgeted, monkeypatch, prompt):
    """The answer's own grammar is timed: after a reasoning too (the first steps are free of it),
    and for a prompt of token ids (made on the engine's thread)."""
    masks = grammar_masks(monkeypatch)
    status, data = post(budgeted, "/completion", {"prompt": prompt, "grammar": COSTLY, "max_tokens": 4})
    assert_too_costly(status, data)
    deadline = time.monotonic() + 60
    while not masks and time.monotonic() < deadline:  # ended before the server is stopped
        time.sleep(0.01)
    assert len(masks) == 1


def test_a_real_schema_and_grammar_pass_a_low_budget(budgeted, engine, monkeypatch):
    """A schema's and a small grammar's first masks take a fraction of a millisecond on the tiny
    vocabulary: they are timed, and generate what the engine generates by itself."""
    masks = grammar_masks(monkeypatch)
    body = {"prompt": "x", "grammar": GBNF, "max_tokens": 16, "temperature": 0}
    status, data = post(budgeted, "/completion", body)
    assert status == 200 and data["content"] == engine.generate("x", grammar=GBNF, max_tokens=16, temperature=0).text
    response_format = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
    status, data = post(
        budgeted, "/v1/chat/completions", {**SMALL, "max_tokens": 40, "response_format": response_format}
    )
    assert status == 200, data
    assert len(masks) == 2


def test_a_grammar_budget_is_a_positive_number_of_seconds():
    for budget in (0, -1.0, math.inf, math.nan):
        with pytest.raises(SpecllmError, match="the grammar budget is a number of seconds above 0"):
            ServeSettings(model="tiny", grammar_budget=budget)


# Tens of seconds a mask on the tiny vocabulary (28.5 s on a quiet core): still running when each
# test below ends with its server
STUCK = "root ::= " + " ".join(['"x"?'] * 3100)
SECONDS_STUCK = "root ::= " + " ".join(['"x"?'] * 2000)  # about 7 s a mask
ASK_STUCK = {"prompt": "x", "grammar": STUCK, "max_tokens": 4}
ASK_CHEAP = {"prompt": "x", "grammar": GBNF, "max_tokens": 8, "temperature": 0}


def serve_args(tiny_models) -> list:
    return ["serve", "--target", tiny_models.target, "--threads", 1, "--port", 0, "--grammar-budget", LOW_BUDGET]


def post_to(url: str, body: dict) -> tuple[int, dict]:
    conn = http.client.HTTPConnection(urlsplit(url).netloc, timeout=120)
    conn.request("POST", "/completion", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    status, data = response.status, json.loads(response.read())
    conn.close()
    return status, data


def post_at_once(url: str, body: dict, count: int) -> list[tuple[int, dict]]:
    answers: list[tuple[int, dict]] = []
    posts = [threading.Thread(target=lambda: answers.append(post_to(url, body))) for _ in range(count)]
    for thread in posts:
        thread.start()
    for thread in posts:
        thread.join()
    return answers


def ended_within(proc, seconds: float) -> tuple[int, str]:
    """The exit code and the rest of stderr of a serve process that must end within `seconds`."""
    try:
        code = proc.wait(seconds)
    except subprocess.TimeoutExpired:
        pytest.fail(f"serve took longer than {seconds} s to end")
    return code, proc.stderr.read()


def test_costly_grammars_given_up_on_hold_no_cheap_one_and_past_a_cap_get_a_503(tiny_models):
    """Masks still running past the budget are given up on: a cheap grammar sent after four is
    timed and answered at once (it waited for a mask of theirs to end: tens of seconds). Past the
    cap of given-up masks still running, a grammar gets a 503 (and another thread is not started).
    SIGTERM ends serve within seconds, though the masks run on, with its line and exit code."""
    with serving(serve_args(tiny_models)) as (proc, _, url):
        answers = post_at_once(url, ASK_STUCK, 4)
        assert [a[1]["error"]["code"] for a in answers] == ["grammar_too_costly"] * 4
        asked = time.monotonic()
        status, data = post_to(url, ASK_CHEAP)
        assert status == 200 and re.fullmatch(r"\{[a-z]{1,6}\}", data["content"]), data
        assert time.monotonic() - asked < 5
        for _ in range(GIVEN_UP_MASKS + 1 - 4):
            status, data = post_to(url, ASK_STUCK)
            assert (status, data["error"]["code"]) == (400, "grammar_too_costly")
        status, data = post_to(url, ASK_CHEAP)
        assert status == 503 and data["error"] == {
            "message": f"the server is busy with costly grammars ({GIVEN_UP_MASKS + 1} masks past the budget "
            "still running): try again later",
            "type": "server_error",
            "param": None,
            "code": "server_busy",
        }
        proc.send_signal(signal.SIGTERM)
        code, rest = ended_within(proc, 10)
        assert code == 143 and rest.splitlines()[-1] == "terminated" and "Traceback" not in rest, rest


def test_ctrl_c_ends_serve_at_once_beside_a_costly_grammars_mask(tiny_models):
    with serving(serve_args(tiny_models)) as (proc, _, url):
        status, data = post_to(url, ASK_STUCK)
        assert (status, data["error"]["code"]) == (400, "grammar_too_costly")
        proc.send_signal(signal.SIGINT)
        code, rest = ended_within(proc, 10)
        assert code == 130 and rest.splitlines()[-1] == "interrupted" and "Traceback" not in rest, rest


def serving_in_a_thread(engine, monkeypatch) -> tuple[str, Callable[[], None]]:
    """serve() itself, as the CLI calls it, on a thread: its URL, and what stops it and waits for
    its end (as Ctrl-C would)."""
    servers = []
    make_server = server_module.server
    monkeypatch.setattr(server_module, "server", lambda app: servers.append(make_server(app)) or servers[-1])
    sock = listen("127.0.0.1", 0)
    url = server_module.address(sock)
    thread = threading.Thread(target=serve, args=(engine, ServeSettings(model="tiny", grammar_budget=LOW_BUDGET), sock))
    thread.start()
    while not (servers and servers[0].started):
        time.sleep(0.01)

    def stop() -> None:
        servers[0].handle_exit(signal.SIGINT, None)
        thread.join(10)
        assert not thread.is_alive()

    return url, stop


def test_serve_leaves_the_models_a_mask_still_reads_and_frees_them_otherwise(tiny_models, monkeypatch):
    """After serve, the caller closes the engine (the CLI does): that frees the models, but for
    those a grammar's mask still reads, which are left to the process's end (freed under it, the
    mask would read freed memory)."""
    engine = specllm.load(str(tiny_models.target), n_ctx=CTX, n_threads=1)
    url, stop = serving_in_a_thread(engine, monkeypatch)
    assert post_to(url, ASK_CHEAP)[0] == 200
    stop()
    engine.close()
    assert engine.target._model is None  # freed: no mask was running

    engine = specllm.load(str(tiny_models.target), n_ctx=CTX, n_threads=1)
    url, stop = serving_in_a_thread(engine, monkeypatch)
    masks = grammar_masks(monkeypatch)
    assert post_to(url, {**ASK_STUCK, "grammar": SECONDS_STUCK})[0] == 400
    stop()
    engine.close()
    assert engine.target._model is not None and not masks  # left: the mask goes on reading it
    deadline = time.monotonic() + 120
    while not masks and time.monotonic() < deadline:
        time.sleep(0.05)
    assert masks  # it ended, reading the vocabulary to the end
    engine.target.close()
