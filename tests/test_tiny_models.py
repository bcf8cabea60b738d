"""The tiny GGUF models are what conftest.py says they are, checked with real llama.cpp."""

from __future__ import annotations

import ctypes

import llama_cpp
import numpy as np
import pytest
import tiny_models as tm

PROMPTS = [
    "Hello world",
    "def add(a, b):",
    "The name of the class is",
    "import numpy as np",
    "for i in range(10):",
    "while True:",
    "print(value)",
    "if x == 1:",
    "Once upon a time",
    "class Node:",
    "return self.data",
    "you can get the list",
]
N_GEN = 32


def load(path, **kw) -> llama_cpp.Llama:
    return llama_cpp.Llama(model_path=str(path), n_ctx=512, n_threads=1, verbose=False, **kw)


def vocab(llm: llama_cpp.Llama):
    return llama_cpp.llama_model_get_vocab(llm.model)


def token_text(llm: llama_cpp.Llama, i: int) -> bytes:
    return llama_cpp.llama_vocab_get_text(vocab(llm), i)


def last_logits(llm: llama_cpp.Llama) -> np.ndarray:
    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).astype(np.float64)


def greedy(llm: llama_cpp.Llama, prompt: str, n: int = N_GEN) -> tuple[list[int], list[int], list[np.ndarray]]:
    """Prompt tokens, n greedy tokens (one token per decode call) and the logits before each."""
    toks = llm.tokenize(prompt.encode())
    llm.reset()
    llm.eval(toks)
    out, logits = [], []
    for _ in range(n):
        row = last_logits(llm)
        t = int(row.argmax())
        out.append(t)
        logits.append(row)
        llm.eval([t])
    return toks, out, logits


def spec_vocab_compatible(a: llama_cpp.Llama, b: llama_cpp.Llama) -> bool:
    """llama.cpp's speculative-decoding check: type, BOS/EOS, size diff <= 128, texts from id 5."""
    va, vb = vocab(a), vocab(b)
    if llama_cpp.llama_vocab_type(va) != llama_cpp.llama_vocab_type(vb):
        return False
    if (a.token_bos(), a.token_eos()) != (b.token_bos(), b.token_eos()):
        return False
    if abs(a.n_vocab() - b.n_vocab()) > 128:
        return False
    return all(token_text(a, i) == token_text(b, i) for i in range(5, min(a.n_vocab(), b.n_vocab())))


@pytest.fixture(scope="module")
def target(tiny_models):
    return load(tiny_models.target)


@pytest.fixture(scope="module")
def target_runs(target):
    return {p: greedy(target, p) for p in PROMPTS}


def test_models_load_with_expected_vocab(tiny_models):
    for name, kind in [
        ("target", "standard"),
        ("draft", "standard"),
        ("incompatible", "incompatible"),
        ("extended", "extended"),
        ("no_template", "standard"),
        ("bytes", "standard"),
    ]:
        llm = load(getattr(tiny_models, name))
        assert llm.n_vocab() == tm.vocab_size(kind), name
        assert llm.metadata["general.architecture"] == "llama"
    assert tm.vocab_size("standard") == tm.vocab_size("incompatible")
    assert 0 < tm.vocab_size("extended") - tm.vocab_size("standard") <= 128


def test_broken_files_do_not_load(tiny_models):
    assert tiny_models.not_gguf.stat().st_size > 0
    assert 0 < tiny_models.truncated.stat().st_size < tiny_models.target.stat().st_size
    for path in (tiny_models.not_gguf, tiny_models.truncated):
        with pytest.raises(ValueError):
            load(path)


