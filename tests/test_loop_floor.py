"""benchmarks/loop_floor.py runs the least loop there is on a real pair and reports its host time."""

import re

from benchmark_scripts import run_benchmark


def floor(*args: str):
    return run_benchmark("loop_floor.py", *args)


def test_loop_floor_reports_the_host_time_per_step(tiny_models):
    proc = floor(str(tiny_models.target), str(tiny_models.draft), "--steps", "12", "--rows", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = re.search(r"gamma 4, 2 verify rows read, 12 steps\): median (\d+\.\d{3}) ms \(p10 (\d+\.\d{3})", proc.stdout)
    assert m and float(m.group(1)) > 0 and float(m.group(2)) > 0, proc.stdout


def test_loop_floor_refuses_more_rows_than_the_verify_call_has(tiny_models):
    proc = floor(str(tiny_models.target), str(tiny_models.draft), "--gamma", "2", "--rows", "4")
    assert proc.returncode != 0 and "--rows must be in 1..3" in proc.stderr
