"""`specllm serve` as a real process, for the tests of the command itself."""

from __future__ import annotations

import http.client
import json
import logging
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import openai
import tiny_models as tm

import specllm
from specllm.engine.loop import Generation
from specllm.serve.openai_api import ChatReply, ToolReply
from specllm.serve.server import ServeSettings, address, create_app, listen, server


@contextmanager
def serving(
    args: list, env: dict | None = None, python: str = sys.executable, cwd=None
) -> Iterator[tuple[subprocess.Popen, list[str], str]]:
    """`python -m specllm ARGS` (a `serve` command with `--port 0`): yields the process, its stderr
    lines up to the startup line, and the server's URL; the process is killed at the end."""
    proc = subprocess.Popen(
        [python, "-m", "specllm", *map(str, args)], stderr=subprocess.PIPE, text=True, env=env, cwd=cwd
    )
    try:
        lines = []
        while not lines or not lines[-1].startswith("specllm serve:"):
            lines.append(proc.stderr.readline())
            assert lines[-1], "".join(lines)
        yield proc, lines, re.search(r"http://127\.0\.0\.1:\d+", lines[-1])[0]
    finally:
        proc.kill()
        proc.wait()


CTX = 2048


class Server:
    """create_app on uvicorn in a thread, on a free loopback port; its log lines are kept."""

    def __init__(self, engine, embedder=None, **settings):
        self.sock = listen("127.0.0.1", 0)
        self.url = address(self.sock)
        app = create_app(engine, ServeSettings(model="tiny", **settings), embedder)
        self.worker = app.state.worker
        self.uvicorn = server(app)
        self.thread = threading.Thread(target=self.uvicorn.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        while not self.uvicorn.started:
            time.sleep(0.01)

    def client(self, api_key="-"):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=60)

    def post(self, path, body: bytes, headers=None):
        """A raw request (for bodies the openai client would not send): (status, JSON body)."""
        conn = http.client.HTTPConnection(urlsplit(self.url).netloc, timeout=60)
        conn.request("POST", path, body, {"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        status, data = response.status, json.loads(response.read())
        conn.close()
        return status, data

    def post_events(self, path, body: dict) -> list:
        """The events of a streamed response, each data line read as JSON ("[DONE]" as a string)."""
        conn = http.client.HTTPConnection(urlsplit(self.url).netloc, timeout=60)
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        lines = conn.getresponse().read().decode().split("\n\n")
        conn.close()
        data = [line.removeprefix("data: ") for line in lines if line]
        return [d if d == "[DONE]" else json.loads(d) for d in data]

    def post_named_events(self, path, body: dict) -> list[dict]:
        """The events of a stream whose `event:` lines name their data's type (the Responses API's,
        Anthropic's), each checked to do so, read as JSON."""
        conn = http.client.HTTPConnection(urlsplit(self.url).netloc, timeout=60)
        conn.request("POST", path, json.dumps(body | {"stream": True}), {"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200 and response.getheader("content-type").startswith("text/event-stream")
        blocks = [block for block in response.read().decode().split("\n\n") if block]
        conn.close()
        read = []
        for block in blocks:
            event_line, data_line = block.split("\n")
            data = json.loads(data_line.removeprefix("data: "))
            assert event_line == f"event: {data['type']}"
            read.append(data)
        return read

    def get(self, path):
        conn = http.client.HTTPConnection(urlsplit(self.url).netloc, timeout=60)
        conn.request("GET", path)
        data = json.loads(conn.getresponse().read())
        conn.close()
        return data

    def stop(self):
        self.uvicorn.should_exit = True
        self.thread.join(10)
        self.sock.close()


class LogLines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@contextmanager
def serve_log() -> Iterator[list[str]]:
    """The lines specllm serve logs meanwhile (a fixture's `log`)."""
    logger, handler = logging.getLogger("specllm.serve"), LogLines()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)


def hold(engine, monkeypatch, max_tokens) -> threading.Event:
    """Make the engine's generations of `max_tokens` tokens wait after their first step until the
    event returned is set: a generation stays under way while a test acts on it, whatever the
    model's speed (the tiny models write CTX tokens in well under a second)."""
    release, start = threading.Event(), engine.start

    def held(generation):
        with generation:
            for i, step in enumerate(generation):
                yield step
                if i == 0:
                    release.wait(60)
            return generation.result

    def gated(prompt, config=None, **kwargs):
        generation = start(prompt, config, **kwargs)
        if config is not None and config.max_tokens == max_tokens:
            return Generation(held(generation))
        return generation

    monkeypatch.setattr(engine, "start", gated)
    return release


def leave_a_stream(engine, srv, monkeypatch, path: str, body: dict, first_event: bytes) -> str:
    """A client that reads a stream's first event from `path` and goes away, its generation held
    after its first step (so it cannot end first): the generation is cancelled, and the access
    log's line for the request is returned."""
    release = hold(engine, monkeypatch, body.get("max_tokens") or body["max_output_tokens"])
    with serve_log() as log:
        conn = http.client.HTTPConnection(urlsplit(srv.url).netloc, timeout=60)
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.readline().startswith(first_event)
        conn.close()
        release.set()
        (line,) = wait_for_line(log, f"POST {path}", 1)
    assert srv.worker.job.cancelled.wait(10)  # set as the response ends, just after the log line
    return line


def wait_for_line(log, fragment, count):
    deadline = time.time() + 30
    while sum(fragment in line for line in log) < count and time.time() < deadline:
        time.sleep(0.05)
    return [line for line in log if fragment in line]


# A chat request for templated_server's models: a question, the tool that answers it, and greedy
# settings that keep the tiny models' replies short.
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
GET_WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "The weather in a city", "parameters": PARAMETERS},
}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
GREEDY = dict(model="x", temperature=0, max_tokens=12)
CALL = {"id": "abc123XYZ", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


def read_reply(pieces: list[str], opened: bool | str = False, prefill: str = "") -> tuple[dict, dict]:
    """A reply read by ChatReply in these pieces, get_weather offered (`opened`, `prefill`: as
    ChatReply takes them): the message, and the deltas joined."""
    reply = ChatReply(opened, ToolReply(["get_weather"]), prefill)
    joined: dict = {"reasoning": "", "text": "", "tool_calls": []}
    for delta in [reply.feed(piece) for piece in pieces] + [reply.finish()]:
        for part in delta:
            for key, value in part.items():
                joined[key] += value
    return reply.message(), joined


def replayed(reply, read: ChatReply, pieces: list[str], result) -> list:
    """The events `reply` (an API's Reply) streams for a generation of `result` whose text came in
    these pieces, read by `read` (the reader serve made for the request)."""
    streamed = reply.opening()
    for piece in pieces:
        streamed += reply.deltas(read.feed(piece))
    return streamed + reply.deltas(read.finish()) + reply.closing(result, 0, read, False)


def templated_server(
    tmp_path_factory, name: str, template: str, settings: dict | None = None, **model
) -> Iterator[tuple]:
    """A tiny model with `template` as its chat template (and `model`'s write_model options: vocab,
    seed, ...), and a server of it with `settings` (ServeSettings'): yields (engine, server), for a
    module's fixture."""
    path = tm.write_model(tmp_path_factory.mktemp("templated") / f"{name}.gguf", chat_template=template, **model)
    engine = specllm.load(str(path), n_ctx=2048, n_threads=1)
    srv = Server(engine, **(settings or {}))
    yield engine, srv
    srv.stop()
    engine.close()
