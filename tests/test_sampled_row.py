"""benchmarks/sampled_row.py times a sampled row's and a greedy draft row's host work, compiled and
numpy, warm and cold."""

import re

from benchmark_scripts import run_benchmark

PARTS = ("chain", "draw", "by id", "target row", "lookups", "residual", "its draw")
GREEDY_PARTS = ("argmax", "confidence")
NAMES = ["compiled, warm", "compiled, cold", "numpy, warm", "numpy, cold"]


def check_table(lines: list[str], parts: tuple[str, ...]) -> None:
    assert lines[0].split() == [word for part in (*parts, "total") for word in part.split()]
    rows = {line[:16].strip(): line[16:].split() for line in lines[1:]}
    assert list(rows) == NAMES
    for name, cells in rows.items():
        assert len(cells) == len(parts) + 1, name
        assert all(re.fullmatch(r"\d+\.\d", c) and float(c) > 0 for c in cells), name


def test_sampled_row_reports_every_part_for_both_implementations(tiny_models):
    proc = run_benchmark("sampled_row.py", str(tiny_models.target), "--rounds", "3")
    assert proc.returncode == 0, proc.stderr[-2000:]
    sampled, greedy = proc.stdout.strip().split("\n\n")
    check_table(sampled.splitlines()[1:], PARTS)
    title, *table = greedy.splitlines()
    assert re.search(r"the model's own row \(\d+\.\d% of its logits within 20 of the top\)", title), title
    check_table(table, GREEDY_PARTS)
