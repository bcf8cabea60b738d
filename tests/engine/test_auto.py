"""The auto drafter on real llama.cpp with the tiny models: exactness with mixed sources, the
calibration cache, and not loading a draft model that cannot pay."""

import json
import os
import time

import numpy as np
import pytest
from costs import FixedCosts, gpu_like_policy
from slowed import SLOW_CALL, slowed
from stats import chi_square_pvalue

import specllm
from specllm.engine import calibration, loop
from specllm.engine.policy import Acceptance, AutoPolicy, CostTable
from specllm.engine.sampling import SamplerSettings, distribution
from specllm.llama.model import Model
from specllm.llama.options import ModelOptions

PROMPTS = [
    "Hello world",
    "def f(x): return",
    "the cat is in the house and the cat is in the",
    "print(self.x) print(self.x) print(self.x) print(self",
    "for i in range(10): print(i) for i in range(10): print(i) for i in",
]


class FixedAcceptance(Acceptance):
    """Acceptance estimates that do not learn: the policy then keeps choosing n-gram copies
    wherever there is a match, whatever the target does."""

    def __init__(self, rate):
        super().__init__(lambda _: rate)

    def record(self, context_bucket, position, accepted):
        pass

    def child(self, weight):
        return self


def mixed_policy() -> AutoPolicy:
    """GPU-like costs where n-gram copies are always taken when there is a match and the draft
    model drafts where there is none: both sources draft in one generation."""
    policy = gpu_like_policy()
    policy.learned["ngram"] = FixedAcceptance(0.95)
    return policy


def cpu_like_policy() -> AutoPolicy:
    """This project's 2-core CPU's table: the draft model cannot pay."""
    target = FixedCosts(0.0395, {2: 1.63, 3: 1.99, 5: 3.23, 8: 5.84, 12: 7.41, 17: 8.54, 24: 10.3, 33: 12.9})
    return AutoPolicy(target, FixedCosts(0.0209, {2: 1.92, 3: 2.20, 5: 3.35, 8: 4.09}))


@pytest.fixture()
def engine(tiny_models):
    e = specllm.load(str(tiny_models.target), str(tiny_models.draft), n_ctx=512, n_threads=1)
    yield e
    e.close()


def greedy(engine, prompt, drafter, gamma=None, max_tokens=48):
    return engine.generate(prompt, max_tokens=max_tokens, temperature=0, drafter=drafter, gamma=gamma)


@pytest.mark.parametrize("gamma", [None, 1, 3, 16])
def test_greedy_auto_equals_target_only_with_mixed_sources(engine, gamma):
    engine.policy = mixed_policy()
    sources = {}
    for prompt in PROMPTS:
        expected = greedy(engine, prompt, "none").tokens
        result = greedy(engine, prompt, "auto", gamma)
        assert result.tokens == expected, prompt
        for name, counts in result.stats.sources.items():
            sources[name] = sources.get(name, 0) + counts["drafted"]
        assert sum(c["steps"] for c in result.stats.sources.values()) == result.stats.target_calls
    assert sources.get("model", 0) > 20 and sources.get("ngram", 0) > 0  # really speculated, from both
    if gamma is not None:
        assert max(len(engine.generate(p, max_tokens=8, temperature=0, gamma=gamma).tokens) for p in PROMPTS) == 8


def test_greedy_auto_equals_target_only_with_measured_costs(engine):
    for prompt in PROMPTS:
        assert greedy(engine, prompt, "auto").tokens == greedy(engine, prompt, "none").tokens
    assert engine.policy is not None and engine.calibration["measured"] == ["target", "draft"]


def test_cpu_costs_never_spend_on_the_draft_model(engine):
    engine.policy = cpu_like_policy()
    before = list(engine.draft.tokens)
    for prompt in PROMPTS:
        result = greedy(engine, prompt, "auto")
        assert "model" not in result.stats.sources and result.stats.draft_calls == 0
    assert engine.draft.tokens == before  # no prefill, no catch-up call


# --- sampling: the output is distributed as the target's, with both sources drafting ------------

