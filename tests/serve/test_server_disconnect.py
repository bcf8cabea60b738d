"""A streamed request whose client goes away while the response lags behind the engine: the engine
stops within a few steps of the last event the response took, however fast the model is. The
engine's steps are handed out one by one, and the response is held up at its fourth event."""

import gc
import json
import logging
import re
import signal
import socket
import threading
import time
from urllib.parse import urlsplit

from serving import CTX, LogLines, Server, wait_for_line

import specllm
from specllm.engine.loop import Generation
from specllm.serve import openai_api
from specllm.serve.server import AHEAD


class Steps:
    """The engine's steps wait for a permit each; `taken` counts the steps it has made."""

    def __init__(self, engine, monkeypatch):
        self.permits, self.taken, start = threading.Semaphore(0), 0, engine.start

        def gated(*args, **kwargs):
            def steps(generation):
                with generation:
                    for step in generation:
                        self.permits.acquire(timeout=60)
                        self.taken += 1
                        yield step
                    return generation.result

            return Generation(steps(start(*args, **kwargs)))

        monkeypatch.setattr(engine, "start", gated)


def hold_the_response_at(n: int, monkeypatch) -> threading.Event:
    """The response's n-th text chunk waits (on the event loop) until the event returned is set."""
    go, chunk, made = threading.Event(), openai_api.Reply.chunk, [0]

    def held(self, *args, **kwargs):
        made[0] += 1
        if made[0] == n:
            go.wait(60)
        return chunk(self, *args, **kwargs)

    monkeypatch.setattr(openai_api.Reply, "chunk", held)
    return go


def test_a_closed_stream_stops_the_engine_within_a_few_steps(tiny_models, monkeypatch):
    logger, lines = logging.getLogger("specllm.serve"), LogLines()
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    engine = specllm.load(str(tiny_models.target), n_ctx=CTX, n_threads=1)
    steps, go = Steps(engine, monkeypatch), hold_the_response_at(4, monkeypatch)
    srv = Server(engine)
    host, port = urlsplit(srv.url).netloc.split(":")
    try:
        client = socket.create_connection((host, int(port)))
        body = json.dumps(
            {"prompt": "def f(x):", "max_tokens": CTX - 16, "temperature": 0, "stream": True, "drafter": "none"}
        ).encode()
        client.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body) + body
        )
        steps.permits.release(3)
        received = b""
        while received.count(b"data: ") < 3:
            received += client.recv(65536)
        steps.permits.release(40)  # the response is held at its 4th event: the engine runs on
        deadline = time.monotonic() + 2
        while steps.taken < 40 and time.monotonic() < deadline:  # an engine without a bound takes all
            time.sleep(0.01)
        client.close()
        time.sleep(0.1)  # the close reaches the server
        go.set()
        stopped = wait_for_line(lines.lines, "client went away", 1)
        assert stopped, lines.lines
        generated = int(re.search(r"stopped after (\d+) tokens", stopped[0])[1])
        # 3 read; the held one; AHEAD in the queue and the one the engine made while it waited for
        # room; and, since the log reads the engine's live count, the few steps the engine takes
        # while the response works through its queue before it sees the connection closed. An
        # engine without the bound had taken all 40 permits.
        assert generated <= 3 + 1 + 4 + 1 + 6 and AHEAD == 4, stopped[0]
    finally:
        go.set()
        steps.permits.release(CTX)
        srv.stop()
        engine.close()
        logger.removeHandler(lines)


def test_a_request_whose_headers_never_end_is_closed(tiny_models):
    engine = specllm.load(str(tiny_models.target), n_ctx=CTX, n_threads=1)
    srv = Server(engine, header_seconds=2.0)
    host, port = urlsplit(srv.url).netloc.split(":")
    try:
        half = socket.create_connection((host, int(port)), timeout=10)
        half.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Ty")  # and nothing more
        whole = socket.create_connection((host, int(port)), timeout=10)  # a slow but whole request is served
        whole.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        time.sleep(0.2)
        whole.sendall(b"\r\n")
        assert whole.recv(65536).startswith(b"HTTP/1.1 200")
        start = time.monotonic()
        assert half.recv(65536) == b""  # closed by the server
        assert time.monotonic() - start < 10
    finally:
        srv.stop()
        engine.close()


