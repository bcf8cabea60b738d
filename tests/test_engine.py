"""The engine on real llama.cpp with tiny generated models."""

import numpy as np
import pytest
from stats import chi_square_pvalue

import specllm
from specllm.backend import Model, ModelOptions, check_pair
from specllm.drafters import NgramDrafter
from specllm.engine import Finished, Step
from specllm.errors import SpecllmError
from specllm.sampling import SamplerSettings, distribution
from specllm.text import TextStream

PROMPTS = [
    "Hello world",
    "def f(x): return",
    "the cat is in the house and the cat is in the",
    "print(self.x) print(self.x) print(self",
    "a b c d e f",
    "for i in range(10):",
    "import os",
    "The quick brown fox",
]


@pytest.fixture(scope="module")
def engine(tiny_models):
    e = specllm.load(str(tiny_models.target), str(tiny_models.draft), n_ctx=512, n_threads=1)
    yield e
    e.close()


def greedy(engine, prompt, drafter, gamma=4, max_tokens=48):
    return engine.generate(prompt, max_tokens=max_tokens, temperature=0, drafter=drafter, gamma=gamma)


@pytest.mark.parametrize("drafter", ["model", "ngram"])
@pytest.mark.parametrize("gamma", [1, 2, 4, 8])
def test_greedy_speculative_equals_target_only(engine, drafter, gamma):
    for prompt in PROMPTS:
        expected = greedy(engine, prompt, "none").tokens
        result = greedy(engine, prompt, drafter, gamma)
        assert result.tokens == expected, prompt
        assert len(expected) == 48


def test_greedy_runs_really_speculate(engine):
    """Guard against a vacuous equality test: drafts were made and mostly accepted."""
    model = greedy(engine, PROMPTS[0], "model", 4).stats
    assert model.n_drafted > 20 and 0.3 < model.acceptance_rate < 1.0
    assert model.mean_accepted_length > 1.5
    ngram = engine.generate(PROMPTS[2], max_tokens=48, temperature=0, drafter="ngram", gamma=4).stats
    assert ngram.n_drafted > 0


def test_stats_add_up(engine):
    r = greedy(engine, PROMPTS[1], "model", 4)
    s = r.stats
    assert s.generated_tokens == len(r.tokens) == 48
    assert s.n_drafted == sum(s.drafted_per_position)
    assert s.n_accepted == sum(s.accepted_per_position)
    assert len(s.drafted_per_position) == 4
    assert s.drafted_per_position[0] == s.target_calls - (s.target_calls - s.drafted_per_position[0])
    # every target call emits its accepted drafts plus one token of its own (the last may be cut)
    assert s.n_accepted + s.target_calls >= s.generated_tokens >= s.n_accepted + s.target_calls - 4
    assert s.acceptance_rate == pytest.approx(s.n_accepted / s.n_drafted)
    assert s.mean_accepted_length == pytest.approx(48 / s.target_calls)
    assert s.prompt_tokens == len(engine.prompt_tokens(PROMPTS[1]))
    assert s.draft_calls >= s.target_calls - 1
    assert s.decode_seconds > 0 and s.prefill_seconds > 0


def test_stream_yields_steps_whose_text_adds_up(engine):
    events = list(engine.stream(PROMPTS[0], max_tokens=40, temperature=0, drafter="model", gamma=3))
    steps, final = events[:-1], events[-1]
    assert isinstance(final, Finished) and all(isinstance(e, Step) for e in steps)
    assert "".join(s.accepted_text + s.token_text for s in steps) == final.result.text
    rejected_steps = [s for s in steps if s.accepted < len(s.drafted)]
    assert rejected_steps and all(s.rejected_text for s in rejected_steps)
    emitted = [t for s in steps for t in s.drafted[: s.accepted] + ([s.token] if s.token >= 0 else [])]
    assert emitted == final.result.tokens


