"""An embedding model on tiny GGUFs that set <arch>.pooling_type (llama ones, and BERT-family ones with
a WordPiece vocabulary): its embeddings against llama.cpp's own, computed here through llama_cpp
directly; its context; the models it refuses."""

import llama_cpp
import numpy as np
import pytest
import tiny_models as tm
from embedding import reference

from specllm.errors import SpecllmError
from specllm.llama.embeddings import describe_embeddings, fitted_rerank_tokens, open_embedding_model, rerank_tokens
from specllm.llama.options import ModelOptions

MEAN, CLS, LAST, RANK = (
    llama_cpp.LLAMA_POOLING_TYPE_MEAN,
    llama_cpp.LLAMA_POOLING_TYPE_CLS,
    llama_cpp.LLAMA_POOLING_TYPE_LAST,
    llama_cpp.LLAMA_POOLING_TYPE_RANK,
)
OPTIONS = ModelOptions(n_ctx=1024, n_threads=1)
LONG = 600  # tokens: more than llama.cpp's default micro-batch of 512


@pytest.fixture(scope="module")
def pooled(tmp_path_factory):
    """A tiny model for each pooling type that gives one embedding per text."""
    d = tmp_path_factory.mktemp("embedding_models")
    return {p: tm.write_model(d / f"pooling{p}.gguf", seed=5, pooling_type=p) for p in (MEAN, CLS, LAST)}


@pytest.mark.parametrize("pooling", [MEAN, CLS, LAST])
def test_an_embedding_is_llama_cpps_own_for_short_and_long_texts(pooled, pooling):
    """Bit for bit. A text longer than llama.cpp's default micro-batch (512) is pooled whole: a
    mean over only its last micro-batch's tokens was what llama.cpp gave with the default."""
    model = open_embedding_model(pooled[pooling], OPTIONS)
    try:
        short = model.tokenize("def total(values): return sum(values)")
        long = (short * LONG)[:LONG]
        for tokens in (short, long, short):  # the cache emptied between texts
            np.testing.assert_array_equal(model.embed(tokens), reference(pooled[pooling], tokens, model.n_ctx))
        assert model.embed(short).shape == (64,)
    finally:
        model.close()


def test_the_context_is_at_most_the_models_training_context(tmp_path):
    """A BERT has position embeddings for its training context only; llama.cpp's context size is a
    multiple of 256 (XLM-RoBERTa's 514 is 512)."""
    path = tm.write_model(tmp_path / "short.gguf", seed=5, pooling_type=MEAN, n_ctx_train=514)
    model = open_embedding_model(path, OPTIONS)
    try:
        assert (model.n_ctx, model.n_batch) == (512, 512)
        assert describe_embeddings(model) == "embeddings short.gguf (mean pooling, 512 tokens)"
    finally:
        model.close()
    model = open_embedding_model(tm.write_model(tmp_path / "long.gguf", seed=5, pooling_type=LAST), OPTIONS)
    try:
        assert (model.n_ctx, model.n_batch) == (1024, 1024)  # the options' (the model's: 4096)
    finally:
        model.close()


def test_a_model_that_pools_nothing_is_refused_in_one_line(tmp_path):
    """A model made to generate has no pooling type (none): it embeds each token, not the text,
    as llama-server says when it refuses one on its OpenAI endpoint."""
    plain = tm.write_model(tmp_path / "plain.gguf", seed=0)
    with pytest.raises(SpecllmError, match=r"^plain\.gguf is not an embedding model: its pooling type is none"):
        open_embedding_model(plain, OPTIONS)
    stated = tm.write_model(tmp_path / "none.gguf", seed=0, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_NONE)
    with pytest.raises(SpecllmError, match=r"^none\.gguf is not an embedding model"):
        open_embedding_model(stated, OPTIONS)


def test_a_reranker_scores_a_pair_as_llama_cpp_reads_it(tmp_path):
    """A BERT reranker (bge-reranker's shape) reads a query and a document as llama-server's
    format_prompt_rerank puts them: [CLS] query [SEP] document (its vocabulary adds BOS and SEP,
    no EOS); its score is llama.cpp's, bit for bit; a rerank template in the GGUF (Qwen3-Reranker's
    way) is used instead, with control tokens read."""
    path = tm.write_model(tmp_path / "rank.gguf", arch="bert", seed=5, pooling_type=RANK)
    model = open_embedding_model(path, OPTIONS)
    try:
        assert describe_embeddings(model) == "reranker rank.gguf (512 tokens a pair)"
        tokens = rerank_tokens(model, "lazy dog", "the quick fox")
        words = [tm.BERT_VOCAB.index("\u2581" + w) for w in ("lazy", "dog", "the", "quick", "fox")]
        assert tokens == [tm.CLS_ID, *words[:2], tm.SEP_ID, *words[2:]]
        [score] = model.embed(tokens)
        assert score == reference(path, tokens, model.n_ctx)[0]
    finally:
        model.close()
    template = "[CLS]query: {query}[SEP]{document}"
    path = tm.write_model(tmp_path / "templated.gguf", arch="bert", seed=5, pooling_type=RANK, rerank_template=template)
    model = open_embedding_model(path, OPTIONS)
    try:
        expected = [tm.CLS_ID, *model.tokenize("query: lazy dog", add_special=False), tm.SEP_ID]
        # the whole text is read with control tokens, the document's "[CLS]" too, as llama-server reads it
        assert rerank_tokens(model, "lazy dog", "[CLS]") == [*expected, tm.CLS_ID]
    finally:
        model.close()


