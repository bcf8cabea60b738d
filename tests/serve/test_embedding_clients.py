"""/v1/embeddings as real clients call it: each client's request body and headers, as its source
sends them, and its answer read as that client reads it. The bodies, from each client's code:

- the `openai` package (and LangChain, which calls it): `client.embeddings.create` adds
  `"encoding_format": "base64"` unless told a format, and decodes each embedding from it;
- Continue (its OpenAI provider, through the openai Node package 5.x): `{"model": M, "input":
  [chunks]}`, to which that package adds `"encoding_format": "base64"` and then decodes each
  embedding as a Float32Array; its older path posted `{"input": chunks, "model": M}` itself and read
  `data[i].embedding`;
- Open WebUI (its OpenAI engine for RAG): `{"input": texts, "model": M}`, a prefix field of the
  admin's naming where one is set, `Authorization: Bearer KEY` even with no key, X-OpenWebUI-User-*
  headers where forwarding is on; it reads `[e["embedding"] for e in data["data"]]`;
- LangChain's OpenAIEmbeddings: by default each text as OpenAI's tokenizer's token ids (tiktoken,
  cl100k_base for a model it does not know), up to 1000 inputs a request, through the `openai`
  package; with check_embedding_ctx_length=False the texts themselves; `dimensions` if given."""

import base64
import json

import llama_cpp
import numpy as np
import openai
import pytest
import tiny_models as tm
from serving import Server

import specllm
from specllm.llama.embeddings import open_embedding_model
from specllm.llama.options import ModelOptions

TEXTS = ["def total(values): return sum(values)", "the lazy dog", "Hello, World"]
HELLO_WORLD_CL100K = [15339, 1917]  # tiktoken's cl100k_base ids of "hello world"


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    """A BERT embedding model (bge's shape) beside a tiny target."""
    d = tmp_path_factory.mktemp("clients")
    engine = specllm.load(str(tm.write_model(d / "target.gguf", seed=0)), n_ctx=512, n_threads=1)
    path = tm.write_model(d / "bge.gguf", arch="bert", seed=5, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_CLS)
    embedder = open_embedding_model(path, ModelOptions(n_ctx=512, n_threads=1))
    s = Server(engine, embedder)
    yield s
    s.stop()
    embedder.close()
    engine.close()


@pytest.fixture(scope="module")
def floats(srv) -> list[np.ndarray]:
    """Each text's embedding as a plain float request gets it."""
    status, data = srv.post("/v1/embeddings", json.dumps({"input": TEXTS}).encode())
    assert status == 200, data
    return [np.array(entry["embedding"], dtype=np.float32) for entry in data["data"]]


def create(srv, **params):
    """`client.embeddings.create(**params)` of the openai package: the body it sent, and its answer
    as it gives it to its caller (decoded from base64 where it asked for that)."""
    raw = srv.client().embeddings.with_raw_response.create(**params)
    return json.loads(raw.http_request.content), raw.parse()


def test_the_openai_package_asks_for_base64_and_reads_the_floats(srv, floats):
    sent, answer = create(srv, model="nomic-embed-text", input=TEXTS)
    assert sent == {"input": TEXTS, "model": "nomic-embed-text", "encoding_format": "base64"}
    for entry, expected in zip(answer.data, floats):
        np.testing.assert_array_equal(np.array(entry.embedding, dtype=np.float32), expected)
    assert answer.usage.prompt_tokens == answer.usage.total_tokens > 0


def test_the_openai_package_with_every_field_it_sends(srv, floats):
    """A float format asked for, the model's own dimensions, a user: the floats as they are."""
    fields = {"model": "bge", "input": TEXTS[0], "encoding_format": "float", "dimensions": 64, "user": "user-1"}
    sent, answer = create(srv, **fields)
    assert sent == fields
    np.testing.assert_array_equal(np.array(answer.data[0].embedding, dtype=np.float32), floats[0])
    with pytest.raises(openai.BadRequestError, match="embeddings have 64, not 32"):
        srv.client().embeddings.create(model="bge", input=TEXTS[0], dimensions=32)


