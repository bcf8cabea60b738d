"""The `specllm` command as a user runs it: a real process on the tiny models."""

import json
import os
import subprocess
import sys

import pytest

import specllm

from terminal import Terminal

SPECLLM = [sys.executable, "-m", "specllm"]


def specllm_run(*args, stdin=None, env=None):
    return subprocess.run(
        SPECLLM + ["run", *map(str, args)],
        input=stdin,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


def run_in_pty(args, env=None, rows=30, cols=100):
    """Run `specllm ARGS` on a pseudo-terminal; return everything it wrote, escape codes kept."""
    return Terminal(args, rows=rows, cols=cols, env=env).output()


def assert_one_line_error(proc, *fragments):
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture(scope="module")
def models(tiny_models):
    return ["--target", tiny_models.target, "--draft", tiny_models.draft, "--threads", 1, "--ctx-size", 256]


def test_the_default_drafter_is_auto_and_reports_its_costs(models, tmp_path):
    env = {"SPECLLM_CACHE": str(tmp_path)}
    proc = specllm_run("def f(x):", *models, "--json", "-v", "--temperature", 0, "-n", 8, env=env)
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout)["stats"]
    assert sum(s["steps"] for s in stats["sources"].values()) == stats["target_calls"]
    policy = stats["policy"]
    assert policy["calibration"]["measured"] == ["target", "draft"] and stats["calibration_seconds"] > 0
    assert policy["target"]["step_seconds"] > 0 and isinstance(policy["model_could_pay"], bool)
    assert "auto: costs measured (target, draft)" in proc.stderr
    again = specllm_run("def f(x):", *models, "--json", "-v", "--temperature", 0, "-n", 8, env=env)
    assert "auto: costs from the calibration cache" in again.stderr
    assert json.loads(again.stdout)["stats"]["calibration_seconds"] == 0
    fixed = specllm_run("def f(x):", *models, "--json", "--temperature", 0, "-n", 8, "--gamma", 3, env=env)
    fixed_stats = json.loads(fixed.stdout)["stats"]
    assert fixed_stats["policy"] is None and set(fixed_stats["sources"]) <= {"model", "none"}  # --gamma alone: model


def test_json_output_has_the_documented_shape(models, tiny_models):
    proc = specllm_run("def f(x):", *models, "--json", "--temperature", 0, "-n", 24, "--gamma", 3)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert set(out) >= {"text", "tokens", "stop_reason", "stats"}
    stats = out["stats"]
    for key in (
        "n_drafted", "n_accepted", "acceptance_rate", "mean_accepted_length", "accepted_per_position",
        "target_calls", "draft_calls", "prompt_tokens", "generated_tokens", "tokens_per_second",
        "prefill_seconds", "decode_seconds",
    ):  # fmt: skip
        assert key in stats, key
    assert out["stop_reason"] == "max_tokens" and stats["generated_tokens"] == len(out["tokens"]) == 24
    assert stats["n_drafted"] > 0 and len(stats["accepted_per_position"]) == 3
    # the same as the library gives for the same settings (chat template applied by default)
    engine = specllm.load(str(tiny_models.target), n_ctx=256, n_threads=1)
    expected = engine.generate(engine.prompt_tokens("def f(x):", chat=True), max_tokens=24, temperature=0, drafter="none")
    assert out["tokens"] == expected.tokens and out["text"] == expected.text


def test_plain_output_when_not_a_terminal(models):
    proc = specllm_run("hello", *models, "--temperature", 0, "-n", 16)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout + proc.stderr
    as_json = json.loads(specllm_run("hello", *models, "--temperature", 0, "-n", 16, "--json").stdout)
    assert proc.stdout == as_json["text"] + "\n"
    assert "tok/s" in proc.stderr and "acceptance" in proc.stderr  # the summary, kept off stdout


def test_prompt_from_stdin_and_raw_mode(models):
    piped = specllm_run("-", *models, "--json", "--temperature", 0, "-n", 8, "--raw", stdin="import os")
    given = specllm_run("import os", *models, "--json", "--temperature", 0, "-n", 8, "--raw")
    templated = specllm_run("import os", *models, "--json", "--temperature", 0, "-n", 8)
    assert json.loads(piped.stdout)["tokens"] == json.loads(given.stdout)["tokens"]
    assert json.loads(templated.stdout)["stats"]["prompt_tokens"] > json.loads(given.stdout)["stats"]["prompt_tokens"]


def test_ngram_and_target_only_drafters(models):
    for drafter in ("ngram", "none"):
        out = json.loads(specllm_run("the cat the cat the", *models, "--drafter", drafter, "--json", "-n", 8).stdout)
        assert out["stats"]["draft_calls"] == 0
        if drafter == "none":
            assert out["stats"]["n_drafted"] == 0


def test_live_view_in_a_terminal_marks_accepted_and_rejected_tokens(models):
    out = run_in_pty(["run", "def f(x):", *models, "--temperature", "0", "-n", "48"])
    assert "\x1b[" in out
    assert "\x1b[9;31m" in out  # rejected draft tokens: struck through, red
    assert "\x1b[32m" in out and "\x1b[1m" in out  # accepted draft tokens green, target tokens bold
    assert "accepted draft" in out and "rejected draft" in out and "tok/s" in out


def test_no_color_and_no_live_give_plain_text_in_a_terminal(models):
    args = ["run", "def f(x):", *models, "--temperature", "0", "-n", "16"]
    assert "\x1b" not in run_in_pty(args, env={"NO_COLOR": "1"})
    assert "\x1b" not in run_in_pty(args + ["--no-live"])


def test_a_missing_file_is_one_clear_line(models, tmp_path):
    assert_one_line_error(specllm_run("hi", "--target", tmp_path / "nope.gguf"), "not found", "nope.gguf")


def test_a_file_that_is_not_gguf_is_one_clear_line(tiny_models):
    assert_one_line_error(specllm_run("hi", "--target", tiny_models.not_gguf), "not a GGUF")


def test_a_truncated_gguf_is_one_clear_line(tiny_models):
    assert_one_line_error(specllm_run("hi", "--target", tiny_models.truncated, "--threads", 1), "cannot load")


def test_an_incompatible_pair_is_one_clear_line(tiny_models):
    proc = specllm_run("hi", "--target", tiny_models.target, "--draft", tiny_models.incompatible, "--threads", 1)
    assert_one_line_error(proc, "cannot draft", "token 261 differs")


def test_a_prompt_longer_than_the_context_is_one_clear_line(models):
    assert_one_line_error(specllm_run("the cat is in the house " * 200, *models, "--raw"), "context", "--ctx-size")


@pytest.mark.parametrize(
    "option,value,fragment",
    [
        ("--gamma", "abc", "--gamma"),
        ("--gamma", "0", "gamma"),
        ("--max-tokens", "0", "max tokens"),
        ("--top-p", "1.5", "top-p"),
        ("--temperature", "-1", "temperature"),
        ("--drafter", "magic", "unknown drafter"),
        ("--ctx-size", "2", "context size"),
        ("--threads", "0", "threads"),
    ],
)
def test_invalid_option_values_are_one_clear_line(models, option, value, fragment):
    assert_one_line_error(specllm_run("hi", *models, option, value), fragment)


def test_an_unknown_option_is_one_clear_line(models):
    assert_one_line_error(specllm_run("hi", *models, "--bogus"), "--bogus")


def test_doctor_reports_the_backend():
    proc = subprocess.run(SPECLLM + ["doctor"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert "gpu_offload:" in proc.stdout and "devices:" in proc.stdout and "CPU" in proc.stdout