SAMPLER = SamplerSettings(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0)


def target_joint_distribution(tiny_models, prompt_ids, n_tokens):
    """P(t1..tn) of target-only sampling, from the target's own logits one token at a time."""
    model = Model(tiny_models.target, ModelOptions(n_ctx=256, n_threads=1))
    joint = {(): 1.0}
    for _ in range(n_tokens):
        longer = {}
        for prefix, p in joint.items():
            probs = distribution(np.array(model.sync(prompt_ids + list(prefix), n_logits=1)[0]), SAMPLER)
            for t in np.flatnonzero(probs):
                longer[prefix + (int(t),)] = p * probs[t]
        joint = longer
    model.close()
    return joint


def test_sampled_auto_follows_the_target_distribution_with_both_sources(engine, tiny_models):
    engine.policy = mixed_policy()
    ids = engine.prompt_tokens("a b a b a b a b a b a b a b a b a")
    joint = target_joint_distribution(tiny_models, ids, 3)
    cells = sorted(joint)
    counts = dict.fromkeys(cells, 0)
    drafted = {"model": 0, "ngram": 0}
    n = 4000
    for seed in range(n):
        r = engine.generate(ids, max_tokens=3, drafter="auto", **SAMPLER.__dict__ | {"seed": seed})
        counts[tuple(r.tokens)] += 1  # a KeyError is a sequence the target cannot produce
        for name in drafted:
            drafted[name] += r.stats.sources.get(name, {}).get("drafted", 0)
    assert drafted["model"] > n / 2 and drafted["ngram"] > n / 2, drafted
    observed = np.array([counts[c] for c in cells])
    assert chi_square_pvalue(observed, np.array([joint[c] for c in cells])) > 1e-3


# --- calibration cache ---------------------------------------------------------------------------


def run_auto(tiny_models, **options) -> specllm.Engine:
    e = specllm.load(str(tiny_models.target), str(tiny_models.draft), n_ctx=256, **options)
    greedy(e, PROMPTS[1], "auto", max_tokens=4)
    e.close()
    return e


def test_calibration_times_every_width_and_leaves_the_context(engine):
    context = engine.prompt_tokens(PROMPTS[0], chat=False)
    table = calibration.measure(engine.target, calibration.TARGET_WIDTHS, context)
    assert table.step_seconds > 0 and sorted(table.V) == [w for w in calibration.TARGET_WIDTHS if w > 1]
    assert all(1.0 <= v <= w for w, v in table.V.items())
    assert engine.target.tokens == context  # its KV cache holds the context, as before


def test_calibration_on_an_empty_context_times_real_calls(engine):
    """A one-token prompt leaves nothing in the KV cache to calibrate on: the calls were timed on no
    tokens at all, and those costs (microseconds) were cached for every later run."""
    engine.target.truncate(0)
    before = engine.target.n_evaluated
    calibration.measure(engine.target, calibration.TARGET_WIDTHS, [])
    narrow = [w for w in calibration.TARGET_WIDTHS if w <= calibration.NARROW]
    wide = [w for w in calibration.TARGET_WIDTHS if w > calibration.NARROW]
    assert engine.target.n_evaluated - before == calibration.NARROW_ROUNDS * sum(narrow) + sum(wide)
    assert engine.target.tokens == []


