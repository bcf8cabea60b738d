"""The engine on real llama.cpp with tiny generated models."""

import codecs
import copy
import gc
import os
import random
import signal
import sys
import threading
import time

import llama_cpp
import numpy as np
import pytest
from slowed import SLOW_CALL, closed_from_another_thread, slowed
from stats import SAMPLER, chi_square_pvalue, target_joint_distribution

import specllm
from specllm.engine.drafters import Draft, NgramDrafter, NoDrafter
from specllm.engine.loop import Engine, Finished, GenerationConfig, Step
from specllm.engine.names import Drafter
from specllm.engine.sampling import SamplerSettings, distribution
from specllm.engine.text import TextStream
from specllm.errors import Interrupted, SpecllmError
from specllm.llama.model import Model, common_prefix, interruptible
from specllm.llama.options import ModelOptions
from specllm.llama.vocab import ensure_compatible

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


@pytest.mark.parametrize("one_token", [True, False])
def test_a_draft_on_cuda_graphs_catches_up_one_token_a_call(tiny_models, one_token):
    """With CUDA graphs (Model.one_token_catch_up) a draft feeds the 2 tokens it has not seen after
    a fully accepted draft as two one-token calls, keeping every drafting call one token wide; the
    output is the same. The draft here is the target itself, so every draft is accepted whole."""
    e = specllm.load(str(tiny_models.target), str(tiny_models.target), n_ctx=256, n_threads=1)
    try:
        widths, real_eval = [], e.draft.eval
        e.draft.eval = lambda tokens, n_logits=1: widths.append(len(tokens)) or real_eval(tokens, n_logits)
        e.draft.one_token_catch_up = one_token
        expected = greedy(e, PROMPTS[0], "none").tokens
        result = greedy(e, PROMPTS[0], "model", gamma=4)
        assert result.tokens == expected
        assert result.stats.acceptance_rate == 1.0 and result.stats.n_drafted >= 32
        drafting = widths[1:]  # after the prompt's prefill
        assert drafting and (set(drafting) == {1}) == one_token, widths
    finally:
        e.close()


def test_greedy_runs_really_speculate(engine):
    """Guard against a vacuous equality test: drafts were made and mostly accepted."""
    model = greedy(engine, PROMPTS[0], "model", 4).stats
    assert model.n_drafted > 20 and 0.3 < model.acceptance_rate < 1.0
    assert model.mean_accepted_length > 1.5
    ngram = engine.generate(PROMPTS[2], max_tokens=48, temperature=0, drafter="ngram", gamma=4).stats
    assert ngram.n_drafted > 0


def test_stats_add_up_over_positions_sources_and_calls(engine):
    steps, r = steps_and_result(engine, PROMPTS[1], max_tokens=48, temperature=0, drafter="model", gamma=4)
    s = r.stats
    assert s.generated_tokens == len(r.tokens) == 48
    assert s.n_drafted == sum(s.drafted_per_position)
    assert s.n_accepted == sum(s.accepted_per_position)
    assert len(s.drafted_per_position) == 4
    # per position: the steps whose draft reached it, and those whose accepted prefix did
    assert s.drafted_per_position == [sum(len(st.drafted) > i for st in steps) for i in range(4)]
    assert s.accepted_per_position == [sum(st.accepted > i for st in steps) for i in range(4)]
    assert s.target_calls == len(steps) and s.drafted_per_position[0] >= s.target_calls - 1  # the last may not draft
    assert all(a <= d for a, d in zip(s.accepted_per_position, s.drafted_per_position))
    # every target call emits its accepted drafts plus one token of its own (the last may be cut)
    assert s.n_accepted + s.target_calls >= s.generated_tokens >= s.n_accepted + s.target_calls - 4
    assert s.acceptance_rate == pytest.approx(s.n_accepted / s.n_drafted)
    assert s.mean_accepted_length == pytest.approx(48 / s.target_calls)
    assert s.prompt_tokens == len(engine.prompt_tokens(PROMPTS[1]))
    assert s.draft_calls >= s.target_calls - 1
    assert s.decode_seconds > 0 and s.prefill_seconds > 0


def test_a_steps_stats_copied_with_to_dict_stay_as_they_were(engine):
    """python-api.md: copy (step.stats.to_dict()) what a step should remember of its Stats. The
    per-position counts and the policy were shared with the live Stats, and went on changing."""
    copies = []
    for event in engine.stream(PROMPTS[0], max_tokens=30, temperature=0, drafter="model", gamma=3):
        if isinstance(event, Step):
            copies.append((event.stats.to_dict(), repr(event.stats.to_dict())))
    assert [repr(d) for d, _ in copies] == [r for _, r in copies]
    assert len(copies) > 5 and copies[0][0]["drafted_per_position"] != copies[-1][0]["drafted_per_position"]
    stats = engine.generate(PROMPTS[0], max_tokens=4, temperature=0, drafter="auto").stats
    stats.to_dict()["policy"]["calibration"]["measured"].append("changed by the caller")
    assert "changed by the caller" not in stats.policy["calibration"]["measured"]


def test_decode_time_is_the_engines_own(engine):
    """A consumer that takes its time between events (rendering, a slow pipe) must not count in
    decode_seconds: an accounting check, not a benchmark (10 target calls on a tiny model take
    milliseconds; the consumer sleeps 2 s in all)."""
    import time

    slept = 0.0
    for event in engine.stream(PROMPTS[0], max_tokens=10, temperature=0, drafter="none"):
        if isinstance(event, Step):
            time.sleep(0.2)
            slept += 0.2
    stats = event.result.stats
    assert stats.target_calls == 10 and slept == pytest.approx(2.0)
    assert 0 < stats.decode_seconds < slept


@pytest.mark.parametrize("drafter", ["none", "model", "ngram"])
def test_the_loops_own_time_leaves_out_every_models_llama_cpp_calls(engine, monkeypatch, drafter):
    """llama_seconds holds the time of every call of the target's and the draft's: with each
    decode slowed by 5 ms, all of it is there, and none of it in the loop's time per step."""
    slowed(monkeypatch, "llama_decode", "llama_get_logits")  # on a GPU, fetching the logits is the wait
    s = engine.generate(PROMPTS[2], max_tokens=12, temperature=0, drafter=drafter, gamma=3).stats
    decodes = s.target_calls + s.draft_calls
    assert s.draft_calls > 0 or drafter != "model"
    assert SLOW_CALL * decodes <= s.llama_seconds < s.decode_seconds
    assert 0 < s.loop_seconds_per_step < SLOW_CALL
    assert s.to_dict()["loop_seconds_per_step"] == s.loop_seconds_per_step


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


# (target, draft, drafter, prompt): "scripted" proposes the target's greedy continuation, one-hot
JOINT_CASES = {
    "model drafter": ("target", "draft", "model", "the cat"),
    "one-hot drafter": ("target", None, "scripted", "the cat"),
    "n-gram drafter": ("target", None, "ngram", " ".join("abc" * 5)),  # it drafts "a b c": rarely accepted
    "draft vocab larger": ("target", "extra_heavy", "model", "the cat"),
    "target vocab larger": ("extra_heavy", "draft", "model", "the cat"),
}


