"""benchmarks/grammar_mask.py times a grammar's whole-vocabulary check, narrowed and not, in each
state along a JSON text (and stops where the two answers differ)."""

import re

from benchmark_scripts import run_benchmark


def test_grammar_mask_reports_each_state_and_the_medians(tiny_models):
    proc = run_benchmark("grammar_mask.py", str(tiny_models.target), "--repeats", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert re.fullmatch(r"\S+\.gguf: \d+ tokens; probes found in \d+\.\d\d s \(once\)", lines[0]), lines[0]
    states = [line for line in lines if re.fullmatch(r"\s*\d+\s+\d+\.\d ms\s+\d+\.\d\d ms", line)]
    assert len(states) > 20
    assert any(line.startswith("few allowed (") for line in lines)