def test_on_a_gpu_calibration_times_the_last_of_three_calls_of_a_width_in_a_row(engine, monkeypatch):
    """A CUDA build replays a captured graph only from the third call of one shape in a row, so on
    a GPU each timed call comes after two of its width: the loop's steady cost, not the cost of
    setting a graph up (2-3x a one-token call of a small draft on an H200). Here the first two
    calls after each change of width are made slow: the table must not see them."""
    context = engine.prompt_tokens(PROMPTS[0], chat=False)
    engine.target.sync(context)
    widths, real_eval = [], engine.target.eval

    def eval_(tokens, n_logits=1):
        if not tokens:  # the context's sync, which has nothing left to evaluate
            return real_eval(tokens, n_logits)
        run = len(widths) - next((i for i in range(len(widths) - 1, -1, -1) if widths[i] != len(tokens)), -1) - 1
        widths.append(len(tokens))
        if run < 2:
            time.sleep(0.05)  # setting up the graph of a new shape
        return real_eval(tokens, n_logits)

    monkeypatch.setattr(engine.target, "eval", eval_)
    monkeypatch.setattr(engine.target, "on_gpu", True)
    table = calibration.measure(engine.target, (1, 2, 3, 8), context)
    assert widths == [1, 1, 1, 2, 2, 2, 3, 3, 3] * calibration.NARROW_ROUNDS + [8, 8, 8]
    assert table.step_seconds < 0.05 and table.seconds(8) < 0.05
    assert engine.target.tokens == context
    monkeypatch.setattr(engine.target, "on_gpu", False)  # on a CPU, as before: each width once a round
    widths.clear()
    calibration.measure(engine.target, (1, 2, 3, 8), context)
    assert widths == [1, 2, 3] * calibration.NARROW_ROUNDS + [8]


@pytest.mark.parametrize("one_token", [True, False])
def test_a_draft_that_catches_up_one_token_a_call_is_priced_so(engine, monkeypatch, one_token):
    """On CUDA graphs a short catch-up is that many one-token calls (ModelDrafter._catch_up_to), so
    the draft's cost table prices it so, not as the one wider call calibration timed."""
    from specllm.engine.drafters import ONE_TOKEN_CATCH_UP

    monkeypatch.setattr(engine.draft, "one_token_catch_up", one_token)
    table = engine._measure_draft(engine.draft, engine.prompt_tokens(PROMPTS[0], chat=False))
    short = range(2, ONE_TOKEN_CATCH_UP + 1)
    assert all(table.ratio(w) == w for w in short) == one_token, table.V


def test_calibration_pairs_narrow_calls_with_the_one_token_call_of_their_round(engine, monkeypatch):
    """The machine runs at a different speed in each round, and in one round it slows down
    between the one-token call and the narrow ones: the medians of paired ratios still read the
    true costs, where the fastest timings of each width (the one-token call's from one round, the
    others' from another) would read them 30% too high."""
    true_v = {1: 1.0, 2: 1.6, 3: 2.1, 4: 2.7, 5: 3.2, 8: 6.0, 12: 7.4, 16: 7.1, 32: 11.6}
    rounds = iter([(2.0, 2.0), (1.0, 1.3), (1.5, 1.5)])  # (one-token call, narrow calls) speed

    def timings(jobs, context, reps, in_a_row=1):
        if any(n > calibration.NARROW for _, n in jobs):
            return [0.01 * true_v[n] for _, n in jobs]  # wide calls: timed once
        one, narrow = next(rounds)
        return [0.01 * true_v[n] * (one if n == 1 else narrow) for _, n in jobs]

    monkeypatch.setattr(calibration, "time_calls", timings)
    table = calibration.measure(engine.target, calibration.TARGET_WIDTHS, [1, 2, 3])
    assert table.step_seconds == pytest.approx(0.015)  # the median round's one-token call
    for w in (2, 3, 4, 5):
        assert table.V[w] == pytest.approx(true_v[w])
    assert table.V[8] == pytest.approx(6.0 / 1.5)  # against the median one-token call


def test_calibration_is_cached_and_reused(tiny_models):
    first = run_auto(tiny_models, n_threads=1)
    assert first.calibration["measured"] == ["target", "draft"]
    saved = json.loads(calibration.cache_path().read_text())
    cached = saved["models"]
    assert len(cached) == 2 and all("step_seconds" in t for t in cached.values())
    for table in cached.values():  # where it was measured: past DRIFT on a busy machine, it is measured again
        table["step_seconds"] = table["measured_at"]
    calibration.cache_path().write_text(json.dumps(saved))
    again = run_auto(tiny_models, n_threads=1)
    assert again.calibration["measured"] == []


