"""The bench logic on the tiny real models: prompts, configurations, the runner and its JSON, the
speedup formula, the fidelity check (a planted divergence is caught and classified), the view.
Nothing here asserts a timing: on tiny models speeds are noise."""

from __future__ import annotations

import copy
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from one_line import assert_one_line_error
from rich.console import Console

import specllm
from specllm.bench import runner as b
from specllm.bench.view import explanation, render, results_table
from specllm.engine import loop as engine_module
from specllm.engine.loop import Stats
from specllm.engine.policy import AutoPolicy
from specllm.errors import ContextFull, SpecllmError

SMALL_SUITE = [
    b.BenchPrompt("Write a Python function that adds two numbers.", "code"),
    b.BenchPrompt("def add(a, b):\n    return a + b\n\nRepeat the code above exactly.", "edit"),
    b.BenchPrompt("Once upon a time", "chat", max_tokens=8),
]
STAT_NAMES = set(Stats().to_dict())


@pytest.fixture(scope="module")
def engine(tiny_models):
    e = specllm.load(str(tiny_models.target), str(tiny_models.draft), n_ctx=1024, n_threads=1)
    yield e
    e.close()


def settings(**kw) -> b.BenchSettings:
    kw.setdefault("configurations", tuple(b.configurations(["model", "ngram"], [1, 3])))
    kw.setdefault("max_tokens", 24)
    kw.setdefault("warmup_tokens", 4)
    kw.setdefault("calibration_reps", 2)
    return b.BenchSettings(**kw)


@pytest.fixture(scope="module")
def results(engine):
    events = []
    out = b.run_bench(engine, SMALL_SUITE, settings(), lambda *e: events.append(e))
    out["_progress"] = events
    return out


# --- prompts -----------------------------------------------------------------------------------


def test_a_prompt_file_gives_one_prompt_per_line_with_defaults():
    text = '{"prompt": "a"}\n\n{"prompt": "b", "category": "x", "max_tokens": 5, "id": 7}\n'
    assert b.parse_prompts(text, "f") == [b.BenchPrompt("a", b.DEFAULT_CATEGORY), b.BenchPrompt("b", "x", 5)]


def test_malformed_lines_are_reported_with_their_numbers():
    lines = [
        '{"prompt": "fine"}',  # 1
        '{"prompt": "unterminated',  # 2
        "",  # 3: blank lines are skipped
        '["a list"]',  # 4
        '{"category": "no prompt"}',  # 5
        '{"prompt": "x", "max_tokens": 0}',  # 6
        '{"prompt": "x", "max_tokens": true}',  # 7
        '{"prompt": "x", "category": 5}',  # 8
        '{"prompt": "   "}',  # 9
    ]
    with pytest.raises(SpecllmError) as e:
        b.parse_prompts("\n".join(lines), "my.jsonl")
    msg = str(e.value)
    assert msg.startswith("my.jsonl: 7 malformed lines: line 2: not valid JSON")
    assert "\n" not in msg  # the CLI's error is one line
    for n in (2, 4, 5, 6, 7, 8, 9):
        assert f"line {n}:" in msg
    assert "line 1:" not in msg and "line 3:" not in msg
    assert "not valid JSON" in msg and '"max_tokens" must be a positive integer' in msg


def test_more_than_ten_malformed_lines_are_counted_after_the_first_ten():
    with pytest.raises(SpecllmError) as e:
        b.parse_prompts("[]\n" * 12, "my.jsonl")
    msg = str(e.value)
    assert msg.startswith("my.jsonl: 12 malformed lines: line 1: expected a JSON object")
    assert "line 10:" in msg and "line 11:" not in msg and msg.endswith("; and 2 more")


def test_a_gap_to_fill_is_a_prompt_with_a_suffix():
    text = '{"prompt": "def f():\\n", "suffix": "\\nf()\\n", "category": "fill"}\n'
    assert b.parse_prompts(text, "f") == [b.BenchPrompt("def f():\n", "fill", None, "\nf()\n")]
    with pytest.raises(SpecllmError, match='line 1: "suffix" must be a string'):
        b.parse_prompts('{"prompt": "a", "suffix": 3}', "f")


def test_a_gap_is_benched_with_its_fim_prompt(tiny_code_models):
    e = specllm.load(str(tiny_code_models.target), str(tiny_code_models.draft), n_ctx=512, n_threads=1)
    try:
        gap = b.BenchPrompt("def total(values):\n", "fill", 12, "\n    return result\n")
        run = b.run_one(e, 0, gap, b.Configuration("model", 3), settings())
        assert run.prompt_tokens == e.infill_prompt(gap.prompt, gap.suffix, max_tokens=12).tokens
        assert run.result.tokens == e.generate(run.prompt_tokens, max_tokens=12, temperature=0, drafter="none").tokens
        cut = b.BenchPrompt("x = 1\n" * 300, "fill", 12, "\n")  # cut to leave room for its reply
        warm_up = b.run_one(e, 0, cut, b.Configuration("model", 3), settings(), max_tokens=200)
        assert warm_up.prompt_tokens == b.run_one(e, 0, cut, b.Configuration("model", 3), settings()).prompt_tokens
    finally:
        e.close()


def test_a_gap_the_model_cannot_fill_is_refused_before_anything_runs(engine):
    events = []
    with pytest.raises(SpecllmError, match=r"^prompt 3 \(fill\): target.gguf has no fill-in-the-middle tokens"):
        b.run_bench(
            engine, [*SMALL_SUITE[:2], b.BenchPrompt("a", "fill", None, "b")], settings(), lambda *e: events.append(e)
        )
    assert events == []


def test_a_prompt_file_is_read_or_refused_in_one_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "hi", "category": "chat"}\n')
    assert b.load_prompts(path) == [b.BenchPrompt("hi", "chat")]
    with pytest.raises(SpecllmError, match="cannot read prompts"):
        b.load_prompts(tmp_path / "missing.jsonl")
    path.write_text('\ufeff{"prompt": "hi", "category": "chat"}\n', encoding="utf-8")  # Notepad's BOM
    assert b.load_prompts(path) == [b.BenchPrompt("hi", "chat")]
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(SpecllmError, match="no prompts"):
        b.load_prompts(tmp_path / "empty.jsonl")


def test_the_builtin_suite_covers_every_category_at_least_three_times():
    suite = b.builtin_prompts()
    counts = {c: sum(p.category == c for p in suite) for c in b.categories_of(suite)}
    assert {"code-generation", "code-editing", "chat", "extraction", "math"} <= set(counts)
    assert all(n >= 3 for n in counts.values())
    # Code editing: the prompt holds code that the answer must largely repeat.
    assert all("```" in p.prompt and len(p.prompt) > 200 for p in suite if p.category == "code-editing")


