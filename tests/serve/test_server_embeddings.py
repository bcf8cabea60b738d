"""/v1/embeddings on a tiny embedding model (mean pooling) beside a tiny target: embeddings against
llama.cpp's own, normalised as llama-server does; every shape of `input`; base64; the request's
model named; truncate; the errors; the API key, the body limit and the waiting limit; no wait
behind a generation under way. On a tiny BERT (bge's shape): texts read [CLS] ... [SEP], batches,
and its 512 positions."""

import base64
import json
import socket
import threading
import time
import warnings
from urllib.parse import urlsplit

import llama_cpp
import numpy as np
import pytest
import tiny_models as tm
from embedding import reference
from serving import CTX, Server, hold, serve_log, wait_for_line

import specllm
from specllm.llama.embeddings import open_embedding_model
from specllm.llama.options import ModelOptions
from specllm.serve.embeddings import SHAPES, normalized

EMBEDDING_CTX = 512
TEXTS = ["def total(values): return sum(values)", "KV caches, explained", "é"]
PROMPT = "def fib(n):"
TOO_LONG = " ".join(["x"] * EMBEDDING_CTX)  # BOS and 512 tokens
FITS = " ".join(["x"] * (EMBEDDING_CTX - 1))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("embeddings")
    engine = specllm.load(str(tm.write_model(d / "target.gguf", seed=0)), n_ctx=CTX, n_threads=1)
    path = tm.write_model(d / "embed.gguf", seed=5, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN)
    embedder = open_embedding_model(path, ModelOptions(n_ctx=EMBEDDING_CTX, n_threads=1))
    yield engine, embedder
    embedder.close()
    engine.close()


@pytest.fixture(scope="module")
def srv(models):
    s = Server(*models)
    yield s
    s.stop()


def embed(srv, body: dict, headers=None) -> tuple[int, dict]:
    return srv.post("/v1/embeddings", json.dumps(body).encode(), headers)


def vectors(data: dict) -> list[np.ndarray]:
    assert [e["index"] for e in data["data"]] == list(range(len(data["data"])))
    return [np.array(e["embedding"], dtype=np.float32) for e in data["data"]]


def test_an_embedding_is_llama_cpps_own_normalised(srv, models):
    """As llama-server: the pooled embedding scaled to length 1 (embd_normalize 2, its default),
    or as llama.cpp gives it with embd_normalize -1, bit for bit."""
    embedder = models[1]
    tokens = embedder.tokenize(TEXTS[0])
    raw = reference(embedder.path, tokens, EMBEDDING_CTX)
    status, data = embed(srv, {"input": TEXTS[0], "model": "anything"})
    assert status == 200, data
    assert data["object"] == "list" and data["model"] == "anything"
    assert data["data"][0]["object"] == "embedding"
    assert data["usage"] == {"prompt_tokens": len(tokens), "total_tokens": len(tokens)}
    [got] = vectors(data)
    assert abs(np.linalg.norm(got.astype(np.float64)) - 1) < 1e-6
    np.testing.assert_allclose(got, raw / np.linalg.norm(raw.astype(np.float64)), rtol=0, atol=1e-7)
    status, data = embed(srv, {"input": TEXTS[0], "embd_normalize": -1})
    np.testing.assert_array_equal(vectors(data)[0], raw)
    status, data = embed(srv, {"input": TEXTS[0], "embd_normalize": 1})
    assert abs(np.abs(vectors(data)[0].astype(np.float64)).sum() - 1) < 1e-6


