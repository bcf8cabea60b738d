"""benchmarks/sampled_row.py times a sampled row's host work, compiled and numpy, warm and cold."""

import re

from benchmark_scripts import run_benchmark

PARTS = ("chain", "draw", "by id", "target row", "lookups", "residual", "its draw", "total")


def test_sampled_row_reports_every_part_for_both_implementations(tiny_models):
    proc = run_benchmark("sampled_row.py", str(tiny_models.target), "--rounds", "3")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[1].split() == [word for part in PARTS for word in part.split()]
    rows = {line[:16].strip(): line[16:].split() for line in lines[2:]}
    assert list(rows) == ["compiled, warm", "compiled, cold", "numpy, warm", "numpy, cold"]
    for name, cells in rows.items():
        assert len(cells) == len(PARTS) and all(re.fullmatch(r"\d+\.\d", c) and float(c) > 0 for c in cells), name
