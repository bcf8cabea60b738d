"""Chat, serve and run on hybrid (Qwen3.5), recurrent (Mamba) and MTP (Qwen3.5 with its own MTP
layers) targets: a recurrent state cannot be cut back to any position, so every turn after the
first, every edited history, every /reset and every request goes through Model._rewind (snapshots,
the checkpoint taken after each prefill, or the whole prompt again). Each reply must be what a fresh
target-only engine gives for the same tokens; the tokens the target really evaluates are counted
(a spy on its `sync`), not taken from the stats."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
from urllib.parse import urlsplit

import pytest
import tiny_models as tm
from one_line import assert_one_line_error
from serving import Server, serve_log

import specllm
from specllm.chat.repl import command
from specllm.chat.session import ChatSession
from specllm.engine.loop import make_config
from specllm.engine.prompt_cache import PromptCache
from specllm.llama.model import Model
from specllm.llama.options import ModelOptions

CTX = 512
MAX_TOKENS = 16
SYSTEM = "You are terse."
NEAR_TIE = 0.02  # as tests/chat/test_session.py: llama.cpp's logits move with the batch shape by up to ~7e-3
SPECLLM = [sys.executable, "-m", "specllm"]

# (target, draft, drafter): a noisy draft of the target's own arch, auto, and the target's MTP layers
CASES = [
    ("qwen35", "qwen35_draft", "model"),
    ("qwen35", "qwen35_draft", "auto"),
    ("mamba", "mamba_draft", "model"),
    ("mamba", "mamba_draft", "auto"),
    ("qwen35_mtp", None, "mtp"),
    ("qwen35_mtp", None, "auto"),
]
CASE_IDS = [f"{t}-{d}" for t, _, d in CASES]


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("hybrid_chat_serve")
    write = tm.write_model
    return {
        "qwen35": write(d / "qwen35.gguf", arch="qwen35", seed=0),
        "qwen35_draft": write(d / "qwen35_draft.gguf", arch="qwen35", seed=0, noise=tm.DRAFT_NOISES["qwen35"]),
        "qwen35_mtp": write(d / "qwen35_mtp.gguf", arch="qwen35", seed=0, n_nextn=1, mtp_mimic=True),
        "mamba": write(d / "mamba.gguf", arch="mamba", seed=0),
        "mamba_draft": write(d / "mamba_draft.gguf", arch="mamba", seed=0, noise=tm.DRAFT_NOISES["mamba"]),
    }


def load(paths, target, draft=None, **kw):
    return specllm.load(str(paths[target]), str(paths[draft]) if draft else None, n_ctx=CTX, n_threads=1, **kw)


def greedy(drafter, **kw):
    gamma = None if drafter in ("auto", "none") else 4  # within qwen35's 8 snapshots
    return make_config(**{"max_tokens": MAX_TOKENS, "temperature": 0.0, "drafter": drafter, "gamma": gamma, **kw})


def assert_fresh_reply(path, tokens, reply):
    """`reply` is what a freshly loaded engine gives target-only (greedy) for `tokens`, or differs
    from it first where the target's top two logits are a near-tie."""
    fresh = specllm.load(str(path), n_ctx=CTX, n_threads=1)
    try:
        expected = fresh.generate(tokens, config=greedy("none")).tokens
    finally:
        fresh.close()
    if expected == reply:
        return
    j = next((k for k, (a, b) in enumerate(zip(expected, reply)) if a != b), None)
    assert j is not None, f"lengths differ: {len(expected)} vs {len(reply)}"
    model = Model(path, ModelOptions(n_ctx=CTX, n_threads=1))
    try:
        logits = model.sync(tokens + expected[:j], n_logits=1)[0]
        gap = float(logits[expected[j]] - logits[reply[j]])
    finally:
        model.close()
    assert abs(gap) < NEAR_TIE, f"reply differs from a fresh target-only run at token {j} (logit gap {gap})"