def test_token_list_prompt_is_used_as_given(engine):
    ids = engine.prompt_tokens("import os")
    assert ids[0] == engine.target.bos
    assert greedy(engine, ids, "model").tokens == greedy(engine, "import os", "model").tokens
    no_bos = ids[1:]
    assert engine.generate(no_bos, max_tokens=4, temperature=0).stats.prompt_tokens == len(no_bos)


def test_one_engine_generates_many_times_identically(engine):
    first = [greedy(engine, p, "model").tokens for p in PROMPTS[:3]]
    again = [greedy(engine, p, "model").tokens for p in PROMPTS[:3]]
    assert first == again


def test_seeded_sampling_is_reproducible(engine):
    kw = dict(max_tokens=32, temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, drafter="model", gamma=3)
    a = engine.generate(PROMPTS[0], seed=123, **kw).tokens
    assert engine.generate(PROMPTS[0], seed=123, **kw).tokens == a
    assert engine.generate(PROMPTS[0], seed=124, **kw).tokens != a


# --- sampling, end to end ---------------------------------------------------------------------

SAMPLER = SamplerSettings(temperature=1.0, top_k=4, top_p=1.0, min_p=0.0)


def target_two_token_distribution(tiny_models, prompt_ids):
    """P(t1, t2) of target-only sampling, from the target's own logits (one token at a time)."""
    model = Model(tiny_models.target, ModelOptions(n_ctx=256, n_threads=1))
    p1 = distribution(model.sync(prompt_ids, n_logits=1)[0], SAMPLER)
    joint = {}
    for t1 in np.flatnonzero(p1):
        p2 = distribution(model.sync(prompt_ids + [int(t1)], n_logits=1)[0], SAMPLER)
        for t2 in np.flatnonzero(p2):
            joint[(int(t1), int(t2))] = p1[t1] * p2[t2]
    model.close()
    return joint


@pytest.mark.parametrize("drafter,prompt", [("model", "the cat"), ("ngram", " ".join(["the"] * 10))])
def test_first_two_tokens_follow_the_target_distribution(engine, tiny_models, drafter, prompt):
    ids = engine.prompt_tokens(prompt)
    joint = target_two_token_distribution(tiny_models, ids)
    cells = sorted(joint)
    counts = dict.fromkeys(cells, 0)
    n, drafted = 4000, 0
    for seed in range(n):
        r = engine.generate(ids, max_tokens=2, drafter=drafter, gamma=3, **SAMPLER.__dict__ | {"seed": seed})
        counts[tuple(r.tokens)] += 1  # a KeyError here is a token pair the target cannot produce
        drafted += r.stats.n_drafted
    assert drafted > n / 2  # the drafter really proposed tokens
    observed = np.array([counts[c] for c in cells])
    assert chi_square_pvalue(observed, np.array([joint[c] for c in cells])) > 1e-3


# --- KV cache ---------------------------------------------------------------------------------


def test_kv_rollback_gives_the_logits_of_a_fresh_decode(tiny_models):
    model = Model(tiny_models.target, ModelOptions(n_ctx=256, n_threads=1))
    prefix = model.tokenize("def f(x): return x")
    model.eval(prefix + [300, 301, 302, 303], 1)
    model.truncate(len(prefix))
    assert model.tokens == prefix
    after_rollback = model.eval([400, 401, 402], 3).copy()
    model.truncate(0)
    model.eval(prefix, 1)
    fresh = model.eval([400, 401, 402], 3).copy()
    np.testing.assert_array_equal(after_rollback, fresh)
    model.close()


def test_sync_reuses_the_common_prefix(tiny_models):
    model = Model(tiny_models.target, ModelOptions(n_ctx=256, n_threads=1))
    a = model.tokenize("the cat is in the house")
    model.sync(a)
    b = a[:4] + [300, 301]
    logits = model.sync(b, n_logits=1)[0].copy()
    assert model.tokens == b
    model.truncate(0)
    model.eval(b[:4], 0)
    np.testing.assert_array_equal(model.eval(b[4:], 1)[0], logits)  # same batch shapes: exact
    # asking for logits of tokens already cached re-evaluates the last one (a 1-token batch,
    # so equal up to llama.cpp's batch-shape rounding)
    np.testing.assert_allclose(model.sync(b, n_logits=1)[0], logits, atol=1e-3)
    assert model.tokens == b
    model.close()