def test_prompts_are_selected_by_category_in_suite_order():
    suite = b.builtin_prompts()
    picked = b.select_prompts(suite, ["math", "chat"], per_category=1)
    assert [p.category for p in picked] == ["chat", "math"]  # suite order
    with pytest.raises(SpecllmError, match="no prompts in category poetry"):
        b.select_prompts(suite, ["poetry"])
    with pytest.raises(SpecllmError, match=">= 1"):
        b.select_prompts(suite, None, per_category=0)


def test_configurations_are_each_drafter_at_each_gamma_once_and_auto_once():
    configs = b.configurations(["model", "none", "ngram", "model"], [2, 4, 2])
    assert [c.name for c in configs] == ["model g=2", "model g=4", "ngram g=2", "ngram g=4"]
    configs = b.configurations(["auto", "ngram"], [2, 4])  # auto chooses its own lengths: once
    assert [(c.name, c.gamma) for c in configs] == [("auto", None), ("ngram g=2", 2), ("ngram g=4", 4)]
    assert b.parse_gammas(" 1, 2,8 ") == [1, 2, 8]
    with pytest.raises(SpecllmError, match="comma-separated integers"):
        b.parse_gammas("1,two")
    with pytest.raises(SpecllmError, match="positive"):
        b.configurations(["ngram"], [0])
    with pytest.raises(SpecllmError, match="unknown drafter 'medusa'"):
        b.configurations(["medusa"], [2])
    with pytest.raises(SpecllmError, match="nothing to compare"):
        b.configurations(["none"], [2])


# --- the formula -------------------------------------------------------------------------------


def test_expected_tokens_and_prediction():
    assert b.expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert b.expected_tokens(1.0, 4) == 5
    assert b.expected_tokens(0.0, 4) == 1
    V = {"1": 1.0, "2": 1.5, "3": 2.0}
    # Every step drafted 2 tokens: E / (k c + V(k+1)).
    assert b.predicted_speedup([(2, 2)] * 3, 0.5, 0.25, V) == pytest.approx(1.75 / (2 * 0.25 + 2.0))
    # Steps that draft nothing emit one token for one target call.
    assert b.predicted_speedup([(0, 0)] * 5, 0.9, 0.0, V) == pytest.approx(1.0)
    mixed = [(0, 0), (2, 1)]
    assert b.predicted_speedup(mixed, 0.5, 0.0, V) == pytest.approx((1 + 1.75) / (1 + 2.0))
    assert b.predicted_speedup([], 0.5, 0.0, V) is None


def test_per_token_acceptance_counts_accepted_over_judged_tokens():
    # Accepted 2 then rejected; accepted all 3; rejected at once: 5 accepted, 2 rejections.
    assert b.per_token_acceptance([(3, 2), (3, 3), (2, 0), (0, 0)]) == pytest.approx(5 / 7)
    assert b.per_token_acceptance([(0, 0)]) is None  # nothing judged: no estimate


def test_aggregated_stats_add_up_tokens_time_and_positions():
    s1 = Stats(generated_tokens=3, decode_seconds=1.0, drafted_per_position=[2, 1], accepted_per_position=[1, 0])
    s2 = Stats(generated_tokens=5, decode_seconds=1.5, drafted_per_position=[3], accepted_per_position=[3])
    total = b.aggregate([s1, s2])
    assert total.generated_tokens == 8 and total.decode_seconds == 2.5
    assert total.drafted_per_position == [5, 1] and total.accepted_per_position == [4, 0]


# --- the runner --------------------------------------------------------------------------------


def test_bench_results_have_every_field(results, engine, tmp_path):
    assert results["machine"]["threads"] == 1
    for key in ("cpu", "gpu_offload", "target_gpu_layers", "devices", "llama_cpp_python"):
        assert key in results["machine"]
    assert results["models"]["target"]["name"] == "target.gguf"
    assert results["models"]["draft"]["name"] == "draft.gguf"
    assert results["settings"]["greedy"] and results["settings"]["categories"] == {"code": 1, "edit": 1, "chat": 1}
    # V(n) for n = 1 .. max gamma + 1 (a verify call on k drafts evaluates k + 1 tokens), V(1) = 1.
    assert list(results["V"]) == ["1", "2", "3", "4"] and results["V"]["1"] == 1.0
    assert results["c"] > 0 and results["calibration"]["target_step_seconds"] > 0

    names = [r["configuration"] for r in results["results"]]
    assert names == ["target-only", "model g=1", "model g=3", "ngram g=1", "ngram g=3"]
    for r in results["results"]:
        speculative = r["drafter"] != "none"
        for summary in [r["overall"], *r["categories"].values()]:
            assert set(summary["stats"]) == STAT_NAMES  # the names `run --json` uses
            assert summary["speedup"] is not None
            if speculative:
                assert summary["predicted_speedup"] > 0 and summary["c"] is not None
                assert summary["fidelity"]["compared"] == summary["prompts"]
        assert list(r["categories"]) == ["code", "edit", "chat"]
        assert len(r["prompts"]) == 3
        for p in r["prompts"]:
            assert set(p["stats"]) == STAT_NAMES and p["stats"]["generated_tokens"] == len(p["tokens"])
            assert p["matches"] is (None if not speculative else p["divergence"] is None)
        assert r["prompts"][2]["stats"]["generated_tokens"] <= 8  # the prompt's own max_tokens
    model_g3 = results["results"][2]["overall"]
    assert len(model_g3["per_position_acceptance"]) == 3
    assert model_g3["stats"]["n_drafted"] > 0
    for key in (
        "configuration",
        "speedup",
        "predicted_speedup",
        "recommended",
        "c",
        "V_verify",
        "expected_tokens_per_call",
        "break_even_c",
        "by_category",
        "by_drafter",
    ):
        assert key in results["best"]

    # Every speculative token is what its own verify call picked: never a bug.
    for r in results["results"][1:]:
        assert r["overall"]["fidelity"]["bugs"] == 0

    # Progress: monotone, ends complete.
    progress = results.pop("_progress")
    assert progress[0][0] == "warm-up" and progress[-1][1] == progress[-1][2]
    assert [e[1] for e in progress] == sorted(e[1] for e in progress)

    path = tmp_path / "out.json"
    b.write_json(results, path)
    assert json.loads(path.read_text())["results"][0]["configuration"] == "target-only"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]  # no temporary left behind


def test_target_only_is_the_plain_engine_output(engine, results):
    """The baseline is exactly what `run --drafter none` generates."""
    expected = engine.generate(SMALL_SUITE[0].prompt, chat=True, max_tokens=24, temperature=0, drafter="none")
    assert results["results"][0]["prompts"][0]["tokens"] == expected.tokens


def test_write_json_leaves_nothing_on_error(tmp_path):
    with pytest.raises(TypeError):
        b.write_json({"x": object()}, tmp_path / "out.json")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(SpecllmError, match="cannot write"):
        b.write_json({}, tmp_path / "no-such-dir" / "out.json")


