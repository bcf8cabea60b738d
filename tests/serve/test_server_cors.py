"""`serve --cors ORIGIN`: web pages of the origins named may call the API from a browser (a
preflight answered without the key, every answer, errors and streams included, readable by the
page); other origins, and a server started without it, send no CORS header. Bad origins are
refused at startup; `*` without a key is warned of."""

import http.client
import json
import subprocess
import sys
from urllib.parse import urlsplit

import pytest
from serving import CTX, Server

import specllm
from specllm.serve.server import ServeSettings, exposure_warning, listen

PAGE = "http://localhost:3000"
CHAT = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4, "temperature": 0}
ALLOW_ORIGIN = "access-control-allow-origin"


@pytest.fixture(scope="module")
def engine(tiny_models):
    engine = specllm.load(str(tiny_models.target), n_ctx=CTX, n_threads=1)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def srv(engine):
    s = Server(engine, api_key="k", cors_origins=(PAGE + "/",))  # a trailing slash is taken off
    yield s
    s.stop()


def request(srv, method: str, path: str, headers: dict, body: dict | None = None):
    """(status, headers with lower-case names, body as text)."""
    conn = http.client.HTTPConnection(urlsplit(srv.url).netloc, timeout=60)
    conn.request(method, path, json.dumps(body) if body is not None else None, headers)
    response = conn.getresponse()
    answer = response.status, {k.lower(): v for k, v in response.getheaders()}, response.read().decode()
    conn.close()
    return answer


def preflight(srv, origin: str, path: str = "/v1/chat/completions"):
    headers = {
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type, x-api-key, anthropic-version",
    }
    return request(srv, "OPTIONS", path, headers)


def test_a_pages_preflight_is_answered_without_the_key(srv):
    status, headers, _ = preflight(srv, PAGE)
    assert status == 200
    assert headers[ALLOW_ORIGIN] == PAGE
    assert "POST" in headers["access-control-allow-methods"]
    allowed = {h.strip().lower() for h in headers["access-control-allow-headers"].split(",")}
    assert {"authorization", "content-type", "x-api-key", "anthropic-version"} <= allowed


def test_every_answer_to_the_page_is_readable_by_it(srv):
    """A reply, a stream, and a refusal (the key missing): each carries the page's origin, so the
    page can read the error too."""
    asked = {"Origin": PAGE, "Content-Type": "application/json", "Authorization": "Bearer k"}
    status, headers, body = request(srv, "POST", "/v1/chat/completions", asked, CHAT)
    assert (status, headers.get(ALLOW_ORIGIN)) == (200, PAGE), body
    assert json.loads(body)["choices"][0]["message"]["content"] is not None
    status, headers, body = request(srv, "POST", "/v1/chat/completions", asked, CHAT | {"stream": True})
    assert (status, headers.get(ALLOW_ORIGIN)) == (200, PAGE) and body.rstrip().endswith("data: [DONE]")
    status, headers, body = request(srv, "GET", "/v1/models", {"Origin": PAGE})
    assert (status, headers.get(ALLOW_ORIGIN)) == (401, PAGE)
    assert json.loads(body)["error"]["code"] == "invalid_api_key"


def test_another_origin_gets_no_cors_header(srv):
    status, headers, _ = preflight(srv, "http://evil.example")
    assert status == 400 and ALLOW_ORIGIN not in headers
    asked = {"Origin": "http://evil.example", "Authorization": "Bearer k"}
    status, headers, _ = request(srv, "GET", "/v1/models", asked)
    assert status == 200 and ALLOW_ORIGIN not in headers


def test_without_cors_no_page_is_let_in(engine):
    plain = Server(engine)
    try:
        status, headers, _ = preflight(plain, PAGE)
        assert status == 405 and ALLOW_ORIGIN not in headers
        status, headers, _ = request(plain, "GET", "/v1/models", {"Origin": PAGE})
        assert status == 200 and ALLOW_ORIGIN not in headers
    finally:
        plain.stop()


def test_any_origin(engine):
    anyone = Server(engine, cors_origins=("*",))
    try:
        assert preflight(anyone, "http://elsewhere:5173")[1][ALLOW_ORIGIN] == "*"
        status, headers, _ = request(anyone, "GET", "/v1/models", {"Origin": "http://elsewhere:5173"})
        assert (status, headers[ALLOW_ORIGIN]) == (200, "*")
    finally:
        anyone.stop()


@pytest.mark.parametrize("origin", ["localhost:3000", "http://localhost:3000/chat", "ftp://host", "", "http://"])
def test_an_origin_no_browser_sends_is_refused(origin):
    with pytest.raises(specllm.SpecllmError, match="give an origin as a browser sends it"):
        ServeSettings(model="m", cors_origins=(origin,))


def test_serve_refuses_a_bad_origin_in_one_line_before_loading(tiny_models):
    args = ["serve", "--target", str(tiny_models.target), "--cors", "localhost:3000", "--port", "0"]
    done = subprocess.run([sys.executable, "-m", "specllm", *args], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        "error: --cors 'localhost:3000': give an origin as a browser sends it, scheme://host[:port] "
        "(http://localhost:3000), or * for any page"
    ]


def test_any_page_without_a_key_is_warned_of():
    """A loopback server is safe from other machines, but not from the pages its user opens."""
    sock = listen("127.0.0.1", 0)
    try:
        warning = exposure_warning(sock, ServeSettings(model="m", cors_origins=("*",)))
        assert warning is not None and warning.startswith("warning: --cors * lets any web page")
        assert exposure_warning(sock, ServeSettings(model="m", cors_origins=("*",), api_key="k")) is None
        assert exposure_warning(sock, ServeSettings(model="m", cors_origins=(PAGE,))) is None
    finally:
        sock.close()
