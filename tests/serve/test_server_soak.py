"""What thousands of requests found: what a connection, a request or a client that leaves must not
leave behind or slow down. Real llama.cpp on the tiny models; each test counts or reads state, not
time."""

import socket
import threading
from urllib.parse import urlsplit

import pytest
from serving import CTX, Server

import specllm


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