def test_a_p_norm_past_floats_range_scales_to_zero_without_a_warning(srv):
    """llama.cpp's sum of |x|^p in double is infinite for a large p and a value above 1, and its
    scale 0; numpy's overflow warning was two lines of the server's log."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(normalized(np.array([3.0, -0.5], dtype=np.float32), 1000), [0.0, 0.0])
    status, data = embed(srv, {"input": TEXTS[0], "embd_normalize": 1000})  # its values are under 1: no overflow
    assert (
        status == 200 and abs(np.abs(vectors(data)[0]).max() - 1) < 0.01
    )  # a large p-norm is nearly the largest value


def test_a_batch_is_each_input_alone_and_ids_are_their_text(srv, models):
    """Each input is embedded alone: a batch gives what each one gives, and token ids (a list of
    them, or lists) what the text they read as gives."""
    embedder = models[1]
    alone = [vectors(embed(srv, {"input": text})[1])[0] for text in TEXTS]
    status, data = embed(srv, {"input": TEXTS})
    assert status == 200 and len(data["data"]) == len(TEXTS)
    for got, one in zip(vectors(data), alone):
        np.testing.assert_array_equal(got, one)
    ids = [embedder.tokenize(text) for text in TEXTS]
    assert data["usage"]["prompt_tokens"] == sum(map(len, ids))
    np.testing.assert_array_equal(vectors(embed(srv, {"input": ids[0]})[1])[0], alone[0])
    for got, one in zip(vectors(embed(srv, {"input": ids})[1]), alone):
        np.testing.assert_array_equal(got, one)


def test_base64_is_the_same_floats(srv):
    """The openai client asks for base64 unless told otherwise, and decodes it."""
    floats = vectors(embed(srv, {"input": TEXTS})[1])
    status, data = embed(srv, {"input": TEXTS, "encoding_format": "base64"})
    assert status == 200 and data["data"][0]["encoding_format"] == "base64"
    for entry, expected in zip(data["data"], floats):
        np.testing.assert_array_equal(np.frombuffer(base64.b64decode(entry["embedding"]), dtype="<f4"), expected)
    answer = srv.client().embeddings.create(model="x", input=TEXTS)
    for entry, expected in zip(answer.data, floats):
        np.testing.assert_array_equal(np.array(entry.embedding, dtype=np.float32), expected)
    assert answer.usage.prompt_tokens > 0


@pytest.mark.parametrize(
    "body, param, fragment",
    [
        ({}, "input", "input: Field required"),
        ({"input": []}, "input", "input must not be empty"),
        ({"input": ["a", []]}, "input", "input[1] is empty: it has no tokens to embed"),
        ({"input": [[1, 2], []]}, "input", "input[1] is empty: it has no tokens to embed"),
        ({"input": [1, 100000]}, "input[0]", "input[0]: token id 100000 (at 1) is not in 0..568: token ids are"),
        ({"input": ["a", [7, "b", 569]]}, "input[1]", "input[1]: token id 569 (at 2) is not in 0..568"),
        ({"input": [-1]}, "input[0]", "token id -1 (at 0)"),
        ({"input": 5}, "input", f"input[0] must be {SHAPES}"),
        ({"input": None}, "input", f"input[0] must be {SHAPES}"),
        ({"input": [True]}, "input", f"input[0] must be {SHAPES}"),
        ({"input": [1, True]}, "input", f"input[0] must be {SHAPES}"),
        ({"input": [1, 2.0]}, "input", f"input[0] must be {SHAPES}"),
        ({"input": [1, [2]]}, "input", f"input[0] must be {SHAPES}"),
        ({"input": ["a", ["b", "c"]]}, "input", f"input[1] must be {SHAPES}"),  # texts alone: no input
        ({"input": [{"prompt": "a"}]}, "input", f"input[0] must be {SHAPES}"),
        ({"input": {"prompt_string": [1, None]}}, "input", f"input[0] must be {SHAPES}"),
        ({"input": {"prompt_string": "a", "multimodal_data": ["AA=="]}}, "input", "input[0]: multimodal_data: "),
        ({"input": [{"content": "a"}]}, "input", "input[0].content must be a list of content parts"),
        ({"input": [{"content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]}, "input", "image_url: "),
        (
            {"input": {"content": [{"type": "file", "file": {"file_data": "x"}}]}},
            "input",
            'content[0]: type must be "text"',
        ),
        (
            {"input": [{"content": [{"type": "text", "text": "a"}, {"text": "b"}]}]},
            "input",
            "input[0].content[1]: type",
        ),
        ({"content": ["a", []]}, "input", "input[1] is empty"),
        ({"input": "x", "encoding_format": "hex"}, "encoding_format", "'float' or 'base64'"),
        ({"input": "x", "dimensions": 32}, "dimensions", "embeddings have 64, not 32"),
        ({"input": "x", "embd_normalize": -2}, "embd_normalize", "greater than or equal to -1"),
        ({"input": "x", "truncate": "yes"}, "truncate", "truncate: Input should be a valid boolean"),
        (
            {"input": TOO_LONG},
            "input",
            "input[0] is 513 tokens but the embedding model's context holds 512",
        ),
    ],
)
def test_bad_input_is_a_400_naming_its_field(srv, body, param, fragment):
    status, data = embed(srv, body)
    assert status == 400, data
    assert data["error"]["param"] == param and fragment in data["error"]["message"], data
    assert data["error"]["type"] == "invalid_request_error"


def test_too_long_an_input_says_so_as_a_prompt_does(srv):
    status, data = embed(srv, {"input": ["x", TOO_LONG]})
    assert (status, data["error"]["code"]) == (400, "context_length_exceeded")
    assert "input[1] is 513 tokens" in data["error"]["message"]
    assert embed(srv, {"input": FITS})[0] == 200


def test_the_answer_names_the_model_the_request_named(srv):
    """As llama-server: the request's `model` echoed (OpenAI's clients compare it with what they
    asked for), the server's name for its model where the request names none."""
    for asked in ("text-embedding-3-small", "", "embed.gguf"):
        status, data = embed(srv, {"input": "x", "model": asked})
        assert (status, data["model"]) == (200, asked)
    assert embed(srv, {"input": "x"})[1]["model"] == "embed.gguf"
    assert embed(srv, {"input": "x", "model": None})[1]["model"] == "embed.gguf"
    assert srv.client().embeddings.create(model="nomic-embed-text", input="x").model == "nomic-embed-text"


