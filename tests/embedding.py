"""llama.cpp's own pooled embedding of a text (a reranker's score), computed through llama_cpp
directly: what the embedding model (specllm/llama/embeddings.py), /v1/embeddings and /rerank are
checked against."""

import ctypes

import llama_cpp
import numpy as np


def reference(path, tokens: list[int], n_ctx: int) -> np.ndarray:
    """The pooled embedding of `tokens` from a context of llama.cpp's default parameters, but an
    embeddings one whose micro-batch holds the whole context (what llama-server needs for a text
    it pools: -ub)."""
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), llama_cpp.llama_model_default_params())
    assert model
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = params.n_batch = params.n_ubatch = n_ctx
    params.n_threads = params.n_threads_batch = 1
    params.embeddings = True
    ctx = llama_cpp.llama_init_from_model(model, params)
    ids = (llama_cpp.llama_token * len(tokens))(*tokens)  # held: the batch only points to it
    batch = llama_cpp.llama_batch_get_one(ids, len(tokens))
    try:
        assert llama_cpp.llama_decode(ctx, batch) == 0
        pooled = llama_cpp.llama_get_embeddings_seq(ctx, 0)
        n_embd = llama_cpp.llama_model_n_embd_out(model)
        if llama_cpp.llama_pooling_type(ctx) == llama_cpp.LLAMA_POOLING_TYPE_RANK:  # a reranker's scores
            n_embd = llama_cpp.llama_model_n_cls_out(model)
        return np.array(ctypes.cast(pooled, ctypes.POINTER(ctypes.c_float))[:n_embd], dtype=np.float32)
    finally:
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
