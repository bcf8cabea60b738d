"""benchmarks/template_cost.py renders a model's own chat template in llama-cpp-python's sandbox and
in the bounded one, and checks that both give the same text."""

import re

import tiny_models as tm
import tool_templates
from benchmark_scripts import run_benchmark


def test_template_cost_times_both_sandboxes_on_a_models_own_template(tmp_path):
    model = tm.write_model(tmp_path / "qwen35.gguf", seed=0, chat_template=tool_templates.QWEN35)
    proc = run_benchmark("template_cost.py", str(model), "--turns", "5", "--rounds", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    header, row = proc.stdout.strip().splitlines()
    assert header.split() == ["template", "chars", "plain", "ms", "bounded", "ms"]
    assert re.fullmatch(r"qwen35\.gguf +\d+ +\d+\.\d\d +\d+\.\d\d", row), row


def test_template_cost_stops_where_the_bounded_sandbox_renders_another_text(tmp_path):
    """A template past a bound renders in the plain sandbox and not in the bounded one."""
    model = tm.write_model(tmp_path / "big.gguf", seed=0, chat_template="{{ 'x' * 40000000 }}")
    proc = run_benchmark("template_cost.py", str(model), "--turns", "1", "--rounds", "1")
    assert proc.returncode != 0 and proc.stderr.strip().splitlines() == [
        "big.gguf: the template failed: it makes a value of more than 33554432 characters"
    ], proc.stderr[-2000:]