def test_continue_through_the_openai_node_package(srv, floats):
    """The body the Node package sends for Continue's batch of chunks; each answer decoded as it
    decodes it (the base64 bytes read as a Float32Array: little-endian float32), in order."""
    body = {"model": "nomic-embed-text", "input": TEXTS, "encoding_format": "base64"}
    headers = {"Authorization": "Bearer -"}
    status, data = srv.post("/v1/embeddings", json.dumps(body).encode(), headers)
    assert status == 200, data
    decoded = [np.frombuffer(base64.b64decode(entry["embedding"]), dtype="<f4") for entry in data["data"]]
    for got, expected in zip(decoded, floats, strict=True):
        np.testing.assert_array_equal(got, expected)


def test_continues_own_request(srv, floats):
    """Continue's provider posting by itself: the floats, data[i].embedding, in order."""
    body = {"input": TEXTS, "model": "nomic-embed-text"}
    headers = {"Authorization": "Bearer -", "api-key": "-"}
    status, data = srv.post("/v1/embeddings", json.dumps(body).encode(), headers)
    assert status == 200, data
    got = [np.array(result["embedding"], dtype=np.float32) for result in data["data"]]
    for one, expected in zip(got, floats, strict=True):
        np.testing.assert_array_equal(one, expected)


def test_open_webui_with_no_key_a_prefix_field_and_user_headers(srv, floats):
    """Open WebUI's RAG batch: an empty bearer token (no key set on either side), a prefix under a
    field name of the admin's choosing (ignored, as llama-server ignores it), its user headers."""
    body = {"input": TEXTS, "model": "bge", "prefix_field": "search_document: "}
    headers = {
        "Authorization": "Bearer ",
        "X-OpenWebUI-User-Name": "Ada",
        "X-OpenWebUI-User-Id": "1",
        "X-OpenWebUI-User-Email": "ada@example.org",
        "X-OpenWebUI-User-Role": "admin",
    }
    status, data = srv.post("/v1/embeddings", json.dumps(body).encode(), headers)
    assert status == 200 and "data" in data, data
    for one, expected in zip([e["embedding"] for e in data["data"]], floats, strict=True):
        np.testing.assert_array_equal(np.array(one, dtype=np.float32), expected)


def test_langchain_by_default_sends_tiktokens_ids_and_is_told_to_send_text(srv):
    """LangChain's default request: each text as tiktoken's ids, through the openai package
    (base64). They are not this model's ids: a 400 naming the input and saying to send text (an id
    inside the vocabulary would embed other words, which no server can tell)."""
    with pytest.raises(openai.BadRequestError) as refused:
        srv.client().embeddings.create(input=[HELLO_WORLD_CL100K], model="text-embedding-ada-002")
    request = json.loads(refused.value.request.content)
    assert request == {"input": [HELLO_WORLD_CL100K], "model": "text-embedding-ada-002", "encoding_format": "base64"}
    message = refused.value.body["message"]  # type: ignore[index]
    assert message.startswith("input[0]: token id 15339 (at 0) is not in 0..")
    assert message.endswith("token ids are the embedding model's own; send text, not another tokenizer's ids")


def test_langchain_without_its_ctx_length_check_sends_the_texts(srv, floats):
    """check_embedding_ctx_length=False: the texts, through the openai package, read back as
    LangChain reads them (response.model_dump()["data"][i]["embedding"])."""
    sent, answer = create(srv, input=TEXTS, model="bge")
    assert sent["input"] == TEXTS and sent["encoding_format"] == "base64"
    answer = answer.model_dump()
    for entry, expected in zip(answer["data"], floats, strict=True):
        np.testing.assert_array_equal(np.array(entry["embedding"], dtype=np.float32), expected)