def test_a_prompt_longer_than_the_context_is_refused_before_anything_runs(engine):
    too_long = b.BenchPrompt("word " * engine.target.n_ctx, "long")
    events = []
    with pytest.raises(ContextFull, match=r"^prompt 3 \(long: 'word word") as refused:
        b.run_bench(engine, [*SMALL_SUITE[:2], too_long], settings(), lambda *e: events.append(e))
    assert refused.value.n_ctx == engine.target.n_ctx and events == []  # no warm-up, no prompt run


def test_model_drafter_needs_a_draft(tiny_models):
    e = specllm.load(str(tiny_models.target), n_ctx=256, n_threads=1)
    try:
        with pytest.raises(SpecllmError, match="needs a draft model"):
            b.run_bench(e, SMALL_SUITE, settings())
    finally:
        e.close()


# --- fidelity ----------------------------------------------------------------------------------

MODEL_G3 = b.Configuration("model", 3)


def one_token_logits(engine, run: b.PromptRun) -> list[np.ndarray]:
    """The target's one-token logits before each emitted token of a target-only run."""
    return [b.reference_logits(engine.target, run.prompt_tokens, run.emitted[:i]) for i in range(len(run.emitted))]


def top2_gaps(logits: list[np.ndarray]) -> list[float]:
    return [float(np.sort(row)[-1] - np.sort(row)[-2]) for row in logits]


@pytest.fixture(scope="module")
def reference(engine):
    run = b.run_one(engine, 0, SMALL_SUITE[0], b.BASELINE, settings(max_tokens=24))
    return run, one_token_logits(engine, run)


@pytest.fixture(scope="module")
def speculative(engine, reference):
    run = b.run_one(engine, 0, SMALL_SUITE[0], MODEL_G3, settings(max_tokens=24))
    assert run.emitted == reference[0].emitted  # no flip on this prompt: the cases below are planted
    return run


def test_equal_outputs_pass_the_fidelity_check(engine, speculative):
    run = speculative
    assert b.check_fidelity(engine.target, run.prompt_tokens, run.emitted, list(run.emitted), run.calls) is None


def test_replay_rebuilds_the_verify_call_of_every_position(engine, speculative):
    """replay_logits finds the call that emitted each position and its row there: the target's
    argmax in the replayed call is the token the run emitted."""
    run = speculative
    assert any(len(drafted) == 3 and accepted >= 2 for drafted, accepted in run.calls)
    rows = []
    for pos, token in enumerate(run.emitted):
        logits, call = b.replay_logits(engine.target, run.prompt_tokens, run.emitted, run.calls, pos)
        drafted, accepted = run.calls[call["index"]]
        assert call["width"] == len(drafted) + 1 and call["row"] <= accepted
        assert int(np.argmax(logits)) == token
        rows.append(call["row"])
    assert sorted(set(rows))[:3] == [0, 1, 2]  # accepted draft tokens and target tokens alike
    assert b.replay_logits(engine.target, run.prompt_tokens, run.emitted, run.calls, len(run.emitted)) is None


def test_replay_never_shows_the_target_a_draft_id_it_does_not_have(engine, speculative):
    """A draft from a larger vocabulary can propose an id past the target's: it is rejected without
    being evaluated, so the replayed call ends before it."""
    run, past_vocab = speculative, engine.target.n_vocab + 5
    calls = [(d[:a] + [past_vocab] + d[a + 1 :], a) if a < len(d) else (d, a) for d, a in run.calls]
    assert calls != run.calls
    for pos, token in enumerate(run.emitted):
        logits, call = b.replay_logits(engine.target, run.prompt_tokens, run.emitted, calls, pos)
        drafted, accepted = calls[call["index"]]
        assert call["width"] == (accepted + 1 if past_vocab in drafted else len(drafted) + 1)
        assert int(np.argmax(logits)) == token


def test_planted_divergence_at_a_clear_choice_is_a_bug(engine, reference, speculative):
    run, logits = reference
    pos = 5
    planted = list(run.emitted)
    planted[pos] = int(np.argmin(logits[pos]))  # the target's least likely token
    planted[pos + 1 :] = run.emitted[pos + 2 :] + [run.emitted[0]]  # and it goes on differently
    d = b.check_fidelity(engine.target, run.prompt_tokens, run.emitted, planted, speculative.calls)
    assert d["position"] == pos and d["kind"] == b.BUG
    assert d["target_token"] == run.emitted[pos] == d["reference_argmax"] == d["batch_argmax"]
    assert d["speculative_token"] == planted[pos]
    assert d["gap"] > 1.0 and d["speculative_rank"] > 100 and d["batch_gap"] < -1.0


def test_a_verifier_that_picks_the_runner_up_at_a_close_call_is_a_bug(engine, reference, monkeypatch):
    """The bug a gap threshold let through: the speculative loop emits the target's second-best
    token where it is within a logit of the best (as on most positions of a real model). The
    verify call that emitted it, replayed, picks the best token: a bug, not a near-tie."""
    run, logits = reference
    gaps = top2_gaps(logits)
    pos = next(i for i, gap in enumerate(gaps) if i > 0 and 0.05 < gap < 1.0)
    runner_up = int(np.argsort(logits[pos])[-2])
    real_verify = engine_module.verify_greedy
    done = 0  # output tokens emitted before the current call

    def picks_the_runner_up(draft, argmax):
        nonlocal done
        row = pos - done
        argmax = [argmax[i] for i in range(len(argmax))]  # the engine's rows are computed when read
        if 0 <= row < len(argmax):
            argmax[row] = runner_up
        verdict = real_verify(draft, argmax)
        done += verdict.n_accepted + 1
        return verdict

    with monkeypatch.context() as m:
        m.setattr(engine_module, "verify_greedy", picks_the_runner_up)
        buggy = b.run_one(engine, 0, SMALL_SUITE[0], MODEL_G3, settings(max_tokens=24))
    assert buggy.emitted[:pos] == run.emitted[:pos] and buggy.emitted[pos] == runner_up
    d = b.check_fidelity(engine.target, run.prompt_tokens, run.emitted, buggy.emitted, buggy.calls)
    assert d["position"] == pos and d["speculative_rank"] == 1 and d["gap"] == pytest.approx(gaps[pos], abs=1e-3)
    assert d["gap"] < 1.0  # the old rule (a near-tie: within 1 logit) let this through
    assert d["batch_argmax"] == run.emitted[pos] and d["batch_gap"] < 0 and d["kind"] == b.BUG


def test_a_divergence_its_verify_call_reproduces_is_a_near_tie(engine, reference, speculative):
    """A constructed case, whatever the build's rounding: target-only output made to take the
    runner-up at the closest call (as if its one-token rounding had gone the other way). The
    speculative token there is what its own verify call picks: a near-tie."""
    run, logits = reference
    gaps = top2_gaps(logits)
    pos = int(np.argmin(gaps))
    runner_up = int(np.argsort(logits[pos])[-2])
    constructed = run.emitted[:pos] + [runner_up]
    d = b.check_fidelity(engine.target, run.prompt_tokens, constructed, speculative.emitted, speculative.calls)
    assert d["position"] == pos and d["speculative_token"] == speculative.emitted[pos] == d["batch_argmax"]
    assert d["batch_gap"] > 0 and d["kind"] == b.NEAR_TIE