class PrefillSpy:
    """Counts the tokens the target really evaluates in each `sync` (the engine's prefill is the
    first sync of a generation)."""

    def __init__(self, model):
        self.model, self.calls = model, []
        sync, decode = model.sync, model._decode
        counted = [0]

        def counting_decode(chunk, n_out):
            counted[0] += len(chunk)
            return decode(chunk, n_out)

        def counting_sync(tokens, n_logits=0):
            counted[0] = 0
            model._decode = counting_decode
            try:
                return sync(tokens, n_logits)
            finally:
                del model._decode
                self.calls.append(counted[0])

        model.sync = counting_sync

    def start(self):
        self.calls.clear()

    @property
    def prefill(self) -> int:
        return self.calls[0]


def turn(session, message):
    """One whole turn: (prepared, result)."""
    prepared = session.prepare(message)
    result = session.stream(prepared).run()
    return prepared, result


@pytest.fixture(params=CASES, ids=CASE_IDS)
def chat_case(request, paths):
    target, draft, drafter = request.param
    engine = load(paths, target, draft)
    spy = PrefillSpy(engine.target)
    yield engine, spy, paths[target], drafter
    engine.close()


def test_chat_turns_edits_and_reset_equal_fresh_target_only(chat_case, tmp_path):
    engine, spy, path, drafter = chat_case
    session = ChatSession(engine, greedy(drafter), system=SYSTEM)
    drafted = 0

    def checked_turn(message):
        nonlocal drafted
        spy.start()
        prepared, result = turn(session, message)
        assert_fresh_reply(path, prepared.tokens, result.tokens)
        assert session.turns[-1].reply == result.text
        drafted += result.stats.n_drafted
        return prepared, result

    # Turn 1: the whole prompt is prefilled.
    prepared, result = checked_turn("Hello world")
    assert result.stop_reason == "max_tokens" and spy.prefill == result.stats.prefill_tokens == len(prepared.tokens) - 1
    # Turns 2 and 3 extend the conversation: only the new tokens are evaluated, the cache (KV and
    # recurrent state) holds the rest.
    for message in ("def add(a, b):", "print the value"):
        last = len(prepared.tokens) + len(result.tokens)
        prepared, result = checked_turn(message)
        assert prepared.extended and prepared.reused == last
        assert (
            spy.prefill
            == result.stats.prefill_tokens
            == len(prepared.tokens) - prepared.reused
            < len(prepared.tokens) // 2
        )

    # An edited history: the transcript saved, turn 2's message changed and the last turn taken
    # back, loaded (/save and /load are what ChatSession offers to change earlier turns).
    saved = tmp_path / "chat.json"
    command(session, f"/save {saved}")
    data = json.loads(saved.read_text())
    data["turns"][1]["user"] = "def sub(a, b):"
    del data["turns"][2]
    saved.write_text(json.dumps(data))
    command(session, f"/load {saved}")
    prepared, result = checked_turn("return self.data")
    assert [t.user for t in session.turns] == ["Hello world", "def sub(a, b):", "return self.data"]
    assert prepared.tokens == engine.prompt_tokens(prepared.text) and "def sub(a, b):" in prepared.text
    assert "def add" not in prepared.text

    # A changed system prompt rewrites the start of the history.
    command(session, "/system You are verbose.")
    prepared, result = checked_turn("Once upon a time")
    assert not prepared.extended and prepared.text.count("You are verbose.") == 1

    # /reset: a new conversation (the system prompt stays), on a cache holding another.
    command(session, "/reset")
    prepared, result = checked_turn("import os")
    assert len(session.turns) == 1
    assert prepared.tokens == engine.prompt_tokens(prepared.text) and prepared.text.count("<|im_start|>user") == 1
    if drafter != "auto":
        assert drafted > 0  # really speculated (auto may judge drafting not worth it here)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_regenerating_a_reply_resumes_from_the_prefill_checkpoint(paths, case):
    """/reset right after a turn and the same message again (a regenerated reply): the prompt is
    the previous turn's, the cache holds it and the reply after it. A recurrent state cannot drop
    the reply token by token: it is restored from the checkpoint taken after the prefill (kept
    apart from those taken before draft and verify calls)."""
    target, draft, drafter = case
    engine = load(paths, target, draft)
    spy = PrefillSpy(engine.target)
    try:
        session = ChatSession(engine, greedy(drafter), system=SYSTEM)
        first, one = turn(session, "Hello world")
        assert engine.target.recurrent and len(engine.target.tokens) == len(first.tokens) + len(one.tokens) - 1
        command(session, "/reset")
        spy.start()
        again, two = turn(session, "Hello world")
        assert again.tokens == first.tokens and again.reused == len(first.tokens)
        assert two.tokens == one.tokens
        assert_fresh_reply(paths[target], again.tokens, two.tokens)
        assert spy.prefill == two.stats.prefill_tokens == 0  # the checkpoint after the prompt, kept
    finally:
        engine.close()