# --- stopping ---------------------------------------------------------------------------------


@pytest.mark.parametrize("drafter", ["model", "ngram", "none"])
def test_a_full_context_stops_cleanly(tiny_models, drafter):
    e = specllm.load(str(tiny_models.target), str(tiny_models.draft), n_ctx=256, n_threads=1)
    prompt = e.prompt_tokens("the cat is in the house")
    r = e.generate(prompt, max_tokens=1000, temperature=0, drafter=drafter, gamma=8)
    assert r.stop_reason == "context_full"
    n_ctx = e.target.n_ctx  # llama.cpp may round the size up
    assert len(prompt) + len(r.tokens) == n_ctx + 1  # the last token needs no KV slot of its own
    roomy = specllm.load(str(tiny_models.target), n_ctx=2 * n_ctx, n_threads=1)
    assert r.tokens == greedy(roomy, prompt, "none", max_tokens=len(r.tokens)).tokens
    e.close()


def test_a_prompt_longer_than_the_context_is_refused(tiny_models):
    e = specllm.load(str(tiny_models.target), n_ctx=256, n_threads=1)
    with pytest.raises(SpecllmError, match="context"):
        e.generate("the cat is in the house " * 100, max_tokens=4, drafter="none")
    e.close()


def test_eos_stops_generation(tiny_models, tmp_path):
    """A model whose EOS id is a token the target would produce greedily stops right there."""
    import tiny_models as tm

    base = specllm.load(str(tiny_models.target), n_ctx=256, n_threads=1)
    tokens = greedy(base, "import os", "none", max_tokens=12).tokens
    stop_token = tokens[5]
    first = tokens.index(stop_token)
    eos_model = tm.write_model(tmp_path / "eos.gguf", seed=0, eos_token_id=stop_token)
    e = specllm.load(str(eos_model), n_ctx=256, n_threads=1)
    r = e.generate(e.prompt_tokens("import os"), max_tokens=40, temperature=0, drafter="ngram")
    assert r.stop_reason == "eos"
    assert r.tokens == tokens[:first]


def test_max_tokens_and_stop_strings(engine):
    full = greedy(engine, PROMPTS[1], "model", max_tokens=40)
    assert full.stop_reason == "max_tokens"
    for n in (1, 2, 7):
        assert greedy(engine, PROMPTS[1], "model", 8, max_tokens=n).tokens == full.tokens[:n]
    stop = full.text[10:14]
    cut = full.text.index(stop)
    r = engine.generate(PROMPTS[1], max_tokens=40, temperature=0, drafter="model", stop=[stop])
    assert r.stop_reason == "stop"
    assert r.text == full.text[:cut]
    streamed = "".join(e.accepted_text + e.token_text for e in engine.stream(PROMPTS[1], max_tokens=40, temperature=0, stop=[stop]) if isinstance(e, Step))
    assert streamed == full.text[:cut]


# --- text ---------------------------------------------------------------------------------------


def test_multibyte_characters_split_across_tokens_stream_whole():
    stream = TextStream()
    euro = "€".encode()  # three bytes
    assert stream.push(euro[:1]) == ""
    assert stream.push(euro[1:2]) == ""
    assert stream.push(euro[2:] + b"!") == "€!"
    assert stream.finish() == ""


def test_invalid_bytes_become_replacement_characters():
    stream = TextStream()
    out = stream.push(b"a\xffb") + stream.push(b"\xe2\x82") + stream.finish()
    assert out == "a\ufffdb\ufffd"


def test_stop_string_spanning_pushes_is_never_shown():
    stream = TextStream(stop=("END",))
    shown = stream.push(b"abc E") + stream.push(b"N") + stream.push(b"D tail")
    assert shown == "abc " and stream.stopped and stream.text == "abc "