def test_a_real_batch_rounding_flip_is_a_near_tie(engine):
    """Found by search on the tiny models (n_threads=1): with an 8-token draft, the verify call's
    rounding flips a greedy choice whose top-2 gap is ~1e-4, 43 tokens in. The replayed call
    reproduces the flip."""
    prompt = b.BenchPrompt("class get x")
    s = settings(max_tokens=48)
    ref = b.run_one(engine, 0, prompt, b.BASELINE, s)
    run = b.run_one(engine, 0, prompt, b.Configuration("model", 8), s)
    d = b.check_fidelity(engine.target, ref.prompt_tokens, ref.emitted, run.emitted, run.calls)
    if d is None:
        pytest.skip("this llama.cpp build does not flip here (the check itself is tested above)")
    assert d["kind"] == b.NEAR_TIE and d["speculative_rank"] == 1 and d["top2_gap"] < 0.01
    assert d["reference_argmax"] == d["target_token"] and d["batch_argmax"] == d["speculative_token"]
    assert d["call"]["width"] > 1 and d["batch_gap"] > 0


def test_early_end_of_generation_is_a_divergence(engine, reference):
    run, _ = reference
    eos = engine.target.eos
    d = b.check_fidelity(engine.target, run.prompt_tokens, run.emitted, run.emitted[:7] + [eos], run.calls)
    assert d["position"] == 7 and d["speculative_token"] == eos and d["kind"] == b.BUG
    assert d["call"] == {"index": 7, "width": 1, "row": 0} and d["batch_argmax"] == run.emitted[7]


def test_bench_reports_a_planted_divergence(engine, monkeypatch):
    """End to end: corrupt one speculative output the way a broken verify step would; the bench
    finds it, classifies it as a bug, and the explanation and the divergence table say so."""
    real_side_by_side = b.run_side_by_side

    def corrupted(lanes, index, prompt, order, settings):
        runs = real_side_by_side(lanes, index, prompt, order, settings)
        run = runs[b.Configuration("ngram", 1)]
        if index == 1:
            logits = b.reference_logits(engine.target, run.prompt_tokens, run.emitted[:3])
            run.emitted[3] = int(np.argmin(logits))
        return runs

    monkeypatch.setattr(b, "run_side_by_side", corrupted)
    out = b.run_bench(engine, SMALL_SUITE, settings(configurations=(b.Configuration("ngram", 1),)))
    fid = out["results"][1]["overall"]["fidelity"]
    assert fid["matched"] == 2 and fid["bugs"] == 1 and fid["fraction"] == pytest.approx(2 / 3)
    assert fid["divergences"][0]["prompt_index"] == 1 and fid["divergences"][0]["position"] == 3
    assert out["results"][1]["prompts"][1]["matches"] is False
    assert out["results"][1]["categories"]["edit"]["fidelity"]["bugs"] == 1
    text = render_text(out)
    assert "Divergences from target-only output" in text and "bug" in text
    assert any("BUG" in line for line in explanation(out))


def test_sampled_runs_skip_fidelity(engine):
    from specllm.engine.sampling import SamplerSettings

    s = settings(configurations=(b.Configuration("model", 2),), sampler=SamplerSettings(temperature=0.8, seed=3))
    out = b.run_bench(engine, SMALL_SUITE[:1], s)
    assert out["results"][1]["overall"]["fidelity"] is None and out["results"][1]["prompts"][0]["matches"] is None
    assert any("not checked" in line for line in explanation(out))


# --- the view and the command ------------------------------------------------------------------


def render_text(results) -> str:
    console = Console(record=True, width=140, force_terminal=False)
    render(results, console)
    return console.export_text()


def test_the_text_report_explains_costs_speeds_and_acceptance(results):
    text = render_text(results)
    for part in (
        "Cost on this machine",
        "V(n)",
        "Overall (3 prompts)",
        "code (1 prompt)",
        "edit (1 prompt)",
        "Decode speed",
        "target-only",
        "model g=3",
        "ngram g=1",
        "Measured costs",
    ):
        assert part in text


def test_the_explanation_gives_the_loops_own_time_per_step_of_every_configuration(results):
    sentence = next(line for line in explanation(results) if line.startswith("The loop's own work"))
    for r in results["results"]:
        ms = r["overall"]["stats"]["loop_seconds_per_step"] * 1000
        assert ms > 0
        assert f"{r['configuration']} {ms:.2f}" in sentence


def test_explanation_says_plainly_when_speculation_loses(results):
    losing = copy.deepcopy(results)
    losing["timing_check"]["stable"] = True
    best = losing["best"]
    best.update(speedup=0.6, wins=False, recommended="target-only")
    for cat in best["by_category"].values():
        cat.update(speedup=0.8, wins=False)
    best["by_drafter"]["model"].update(speedup=0.5, break_even_c=-0.2)
    lines = explanation(losing)
    assert lines[0].startswith("Speculation loses on this machine: target-only decoding")
    assert any("even a free draft model could not win" in line and "V near 1" in line for line in lines)
    assert any("use --drafter none" in line for line in lines)

    winning = copy.deepcopy(results)
    winning["timing_check"]["stable"] = True
    winning["best"].update(speedup=1.5, wins=True, configuration="ngram g=3", drafter="ngram", gamma=3)
    winning["best"]["by_category"]["edit"].update(speedup=1.8, wins=True, configuration="ngram g=3")
    lines = explanation(winning)
    assert lines[0].startswith("Best on this machine: ngram g=3, 1.50x")
    assert any("edit (1.80x with ngram g=3)" in line for line in lines)
    assert lines[-2] == "Use --drafter ngram --gamma 3 on this machine."

    noisy = copy.deepcopy(winning)
    noisy["timing_check"].update(stable=False, spread=4.0, target_only_step_seconds=[0.01, 0.04])
    lines = explanation(noisy)
    assert lines[0].startswith("WARNING: the timings are unstable") and "not reliable" in lines[0]
    assert lines[1].startswith("Best on this machine")


def test_the_timing_warning_and_the_costs_give_sub_millisecond_steps_in_figures(results):
    """A tiny model's step takes a fraction of a millisecond: rounded to whole ones, the warning
    said a step "took 0 to 0 ms" next to a spread of 4x."""
    noisy = copy.deepcopy(results)
    noisy["timing_check"].update(
        stable=False, spread=4.0, target_only_step_seconds=[0.00009, 0.00036], calibration_step_seconds=0.00012
    )
    noisy["calibration"].update(target_step_seconds=0.00012, draft_step_seconds=0.000087)
    lines = explanation(noisy)
    assert "a target-only step took 0.09 to 0.36 ms across prompts and calibration (4.0x)" in lines[0]
    assert next(line for line in lines if line.startswith("The loop's own work")).endswith(
        "a target step takes 0.12 ms."
    )
    assert "draft step 0.087 ms / target step 0.12 ms" in render_text(noisy)


