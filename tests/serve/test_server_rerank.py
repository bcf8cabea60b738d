"""/rerank (and llama-server's other paths for it) on a tiny BERT reranker (bge-reranker's shape:
a classifier head, pooling type rank) beside a tiny target: each score llama.cpp's own for the
pair as llama-server reads it, best first, top_n, Jina's and text-embeddings-inference's shapes,
the request's model named; the errors; an embedding model asked to rerank and a reranker asked to
embed."""

import json

import llama_cpp
import pytest
import tiny_models as tm
from embedding import reference
from serving import CTX, Server

import specllm
from specllm.llama.embeddings import open_embedding_model, rerank_tokens
from specllm.llama.options import ModelOptions

RANK, CLS = llama_cpp.LLAMA_POOLING_TYPE_RANK, llama_cpp.LLAMA_POOLING_TYPE_CLS
QUERY = "the lazy dog"
DOCUMENTS = ["a quick brown fox", "the lazy dog jumps over", "code file", "search query document"]
PATHS = ["/rerank", "/reranking", "/v1/rerank", "/v1/reranking"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("rerank")
    engine = specllm.load(str(tm.write_model(d / "target.gguf", seed=0)), n_ctx=CTX, n_threads=1)
    path = tm.write_model(d / "reranker.gguf", arch="bert", seed=5, pooling_type=RANK)
    reranker = open_embedding_model(path, ModelOptions(n_ctx=4096, n_threads=1))
    yield engine, reranker
    reranker.close()
    engine.close()


@pytest.fixture(scope="module")
def srv(models):
    s = Server(*models)
    yield s
    s.stop()


def rerank(srv, body: dict, path: str = "/rerank") -> tuple[int, dict]:
    return srv.post(path, json.dumps(body).encode())


def expected_scores(reranker) -> list[float]:
    """llama.cpp's score of each pair, [CLS] query [SEP] document, through llama_cpp directly."""
    pairs = [rerank_tokens(reranker, QUERY, document) for document in DOCUMENTS]
    return [float(reference(reranker.path, tokens, reranker.n_ctx)[0]) for tokens in pairs]


@pytest.mark.parametrize("path", PATHS)
def test_each_document_gets_llama_cpps_score_best_first(srv, models, path):
    """As llama-server answers (Jina's shape): every document's index and relevance_score, the
    head's output as the model gives it, best first; usage counts every pair's tokens."""
    reranker = models[1]
    scores = expected_scores(reranker)
    status, data = rerank(srv, {"query": QUERY, "documents": DOCUMENTS}, path)
    assert status == 200, data
    assert data["object"] == "list" and data["model"] == "reranker.gguf"
    best_first = sorted(range(len(DOCUMENTS)), key=lambda i: -scores[i])
    assert data["results"] == [{"index": i, "relevance_score": scores[i]} for i in best_first]
    assert len(set(scores)) == len(scores)  # the order is the scores', not a tie's
    n_tokens = sum(len(rerank_tokens(reranker, QUERY, d)) for d in DOCUMENTS)
    assert data["usage"] == {"prompt_tokens": n_tokens, "total_tokens": n_tokens}


def test_top_n_keeps_the_best_and_the_model_asked_for_is_named(srv):
    whole = rerank(srv, {"query": QUERY, "documents": DOCUMENTS})[1]["results"]
    status, data = rerank(srv, {"query": QUERY, "documents": DOCUMENTS, "top_n": 2, "model": "bge-reranker-v2-m3"})
    assert status == 200 and data["results"] == whole[:2] and data["model"] == "bge-reranker-v2-m3"
    assert rerank(srv, {"query": QUERY, "documents": DOCUMENTS, "top_n": 10})[1]["results"] == whole


def test_texts_asks_for_text_embeddings_inferences_shape(srv):
    """`texts` in place of `documents` (TEI's request): a bare list of index and score, each
    document's text beside it with return_text."""
    whole = rerank(srv, {"query": QUERY, "documents": DOCUMENTS})[1]["results"]
    status, data = rerank(srv, {"query": QUERY, "texts": DOCUMENTS, "top_n": 3})
    assert status == 200
    assert data == [{"index": r["index"], "score": r["relevance_score"]} for r in whole[:3]]
    status, data = rerank(srv, {"query": QUERY, "texts": DOCUMENTS, "return_text": True})
    expected = [{"index": r["index"], "score": r["relevance_score"], "text": DOCUMENTS[r["index"]]} for r in whole]
    assert (status, data) == (200, expected)


def test_return_documents_gives_each_documents_text_as_jina_and_cohere_do(srv):
    """Jina's and Cohere's `return_documents`: each result's `document` ({"text": ...}) beside its
    score, in the results' order and top_n; false or null: none, as llama-server answers."""
    whole = rerank(srv, {"query": QUERY, "documents": DOCUMENTS})[1]["results"]
    status, data = rerank(srv, {"query": QUERY, "documents": DOCUMENTS, "top_n": 3, "return_documents": True})
    assert status == 200, data
    assert data["results"] == [r | {"document": {"text": DOCUMENTS[r["index"]]}} for r in whole[:3]]
    for unasked in (False, None):
        body = {"query": QUERY, "documents": DOCUMENTS, "return_documents": unasked, "return_text": unasked}
        assert rerank(srv, body)[1]["results"] == whole


def test_documents_as_objects_are_scored_by_their_text(srv):
    """Jina's and Cohere's v1 documents may be objects: each is scored as its `text`, and
    `return_documents` gives it back as it came, its other fields too."""
    whole = rerank(srv, {"query": QUERY, "documents": DOCUMENTS})[1]["results"]
    objects = [{"text": d, "id": f"doc-{i}"} for i, d in enumerate(DOCUMENTS)]
    mixed = [objects[0], *DOCUMENTS[1:]]
    for documents in (objects, mixed):
        status, data = rerank(srv, {"query": QUERY, "documents": documents})
        assert (status, data["results"]) == (200, whole), data
    status, data = rerank(srv, {"query": QUERY, "documents": mixed, "return_documents": True})
    assert status == 200, data
    expected = [objects[0]] + [{"text": d} for d in DOCUMENTS[1:]]
    assert data["results"] == [r | {"document": expected[r["index"]]} for r in whole]


def test_truncate_scores_a_too_long_document_as_its_first_tokens_that_fit(srv, models):
    """text-embeddings-inference's `truncate: true`: a document too long beside the query is scored
    as its first tokens that fit (the words that fit, as a shorter document), the others as they
    are; usage counts the tokens read. Its truncation_direction "right" (TEI's default) is the
    one taken."""
    long, room = " ".join(["dog"] * 600), 512 - len(rerank_tokens(models[1], QUERY, ""))
    cut = rerank(srv, {"query": QUERY, "texts": [" ".join(["dog"] * room), DOCUMENTS[0]]})
    for direction in ({}, {"truncation_direction": "Right"}):
        body = {"query": QUERY, "texts": [long, DOCUMENTS[0]], "truncate": True} | direction
        assert rerank(srv, body) == cut
    status, data = rerank(srv, {"query": QUERY, "documents": [long], "truncate": True})
    assert (status, data["usage"]["prompt_tokens"]) == (200, 512)


@pytest.mark.parametrize(
    "body, param, fragment",
    [
        ({"documents": DOCUMENTS}, "query", "query: Field required"),
        ({"query": 5, "documents": DOCUMENTS}, "query", "query: Input should be a valid string"),
        ({"query": QUERY}, "documents", "documents must be a non-empty list of texts"),
        ({"query": QUERY, "documents": []}, "documents", "documents must be a non-empty list of texts"),
        ({"query": QUERY, "texts": []}, "texts", "texts must be a non-empty list of texts"),
        ({"query": QUERY, "documents": ["a", 1]}, "documents.1", "Input should be a valid string"),
        ({"query": QUERY, "documents": [{"title": "a"}]}, "documents.0", "documents.0.text: Field required"),
        ({"query": QUERY, "documents": [{"text": 5}]}, "documents.0", "documents.0.text: Input should be a valid"),
        ({"query": QUERY, "documents": DOCUMENTS, "top_n": -1}, "top_n", "greater than or equal to 0"),
        (  # a document's start is not what it cuts
            {"query": QUERY, "documents": DOCUMENTS, "truncate": True, "truncation_direction": "Left"},
            "truncation_direction",
            "Input should be 'right' or 'Right'",
        ),
        (
            {"query": QUERY, "documents": ["dog", " ".join(["dog"] * 510)]},
            "documents",
            "documents[1] is 515 tokens with the query but the reranker's context holds 512",
        ),
        (  # the query alone too long for any document: it is named, not the first document
            {"query": " ".join(["dog"] * 600), "documents": ["dog"]},
            "query",
            "query is 602 tokens with the pair's markup but the reranker's context holds 512",
        ),
    ],
)
def test_bad_input_is_a_400_naming_its_field(srv, body, param, fragment):
    status, data = rerank(srv, body)
    assert status == 400, data
    assert data["error"]["param"] == param and fragment in data["error"]["message"], data
    assert data["error"]["type"] == "invalid_request_error"


def test_a_pair_takes_what_the_positions_hold(srv):
    """[CLS], the query's 3 tokens, [SEP] and 507 more: 512, the BERT's positions."""
    assert rerank(srv, {"query": QUERY, "documents": [" ".join(["dog"] * 507)]})[0] == 200


def test_a_reranker_embeds_nothing_and_is_listed(srv):
    status, data = srv.post("/v1/embeddings", json.dumps({"input": "x"}).encode())
    assert (status, data["error"]["code"]) == (400, "model_not_supported")
    assert data["error"]["message"].startswith("reranker.gguf is a reranker: it scores documents against a query")
    assert [m["id"] for m in srv.get("/v1/models")["data"]] == ["tiny", "reranker.gguf"]


def test_an_embedding_model_cannot_rerank_and_says_so(models, tmp_path):
    path = tm.write_model(tmp_path / "bge.gguf", arch="bert", seed=5, pooling_type=CLS)
    embedder = open_embedding_model(path, ModelOptions(n_ctx=4096, n_threads=1))
    srv = Server(models[0], embedder)
    try:
        status, data = rerank(srv, {"query": QUERY, "documents": DOCUMENTS})
    finally:
        srv.stop()
        embedder.close()
    assert (status, data["error"]["code"], data["error"]["type"]) == (
        400,
        "model_not_supported",
        "invalid_request_error",
    )
    assert data["error"]["message"].startswith("bge.gguf is an embedding model, not a reranker (pooling type rank")


def test_a_server_without_one_says_how_to_start_one(models):
    plain = Server(models[0])
    try:
        status, data = rerank(plain, {"query": QUERY, "documents": DOCUMENTS})
    finally:
        plain.stop()
    assert (status, data["error"]["code"]) == (404, "model_not_found")
    assert "start specllm serve with --embedding-model RERANKER" in data["error"]["message"]