def test_broken_utf8_from_a_model_streams_cleanly(tiny_models):
    e = specllm.load(str(tiny_models.bytes), n_ctx=256, n_threads=1)
    events = list(e.stream("hello", max_tokens=120, temperature=0.8, seed=3, drafter="ngram"))
    result = events[-1].result
    raw = e.target.detokenize(result.tokens)
    with pytest.raises(UnicodeDecodeError):
        raw.decode("utf-8")  # the model really emitted broken UTF-8 ...
    pieces = [ev.accepted_text + ev.token_text for ev in events[:-1]]
    assert "".join(pieces) == result.text == raw.decode("utf-8", errors="replace")  # ... shown cleanly
    assert "\ufffd" in result.text
    for piece in pieces:
        piece.encode("utf-8")  # no lone surrogates or half characters in any streamed piece
    e.close()


# --- vocabularies -------------------------------------------------------------------------------


def test_incompatible_vocabularies_are_refused(tiny_models):
    with pytest.raises(SpecllmError, match=r"token 261 differs \('.*' vs '.*'\)"):
        check_pair(tiny_models.target, tiny_models.incompatible)
    with pytest.raises(SpecllmError, match="cannot draft"):
        specllm.load(str(tiny_models.target), str(tiny_models.incompatible), n_ctx=256, n_threads=1)


def test_a_draft_with_a_slightly_larger_vocabulary_is_accepted(tiny_models):
    check_pair(tiny_models.target, tiny_models.extended)
    check_pair(tiny_models.target, tiny_models.draft)
    e = specllm.load(str(tiny_models.target), str(tiny_models.extended), n_ctx=256, n_threads=1)
    assert greedy(e, "import os", "model").tokens == greedy(e, "import os", "none").tokens
    e.close()


# --- drafters -----------------------------------------------------------------------------------


def test_ngram_drafter_drafts_only_after_a_long_enough_repeat():
    text = [7, 1, 2, 3, 4, 5, 6, 8, 9, 1, 2, 3, 4, 5, 6]  # "1 2 3 4 5 6" repeats: 6 tokens
    assert NgramDrafter(min_match=6).propose(text, 3).tokens == [8, 9, 1]
    assert NgramDrafter(min_match=7).propose(text, 3).tokens == []
    assert NgramDrafter(min_match=7).propose([7, *text[1:8], 7, *text[9:]], 3).tokens == [8, 7, 1]  # 7 now


def test_ngram_drafter_proposes_the_continuation_of_the_latest_match():
    d = NgramDrafter(max_ngram=3, min_ngram=2, min_match=2)
    ctx = [1, 2, 3, 4, 5, 9, 9, 2, 3, 4, 6, 7, 8, 2, 3, 4]
    assert d.propose(ctx, 3).tokens == [6, 7, 8]  # latest earlier "2 3 4" is followed by 6 7 8
    assert d.propose(ctx + [6], 2).tokens == [7, 8]  # incremental index, 3-gram "3 4 6"
    assert d.propose([1, 2, 3, 4], 3).tokens == []  # nothing repeats
    assert d.propose([5, 6, 5, 6], 4).tokens == [5, 6]  # a match near the end proposes what exists
    assert d.propose([7, 1, 2, 7, 1], 2).tokens == [2, 7]  # a new context resets the index


def test_model_drafter_needs_a_draft_model(tiny_models):
    e = specllm.load(str(tiny_models.target), n_ctx=256, n_threads=1)
    with pytest.raises(SpecllmError, match="draft model"):
        e.generate("hi", drafter="model")
    with pytest.raises(SpecllmError, match="unknown drafter"):
        e.generate("hi", drafter="magic")
    e.close()


def test_chat_template_is_applied_when_asked(engine):
    raw = engine.prompt_tokens("hi")
    chat = engine.prompt_tokens("hi", chat=True, system="be brief")
    text = engine.target.detokenize(chat).decode()
    assert len(chat) > len(raw) and chat.count(engine.target.bos) <= 1
    assert "be brief" in text and "hi" in text
    assert 3 in chat  # <|im_start|> was parsed as the special token, not as text
