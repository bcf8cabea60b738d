"""llama-server's own endpoints, /infill and /completion, and filling in the middle with
/v1/completions' suffix, on tiny models with Qwen2.5-Coder's FIM tokens. Greedy answers are
compared with the engine's own."""

import json
import subprocess
import sys
import threading

import pytest
from serving import CTX, Server, serve_log

import specllm
from specllm.engine.infill import ContextFile
from specllm.engine.loop import Result, Stats
from specllm.llama.grammar import Grammar
from specllm.serve.llama_api import tokens_cached

PREFIX = "def total(values):\n    result = 0\n"
SUFFIX = "\n    return result\n"
GREEDY = dict(temperature=0, max_tokens=16)
GBNF = "root ::= [a-z ]{1,8}"


@pytest.fixture(scope="module")
def engine(tiny_code_models):
    engine = specllm.load(str(tiny_code_models.target), str(tiny_code_models.draft), n_ctx=CTX, n_threads=1)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def log():
    with serve_log() as lines:
        yield lines


@pytest.fixture(scope="module")
def srv(engine, log):
    s = Server(engine)
    yield s
    s.stop()


def expected(engine, files=(), line="", max_tokens=16):
    prompt = engine.infill_prompt(PREFIX, SUFFIX, files=files, line=line, max_tokens=max_tokens)
    return engine.generate(prompt.tokens, max_tokens=max_tokens, temperature=0, drafter="none")


def test_a_completion_with_a_suffix_fills_the_gap(srv, engine):
    reply = srv.client().completions.create(model="m", prompt=PREFIX, suffix=SUFFIX, **GREEDY)
    alone = expected(engine)
    assert reply.choices[0].text == alone.text
    assert reply.usage.prompt_tokens == len(engine.infill_prompt(PREFIX, SUFFIX, max_tokens=16).tokens)
    plain = srv.client().completions.create(model="m", prompt=PREFIX, suffix="", **GREEDY)
    assert plain.usage.prompt_tokens == len(engine.prompt_tokens(PREFIX))  # "" asks for no gap


@pytest.mark.parametrize("drafter", ["model", "ngram", "auto"])
def test_infill_greedy_equals_target_only(srv, engine, drafter):
    body = dict(input_prefix=PREFIX, input_suffix=SUFFIX, n_predict=16, temperature=0, drafter=drafter)
    status, data = srv.post("/infill", json.dumps(body).encode())
    assert status == 200
    alone = expected(engine)
    assert data["content"] == alone.text
    assert data["tokens_predicted"] == 16 and data["stop_type"] == "limit" and data["stop"] is True
    assert data["tokens_evaluated"] == alone.stats.prompt_tokens and data["truncated"] is False
    assert data["tokens_cached"] == alone.stats.prompt_tokens + 16 - 1  # all but the last token, as llama-server
    assert data["timings"]["predicted_n"] == 16


def test_infill_reads_files_and_the_cursors_line_as_llama_server_does(srv, engine):
    extra = [{"filename": "a.py", "text": "x = 1\n"}, {"text": "y = 2\n"}]
    body = dict(
        input_prefix=PREFIX, input_suffix=SUFFIX, input_extra=extra, prompt="    res", n_predict=8, temperature=0
    )
    status, data = srv.post("/infill", json.dumps(body).encode())
    files = (ContextFile("a.py", "x = 1\n"), ContextFile("tmp", "y = 2\n"))  # llama-server's name for none
    alone = expected(engine, files=files, line="    res", max_tokens=8)
    assert status == 200 and data["content"] == alone.text
    assert data["tokens_evaluated"] == alone.stats.prompt_tokens


def test_a_streamed_infill_is_llama_cpps_stream(srv, engine):
    events = srv.post_events(
        "/infill", dict(input_prefix=PREFIX, input_suffix=SUFFIX, n_predict=16, temperature=0, stream=True)
    )
    *chunks, last = events
    assert "[DONE]" not in events  # llama.cpp's own stream ends with its last object
    assert all(chunk["stop"] is False for chunk in chunks)
    assert "".join(chunk["content"] for chunk in chunks) == expected(engine).text
    assert last["stop"] is True and last["content"] == "" and last["tokens_predicted"] == 16


def test_response_fields_pick_paths_as_llama_server_does(srv):
    fields = ["content", "timings/predicted_n", "truncated", "no/such"]
    body = dict(input_prefix=PREFIX, input_suffix=SUFFIX, n_predict=4, response_fields=fields)
    status, data = srv.post("/infill", json.dumps(body).encode())
    assert status == 200 and set(data) == {"content", "timings/predicted_n", "truncated"}
    assert data["timings/predicted_n"] == 4