@pytest.mark.parametrize("case", [CASES[0], CASES[2]], ids=[CASE_IDS[0], CASE_IDS[2]])
def test_prefill_tokens_counts_what_a_recurrent_target_evaluates(paths, tmp_path, case):
    """Where a recurrent state cannot go back to the common prefix with the new prompt, it
    evaluates more than the tokens after it: the stats say what it evaluated."""
    target, draft, drafter = case
    engine = load(paths, target, draft)
    spy = PrefillSpy(engine.target)
    try:
        session = ChatSession(engine, greedy(drafter), system=SYSTEM)
        reported, evaluated = [], []
        for step in ("Hello world", "/reset", "Hello world", "def add(a, b):", "/save", "/load", "print the value"):
            if step == "/save":
                command(session, f"/save {tmp_path / 'chat.json'}")
                data = json.loads((tmp_path / "chat.json").read_text())
                data["turns"][-1]["user"] = "def sub(a, b):"  # edited: the text no longer extends
                (tmp_path / "chat.json").write_text(json.dumps(data))
            elif step == "/load":
                command(session, f"/load {tmp_path / 'chat.json'}")
            elif step.startswith("/"):
                command(session, step)
            else:
                spy.start()
                reported.append(turn(session, step)[1].stats.prefill_tokens)
                evaluated.append(spy.prefill)
        assert reported == evaluated
    finally:
        engine.close()


def test_chat_commands_refuse_a_fixed_draft_longer_than_the_snapshots(paths):
    """/gamma and /drafter refuse a fixed drafter whose draft would not fit the snapshots, with the
    commands that fix it, instead of taking it and failing every message after it."""
    from specllm.chat.repl import chat_hint
    from specllm.errors import DraftTooLong

    engine = load(paths, "qwen35", "qwen35_draft")
    try:
        session = ChatSession(engine, greedy("auto"))
        command(session, "/gamma 12")  # auto: the longest draft it may make, within the snapshots
        with pytest.raises(DraftTooLong) as refused:
            command(session, "/drafter model")
        assert chat_hint(refused.value) == ": /gamma 8 or less, /drafter auto, or start the chat with --snapshots 12"
        command(session, "/gamma 8")
        command(session, "/drafter model")
        with pytest.raises(DraftTooLong):
            command(session, "/gamma 9")
        assert (session.config.drafter, session.config.gamma) == ("model", 8)
        assert session.send("Hello world").stats.n_drafted > 0
    finally:
        engine.close()