def test_truncate_cuts_an_input_to_the_tokens_that_fit(srv, models):
    """`truncate: true` embeds a too-long input's first 512 tokens (what those tokens, sent as ids,
    give) and counts those; inputs that fit are as they were; without it, a 400 (above)."""
    embedder = models[1]
    cut = embedder.tokenize(TOO_LONG)[:EMBEDDING_CTX]
    status, data = embed(srv, {"input": [TOO_LONG, TEXTS[0]], "truncate": True})
    assert status == 200, data
    assert data["usage"]["prompt_tokens"] == EMBEDDING_CTX + len(embedder.tokenize(TEXTS[0]))
    [expected] = vectors(embed(srv, {"input": cut})[1])
    [fits] = vectors(embed(srv, {"input": TEXTS[0]})[1])
    np.testing.assert_array_equal(vectors(data)[0], expected)
    np.testing.assert_array_equal(vectors(data)[1], fits)
    assert embed(srv, {"input": TOO_LONG, "truncate": False})[1]["error"]["code"] == "context_length_exceeded"


def test_truncate_null_is_not_asked(srv):
    """text-embeddings-inference's clients send `"truncate": null` for its default: an input that
    fits is embedded as without it, a too-long one refused."""
    [plain] = vectors(embed(srv, {"input": TEXTS[0]})[1])
    status, data = embed(srv, {"input": TEXTS[0], "truncate": None})
    assert status == 200, data
    np.testing.assert_array_equal(vectors(data)[0], plain)
    assert embed(srv, {"input": TOO_LONG, "truncate": None})[1]["error"]["code"] == "context_length_exceeded"


