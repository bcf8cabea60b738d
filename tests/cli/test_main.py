"""The `specllm` command as a user runs it: a real process on the tiny models."""

import json
import os
import re
import select
import signal
import subprocess
import sys
import time

import pytest
from one_line import assert_one_line_error
from serving import serving
from terminal import STOPPED, Terminal

import specllm

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
    # The first run's steps move the one-token time the cache keeps; on a busy machine past DRIFT
    # from when it was measured, and the next run measures again (as it should: test_policy.py).
    # Kept where it was measured, the next run reads the cache.
    cache = tmp_path / "calibration.json"
    saved = json.loads(cache.read_text())
    assert len(saved["models"]) == 2
    for table in saved["models"].values():
        table["step_seconds"] = table["measured_at"]
    cache.write_text(json.dumps(saved))
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
        "n_drafted",
        "n_accepted",
        "acceptance_rate",
        "mean_accepted_length",
        "accepted_per_position",
        "target_calls",
        "draft_calls",
        "prompt_tokens",
        "generated_tokens",
        "tokens_per_second",
        "prefill_seconds",
        "decode_seconds",
    ):
        assert key in stats, key
    assert out["stop_reason"] == "max_tokens" and stats["generated_tokens"] == len(out["tokens"]) == 24
    assert stats["n_drafted"] > 0 and len(stats["accepted_per_position"]) == 3
    # the same as the library gives for the same settings (chat template applied by default)
    engine = specllm.load(str(tiny_models.target), n_ctx=256, n_threads=1)
    expected = engine.generate(
        engine.prompt_tokens("def f(x):", chat=True), max_tokens=24, temperature=0, drafter="none"
    )
    assert out["tokens"] == expected.tokens and out["text"] == expected.text


def test_plain_output_when_not_a_terminal(models):
    proc = specllm_run("hello", *models, "--temperature", 0, "-n", 16)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout + proc.stderr
    as_json = json.loads(specllm_run("hello", *models, "--temperature", 0, "-n", 16, "--json").stdout)
    assert proc.stdout == as_json["text"] + "\n"
    assert "tok/s" in proc.stderr and "acceptance" in proc.stderr  # the summary, kept off stdout