def test_a_fixed_drafters_own_length_is_shown_within_the_snapshots(paths):
    """Without a gamma, a fixed drafter drafts the pair's length, but on a hybrid target no more
    than its snapshots take back: /gamma and /stats said 4 where every draft was at most 2 long,
    and where /gamma 4 was refused as too long."""
    engine = load(paths, "qwen35", "qwen35_draft", snapshots=2)
    try:
        session = ChatSession(engine, greedy("auto"))
        command(session, "/drafter model")
        assert command(session, "/gamma auto").text == "gamma 2"
        assert "gamma 2 ·" in command(session, "/stats").text
        assert len(session.send("Hello world").stats.drafted_per_position) == 2
    finally:
        engine.close()


# --- serve ----------------------------------------------------------------------------------


def post(srv, path, body, timeout=60):
    """A raw POST: (status, parsed JSON body, or the list of server-sent event payloads)."""
    conn = http.client.HTTPConnection(urlsplit(srv.url).netloc, timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        response = conn.getresponse()
        raw = response.read().decode("utf-8")
        kind = response.getheader("Content-Type", "")
    finally:
        conn.close()
    if kind.startswith("text/event-stream"):
        return response.status, [line[len("data: ") :] for line in raw.split("\n") if line.startswith("data: ")]
    return response.status, json.loads(raw)


def streamed_chat(srv, messages, **extensions):
    """A streamed chat request: its text (chunks added up), its number of text chunks and the
    specllm object of its last chunk. Fails on anything but a 200 stream that ends cleanly."""
    body = {"messages": messages, "temperature": 0, "max_tokens": MAX_TOKENS, "stream": True, **extensions}
    status, events = post(srv, "/v1/chat/completions", body)
    assert status == 200, events
    assert events[-1] == "[DONE]", events
    chunks = [json.loads(e) for e in events[:-1]]
    assert not [c for c in chunks if "error" in c], chunks
    pieces = [c["choices"][0]["delta"].get("content") for c in chunks if c.get("choices")]
    pieces = [p for p in pieces if p]
    stats = next(c["specllm"] for c in reversed(chunks) if "specllm" in c)
    return "".join(pieces), len(pieces), stats


def whole_chat(srv, messages, **extensions):
    body = {"messages": messages, "temperature": 0, "max_tokens": MAX_TOKENS, **extensions}
    status, data = post(srv, "/v1/chat/completions", body)
    assert status == 200, data
    return data["choices"][0]["message"]["content"]


def fresh_texts(path, *texts):
    """Target-only greedy replies to rendered conversations, each extending the one before with
    its reply, from a freshly loaded engine: each prompt's tokens made as the server makes them
    (PromptCache: the previous prompt's and reply's tokens as they were, then the new text's)."""
    fresh = specllm.load(str(path), n_ctx=CTX, n_threads=1)
    replies, cache = [], PromptCache(fresh)
    try:
        for i, text in enumerate(texts):
            prompt = cache.prompt(text)
            assert prompt.extended == (i > 0)
            result = fresh.generate(prompt.tokens, config=greedy("none"))
            replies.append(result.text)
            cache.remember(text, prompt.tokens, result)
    finally:
        fresh.close()
    return replies


@pytest.fixture
def log():
    with serve_log() as lines:
        yield lines


@pytest.fixture
def serve(paths, log):
    """serve(target, draft): a server on a free loopback port for that engine (stopped after)."""
    started = []

    def start(target, draft=None):
        engine = load(paths, target, draft, defer_draft=draft is not None)
        srv = Server(engine)
        started.append((srv, engine))
        return srv, engine

    yield start
    for srv, engine in started:
        srv.stop()
        engine.close()
    assert not [line for line in log if " 500 · " in line], log


MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "def f(x):"}]


