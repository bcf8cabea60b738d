"""`specllm serve` when the machine runs short: more clients than it may open files for."""

import http.client
import json
import re
import resource
import socket
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="resource limits are POSIX's")

OPEN_FILES = 64  # the server's limit: well above what it needs alone, well below the clients below


def _few_open_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))


def _complete(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request(
        "POST", "/v1/completions", json.dumps({"prompt": "hi", "max_tokens": 2}), {"Content-Type": "application/json"}
    )
    status = conn.getresponse().status
    conn.close()
    return status


def test_more_clients_than_open_files_get_one_line_and_the_server_serves_again(tiny_models, tmp_path):
    """Clients beyond `ulimit -n` wait in the listen queue: one warning line, not asyncio's
    traceback for every retry of accept() (thousands a second), and once they close the server
    answers again."""
    log = tmp_path / "serve.log"
    args = ["serve", "--target", tiny_models.target, "--drafter", "none", "--threads", "1", "--port", "0"]
    with log.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "specllm", *map(str, args)], stderr=stderr, preexec_fn=_few_open_files
        )
    try:
        deadline = time.monotonic() + 60
        while not (started := re.search(r"http://127\.0\.0\.1:(\d+)", log.read_text())):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        port = int(started[1])
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(2 * OPEN_FILES)]
        time.sleep(2.5)  # asyncio tries to accept the waiting ones again each second
        for client in clients:
            client.close()
        assert _complete(port) == 200
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
    text = log.read_text()
    assert "Traceback" not in text
    warnings = [line for line in text.splitlines() if "cannot accept a connection" in line]
    assert len(warnings) == 1, text[-2000:]
    assert f"Too many open files (the limit is {OPEN_FILES} open files: `ulimit -n` raises it)" in warnings[0]
