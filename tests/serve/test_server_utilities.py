"""llama-server's utilities, /tokenize, /detokenize, /apply-template and /props, on a tiny model
with an SPM vocabulary (BOS, control tokens, byte tokens) and Qwen2.5's chat template with tools:
tokens compared with the engine's own, prompts with what the chat endpoint generates from."""

import http.client
import json
import threading
import time
from urllib.parse import urlsplit

import pytest
import tiny_models as tm
import tool_templates
from serving import ASK, CTX, GET_WEATHER, NAMED, Server, hold

import specllm

TEXT = "def total(values):\n    return é"  # é: two byte tokens, neither a character alone
MARKUP = "<|im_start|>user\nhi<|im_end|>"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = tmp_path_factory.mktemp("utilities") / "code.gguf"
    tm.write_model(path, seed=0, vocab="code", chat_template=tool_templates.QWEN25)
    engine = specllm.load(str(path), n_ctx=CTX, n_threads=1)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def srv(engine):
    s = Server(engine)
    yield s
    s.stop()


def post(srv, path: str, body) -> tuple[int, dict]:
    return srv.post(path, json.dumps(body).encode())


def request(srv, method: str, path: str, body: bytes | None = None, headers=None, timeout=60) -> tuple[int, dict]:
    conn = http.client.HTTPConnection(urlsplit(srv.url).netloc, timeout=timeout)
    conn.request(method, path, body, headers or {})
    response = conn.getresponse()
    status, data = response.status, json.loads(response.read())
    conn.close()
    return status, data


@pytest.mark.parametrize("text", [TEXT, MARKUP])
def test_tokenize_gives_the_engines_tokens(srv, engine, text):
    """llama-server's defaults (add_special false, parse_special true) and each the other way."""
    target = engine.target
    assert post(srv, "/tokenize", {"content": text}) == (200, {"tokens": target.tokenize(text, add_special=False)})
    status, data = post(srv, "/tokenize", {"content": text, "add_special": True})
    assert (status, data["tokens"]) == (200, engine.prompt_tokens(text))
    assert data["tokens"][0] == target.bos
    status, data = post(srv, "/tokenize", {"content": text, "parse_special": False})
    assert data["tokens"] == target.tokenize(text, add_special=False, parse_special=False)
    assert (3 in data["tokens"]) == False  # noqa: E712  <|im_start|> as text, not the control token


def test_markup_is_one_control_token_unless_parse_special_is_false(srv, engine):
    assert post(srv, "/tokenize", {"content": "<|im_start|>"})[1]["tokens"] == [3]
    assert len(post(srv, "/tokenize", {"content": "<|im_start|>", "parse_special": False})[1]["tokens"]) > 1


def test_tokenize_with_pieces_as_text_or_bytes(srv, engine):
    """A piece that is not UTF-8 (a byte of é) is its list of bytes, as llama-server gives it; a
    control token is its text."""
    status, data = post(srv, "/tokenize", {"content": "<|im_start|>" + TEXT, "with_pieces": True})
    tokens = engine.target.tokenize("<|im_start|>" + TEXT, add_special=False)
    assert status == 200 and [t["id"] for t in data["tokens"]] == tokens
    pieces = [t["piece"] for t in data["tokens"]]
    assert pieces[0] == "<|im_start|>"
    assert pieces[-2:] == [[0xC3], [0xA9]]  # é's two bytes
    assert all(isinstance(p, str) for p in pieces[:-2])
    assert "".join(pieces[1:-2]) == engine.target.detokenize(tokens[1:-2]).decode()


def test_tokenize_takes_text_and_token_ids_mixed(srv, engine):
    """As llama-server's tokenize_mixed: ids kept, and only a first text gets the BOS."""
    target = engine.target
    body = {"content": ["def", 4, " total"], "add_special": True}
    text = [target.tokenize(part, add_special=False) for part in ("def", " total")]
    expected = [target.bos, *text[0], 4, *text[1]]
    assert post(srv, "/tokenize", body)[1]["tokens"] == expected
    ids_first = {"content": [4, "def"], "add_special": True}
    assert post(srv, "/tokenize", ids_first)[1]["tokens"] == [4, *target.tokenize("def", add_special=False)]
    assert post(srv, "/tokenize", {}) == (200, {"tokens": []})  # no content: none, as llama-server


def test_detokenize_writes_the_tokens_text_with_control_tokens(srv, engine):
    target = engine.target
    tokens = target.tokenize(MARKUP + TEXT, add_special=True)
    status, data = post(srv, "/detokenize", {"tokens": tokens})
    assert status == 200
    assert data["content"] == target.detokenize(tokens, special=True).decode()
    assert data["content"].startswith("<s><|im_start|>")  # as llama-server writes them, BOS too
    plain = target.tokenize(TEXT, add_special=False)
    assert post(srv, "/detokenize", {"tokens": plain})[1]["content"] == target.detokenize(plain).decode()
    half = post(srv, "/detokenize", {"tokens": plain[:-1]})[1]["content"]  # é's first byte alone
    assert half == target.detokenize(plain[:-1]).decode(errors="replace") and half.endswith("n \ufffd")
    assert post(srv, "/detokenize", {}) == (200, {"content": ""})


