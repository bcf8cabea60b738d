"""An embedding model (nomic-embed-text, bge, Qwen3-Embedding, ...): a `Model` whose context pools
each text into one vector, as llama-server's `--embeddings` loads one."""

import dataclasses
from pathlib import Path

import llama_cpp as L

from specllm.errors import SpecllmError
from specllm.llama.gguf_header import read_metadata
from specllm.llama.model import Model
from specllm.llama.options import CTX_STEP, ModelOptions

POOLING_NAMES = {
    L.LLAMA_POOLING_TYPE_NONE: "none",
    L.LLAMA_POOLING_TYPE_MEAN: "mean",
    L.LLAMA_POOLING_TYPE_CLS: "cls",
    L.LLAMA_POOLING_TYPE_LAST: "last",
    L.LLAMA_POOLING_TYPE_RANK: "rank",
}


def open_embedding_model(path: str | Path, options: ModelOptions) -> Model:
    """Load `path` with a context that pools each text as its GGUF says (<arch>.pooling_type),
    of options.n_ctx tokens or the model's training context, whichever is less (a BERT has no
    position embeddings beyond it). A text goes to llama.cpp in one micro-batch (Model.embed),
    so n_batch and n_ubatch are the most tokens a text may have (embedding_limit): the whole
    context, or the training context where that is less than llama.cpp's smallest context (a
    BERT of 128 positions: a longer text would read past its position embeddings, which aborts
    the process). A model that does not pool (pooling none: a model made to generate, or one that
    gives a vector per token) or a reranker is refused: neither gives one embedding per text."""
    path = Path(path)
    trained = _training_context(path)
    n_ctx = min(options.n_ctx, max(CTX_STEP, trained // CTX_STEP * CTX_STEP))
    n_batch = min(n_ctx, trained)
    model = Model(path, dataclasses.replace(options, n_ctx=n_ctx, n_batch=n_batch, snapshots=0, embeddings=True))
    try:
        _check_pooling(model)
    except BaseException:
        model.close()
        raise
    return model


def embedding_limit(model: Model) -> int:
    """The most tokens one text may have: what one micro-batch of the context holds."""
    return model.n_batch


def describe_embeddings(model: Model) -> str:
    """The startup line's words for an embedding model: its file, pooling and the tokens a text may have."""
    return f"embeddings {model.path.name} ({POOLING_NAMES[model.pooling]} pooling, {embedding_limit(model)} tokens)"


def _training_context(path: Path) -> int:
    """The model's training context (<arch>.context_length); no limit where the GGUF does not say.
    A context size llama.cpp takes is this rounded down to a multiple of CTX_STEP (XLM-RoBERTa's
    514 is 512), but at least CTX_STEP."""
    arch = read_metadata(path, {"general.architecture"}).get("general.architecture")
    trained = read_metadata(path, {f"{arch}.context_length"}).get(f"{arch}.context_length")
    if not isinstance(trained, int) or isinstance(trained, bool) or trained <= 0:
        return 2**31
    return trained


def _check_pooling(model: Model) -> None:
    pooling = model.pooling
    if pooling == L.LLAMA_POOLING_TYPE_RANK:
        raise SpecllmError(f"{model.path.name} is a reranker (pooling type rank): it scores texts, it embeds none")
    if pooling not in POOLING_NAMES or pooling == L.LLAMA_POOLING_TYPE_NONE:
        raise SpecllmError(
            f"{model.path.name} is not an embedding model: its pooling type is none (no <arch>.pooling_type "
            "in its GGUF), so it gives a vector per token, not one per text (llama-server refuses it too)"
        )