def test_the_models_own_dimensions_are_asked_for_nothing(srv):
    assert embed(srv, {"input": "x", "dimensions": 64})[0] == 200


def test_models_lists_the_embedding_model_too(srv):
    listed = srv.get("/v1/models")["data"]
    assert [(m["id"], m["context_length"]) for m in listed] == [("tiny", CTX), ("embed.gguf", EMBEDDING_CTX)]


def test_a_server_without_an_embedding_model_says_how_to_start_one(models):
    plain = Server(models[0])
    try:
        status, data = embed(plain, {"input": "x"})
        assert [m["id"] for m in plain.get("/v1/models")["data"]] == ["tiny"]
    finally:
        plain.stop()
    assert (status, data["error"]["code"]) == (404, "model_not_found")
    assert "start specllm serve with --embedding-model MODEL" in data["error"]["message"]


def test_the_api_key_and_the_body_limit_hold(models):
    small = Server(*models, api_key="s3cret", max_body_bytes=1000)
    key = {"Authorization": "Bearer s3cret"}
    try:
        assert embed(small, {"input": "x"})[0] == 401
        assert embed(small, {"input": "x"}, key)[0] == 200
        status, data = embed(small, {"input": "x" * 2000}, key)
        assert (status, data["error"]["code"]) == (413, "request_too_large")
    finally:
        small.stop()


def test_more_waiting_than_the_limit_get_a_503(models):
    """The embedding model's thread busy (a batch under way), one request may wait, the next is
    told at once."""
    busy = Server(*models, max_waiting=1)
    gate = threading.Event()
    busy.worker.embedding.thread.submit(gate.wait, 60)
    waiting = threading.Thread(target=embed, args=(busy, {"input": "x"}))
    try:
        waiting.start()
        while busy.worker.embedding.waiting < 1:
            time.sleep(0.01)
        status, data = embed(busy, {"input": "x"})
        assert (status, data["error"]["code"]) == (503, "server_busy")
    finally:
        gate.set()
        waiting.join(60)
        busy.stop()