def test_the_timing_check_says_whether_target_steps_were_stable(results):
    check = results["timing_check"]
    assert len(check["target_only_step_seconds"]) == 3 and check["spread"] >= 1.0
    assert check["stable"] == (check["spread"] <= b.UNSTABLE_SPREAD)


def test_brackets_in_categories_and_tokens_are_shown_as_they_are_not_read_as_markup(engine, monkeypatch):
    """A category of the user's prompts file, or a token such as Llama 2's "[/INST]", holds
    brackets that Rich would read as markup (a "[/]" with nothing to close raised MarkupError once
    the whole bench had run): every table, the bar's label and the explanation show them as text."""
    from specllm.bench.view import BenchProgress

    suite = [b.BenchPrompt(p.prompt, f"[/]{p.category} [bold]x") for p in SMALL_SUITE]
    real_side_by_side = b.run_side_by_side

    def diverging(lanes, index, prompt, order, settings):
        runs = real_side_by_side(lanes, index, prompt, order, settings)
        if index == 1:  # a divergence, for the table that names its category and tokens
            run = runs[b.Configuration("ngram", 1)]
            logits = b.reference_logits(engine.target, run.prompt_tokens, run.emitted[:3])
            run.emitted[3] = int(np.argmin(logits))
        return runs

    monkeypatch.setattr(b, "run_side_by_side", diverging)
    progress = BenchProgress(Console(file=io.StringIO(), force_terminal=True, width=100))

    def drawn(description, completed, total):  # the bar's label names the prompt's category
        progress(description, completed, total)
        progress._progress.refresh()

    with progress:
        configurations = (b.Configuration("ngram", 1), b.Configuration("auto", None))
        out = b.run_bench(engine, suite, settings(configurations=configurations), drawn)
    ngram = next(r for r in out["results"] if r["configuration"] == "ngram g=1")
    ngram["overall"]["fidelity"]["divergences"][0]["target_piece"] = "[/INST]"
    out["best"]["auto"]["by_category"]["[/]chat [bold]x"]["matches_best_fixed"] = False  # named in the verdict
    text = render_text(out)
    assert "[/]edit [bold]x (1 prompt)" in text and "[/]edit [bold]x #2" in text and "'[/INST]'" in text
    assert "[/]chat [bold]x (" in " ".join(text.split())  # the verdict's sentence, wherever it wraps
    assert "[/]edit [bold]x" in progress.console.file.getvalue()


def test_the_bench_command_writes_its_json_and_prints_its_report(tiny_models, tmp_path, monkeypatch, capsys):
    from specllm.cli import main as cli

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "Hello", "category": "chat"}\n{"prompt": "def f(x):", "category": "code"}\n')
    out = tmp_path / "out.json"
    argv = [
        "specllm",
        "bench",
        "--target",
        str(tiny_models.target),
        "--draft",
        str(tiny_models.draft),
        "--gamma",
        "1,2",
        "--prompts",
        str(prompts),
        "--categories",
        "code",
        "--max-tokens",
        "8",
        "--threads",
        "1",
        "--ctx-size",
        "512",
        "--seed",
        "7",
        "--json",
        str(out),
    ]
    monkeypatch.setattr(sys, "argv", argv)
    cli.main()
    data = json.loads(out.read_text())
    assert data["settings"]["seed"] == 7 and data["settings"]["prompts"] == 1
    assert data["settings"]["configurations"] == ["auto", "model g=1", "model g=2", "ngram g=1", "ngram g=2"]
    assert "Overall (1 prompt)" in capsys.readouterr().out  # default drafters with --draft: auto,model,ngram

    argv = [
        "specllm",
        "bench",
        "--target",
        str(tiny_models.target),
        "--prompts",
        str(prompts),
        "--gamma",
        "3",
        "--max-tokens",
        "4",
        "--threads",
        "1",
        "--ctx-size",
        "512",
        "--json",
        str(out),
    ]
    monkeypatch.setattr(sys, "argv", argv)
    cli.main()
    data = json.loads(out.read_text())
    assert data["settings"]["configurations"] == ["auto", "ngram g=3"] and data["models"]["draft"] is None


def test_a_configuration_that_drafted_nothing_has_no_alpha_and_no_verdict_on_the_draft(
    tiny_models, tmp_path, monkeypatch, capsys
):
    """With one token a reply nothing is ever drafted: alpha was 0%, "the target accepts 0% of the
    draft tokens it judges", and the report concluded that even a free draft could not win."""
    from specllm.cli import main as cli

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "def f(x):", "category": "code"}\n')
    out = tmp_path / "out.json"
    argv = ["specllm", "bench", "--target", str(tiny_models.target), "--draft", str(tiny_models.draft)]
    argv += ["--drafter", "model", "--gamma", "2", "--prompts", str(prompts), "-n", "1", "--threads", "1"]
    monkeypatch.setattr(sys, "argv", argv + ["--ctx-size", "512", "--json", str(out)])
    cli.main()
    report = " ".join(capsys.readouterr().out.split())
    (model,) = [r for r in json.loads(out.read_text())["results"] if r["configuration"] == "model g=2"]
    assert model["overall"]["stats"]["n_drafted"] == 0 and model["overall"]["alpha"] is None
    assert "It drafted nothing here (every reply ended before a draft was made)" in report
    assert "draft tokens it judges" not in report and "even a free draft" not in report


def test_cli_bench_reports_a_malformed_prompt_file(tiny_models, tmp_path, monkeypatch, capsys):
    from specllm.cli import main as cli

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "ok"}\n{"prompt": 3}\n')
    argv = ["specllm", "bench", "--target", str(tiny_models.target), "--prompts", str(prompts)]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as e:
        cli.main()
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert err == f'error: {prompts}: line 2: "prompt" must be a non-empty string\n'


def test_the_json_and_header_report_the_max_tokens_each_prompt_ran_with(engine):
    """A prompt's own max_tokens wins over --max-tokens: the results say so, prompt by prompt."""
    from specllm.bench.view import header

    suite = [b.BenchPrompt("Once upon a time", "chat", max_tokens=5), b.BenchPrompt("Once upon a time", "chat")]
    config = settings(configurations=tuple(b.configurations(["ngram"], [2])), max_tokens=20)
    out = b.run_bench(engine, suite, config)
    assert out["settings"]["max_tokens"] == 20 and out["settings"]["max_tokens_per_prompt"] == [5, 20]
    for result in out["results"]:
        ran = [(p["max_tokens"], len(p["tokens"]), p["stop_reason"]) for p in result["prompts"]]
        assert ran == [(5, 5, "max_tokens"), (20, 20, "max_tokens")], result["configuration"]
    line = header(out).plain.splitlines()[2]
    assert "up to 5-20 tokens a prompt (-n 20; a prompt's own max_tokens wins)" in line
    out["settings"]["max_tokens_per_prompt"] = [20, 20]
    assert "up to 20 tokens ·" in header(out).plain.splitlines()[2]