CHATS = [
    {"messages": ASK},
    {"messages": ASK, "tools": [GET_WEATHER]},
    {"messages": ASK, "tools": [GET_WEATHER], "tool_choice": NAMED},  # its prompt begins the call
    {"messages": [{"role": "system", "content": "Be brief."}, *ASK], "chat_template_kwargs": {"x": 1}},
]


@pytest.mark.parametrize("chat", CHATS, ids=["plain", "tools", "named-tool", "system"])
def test_apply_template_gives_the_prompt_the_chat_endpoint_generates_from(srv, engine, chat):
    status, data = post(srv, "/apply-template", chat)
    assert status == 200
    prompt = data["prompt"]
    status, reply = post(srv, "/v1/chat/completions", chat | {"temperature": 0, "max_tokens": 1})
    assert status == 200 and len(engine.prompt_tokens(prompt)) == reply["usage"]["prompt_tokens"]
    tokenized = post(srv, "/tokenize", {"content": prompt, "add_special": True})[1]["tokens"]
    assert tokenized == engine.prompt_tokens(prompt)
    if "tool_choice" in chat:
        assert prompt.endswith('<tool_call>\n{"name": "get_weather", "arguments": ')


def test_llama_vscodes_count_of_its_agents_prompt(srv, engine):
    """llama.vscode's agent (src/llama-server.ts, applyToolsTemplate and countTextTokens): the
    prompt of its messages and tools, then its tokens without BOS; it reads their number."""
    chat = {"messages": ASK, "model": "", "tools": [GET_WEATHER], "tool_choice": "auto"}
    prompt = post(srv, "/apply-template", chat)[1]["prompt"]
    status, data = post(srv, "/tokenize", {"content": prompt, "add_special": False, "parse_special": True})
    reply = srv.client().chat.completions.create(temperature=0, max_tokens=1, **chat)
    assert status == 200 and len(data["tokens"]) == reply.usage.prompt_tokens - 1  # all but the BOS


def test_props_gives_the_context_and_templates_and_no_path(srv, engine):
    status, data = request(srv, "GET", "/props")
    assert status == 200
    assert data["default_generation_settings"]["n_ctx"] == CTX
    assert data["chat_template"] == engine.target.chat_template() == tool_templates.QWEN25
    assert data["total_slots"] == 1 and data["model_alias"] == "tiny"
    assert "model_path" not in data and str(engine.target.path.parent) not in json.dumps(data)


BAD = [
    ("/tokenize", b'{"content": 5}', "content"),
    ("/tokenize", b'{"content": "x", "add_special": "yes"}', "add_special"),
    ("/tokenize", b'{"content": ["x", 99999]}', "content"),  # an id outside the vocabulary
    ("/tokenize", b'{"content": "x"', None),  # not JSON
    ("/detokenize", b'{"tokens": [1, 99999]}', "tokens"),
    ("/detokenize", b'{"tokens": [-1]}', "tokens"),
    ("/detokenize", b'{"tokens": "1 2"}', "tokens"),
    ("/detokenize", b'{"tokens": [1.5]}', "tokens.0"),
    ("/apply-template", b'{"prompt": "x"}', "messages"),
    ("/apply-template", b'{"messages": []}', "messages"),
    ("/apply-template", b'{"messages": [{"role": "user"}]}', "messages.0"),
    ("/apply-template", b'{"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}', "tool_choice"),
]


@pytest.mark.parametrize("path,body,param", BAD)
def test_bad_input_is_an_openai_400(srv, path, body, param):
    status, data = srv.post(path, body)
    assert status == 400 and data["error"]["type"] == "invalid_request_error"
    assert data["error"]["param"] == param, data


def test_the_body_limit_and_the_api_key_hold(engine):
    small = Server(engine, api_key="s3cret", max_body_bytes=1000)
    key = {"Authorization": "Bearer s3cret"}
    try:
        for path in ("/tokenize", "/detokenize", "/apply-template"):
            assert small.post(path, b"{}")[0] == 401
        assert request(small, "GET", "/props")[0] == 401
        assert request(small, "GET", "/props", headers=key)[0] == 200
        status, data = small.post("/tokenize", json.dumps({"content": "x" * 2000}).encode(), key)
        assert (status, data["error"]["code"]) == (413, "request_too_large")
        assert small.post("/tokenize", json.dumps({"content": "x" * 500}).encode(), key)[0] == 200
    finally:
        small.stop()


def test_no_wait_behind_a_generation(srv, engine, monkeypatch):
    """A generation under way holds the engine's thread (here after its first step, as a long
    prefill would): the utilities are answered meanwhile, not after it."""
    release = hold(engine, monkeypatch, 100)
    body = {"messages": ASK, "max_tokens": 100, "temperature": 0}
    generating = threading.Thread(target=post, args=(srv, "/v1/chat/completions", body))
    generating.start()
    try:
        while not srv.worker.lock.locked():
            time.sleep(0.01)
        tokens = engine.target.tokenize(TEXT, add_special=False)
        assert request(srv, "POST", "/tokenize", json.dumps({"content": TEXT}).encode(), timeout=10)[0] == 200
        assert request(srv, "POST", "/detokenize", json.dumps({"tokens": tokens}).encode(), timeout=10)[0] == 200
        assert request(srv, "POST", "/apply-template", json.dumps({"messages": ASK}).encode(), timeout=10)[0] == 200
        assert request(srv, "GET", "/props", timeout=10)[0] == 200
        assert srv.worker.lock.locked()  # the generation was under way all along
    finally:
        release.set()
        generating.join(60)
