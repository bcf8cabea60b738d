"""benchmarks/gpu_check.py's dry run: every step of the GPU check on the CPU with tiny shapes, so the
script is known to work before a minute of a GPU is spent on it. The JSON and Markdown must have
the shape a GPU run writes: every section present, numbers where numbers belong."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from slowed import SLOW_CALL, slowed

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


gpc = _module()


def _run(out: Path, *extra: str) -> dict:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--out", str(out), *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "gpu_check.json").read_text())


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _positive(x) -> bool:
    return _number(x) and x > 0


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> tuple[dict, str]:
    out = tmp_path_factory.mktemp("gpu-check")
    data = _run(out)
    return data, (out / "gpu_check.md").read_text()


def test_dry_run_writes_every_section(dry_run):
    data, _ = dry_run
    assert data["schema"] == gpc.SCHEMA
    assert data["mode"] == "dry-run" and data["status"] == "done"
    assert data["errors"] == [] and data["skipped"] == []
    assert data["smoke"]["ok"] is True
    assert set(data) >= {
        "settings",
        "machine",
        "setup",
        "smoke",
        "models",
        "calibration",
        "pairs",
        "plain_decoding",
        "selection",
        "patterns",
        "loop",
        "speedups",
        "fidelity",
    }
    assert set(data["models"]) == set(gpc.DRY_SHAPES)
    assert data["machine"]["sampler"] == "compiled (C)"
    for info in data["models"].values():
        assert _positive(info["bytes"]) and _number(info["write_seconds"]) and _number(info["load_seconds"])


def test_call_costs_and_c(dry_run):
    data, _ = dry_run
    assert set(data["calibration"]) == set(gpc.DRY_SHAPES)
    for cal in data["calibration"].values():
        assert _positive(cal["t1_ms"])
        assert set(cal["V"]) == {str(w) for w in gpc.WIDTHS}
        assert cal["V"]["1"] == 1.0 and all(_positive(v) for v in cal["V"].values())
    assert set(data["pairs"]) == {gpc.pair_name(d, t) for d, t in gpc.CURATED_PAIRS}
    for pair in data["pairs"].values():
        assert _positive(pair["c"]) and _positive(pair["draft_t1_ms"]) and _positive(pair["target_t1_ms"])


def test_each_models_calls_are_timed_in_the_sequences_the_loop_makes(dry_run):
    data, md = dry_run
    assert set(data["patterns"]) == set(gpc.DRY_SHAPES)
    for by_sequence in data["patterns"].values():
        assert set(by_sequence) == set(gpc.CALL_PATTERNS)
        for label, widths in gpc.CALL_PATTERNS.items():
            assert set(by_sequence[label]) == {str(w) for w in widths}
            assert all(_positive(ms) for ms in by_sequence[label].values())
    assert "## Call sequences" in md


def test_call_pattern_times_each_width_once_a_cycle_and_leaves_the_context(tiny_models):
    from specllm.llama.model import Model

    model = Model(tiny_models.target)
    try:
        context = list(range(5, 25))
        calls = []
        real_eval = model.eval
        model.eval = lambda tokens, n: calls.append(len(tokens)) or real_eval(tokens, n)
        result = gpc.call_pattern(model, context, (2, 1, 1), cycles=3)
        assert calls == [len(context)] + [2, 1, 1] * 4  # the context, a warm-up cycle, the timed ones
        assert set(result) == {"2", "1"} and all(_positive(ms) for ms in result.values())
        assert model.tokens == context
    finally:
        model.close()


def test_pairs_and_alphas_choose_what_is_measured(tmp_path):
    data = _run(tmp_path, "--pairs", "1.5B->14B,0.5B->7B", "--alphas", "0.9")
    assert data["status"] == "done" and data["errors"] == []
    assert list(data["speedups"]) == ["1.5B->14B", "0.5B->7B"]
    assert all(list(by) == ["0.9"] for by in data["speedups"].values())
    assert set(data["calibration"]) == {"qwen2.5-1.5b", "qwen2.5-14b", "qwen2.5-0.5b", "qwen2.5-7b"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--out", str(tmp_path / "x"), "--pairs", "3B->70B"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "unknown pair 3B->70B" in proc.stderr


def test_plain_decoding_and_loop(dry_run):
    data, _ = dry_run
    assert set(data["plain_decoding"]) == set(gpc.TARGETS)
    for p in data["plain_decoding"].values():
        for key in ("specllm_tok_s", "ctypes_tok_s", "step_ms"):
            assert _positive(p[key]), key
        assert _number(p["loop_ms_per_step"]) and 0 < p["loop_share"] < 1
        if p["c_loop"] is None:  # no C compiler or no llama.h here: said so
            assert "ctypes loop is the floor" in p["c_loop_note"]
        else:
            assert _positive(p["c_loop"]["sampler_tok_s"]) and _positive(p["c_loop"]["argmax_tok_s"])
            assert _positive(p["specllm_vs_c_sampler"])
    assert set(data["selection"]) == set(gpc.TARGETS)  # each row's token chosen in llama.cpp's graph and on the host
    for results in data["selection"].values():
        assert [r["selection"] for r in results] == ["greedy", "top-k 40"]
        for r in results:
            assert all(_positive(r[k]) for k in ("host_call_ms", "host_select_ms", "graph_call_ms", "graph_select_ms"))
            assert _number(r["graph_minus_host_ms"])
    pairs = {gpc.pair_name(*pair) for _, pair in gpc.STAGES}
    assert set(data["loop"]) == pairs
    for p in data["loop"].values():
        for key in ("target-only", "model g=4", "auto", "model g=4 sampled", "target_step_ms"):
            assert _number(p[key]), key


def test_dry_run_measures_every_pair_at_every_alpha_and_checks_greedy_fidelity(dry_run):
    data, _ = dry_run
    pairs = {gpc.pair_name(*pair) for _, pair in gpc.STAGES}
    assert set(data["speedups"]) == pairs
    n_runs = extra_calls = 0
    for by_alpha in data["speedups"].values():
        assert set(by_alpha) == {str(a) for a in gpc.ALPHAS}
        for r in by_alpha.values():
            assert _positive(r["target_only_tok_s"]) and _positive(r["c"])
            assert _positive(r["best_predicted"]) and 1 <= r["best_k"] <= 15
            # on a CPU the draft catches up in one call; the second g=4 run does it one token a call
            other = gpc.CATCH_UP_CONFIGS[True]
            assert [x["config"] for x in r["runs"]] == [f"model g={g}" for g in gpc.GAMMAS] + [other, "auto"]
            for x in r["runs"]:
                n_runs += 1
                for key in (
                    "tok_s",
                    "speedup",
                    "predicted",
                    "acceptance",
                    "mean_accepted_length",
                    "loop_ms_per_step",
                    "llama_ms_per_step",
                ):
                    assert x["config"] == other or _number(x[key]), (x["config"], key)
                assert x["generated"] == data["settings"]["tokens"]
                assert isinstance(x["identical"], bool) and x["reanchors"] >= 0
            by = {x["config"]: x for x in r["runs"]}
            same, split = by["model g=4"], by[other]  # the same proposals: only the catch-up differs
            assert split["target_calls"] == same["target_calls"] and split["draft_calls"] >= same["draft_calls"]
            extra_calls += split["draft_calls"] - same["draft_calls"]
            auto = r["runs"][-1]["auto"]
            assert auto["summary"] and abs(sum(auto["shares"].values()) - 1) < 1e-9
    assert extra_calls > 0  # fully accepted drafts were caught up on one token a call
    # The GPU-like costs a dry run gives auto make it draft with the (synthetic) draft model somewhere.
    assert any("model" in r["runs"][-1]["auto"]["sources"] for by in data["speedups"].values() for r in by.values())
    fid = data["fidelity"]
    assert fid["runs"] == n_runs and 0 <= fid["identical"] <= n_runs
    assert len(fid["divergences"]) == n_runs - fid["identical"]
    for d in fid["divergences"]:
        assert d["kind"] != "bug", d  # greedy speculative output must only differ from target-only at near-ties
        assert d["kind"] == "near-tie" or d["kind"].startswith("not replayed"), d
        assert isinstance(d["position"], int)


def test_markdown_has_every_table(dry_run):
    _, md = dry_run
    for heading in (
        "## Call costs",
        "## c per pair",
        "## specllm target-only against llama.cpp's plain decoding",
        "## The loop's own time per step",
        "## Speedups at controlled acceptance",
        "## Greedy fidelity",
    ):
        assert heading in md
    for name in gpc.DRY_SHAPES:
        assert f"| {name} |" in md
    for draft, target in gpc.CURATED_PAIRS:
        assert f"| {gpc.pair_name(draft, target)} |" in md
    assert "| 0.5B->32B | 0.9 |" in md


def test_budget_skips_what_does_not_fit(tmp_path):
    data = _run(tmp_path, "--budget", "1")
    assert data["status"] == "done" and data["errors"] == []
    assert data["skipped"] and all("budget" in x["why"] for x in data["skipped"])
    assert data["speedups"] == {}
    assert "## Skipped" in (tmp_path / "gpu_check.md").read_text()


def test_call_timer_counts_every_llama_cpp_call_the_engine_counts(tiny_models, monkeypatch):
    """On a GPU, fetching the logits is where the host waits for the call: the check's timer must
    count it through specllm's own binding of llama_get_logits too, or that wait reads as loop time."""
    import llama_cpp

    from specllm.llama import model as backend

    slowed(monkeypatch, "llama_get_logits")
    for module in (llama_cpp, backend):  # put back whatever the timer wraps, after the test
        for name in gpc.CallTimer.NAMES:
            if hasattr(module, name):
                monkeypatch.setattr(module, name, getattr(module, name))
    timer = gpc.CallTimer()
    target = backend.Model(tiny_models.target)
    try:
        before = timer.seconds
        target.eval(target.tokenize("def add(a, b):"), 1)
        # the model's own clock also holds the timer's wrappers (microseconds): not half a slowed call
        assert target.llama_seconds >= SLOW_CALL
        assert timer.seconds - before > target.llama_seconds - SLOW_CALL / 2
    finally:
        target.close()