def test_special_tokens_and_tokenizer(target):
    v = vocab(target)
    assert llama_cpp.llama_vocab_type(v) == llama_cpp.LLAMA_VOCAB_TYPE_SPM
    assert (target.token_bos(), target.token_eos()) == (tm.BOS_ID, tm.EOS_ID)
    assert llama_cpp.llama_vocab_eot(v) == tm.EOT_ID
    assert [i for i in range(target.n_vocab()) if llama_cpp.llama_vocab_is_eog(v, i)] == [tm.EOS_ID, tm.EOT_ID]
    assert llama_cpp.llama_vocab_get_add_bos(v) and not llama_cpp.llama_vocab_get_add_eos(v)
    assert token_text(target, tm.byte_token_id(0x0A)) == b"<0x0A>"
    # SPM adds a space prefix; whole words are single tokens.
    toks = target.tokenize(b"Hello world")
    assert toks[0] == tm.BOS_ID and len(toks) == 3
    assert [target.detokenize([t]) for t in toks[1:]] == [b" Hello", b" world"]
    assert target.detokenize(toks) == b"Hello world"
    # Anything outside the vocab falls back to byte tokens and round-trips. (llama-cpp-python's
    # detokenize drops the prefix space only after a leading BOS.)
    text = "def f(x):\n    return x == 1  # caf\u00e9 \u20ac".encode()
    assert target.detokenize(target.tokenize(text)) == text
    assert target.detokenize(target.tokenize(text, add_bos=False)) == b" " + text
    assert tm.byte_token_id(0xE2) in target.tokenize(text)
    chat = target.tokenize(b"<|im_start|>user\nhi<|im_end|>", add_bos=False, special=True)
    assert chat[0] == tm.IM_START_ID and chat[-1] == tm.IM_END_ID
    assert tm.byte_token_id(0x0A) in chat


def test_the_target_carries_chatml_and_one_model_carries_no_template(tiny_models, target):
    assert target.metadata["tokenizer.chat_template"] == tm.CHATML_TEMPLATE
    assert "tokenizer.chat_template" not in load(tiny_models.no_template).metadata


def test_draft_and_extended_vocabularies_are_compatible_and_the_incompatible_one_is_not(tiny_models, target):
    assert spec_vocab_compatible(target, load(tiny_models.draft))
    extended = load(tiny_models.extended)
    assert spec_vocab_compatible(target, extended)
    incompatible = load(tiny_models.incompatible)
    assert incompatible.n_vocab() == target.n_vocab()
    assert not spec_vocab_compatible(target, incompatible)
    first_diff = next(i for i in range(target.n_vocab()) if token_text(target, i) != token_text(incompatible, i))
    assert first_diff == tm.FIRST_NORMAL_ID >= 5


def test_extended_model_matches_target_on_shared_ids(tiny_models, target, target_runs):
    extended = load(tiny_models.extended)
    n = target.n_vocab()
    for prompt in PROMPTS[:3]:
        toks, gen, logits = target_runs[prompt]
        extended.reset()
        extended.eval(toks + gen[:4])
        target.reset()
        target.eval(toks + gen[:4])
        np.testing.assert_allclose(last_logits(extended)[:n], last_logits(target), atol=1e-4)


def test_target_greedy_output_varies_and_rarely_ends(target_runs):
    eog = 0
    for prompt, (_, gen, _) in target_runs.items():
        assert len(set(gen)) > 3, prompt
        eog += sum(t in (tm.EOS_ID, tm.EOT_ID) for t in gen)
    assert eog <= 2