def test_bench_compares_auto_with_the_fixed_configurations(engine):
    config = settings(configurations=tuple(b.configurations(["auto", "model", "ngram"], [2])))
    out = b.run_bench(engine, SMALL_SUITE, config)
    auto = out["results"][1]
    assert auto["configuration"] == "auto" and auto["gamma"] is None
    for summary in [auto["overall"], *auto["categories"].values()]:
        assert set(summary["stats"]) == STAT_NAMES
        shares = summary["chose"]
        assert set(shares) <= {"none", "ngram", "model"} and sum(shares.values()) == pytest.approx(1.0)
        assert summary["predicted_speedup"] is None  # mixed sources and lengths: no single formula
        assert summary["fidelity"]["compared"] == summary["prompts"] and summary["fidelity"]["bugs"] == 0
    versus = out["best"]["auto"]
    assert versus["overall"]["best_fixed"] == "model g=2"  # the n-gram lookup finds no repeat in these
    assert versus["overall"]["speedup"] == auto["overall"]["speedup"]
    assert list(versus["by_category"]) == ["code", "edit", "chat"]
    for v in versus["by_category"].values():
        assert v["matches_best_fixed"] == (v["speedup"] >= v["best_fixed_speedup"] - b.NOISE)
    assert "auto" not in out["best"]["by_drafter"]
    sentence = next(line for line in explanation(out) if line.startswith("auto: "))
    assert "drafting with n-gram copies on" in sentence and "model g=2" in sentence
    assert render_text(out).count("auto drafted with n-gram copies on") == 4  # each category and overall


def test_rounds_run_the_suite_again_and_add_up(engine, monkeypatch):
    forgets = []
    forget = AutoPolicy.forget_acceptance
    monkeypatch.setattr(AutoPolicy, "forget_acceptance", lambda self: forgets.append(1) or forget(self))
    events = []
    config = settings(configurations=tuple(b.configurations(["auto", "ngram"], [2])), rounds=2)
    out = b.run_bench(engine, SMALL_SUITE, config, lambda *e: events.append(e))
    assert out["settings"]["rounds"] == 2 and len(forgets) == 2  # auto starts each round afresh
    for r in out["results"]:
        assert [(p["round"], p["index"]) for p in r["prompts"]] == [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)]
        o = r["overall"]
        assert o["prompts"] == 3 and o["runs"] == 6 and len(o["round_speedups"]) == 2
        assert o["stats"]["generated_tokens"] == sum(p["stats"]["generated_tokens"] for p in r["prompts"])
        assert r["categories"]["chat"]["runs"] == 2
    target_only = out["results"][0]["prompts"]
    assert [p["tokens"] for p in target_only[:3]] == [p["tokens"] for p in target_only[3:]]  # greedy: same text
    assert [e[0] for e in events if e[0].startswith("code 1/1")] == ["code 1/1 · round 1/2", "code 1/1 · round 2/2"]
    assert events[-1][1] == events[-1][2] == 2 + 3 * 3 * 2
    assert "3 prompts in 3 categories, 2 rounds" in render_text(out)
    assert any(line.startswith("Noise: from round to round") for line in explanation(out))


def test_the_header_counts_one_prompt_and_one_token_in_the_singular(engine):
    config = settings(configurations=(b.Configuration("ngram", 2),), max_tokens=1)
    text = render_text(b.run_bench(engine, SMALL_SUITE[:1], config, lambda *e: None))
    assert "1 prompt in 1 category · greedy" in text and "up to 1 token ·" in text


