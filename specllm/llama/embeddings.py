"""An embedding model (nomic-embed-text, bge, Qwen3-Embedding, ...): a `Model` whose context pools
each text into one vector, as llama-server's `--embeddings` loads one; or a reranker (bge-reranker,
Qwen3-Reranker: pooling type rank), whose context pools a query and a document into their score, as
llama-server's `--reranking` loads one."""

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
    gives a vector per token) is refused: it gives no one vector per text."""
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


def is_reranker(model: Model) -> bool:
    return model.pooling == L.LLAMA_POOLING_TYPE_RANK


def describe_embeddings(model: Model) -> str:
    """The startup line's words for an embedding model: its file, pooling and the tokens a text may have."""
    if is_reranker(model):
        return f"reranker {model.path.name} ({embedding_limit(model)} tokens a pair)"
    return f"embeddings {model.path.name} ({POOLING_NAMES[model.pooling]} pooling, {embedding_limit(model)} tokens)"


def rerank_tokens(model: Model, query: str, document: str) -> list[int]:
    """The tokens a reranker scores for a query and a document, as llama-server's
    format_prompt_rerank makes them: the GGUF's rerank template (tokenizer.chat_template.rerank,
    Qwen3-Reranker's) with {query} and {document} put in, read with control tokens; else the
    query, the vocabulary's end tokens (EOS where it adds one, SEP where it adds one) and the
    document, each read without control tokens, after BOS and before EOS where the model adds them
    (a WordPiece BERT's: [CLS] query [SEP] document)."""
    template = model.chat_template("rerank")
    if template is not None:
        prompt = template.replace("{query}", query).replace("{document}", document)
        return model.tokenize(prompt, add_special=False, parse_special=True)
    end = model.eos if model.eos != L.LLAMA_TOKEN_NULL else model.sep
    tokens = [model.bos] if model.add_bos else []
    tokens += model.tokenize(query, add_special=False, parse_special=False)
    tokens += [end] if model.add_eos else []
    tokens += [model.sep] if model.add_sep else []
    tokens += model.tokenize(document, add_special=False, parse_special=False)
    return tokens + ([end] if model.add_eos else [])


def truncated(model: Model, tokens: list[int], limit: int, one_text: bool) -> list[int]:
    """`tokens` cut to their first `limit`, as text-embeddings-inference cuts a text: the end token
    the model's tokenizer adds after one (a BERT's [SEP]; an EOS, which last-token pooling such as
    Qwen3-Embedding's reads as the whole text) stays at the end. `one_text`: the tokens are a
    single text read with the model's special tokens; a mix of texts and ids is cut as it is."""
    closing = [t for t, added in ((model.eos, model.add_eos), (model.sep, model.add_sep)) if added]
    if one_text and limit > 1 and tokens[-1:] and tokens[-1] in closing:
        return tokens[: limit - 1] + tokens[-1:]
    return tokens[:limit]


def fitted_rerank_tokens(model: Model, query: str, document: str, limit: int) -> list[int]:
    """rerank_tokens of `query` and as much of `document`'s start as fits in `limit` tokens with
    it (all of it where it fits). The document is cut, not the pair (whose end may be a rerank
    template's closing text), and what is left of it is read again as text: the tokens are the
    pair of the shorter document. The query must fit with an empty document."""
    tokens = rerank_tokens(model, query, document)
    own = model.tokenize(document, add_special=False, parse_special=model.chat_template("rerank") is not None)
    kept = len(own)
    while len(tokens) > limit:  # a cut's text may read as more tokens than it was: cut again
        kept = max(0, kept - (len(tokens) - limit))
        cut = model.detokenize(own[:kept], special=True).decode("utf-8", errors="ignore")
        tokens = rerank_tokens(model, query, cut)
    return tokens


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
    if pooling not in POOLING_NAMES or pooling == L.LLAMA_POOLING_TYPE_NONE:
        raise SpecllmError(
            f"{model.path.name} is not an embedding model: its pooling type is none (no <arch>.pooling_type "
            "in its GGUF), so it gives a vector per token, not one per text (llama-server refuses it too)"
        )