def test_target_distribution_is_peaked_but_not_one_hot(target_runs):
    rows = np.array([row for _, _, logits in target_runs.values() for row in logits])
    p = np.exp(rows - rows.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p.sort(1)
    assert 0.15 < np.median(p[:, -1]) < 0.75  # top-1 probability at temperature 1
    assert np.median(p[:, -5:].sum(1)) > 0.5  # top-5 hold most of the mass
    top2 = np.sort(rows, 1)[:, -2:]
    gaps = top2[:, 1] - top2[:, 0]
    assert (gaps < 1e-3).mean() < 0.01  # greedy near-ties are rare


def agreement(draft, runs) -> float:
    """How often the draft's greedy token is the target's, teacher-forced on the target's greedy
    paths (`runs`: prompt tokens, generated tokens, ...)."""
    agree = total = 0
    for toks, gen, _ in runs:
        draft.reset()
        draft.eval(toks)
        for t in gen:
            agree += int(last_logits(draft).argmax()) == t
            total += 1
            draft.eval([t])
    return agree / total


def test_draft_agrees_with_target_mostly(tiny_models, target_runs):
    assert 0.5 <= agreement(load(tiny_models.draft), target_runs.values()) <= 0.97


def test_bytes_model_emits_broken_utf8(tiny_models):
    llm = load(tiny_models.bytes)
    _, gen, _ = greedy(llm, "Hello world", 48)
    assert sum(tm.FIRST_BYTE_ID <= t < tm.FIRST_NORMAL_ID for t in gen) > len(gen) // 2
    data = llm.detokenize(gen)
    with pytest.raises(UnicodeDecodeError):
        data.decode("utf-8")
    assert any(tm.byte_token_id(b) in gen for b in (0xC3, 0xE2, 0xF0))  # lead bytes


def test_custom_eos_and_determinism(tmp_path, tiny_models):
    eos = tm.FIRST_NORMAL_ID + 10
    path = tm.write_model(tmp_path / "eos.gguf", eos_token_id=eos)
    llm = load(path)
    assert llm.token_eos() == eos and llama_cpp.llama_vocab_is_eog(vocab(llm), eos)
    again = tm.write_model(tmp_path / "again.gguf")
    assert again.read_bytes() == tiny_models.target.read_bytes()
    assert tm.write_model(tmp_path / "other.gguf", seed=1).read_bytes() != again.read_bytes()


# --- Other architectures: qwen35 (hybrid, with and without MTP) and mamba (recurrent) ---

ARCH_KIND = {"qwen35": (True, False), "mamba": (False, True)}  # (is_hybrid, is_recurrent)


def low_level_model(path, load_mtp: bool = False):
    params = llama_cpp.llama_model_default_params()
    params.load_mtp = load_mtp
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    assert model, path
    return model


def low_level_ctx(model, **kw):
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_threads, params.n_threads_batch = 256, 1, 1
    params.type_k = params.type_v = 0  # F32 KV cache: exact comparisons
    for k, v in kw.items():
        setattr(params, k, v)
    ctx = llama_cpp.llama_init_from_model(model, params)
    assert ctx
    return ctx


def decode(ctx, tokens, pos0: int, n_vocab: int) -> np.ndarray:
    """Decode `tokens` at positions pos0.. in one batch; the logits of the last one."""
    batch = llama_cpp.llama_batch_init(len(tokens), 0, 1)
    try:
        for i, t in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, pos0 + i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i == len(tokens) - 1
        batch.n_tokens = len(tokens)
        assert llama_cpp.llama_decode(ctx, batch) == 0
    finally:
        llama_cpp.llama_batch_free(batch)
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).astype(np.float64)


@pytest.fixture(scope="module")
def arch_runs(tiny_recurrent_models):
    """arch -> (target Llama, {prompt: greedy run}) for the first 8 prompts."""
    out = {}
    for arch in ARCH_KIND:
        llm = load(getattr(tiny_recurrent_models, arch))
        out[arch] = (llm, {p: greedy(llm, p) for p in PROMPTS[:8]})
    return out


@pytest.mark.parametrize("arch", list(ARCH_KIND))
def test_arch_loads_as_its_kind_with_the_same_tokenizer(tiny_recurrent_models, target, arch):
    llm = load(getattr(tiny_recurrent_models, arch))
    assert llm.metadata["general.architecture"] == arch
    assert (llama_cpp.llama_model_is_hybrid(llm.model), llama_cpp.llama_model_is_recurrent(llm.model)) == ARCH_KIND[
        arch
    ]
    assert llama_cpp.llama_model_n_layer_nextn(llm.model) == 0
    assert llm.n_vocab() == tm.vocab_size("standard")
    assert spec_vocab_compatible(target, llm)
    for text in (b"Hello world", b"def f(x):\n    return x == 1"):
        assert llm.tokenize(text) == target.tokenize(text)