def test_refined_costs_are_not_written_after_every_generation(tiny_models, monkeypatch):
    """Costs obtained now are written at once; refined ones at most once a minute: written after
    every generation, they cost each about 20 ms, more than a short one takes here."""
    writes, save = [], calibration.save_costs
    monkeypatch.setattr(calibration, "save_costs", lambda tables: writes.append(tables) or save(tables))
    e = specllm.load(str(tiny_models.target), str(tiny_models.draft), n_ctx=256, n_threads=1)
    for prompt in PROMPTS[:4]:
        greedy(e, prompt, "auto", max_tokens=4)
    assert len(writes) == 1 and calibration.load_costs(next(iter(writes[0]))) is not None
    monkeypatch.setattr(loop, "SAVE_COSTS_EVERY", 0.0)  # a minute has passed
    greedy(e, PROMPTS[0], "auto", max_tokens=4)
    assert len(writes) == 2
    e.close()


@pytest.mark.parametrize("change", ["threads", "gpu_layers", "model_file"])
def test_calibration_is_redone_when_what_it_depends_on_changes(tiny_models, tmp_path, change):
    assert run_auto(tiny_models, n_threads=1).calibration["measured"] == ["target", "draft"]
    if change == "threads":
        again = run_auto(tiny_models, n_threads=2)
    elif change == "gpu_layers":  # a CPU build offloads nothing either way, but the key differs
        again = run_auto(tiny_models, n_threads=1, n_gpu_layers=1)
        assert again.calibration["measured"] == ["target"]  # the draft's own layers did not change
        return
    else:
        st = os.stat(tiny_models.target)
        os.utime(tiny_models.target, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # the file was replaced
        try:
            again = run_auto(tiny_models, n_threads=1)
        finally:
            os.utime(tiny_models.target, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert again.calibration["measured"] == ["target"]
        return
    assert again.calibration["measured"] == ["target", "draft"]


def write_cache(tiny_models, target: CostTable, draft: CostTable, n_threads=1):
    options = ModelOptions(n_ctx=256, n_threads=n_threads)
    calibration.save_costs(
        {
            calibration.model_key(tiny_models.target, options): target,
            calibration.model_key(tiny_models.draft, options): draft,
        }
    )


def test_a_cached_verdict_that_the_draft_cannot_pay_means_it_is_never_loaded(tiny_models):
    p = cpu_like_policy()
    write_cache(tiny_models, p.target, p.draft)
    e = specllm.load(str(tiny_models.target), str(tiny_models.draft), n_ctx=256, n_threads=1, defer_draft=True)
    result = greedy(e, PROMPTS[3], "auto")
    assert e.draft is None and e.has_draft  # not loaded: it cannot pay here
    assert e.calibration["measured"] == [] and "model" not in result.stats.sources
    assert result.stats.policy["model_could_pay"] is False
    # asking for it loads it
    assert e.generate(PROMPTS[3], max_tokens=8, temperature=0, drafter="model").stats.n_drafted > 0
    assert e.draft is not None
    e.close()


def test_a_cached_verdict_that_the_draft_pays_loads_and_uses_it(tiny_models):
    p = gpu_like_policy()
    write_cache(tiny_models, p.target, p.draft)
    e = specllm.load(str(tiny_models.target), str(tiny_models.draft), n_ctx=256, n_threads=1, defer_draft=True)
    assert e.draft is None
    e.policy = gpu_like_policy()  # keep the GPU-like costs: the tiny models' real ones would drift in
    result = greedy(e, PROMPTS[0], "auto")
    assert e.draft is not None and result.stats.sources["model"]["drafted"] > 0
    e.close()


# --- the machine's speed changes after calibration --------------------------------------------

CPU_V = {2: 1.63, 3: 1.99, 4: 2.7, 5: 3.23}  # a quiet 2-core CPU's narrow calls


def test_costs_measured_on_a_quiet_machine_are_measured_again_when_it_slows_down(engine, monkeypatch):
    """Another process takes the CPU after calibration: every call now waits SLOW_CALL whatever its
    width, so a 5-token call costs about one 1-token call. A policy that drafts nothing makes only
    one-token calls, which never corrected V(5): it stayed at the quiet machine's 3.2 for good, and
    the draft model, which this machine now pays for, was never tried. Once a one-token call is
    more than twice as slow as when V was measured, the next text measures it again."""
    quiet = SLOW_CALL / 10
    engine.policy = AutoPolicy(CostTable(quiet, dict(CPU_V)), CostTable(quiet * 0.53, {2: 1.92, 5: 3.35}))
    assert not engine.policy.model_could_pay()
    slowed(monkeypatch, "llama_decode")
    first = greedy(engine, PROMPTS[0], "auto", max_tokens=24)  # drafts nothing: one-token calls only
    assert first.stats.policy["calibration"]["measured"] == []
    assert engine.policy.target.V[5] == CPU_V[5]
    second = greedy(engine, PROMPTS[0], "auto", max_tokens=24)
    assert second.stats.policy["calibration"]["measured"] == ["target", "draft"]
    assert second.stats.calibration_seconds > 0
    assert engine.policy.target.V[5] < 2 and not engine.policy.target.drifted()
    assert second.tokens == greedy(engine, PROMPTS[0], "none", max_tokens=24).tokens


def test_costs_measured_on_a_busy_machine_are_measured_again_when_it_is_quiet(engine):
    """Calibrated while other processes held the CPU, every call looked alike (V = 1) and the
    draft model cheap: auto drafts with it at every step, and its wide calls alone only pulled the
    one-token estimate down to three quarters of theirs, so V stayed 1 and the draft model in use
    where it loses. Once a one-token call is more than twice as fast as when V was measured, the
    next text measures it again."""
    busy = SLOW_CALL * 10
    engine.policy = AutoPolicy(CostTable(busy, {n: 1.0 for n in CPU_V}), CostTable(busy * 0.1, {2: 1.0, 5: 1.0}))
    first = greedy(engine, PROMPTS[0], "auto", max_tokens=24)
    assert first.stats.sources["model"]["steps"] > 0 and first.stats.policy["calibration"]["measured"] == []
    second = greedy(engine, PROMPTS[0], "auto", max_tokens=24)
    assert second.stats.policy["calibration"]["measured"] == ["target", "draft"]
    assert engine.policy.target.measured_at < busy / 10 and second.tokens == first.tokens


def test_costs_are_not_measured_again_while_the_machine_keeps_its_speed(engine, monkeypatch):
    slowed(monkeypatch, "llama_decode")
    engine.policy = AutoPolicy(CostTable(SLOW_CALL, dict(CPU_V)), CostTable(SLOW_CALL * 0.53, {2: 1.92, 5: 3.35}))
    for _ in range(2):
        assert greedy(engine, PROMPTS[0], "auto", max_tokens=24).stats.policy["calibration"]["measured"] == []
    assert engine.policy.target.V == CPU_V


def test_a_cached_table_whose_machine_slowed_down_is_measured_again_at_once(tiny_models, monkeypatch):
    """A run on a busy machine wrote its slower one-token time to the cache: the next run does not
    decide on the quiet machine's V."""
    quiet = SLOW_CALL / 10
    busy = CostTable(SLOW_CALL, dict(CPU_V), measured_at=quiet)
    write_cache(tiny_models, busy, CostTable(quiet * 0.53, {2: 1.92, 5: 3.35}, measured_at=quiet))
    slowed(monkeypatch, "llama_decode")
    e = specllm.load(str(tiny_models.target), str(tiny_models.draft), n_ctx=256, n_threads=1, defer_draft=True)
    result = greedy(e, PROMPTS[0], "auto", max_tokens=4)
    assert result.stats.policy["calibration"]["measured"] == ["target"]  # the draft was not loaded
    assert e.policy.target.V[5] < 2
    e.close()


def test_a_deferred_draft_is_still_checked_for_compatibility_at_load(tiny_models):
    with pytest.raises(specllm.SpecllmError, match="cannot draft"):
        specllm.load(str(tiny_models.target), str(tiny_models.incompatible), n_ctx=256, defer_draft=True)


def test_a_deferred_draft_given_by_a_relative_path_loads_from_another_directory(tiny_models, monkeypatch, tmp_path):
    monkeypatch.chdir(tiny_models.draft.parent)
    e = specllm.load(str(tiny_models.target), tiny_models.draft.name, n_ctx=256, n_threads=1, defer_draft=True)
    monkeypatch.chdir(tmp_path)  # the program moves on before the draft is first needed
    result = e.generate(PROMPTS[0], max_tokens=8, temperature=0, drafter="model")
    assert result.stats.n_drafted > 0 and result.tokens == greedy(e, PROMPTS[0], "none", max_tokens=8).tokens
    e.close()


@pytest.mark.parametrize("defer_draft", ["no", 0, None])
def test_defer_draft_of_the_wrong_type_is_refused_in_one_line(tiny_models, defer_draft):
    with pytest.raises(specllm.SpecllmError, match="defer_draft must be True or False"):
        specllm.load(str(tiny_models.target), str(tiny_models.draft), n_ctx=256, defer_draft=defer_draft)


def test_the_policy_report_says_where_the_costs_came_from(engine):
    result = greedy(engine, PROMPTS[1], "auto", max_tokens=4)
    report = result.stats.policy
    assert report["calibration"]["measured"] == ["target", "draft"] and report["calibration"]["seconds"] > 0
    assert report["target"]["step_seconds"] > 0 and "2" in report["target"]["V"]
    assert result.stats.calibration_seconds == report["calibration"]["seconds"]
    assert report["calibration"]["reused"] is False
    second = greedy(engine, PROMPTS[1], "auto", max_tokens=4)
    assert second.stats.calibration_seconds == 0  # the engine keeps its policy
    calibration = second.stats.policy["calibration"]  # and says that this generation measured nothing
    assert calibration["measured"] == [] and calibration["seconds"] == 0 and calibration["reused"] is True
    assert greedy(engine, PROMPTS[1], "ngram", max_tokens=4).stats.policy is None


def test_a_passed_vocabulary_check_is_remembered_until_a_file_changes(tiny_models, tmp_path):
    """The deferred draft's vocabulary check (1-2 s for a real pair) runs once per pair of files;
    a changed file is checked again, so a draft replaced by an incompatible one is still refused."""
    import shutil

    from specllm.llama.vocab import known_compatible

    target, draft = tmp_path / "t.gguf", tmp_path / "d.gguf"
    shutil.copy(tiny_models.target, target)
    shutil.copy(tiny_models.draft, draft)
    assert not known_compatible(target, draft)
    specllm.load(str(target), str(draft), n_ctx=256, n_threads=1, defer_draft=True).close()
    assert known_compatible(target, draft)
    specllm.load(str(target), str(draft), n_ctx=256, n_threads=1, defer_draft=True).close()  # from the cache

    shutil.copy(tiny_models.incompatible, draft)
    assert not known_compatible(target, draft)
    with pytest.raises(specllm.SpecllmError, match="cannot draft for"):
        specllm.load(str(target), str(draft), n_ctx=256, n_threads=1, defer_draft=True)


def test_a_greedy_drafts_confidence_is_its_softmax_top_probability():
    """The confidence leaves out logits far below the top: on peaked, flat and in-between rows of a
    150k vocabulary it stays within 1e-3 of the full softmax's top probability."""
    from specllm.engine.sampling import top_probability

    rng = np.random.default_rng(0)
    for scale in (0.5, 2.0, 5.0, 20.0):
        row = (rng.normal(0, scale, 151_936)).astype(np.float32)
        row[17] += 3 * scale
        x = row.astype(np.float64)
        exact = 1.0 / np.exp(x - x.max()).sum()
        assert abs(top_probability(row, int(row.argmax())) - exact) < 1e-3


def test_the_stopping_rule_decides_as_the_estimates_of_the_moment_say():
    """auto's per-proposal StoppingRule looks the estimates up once per proposal: each of its
    decisions equals model_keep_going's on estimates read afresh, across proposals whose outcomes
    are learned in between."""
    import random

    from specllm.engine.drafters import StoppingRule
    from specllm.engine.policy import CONFIDENCE_EDGES, MODEL_MAX, bucket

    policy = AutoPolicy(CostTable(0.005, {n: 1 + 0.02 * n for n in range(2, 18)}), CostTable(0.0015, {}))
    table, rng, outcomes = policy.by_confidence["model"], random.Random(3), set()
    for _ in range(150):
        rule, confidences = StoppingRule(policy, "model"), []
        while len(confidences) < MODEL_MAX:
            c, spent = rng.random() ** 0.3, 0.0015 * (len(confidences) + 1)
            taken = [table.rate(bucket(x, CONFIDENCE_EDGES), j) for j, x in enumerate(confidences, 1)]
            expected = policy.model_keep_going(taken, c, spent, MODEL_MAX)
            assert rule(confidences, c, spent) == expected
            outcomes.add(expected)
            if not expected:
                break
            confidences.append(c)
        policy.record_model(confidences, rng.randrange(len(confidences) + 1))
    assert outcomes == {True, False}


# --- a deferred draft that cannot be loaded when auto first needs it ----------------------------


def test_auto_goes_on_without_a_draft_that_went_bad_after_loading(tiny_models, tmp_path, capsys):
    """The draft file was damaged after the engine was loaded: auto's calibration (no costs
    cached) cannot load it. The reply goes on without it, greedy equal to target-only, the user is
    told once, and the draft is not tried again by the next generation; asking for the model
    drafter by name still fails."""
    draft = tmp_path / "draft.gguf"
    draft.write_bytes(tiny_models.draft.read_bytes())
    e = specllm.load(str(tiny_models.target), str(draft), n_ctx=256, n_threads=1, defer_draft=True)
    draft.write_bytes(tiny_models.draft.read_bytes()[:300_000])
    capsys.readouterr()
    try:
        for prompt in PROMPTS[2:4]:
            result = greedy(e, prompt, "auto")
            assert result.tokens == greedy(e, prompt, "none").tokens
            assert "model" not in result.stats.sources
            assert result.stats.policy["draft_unavailable"].startswith(f"cannot load {draft}: ")
            assert result.stats.policy["draft"] is None and not result.stats.policy["model_could_pay"]
        warnings = [line for line in capsys.readouterr().err.splitlines() if "could not be loaded" in line]
        assert warnings == [
            f"specllm: warning: the draft model could not be loaded, so auto goes on without it: {e.draft_unavailable}"
        ]
        with pytest.raises(specllm.errors.DraftNotLoaded, match="^cannot load .*draft.gguf: "):
            greedy(e, PROMPTS[0], "model")
    finally:
        e.close()


def test_auto_goes_on_without_a_draft_the_memory_check_refuses(tiny_models, monkeypatch, capsys):
    """Cached costs say the draft pays, but the target took the memory its context needs: the
    first reply goes on with n-gram copies or the target alone, and no later one tries the draft."""
    from specllm.llama import memory

    p = gpu_like_policy()
    write_cache(tiny_models, p.target, p.draft)
    e = specllm.load(str(tiny_models.target), str(tiny_models.draft), n_ctx=256, n_threads=1, defer_draft=True)
    tried = []
    monkeypatch.setattr(memory, "available_memory", lambda: tried.append(1) or 1024)
    capsys.readouterr()
    try:
        e.policy = gpu_like_policy()  # keep the GPU-like costs: the draft model pays
        first = greedy(e, PROMPTS[0], "auto")
        assert len(tried) == 1 and e.draft is None and not e.policy.model_could_pay()
        assert first.stats.policy["draft_unavailable"].startswith("a context of 256 tokens for draft.gguf needs about")
        assert "model" not in first.stats.sources
        second = greedy(e, PROMPTS[1], "auto")
        assert len(tried) == 1 and second.stats.policy["draft_unavailable"] == e.draft_unavailable
        assert capsys.readouterr().err.count("could not be loaded") == 1
        monkeypatch.undo()  # the draft itself was never the problem: greedy equal to target-only
        for prompt, result in zip(PROMPTS, (first, second)):
            assert result.tokens == greedy(e, prompt, "none").tokens
    finally:
        e.close()