def test_text_an_output_encoding_cannot_hold_is_written_as_question_marks(tiny_models):
    """A stdout that is not UTF-8 (a Latin-1 locale, PYTHONIOENCODING) cannot hold U+FFFD or most
    of what the bytes model writes: it stopped with a UnicodeEncodeError traceback."""
    args = ["hello", "--raw", "--target", tiny_models.bytes, "--threads", 1, "--ctx-size", 256]
    args += ["--drafter", "none", "--temperature", 0, "-n", 24]
    text = json.loads(specllm_run(*args, "--json").stdout)["text"]
    assert not text.isascii()
    proc = specllm_run(*args, env={"PYTHONIOENCODING": "ascii"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == text.encode("ascii", errors="replace").decode() + "\n"


def test_prompt_from_stdin_and_raw_mode(models):
    piped = specllm_run("-", *models, "--json", "--temperature", 0, "-n", 8, "--raw", stdin="import os")
    given = specllm_run("import os", *models, "--json", "--temperature", 0, "-n", 8, "--raw")
    templated = specllm_run("import os", *models, "--json", "--temperature", 0, "-n", 8)
    assert json.loads(piped.stdout)["tokens"] == json.loads(given.stdout)["tokens"]
    with_bom = specllm_run("-", *models, "--json", "--temperature", 0, "-n", 8, "--raw", stdin="\ufeffimport os")
    assert json.loads(with_bom.stdout)["tokens"] == json.loads(given.stdout)["tokens"]
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


def test_no_color_and_no_live_give_plain_text_in_a_terminal_and_an_empty_no_color_does_not(models):
    args = ["run", "def f(x):", *models, "--temperature", "0", "-n", "16"]
    assert "\x1b" not in run_in_pty(args, env={"NO_COLOR": "1"})
    assert "\x1b[32m" in run_in_pty(args, env={"NO_COLOR": ""})  # set but empty is unset, as no-color.org says
    assert "\x1b" not in run_in_pty(args + ["--no-live"])


def test_a_missing_file_is_one_clear_line(models, tmp_path):
    assert_one_line_error(specllm_run("hi", "--target", tmp_path / "nope.gguf"), "not found", "nope.gguf")


def test_an_empty_model_name_is_one_line_that_says_so(tiny_models):
    """`--target "$MODEL"` with MODEL unset: an empty name was read as the path ".", "not a file: ."."""
    for args in (["--target", ""], ["--target", tiny_models.target, "--draft", ""]):
        assert_one_line_error(specllm_run("hi", *args), "bad model '': empty; give a GGUF path")
    with pytest.raises(specllm.SpecllmError, match="bad model '': empty"):
        specllm.load("")


def test_a_pair_with_a_target_or_a_draft_alone_is_refused_in_the_flags_words(tiny_models, isolated):
    both = specllm_run("hi", "--pair", "x", "--target", tiny_models.target)
    assert_one_line_error(both, "give either --pair or --target/--draft, not both")
    assert_one_line_error(
        specllm_run("hi", "--draft", tiny_models.draft), "--draft needs --target (or use --pair NAME)"
    )


def test_offline_without_the_file_names_the_flag_and_the_variable(isolated):
    proc = specllm_run("hi", "--target", "hf:tiny-org/tiny-GGUF/m.gguf", "--offline")
    assert_one_line_error(proc, "is not downloaded yet, and offline mode is on (--offline or HF_HUB_OFFLINE)")


def test_a_file_that_is_not_gguf_is_one_clear_line(tiny_models):
    assert_one_line_error(specllm_run("hi", "--target", tiny_models.not_gguf), "not a GGUF")


def test_a_truncated_gguf_is_one_clear_line(tiny_models):
    assert_one_line_error(specllm_run("hi", "--target", tiny_models.truncated, "--threads", 1), "cannot load")


def test_a_bpe_model_without_a_pre_tokenizer_runs_with_one_warning(tmp_path):
    """A GGUF converted before tokenizer.ggml.pre existed: llama.cpp splits its text by default
    rules and said so only in its own log, hidden without -v."""
    import tiny_models as tm

    args = ["hi", "--draft", "none", "-n", 2, "--threads", 1, "--ctx-size", 256, "--no-live"]
    old = tm.write_model(tmp_path / "old.gguf", tokenizer_model="gpt2")
    proc = specllm_run(*args, "--target", old)
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert warnings == [
        "specllm: warning: old.gguf names no pre-tokenizer (tokenizer.ggml.pre, which GGUFs converted before "
        "May 2024 lack): llama.cpp splits its text by default rules that may not be the model's, and its "
        "answers can be worse; a newer conversion of the model has it"
    ]
    for pre in ("default", "qwen2"):
        named = tm.write_model(tmp_path / f"{pre}.gguf", tokenizer_model="gpt2", tokenizer_pre=pre)
        proc = specllm_run(*args, "--target", named)
        assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stderr


@pytest.fixture(scope="module")
def nan_models(tiny_models, tmp_path_factory):
    import tiny_models as tm

    d = tmp_path_factory.mktemp("nan")
    return {
        "all": tm.with_nan_in(tiny_models.target, d / "broken.gguf", "output_norm.weight"),
        "draft": tm.with_nan_in(tiny_models.draft, d / "broken_draft.gguf", "output_norm.weight"),
        "some": tm.with_nan_in(tiny_models.target, d / "some.gguf", "output.weight", slice(0, 300)),
    }


@pytest.mark.parametrize("temperature", [0, 0.8])
def test_a_model_whose_logits_are_nan_is_one_line_naming_it(nan_models, tiny_models, temperature):
    """Its computation broke down (an overflow in a GPU's kernels gives the same): greedy chose
    token 0 from it, sampling ended in an IndexError's traceback."""
    args = ["hi", "-n", 4, "--threads", 1, "--ctx-size", 256, "--temperature", temperature, "--seed", 1]
    target_only = specllm_run(*args, "--target", nan_models["all"], "--draft", "none")
    assert_one_line_error(
        target_only, "the target model (broken.gguf) gave logits that are not finite numbers (NaN or infinite)"
    )
    drafting = specllm_run(*args, "--target", tiny_models.target, "--draft", nan_models["draft"], "--drafter", "model")
    assert_one_line_error(drafting, "the draft model (broken_draft.gguf) gave logits that are not finite numbers")


def test_nan_among_a_rows_logits_is_passed_over(nan_models):
    """As llama.cpp's samplers do: only a row without a number is refused."""
    proc = specllm_run(
        "hi",
        "-n",
        12,
        "--threads",
        1,
        "--ctx-size",
        256,
        "--temperature",
        0,
        "--draft",
        "none",
        "--target",
        nan_models["some"],
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    assert all(token >= 300 for token in json.loads(proc.stdout)["tokens"])


def test_an_incompatible_pair_is_one_clear_line(tiny_models):
    proc = specllm_run("hi", "--target", tiny_models.target, "--draft", tiny_models.incompatible, "--threads", 1)
    assert_one_line_error(proc, "cannot draft", "token 261 differs")


def test_a_prompt_longer_than_the_context_is_one_clear_line(models):
    proc = specllm_run("the cat is in the house " * 200, *models, "--raw")
    assert_one_line_error(proc, "but the context holds 256: raise --ctx-size or shorten the prompt")


def test_drafter_model_without_a_draft_names_the_flags_that_give_one(tiny_models):
    """The library says what is missing; the CLI adds which flags fix it."""
    proc = specllm_run("hi", "--target", tiny_models.target, "--draft", "none", "--drafter", "model", "--threads", 1)
    assert_one_line_error(
        proc, "drafter 'model' needs a draft model: give --draft or --pair, or use --drafter auto|mtp|ngram|none"
    )


def test_drafter_model_for_a_target_no_draft_on_disk_fits_names_the_flags(tiny_models, isolated):
    proc = specllm_run("hi", "--target", tiny_models.target, "--drafter", "model", "--threads", 1, "--offline")
    name = tiny_models.target.name
    assert_one_line_error(
        proc,
        f"drafter 'model' needs a draft model, and none on disk fits {name} (`specllm models --drafts-for {name}` "
        "lists why): give --draft, or use --drafter auto|ngram|none",
    )


@pytest.mark.parametrize("command", [["run", "hi"], ["chat"], ["serve", "--port", "0"], ["bench"]])
def test_drafter_model_with_a_pair_without_a_draft_is_refused_before_the_download(
    tiny_models, fake_hub, isolated, command
):
    """A pair that drafts for itself (qwen3.5-4b-mtp, granite-4.0-h-1b: gigabytes) is not
    downloaded only to be refused for having no draft model."""
    from fakehub import single_file

    content = tiny_models.target.read_bytes()
    fake_hub.add("tiny-org/tiny-GGUF", "target.gguf", content)
    pairs = single_file(isolated / "one.toml", "tiny-org/tiny-GGUF", content)
    args = [*command, "--pair", "tiny-one", "--models", pairs, "--drafter", "model"]
    proc = subprocess.run(SPECLLM + list(map(str, args)), input="", capture_output=True, text=True, timeout=60)
    assert_one_line_error(proc, "pair tiny-one has no draft model: use --drafter auto|mtp|ngram|none")
    assert fake_hub.gets("target.gguf") == []


def test_drafter_mtp_on_a_target_without_mtp_layers_names_the_other_drafters(models):
    proc = specllm_run("hi", *models, "--drafter", "mtp")
    assert_one_line_error(proc, "has none: use --drafter auto, ngram or model")


def test_verbose_shows_llama_cpps_own_log_and_quiet_hides_it(tiny_models):
    args = ["hi", "--target", tiny_models.target, "--drafter", "none", "-n", 2, "--threads", 1, "--ctx-size", 256]
    verbose = specllm_run(*args, "-v")
    assert verbose.returncode == 0, verbose.stderr
    assert "llama_model_loader: loaded meta data" in verbose.stderr
    quiet = specllm_run(*args)
    assert quiet.returncode == 0, quiet.stderr
    assert "llama_model_loader" not in quiet.stderr


def test_serve_verbose_shows_llama_cpps_own_log_before_it_listens(tiny_models):
    args = ["serve", "--target", tiny_models.target, "--draft", "none", "--threads", 1, "--ctx-size", 256, "--port", 0]
    with serving([*args, "-v"]) as (_, lines, _):
        assert any("llama_model_loader: loaded meta data" in line for line in lines)
    with serving(args) as (_, lines, _):
        assert not any("llama_model_loader" in line for line in lines)
        assert lines[-1].startswith("specllm serve:")


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
        ("--threads", "100000", "threads must be between 1 and 1024"),
        ("--snapshots", "65", "snapshots must be between 0 and 64"),
        ("--drafter", "mtp", "drafter 'mtp' needs a target with MTP layers"),
        ("--models", "/nonexistent/pairs.toml", "pairs file not found"),  # read though only a target is named
        ("--temperature", "inf", "temperature must be >= 0 and finite"),
    ],
)
def test_invalid_option_values_are_one_clear_line(models, option, value, fragment):
    assert_one_line_error(specllm_run("hi", *models, option, value), fragment)


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--drafter", "mtp"], "drafter 'mtp' needs a target with MTP layers"),  # every request would fail
        (["--api-key", ""], "the API key is empty"),  # an open server, where a key was meant
        (["--api-key", "s3cret\n"], "no spaces, line breaks"),  # no client could send it
        (["--grammar-budget", "inf"], "the grammar budget is a number of seconds above 0, not inf"),
    ],
)
def test_serve_refuses_at_startup_what_would_fail_every_request(tiny_models, args, fragment):
    models = ["--target", tiny_models.target, "--draft", "none", "--threads", 1, "--ctx-size", 256, "--port", 0]
    proc = subprocess.run(SPECLLM + ["serve", *map(str, models + args)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()  # after the line saying which backend serve loaded with, if it got there
    assert [line for line in lines if line.startswith("error: ")] == [lines[-1]] and fragment in lines[-1]


ABSURD_CTX = 2**31 - 256  # the largest context size llama.cpp takes: a tiny model's KV cache alone is 1 TiB


def test_a_context_larger_than_memory_is_one_line_naming_the_size_that_fits(tiny_models):
    proc = specllm_run("hi", "--target", tiny_models.target, "--drafter", "none", "--ctx-size", ABSURD_CTX)
    fits = re.search(r"enough for (\d+) tokens", proc.stderr)
    assert fits and int(fits.group(1)) % 256 == 0, proc.stderr
    assert_one_line_error(
        proc,
        f"error: a context of {ABSURD_CTX} tokens for target.gguf needs about 3298.5 GB of memory ",
        "(KV cache 1099.5 GB, attention mask 2199.0 GB), and ",
        f"(SPECLLM_NO_MEMORY_CHECK=1 skips this check): use --ctx-size {fits.group(1)} or less",
        exit_code=1,
    )


def test_serve_refuses_to_start_with_a_context_larger_than_memory(tiny_models):
    args = ["serve", "--target", tiny_models.target, "--draft", "none", "--ctx-size", ABSURD_CTX, "--port", 0]
    proc = subprocess.run(SPECLLM + list(map(str, args)), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert [line for line in lines if line.startswith("error: ")] == [lines[-1]]
    assert f"a context of {ABSURD_CTX} tokens for target.gguf needs about" in lines[-1]
    assert re.search(r": use --ctx-size \d+ or less$", lines[-1])


def test_serve_embedding_model_answers_v1_embeddings(tiny_models, tmp_path):
    """--embedding-model: the startup line names it, its pooling and its context (the serve's, at
    most the model's), and /v1/embeddings answers with it."""
    import urllib.request

    import tiny_models as tm

    embedding = tm.write_model(tmp_path / "embed.gguf", seed=5, pooling_type=1, n_ctx_train=300)
    models = ["--target", tiny_models.target, "--draft", "none", "--threads", 1, "--ctx-size", 512, "--port", 0]
    with serving(["serve", *models, "--embedding-model", embedding]) as (_, lines, url):
        assert " · context 512 tokens · embeddings embed.gguf (mean pooling, 256 tokens) · " in lines[-1]
        sent = urllib.request.Request(url + "/v1/embeddings", json.dumps({"input": ["a", "b"]}).encode())
        with urllib.request.urlopen(sent, timeout=60) as response:
            data = json.loads(response.read())
    assert data["model"] == "embed.gguf" and len(data["data"]) == 2 and len(data["data"][0]["embedding"]) == 64


def test_serve_refuses_an_embedding_model_that_cannot_embed_in_one_line(tiny_models):
    models = ["--target", tiny_models.target, "--draft", "none", "--threads", 1, "--ctx-size", 256, "--port", 0]
    for embedding, fragment in [
        (tiny_models.target, "target.gguf is not an embedding model: its pooling type is none"),
        (tiny_models.target.parent / "missing.gguf", "model file not found"),
        ("", "--embedding-model"),
    ]:
        args = ["serve", *map(str, models), "--embedding-model", str(embedding)]
        proc = subprocess.run(SPECLLM + args, capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
        lines = proc.stderr.strip().splitlines()  # after the line saying which backend serve loads with
        assert [line for line in lines if line.startswith("error: ")] == [lines[-1]] and fragment in lines[-1]
        assert "specllm serve:" not in proc.stderr


def test_an_unknown_option_is_one_clear_line(models):
    assert_one_line_error(specllm_run("hi", *models, "--bogus"), "--bogus")


def test_doctor_reports_the_backend():
    proc = subprocess.run(SPECLLM + ["doctor"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert "gpu_offload:" in proc.stdout and "devices:" in proc.stdout and "CPU" in proc.stdout


# --- the chat template (issue 10, items 7 and 14) ------------------------------------------------


def test_run_without_a_chat_template_uses_chatml_and_says_so_as_chat_does(tiny_models):
    args = ["--target", tiny_models.no_template, "--threads", 1, "--ctx-size", 256, "--temperature", 0, "-n", 8]
    proc = specllm_run("Hello world", *args, "--system", "You are terse.", "--json")
    assert proc.returncode == 0, proc.stderr
    notice = "note: no_template.gguf has no chat template: using ChatML"
    assert proc.stderr.strip() == notice
    chatml = (
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHello world<|im_end|>\n<|im_start|>assistant\n"
    )
    engine = specllm.load(str(tiny_models.no_template), n_ctx=256, n_threads=1)
    expected = engine.generate(engine.target.tokenize(chatml), max_tokens=8, temperature=0, drafter="none")
    out = json.loads(proc.stdout)
    assert out["stats"]["prompt_tokens"] == len(engine.target.tokenize(chatml))  # the system message is in
    assert out["tokens"] == expected.tokens
    chat = subprocess.run(SPECLLM + ["chat", *map(str, args)], input="", capture_output=True, text=True, timeout=120)
    assert chat.returncode == 0 and notice in chat.stdout  # chat's notice, word for word


def test_system_without_the_chat_template_is_refused(models):
    assert_one_line_error(specllm_run("hi", *models, "--raw", "--system", "Be brief."), "--system", "--raw")


def model_with_template(tmp_path, template: str):
    import tiny_models as tm

    return tm.write_model(tmp_path / "templated.gguf", chat_template=template)


@pytest.mark.parametrize("command", ["run", "chat"])
def test_a_chat_template_with_a_syntax_error_is_one_clear_line(tmp_path, command):
    path = model_with_template(tmp_path, "{% for message in messages %}{{ message['content'] }}")  # no endfor
    args = [command, *(["hi"] if command == "run" else []), "--target", path, "--threads", "1", "--drafter", "none"]
    proc = subprocess.run(SPECLLM + list(map(str, args)), input="hi\n", capture_output=True, text=True, timeout=120)
    assert_one_line_error(proc, "chat template of templated.gguf failed")
    assert proc.stderr.rstrip().endswith("(--raw runs without it)") == (command == "run")  # chat has no --raw


HOSTILE_TEMPLATE = "{{ raise_exception('bad\x1b]52;c;aGk=\x07\x1b[2J') }}"  # write the clipboard, clear the screen


@pytest.mark.parametrize("command", ["run", "chat"])
def test_a_chat_templates_own_error_text_cannot_drive_the_terminal(tmp_path, command):
    """The error a model's template raises is the model's text: its escape sequences are shown as
    symbols, as in a reply, not obeyed by the terminal."""
    path = model_with_template(tmp_path, HOSTILE_TEMPLATE)
    args = [command, *(["hi"] if command == "run" else []), "--target", path, "--threads", "1", "--drafter", "none"]
    proc = subprocess.run(SPECLLM + list(map(str, args)), input="hi\n", capture_output=True, text=True, timeout=120)
    assert_one_line_error(proc, "chat template of templated.gguf failed: bad␛]52;c;aGk=␇␛[2J")
    assert "\x1b" not in proc.stderr and "\x07" not in proc.stderr


def test_a_status_line_shows_the_control_characters_of_a_file_name(capsys):
    """`specllm: downloading FILE ...` names a file another party named (a Hub repository's)."""
    from specllm.cli.report import RichReporter

    RichReporter().say("downloading x\x1b]52;c;aGk=\x07.gguf [bold]")
    assert capsys.readouterr().err == "specllm: downloading x␛]52;c;aGk=␇.gguf [bold]\n"


@pytest.mark.parametrize(
    "template, fragment",
    [
        # 10^10 loop steps that output nothing: no memory, but no end
        ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "range()"),
        # 40 MB of output from few loop steps
        ("{% for i in range(100000) %}{{ messages[0]['content'] }}{% endfor %}", "characters"),
        # 2 GB from one operation, refused before it is made
        ('{{ "x" * 2000000000 }}', "it makes a value of more than 33554432 characters"),
    ],
)
def test_a_chat_template_cannot_loop_or_grow_without_bound(tmp_path, template, fragment):
    path = model_with_template(tmp_path, template)
    proc = specllm_run("x" * 400, "--target", path, "--threads", 1, "--drafter", "none")
    assert_one_line_error(proc, "chat template of templated.gguf failed", fragment)


# --- bad input: one line, before any model is loaded (issue 10, items 14 and 16) -----------------


@pytest.mark.parametrize("command", ["run", "chat", "bench"])
@pytest.mark.parametrize("seed", ["-1", str(2**32)])
def test_a_seed_out_of_range_is_refused_before_loading(tmp_path, command, seed):
    missing = tmp_path / "not-loaded.gguf"  # the seed is refused first, so this is never looked at
    args = [command, *(["hi"] if command == "run" else []), "--target", missing, "--seed", seed]
    proc = subprocess.run(SPECLLM + list(map(str, args)), input="", capture_output=True, text=True, timeout=120)
    assert_one_line_error(proc, "--seed")


def test_the_seed_range_ends_are_accepted(models):
    for seed in (0, 2**32 - 1):
        proc = specllm_run("hi", *models, "--seed", seed, "-n", 2, "--json")
        assert proc.returncode == 0 and json.loads(proc.stdout)["seed"] == seed, proc.stderr


def test_bytes_that_are_not_utf8_are_one_clear_line(models):
    def run(*args, stdin=None):
        proc = subprocess.run(
            [*SPECLLM, "run", *args, *map(str, models)], input=stdin, capture_output=True, timeout=120
        )
        proc.stderr = proc.stderr.decode(errors="replace")
        return proc

    assert_one_line_error(run("-", stdin=b"def f(\xff):"), "standard input is not valid UTF-8")
    assert_one_line_error(run(b"def f(\xff):"), "the prompt is not valid UTF-8")
    assert_one_line_error(run("hi", "--system", b"\xfe"), "--system is not valid UTF-8")


@pytest.mark.parametrize(
    "size, fragment",
    [
        (100, "at least 256"),  # llama.cpp would make it 256 but keep a batch of 100
        (1000, "multiple of 256 (llama.cpp would make 1000 1024)"),
        (2**32, "at most"),  # would wrap around to 0: the model's trained context
    ],
)
def test_a_context_size_llama_cpp_would_change_is_refused(tmp_path, size, fragment):
    missing = tmp_path / "not-loaded.gguf"
    assert_one_line_error(specllm_run("hi", "--target", missing, "--ctx-size", size), "context size", fragment)
    with pytest.raises(specllm.SpecllmError, match="context size"):
        specllm.ModelOptions(n_ctx=size)


def test_the_context_in_use_is_the_context_asked_for(tiny_models):
    for n_ctx in (256, 768):
        engine = specllm.load(str(tiny_models.target), n_ctx=n_ctx, n_threads=1)
        assert engine.target.n_ctx == n_ctx and engine.target.n_batch == min(512, n_ctx)
        engine.close()


# --- signals and pipes (issue 10, items 8 and 17) -------------------------------------------------

# Long enough that every signal below lands while the command still works (tiny models run
# thousands of tokens a second; this context is far from full when the signal comes).
ENDLESS = ["--threads", 1, "--ctx-size", 65536, "-n", 60000, "--temperature", 0]


@pytest.fixture
def start():
    """start(ARGS): `specllm ARGS` as a process with pipes; any still running at the end is killed."""
    procs = []

    def start(*args):
        procs.append(subprocess.Popen(SPECLLM + list(map(str, args)), stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        return procs[-1]

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def first_output(stream, timeout=60) -> bytes:
    """What a process first wrote on a pipe (b"" if it ended), without waiting forever."""
    assert select.select([stream], [], [], timeout)[0], "no output"
    return os.read(stream.fileno(), 65536)


def interrupt(proc, signum=signal.SIGINT) -> tuple[int, str, str]:
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def assert_interrupted(rc, err):
    assert rc == 130 and err.strip().splitlines()[-1:] == ["interrupted"], err
    assert "Traceback" not in err


def test_ctrl_c_during_run_exits_130(tiny_models, start):
    proc = start("run", "def f(x):", "--target", tiny_models.target, "--draft", tiny_models.draft, *ENDLESS)
    assert first_output(proc.stdout)  # the text is streaming
    rc, _, err = interrupt(proc)
    assert_interrupted(rc, err)


def test_ctrl_c_during_run_json_exits_130_with_nothing_on_stdout(tiny_models, start):
    # The model without a template says so on stderr just before it generates.
    proc = start("run", "def f(x):", "--target", tiny_models.no_template, *ENDLESS, "--json")
    assert first_output(proc.stderr).startswith(b"note: ")
    rc, out, err = interrupt(proc)
    assert_interrupted(rc, err)
    assert out == ""


def test_ctrl_c_in_a_slow_chat_template_exits_130(tmp_path, start):
    digits = "'0123456789'"
    loops = "".join(f"{{% for x{i} in {digits} %}}" for i in range(9)) + "{% endfor %}" * 9  # 10^9 steps
    path = model_with_template(tmp_path, loops)
    proc = start("run", "hi", "--target", path, "--threads", 1, "--drafter", "none", "-v")
    assert first_output(proc.stderr).startswith(b"llama-cpp-python")  # -v: about to load the model
    time.sleep(2)  # the model loads in a fraction of this; the template then renders for minutes
    rc, _, err = interrupt(proc)
    assert_interrupted(rc, err)


def test_ctrl_c_during_pull_exits_130(isolated, monkeypatch, start):
    import socket

    server = socket.create_server(("127.0.0.1", 0))  # accepts connections, never answers
    server.settimeout(60)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
    pairs = isolated / "pairs.toml"
    file = 'repo = "tiny-org/tiny-GGUF"\nfile = "{}.gguf"\nsize = 1000\nsha256 = "{}"\n'
    pairs.write_text(
        '[[pair]]\nname = "slow"\ndescription = "d"\ngamma = 3\n[pair.target]\n'
        + file.format("target", "0" * 64)
        + "[pair.draft]\n"
        + file.format("draft", "1" * 64)
    )
    proc = start("pull", "slow", "--models", pairs, "--source", "hub")
    connection, _ = server.accept()
    connection.recv(65536)  # the request came: the pull waits for the answer
    rc, out, err = interrupt(proc)
    connection.close()
    server.close()
    assert_interrupted(rc, err)
    assert "ready" not in out


def test_sigterm_during_the_live_view_restores_the_cursor(tiny_models):
    term = Terminal(["run", "def f(x):", "--target", tiny_models.target, "--draft", tiny_models.draft, *ENDLESS])
    term.expect("tok/s")  # the live view is up, the cursor hidden
    term.proc.send_signal(signal.SIGTERM)
    rc = term.wait()
    raw = term.raw.decode("utf-8", errors="replace")
    assert rc == 143 and "terminated" in term.text and "Traceback" not in term.text, term.text[-2000:]
    assert raw.rfind("\x1b[?25h") > raw.rfind("\x1b[?25l") >= 0  # shown again after it was last hidden


UNLOADABLE = {
    "missing": ('raise ModuleNotFoundError("No module named \'llama_cpp\'", name="llama_cpp")', "is not installed"),
    "library": (
        "raise RuntimeError(\"Failed to load shared library '/lib/libllama.so': libcudart.so.13: cannot open\")",
        "cannot load llama.cpp: Failed to load shared library '/lib/libllama.so': libcudart.so.13",
    ),
}


@pytest.mark.parametrize("case", UNLOADABLE)
def test_a_llama_cpp_python_missing_or_unloadable_is_one_line(tmp_path, case):
    """pip install --no-deps, or a CUDA build where CUDA's libraries are not: every command that
    needs llama.cpp says so in one line."""
    raising, said = UNLOADABLE[case]
    (tmp_path / "llama_cpp").mkdir()
    (tmp_path / "llama_cpp" / "__init__.py").write_text(raising + "\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    for args in (["--version"], ["run", "hi", "--target", "none.gguf"], ["doctor"]):
        proc = subprocess.run(SPECLLM + args, capture_output=True, text=True, timeout=60, env=env)
        assert_one_line_error(proc, said, "docs/install.md", exit_code=1)


def _cursor_shown(raw: bytes) -> bool:
    text = raw.decode("utf-8", errors="replace")
    return text.rfind("\x1b[?25h") > text.rfind("\x1b[?25l")


def test_ctrl_z_takes_the_live_view_off_the_screen_and_fg_draws_it_again(tiny_models):
    """Stopped, the job leaves the shell a cursor and no half-erased view; continued, it draws
    the view again below what the shell wrote, and goes on to its end."""
    args = ["run", "def f(x):", "--target", tiny_models.target, "--draft", tiny_models.draft, *ENDLESS]
    term = Terminal(args, job_control=True)
    term.expect("tok/s")
    term.send("\x1a")  # Ctrl-Z: the terminal sends SIGTSTP to the job
    term.expect(re.escape(STOPPED))
    stopped_at = len(term.raw)
    assert _cursor_shown(term.raw)
    time.sleep(0.5)
    assert len(term.raw) == stopped_at  # stopped: it draws nothing more
    term.send("fg\n")
    term.expect("tok/s")  # drawn again, from where the cursor is: no line above it erased
    first_draw = term.raw[stopped_at:]
    assert not _cursor_shown(term.raw) and b"\x1b[1A" not in first_draw[: first_draw.index(b"tok/s")]
    term.send("\x03")
    rc = term.wait()
    assert rc == 130 and _cursor_shown(term.raw) and "Traceback" not in term.text, term.text[-2000:]


def test_a_closed_pipe_ends_a_command_quietly_with_exit_code_0(models, start, isolated):
    streaming = start("run", "def f(x):", *models[:4], *ENDLESS)
    assert len(streaming.stdout.read(20)) == 20  # `| head -c 20`
    streaming.stdout.close()
    # The reader is gone before anything is written: print (the JSON object), Rich (the table of
    # models), Typer's help.
    others = [start("run", "def f(x):", *models, "-n", 16, "--json"), start("models"), start("run", "--help")]
    for proc in others:
        proc.stdout.close()
    for proc in (streaming, *others):
        rc, err = proc.wait(timeout=120), proc.stderr.read().decode(errors="replace")
        assert rc == 0 and err == "", (proc.args, err)  # no traceback, no "Exception ignored" at exit


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (a device that is always full)")
def test_output_that_cannot_be_written_is_one_line_not_a_traceback(models):
    """`specllm run ... > out.txt` on a full disk: print (the JSON object), the plain view, Rich
    (the table of models) and Typer's help all end with one line and exit code 1."""
    for args in (
        ["run", "def f(x):", *models, "-n", 4, "--json"],
        ["run", "def f(x):", *models, "-n", 4],
        ["models"],
        ["run", "--help"],
    ):
        with open("/dev/full", "w") as full:
            proc = subprocess.run(
                SPECLLM + list(map(str, args)), stdout=full, stderr=subprocess.PIPE, text=True, timeout=120
            )
        assert_one_line_error(proc, "No space left on device", exit_code=1)


@pytest.mark.parametrize("closed", [0, 1])
def test_a_command_started_with_stdin_or_stdout_closed_is_no_traceback(models, closed):
    """`specllm run - <&-` is one line; `specllm run ... >&-` (and serve, started by a supervisor
    without stdout) writes its output to nowhere, as asked, instead of failing on it."""
    args = ["-"] if closed == 0 else ["def f(x):", "--json"]
    proc = subprocess.run(
        SPECLLM + ["run", *args, *map(str, models), "-n", "4"],
        stdout=subprocess.DEVNULL if closed == 0 else None,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.close(closed),
    )
    if closed == 0:
        assert_one_line_error(proc, "standard input is closed", exit_code=1)
    else:
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr


@pytest.mark.parametrize("stdin", ["", "\n  \n"])
def test_run_from_an_empty_stdin_is_one_line_before_any_model_loads(tmp_path, stdin):
    """`cat missing.txt | specllm run -` pipes nothing: the model would answer an empty message at
    length. With --suffix an empty prefix is a gap at the code's start, and is filled."""
    missing = tmp_path / "not-loaded.gguf"  # loading it would be another error
    proc = subprocess.run(
        SPECLLM + ["run", "-", "--target", str(missing), "--threads", "1"],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert_one_line_error(proc, "standard input held no text: nothing to complete", exit_code=1)


def test_an_empty_prefix_from_stdin_with_a_suffix_is_filled(tiny_code_models):
    models = ["--target", tiny_code_models.target, "--threads", 1, "--ctx-size", 256]
    args = ["run", "-", "--suffix", "\n    return x\n", "-n", 4, "--temperature", 0, "--json", *models]
    proc = subprocess.run(SPECLLM + list(map(str, args)), input="", capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and json.loads(proc.stdout)["stats"]["generated_tokens"] > 0, proc.stderr


def test_chat_started_with_stdin_closed_is_one_line_before_any_model_loads(tmp_path):
    """`specllm chat <&-` can never read a message: one line, not a traceback from the reader."""
    missing = tmp_path / "not-loaded.gguf"  # loading it would be another error
    proc = subprocess.run(
        SPECLLM + ["chat", "--target", str(missing), "--threads", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.close(0),
    )
    assert_one_line_error(proc, "standard input is closed", exit_code=1)


@pytest.mark.parametrize("template", ["--chat-template", "--raw"])
def test_a_prompt_far_longer_than_the_context_is_refused_from_its_start(models, template):
    """40 MB on stdin for a 256-token context: one line saying it does not fit, from the tokens of
    its start, not after tokenizing all of it (10 s and 2 GB of token ids), nor as the chat
    template's failure on its size (which named --raw, which did not help)."""
    text = "hello world " * 3_400_000
    started = time.monotonic()
    proc = specllm_run("-", *models, "-n", 4, template, stdin=text)
    assert_one_line_error(
        proc, "the prompt is", f"tokens in its first 4096 of {len(text)} characters", "holds 256", exit_code=1
    )
    assert time.monotonic() - started < 20  # a few seconds, most of it piping and checking the text


def test_a_thinking_models_reasoning_is_apart_from_its_answer(tmp_path):
    """Qwen3.5's template opens a think block, which the tiny model never closes: --json has it
    as `reasoning` and an empty `text`; piped, the answer goes to stdout and the reasoning to
    stderr. --no-think closes the block in the prompt: the reply is all text, the tokens those
    of the prompt the template renders so (given with --raw)."""
    import tiny_models as tm
    import tool_templates

    from specllm.llama.templates import compile_chat_template, render_bounded

    path = tm.write_model(tmp_path / "qwen35_templated.gguf", seed=0, chat_template=tool_templates.QWEN35)
    args = ["--target", path, "--draft", "none", "--threads", 1, "--ctx-size", 256, "--temperature", 0, "-n", 8]
    thought = json.loads(specllm_run("Hi", *args, "--json").stdout)
    assert thought["text"] == "" and thought["reasoning"] and thought["stop_reason"] == "max_tokens"
    plain = specllm_run("Hi", *args)
    assert plain.returncode == 0 and plain.stdout == "\n"
    assert plain.stderr.startswith(thought["reasoning"] + "\n[max_tokens] ")
    answered = json.loads(specllm_run("Hi", *args, "--json", "--no-think").stdout)
    assert "reasoning" not in answered
    closed = render_bounded(
        compile_chat_template(tool_templates.QWEN35),
        messages=[{"role": "user", "content": "Hi"}],
        add_generation_prompt=True,
        enable_thinking=False,
        bos_token="<s>",
        eos_token="</s>",
    )
    raw = json.loads(specllm_run(closed, "--raw", *args, "--json").stdout)
    assert (answered["text"], answered["tokens"]) == (raw["text"], raw["tokens"])
    assert_one_line_error(specllm_run("Hi", *args, "--raw", "--think"), "--think needs the chat template")


def test_run_json_reads_functionarys_reply_after_its_first_recipient():
    """functionary v3.2's prompt ends with ">>>": --json's text is the reply's after "all\\n" (it
    began with it), a call as functionary writes one."""
    from specllm.cli.main import result_json
    from specllm.engine.loop import Result, Stats

    text = result_json(Result("all\nHello.", [1], "eos", Stats()), 0, recipient=True)["text"]
    call = result_json(Result('f\n{"a": 1}', [1], "eos", Stats()), 0, recipient=True)["text"]
    assert (text, call) == ("Hello.", '>>>f\n{"a": 1}')
    assert result_json(Result("all\nHello.", [1], "eos", Stats()), 0)["text"] == "all\nHello."  # another model's


def test_run_stops_where_ling3_spells_its_turns_end(tmp_path, capsys, ling3_turn_end):
    """ "<|role_end|>" in text tokens ends no generation: a stop string of a prompt run through the
    chat template, as llama-server adds it (it ran on to max_tokens); not of a --raw one."""
    import tiny_models as tm
    import tool_templates

    from specllm.cli.main import app
    from specllm.llama.templates import compile_chat_template, render_bounded

    path = tm.write_model(tmp_path / "ling3.gguf", seed=0, chat_template=tool_templates.LING3)
    args = ["--target", str(path), "--draft", "none", "--threads", "1", "--temperature", "0", "-n", "12", "--json"]

    def run(prompt: str = "Hello", *more: str) -> dict:
        app(["run", prompt, *args, *more], standalone_mode=False)
        return json.loads(capsys.readouterr().out)

    whole = run()
    raw = whole.get("reasoning", "") + whole["text"]
    at = len(raw) // 2
    ling3_turn_end(raw[at : at + 3])
    assert raw.find(raw[at : at + 3]) == at
    stopped = run()
    assert (stopped.get("reasoning", "") + stopped["text"], stopped["stop_reason"]) == (raw[:at].strip(), "stop")
    rendered = render_bounded(
        compile_chat_template(tool_templates.LING3),
        messages=[{"role": "user", "content": "Hello"}],
        add_generation_prompt=True,
        bos_token="<s>",
        eos_token="</s>",
    )
    raw_run = run(rendered, "--raw")  # the same prompt, given as text: the same reply, not stopped
    assert (raw_run["tokens"], raw_run["stop_reason"]) == (whole["tokens"], "max_tokens")


def test_reasoning_effort_goes_to_the_template(tmp_path):
    """--reasoning-effort sets gpt-oss's variable: the prompt is the one the template renders with
    it (given with --raw, the same tokens); none is --no-think; a bad use is one line."""
    import tiny_models as tm
    import tool_templates

    from specllm.llama.templates import compile_chat_template, render_bounded

    path = tm.write_model(tmp_path / "gpt-oss.gguf", seed=0, vocab="harmony", chat_template=tool_templates.GPT_OSS)
    args = ["--target", path, "--draft", "none", "--threads", 1, "--ctx-size", 1024, "--temperature", 0, "-n", 6]
    high = json.loads(specllm_run("Hi", *args, "--json", "--reasoning-effort", "high").stdout)
    rendered = render_bounded(
        compile_chat_template(tool_templates.GPT_OSS),
        messages=[{"role": "user", "content": "Hi"}],
        add_generation_prompt=True,
        reasoning_effort="high",
        bos_token="<s>",
        eos_token="</s>",
    )
    assert "Reasoning: high" in rendered
    raw = json.loads(specllm_run(rendered, "--raw", *args, "--json").stdout)
    assert (high["text"], high["tokens"]) == (raw["text"], raw["tokens"])
    assert high["stats"]["prompt_tokens"] == raw["stats"]["prompt_tokens"]
    default = json.loads(specllm_run("Hi", *args, "--json").stdout)  # "Reasoning: medium"
    assert default["stats"]["prompt_tokens"] != high["stats"]["prompt_tokens"]
    assert_one_line_error(
        specllm_run("Hi", *args, "--raw", "--reasoning-effort", "low"), "--reasoning-effort needs the chat template"
    )
    assert_one_line_error(
        specllm_run("Hi", *args, "--think", "--reasoning-effort", "none"),
        "--think and --reasoning-effort none ask for opposite things",
    )
    assert_one_line_error(specllm_run("Hi", *args, "--reasoning-effort", ""), "--reasoning-effort: give a level")


def test_serve_takes_think_and_reasoning_effort_as_every_requests_default(tiny_models, monkeypatch, capsys):
    """serve --no-think --reasoning-effort low: the template variables of every chat request,
    under its own (the server's tests check that); the command runs in-process up to its loop."""
    import specllm.serve.server
    from specllm.cli.main import app

    got = {}
    monkeypatch.setattr(specllm.serve.server, "serve", lambda engine, settings, *_: got.update(settings=settings))
    models = ["--target", str(tiny_models.target), "--draft", "none", "--threads", "1", "--ctx-size", "512"]
    app(["serve", "--no-think", "--reasoning-effort", "low", "--port", "0", *models], standalone_mode=False)
    assert got["settings"].template_variables == {"enable_thinking": False, "reasoning_effort": "low"}
    assert ' · enable_thinking false · reasoning_effort "low" · ' in capsys.readouterr().err  # the startup line
    app(["serve", "--port", "0", *models], standalone_mode=False)
    assert got["settings"].template_variables is None


def test_serve_keeps_other_conversations_in_at_most_a_quarter_of_the_memory_left(tiny_models, monkeypatch, capsys):
    """--cache-ram's default is 2048 MiB, or a quarter of the memory left once the models are
    loaded where that is less (a laptop's, a container's); a value given is taken as it is. The
    startup line says how much. The command runs in-process up to its loop."""
    import specllm.cli.main
    import specllm.serve.server
    from specllm.cli.main import app

    got = {}
    monkeypatch.setattr(specllm.serve.server, "serve", lambda engine, settings, *_: got.update(settings=settings))
    models = ["--target", str(tiny_models.target), "--draft", "none", "--threads", "1", "--ctx-size", "512"]
    for available, option, expected in (
        (64 * 2**30, [], 2048 * 2**20),
        (2 * 2**30, [], 512 * 2**20),
        (None, [], 2048 * 2**20),  # unknown: the default as it stands
        (2 * 2**30, ["--cache-ram", "1500"], 1500 * 2**20),
        (2 * 2**30, ["--cache-ram", "0"], 0),
    ):
        monkeypatch.setattr(specllm.cli.main, "available_memory", lambda available=available: available)
        app(["serve", "--port", "0", *option, *models], standalone_mode=False)
        assert got["settings"].cache_ram == expected, (available, option)
        line = capsys.readouterr().err
        assert (f" · other conversations kept in {expected // 2**20} MiB · " in line) == bool(expected), line


def test_a_fixed_drafters_length_is_left_to_the_pair_so_that_auto_keeps_its_own(tiny_models, monkeypatch):
    """serve --drafter model (no --gamma) gave every request the pair's draft length as its
    gamma: a request for drafter auto drafted 4 tokens at most (15 on an auto server). chat's
    /drafter auto did the same. The commands run in-process up to their loop."""
    import specllm.chat.repl
    import specllm.serve.server
    from specllm.cli.main import app
    from specllm.engine.policy import NGRAM_MAX

    got = {}
    monkeypatch.setattr(specllm.serve.server, "serve", lambda engine, settings, *_: got.update(settings=settings))
    monkeypatch.setattr(specllm.chat.repl, "repl", lambda session, console, live: got.update(session=session))
    models = ["--target", str(tiny_models.target), "--draft", str(tiny_models.draft), "--threads", "1"]
    app(["serve", "--drafter", "model", "--port", "0", "--ctx-size", "512", *models], standalone_mode=False)
    app(["chat", "--drafter", "model", "--ctx-size", "512", "--no-live", *models], standalone_mode=False)
    session = got["session"]
    try:
        assert got["settings"].gamma is None
        assert session.config.gamma is None and session.gamma_shown == "4"  # the pair's, as before
        session.set_drafter("auto")
        assert session.config.draft_length(session.engine.fixed_gamma) == NGRAM_MAX
    finally:
        session.engine.close()
    app(
        ["serve", "--drafter", "model", "--gamma", "3", "--port", "0", "--ctx-size", "512", *models],
        standalone_mode=False,
    )
    assert got["settings"].gamma == 3


# The command the checks below run in place of a real one: it fails as a machine out of memory or
# out of file descriptors makes any command fail, at whichever step that happens to be.
RUN_FAILING = """
import sys
import specllm.cli.main as cli

def failing(app):
    def command(**_):
{body}
    return command

cli.build_command = failing
sys.argv = ["specllm"]
cli.main()
"""


def _failing_command(body: str, preexec_fn=None) -> subprocess.CompletedProcess:
    code = RUN_FAILING.format(body="\n".join("        " + line for line in body.splitlines()))
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, preexec_fn=preexec_fn
    )


def test_out_of_memory_is_one_line_not_a_traceback():
    """Python's MemoryError (under `ulimit -v`, importing a module or building a list) is one
    line, with the limit where there is one."""
    proc = _failing_command("raise MemoryError")
    assert_one_line_error(proc, exit_code=1)
    assert proc.stderr.strip() == "error: out of memory"
    if sys.platform != "win32":
        import resource

        def limited_memory():
            resource.setrlimit(resource.RLIMIT_AS, (8 * 10**9, resource.RLIM_INFINITY))  # room for it all

        limited = _failing_command("raise MemoryError", limited_memory)
        assert (
            limited.stderr.strip()
            == "error: out of memory (the process may use 8.0 GB of memory: `ulimit -v` raises it)"
        )


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_NOFILE is POSIX's")
def test_out_of_file_descriptors_is_one_line_with_the_limit():
    """A command that runs out of file descriptors ends with one line naming the limit; exiting
    needs none (it opened /dev/null for the streams' last flush, and failed with a traceback)."""
    import resource

    def few_open_files():
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    proc = _failing_command("held = []\nwhile True:\n    held.append(open('/dev/null'))", few_open_files)
    assert_one_line_error(proc, exit_code=1)
    expected = "error: Too many open files: /dev/null (the limit is 64 open files: `ulimit -n` raises it)"
    assert proc.stderr.strip() == expected


# The CLI with the memory check's reading patched: the first context (the target's) is not
# checked, every later one (the auto drafter's deferred draft) finds 1 KiB available.
SHORT_OF_MEMORY = """
import sys
from specllm.llama import memory
readings = iter([None])
memory.available_memory = lambda: next(readings, 1024)
from specllm.cli.main import main
sys.argv = ["specllm", *sys.argv[1:]]
main()
"""


def test_run_with_auto_goes_on_without_a_draft_the_memory_check_refuses_and_warns_once(tiny_models):
    """The target took the memory: the draft that auto wants at its first step cannot be loaded.
    The run failed with that error; it now gives target-only's greedy text, with one warning line
    and the reason in --json's policy."""
    args = ["run", "def f(x):", "--target", tiny_models.target, "--draft", tiny_models.draft, "-n", 12]
    args += ["--threads", 1, "--ctx-size", 256, "--temperature", 0, "--json"]
    proc = subprocess.run(
        [sys.executable, "-c", SHORT_OF_MEMORY, *map(str, args)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    reason = result["stats"]["policy"]["draft_unavailable"]
    assert reason.startswith("a context of 256 tokens for draft.gguf needs about")
    warnings = [line for line in proc.stderr.splitlines() if "draft" in line]
    assert warnings == [f"specllm: warning: the draft model could not be loaded, so auto goes on without it: {reason}"]
    alone = subprocess.run(
        SPECLLM + [*map(str, args), "--drafter", "none"], capture_output=True, text=True, timeout=120
    )
    assert json.loads(alone.stdout)["tokens"] == result["tokens"]

    model = subprocess.run(
        [sys.executable, "-c", SHORT_OF_MEMORY, *map(str, args), "--drafter", "model"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert_one_line_error(model, "error: a context of 256 tokens for draft.gguf needs about", ": free some memory")