def test_code_cut_to_leave_room_for_the_reply_is_told_as_truncated(srv, engine):
    body = dict(input_prefix=PREFIX * 400, input_suffix=SUFFIX, n_predict=8, temperature=0)
    status, data = srv.post("/infill", json.dumps(body).encode())
    assert status == 200 and data["truncated"] is True
    assert data["tokens_evaluated"] == CTX - 8


@pytest.mark.parametrize(
    ("path", "body", "param", "message"),
    [
        ("/infill", {"input_suffix": ""}, "input_prefix", "Field required"),
        ("/infill", {"input_prefix": "", "input_suffix": "", "n_predict": -2}, "n_predict", "greater than or equal to -1"),  # noqa: E501
        ("/infill", {"input_prefix": "", "input_suffix": "", "lora": [{"id": 0}]}, "lora", "not supported"),
        ("/infill", {"input_prefix": "", "input_suffix": "", "input_extra": [{"filename": "a"}]}, "input_extra.0.text", "required"),  # noqa: E501
        ("/infill", {"input_prefix": "", "input_suffix": "", "grammar": "root ::= x"}, "grammar", "Undefined rule identifier 'x'"),  # noqa: E501
        ("/completion", {"prompt": "x", "mirostat": 2}, "mirostat", "not supported"),
        ("/completion", {"prompt": [1, 2], "grammar": "root ::= x"}, "grammar", "Undefined rule identifier 'x'"),
        ("/v1/completions", {"prompt": [1, 2], "suffix": "x"}, "suffix", "prompt as text"),
    ],
)  # fmt: skip
def test_bad_fill_requests_are_a_400(srv, path, body, param, message):
    status, data = srv.post(path, json.dumps(body).encode())
    assert status == 400 and data["error"]["param"] == param and message in data["error"]["message"]


def test_a_gaps_prompt_and_grammar_are_made_before_it_waits_for_the_engine(srv, engine, monkeypatch):
    """/infill's prompt (its files read, its code cut to fit the context) and its grammar are made
    on the threads that prepare a request beside the generation under way, not on the engine's,
    and the answer is the one the engine gives for that prompt under that grammar."""
    threads, tokenize = set(), engine.target.tokenize

    def observed(text, *args, **kwargs):
        if len(text) > 1000:  # the code, not a marker the engine looks up in its turn
            threads.add(threading.current_thread().name.split("_")[0])
        return tokenize(text, *args, **kwargs)

    parsed, init = set(), Grammar.__init__

    def parse_observed(self, model, text, *, root="root", _sampler=None):
        if _sampler is None:  # not a clone
            parsed.add(threading.current_thread().name.split("_")[0])
        init(self, model, text, root=root, _sampler=_sampler)

    monkeypatch.setattr(engine.target, "tokenize", observed)
    monkeypatch.setattr(Grammar, "__init__", parse_observed)
    files = [{"filename": "util.py", "text": "def helper():\n    pass\n" * 200}]
    body = dict(input_prefix=PREFIX * 100, input_suffix=SUFFIX, input_extra=files, n_predict=8, temperature=0)
    status, data = srv.post("/infill", json.dumps(body | {"grammar": GBNF}).encode())
    assert status == 200 and data["truncated"] is True, data
    assert threads == {"specllm-prepare"}, threads
    assert parsed and parsed <= {"specllm-prepare", "specllm-grammar-cost"}, parsed
    monkeypatch.undo()
    extra = [ContextFile("util.py", files[0]["text"])]
    prompt = engine.infill_prompt(PREFIX * 100, SUFFIX, files=extra, max_tokens=8)
    alone = engine.generate(prompt.tokens, max_tokens=8, temperature=0, drafter="none", grammar=GBNF)
    assert data["content"] == alone.text


def test_a_model_without_fim_tokens_says_so(tiny_models):
    engine = specllm.load(str(tiny_models.target), n_ctx=CTX, n_threads=1)
    srv = Server(engine)
    try:
        status, data = srv.post("/infill", json.dumps(dict(input_prefix="a", input_suffix="b")).encode())
    finally:
        srv.stop()
        engine.close()
    assert status == 400 and "has no fill-in-the-middle tokens" in data["error"]["message"]


def test_run_with_a_suffix_fills_the_gap(tiny_code_models, engine):
    models = ["--target", tiny_code_models.target, "--draft", tiny_code_models.draft, "--threads", 1]

    def run(prefix: str) -> subprocess.CompletedProcess:
        args = ["run", prefix, "--suffix", SUFFIX, "-n", 16, "--temperature", 0, "--ctx-size", CTX, "--json", *models]
        command = [sys.executable, "-m", "specllm", *map(str, args)]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    proc = run(PREFIX)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["text"] == expected(engine).text and "note:" not in proc.stderr
    proc, left_out = run(PREFIX * 200), engine.infill_prompt(PREFIX * 200, SUFFIX, max_tokens=16).left_out
    assert proc.returncode == 0 and f"note: {left_out} tokens of the code were cut" in proc.stderr and left_out > 0


