"""What thousands of requests found: what a connection, a request or a client that leaves must not
leave behind or slow down. Real llama.cpp on the tiny models; each test counts or reads state, not
time."""

import asyncio
import json
import logging
import socket
import struct
import threading
import time
from urllib.parse import urlsplit

import pytest
from serving import CTX, LogLines, Server

import specllm
from specllm.serve import server
from specllm.serve.server import AHEAD


@pytest.fixture(scope="module")
def srv(tiny_models):
    engine = specllm.load(str(tiny_models.target), n_ctx=CTX, n_threads=1)
    s = Server(engine)
    yield s
    s.stop()
    engine.close()


def _connect(srv: Server) -> socket.socket:
    host, port = urlsplit(srv.url).netloc.split(":")
    return socket.create_connection((host, int(port)), timeout=30)


def test_responses_are_written_without_nagles_delay(srv):
    """A response goes out in several writes (headers, body, a stream's events). With Nagle's
    algorithm on, each write after the first waited for the client's delayed ACK: every request
    on a kept-alive connection (the openai client's pool) took 40 ms more, a /health included."""
    client = _connect(srv)
    try:
        client.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert client.recv(65536).startswith(b"HTTP/1.1 200")
        [ours] = [
            c.transport.get_extra_info("socket")
            for c in srv.uvicorn.server_state.connections
            if c.transport.get_extra_info("peername") == client.getsockname()
        ]
        assert ours.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        client.close()


def _worker_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("AnyIO worker")}


def test_requests_start_no_threads_of_their_own(srv):
    """The API key's check was a plain function, which FastAPI runs on a thread pool's thread for
    every request: a burst of requests left up to 40 more threads in the process."""
    before = _worker_threads()
    answers = []
    clients = [threading.Thread(target=lambda: answers.append(srv.get("/health"))) for _ in range(8)]
    for client in clients:
        client.start()
    for client in clients:
        client.join()
    status, _ = srv.post("/v1/completions", b'{"prompt": "hi", "max_tokens": 2}')
    assert status == 200 and len(answers) == 8
    assert _worker_threads() <= before


def test_a_stream_cut_off_by_its_client_writes_no_warning(srv, monkeypatch):
    """A response that lags behind the engine (a busy event loop) has several steps queued, and
    wrote them all in one go: a client gone meanwhile (a reset) was seen only after that burst, and
    asyncio wrote "socket.send() raised exception." in the server's log for every write past the
    fifth (dozens of such lines in 20,000 requests on two cores)."""
    go, events = threading.Event(), server.stream

    async def lagging(*args, **kwargs):  # after its first event the rest queue up, then the loop is busy
        job, n = args[2], 0
        async for event in events(*args, **kwargs):
            n += 1
            if n == 2:
                while not job.generation.finished:
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.1)  # its last steps and result reach the queue
                go.wait(30)  # the loop is held up while the client goes
            yield event

    monkeypatch.setattr(server, "stream", lagging)
    warnings = LogLines()
    logging.getLogger("asyncio").addHandler(warnings)
    client = _connect(srv)
    try:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close() resets
        body = json.dumps({"prompt": "def f(x):", "max_tokens": AHEAD, "stream": True, "drafter": "none"}).encode()
        client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        while b"data: " not in client.recv(65536):
            pass
        time.sleep(0.5)  # the steps have queued up and the loop is held
        client.close()
        time.sleep(0.2)  # the reset arrives
        go.set()
        assert srv.client().completions.create(model="x", prompt="hi", max_tokens=2).usage.completion_tokens == 2
        assert not [line for line in warnings.lines if "socket.send" in line]
    finally:
        go.set()
        client.close()
        logging.getLogger("asyncio").removeHandler(warnings)