@pytest.mark.parametrize("arch", list(ARCH_KIND))
def test_arch_greedy_output_varies_rarely_ends_and_is_deterministic(tmp_path, tiny_recurrent_models, arch_runs, arch):
    llm, runs = arch_runs[arch]
    eog = 0
    for prompt, (_, gen, _) in runs.items():
        assert len(set(gen)) > 10, (prompt, gen)
        eog += sum(t in (tm.EOS_ID, tm.EOT_ID) for t in gen)
    assert eog <= 2
    rows = np.array([row for _, _, logits in runs.values() for row in logits])
    p = np.exp(rows - rows.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    assert 0.15 < np.median(p.max(1)) < 0.75
    # same weights, same output: rewriting the file gives the same bytes, reloading the same tokens
    path = getattr(tiny_recurrent_models, arch)
    assert tm.write_model(tmp_path / "again.gguf", arch=arch).read_bytes() == path.read_bytes()
    assert tm.write_model(tmp_path / "other.gguf", arch=arch, seed=1).read_bytes() != path.read_bytes()
    again = load(path)
    for prompt in PROMPTS[:2]:
        assert greedy(again, prompt)[1] == runs[prompt][1]


@pytest.mark.parametrize("arch", list(ARCH_KIND))
def test_arch_draft_agrees_with_target_mostly(tiny_recurrent_models, arch_runs, arch):
    draft = load(getattr(tiny_recurrent_models, arch + "_draft"))
    assert 0.6 <= agreement(draft, arch_runs[arch][1].values()) <= 0.92


def test_qwen35_mtp_layer_and_context(tiny_recurrent_models):
    n_vocab = tm.vocab_size("standard")
    toks = [tm.BOS_ID] + list(range(300, 306))
    plain = low_level_model(tiny_recurrent_models.qwen35)
    model = low_level_model(tiny_recurrent_models.qwen35_mtp, load_mtp=True)
    ctxs = []
    try:
        assert llama_cpp.llama_model_n_layer_nextn(model) == 1
        assert llama_cpp.llama_model_n_layer_nextn(plain) == 0
        assert llama_cpp.llama_model_is_hybrid(model)
        n_embd = llama_cpp.llama_model_n_embd(model)
        # the main model ignores the MTP block: same logits as the model without it
        ctxs.append(low_level_ctx(plain))
        ref = decode(ctxs[-1], toks, 0, n_vocab)
        ctxs.append(tgt := low_level_ctx(model, embeddings=True))
        batch = llama_cpp.llama_batch_init(len(toks), 0, 1)
        for i, t in enumerate(toks):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t, i, 1, True
            batch.seq_id[i][0] = 0
        batch.n_tokens = len(toks)
        assert llama_cpp.llama_decode(tgt, batch) == 0
        llama_cpp.llama_batch_free(batch)
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(tgt, -1), shape=(n_vocab,))
        np.testing.assert_array_equal(logits, ref)
        # the target's final hidden states (output_norm'd: what the MTP head takes as h)
        h = np.array(
            [
                np.ctypeslib.as_array(llama_cpp.llama_get_embeddings_ith(tgt, i), shape=(n_embd,))
                for i in range(len(toks))
            ],
            dtype=np.float32,
        )
        # the MTP context decodes token x_i paired with h_{i-1} (as common/speculative.cpp's draft-mtp does)
        ctxs.append(mtp := low_level_ctx(model, ctx_type=llama_cpp.LLAMA_CONTEXT_TYPE_MTP))
        rows = [np.zeros(n_embd, np.float32)] + [h[i - 1].copy() for i in range(1, len(toks))]
        bext = llama_cpp.llama_batch_ext_init(mtp)
        try:
            for i, t in enumerate(toks):
                idx = llama_cpp.llama_batch_ext_add_token(bext, 0, t)
                assert idx == i
                assert llama_cpp.llama_batch_ext_set_pos(bext, idx, ctypes.byref(llama_cpp.llama_pos(i)))
                embd = llama_cpp.llama_embd(rows[i].ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, n_embd)
                # llama_batch_ext_set_embd_state is still a stub (returns False) in 0.3.36
                assert llama_cpp.llama_batch_ext_set_embd_token(bext, idx, embd)
                llama_cpp.llama_batch_ext_set_output_logits(bext, idx, i == len(toks) - 1)
            assert llama_cpp.llama_process(mtp, llama_cpp.LLAMA_PROCESS_TYPE_DECODE, bext) == 0
        finally:
            llama_cpp.llama_batch_ext_free(bext)
        draft_logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(mtp, -1), shape=(n_vocab,))
        assert np.isfinite(draft_logits).all() and draft_logits.std() > 1.0
    finally:
        for c in ctxs:
            llama_cpp.llama_free(c)
        llama_cpp.llama_model_free(model)
        llama_cpp.llama_model_free(plain)