def test_serve_streams_on_a_hybrid_target(serve, paths):
    srv, engine = serve("qwen35", "qwen35_draft")
    first = engine.target.render_chat(MESSAGES)
    [expected] = fresh_texts(paths["qwen35"], first)
    assert whole_chat(srv, MESSAGES, drafter="none") == expected
    for extensions in ({}, {"drafter": "auto"}, {"drafter": "model", "gamma": 3}):  # {}: the server's auto
        got, n_chunks, stats = streamed_chat(srv, MESSAGES, **extensions)
        assert (got, stats["stop_reason"]) == (expected, "max_tokens") and n_chunks > 1, extensions
    assert stats["stats"]["n_drafted"] > 0 and set(stats["stats"]["sources"]) <= {"model", "none"}
    # The conversation goes on: the next request extends it and prefills only its new tokens,
    # on top of a cache whose recurrent state holds the whole first reply.
    grown = MESSAGES + [{"role": "assistant", "content": got}, {"role": "user", "content": "and g(y)?"}]
    got, n_chunks, stats = streamed_chat(srv, grown, drafter="model", gamma=3)
    assert got == fresh_texts(paths["qwen35"], first, engine.target.render_chat(grown))[1] and n_chunks > 1
    assert stats["stats"]["prefill_tokens"] < stats["stats"]["prompt_tokens"] // 2


def test_serve_streams_with_mtp_drafts(serve, paths):
    srv, engine = serve("qwen35_mtp")
    [expected] = fresh_texts(paths["qwen35_mtp"], engine.target.render_chat(MESSAGES))
    assert whole_chat(srv, MESSAGES, drafter="none") == expected
    for drafter in ("mtp", "auto"):
        got, n_chunks, stats = streamed_chat(srv, MESSAGES, drafter=drafter)
        assert (got, stats["stop_reason"]) == (expected, "max_tokens") and n_chunks > 1, drafter
        if drafter == "mtp":
            assert stats["stats"]["n_drafted"] > 0 and set(stats["stats"]["sources"]) <= {"mtp", "none"}
        assert whole_chat(srv, MESSAGES, drafter=drafter) == expected


def test_serve_refuses_mtp_on_a_model_without_mtp_layers(serve):
    srv, _ = serve("qwen35")
    for stream in (False, True):
        body = {"messages": MESSAGES, "max_tokens": 4, "drafter": "mtp", "stream": stream}
        status, data = post(srv, "/v1/chat/completions", body)
        assert status == 400, data
        assert set(data) == {"error"} and set(data["error"]) == {"message", "type", "param", "code"}
        message = data["error"]["message"]
        assert "\n" not in message and "mtp" in message and "MTP layers" in message and "qwen35.gguf" in message
        assert "Traceback" not in message
    status, data = post(srv, "/v1/completions", {"prompt": "x", "max_tokens": 2, "drafter": "mtp"})
    assert status == 400 and "MTP layers" in data["error"]["message"]
    assert whole_chat(srv, MESSAGES, drafter="auto")  # the engine is free again


# --- the CLI --------------------------------------------------------------------------------


def specllm_run(*args):
    return subprocess.run(SPECLLM + ["run", *map(str, args)], capture_output=True, timeout=120)


@pytest.mark.parametrize("target,drafter", [("qwen35", None), ("mamba", None), ("qwen35_mtp", "mtp")])
def test_run_on_hybrid_recurrent_and_mtp_targets(isolated, paths, target, drafter):  # noqa: F811
    args = [
        "Hello world",
        "--target",
        paths[target],
        "--raw",
        "--max-tokens",
        MAX_TOKENS,
        "--temperature",
        0,
        "--no-live",
        "--threads",
        1,
        "--ctx-size",
        CTX,
    ]
    proc = specllm_run(*args, *(["--drafter", drafter] if drafter else []))
    stderr = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 0 and "Traceback" not in stderr, stderr
    assert f"drafter {drafter or 'auto'}" in stderr and "[max_tokens]" in stderr
    fresh = specllm.load(str(paths[target]), n_ctx=CTX, n_threads=1)
    try:
        expected = fresh.generate(fresh.prompt_tokens("Hello world"), config=greedy("none")).text
    finally:
        fresh.close()
    assert proc.stdout.decode("utf-8", "replace") == expected + "\n"