@pytest.mark.parametrize("case", JOINT_CASES)
def test_first_three_tokens_follow_the_target_distribution(tiny_models, monkeypatch, case):
    """The joint distribution of the first three tokens, with drafts of three tokens: q rows 2..k,
    the batched p rows 2..k+1 and the draft's KV cache in sampling mode all take part."""
    target, draft, drafter, prompt = JOINT_CASES[case]
    e = load_pair(getattr(tiny_models, target), draft and getattr(tiny_models, draft), n_ctx=256)
    ids = e.prompt_tokens(prompt)
    if drafter == "scripted":
        use_drafter(monkeypatch, ScriptedDrafter(len(ids), greedy(e, ids, "none", max_tokens=4).tokens))
    joint = target_joint_distribution(getattr(tiny_models, target), ids)
    cells = sorted(joint)
    counts = dict.fromkeys(cells, 0)
    n, drafted, third, edge = 4000, 0, 0, 0
    n_target, n_draft = e.target.n_vocab, e.draft.n_vocab if e.draft else None
    for seed in range(n):
        kw = SAMPLER.__dict__ | {"seed": seed, "drafter": "none" if drafter == "scripted" else drafter}
        steps, r = steps_and_result(e, ids, max_tokens=4, gamma=3, **kw)
        counts[tuple(r.tokens[:3])] += 1  # a KeyError here is a sequence the target cannot produce
        drafted += len(steps[0].drafted) == 3
        third += steps[0].accepted == 3
        edge += any(t >= n_target for st in steps for t in st.drafted) or max(r.tokens) >= (n_draft or n_target)
    assert drafted > n / 2  # three-token drafts ...
    assert third > n / 50 or drafter == "ngram"  # ... some accepted to the end
    if "vocab" in case:
        assert edge > n / 50  # foreign ids were drafted / emitted
    observed = np.array([counts[c] for c in cells])
    assert chi_square_pvalue(observed, np.array([joint[c] for c in cells])) > 1e-3
    e.close()


# --- the sampler chain against llama.cpp's own -------------------------------------------------


def llama_cpp_chain(logits: np.ndarray, s: SamplerSettings) -> np.ndarray:
    """The processed distribution by llama.cpp's sampler chain, built through the low-level API in
    the order of llama-cpp-python's Llama.create_completion (top-k, typical, top-p, min-p, temp,
    dist): dist leaves the final probabilities of the kept tokens in the array."""
    import ctypes

    import llama_cpp as L

    n = logits.size
    data = (L.llama_token_data * n)()
    for i in range(n):
        data[i].id, data[i].logit, data[i].p = i, float(logits[i]), 0.0
    array = L.llama_token_data_array(data=data, size=n, selected=-1, sorted=False)
    chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    for sampler in (
        L.llama_sampler_init_top_k(s.top_k),
        L.llama_sampler_init_typical(1.0, 1),
        L.llama_sampler_init_top_p(s.top_p, 1),
        L.llama_sampler_init_min_p(s.min_p, 1),
        L.llama_sampler_init_temp(s.temperature),
        L.llama_sampler_init_dist(0),
    ):
        L.llama_sampler_chain_add(chain, sampler)
    L.llama_sampler_apply(chain, ctypes.byref(array))
    out = np.zeros(n)
    for i in range(array.size):
        out[data[i].id] = data[i].p
    L.llama_sampler_free(chain)
    return out


@pytest.mark.parametrize(
    "settings",
    [
        SamplerSettings(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),  # the CLI's defaults
        SamplerSettings(temperature=0.4, top_k=0, top_p=0.8, min_p=0.0),
        SamplerSettings(temperature=1.7, top_k=0, top_p=1.0, min_p=0.1),
        SamplerSettings(temperature=2.5, top_k=10, top_p=0.9, min_p=0.02),
    ],
)
def test_sampler_chain_matches_llama_cpp(engine, settings):
    """Same kept tokens and the same probabilities as llama.cpp's chain, on a real model's logits."""
    checked = 0
    for prompt in PROMPTS[:4]:
        logits = engine.target.sync(engine.prompt_tokens(prompt), n_logits=1)[0].copy()
        ours, theirs = distribution(logits, settings), llama_cpp_chain(logits, settings)
        np.testing.assert_array_equal(np.flatnonzero(ours), np.flatnonzero(theirs))
        np.testing.assert_allclose(ours, theirs, atol=1e-6)
        checked += np.count_nonzero(ours) > 1
    assert checked >= 2  # not only one-token distributions


def test_ties_at_the_cut_keep_as_many_tokens_as_llama_cpp():
    """At a tie at the top-k (or top-p) cut llama.cpp keeps the same number of tokens with the same
    probabilities, but which of the tied ids depends on its sort; specllm keeps the lowest ids."""
    logits = np.random.default_rng(0).normal(0, 1, 50).astype(np.float32) - 10
    logits[[3, 40, 7, 20]] = 5.0  # four tied, below one clear winner
    logits[30] = 6.0
    for settings in (
        SamplerSettings(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0),
        SamplerSettings(temperature=0.7, top_k=0, top_p=0.6, min_p=0.0),
    ):
        ours, theirs = distribution(logits, settings), llama_cpp_chain(logits, settings)
        assert np.count_nonzero(ours) == np.count_nonzero(theirs) == 3
        assert ours[30] > 0 and theirs[30] > 0
        np.testing.assert_allclose(np.sort(ours[ours > 0]), np.sort(theirs[theirs > 0]), atol=1e-6)
        assert set(np.flatnonzero(ours)) == {3, 7, 30}


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


def test_logit_rows_are_llama_cpps_rows_whatever_the_call_before(tiny_models):
    """eval hands out numpy views kept per buffer address and row count: calls of growing and
    shrinking widths (llama.cpp moves its output buffer when it grows) still read each row where
    llama.cpp wrote it."""
    import llama_cpp as L

    model = Model(tiny_models.target, ModelOptions(n_ctx=512, n_threads=1))
    prefix = model.tokenize("def f(x): return x")
    model.eval(prefix, 1)
    for width in (1, 3, 40, 2, 200, 5, 1):
        rows = model.eval(list(range(300, 300 + width)), width)
        from_llama = [
            np.ctypeslib.as_array(L.llama_get_logits_ith(model._ctx, i), shape=(model.n_vocab,)) for i in range(width)
        ]
        np.testing.assert_array_equal(rows, np.stack(from_llama))
        model.truncate(len(prefix))
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