@pytest.mark.parametrize("template", [None, "[CLS]query: {query}[SEP]{document}[SEP]"])
def test_a_document_too_long_for_the_pair_is_cut_to_its_first_tokens(tmp_path, template):
    """fitted_rerank_tokens: a pair that fits is as rerank_tokens reads it; a longer document keeps
    its first tokens that fit beside the query, the pair read as the shorter document's (a rerank
    template's closing text kept)."""
    path = tm.write_model(tmp_path / "rank.gguf", arch="bert", seed=5, pooling_type=RANK, rerank_template=template)
    model = open_embedding_model(path, OPTIONS)
    try:
        fits = rerank_tokens(model, "lazy dog", "the quick fox")
        assert fitted_rerank_tokens(model, "lazy dog", "the quick fox", len(fits)) == fits
        room = 512 - len(rerank_tokens(model, "lazy dog", ""))
        expected = rerank_tokens(model, "lazy dog", " ".join(["dog"] * room))  # a word a token
        dog = model.tokenize("dog", add_special=False)[0]
        assert len(expected) == 512 and expected[-1] == (tm.SEP_ID if template else dog)
        assert fitted_rerank_tokens(model, "lazy dog", " ".join(["dog"] * 600), 512) == expected
    finally:
        model.close()


def test_an_embedding_takes_what_fits_its_context(pooled):
    model = open_embedding_model(pooled[MEAN], ModelOptions(n_ctx=256, n_threads=1))
    try:
        model.embed([5] * 256)
        for tokens in ([], [5] * 257):
            with pytest.raises(ValueError, match="an embedding takes 1 to n_batch=256 tokens"):
                model.embed(tokens)
    finally:
        model.close()


# --- the BERT family: WordPiece, [CLS] ... [SEP], not causal ---

WORDS = "The quick brown fox jumps over the lazy dog."
# each word and the full stop a piece of the vocabulary, which writes a word's start with "▁"
WORD_IDS = [tm.BERT_VOCAB.index("\u2581" + w) for w in WORDS.lower().replace(".", " .").split()]


@pytest.fixture(scope="module")
def berts(tmp_path_factory):
    """bge's shape (bert, CLS pooling), all-MiniLM's (bert, mean) and nomic-embed-text's (nomic-bert, mean)."""
    d = tmp_path_factory.mktemp("bert_models")
    kinds = [("bert", CLS), ("bert", MEAN), ("nomic-bert", MEAN)]
    return {(a, p): tm.write_model(d / f"{a}{p}.gguf", arch=a, seed=5, pooling_type=p) for a, p in kinds}


@pytest.mark.parametrize("kind", [("bert", CLS), ("bert", MEAN), ("nomic-bert", MEAN)])
def test_a_bert_embeds_cls_text_sep_as_llama_cpp_does(berts, kind):
    """A text reads as llama-server reads it (add_special: [CLS] first, [SEP] last, lowercased
    WordPiece), and its embedding is llama.cpp's own bit for bit, a long text's too (nomic-bert's
    over llama.cpp's default micro-batch of 512)."""
    model = open_embedding_model(berts[kind], ModelOptions(n_ctx=4096, n_threads=1))
    try:
        tokens = model.tokenize(WORDS.upper())
        assert tokens == [tm.CLS_ID, *WORD_IDS, tm.SEP_ID]
        long = [tm.CLS_ID, *(WORD_IDS * 100)[: model.n_ctx - 2], tm.SEP_ID]
        for text in (tokens, long, tokens):
            np.testing.assert_array_equal(model.embed(text), reference(berts[kind], text, model.n_ctx))
        assert model.embed(tokens).shape == (64,)
    finally:
        model.close()


@pytest.mark.parametrize("arch, trained", [("bert", 512), ("nomic-bert", 2048)])
def test_a_berts_context_is_its_training_context(berts, arch, trained):
    """bert has position embeddings for 512 tokens; nomic-bert's RoPE was trained on 2048."""
    model = open_embedding_model(berts[(arch, MEAN)], ModelOptions(n_ctx=4096, n_threads=1))
    try:
        assert (model.n_ctx, model.n_batch) == (trained, trained)
        model.embed([tm.CLS_ID] * trained)
        with pytest.raises(ValueError, match=f"an embedding takes 1 to n_batch={trained} tokens"):
            model.embed([tm.CLS_ID] * (trained + 1))
    finally:
        model.close()


def test_a_bert_of_fewer_positions_than_the_smallest_context_takes_no_more(tmp_path):
    """llama.cpp's smallest context is 256 tokens: a BERT of 128 positions given a longer text there
    reads past its position embeddings, and llama.cpp aborts the process."""
    path = tm.write_model(tmp_path / "short.gguf", arch="bert", seed=5, pooling_type=CLS, n_ctx_train=128)
    model = open_embedding_model(path, OPTIONS)
    try:
        assert (model.n_ctx, model.n_batch) == (256, 128)
        assert describe_embeddings(model) == "embeddings short.gguf (cls pooling, 128 tokens)"
        tokens = [tm.CLS_ID, *(WORD_IDS * 13)[:126], tm.SEP_ID]
        np.testing.assert_array_equal(model.embed(tokens), reference(path, tokens, model.n_ctx))
        with pytest.raises(ValueError, match="an embedding takes 1 to n_batch=128 tokens"):
            model.embed([*tokens, tm.SEP_ID])
    finally:
        model.close()