def test_cli_bench_refuses_zero_rounds(tiny_models, monkeypatch, capsys):
    from specllm.cli import main as cli

    argv = ["specllm", "bench", "--target", str(tiny_models.target), "--rounds", "0"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as e:
        cli.main()
    assert e.value.code == 2 and "--rounds" in capsys.readouterr().err


def test_configurations_run_side_by_side_as_they_run_alone(engine):
    """Lanes share the weights and keep their own KV caches: interleaved step by step, every
    configuration makes the text (and a fixed one exactly the calls) it makes on its own."""
    configs = [b.BASELINE, *b.configurations(["auto", "model", "ngram"], [3])]
    s = settings(configurations=tuple(configs[1:]))
    alone = {c: b.run_one(engine, 1, SMALL_SUITE[1], c, s) for c in configs}
    lanes = {c: engine if c == b.BASELINE else engine.lane() for c in configs}
    for lane in lanes.values():
        assert lane.target._model == engine.target._model and lane.target._ctx != engine.target._ctx or lane is engine
    together = b.run_side_by_side(lanes, 1, SMALL_SUITE[1], configs[::-1], s)
    for lane in lanes.values():
        if lane is not engine:
            lane.close()
    for c in configs:
        assert together[c].emitted == alone[c].emitted, c.name
        if c.drafter != "auto":  # auto's choices also depend on its timings
            assert together[c].calls == alone[c].calls, c.name
    assert any(drafted for drafted, _ in together[b.Configuration("model", 3)].calls)
    # Closing the lanes left the engine's weights alone.
    assert b.run_one(engine, 1, SMALL_SUITE[1], b.BASELINE, s).emitted == alone[b.BASELINE].emitted


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--json", "{tmp}"], "it is a folder"),
        (["--json", "{tmp}/no-such-folder/out.json"], "there is no folder"),
        (["--json", "-"], "--json takes a file name"),
        (["--gamma", "2,600"], "gamma (draft length) 600 is too long"),
    ],
)
def test_bench_refuses_an_output_or_gamma_it_cannot_use_before_it_runs(tiny_models, tmp_path, args, fragment):
    """Not after a bench of many minutes; one line, with nothing before it (a progress bar off a
    terminal printed a blank line)."""
    models = ["--target", tiny_models.target, "--draft", tiny_models.draft, "--threads", 1, "--ctx-size", 256]
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    proc = subprocess.run(
        [sys.executable, "-m", "specllm", "bench", *map(str, models), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert_one_line_error(proc, fragment)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("option", ["--prompts", "--models"])
def test_bench_refuses_to_write_its_results_over_a_file_it_reads(tiny_models, tmp_path, option):
    """--json FILE with FILE the prompts (or pairs) it reads: the results replaced them."""
    given = tmp_path / "mine.jsonl"
    text = '{"prompt": "Say hi"}\n' if option == "--prompts" else "# my pairs\n"
    given.write_text(text)
    models = ["--target", tiny_models.target, "--draft", tiny_models.draft, "--threads", 1, "--ctx-size", 256]
    proc = subprocess.run(
        [sys.executable, "-m", "specllm", "bench", *map(str, models), option, str(given), "--json", "./mine.jsonl"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert_one_line_error(proc, f"is the file given to {option}")
    assert given.read_text() == text


@pytest.mark.parametrize(
    "option, given, kind",
    [
        ("--prompts", "{tmp}/pipe", "a FIFO"),  # opened for reading, it waited for ever for a writer
        ("--prompts", "/dev/null", "a device"),  # /dev/zero was read until memory ran out
        ("--prompts", "{tmp}", "a folder"),
        ("--models", "{tmp}/pipe", "a FIFO"),
        ("--models", "/dev/null", "a device"),
    ],
)
def test_bench_refuses_an_input_that_is_no_regular_file_at_once(tiny_models, tmp_path, option, given, kind):
    os.mkfifo(tmp_path / "pipe")
    given = given.replace("{tmp}", str(tmp_path))
    models = ["--target", tiny_models.target, "--draft", tiny_models.draft, "--threads", 1, "--ctx-size", 256]
    proc = subprocess.run(
        [sys.executable, "-m", "specllm", "bench", *map(str, models), option, given],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert_one_line_error(proc, "cannot read", f"{given}: it is {kind}, not a regular file")


def test_bench_refuses_a_read_only_json_file_before_it_runs(tiny_models, tmp_path):
    """A file made read-only is kept, even by root, in the words /save refuses it in."""
    kept = tmp_path / "results.json"
    kept.write_text("earlier results\n")
    kept.chmod(0o444)
    models = ["--target", tiny_models.target, "--draft", tiny_models.draft, "--threads", 1, "--ctx-size", 256]
    proc = subprocess.run(
        [sys.executable, "-m", "specllm", "bench", *map(str, models), "--json", str(kept)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert_one_line_error(proc, f"cannot write {kept}: the file is read-only")
    assert kept.read_text() == "earlier results\n" and [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_a_configuration_none_of_whose_drafts_were_accepted_is_never_the_best(results):
    """It did target-only decoding's work: a lead it shows is timing noise. It is named as such,
    and auto is measured against the best configuration that did gain, not against it."""
    runs = copy.deepcopy(results["results"])
    by_name = {r["configuration"]: r for r in runs}
    for r in runs[1:]:
        r["overall"]["speedup"] = 1.0
    by_name["model g=3"]["overall"]["speedup"] = 1.3
    assert by_name["model g=3"]["overall"]["stats"]["n_accepted"] > 0
    by_name["ngram g=1"]["overall"].update(speedup=2.0)
    by_name["ngram g=1"]["overall"]["stats"]["n_accepted"] = 0
    auto = copy.deepcopy(by_name["model g=1"])
    auto.update(drafter="auto", configuration="auto")
    auto["overall"].update(speedup=1.29, chose={})
    for cat in auto["categories"].values():
        cat["chose"] = {}
    best = b._best([*runs, auto], results["calibration"])
    assert (best["configuration"], best["unaccepted_faster"]) == ("model g=3", "ngram g=1")
    assert best["auto"]["overall"]["best_fixed"] == "model g=3" and best["auto"]["overall"]["matches_best_fixed"]
    lines = explanation({**results, "best": best})
    noise = "ngram g=1 measured faster, but the target accepted none of its drafts"
    assert any(line.startswith(noise) for line in lines)


def test_when_no_draft_was_accepted_anywhere_no_configuration_is_named_the_best(results):
    """Every configuration did target-only decoding's work: the fastest of them (an n-gram lookup
    that found nothing to draft, measured at 1.28x) was named "the best speculative
    configuration", its speedup "within the noise"; a slower one, that speculation loses."""
    for speedup in (1.28, 0.87):
        runs = copy.deepcopy(results["results"])
        for r in runs[1:]:
            r["overall"]["stats"]["n_accepted"] = 0
            r["overall"]["speedup"] = speedup if r["configuration"] == "ngram g=1" else 0.8
        best = b._best(runs, results["calibration"])
        assert (best["configuration"], best["wins"]) == ("ngram g=1", False)
        headline = explanation({**results, "results": runs, "best": best, "timing_check": {"stable": True}})[0]
        assert headline.startswith("The target accepted no draft token in any configuration: speculation gained")
        assert "ngram g=1" not in headline and f"{speedup:.2f}x" not in headline


def test_a_configuration_that_drafted_nothing_shows_no_acceptance(results):
    """Nothing drafted, nothing judged: its acceptance is no figure at all, where the table said 0%
    and the explanation "the target accepts 0% of what is drafted"."""
    runs = copy.deepcopy(results["results"])
    for ngram in (r for r in runs if r["drafter"] == "ngram"):
        stats = ngram["overall"]["stats"]
        stats.update(n_drafted=0, n_accepted=0, drafted_per_position=[], accepted_per_position=[])
        ngram["overall"].update(per_position_acceptance=[], alpha=0.0)
    out = {**results, "results": runs, "best": b._best(runs, results["calibration"])}
    console = Console(record=True, width=200, force_terminal=False)
    console.print(results_table(out, None))
    row = next(line.split() for line in console.export_text().splitlines() if line.strip().startswith("ngram g=1"))
    assert row[5:] == ["—", "1.00", "3/3", "—"]  # accept, tok/call, matched, per position
    why = next(line for line in explanation(out) if line.startswith("ngram g=") and "predicted" in line)
    assert "only happens where the output repeats earlier text: it never did here; measured:" in why
    assert "accepts 0%" not in why


def test_auto_is_measured_only_against_fixed_configurations_that_gained(results):
    """A fixed configuration none of whose drafts were accepted did target-only decoding's work:
    auto was said to trail it (at a speed that is timing noise), and with no fixed configuration
    beside it, to have "done as well as the best fixed configuration"."""
    runs = copy.deepcopy(results["results"])
    auto = copy.deepcopy(next(r for r in runs if r["configuration"] == "model g=1"))
    auto.update(drafter="auto", configuration="auto", gamma=None)
    for summary in [auto["overall"], *auto["categories"].values()]:
        summary.update(speedup=1.0, chose={"none": 1.0})
    ngram = [r for r in runs if r["drafter"] == "ngram"]
    for r in ngram:
        for summary in [r["overall"], *r["categories"].values()]:
            summary.update(speedup=1.5)
            summary["stats"]["n_accepted"] = 0
    for fixed in (ngram, []):
        out = {**results, "results": [runs[0], auto, *fixed]}
        out["best"] = b._best(out["results"], results["calibration"])
        versus = out["best"]["auto"]
        assert versus["overall"]["best_fixed"] is None
        assert all(v["best_fixed"] is None for v in versus["by_category"].values())
        lines = explanation(out)
        assert not any("best fixed" in line or "ngram g=" in line and "against" in line for line in lines)
        assert "Keep auto, the default drafter: it drafts only where that pays (1.00x target-only here)" in " ".join(
            lines
        )


def test_a_lead_that_one_round_does_not_show_is_no_win(results):
    """With --rounds the bench measures its own noise, the spread of a configuration's speedups from
    round to round, and prints it: a configuration 1.14x faster over three rounds but 0.95x in one
    of them was named "Best on this machine" all the same, a category likewise. A round at 1.01x
    does not undo a lead (code, 1.15x): more rounds must not make a real gain harder to show."""
    runs = copy.deepcopy(results["results"])
    for r in runs[1:]:
        for summary in [r["overall"], *r["categories"].values()]:
            summary.update(speedup=0.9, round_speedups=[0.9, 0.9, 0.9])
    model = next(r for r in runs if r["configuration"] == "model g=3")
    model["overall"].update(speedup=1.14, round_speedups=[1.3, 0.95, 1.2])
    model["categories"]["code"].update(speedup=1.15, round_speedups=[1.2, 1.01, 1.25])
    model["categories"]["edit"].update(speedup=1.5, round_speedups=[1.6, 1.8, 0.98])
    best = b._best(runs, results["calibration"])
    assert best["configuration"] == "model g=3" and not best["wins"] and best["recommended"] == "target-only"
    assert best["by_category"]["code"]["wins"] and not best["by_category"]["edit"]["wins"]
    lines = explanation({**results, "results": runs, "best": best, "timing_check": {"stable": True}})
    assert lines[0] == (
        "No clear winner: the best speculative configuration, model g=3, runs at 1.14x target-only "
        f"({best['tokens_per_second']:.1f} against {best['target_only_tokens_per_second']:.1f} tok/s), but 0.95x "
        "in its slowest round, within the noise of this measurement."
    )
    assert "Speculation pays in code (1.15x with model g=3)." in lines


def test_a_configuration_that_gained_nothing_and_lost_is_not_said_to_lead_by_noise(results):
    """An n-gram lookup that found nothing to draft measured 0.52x, faster than the draft model at
    0.39x: it skipped the drafting, a lead that is no timing noise, as the verdict said it was."""
    runs = copy.deepcopy(results["results"])
    by_name = {r["configuration"]: r for r in runs}
    for r in runs[1:]:
        r["overall"]["speedup"] = 0.3
    by_name["model g=1"]["overall"]["speedup"] = 0.39
    by_name["ngram g=3"]["overall"].update(speedup=0.52)
    by_name["ngram g=3"]["overall"]["stats"]["n_accepted"] = 0
    best = b._best(runs, results["calibration"])
    assert (best["configuration"], best["unaccepted_faster"]) == ("model g=1", "ngram g=3")
    lines = explanation({**results, "results": runs, "best": best})
    assert (
        "ngram g=3 measured faster, but the target accepted none of its drafts: it did the work of target-only "
        "decoding, at 0.52x its speed."
    ) in lines
    assert not any("noise" in line for line in lines if line.startswith("ngram g=3 measured"))


def test_the_explanation_tells_alpha_from_the_accept_column(results):
    """alpha counts only the draft tokens the target judged; the table's accept column, accepted /
    drafted, counts those after a rejection too. The explanation said "the target accepts 89% of
    draft tokens" under a table whose accept column said 78%."""
    runs = copy.deepcopy(results["results"])
    for r in runs[1:]:  # the draft model at gamma 3 is the model drafter's best
        r["overall"]["speedup"] = 1.5 if r["configuration"] == "model g=3" else 1.0
    best = b._best(runs, results["calibration"])
    d = best["by_drafter"]["model"]
    stats = next(r for r in runs if r["configuration"] == "model g=3")["overall"]["stats"]
    assert d["configuration"] == "model g=3" and d["acceptance_rate"] == stats["acceptance_rate"]
    assert d["alpha"] > d["acceptance_rate"] > 0  # some draft of 3 was cut short by a rejection
    line = next(
        line for line in explanation({**results, "results": runs, "best": best}) if line.startswith("model g=3: ")
    )
    assert (
        f"The target accepts alpha = {d['alpha']:.0%} of the draft tokens it judges (the accept column's "
        f"{d['acceptance_rate']:.0%} also counts those after a rejection, never judged), so a call should yield"
    ) in line
    d.update(configuration="model g=1", k=1, alpha=0.78, acceptance_rate=0.78)  # every token judged: one figure
    line = next(
        line for line in explanation({**results, "results": runs, "best": best}) if line.startswith("model g=1: ")
    )
    assert "The target accepts alpha = 78% of the draft tokens it judges, so a call should yield" in line


def test_auto_beats_the_best_fixed_configuration_only_by_more_than_the_noise(results):
    """auto at 1.004x against the draft model's 1.001x was said to beat it: "auto: 1.00x measured
    ... it beats the best fixed configuration overall (model g=3, 1.00x)"."""
    runs = copy.deepcopy(results["results"])
    for r in runs[1:]:
        r["overall"]["speedup"] = 0.9
    next(r for r in runs if r["configuration"] == "model g=3")["overall"]["speedup"] = 1.001
    auto = copy.deepcopy(next(r for r in runs if r["configuration"] == "model g=3"))
    auto.update(drafter="auto", configuration="auto", gamma=None)
    for summary in [auto["overall"], *auto["categories"].values()]:
        summary["chose"] = {"model": 1.0}
    for speedup, verdict in ((1.004, "matches"), (1.001 + b.NOISE, "beats"), (1.001 - b.NOISE - 0.01, "trails")):
        auto["overall"]["speedup"] = speedup
        out = {**results, "results": [*runs, auto]}
        out["best"] = b._best(out["results"], results["calibration"])
        line = next(line for line in explanation(out) if line.startswith("auto: "))
        assert f"; it {verdict} the best fixed configuration overall (model g=3, 1.00x)" in line


def test_autos_shares_of_steps_add_up_to_100_percent():
    """Each share rounded on its own, thirds read 33% + 33% + 33%, and a source auto used on 0.4%
    of its steps read 0%, as if never used."""
    from specllm.bench.view import _mix, whole_percents

    assert _mix({"ngram": 1 / 3, "model": 1 / 3, "none": 1 / 3}) == (
        "n-gram copies on 34%, the draft model on 33%, the MTP layers on 0%, nothing on 33% of steps"
    )
    assert _mix({"model": 0.004, "none": 0.996}).startswith("n-gram copies on 0%, the draft model on 1%,")
    assert whole_percents([0.16, 0.84]) == [16, 84]
    assert whole_percents([0.57, 0.43]) == [57, 43]  # 0.57 * 100 is 56.99999999999999
    assert whole_percents([0.125, 0.125, 0.375, 0.375]) == [13, 13, 37, 37]
    assert whole_percents([0.005, 0.005, 0.005, 0.985]) == [1, 1, 1, 97]
    assert whole_percents([0.0, 1.0]) == [0, 100]