def test_the_common_prefix_is_found_wherever_the_lists_part():
    rng = random.Random(1)
    for length in (0, 1, 15, 16, 17, 63, 64, 65, 191, 192, 193, 1000, 5000):
        a = [rng.randrange(2) for _ in range(length)]
        for part in {0, 1, length // 3, length - 17, length - 1, length}:
            part = max(0, part)
            for tail in ([], [2], [2, 0, 1] * 100, a[part:][1:]):
                b = a[:part] + tail
                expected = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                assert common_prefix(a, b) == common_prefix(b, a) == expected


def test_finding_the_common_prefix_of_a_long_context_reads_few_tokens_one_by_one():
    """A draft model's cache is checked against the context on every step: a Python loop over
    the whole context made each step of a long generation slower. Slices are compared in C; the
    tokens read one at a time in Python are counted."""

    class Counted(list):
        reads = 0

        def __getitem__(self, i):
            if isinstance(i, int):
                Counted.reads += 1
            return super().__getitem__(i)

    context = Counted(range(1000, 101_000))
    cached = Counted([*context[:-1], 7])  # its last token differs
    Counted.reads = 0
    assert common_prefix(context, cached) == len(context) - 1
    assert Counted.reads <= 2 * 16


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


def test_an_eos_token_ends_the_generation_where_it_is_produced(tiny_models, tmp_path):
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


class ScriptedDrafter(NoDrafter):
    """Proposes the next tokens of a fixed script, from the position the generation has reached
    (one-hot q), whatever was emitted so far."""

    name = "scripted"

    def __init__(self, prompt_length: int, script: list[int]):
        self.prompt_length, self.script = prompt_length, script

    def propose(self, context: list[int], gamma: int) -> Draft:
        at = len(context) - self.prompt_length
        return Draft(list(self.script[at : at + gamma]))


def use_drafter(monkeypatch, drafter) -> None:
    """Make every generation use `drafter` (a test drafter is not among the engine's names)."""
    import specllm.engine.loop

    monkeypatch.setattr(specllm.engine.loop._Run, "_make_drafter", lambda run, engine: drafter)


def test_eos_inside_an_accepted_draft(tiny_models, tmp_path, monkeypatch):
    """The draft holds EOS in its middle and the target accepts all of it: generation ends at the
    EOS; the draft tokens after it were never emitted, so they count in no stats."""
    import tiny_models as tm

    base = specllm.load(str(tiny_models.target), n_ctx=256, n_threads=1)
    script = greedy(base, "import os", "none", max_tokens=12).tokens
    base.close()
    eos = script[3]
    first = script.index(eos)
    assert first + 1 < 8
    e = specllm.load(str(tm.write_model(tmp_path / "eos.gguf", seed=0, eos_token_id=eos)), n_ctx=256, n_threads=1)
    prompt = e.prompt_tokens("import os")
    use_drafter(monkeypatch, ScriptedDrafter(len(prompt), script))
    steps, r = steps_and_result(e, prompt, max_tokens=40, temperature=0, drafter="none", gamma=8)
    assert r.stop_reason == "eos" and r.tokens == script[:first]
    assert len(steps) == 1 and steps[0].drafted == script[:8] and steps[0].token == -1
    assert steps[0].accepted == first + 1  # up to and including the EOS
    s = r.stats
    assert (s.n_drafted, s.n_accepted, s.generated_tokens, s.target_calls) == (8, first + 1, first, 1)
    assert s.accepted_per_position == [1] * (first + 1) + [0] * (7 - first)
    e.close()


def test_stop_string_inside_an_accepted_draft(engine, monkeypatch):
    """The draft completes a stop string in its middle: the text ends before it, and only the draft
    tokens up to the one that completed it count as accepted."""
    full = greedy(engine, PROMPTS[1], "none", max_tokens=12)
    script = full.tokens
    texts = [engine.target.detokenize(script[:n]).decode("utf-8", errors="replace") for n in range(13)]
    stop = next(
        full.text[i : i + 3]
        for i in range(len(texts[1]), len(texts[6]))
        if full.text.index(full.text[i : i + 3]) == i and "\ufffd" not in full.text[i : i + 3]
    )
    completed = next(n for n in range(13) if stop in texts[n])
    assert 2 <= completed < 8  # in the middle of the first draft
    prompt = engine.prompt_tokens(PROMPTS[1])
    use_drafter(monkeypatch, ScriptedDrafter(len(prompt), script))
    steps, r = steps_and_result(engine, prompt, max_tokens=40, temperature=0, drafter="none", gamma=8, stop=stop)
    assert r.stop_reason == "stop" and r.text == full.text[: full.text.index(stop)]
    assert r.tokens == script[:completed] and steps[0].accepted == completed
    s = r.stats
    assert (s.n_drafted, s.n_accepted, s.target_calls) == (8, completed, 1)
    assert s.accepted_per_position == [1] * completed + [0] * (8 - completed)


def test_max_tokens_and_stop_strings(engine):
    full = greedy(engine, PROMPTS[1], "model", max_tokens=40)
    assert full.stop_reason == "max_tokens"
    for n in (1, 2, 7):
        assert greedy(engine, PROMPTS[1], "model", 8, max_tokens=n).tokens == full.tokens[:n]
    stop = full.text[10:14]
    cut = full.text.index(stop)
    r = engine.generate(PROMPTS[1], max_tokens=40, temperature=0, drafter="model", stop=["never there", stop])
    assert r.stop_reason == "stop" and r.stop_string == stop and full.stop_string is None
    assert r.text == full.text[:cut]
    streamed = "".join(
        e.accepted_text + e.token_text
        for e in engine.stream(PROMPTS[1], max_tokens=40, temperature=0, stop=[stop])
        if isinstance(e, Step)
    )
    assert streamed == full.text[:cut]


def test_gamma_at_the_batch_limit(tiny_models):
    """A verify call on gamma + 1 tokens must fit in one batch: n_batch - 1 works, n_batch is refused
    up front (by the engine, the CLI's option check and chat's /gamma), not mid-generation."""
    from specllm.chat.repl import command
    from specllm.chat.session import ChatSession
    from specllm.cli.main import check_options
    from specllm.engine.loop import GenerationConfig

    e = load_pair(tiny_models.target, tiny_models.draft, n_ctx=256, n_batch=16)
    assert e.target.n_batch == 16
    prompt = e.prompt_tokens(PROMPTS[0])
    r = e.generate(prompt, max_tokens=40, temperature=0, drafter="model", gamma=15)
    assert len(r.stats.drafted_per_position) == 15  # a 15-token draft was verified in one call
    assert r.tokens == greedy(e, prompt, "none", max_tokens=40).tokens
    with pytest.raises(SpecllmError, match="at most 15"):
        e.stream(prompt, max_tokens=40, temperature=0, drafter="model", gamma=16)
    session = ChatSession(e, GenerationConfig(gamma=4))
    with pytest.raises(SpecllmError, match="at most 15"):
        command(session, "/gamma 16")
    assert session.config.gamma == 4
    assert command(session, "/gamma 15").text == "gamma 15" and session.config.gamma == 15
    e.close()
    check_options(8, "ngram", 511, {}, ctx_size=4096)
    check_options(8, "ngram", 255, {}, ctx_size=256)  # llama.cpp caps the batch at the context
    for gamma, ctx_size in ((512, 4096), (600, 4096), (256, 256)):
        with pytest.raises(SpecllmError, match="gamma"):
            check_options(8, "ngram", gamma, {}, ctx_size=ctx_size)


def test_one_stop_string_is_one_stop(engine):
    """GenerationConfig(stop="END") stops at "END", not at "E", "N" or "D"."""
    from specllm.engine.loop import GenerationConfig

    assert GenerationConfig(stop="END").stop == ("END",)
    assert GenerationConfig(stop=["a", "bc"]).stop == ("a", "bc")
    full = greedy(engine, PROMPTS[1], "model", max_tokens=40)
    stop = next(full.text[i : i + 4] for i in range(8, 30) if len(set(full.text[i : i + 4])) == 4)
    assert any(full.text.index(c) < full.text.index(stop) for c in stop)  # one letter comes earlier
    config = GenerationConfig(max_tokens=40, sampler=SamplerSettings(temperature=0), stop=stop)
    r = engine.generate(PROMPTS[1], config=config)
    assert r.stop_reason == "stop" and r.text == full.text[: full.text.index(stop)]


def test_a_stop_string_that_is_not_utf8_is_refused(engine):
    """A lone surrogate (bytes that were not UTF-8, "\\ud800" in JSON) is no text a model writes:
    such a stop string was taken and never stopped anything; --stop refuses it too."""
    for stop in ("\ud800", ["END", "x\udcff"]):
        with pytest.raises(SpecllmError, match="a stop string is not valid UTF-8"):
            engine.generate(PROMPTS[0], max_tokens=4, temperature=0, stop=stop)


def test_a_config_and_keywords_together_are_refused(engine):
    from specllm.engine.loop import GenerationConfig

    with pytest.raises(TypeError, match="not both"):
        engine.stream(PROMPTS[0], GenerationConfig(), temperature=0)


def test_a_second_live_stream_is_refused(engine):
    """Streams share the engine's KV caches: a second one is refused while the first runs; a
    finished or closed stream releases the engine."""
    expected = greedy(engine, PROMPTS[0], "model", max_tokens=20).tokens
    first = engine.stream(PROMPTS[0], max_tokens=20, temperature=0, drafter="model")
    next(first)
    with pytest.raises(SpecllmError, match="another stream"):
        engine.stream(PROMPTS[1], max_tokens=20, temperature=0)
    assert list(first)[-1].result.tokens == expected  # the first went on undisturbed
    closed = engine.stream(PROMPTS[1], max_tokens=20, temperature=0)
    next(closed)
    closed.close()
    a = engine.stream(PROMPTS[0], max_tokens=20, temperature=0, drafter="model")
    b = engine.stream(PROMPTS[1], max_tokens=20, temperature=0)  # created, not started: allowed
    next(a)
    with pytest.raises(SpecllmError, match="another stream"):
        next(b)  # ... but refused once it would run while the first is live
    assert list(a)[-1].result.tokens == expected
    assert list(b)[-1].result.tokens == greedy(engine, PROMPTS[1], "none", max_tokens=20).tokens  # and runs after
    assert greedy(engine, PROMPTS[0], "model", max_tokens=20).tokens == expected


def test_a_refused_generation_can_start_once_the_engine_is_free(engine):
    expected = greedy(engine, PROMPTS[1], "none", max_tokens=12).tokens
    first = engine.start(PROMPTS[0], max_tokens=12, temperature=0)
    waiting = engine.start(PROMPTS[1], max_tokens=12, temperature=0)
    next(first)
    with pytest.raises(SpecllmError, match="another stream"):
        next(waiting)
    first.close()
    assert waiting.run().tokens == expected


def test_a_closed_engine_refuses_every_call_in_one_line(tiny_models):
    """llama.cpp's freed models are never touched again: using them aborts the process."""

    def fresh():
        return specllm.load(str(tiny_models.target), str(tiny_models.draft), n_ctx=256, n_threads=1)

    closed = fresh()
    closed.close()
    closed.close()  # twice is fine
    for call in (
        lambda: closed.generate(PROMPTS[0], max_tokens=4),
        lambda: closed.prompt_tokens(PROMPTS[0]),
        lambda: closed.chat_prompt(PROMPTS[0]),
        lambda: closed.lane(),
    ):
        with pytest.raises(SpecllmError, match="engine is closed"):
            call()
    message = [{"role": "user", "content": PROMPTS[0]}]
    for call in (  # its models, which the API names too (engine.target.render_chat)
        lambda: closed.target.render_chat(message),
        lambda: closed.target.tokenize(PROMPTS[0]),
        lambda: closed.target.piece(closed.target.n_vocab - 1),
        lambda: closed.target.metadata("general.architecture"),
        lambda: closed.draft.is_eog(0),
    ):
        with pytest.raises(SpecllmError, match=r"\.gguf is closed: load the model again"):
            call()
    during = fresh()  # closed while a stream holds a step, or between start and its first step
    started = during.start(PROMPTS[0], max_tokens=8)
    stream = during.stream(PROMPTS[0], max_tokens=8, drafter="model")
    next(stream)
    during.close()
    with pytest.raises(SpecllmError, match="engine is closed"):
        list(stream)
    assert list(stream) == []  # ended: no Finished without a result
    with pytest.raises(SpecllmError, match="engine is closed"):
        next(started)


def test_a_closed_engine_loads_no_deferred_draft(tiny_models):
    """load_draft() (chat's /drafter model calls it) loaded the deferred draft into a closed
    engine, which held it, its weights and its context, until it was closed again or dropped."""
    engine = specllm.load(str(tiny_models.target), str(tiny_models.draft), n_ctx=256, n_threads=1, defer_draft=True)
    engine.close()
    with pytest.raises(SpecllmError, match="engine is closed"):
        engine.load_draft()
    assert engine.draft is None


def test_closing_an_engine_closes_its_lanes(tiny_models):
    """A lane's KV caches live on its engine's weights: once they are freed, using the lane
    (which aborted the process) raises SpecllmError, and a lane's stream under way stops."""
    engine = specllm.load(str(tiny_models.target), str(tiny_models.draft), n_ctx=256, n_threads=1)
    lane, other = engine.lane(), engine.lane()
    stream = lane.stream(PROMPTS[0], max_tokens=8, drafter="model")
    next(stream)
    engine.close()
    assert lane.closed and other.closed
    with pytest.raises(SpecllmError, match="engine is closed"):
        list(stream)
    with pytest.raises(SpecllmError, match="engine is closed"):
        other.generate(PROMPTS[0], max_tokens=4)
    lane.close()  # closing it again is fine


def test_closing_an_engine_from_another_thread_waits_for_the_step_under_way(tiny_models, monkeypatch):
    """close() from another thread used to free the models while llama.cpp was evaluating on them
    (a segmentation fault): it now waits for the step, and the generation stops at its next one."""
    engine = specllm.load(str(tiny_models.target), str(tiny_models.draft), n_ctx=256, n_threads=1)
    slowed(monkeypatch, "llama_decode")  # each step spends most of its time inside llama.cpp
    first_step, outcome = threading.Event(), []

    def generate():
        try:
            for _ in engine.stream(PROMPTS[0], max_tokens=200, temperature=0, drafter="model"):
                first_step.set()
        except SpecllmError as e:
            outcome.append(str(e))

    worker = threading.Thread(target=generate)
    worker.start()
    first_step.wait()
    engine.close()
    worker.join()
    assert outcome == ["this engine is closed: load the models again"]


def test_a_generation_closed_from_another_thread_stops_after_the_step_under_way(engine, monkeypatch):
    """Its close() raised "generator already executing" while the other thread was in a step,
    and the generation went on to the end."""
    slowed(monkeypatch, "llama_decode")
    generation = engine.start(PROMPTS[0], max_tokens=200, temperature=0, drafter="model")
    steps = closed_from_another_thread(generation)
    assert not generation.finished and len(steps) < 50
    assert engine.generate(PROMPTS[1], max_tokens=4, temperature=0).stats.generated_tokens == 4


def test_closing_an_engine_from_another_thread_waits_for_a_generation_being_prepared(tiny_models, monkeypatch):
    """start() reads the models before the first step (the n-gram drafter's markup tokens, here
    read for the first time): a close() from another thread meanwhile freed the vocabulary under
    it (a segmentation fault)."""
    engine = specllm.load(str(tiny_models.target), n_ctx=256, n_threads=1)
    reading, is_control, freed_while_reading = threading.Event(), llama_cpp.llama_vocab_is_control, []

    def slow_first_read(*args):
        if not reading.is_set():
            reading.set()
            time.sleep(0.2)  # the other thread closes the engine now
            freed_while_reading.append(engine.target._model is None)
        return is_control(*args)

    monkeypatch.setattr(llama_cpp, "llama_vocab_is_control", slow_first_read)
    closer = threading.Thread(target=lambda: reading.wait() and engine.close())
    closer.start()
    generation = engine.start(PROMPTS[0], max_tokens=8, drafter="ngram")
    closer.join()
    assert freed_while_reading == [False]
    with pytest.raises(SpecllmError, match="engine is closed"):
        next(generation)


def test_an_engine_closed_by_a_signal_handler_mid_step_is_freed_when_the_step_ends(tiny_models, monkeypatch):
    """A handler runs between any two lines of the step under way: the step's next llama.cpp
    calls went on with freed models (a segmentation fault)."""
    engine = specllm.load(str(tiny_models.target), str(tiny_models.draft), n_ctx=256, n_threads=1)
    _close_by_a_signal_mid_step(engine, engine, monkeypatch)
    assert engine.closed and engine.target._ctx is None and engine.draft._ctx is None  # freed


def test_an_engine_closed_mid_step_of_its_lane_keeps_the_weights_until_the_lane_lets_go(tiny_models, monkeypatch):
    """A signal handler closes the engine while one of its lanes is in a step: the lane's close
    waits for the step's end, and the engine's freed the weights the step was still using (a
    segmentation fault). The weights now go with the last model on them."""
    engine = specllm.load(str(tiny_models.target), str(tiny_models.draft), n_ctx=256, n_threads=1)
    lane = engine.lane()
    _close_by_a_signal_mid_step(engine, lane, monkeypatch)
    assert lane.closed and lane.target._model is None and lane.draft._model is None
    assert engine.target._weights_users == engine.draft._weights_users == [0]  # freed, once


def _close_by_a_signal_mid_step(engine, generating, monkeypatch):
    """`generating` generates; a signal handler closes `engine` right after its sixth llama_decode."""
    previous = signal.signal(signal.SIGUSR1, lambda *_: engine.close())
    decode, calls = llama_cpp.llama_decode, []

    def decode_then_signal(*args):
        status = decode(*args)
        calls.append(status)
        if len(calls) == 6:
            signal.raise_signal(signal.SIGUSR1)
        return status

    monkeypatch.setattr(llama_cpp, "llama_decode", decode_then_signal)
    try:
        with pytest.raises(SpecllmError, match="engine is closed"):
            generating.generate(PROMPTS[0], max_tokens=100, temperature=0, drafter="model")
    finally:
        signal.signal(signal.SIGUSR1, previous)


@pytest.mark.parametrize("models, name", [("tiny_models", "target"), ("tiny_recurrent_models", "qwen35_mtp")])
def test_an_interrupt_right_after_a_free_never_frees_twice(request, monkeypatch, models, name):
    """Ctrl-C landing as close() frees a context: the next close() (a program's cleanup) or the
    garbage collector freed it a second time, a segmentation fault."""
    engine = specllm.load(str(getattr(request.getfixturevalue(models), name)), n_ctx=256, n_threads=1)
    free = llama_cpp.llama_free

    def free_then_interrupt(ctx):
        free(ctx)
        signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(llama_cpp, "llama_free", free_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        engine.close()
    monkeypatch.setattr(llama_cpp, "llama_free", free)
    engine.close()
    assert engine.target._ctx is None and engine.target._model is None
    del engine
    gc.collect()


@pytest.mark.parametrize("models, name", [("tiny_models", "target"), ("tiny_recurrent_models", "qwen35_mtp")])
def test_a_second_ctrl_c_while_dropped_models_are_freed_is_no_traceback(request, monkeypatch, models, name):
    """A command interrupted by Ctrl-C frees its models on its way out, as their last reference
    goes (__del__): a second Ctrl-C landing there printed "Exception ignored in Model.__del__"
    with a traceback, and the weights were never freed."""
    engine = specllm.load(str(getattr(request.getfixturevalue(models), name)), n_ctx=256, n_threads=1)
    assert (engine.mtp is not None) == (name == "qwen35_mtp")  # its MTP head is freed so too
    free, free_weights, weights_freed, unraisable = llama_cpp.llama_free, llama_cpp.llama_model_free, [], []

    def free_then_interrupt(ctx):
        free(ctx)
        signal.raise_signal(signal.SIGINT)

    def free_weights_counted(model):
        free_weights(model)
        weights_freed.append(model)

    monkeypatch.setattr(llama_cpp, "llama_free", free_then_interrupt)
    monkeypatch.setattr(llama_cpp, "llama_model_free", free_weights_counted)
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    del engine
    gc.collect()
    assert [u.exc_type for u in unraisable] == [] and len(weights_freed) == 1


def test_generate_takes_a_config_as_stream_does(engine):
    from specllm.engine.loop import GenerationConfig

    config = GenerationConfig(max_tokens=8, sampler=SamplerSettings(temperature=0), drafter="model")
    assert engine.generate(PROMPTS[0], config).tokens == greedy(engine, PROMPTS[0], "none", max_tokens=8).tokens


@pytest.mark.parametrize("config", [{}, {"max_tokens": 2}, 8, "max_tokens=2"])
def test_a_config_that_is_not_a_generation_config_is_refused_in_one_line(engine, config):
    with pytest.raises(SpecllmError, match="config must be a GenerationConfig"):
        engine.generate(PROMPTS[0], config)


@pytest.mark.parametrize(
    "options",
    [
        dict(seed=-1),
        dict(seed=2**32),
        dict(seed="1"),
        dict(stop=5),
        dict(stop=["a", 5]),
        dict(stop=b"x"),
        dict(max_tokens=None),
        dict(max_tokens="10"),
        dict(max_tokens=2.5),
        dict(max_tokens=True),
        dict(temperature="0"),
        dict(temperature=None),
        dict(top_k=1.5),
        dict(top_p="0.9"),
        dict(temperature=10**400),  # beyond a float's range: an OverflowError before
        dict(min_p=-(10**400)),
        dict(gamma="4"),
        dict(gamma=2.5),
    ],
)
def test_options_of_a_wrong_type_from_python_are_refused_in_one_line(engine, options):
    with pytest.raises(SpecllmError, match=f"{next(iter(options)).replace('_', '.')}"):
        engine.generate(PROMPTS[0], **options)


def test_the_generation_keywords_a_type_checker_sees_are_the_configs_and_its_samplers():
    """GenerationOptions types generate's keywords: the options make_config takes, no fewer."""
    from dataclasses import fields

    from specllm.engine.loop import GenerationConfig, GenerationOptions

    config, sampler = {f.name for f in fields(GenerationConfig)}, {f.name for f in fields(SamplerSettings)}
    assert set(GenerationOptions.__annotations__) == config | sampler


def test_a_sampler_is_taken_as_a_keyword_or_its_keywords_but_not_both(engine):
    """sampler= was "GenerationConfig() got multiple values for keyword argument 'sampler'"."""
    expected = greedy(engine, PROMPTS[0], "none", max_tokens=6).tokens
    assert engine.generate(PROMPTS[0], max_tokens=6, sampler=SamplerSettings(temperature=0)).tokens == expected
    with pytest.raises(TypeError, match="^give a sampler or its keywords, not both \\(got sampler and seed, top_k\\)$"):
        engine.generate(PROMPTS[0], sampler=SamplerSettings(), top_k=5, seed=1)
    with pytest.raises(SpecllmError, match="sampler must be a SamplerSettings, got"):
        engine.generate(PROMPTS[0], sampler={"temperature": 0})


@pytest.mark.parametrize("drafter", [None, "ngram", Drafter.NGRAM])
def test_a_configs_drafter_is_its_plain_name_however_given(drafter):
    """The default was the enum (repr: drafter=<Drafter.AUTO: 'auto'>), a name given a str."""
    config = GenerationConfig() if drafter is None else GenerationConfig(drafter=drafter)
    name = "auto" if drafter is None else "ngram"
    assert type(config.drafter) is str and f"drafter='{name}'" in repr(config)


def test_whole_numbers_of_any_integer_type_and_no_stop_are_taken(engine):
    expected = greedy(engine, PROMPTS[0], "none", max_tokens=6).tokens
    numpy_ints = dict(max_tokens=np.int64(6), gamma=np.int32(2), seed=np.uint32(3), top_k=np.int64(40))
    assert engine.generate(PROMPTS[0], temperature=0, stop=None, drafter="model", **numpy_ints).tokens == expected


@pytest.mark.parametrize(
    "prompt, options, message",
    [
        (b"import os", {}, "a prompt is text"),
        ([1, 300, 100000], {}, "token id 100000 is outside the vocabulary"),
        ([-1], {}, "token id -1 is outside"),
        (["a"], {}, "a token id must be a whole number"),
        ({5, 300, 7}, {}, "a prompt's token ids are a list, in order, not a set"),
        ({5: "a"}, {}, "a prompt's token ids are a list, in order, not a dict"),
        ([1.7, 300], {}, "a token id must be a whole number"),
        ([1, 2], {"chat": True}, "token ids are used as given"),
        (PROMPTS[0], {"system": "Be brief."}, "needs chat=True"),
        (PROMPTS[0], {"chat": "no"}, "chat must be True or False"),
        (PROMPTS[0], {"chat": 1}, "chat must be True or False"),
        (PROMPTS[0], {"chat": True, "system": 5}, "a system message is text"),
        (PROMPTS[0], {"chat": True, "system": ["Be brief."]}, "a system message is text"),
    ],
)
def test_bad_prompts_from_python_are_refused_in_one_line(engine, prompt, options, message):
    with pytest.raises(SpecllmError, match=message):
        engine.generate(prompt, max_tokens=2, **options)


@pytest.mark.parametrize(
    "gamma, message",
    [(2.5, "fixed_gamma must be a whole number"), ("4", "fixed_gamma must be a whole number"), (None, "whole"),
     (0, "fixed_gamma must be >= 1, got 0"), (10**6, "gamma must be at most")],
)  # fmt: skip
def test_an_engines_fixed_gamma_is_checked_when_set(engine, gamma, message):
    """2.5 had the draft model draft until its context was full; "4" and None raised a TypeError."""
    with pytest.raises(SpecllmError, match=message):
        engine.fixed_gamma = gamma
    assert engine.fixed_gamma == 4
    engine.fixed_gamma = 3
    try:
        assert engine.generate("def f(x):", max_tokens=12, temperature=0, drafter="model").stats.draft_calls > 0
    finally:
        engine.fixed_gamma = 4


@pytest.mark.parametrize(
    "arguments, message",
    [
        ((None,), "a message is text"),
        ((["hi"],), "a message is text"),
        (("hi", 5), "a system message is text"),
        (("hi", None, ["enable_thinking"]), "variables are a dict of names"),
        (("hi", None, {1: False}), "variables are a dict of names"),
        (
            ("hi", None, {"add_generation_prompt": False}),
            "variables cannot set add_generation_prompt: the rendering sets it$",
        ),
        (("hi", None, {"range": 5, "bos_token": "x"}), "cannot set bos_token, range: the rendering sets them"),
    ],
)
def test_chat_prompts_bad_arguments_are_named_not_blamed_on_the_template(engine, arguments, message):
    """They were refused as "the chat template ... failed", which points at the model file."""
    with pytest.raises(SpecllmError, match=message):
        engine.chat_prompt(*arguments)


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


def test_the_stop_string_found_first_is_told_the_first_given_of_those_at_one_place():
    stream = TextStream(stop=("xyz", "D", "c E", "c"))
    stream.push(b"abc END")
    assert stream.text == "ab" and stream.stop_string == "c E"


def test_a_long_stop_string_costs_a_push_only_the_text_still_held_back():
    """A client may send a stop string of 100k characters. Each push looked for its start all
    over the text, a cost of the text's length squared: four such strings made 3000 tokens of a
    tiny model take 74 s instead of 7."""
    stream = TextStream(stop=("\x00" * 100_000,))
    suffixes_tried = 0

    def count(frame, event, arg):
        nonlocal suffixes_tried
        suffixes_tried += event == "c_call" and getattr(arg, "__name__", "") == "endswith"

    sys.setprofile(count)
    try:
        shown = "".join(stream.push(b"text") for _ in range(1000))
    finally:
        sys.setprofile(None)
    assert shown == "text" * 1000
    assert suffixes_tried <= 4 * 1000  # the 4 characters a push holds back; the whole text: 2 million


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


def test_a_stop_string_the_last_unfinished_character_completes_ends_as_a_stop(tiny_models):
    """At max_tokens the last bytes may be an unfinished character, shown as U+FFFD only when the
    text is finished: a stop string that this completes cuts the text, and the generation says
    it ended at a stop string, not at max_tokens."""
    e = specllm.load(str(tiny_models.bytes), n_ctx=256, n_threads=1)
    options = dict(temperature=0, drafter="none")
    n, whole = _ending_in_an_unfinished_character(e, e.generate("hello", max_tokens=60, **options).tokens)
    stop = whole[-2:]  # the character before and the U+FFFD that only the end adds
    for drafter in ("none", "ngram"):
        result = e.generate("hello", max_tokens=n, stop=[stop], **options | dict(drafter=drafter))
        assert (result.text, result.stop_reason) == (whole[:-2], "stop")
    e.close()


def _ending_in_an_unfinished_character(e, tokens: list[int]) -> tuple[int, str]:
    """The first n of `tokens` whose text ends in an unfinished character, after a character of
    its own, the two found nowhere before; and that text, finished."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text = ""
    for n, token in enumerate(tokens, 1):
        text += decoder.decode(e.target.piece(token))
        whole = text + copy.deepcopy(decoder).decode(b"", final=True)
        end = whole[len(text) - 1 :]
        if len(end) == 2 and end[0] != end[1] == "\ufffd" and whole.find(end) == len(whole) - 2:
            return n, whole
    raise AssertionError("no prefix of the generation ends in an unfinished character")


# --- vocabularies -------------------------------------------------------------------------------


@pytest.mark.parametrize("target, draft", [(None, None), ("T", b"D"), (b"T", None), (3, None), ("T", 3)])
def test_a_model_that_is_not_a_path_is_refused_as_such(tiny_models, target, draft):
    """None, bytes or a number was "model file not found: b'...'", even for a file that exists."""
    spelled = {"T": str(tiny_models.target), b"T": bytes(tiny_models.target), b"D": bytes(tiny_models.draft)}
    wrong = "target" if draft is None else "draft"
    with pytest.raises(SpecllmError, match=f"^{wrong} is a model file's path \\(a str or a Path\\), not "):
        specllm.load(spelled.get(target, target), spelled.get(draft, draft), n_ctx=256, n_threads=1)


def test_incompatible_vocabularies_are_refused(tiny_models):
    with pytest.raises(SpecllmError, match=r"token 261 differs \('.*' vs '.*'\)"):
        ensure_compatible(tiny_models.target, tiny_models.incompatible)
    with pytest.raises(SpecllmError, match="cannot draft"):
        specllm.load(str(tiny_models.target), str(tiny_models.incompatible), n_ctx=256, n_threads=1)


def test_a_draft_with_a_slightly_larger_vocabulary_is_accepted(tiny_models):
    ensure_compatible(tiny_models.target, tiny_models.extended)
    ensure_compatible(tiny_models.target, tiny_models.draft)
    e = specllm.load(str(tiny_models.target), str(tiny_models.extended), n_ctx=256, n_threads=1)
    assert greedy(e, "import os", "model").tokens == greedy(e, "import os", "none").tokens
    e.close()


def load_pair(target, draft, n_ctx=256, **options) -> Engine:
    """An engine on two model files (options such as n_batch that specllm.load does not take)."""
    opts = ModelOptions(n_ctx=n_ctx, n_threads=1, **options)
    return Engine(Model(target, opts), Model(draft, opts) if draft else None)


FULL_SAMPLING = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)


def steps_and_result(engine, prompt, **kwargs):
    events = list(engine.stream(prompt, **kwargs))
    return events[:-1], events[-1].result


def test_draft_tokens_the_target_lacks_are_rejected_unseen(tiny_models):
    """A draft vocabulary larger than the target's: the draft proposes ids the target lacks. They
    are rejected (p = 0) without reaching the target, and shown with the draft's own text."""
    e = load_pair(tiny_models.target, tiny_models.extra_heavy)
    n_target = e.target.n_vocab
    assert e.draft.n_vocab > n_target
    foreign = 0
    for prompt in PROMPTS[:4]:
        steps, result = steps_and_result(e, prompt, max_tokens=32, temperature=0, drafter="model", gamma=4)
        assert result.tokens == greedy(e, prompt, "none", max_tokens=32).tokens
        for step in steps:
            outside = [i for i, t in enumerate(step.drafted) if t >= n_target]
            if outside:
                foreign += 1
                assert step.accepted <= outside[0]
                assert e.draft.piece(step.drafted[outside[0]]).decode().replace("\u2581", " ") in step.rejected_text
    assert foreign > 0  # greedy drafts really held foreign ids
    foreign = 0
    for seed in range(20):  # sampling at temperature 1, top-k off
        kw = dict(max_tokens=32, seed=seed, drafter="model", gamma=4, **FULL_SAMPLING)
        steps, result = steps_and_result(e, PROMPTS[seed % 4], **kw)
        assert result.stop_reason in ("max_tokens", "eos") and max(result.tokens) < n_target
        foreign += sum(t >= n_target for step in steps for t in step.drafted)
    assert foreign > 10
    e.close()


def test_a_target_token_the_draft_lacks_turns_drafting_off(tiny_models):
    """A target vocabulary larger than the draft's: once the context holds an id the draft does not
    have, the draft drafts nothing more in that generation, and the output stays exact."""
    e = load_pair(tiny_models.extra_heavy, tiny_models.draft)
    n_draft = e.draft.n_vocab
    assert e.target.n_vocab > n_draft
    reached = drafted_before = 0
    for prompt in PROMPTS[:4]:
        expected = greedy(e, prompt, "none", max_tokens=32).tokens
        steps, result = steps_and_result(e, prompt, max_tokens=32, temperature=0, drafter="model", gamma=4)
        assert result.tokens == expected
        first = next((i for i, t in enumerate(expected) if t >= n_draft), None)
        if first is None:
            continue
        reached += 1
        emitted = 0
        for step in steps:
            if emitted > first:
                assert step.drafted == []
            else:
                drafted_before += len(step.drafted)
            emitted += step.accepted + (step.token >= 0)
    assert reached > 0 and drafted_before > 0
    foreign_prompt = e.prompt_tokens(PROMPTS[0]) + [n_draft]  # in the prompt already
    r = greedy(e, foreign_prompt, "model", max_tokens=8)
    assert r.tokens == greedy(e, foreign_prompt, "none", max_tokens=8).tokens and r.stats.n_drafted == 0
    foreign = 0
    for seed in range(20):  # sampling at temperature 1, top-k off
        r = e.generate(PROMPTS[seed % 4], max_tokens=32, seed=seed, drafter="model", gamma=4, **FULL_SAMPLING)
        assert r.stop_reason in ("max_tokens", "eos")
        foreign += sum(t >= n_draft for t in r.tokens)
    assert foreign > 10
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


class _CountedReads(list):
    """A context that counts the tokens read out of it."""

    reads = 0

    def __getitem__(self, index):
        got = super().__getitem__(index)
        self.reads += len(got) if isinstance(index, slice) else 1
        return got

    def __iter__(self):
        self.reads += len(self)
        return super().__iter__()


def test_an_ngram_proposal_reads_as_much_at_25k_tokens_as_at_8k():
    """A long repetitive generation: each step's lookup must cost the same at its end as at its
    start (it read, and copied, the whole context every step), and propose what a drafter that
    indexes the whole context at once proposes."""
    period = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]
    context, drafter, reads = _CountedReads(), NgramDrafter(min_match=6), {}
    for i in range(25_600):  # the text repeats every 850 tokens (17 x 50): from the 9th on, alike
        context.append(period[i % len(period)] if i % 50 else 99)  # a copy is rejected now and then
        before = context.reads
        draft = drafter.propose(context, 8)
        reads[len(context)] = context.reads - before
        if len(context) in (8_550, 25_550):
            assert draft.tokens == NgramDrafter(min_match=6).propose(list(context), 8).tokens != []
    early = [reads[n] for n in range(8_500, 8_600)]
    late = [reads[n] for n in range(25_500, 25_600)]
    assert late == early


def test_an_ngram_copy_stops_before_chat_markup():
    text = [5, 1, 2, 3, 4, 6, 7, 99, 98, 8, 1, 2, 3, 4]  # the repeat was followed by 6 7, then markup
    assert NgramDrafter(min_match=4).propose(text, 4).tokens == [6, 7, 99, 98]
    assert NgramDrafter(min_match=4, markup=frozenset({98, 99})).propose(text, 4).tokens == [6, 7]
    assert NgramDrafter(min_match=4, markup=frozenset({6})).propose(text, 4).tokens == []


def test_the_markup_tokens_are_the_control_and_end_of_generation_ones(engine):
    assert engine.target.markup_tokens == {1, 2, 3, 4}  # <s>, </s>, <|im_start|>, <|im_end|> (tiny_models)


@pytest.mark.parametrize("drafter", ["ngram", "auto"])
def test_no_drafter_copies_the_chat_markup_that_ends_a_message(engine, drafter):
    """A prompt that ends by repeating the end of an earlier user message: the copy would go on
    with the template's end-of-turn and role header, which an answer never writes."""
    message = engine.target.tokenize("the cat is in the house and the dog", add_special=False)
    header = engine.target.tokenize("assistant", add_special=False)
    prompt = [engine.target.bos, 3, *message, 4, 3, *header, *message[:-1]]
    steps = [
        s for s in engine.stream(prompt, max_tokens=16, temperature=0, drafter=drafter, gamma=8) if isinstance(s, Step)
    ]
    drafted = [t for s in steps for t in s.drafted]
    assert not set(drafted) & engine.target.markup_tokens
    if drafter == "ngram":  # the first step copies the last token of the message, and stops there
        assert steps[0].drafted == message[-1:]
    assert [t for s in steps for t in s.drafted[: s.accepted] + [s.token]] == greedy(
        engine, prompt, "none", max_tokens=16
    ).tokens


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


def test_the_engine_its_generations_and_steps_show_what_they_are_in_a_line(tiny_models):
    """Their reprs were the default "<specllm.engine.loop.Engine object at 0x...>", and a Step's
    held the whole Stats (the generation's, with its policy), 600 characters a step."""
    with specllm.load(str(tiny_models.target), str(tiny_models.draft), n_ctx=512, n_threads=1) as engine:
        assert repr(engine) == "<Engine target.gguf + draft.gguf>"
        assert repr(engine.target) == f"<Model {str(tiny_models.target)!r}, n_ctx=512>"
        generation = engine.start("Hello world", max_tokens=3, temperature=0, drafter="model")
        assert repr(generation) == "<Generation not started>"
        step = next(generation)
        assert repr(generation) == "<Generation running>"
        assert "stats=" not in repr(step) and repr(step).startswith(f"Step(drafted={step.drafted!r}, accepted=")
        generation.run()
        assert repr(generation) == "<Generation finished (max_tokens, 3 tokens)>"
        with engine.start("Hello world", max_tokens=3) as cut:
            next(cut)
        assert repr(cut) == "<Generation cut short>"
        assert repr(engine.stream("Hello world", max_tokens=3)) == "<Events of <Generation not started>>"
    assert repr(engine) == "<Engine target.gguf + draft.gguf, closed>"
    assert repr(engine.target) == f"<Model {str(tiny_models.target)!r}, closed>"


def test_an_engine_in_a_with_block_is_closed_at_its_end_even_by_an_error(tiny_models):
    with (
        pytest.raises(SpecllmError, match="max tokens must be >= 1"),
        specllm.load(str(tiny_models.target), n_ctx=256, n_threads=1) as engine,
    ):
        engine.generate("Hello world", max_tokens=0)
    with pytest.raises(SpecllmError, match="this engine is closed"):
        engine.generate("Hello world", max_tokens=2)


def test_an_engine_is_used_from_asyncio_through_a_thread_as_the_doc_says(engine):
    """docs/python-api.md: generate in asyncio.to_thread, a generation's steps by next() there."""
    import asyncio

    async def steps_and_whole() -> tuple[str, str]:
        generation = engine.start(PROMPTS[2], max_tokens=12, temperature=0, drafter="model")
        text = ""
        while (step := await asyncio.to_thread(next, generation, None)) is not None:
            text += step.accepted_text + step.token_text
        whole = await asyncio.to_thread(engine.generate, PROMPTS[2], max_tokens=12, temperature=0)
        assert generation.result.text == text
        return text, whole.text

    text, whole = asyncio.run(steps_and_whole())
    assert text == whole == greedy(engine, PROMPTS[2], "none", max_tokens=12).text


def test_a_generation_yields_only_steps_then_has_its_result(engine):
    options = dict(max_tokens=40, temperature=0, drafter="model", gamma=3)
    with engine.start(PROMPTS[0], **options) as generation:
        with pytest.raises(RuntimeError, match="not finished"):
            generation.result  # noqa: B018 (reading it is the test)
        steps = list(generation)
    assert steps and all(isinstance(s, Step) for s in steps)
    result = generation.result
    assert "".join(s.accepted_text + s.token_text for s in steps) == result.text
    assert result.tokens == engine.generate(PROMPTS[0], **options).tokens


def test_a_generation_closed_early_has_no_result_and_frees_the_engine(engine):
    generation = engine.start(PROMPTS[0], max_tokens=40, temperature=0, drafter="none")
    next(generation)
    generation.close()
    assert list(generation) == [] and not generation.finished
    with pytest.raises(RuntimeError, match="not finished"):
        generation.result  # noqa: B018
    assert engine.generate(PROMPTS[1], max_tokens=4, temperature=0).stats.generated_tokens == 4


def test_text_held_back_for_a_stop_string_ends_the_generation_as_a_text_tail_step(engine):
    """At max_tokens the text's end still looks like the start of a stop string; the end releases
    it as one last step that made no target call (Step.text_tail)."""
    options = dict(max_tokens=20, temperature=0, drafter="none")
    full = engine.generate(PROMPTS[1], **options)
    held = full.text[-3:]
    with engine.start(PROMPTS[1], stop=[held + "\x01 never generated"], **options) as generation:
        steps = list(generation)
    stats = generation.result.stats
    assert len(steps) == stats.target_calls + 1 and generation.result.text == full.text
    assert steps[-1] == Step.text_tail(steps[-1].token_text, stats) and steps[-1].token_text.endswith(held)
    assert (steps[-1].drafted, steps[-1].token, steps[-1].accepted_text) == ([], -1, "")


def long_prompt(engine, batches: float) -> list[int]:
    """Prompt tokens that fill `batches` of the target's batches (n_batch tokens each)."""
    piece = engine.target.tokenize("def f(x):\n    return x * 2\n", add_special=False)
    n = int(batches * engine.target.n_batch)
    return (piece * (n // len(piece) + 1))[:n]


@pytest.mark.parametrize("arch", ["llama", "qwen35"])
def test_a_cancelled_generation_stops_its_prefill_at_once(tiny_models, tiny_recurrent_models, arch):
    """cancel() before the first step: llama.cpp stops the prompt's first batch at its first
    node; the generation ends cut short, and the KV cache (a hybrid's recurrent state too)
    holds what its tokens say: the next generation equals a fresh engine's."""
    path = tiny_models.target if arch == "llama" else tiny_recurrent_models.qwen35
    engine = specllm.load(str(path), n_ctx=2048, n_threads=1)
    prompt = long_prompt(engine, 3.5)
    try:
        generation = engine.start(prompt, max_tokens=8, temperature=0, drafter="none")
        generation.cancel()
        before = engine.target.n_evaluated
        assert list(generation) == [] and not generation.finished
        assert engine.target.n_evaluated - before == 0
        with pytest.raises(RuntimeError, match="has not finished"):
            _ = generation.result
        again = engine.generate(prompt, max_tokens=8, temperature=0, drafter="ngram").tokens
    finally:
        engine.close()
    fresh = specllm.load(str(path), n_ctx=2048, n_threads=1)
    try:
        assert again == fresh.generate(prompt, max_tokens=8, temperature=0, drafter="none").tokens
    finally:
        fresh.close()


def test_a_generation_cancelled_from_another_thread_ends_after_its_step(engine):
    generation = engine.start(PROMPTS[0], max_tokens=40, temperature=0, drafter="model")
    next(generation)
    canceller = threading.Thread(target=generation.cancel)
    canceller.start()
    canceller.join(5)
    assert not canceller.is_alive()
    assert list(generation) == [] and not generation.finished
    assert engine.generate(PROMPTS[1], max_tokens=4, temperature=0).stats.generated_tokens == 4


def test_the_result_of_a_generation_cut_short_says_so(engine):
    """run() after cancel() from another thread (a stop button) raised "its steps were not all
    taken", when they had all been: the generation was cut short."""
    generation = engine.start(PROMPTS[0], max_tokens=40, temperature=0, drafter="ngram")
    next(generation)
    with pytest.raises(RuntimeError, match="its steps were not all taken"):
        _ = generation.result
    generation.cancel()
    with pytest.raises(RuntimeError, match=r"^the generation has not finished: it was cut short \(cancel"):
        generation.run()
    closed = engine.start(PROMPTS[1], max_tokens=4, temperature=0)
    closed.close()
    with pytest.raises(RuntimeError, match="it was cut short"):
        _ = closed.result


@pytest.mark.parametrize("arch", ["llama", "qwen35"])
def test_an_evaluation_cancelled_within_a_batch_leaves_the_batches_before_it(tiny_models, tiny_recurrent_models, arch):
    """llama.cpp asks after each node of its graph; once told to stop, the batch under way ends
    and its entries leave the KV cache (a recurrent state, half written, is rebuilt): evaluating
    the rest then gives a fresh model's logits exactly."""
    path = tiny_models.target if arch == "llama" else tiny_recurrent_models.qwen35
    model, fresh = (
        Model(path, ModelOptions(n_ctx=2048, n_threads=1)),
        Model(path, ModelOptions(n_ctx=2048, n_threads=1)),
    )
    piece = model.tokenize("def f(x):\n    return x * 2\n", add_special=False)
    tokens = (piece * 2048)[: int(2.5 * model.n_batch)]
    asked = []

    def cancelled() -> bool:  # from the 6th question within the second batch on
        if model.n_evaluated >= model.n_batch:
            asked.append(True)
        return len(asked) > 5

    try:
        with interruptible(cancelled), pytest.raises(Interrupted):
            model.eval(tokens)
        assert len(asked) == 6 and model.tokens == tokens[: model.n_batch]
        rows = model.sync(tokens, n_logits=4).copy()
        assert np.array_equal(rows, fresh.eval(tokens, n_logits=4))
    finally:
        model.close()
        fresh.close()


def test_a_ctrl_c_within_a_prompts_batch_stops_it_there(tiny_models):
    """On the main thread, llama.cpp's question after each node runs Python: a Ctrl-C's
    KeyboardInterrupt is raised in it, where ctypes reports it as unraisable and goes on. It is
    kept, the batch stops at the next question, and the evaluation raises it."""
    model = Model(tiny_models.target, ModelOptions(n_ctx=2048, n_threads=1))
    piece = model.tokenize("def f(x):\n    return x * 2\n", add_special=False)
    tokens = (piece * 2048)[: int(2.5 * model.n_batch)]
    asked = []

    def cancelled() -> bool:  # Ctrl-C at the 3rd question after the first batch: within the second
        if model.n_evaluated >= model.n_batch:
            asked.append(True)
            if len(asked) == 3:
                os.kill(os.getpid(), signal.SIGINT)
        return False

    try:
        with interruptible(cancelled), pytest.raises(KeyboardInterrupt):
            model.eval(tokens)
        assert 3 <= len(asked) <= 4 and model.tokens == tokens[: model.n_batch]
    finally:
        model.close()


def test_llama_cpp_asks_within_a_batch_only_for_a_long_prompt(tiny_models):
    """Its question is a Python call per node, which waits for the GIL while another thread runs
    Python: a short prompt, done in a second or two, is evaluated without it."""
    from specllm.llama.model import ASKED_FROM_TOKENS

    model = Model(tiny_models.target, ModelOptions(n_ctx=512, n_threads=1))
    tokens = (model.tokenize("def f(x):\n    return x * 2\n", add_special=False) * 512)[:ASKED_FROM_TOKENS]
    asked = []
    try:
        with interruptible(lambda: asked.append(True) or False):
            model.eval(tokens[:-1])
            assert asked == []
            model.eval(tokens)
            assert len(asked) > 10  # a question a node
    finally:
        model.close()


@pytest.mark.parametrize("close", ["generation", "engine"])
def test_closing_from_another_thread_stops_a_prefill_under_way(tiny_models, close):
    """close() waits for the call under way: a long prompt's prefill went on to its end first. A
    generation closed ends quietly; one whose engine was closed says so, as at a later step (it
    ended as if cancelled, and generate() raised a RuntimeError)."""
    engine = specllm.load(str(tiny_models.target), n_ctx=32768, n_threads=1)
    prompt = long_prompt(engine, 60)
    generation = engine.start(prompt, max_tokens=4, temperature=0, drafter="none")
    raised: list[BaseException] = []
    runner = threading.Thread(target=_taking_steps, args=(generation, raised))
    try:
        runner.start()
        deadline = time.monotonic() + 60
        while engine.target.n_evaluated < engine.target.n_batch:  # the prefill's first batch is done
            assert runner.is_alive() and time.monotonic() < deadline
            time.sleep(0.001)
        (generation if close == "generation" else engine).close()
        runner.join(30)
        assert not runner.is_alive() and engine.target.n_evaluated < len(prompt) // 2
        if close == "generation":
            assert raised == [] and not generation.finished
        else:
            assert [type(e) for e in raised] == [SpecllmError] and "this engine is closed" in str(raised[0])
    finally:
        engine.close()


def _taking_steps(generation, raised: list[BaseException]) -> None:
    try:
        list(generation)
    except BaseException as e:  # noqa: BLE001 - the test reads it
        raised.append(e)