def test_written_ggufs_hold_valid_sane_blocks(tmp_path):
    """The quantised blocks as gguf-py reads them: the right types and shapes, finite values of
    about the standard deviation asked for, special and padding rows zero."""
    gguf = pytest.importorskip("gguf")
    from gguf.quants import dequantize

    for name, types in (
        ("qwen2.5-7b", {"Q4_K", "Q6_K", "F32"}),
        ("qwen2.5-0.5b", {"Q5_0", "Q8_0", "Q4_K", "Q6_K", "F32"}),
    ):
        shape = gpc.DRY_SHAPES[name]
        path = gpc.write_gguf(tmp_path / f"{name}.gguf", shape, seed=5)
        assert path.stat().st_size == gpc.model_bytes(shape) + _data_offset(path, gguf)
        reader = gguf.GGUFReader(path)
        specs = {t.name: t for t in gpc.tensors(shape)}
        assert {t.name for t in reader.tensors} == set(specs)
        assert {t.tensor_type.name for t in reader.tensors} == types
        for t in reader.tensors:
            spec = specs[t.name]
            assert tuple(int(x) for x in t.shape) == spec.ne and int(t.tensor_type) == spec.qtype
            x = dequantize(t.data, t.tensor_type)
            assert np.isfinite(x).all()
            if spec.kind in ("matrix", "vocab"):
                live = x[5 : shape.family_vocab] if spec.kind == "vocab" else x
                assert 0.7 * spec.std < live.std() < 1.4 * spec.std, (t.name, live.std(), spec.std)
                assert abs(live.mean()) < 0.2 * spec.std
            if spec.kind == "vocab":
                assert not x[:5].any() and not x[shape.family_vocab :].any()
        pieces = reader.fields["tokenizer.ggml.tokens"]
        assert len(pieces.data) == shape.n_vocab


