"""OpenAI's /v1/embeddings for `specllm serve`, answered as llama-server answers it (started with
`--embeddings`): the request, the normalisation and the response, as plain data as openai_api.py
(no HTTP, no model)."""

import base64
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from specllm.serve.openai_api import ApiError

EUCLIDEAN = 2  # llama-server's default embd_normalize: each embedding's length is 1


class EmbeddingRequest(BaseModel):
    """`input`: a text, texts, token ids (one input) or lists of them, as OpenAI and llama-server
    take it; `embd_normalize`, llama-server's: -1 none, 0 the largest value 32760 (int16's range),
    1 taxicab, 2 Euclidean, p > 2 the p-norm."""

    model_config = ConfigDict(extra="ignore", strict=True)
    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None  # any name is accepted: the server has one embedding model
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None  # the model's own, or refused: llama.cpp cannot shorten an embedding
    embd_normalize: int = Field(EUCLIDEAN, ge=-1)

    def inputs(self) -> list[str | list[int]]:
        """Each input: a text, or its token ids (a list of ids is one input)."""
        if isinstance(self.input, str):
            return [self.input]
        if self.input and isinstance(self.input[0], int):
            return [self.input]
        if not self.input:
            raise ApiError(400, "input must not be empty", "input")
        return list(self.input)  # type: ignore[arg-type]

    def check_dimensions(self, n_embd: int) -> None:
        if self.dimensions is not None and self.dimensions != n_embd:
            message = f"dimensions: this embedding model's embeddings have {n_embd}, not {self.dimensions}"
            raise ApiError(400, message, "dimensions")


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
    llama-server and OpenAI send them."""
    return {
        "object": "list",
        "data": [_entry(i, embedding, encoding) for i, embedding in enumerate(embeddings)],
        "model": model,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    }


def _entry(index: int, embedding: np.ndarray, encoding: str) -> dict:
    if encoding == "base64":
        packed = base64.b64encode(embedding.astype("<f4").tobytes()).decode("ascii")
        return {"object": "embedding", "index": index, "embedding": packed, "encoding_format": "base64"}
    return {"object": "embedding", "index": index, "embedding": embedding.tolist()}