def test_run_with_mtp_on_a_model_without_mtp_layers_is_one_line(isolated, paths):  # noqa: F811
    proc = specllm_run(
        "Hello world",
        "--target",
        paths["qwen35"],
        "--raw",
        "--max-tokens",
        MAX_TOKENS,
        "--temperature",
        0,
        "--no-live",
        "--threads",
        1,
        "--drafter",
        "mtp",
    )
    proc = subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(), proc.stderr.decode())
    assert_one_line_error(proc, "drafter 'mtp'", "qwen35.gguf has none")
    assert proc.stdout == ""


@pytest.mark.parametrize("command", ["chat", "serve"])
@pytest.mark.parametrize("drafter,gamma,snapshots", [("mtp", 9, 8), ("ngram", 3, 2)])
def test_chat_and_serve_refuse_a_fixed_draft_longer_than_the_snapshots_at_the_start(
    isolated,  # noqa: F811
    paths,
    command,
    drafter,
    gamma,
    snapshots,
):
    """Not a chat whose every message fails, nor a server that answers every request with a 400
    telling its client to ask for a gamma it never sent."""
    extra = ["--port", "0"] if command == "serve" else ["--max-tokens", MAX_TOKENS]
    args = ["--target", paths["qwen35_mtp"], "--draft", "none", "--drafter", drafter, "--gamma", gamma]
    args += ["--snapshots", snapshots, "--threads", 1, "--ctx-size", CTX, *extra]
    proc = subprocess.run(SPECLLM + [command, *map(str, args)], input=b"Hello\n", capture_output=True, timeout=60)
    stderr = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 1 and "Traceback" not in stderr and "specllm serve:" not in stderr, stderr
    last = stderr.strip().splitlines()[-1]
    assert last == (
        f"error: gamma (draft length) {gamma} is longer than the {snapshots} recurrent-state snapshots "
        f"qwen35_mtp.gguf keeps to take back rejected tokens: use --gamma {snapshots} or less, "
        f"or --snapshots {gamma} (each snapshot costs 11.3 KB of memory)"
    )
    assert proc.stdout == b""


def test_a_fixed_drafter_given_no_gamma_drafts_within_the_snapshots(isolated, paths):  # noqa: F811
    """run and chat with --drafter model and 2 snapshots, no --gamma, were refused at the start
    ("gamma 4 is longer than the 2 snapshots: use --gamma 2"), a length the user never gave, while
    chat's /drafter model and serve's requests drafted within the snapshots. The pair's length is
    a default: kept within them, as auto's drafts are."""
    args = ["--target", paths["qwen35"], "--draft", paths["qwen35_draft"], "--drafter", "model", "--snapshots", 2]
    args += ["--threads", 1, "--ctx-size", CTX, "-n", MAX_TOKENS, "--temperature", 0, "--json"]
    proc = subprocess.run(SPECLLM + ["run", "Hello", *map(str, args)], capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    stats = json.loads(proc.stdout)["stats"]
    assert stats["n_drafted"] > 0 and len(stats["drafted_per_position"]) <= 2


def test_bench_keeps_its_default_lengths_within_the_snapshots(isolated, paths, tmp_path):  # noqa: F811
    """bench without --gamma compares draft lengths 2 and 4: on a target with 2 snapshots it was
    refused ("gamma 4 is longer than the 2 snapshots"), a length the user never gave."""
    out = tmp_path / "bench.json"
    args = ["--target", paths["qwen35"], "--draft", paths["qwen35_draft"], "--drafter", "model", "--snapshots", 2]
    args += ["--threads", 1, "--ctx-size", CTX, "-n", 4, "--per-category", 1, "--categories", "chat", "--json", out]
    proc = subprocess.run(SPECLLM + ["bench", *map(str, args)], capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    assert json.loads(out.read_text())["settings"]["gammas"] == [2]
