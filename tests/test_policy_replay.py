"""benchmarks/policy_replay.py's draft-model replay: the recorded traces decide every greedy draft
exactly, and the modeled cost of a step is what the cost model says."""

import importlib.util
import json
import math

import pytest
from benchmark_scripts import ROOT, run_benchmark

import specllm

spec = importlib.util.spec_from_file_location("policy_replay", ROOT / "benchmarks" / "policy_replay.py")
replay = importlib.util.module_from_spec(spec)
spec.loader.exec_module(replay)

V = {1: 1.0, 2: 1.2, 3: 1.5}


def test_a_step_costs_its_draft_steps_and_its_verify_call():
    assert replay.model_replay([True] * 6, 2, 0.5, V) == pytest.approx(6 / (2.5 + 2.5))
    # after a fully accepted draft the draft model first catches up on two tokens
    assert replay.model_replay([True] * 6, 2, 0.5, V, draft_V2=1.5) == pytest.approx(6 / (2.5 + 2.75))
    # nothing accepted: each step yields the target's own token
    assert replay.model_replay([False] * 3, 2, 0.5, V) == pytest.approx(3 / ((1 + 1.5) + (0.5 + 1.2) + 1.0))


def test_the_traces_decide_each_greedy_draft_as_the_engine_does(tiny_models):
    """For every step of a real greedy generation with the draft model, the accepted length is the
    run of matching positions the teacher-forced trace says, capped at the draft's length."""
    engine = specllm.load(str(tiny_models.target), str(tiny_models.draft), n_ctx=512, n_threads=1)
    try:
        prompt = engine.prompt_tokens("def fibonacci(n):", chat=True)
        for gamma in (1, 3):
            generation = engine.start(prompt, max_tokens=48, temperature=0, drafter="model", gamma=gamma)
            steps = list(generation)
            output = generation.result.tokens
            matches = replay.draft_matches(engine.draft, prompt, output)
            i = 0
            for step in steps:
                k = len(step.drafted)
                predicted = next((j for j in range(k) if not matches[i + j]), k)
                assert step.accepted == predicted, (gamma, i)
                i += step.accepted + 1
            assert i == len(output) and 0 < sum(matches) < len(matches)  # some drafts fail, some pass
    finally:
        engine.close()


def test_gpu_predictions_come_from_a_gpu_checks_costs(tmp_path, tiny_models):
    out = tmp_path / "check"
    proc = run_benchmark("gpu_check.py", "--dry-run", "--out", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    check = json.loads((out / "gpu_check.json").read_text())
    rows = [{"category": "code", "prompt": [1], "output": [5] * 12, "draft_matches": [True, False] * 6}]
    table = replay.gpu_predictions(rows, check)
    pair = check["pairs"]["0.5B->7B"]
    V = {int(n): v for n, v in check["calibration"][pair["target"]]["V"].items()}
    expected = replay.model_replay(rows[0]["draft_matches"], 3, pair["c"], V, pair["draft_V2"])
    assert table["0.5B->7B"]["speedups"][3]["overall"] == pytest.approx(expected)
    assert table["0.5B->7B"]["speedups"][3]["code"] == pytest.approx(expected)
    speedups = table["0.5B->7B"]["speedups"]
    best = table["0.5B->7B"]["best_gamma"]
    assert all(s["overall"] <= speedups[best]["overall"] for s in speedups.values())


@pytest.mark.slow
def test_pair_costs_measures_the_default_pair_in_the_gpu_checks_shape(tmp_path):
    """About 30 s on the real default pair: the costs come out in the shape `gpu` reads, and they
    are costs (a wider call dearer than a narrow one). Not that a draft step is cheaper than a
    target step: beside another test's threads on the same cores, llama.cpp's threads wait on each
    other at every op, and a 0.5B draft's many small ops once came out at 1.44 target steps."""
    out = tmp_path / "here.json"
    proc = run_benchmark("policy_replay.py", "pair-costs", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    check = json.loads(out.read_text())
    pair = check["pairs"]["default pair"]
    V = check["calibration"][pair["target"]]["V"]
    assert 0 < pair["c"] < math.inf and pair["draft_V2"] > 0 and V["1"] == 1.0 and V["9"] > V["2"] > 0
    rows = [{"category": "code", "prompt": [1], "output": [5] * 12, "draft_matches": [True] * 12}]
    assert set(replay.gpu_predictions(rows, check)["default pair"]["speedups"]) == set(range(1, 9))


def test_the_call_sequences_give_the_costs_of_the_loop_and_of_one_token_drafting():
    """On a GPU the calibration times each width after other widths (no CUDA graph); the check's
    call sequences give the steady costs. 'loop': the draft's one-token calls as they cost after
    its catch-up call of 2, that call's own cost as draft_V2, and steady verify calls (the
    calibration's less the graph's saving on a one-token call); 'one-token': steady drafting."""
    check = {
        "pairs": {"0.5B->14B": {"draft": "d", "target": "t", "c": 0.3, "draft_V2": 1.3}},
        "calibration": {"t": {"t1_ms": 9.0, "V": {"1": 1.0, "2": 1.1, "5": 1.5}}},
        "patterns": {
            "d": {"1 1 1 1": {"1": 1.2}, "2 1 1 1": {"2": 3.6, "1": 2.4}},
            "t": {"1 1 1 1": {"1": 7.0}, "2 1 1 1": {"2": 9.0, "1": 8.0}},
        },
    }
    pair = check["pairs"]["0.5B->14B"]
    assert replay.pair_costs(check, pair, "calibration") == (0.3, {1: 1.0, 2: 1.1, 5: 1.5}, 1.3)
    c, V, v2 = replay.pair_costs(check, pair, "loop")
    assert c == pytest.approx(2.4 / 7.0) and v2 == pytest.approx(1.5)
    assert V[1] == 1.0 and V[2] == pytest.approx((9.9 - 2.0) / 7.0) and V[5] == pytest.approx((13.5 - 2.0) / 7.0)
    c, V1, v2 = replay.pair_costs(check, pair, "one-token")
    assert c == pytest.approx(1.2 / 7.0) and v2 == 2.0 and V1 == V
    del check["patterns"]["t"]
    assert replay.pair_costs(check, pair, "loop") is None  # a run without the sequences: left out