def test_a_client_that_leaves_before_its_turn_gets_nothing_embedded(models):
    """A batch whose client has gone (its timeout, say) is not made: the log says 499."""
    srv = Server(*models)
    gate = threading.Event()
    srv.worker.embedding.thread.submit(gate.wait, 60)
    body = json.dumps({"input": TEXTS}).encode()
    try:
        with serve_log() as log:
            url = urlsplit(srv.url)
            client = socket.create_connection((url.hostname, url.port))
            client.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
            client.sendall(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            while srv.worker.embedding.waiting < 1:
                time.sleep(0.01)
            client.close()
            time.sleep(0.2)  # the server hears of it
            gate.set()
            [line] = wait_for_line(log, "POST /v1/embeddings", 1)
    finally:
        gate.set()
        srv.stop()
    assert " 499 · the client went away before its embeddings were made" in line


def test_no_wait_behind_a_streamed_generation_nor_harm_to_it(srv, models, monkeypatch):
    """A streamed generation under way holds the engine's thread (here after its first step, as a
    long one would): embeddings are answered meanwhile, and the generation goes on to the text it
    gives alone."""
    engine = models[0]
    request = {"model": "x", "prompt": PROMPT, "max_tokens": 40, "temperature": 0, "drafter": "none"}
    alone = srv.post("/v1/completions", json.dumps(request).encode())[1]["choices"][0]["text"]
    release = hold(engine, monkeypatch, 40)
    events: list = []
    streaming = threading.Thread(
        target=lambda: events.extend(srv.post_events("/v1/completions", request | {"stream": True}))
    )
    streaming.start()
    try:
        while not srv.worker.lock.locked():
            time.sleep(0.01)
        started = time.monotonic()
        assert embed(srv, {"input": TEXTS * 4})[0] == 200
        assert time.monotonic() - started < 10
        assert srv.worker.lock.locked()  # the generation was under way all along
    finally:
        release.set()
        streaming.join(60)
    assert events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == alone


def test_a_model_whose_embedding_is_nan_is_a_500_in_the_errors_own_words(models, tmp_path):
    """A broken embedding model is the server's fault: an OpenAI-shaped 500 (its NaN could not be
    written as JSON: Starlette's plain-text 500 and its traceback), and the server answers on."""
    source = tm.write_model(tmp_path / "embed.gguf", seed=5, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN)
    broken = open_embedding_model(
        tm.with_nan_in(source, tmp_path / "broken.gguf", "output_norm.weight"), ModelOptions(n_ctx=256, n_threads=1)
    )
    srv = Server(models[0], broken)
    try:
        with serve_log() as log:
            status, data = embed(srv, {"input": TEXTS})
            assert embed(srv, {"input": TEXTS[0]})[0] == 500
        assert status == 500 and data["error"]["type"] == "server_error", data
        expected = "embedding failed: broken.gguf gave an embedding that is not finite numbers (NaN or infinite)"
        assert data["error"]["message"] == expected and str(tmp_path) not in str(log)
        assert "POST /v1/embeddings 500 · embedding failed" in log[0] and len(log) == 2
    finally:
        srv.stop()
        broken.close()


# --- a BERT (bge's shape: WordPiece, [CLS] ... [SEP], CLS pooling, 512 positions) ---

BERT_TEXTS = ["Hello, World", "the lazy dog", ""]  # "": [CLS] [SEP], which llama-server embeds too


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    path = tm.write_model(
        tmp_path_factory.mktemp("bert") / "bge.gguf", arch="bert", seed=5, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_CLS
    )
    embedder = open_embedding_model(path, ModelOptions(n_ctx=4096, n_threads=1))
    yield embedder
    embedder.close()


@pytest.fixture(scope="module")
def bert_srv(models, bert):
    s = Server(models[0], bert)
    yield s
    s.stop()


def test_a_bert_reads_cls_text_sep_and_gives_llama_cpps_embedding(bert_srv, bert):
    """As llama-server reads a text for a BERT (add_special: [CLS] before it, [SEP] after it), the
    pooled embedding llama.cpp gives those tokens, normalised or not."""
    words = [tm.BERT_VOCAB.index("\u2581" + w) for w in ("hello", ",", "world")]
    tokens = [tm.CLS_ID, *words, tm.SEP_ID]
    raw = reference(bert.path, tokens, bert.n_ctx)
    status, data = embed(bert_srv, {"input": BERT_TEXTS[0], "embd_normalize": -1})
    assert status == 200 and data["usage"]["prompt_tokens"] == len(tokens), data
    np.testing.assert_array_equal(vectors(data)[0], raw)
    [normalised] = vectors(embed(bert_srv, {"input": BERT_TEXTS[0]})[1])
    np.testing.assert_allclose(normalised, raw / np.linalg.norm(raw.astype(np.float64)), rtol=0, atol=1e-7)
    np.testing.assert_array_equal(vectors(embed(bert_srv, {"input": tokens})[1])[0], normalised)


def test_a_bert_batch_is_each_input_alone(bert_srv):
    alone = [vectors(embed(bert_srv, {"input": text})[1])[0] for text in BERT_TEXTS]
    status, data = embed(bert_srv, {"input": BERT_TEXTS})
    assert status == 200 and data["usage"]["prompt_tokens"] == 5 + 5 + 2
    for got, one in zip(vectors(data), alone):
        np.testing.assert_array_equal(got, one)


def test_a_bert_takes_what_its_positions_hold(bert_srv):
    """512 tokens, [CLS] and [SEP] among them: one more is refused as a prompt too long is."""
    assert embed(bert_srv, {"input": " ".join(["dog"] * 510)})[0] == 200
    status, data = embed(bert_srv, {"input": ["dog", " ".join(["dog"] * 511)]})
    assert (status, data["error"]["code"]) == (400, "context_length_exceeded")
    assert "input[1] is 513 tokens but the embedding model's context holds 512" in data["error"]["message"]
    assert [(m["id"], m["context_length"]) for m in bert_srv.get("/v1/models")["data"]][1] == ("bge.gguf", 512)


def test_a_bert_of_128_positions_refuses_a_longer_text_and_answers_on(models, tmp_path):
    """Its context is llama.cpp's smallest, 256 tokens, but a text may have 128: a longer one read
    past its position embeddings, and llama.cpp aborted the server."""
    mean = llama_cpp.LLAMA_POOLING_TYPE_MEAN
    path = tm.write_model(tmp_path / "short.gguf", arch="bert", seed=5, pooling_type=mean, n_ctx_train=128)
    embedder = open_embedding_model(path, ModelOptions(n_ctx=4096, n_threads=1))
    srv = Server(models[0], embedder)
    try:
        assert srv.get("/v1/models")["data"][1]["context_length"] == 128
        status, data = embed(srv, {"input": " ".join(["dog"] * 127)})
        assert (status, data["error"]["code"]) == (400, "context_length_exceeded")
        assert "input[0] is 129 tokens but the embedding model's context holds 128" in data["error"]["message"]
        assert embed(srv, {"input": " ".join(["dog"] * 126)})[0] == 200
    finally:
        srv.stop()
        embedder.close()


def test_truncate_keeps_the_token_that_closes_a_text(models, bert, bert_srv, tmp_path):
    """As text-embeddings-inference cuts a text: its first tokens that fit, then the end token
    the tokenizer adds after a text, which the embedding reads: a BERT's [SEP], and the EOS that
    last-token pooling (Qwen3-Embedding's) takes as the whole text's. Texts and ids mixed are cut
    as they are."""
    long = " ".join(["dog"] * 600)
    dog = tm.BERT_VOCAB.index("\u2581dog")
    closed = [tm.CLS_ID] + [dog] * 510 + [tm.SEP_ID]
    status, data = embed(bert_srv, {"input": long, "truncate": True})
    assert status == 200, data
    assert data["usage"]["prompt_tokens"] == 512
    np.testing.assert_array_equal(vectors(data)[0], vectors(embed(bert_srv, {"input": closed})[1])[0])
    mixed = vectors(embed(bert_srv, {"input": [long, tm.SEP_ID], "truncate": True})[1])[0]
    np.testing.assert_array_equal(mixed, vectors(embed(bert_srv, {"input": closed[:-1] + [dog]})[1])[0])

    last = llama_cpp.LLAMA_POOLING_TYPE_LAST
    path = tm.write_model(tmp_path / "last.gguf", seed=5, pooling_type=last, add_eos=True, n_ctx_train=256)
    embedder = open_embedding_model(path, ModelOptions(n_ctx=256, n_threads=1))
    srv = Server(models[0], embedder)
    try:
        tokens = embedder.tokenize(" ".join(["x"] * 300))
        assert tokens[-1] == embedder.eos and len(tokens) > 256
        status, data = embed(srv, {"input": " ".join(["x"] * 300), "truncate": True})
        assert status == 200, data
        expected = vectors(embed(srv, {"input": tokens[:255] + [embedder.eos]})[1])[0]
        np.testing.assert_array_equal(vectors(data)[0], expected)
        assert not np.array_equal(expected, vectors(embed(srv, {"input": tokens[:256]})[1])[0])
    finally:
        srv.stop()
        embedder.close()


# --- llama-server's other shapes of input: texts and ids mixed, objects; its own endpoint ---


def test_texts_and_ids_mixed_read_as_llama_server_reads_them(bert_srv):
    """A list holding a token id is one input (llama-server's tokenize_mixed): its first element,
    if a text, is read with [CLS] and [SEP], any later text without, ids as they are. So [CLS]
    "hello, world" [SEP] is the text alone, bit for bit; a list without ids is a batch."""
    alone = vectors(embed(bert_srv, {"input": BERT_TEXTS[0]})[1])[0]
    words = [tm.BERT_VOCAB.index("\u2581" + w) for w in ("hello", ",", "world")]
    status, data = embed(bert_srv, {"input": [tm.CLS_ID, "Hello, World", tm.SEP_ID]})
    assert status == 200 and data["usage"]["prompt_tokens"] == 5, data
    np.testing.assert_array_equal(vectors(data)[0], alone)
    # a text first gets [CLS] and [SEP] of its own: [CLS] hello [SEP] , world [SEP]
    status, data = embed(bert_srv, {"input": ["hello", words[1], "world", tm.SEP_ID]})
    expected = [tm.CLS_ID, words[0], tm.SEP_ID, words[1], words[2], tm.SEP_ID]
    np.testing.assert_array_equal(vectors(data)[0], vectors(embed(bert_srv, {"input": expected})[1])[0])
    assert data["usage"]["prompt_tokens"] == 6
    # a batch of a text, ids, and the two mixed
    batch = ["the lazy dog", words, [tm.CLS_ID, "Hello, World", tm.SEP_ID]]
    status, data = embed(bert_srv, {"input": batch})
    assert status == 200 and len(data["data"]) == 3, data
    np.testing.assert_array_equal(vectors(data)[2], alone)
    np.testing.assert_array_equal(vectors(data)[1], vectors(embed(bert_srv, {"input": words})[1])[0])


def test_prompt_string_and_content_parts_are_their_text(bert_srv):
    """llama-server's {"prompt_string": ...} (a text, or texts and ids) and a chat message's
    {"content": [parts]} (their texts joined) are the text they hold."""
    alone = vectors(embed(bert_srv, {"input": BERT_TEXTS[0]})[1])[0]
    parts = [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "World"}]
    inputs = [{"prompt_string": "Hello, World"}, {"prompt_string": [tm.CLS_ID, "Hello, World", tm.SEP_ID]}]
    status, data = embed(bert_srv, {"input": [*inputs, {"content": parts}]})
    assert status == 200 and data["usage"]["prompt_tokens"] == 15, data
    for got in vectors(data):
        np.testing.assert_array_equal(got, alone)
    np.testing.assert_array_equal(vectors(embed(bert_srv, {"input": {"content": parts}})[1])[0], alone)