@pytest.mark.parametrize("arch", list(ARCH_KIND))
def test_arch_rollback_and_state_restore(tiny_recurrent_models, arch):
    """What speculative decoding relies on: qwen35 rolls back up to n_rs_seq tokens of the last
    decode call exactly (if that call held more tokens than the rollback); mamba cannot roll back
    at all. A saved sequence state restores exactly for both."""
    n_vocab = tm.vocab_size("standard")
    toks = [tm.BOS_ID] + list(range(300, 315))
    model = low_level_model(getattr(tiny_recurrent_models, arch))
    ctxs = []
    try:
        ctxs.append(ctx := low_level_ctx(model, n_rs_seq=4))
        mem = llama_cpp.llama_get_memory(ctx)
        decode(ctx, toks[:10], 0, n_vocab)
        state = (ctypes.c_uint8 * llama_cpp.llama_state_seq_get_size(ctx, 0))()
        assert llama_cpp.llama_state_seq_get_data(ctx, state, len(state), 0) == len(state)
        after10 = decode(ctx, toks[10:11], 10, n_vocab).copy()
        decode(ctx, toks[11:15], 11, n_vocab)  # positions 10..14: 10 + 1 + 4
        if arch == "qwen35":
            assert llama_cpp.llama_n_rs_seq(ctx) == 4
            assert llama_cpp.llama_memory_seq_rm(mem, 0, 13, -1)  # drop 13, 14 (within the last call)
            assert llama_cpp.llama_memory_seq_pos_max(mem, 0) == 12
            got = decode(ctx, toks[13:14], 13, n_vocab).copy()
            ctxs.append(fresh := low_level_ctx(model))
            decode(fresh, toks[:13], 0, n_vocab)
            np.testing.assert_allclose(got, decode(fresh, toks[13:14], 13, n_vocab), atol=1e-4)
            assert not llama_cpp.llama_memory_seq_rm(mem, 0, 8, -1)  # 6 > n_rs_seq: refused, unchanged
        else:
            assert llama_cpp.llama_n_rs_seq(ctx) == 0  # clamped: Mamba has no partial rollback
            assert not llama_cpp.llama_memory_seq_rm(mem, 0, 14, -1)
        assert llama_cpp.llama_memory_seq_pos_max(mem, 0) == (13 if arch == "qwen35" else 14)
        assert llama_cpp.llama_state_seq_set_data(ctx, state, len(state), 0) == len(state)
        assert llama_cpp.llama_memory_seq_pos_max(mem, 0) == 9
        np.testing.assert_array_equal(decode(ctx, toks[10:11], 10, n_vocab), after10)
    finally:
        for c in ctxs:
            llama_cpp.llama_free(c)
        llama_cpp.llama_model_free(model)