def _data_offset(path: Path, gguf) -> int:
    return gguf.GGUFReader(path).data_offset


def test_the_devices_compiled_sampler_is_placed_beside_its_source_for_this_python(tmp_path, monkeypatch):
    """gpu_prepare.sh builds specllm's sampler for the CUDA machine's Python into .device/; the
    script copies the build whose suffix this Python imports (and no other) where specllm finds it."""
    import importlib.machinery

    device, repo = tmp_path / "device", tmp_path / "repo"
    (repo / "specllm" / "engine").mkdir(parents=True)
    device.mkdir()
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    (device / "_sampler.cpython-399-x86_64-linux-gnu.so").write_bytes(b"another Python's")
    monkeypatch.setattr(gpc, "DEVICE_DIR", device)
    monkeypatch.setattr(gpc, "REPO", repo)
    assert gpc._place_compiled_sampler() is None
    (device / f"_sampler{suffix}").write_bytes(b"this Python's")
    assert gpc._place_compiled_sampler() == f"_sampler{suffix}"
    assert [p.name for p in (repo / "specllm" / "engine").iterdir()] == [f"_sampler{suffix}"]
    assert (repo / "specllm" / "engine" / f"_sampler{suffix}").read_bytes() == b"this Python's"


def test_the_oracle_decodes_a_contexts_continuation_once(tiny_models, tmp_path):
    """The synthetic drafter's re-anchoring: a context's greedy continuation, decoded one token a
    call on a sibling context, is kept, so the runs of a pair that meet the same near-tie do not
    decode it again."""
    from specllm.llama.model import Model

    settings = gpc.Settings(
        mode="dry-run", shapes=gpc.DRY_SHAPES, prompt_tokens=16, tokens=12, reps=1, n_ctx=256, gpu_layers=0,
        threads=1, budget=0,
    )  # fmt: skip
    check = gpc.Check(settings, gpc.Report(tmp_path, settings, 0.0), tmp_path, keep_models=True)
    target = Model(tiny_models.target)
    check.loaded["t"] = target
    try:
        prompt = list(range(300, 316))
        oracle = check.oracle("t")
        sibling = check.siblings["t"]
        calls, real_eval = [], sibling.eval
        sibling.eval = lambda tokens, n_logits=1: calls.append(len(tokens)) or real_eval(tokens, n_logits)
        first = oracle(prompt, 8)
        made = len(calls)
        assert len(first) == 8 and made >= 7
        assert oracle(prompt, 8) == first and oracle(prompt, 5) == first[:5]  # kept: no call
        assert len(calls) == made
        assert oracle(prompt + first[:3], 5) == first[3:]  # greedy: the same continuation from further on
    finally:
        check.drop("t")
