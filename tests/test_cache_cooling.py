"""benchmarks/cache_cooling.py runs on a real model and reports every setting it times."""

import re

from benchmark_scripts import run_benchmark


def test_cache_cooling_times_every_setting_including_a_llama_cpp_call(tiny_models):
    proc = run_benchmark("cache_cooling.py", str(tiny_models.target), "--rounds", "3")
    assert proc.returncode == 0, proc.stderr[-2000:]
    cell = r"\s+(\d+\.\d) \(\s*\d+\.\d-\s*\d+\.\d\)"
    rows = {}
    for line in proc.stdout.splitlines():
        m = re.fullmatch(r"(\S.*?)" + 3 * cell, line)
        if m:
            rows[m.group(1)] = tuple(float(m.group(i)) for i in (2, 3, 4))
    spins = [f"after a {ms} ms spin" for ms in ("0.1", "1", "5", "20", "50")]
    sleeps = [name.replace("spin", "sleep") for name in spins]
    assert list(rows) == ["warm", *spins, *sleeps, "after a one-token llama.cpp call"]
    assert all(small > 0 and row > 0 and statements > 0 for small, row, statements in rows.values())
