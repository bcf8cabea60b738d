"""benchmarks/overhead.py measures the loop on real models, with and without its timers, and
compares two checkouts round by round."""

import json
import re

from benchmark_scripts import ROOT, run_benchmark


def overhead(*args: str):
    return run_benchmark("overhead.py", *args, timeout=300)


def test_overhead_reports_the_untimed_loop_the_timed_one_and_its_parts_for_both_checkouts(tiny_models):
    proc = overhead(str(tiny_models.target), str(tiny_models.draft), "-n", "16", "--against", str(ROOT))
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert len(re.findall(r"^  untimed_loop_ms_per_step +\d+\.\d{3}", out, re.MULTILINE)) == 2
    assert len(re.findall(r"^  loop_ms_per_step +\d+\.\d{3}", out, re.MULTILINE)) == 2
    assert len(re.findall(r"^    batch filling +\d+\.\d{3}$", out, re.MULTILINE)) == 2
    assert "outputs identical across versions and rounds: True" in out


def test_the_untimed_run_alone_needs_only_specllms_api(tiny_models):
    """What an older checkout's copy of the script lacks is measured by this one."""
    proc = overhead(str(tiny_models.target), str(tiny_models.draft), "-n", "16", "--json", "--untimed-only")
    assert proc.returncode == 0, proc.stderr[-2000:]
    figures = json.loads(proc.stdout)
    assert list(figures) == ["untimed_loop_ms_per_step"] and figures["untimed_loop_ms_per_step"] > 0