def test_a_request_whose_body_never_ends_gets_a_408(tiny_models):
    """Its headers promise more than it sends: it would hold its connection open for good."""
    engine = specllm.load(str(tiny_models.target), n_ctx=CTX, n_threads=1)
    srv = Server(engine, body_seconds=2.0)
    host, port = urlsplit(srv.url).netloc.split(":")
    try:
        half = socket.create_connection((host, int(port)), timeout=10)
        half.sendall(b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"prompt": ')
        answer = _until_closed(half)  # headers and body may come in separate reads
        assert answer.startswith(b"HTTP/1.1 408") and b'"code":"request_timeout"' in answer, answer
        client = srv.client()  # and the server goes on
        assert client.completions.create(model="x", prompt="hi", max_tokens=2).usage.completion_tokens == 2
    finally:
        srv.stop()
        engine.close()


def _until_closed(sock: socket.socket) -> bytes:
    """All a socket receives until the server closes it."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_shutting_down_cuts_a_stream_its_client_does_not_read(tiny_models):
    """A client that stops reading a stream (suspended, or on a slow link) leaves its response
    waiting for room to write: shutting down cuts it at once, rather than letting uvicorn cancel
    it after its graceful timeout with a traceback."""
    engine = specllm.load(str(tiny_models.target), n_ctx=CTX, n_threads=1)
    srv = Server(engine)
    logger, lines = logging.getLogger("uvicorn.error"), LogLines()  # after uvicorn has set up its logging
    logger.addHandler(lines)
    srv.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # inherited by its connections: fills at once
    try:
        client = _stream_not_read(srv)
        deadline = time.monotonic() + 10  # never read: the server's writes back up
        while not any(c.flow.write_paused for c in srv.uvicorn.server_state.connections):
            assert time.monotonic() < deadline, "the response never waited for room"
            time.sleep(0.01)
        start = time.monotonic()
        srv.uvicorn.handle_exit(signal.SIGINT, None)  # as Ctrl-C does
        srv.thread.join(10)
        assert time.monotonic() - start < 3 and not srv.thread.is_alive()
        assert not [line for line in lines.lines if "Exception" in line or "Cancel" in line], lines.lines
        client.close()
    finally:
        srv.stop()
        engine.close()
        logger.removeHandler(lines)


def test_a_stream_its_client_stops_reading_is_cut_and_frees_the_engine(tiny_models):
    """The stream runs only a few steps ahead of its client (AHEAD): a client that stops reading
    (a suspended process, a pager) would hold the engine, and every request after it, for good."""
    engine = specllm.load(str(tiny_models.target), n_ctx=CTX, n_threads=1)
    srv = Server(engine, read_seconds=1.0)
    srv.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # inherited by its connections: fills at once
    try:
        stalled = _stream_not_read(srv)
        deadline = time.monotonic() + 10
        while not srv.get("/health")["busy"]:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        answer = srv.client().completions.create(model="x", prompt="hi", max_tokens=2, timeout=10)
        assert answer.usage.completion_tokens == 2  # served once the stalled stream was cut
        stalled.close()
    finally:
        srv.stop()
        engine.close()


def _stream_not_read(srv: Server) -> socket.socket:
    """A long streamed request whose client reads nothing: the server's writes back up."""
    host, port = urlsplit(srv.url).netloc.split(":")
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.connect((host, int(port)))
    body = json.dumps(
        {"prompt": "def f(x):", "max_tokens": CTX - 16, "stream": True, "specllm_steps": True, "drafter": "none"}
    ).encode()
    client.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body) + body
    )
    return client


def test_a_client_that_leaves_during_its_body_gets_one_log_line(tiny_models):
    """Closed mid-body, or right after it (a half-close, which uvicorn takes for a client gone):
    one access line, no traceback, and the server goes on."""
    engine = specllm.load(str(tiny_models.target), n_ctx=CTX, n_threads=1)
    srv = Server(engine)
    errors, served = logging.getLogger("uvicorn.error"), logging.getLogger("specllm.serve")
    lines, log = LogLines(), LogLines()
    errors.addHandler(lines)  # after uvicorn has set up its logging
    served.addHandler(log)
    served.setLevel(logging.INFO)
    host, port = urlsplit(srv.url).netloc.split(":")
    body = b'{"prompt": "def f(x):", "max_tokens": 2}'
    clients = []
    try:
        for promised in (len(body) + 10, len(body)):  # closed mid-body; half-closed after it
            client = socket.create_connection((host, int(port)), timeout=10)
            clients.append(client)
            client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % promised + body)
            client.shutdown(socket.SHUT_WR)
        # The half-closed one is heard of as gone before its body is read, or, when the server
        # reads its body first, while it waits for its turn: either way nothing is generated.
        gone = wait_for_line(log.lines, "nothing generated", 2)
        assert len(gone) == 2 and all(" 499 · " in line for line in gone), log.lines
        assert srv.client().completions.create(model="x", prompt="hi", max_tokens=2).usage.completion_tokens == 2
        assert not [line for line in lines.lines if "Exception" in line], lines.lines
    finally:
        for client in clients:
            client.close()
        srv.stop()
        engine.close()
        errors.removeHandler(lines)
        served.removeHandler(log)


def test_a_closed_connection_is_not_kept(tiny_models):
    """Once a client has closed its connection, nothing of it stays: its header deadline (the
    next request's, set when a response completes) once held every connection of the last 30 s,
    thousands on a busy server."""
    engine = specllm.load(str(tiny_models.target), n_ctx=CTX, n_threads=1)
    srv = Server(engine)
    try:
        for _ in range(20):
            assert srv.get("/health")["status"] == "ok"  # a connection each, closed after its answer
        deadline = time.monotonic() + 10
        while srv.uvicorn.server_state.connections:  # the server sees them closed
            assert time.monotonic() < deadline
            time.sleep(0.01)
        gc.collect()
        kept = [o for o in gc.get_objects() if type(o).__qualname__ == "_protocol.<locals>.Protocol"]
        assert not kept
    finally:
        srv.stop()
        engine.close()
