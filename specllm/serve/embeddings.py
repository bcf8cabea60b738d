"""OpenAI's /v1/embeddings and llama-server's /embedding and /rerank for `specllm serve`, answered
as llama-server answers them (started with `--embeddings` or `--reranking`): the requests, the
normalisation and the responses, as plain data as openai_api.py (no HTTP, no model)."""

import base64
import json
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, JsonValue

from specllm.serve.openai_api import ApiError

EUCLIDEAN = 2  # llama-server's default embd_normalize: each embedding's length is 1


Prompt = list[str | int]  # one input: its texts and token ids, in order (llama-server's tokenize_mixed)
MEDIA_PARTS = ("image_url", "input_audio", "input_video", "video_url")
SHAPES = "a text, a list of token ids, a list of texts and token ids, or an object with content or prompt_string"


class EmbeddingRequest(BaseModel):
    """`input`, in every shape llama-server's tokenize_input_prompts takes: a text, token ids, texts
    and ids mixed (one input), or a list of inputs, each of those or an object ({"prompt_string":
    ...}, or {"content": [parts]} as in a chat message); `content` in its place, llama-server's
    name, which asks for llama-server's own answer; `embd_normalize`, llama-server's: -1 none, 0
    the largest value 32760 (int16's range), 1 taxicab, 2 Euclidean, p > 2 the p-norm;
    `truncate` (as llama-cpp-python's and text-embeddings-inference's, whose null is its default,
    false): an input longer than the context cut to its first tokens that fit, where it is
    otherwise a 400."""

    model_config = ConfigDict(extra="ignore", strict=True)
    input: JsonValue = None  # read by prompts(): pydantic's errors for a union of shapes say little
    content: JsonValue = None
    model: str | None = None  # any name is accepted (the server has one embedding model), and echoed
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None  # the model's own, or refused: llama.cpp cannot shorten an embedding
    embd_normalize: int = Field(EUCLIDEAN, ge=-1)
    truncate: bool | None = False  # None: not asked (text-embeddings-inference's clients send null)

    @property
    def openai_shaped(self) -> bool:
        """Whether OpenAI's answer was asked for: llama-server gives its own for `content`."""
        return "input" in self.model_fields_set

    def prompts(self) -> list[Prompt]:
        """Each input's texts and token ids, as llama-server splits `input` into inputs: a list
        that holds a token id is one input, any other list one input per element."""
        if self.openai_shaped:
            given = self.input
        elif "content" in self.model_fields_set:
            given = self.content
        else:
            raise ApiError(400, "input: Field required", "input")
        if isinstance(given, list) and not any(map(_is_id, given)):
            if not given:
                raise ApiError(400, "input must not be empty", "input")
            return [_prompt(item, f"input[{i}]") for i, item in enumerate(given)]
        return [_prompt(given, "input[0]")]

    def check_dimensions(self, n_embd: int) -> None:
        if self.dimensions is not None and self.dimensions != n_embd:
            message = f"dimensions: this embedding model's embeddings have {n_embd}, not {self.dimensions}"
            raise ApiError(400, message, "dimensions")


def _is_id(value: JsonValue) -> bool:
    return type(value) is int  # not a bool, which Python counts as an int and JSON does not


def _prompt(item: JsonValue, field: str) -> Prompt:
    """One input, as llama-server's tokenize_input_subprompt reads it; anything else is a 400."""
    if isinstance(item, str):
        return [item]
    if isinstance(item, list) and _ids_or_mixed(item):
        return list(item)  # type: ignore[arg-type]
    if isinstance(item, dict) and "content" in item:
        return [_content_text(item["content"], field)]
    if isinstance(item, dict) and "prompt_string" in item:
        if "multimodal_data" in item:
            raise ApiError(400, f"{field}: multimodal_data: the embedding model reads text only", "input")
        parts = item["prompt_string"]
        if isinstance(parts, str):
            return [parts]
        if isinstance(parts, list) and all(isinstance(p, str) or _is_id(p) for p in parts):
            return list(parts)  # type: ignore[arg-type]
    raise ApiError(400, f"{field} must be {SHAPES}", "input")


def _ids_or_mixed(items: list[JsonValue]) -> bool:
    """Token ids only, or texts and ids both (a list of texts alone is no input, as in llama-server)."""
    ids = sum(map(_is_id, items))
    texts = sum(isinstance(item, str) for item in items)
    return ids + texts == len(items) and (texts == 0 or ids > 0)


def _content_text(content: JsonValue, field: str) -> str:
    """A chat message's content parts as one text: their texts joined, as llama-server joins them
    for an embedding; an image, audio or video is refused (no multimodal projector here), and so is
    a part of any other type (a file, a part without a type), as llama-server refuses it."""
    if not isinstance(content, list) or not all(isinstance(part, dict) for part in content):
        raise ApiError(400, f"{field}.content must be a list of content parts", "input")
    text = ""
    for at, part in enumerate(content):
        assert isinstance(part, dict)
        kind = part.get("type")
        if kind in MEDIA_PARTS:
            raise ApiError(400, f"{field}.content: {kind}: the embedding model reads text only", "input")
        if kind != "text":  # as llama-server: a file or untyped part embedded as nothing would go unnoticed
            message = f'{field}.content[{at}]: type must be "text" (or a media part), not {json.dumps(kind)}'
            raise ApiError(400, message, "input")
        piece = part.get("text")
        text += piece if isinstance(piece, str) else ""
    return text