@pytest.mark.parametrize("path", ["/embedding", "/embeddings"])
def test_llama_servers_own_endpoint_answers_in_its_own_shape(bert_srv, path):
    """/embedding and /embeddings answer as llama-server does: a list of each input's index and
    its pooled embedding in a list, floats whatever encoding_format says; `content` in place of
    `input` asks /v1/embeddings for that shape too."""
    floats = vectors(embed(bert_srv, {"input": BERT_TEXTS})[1])
    for status, data in (
        bert_srv.post(path, json.dumps({"content": BERT_TEXTS}).encode()),
        bert_srv.post(path, json.dumps({"input": BERT_TEXTS, "encoding_format": "base64"}).encode()),
        embed(bert_srv, {"content": BERT_TEXTS}),
    ):
        assert status == 200 and [entry["index"] for entry in data] == [0, 1, 2], data
        for entry, expected in zip(data, floats):
            [got] = entry["embedding"]
            np.testing.assert_array_equal(np.array(got, dtype=np.float32), expected)
    status, data = bert_srv.post(path, json.dumps({"content": []}).encode())
    assert (status, data["error"]["message"]) == (400, "input must not be empty")


def test_llama_servers_endpoint_without_an_embedding_model_says_how_to_start_one(models):
    plain = Server(models[0])
    try:
        status, data = plain.post("/embedding", json.dumps({"content": "x"}).encode())
    finally:
        plain.stop()
    assert (status, data["error"]["code"]) == (404, "model_not_found")