def test_n_predict_0_fills_the_cache_and_samples_one_token_as_llama_server(srv, engine, log):
    """llama.vscode sends its other files with n_predict 0 ahead of completions, so that their
    prompt is in the KV cache: the next request that begins with them prefills only the rest."""
    files = [{"filename": "a.py", "text": "x = 1\n" * 50}]
    warm = dict(input_prefix="", input_suffix="", input_extra=files, n_predict=0, temperature=0)
    status, data = srv.post("/infill", json.dumps(warm).encode())
    assert status == 200 and data["tokens_predicted"] == 1
    body = dict(input_prefix=PREFIX, input_suffix=SUFFIX, input_extra=files, n_predict=4, temperature=0)
    status, data = srv.post("/infill", json.dumps(body).encode())
    shared = engine.infill_prompt("", "", files=[ContextFile("a.py", "x = 1\n" * 50)]).tokens[:-2]  # to <|fim_prefix|>
    # The reply tells no reuse (another client may have left it: serve.md), the log does.
    prefilled = data["tokens_evaluated"] - len(shared) - 1
    assert status == 200 and f"prompt {data['tokens_evaluated']} tokens ({prefilled} prefilled)" in log[-1]


def test_n_indent_and_t_max_predict_ms_end_a_completion_as_llama_server(srv, engine):
    prefix = PREFIX + "    for value in values:\n"  # the tiny model's reply to it has line breaks
    prompt = engine.infill_prompt(prefix, SUFFIX, max_tokens=200).tokens
    free = engine.generate(prompt, max_tokens=200, temperature=0, drafter="none")
    limited = engine.generate(prompt, max_tokens=200, temperature=0, drafter="none", min_indent=1)
    assert limited.stop_reason == "limit" and free.text.startswith(limited.text) and free.text != limited.text
    body = dict(input_prefix=prefix, input_suffix=SUFFIX, n_predict=200, temperature=0, n_indent=1)
    status, data = srv.post("/infill", json.dumps(body).encode())
    assert status == 200 and (data["content"], data["stop_type"]) == (limited.text, "limit")
    body = dict(body, n_indent=0, t_max_predict_ms=0.001)
    status, data = srv.post("/infill", json.dumps(body).encode())
    pieces = [engine.target.piece(t) for t in free.tokens]
    first_break = next(i for i, piece in enumerate(pieces) if i > 0 and b"\n" in piece)  # after the first token
    assert status == 200 and data["stop_type"] == "limit" and data["content"] != free.text
    assert data["content"] == b"".join(pieces[: first_break + 1]).decode(errors="replace")


@pytest.mark.parametrize("stream", [False, True])
def test_completion_is_llama_servers_completion(srv, engine, stream):
    """Continue's llama.cpp provider: a prompt (its FIM tokens written by the client, as text)
    completed, in llama.cpp's completion objects."""
    text = "<|fim_prefix|>" + PREFIX + "<|fim_suffix|>" + SUFFIX + "<|fim_middle|>"
    alone = engine.generate(text, max_tokens=16, temperature=0, drafter="none")
    assert engine.prompt_tokens(text) == engine.infill_prompt(PREFIX, SUFFIX).tokens  # the tokens read as such
    body = dict(prompt=text, n_predict=16, temperature=0, stream=stream, mirostat=0)  # 0: no mirostat
    if stream:
        *chunks, last = srv.post_events("/completion", body)
        content = "".join(chunk["content"] for chunk in chunks)
    else:
        status, last = srv.post("/completion", json.dumps(body).encode())
        content = last["content"]
    assert content == alone.text and last["tokens_predicted"] == 16 and last["stop"] is True
    ids = dict(body, prompt=engine.prompt_tokens(text), stream=False, seed=-1)  # llama-server's "a fresh seed"
    assert srv.post("/completion", json.dumps(ids).encode())[1]["content"] == alone.text
    assert srv.post("/completion", json.dumps(dict(ids, prompt=[])).encode())[0] == 400


def test_tokens_cached_counts_what_the_kv_cache_holds_as_llama_server():
    stats = Stats(prompt_tokens=10)
    assert tokens_cached(Result("abc", [7, 8, 9], "max_tokens", stats)) == 12  # the last token never evaluated
    assert tokens_cached(Result("abc", [7, 8, 9], "eos", stats)) == 13  # the end of text is none of them


@pytest.mark.parametrize("seed", [-1, 4294967295])
def test_llama_servers_seeds_for_a_fresh_one_ask_for_a_fresh_one(srv, seed):
    body = dict(prompt="def", n_predict=2, seed=seed, mirostat=0.0)
    status, data = srv.post("/completion", json.dumps(body).encode())
    assert status == 200 and data["specllm"]["seed"] != 4294967295
    again = srv.post("/completion", json.dumps(body).encode())[1]
    assert again["specllm"]["seed"] != data["specllm"]["seed"]