def normalized(embedding: np.ndarray, norm: int = EUCLIDEAN) -> np.ndarray:
    """`embedding` scaled as llama.cpp's common_embd_normalize scales it (float32 values, a sum in
    double)."""
    values = embedding.astype(np.float64)
    if norm == -1:
        return embedding
    if norm == 0:
        total = float(np.max(np.abs(values), initial=0.0)) / 32760.0
    elif norm == EUCLIDEAN:
        total = float(np.sqrt(np.sum((embedding * embedding).astype(np.float64))))
    else:  # a p-norm past float64's range is infinite, as in llama.cpp, and scales to 0: no warning
        with np.errstate(over="ignore"):
            total = float(np.sum(np.abs(values) ** norm) ** (1.0 / norm))
    scale = np.float32(1.0 / total if total > 0.0 else 0.0)
    return embedding * scale


def embeddings_response(model: str, embeddings: list[np.ndarray], n_tokens: int, encoding: str) -> dict:
    """OpenAI's list of embeddings; base64: each one's float32 bytes, little-endian, as
    llama-server and OpenAI send them. `model`: the request's, where it names one (echoed, as
    llama-server does), else the server's name for its model."""
    return {
        "object": "list",
        "data": [_entry(i, embedding, encoding) for i, embedding in enumerate(embeddings)],
        "model": model,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    }


def llama_embeddings_response(embeddings: list[np.ndarray]) -> list[dict]:
    """llama-server's own answer (/embedding, or `content` for `input`): a list of each input's
    index and its embeddings, one per pooled input, always floats."""
    return [{"index": i, "embedding": [embedding.tolist()]} for i, embedding in enumerate(embeddings)]


def _entry(index: int, embedding: np.ndarray, encoding: str) -> dict:
    if encoding == "base64":
        packed = base64.b64encode(embedding.astype("<f4").tobytes()).decode("ascii")
        return {"object": "embedding", "index": index, "embedding": packed, "encoding_format": "base64"}
    return {"object": "embedding", "index": index, "embedding": embedding.tolist()}


class TextDocument(BaseModel):
    """A document as an object (Jina's, and Cohere's before its v2): its `text` is what is scored,
    its other fields are the client's own."""

    model_config = ConfigDict(extra="allow", strict=True)
    text: str


class RerankRequest(BaseModel):
    """llama-server's /rerank: a `query` and the `documents` (Jina's and Cohere's name) or `texts`
    (text-embeddings-inference's, which asks for its answer's shape) to score against it;
    `top_n` the best to give (default all); `return_text` (TEI's) each document's text beside its
    score; `documents` may be objects with a `text` (Jina's and Cohere's v1); `return_documents`
    (Jina's and Cohere's) each document beside its score, as they give it (`"document": {"text":
    ...}`, a document object as it came); `truncate` (TEI's) a document too long for the context with
    the query cut to its first tokens that fit, where it is otherwise a 400 (TEI's default
    truncation_direction, the only one taken)."""

    model_config = ConfigDict(extra="ignore", strict=True)
    query: str
    documents: list[str | TextDocument] | None = None
    texts: list[str] | None = None
    top_n: int | None = Field(None, ge=0)
    return_text: bool | None = False
    return_documents: bool | None = False
    truncate: bool | None = False
    truncation_direction: Literal["right", "Right"] | None = None  # a document's end is what is cut
    model: str | None = None  # any name is accepted, and echoed

    @property
    def tei_shaped(self) -> bool:
        """Whether text-embeddings-inference's answer was asked for (llama-server: `texts` given)."""
        return "texts" in self.model_fields_set

    def document_list(self) -> list[str]:
        """The texts to score, in order."""
        given = self.documents if self.documents is not None else self.texts
        if not given:
            field = "texts" if self.documents is None and self.tei_shaped else "documents"
            raise ApiError(400, f"{field} must be a non-empty list of texts", field)
        return [document if isinstance(document, str) else document.text for document in given]

    def returned_document(self, index: int) -> dict:
        """A document as `return_documents` gives it back: an object as it came, a text as Jina's."""
        document = (self.documents or [])[index]
        return {"text": document} if isinstance(document, str) else document.model_dump()


def rerank_response(request: RerankRequest, model: str, scores: list[float], n_tokens: int) -> dict | list:
    """llama-server's answer to /rerank: each document's index and score, best first (ties in the
    documents' order), the best `top_n`; in Jina's shape (`relevance_score`, in an object with
    `model` and `usage`; `document` if asked) or, for `texts`, text-embeddings-inference's (a
    list, `score`, `text` if asked)."""
    documents = request.document_list()
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[: request.top_n]
    if not request.tei_shaped:
        given = request.returned_document if request.return_documents else None
        results = [
            {"index": i, "relevance_score": scores[i]} | ({"document": given(i)} if given else {}) for i in order
        ]
        usage = {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
        return {"model": model, "object": "list", "usage": usage, "results": results}
    text = request.return_text
    return [{"index": i, "score": scores[i]} | ({"text": documents[i]} if text else {}) for i in order]
