"""The CLI basics (issue 12, item 3): --version, shell completion, SPECLLM_... environment
variables for every option, doctor --json. A real process, and the tiny models where a command
needs one."""

import json
import os
import re
import signal
import subprocess
import sys

import llama_cpp
import pytest
from one_line import assert_one_line_error

import specllm
from specllm.cli.basics import NOT_FROM_ENV, RESERVED, build_command
from specllm.cli.main import app

SPECLLM = [sys.executable, "-m", "specllm"]
# Variables of the caller's own shell must not change what these tests see.
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("SPECLLM_") or k in RESERVED}


def run_specllm(*args, env=None):
    return subprocess.run(
        SPECLLM + list(map(str, args)), capture_output=True, text=True, timeout=120, env={**CLEAN_ENV, **(env or {})}
    )


def env_options(command) -> dict[str, list[str]]:
    """Every variable and the options that read it, as `command --option`."""
    found: dict[str, list[str]] = {}

    def walk(group, path: str) -> None:
        for name, sub in getattr(group, "commands", {}).items():
            for param in sub.params:
                if getattr(param, "envvar", None):
                    found.setdefault(param.envvar, []).append(f"{path}{name} {param.opts[0]}")
            walk(sub, f"{path}{name} ")

    walk(command, "")
    return found


def test_version_names_specllm_llama_cpp_python_and_the_llama_cpp_build():
    proc = run_specllm("--version")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"specllm {specllm.__version__}"
    assert lines[1] == f"llama-cpp-python {llama_cpp.__version__}"
    assert lines[2].startswith(f"llama.cpp {llama_cpp.llama_version().decode()}, ggml ")
    assert "CPU" in lines[3]  # llama_print_system_info: the backends and CPU features compiled in


def test_doctor_json_is_one_object():
    proc = run_specllm("doctor", "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["specllm"] == specllm.__version__ and info["llama_cpp_python"] == llama_cpp.__version__
    assert info["sampler"] == "compiled (C)"  # setup.py builds it wherever a C compiler is found
    assert isinstance(info["gpu_offload"], bool) and isinstance(info["devices"], list)
    assert info["physical_cores"] >= 1 and info["llama_cpp"].startswith(llama_cpp.llama_version().decode())
    assert info["transparent_huge_pages"] in ("always", "madvise", "never", "unavailable")
    assert (
        info["recurrent_models"].startswith("snapshots (--snapshots, default 8") and info["mtp_drafting"] == "supported"
    )


def test_shell_completion_completes_commands_and_options():
    env = {"_SPECLLM_COMPLETE": "complete_bash", "COMP_WORDS": "specllm ch", "COMP_CWORD": "1"}
    assert run_specllm(env=env).stdout.split() == ["chat"]
    env = {"_SPECLLM_COMPLETE": "complete_bash", "COMP_WORDS": "specllm run --ctx", "COMP_CWORD": "2"}
    assert run_specllm(env=env).stdout.split() == ["--ctx-size"]
    # the script a user installs (--install-completion writes it into the shell's startup file)
    script = run_specllm("--show-completion", "bash", env={"_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"})
    assert script.returncode == 0 and "_SPECLLM_COMPLETE=complete_bash" in script.stdout


def test_every_option_has_one_variable_shared_across_commands():
    command = build_command(app)
    found = env_options(command)
    for name in ("run", "chat", "bench"):
        for param in command.commands[name].params:
            if param.param_type_name != "option":
                continue
            long = next(o for o in param.opts if o.startswith("--"))
            expected = None if long in NOT_FROM_ENV else "SPECLLM_" + long[2:].upper().replace("-", "_")
            assert param.envvar == expected, (name, long)
    assert {"run --threads", "chat --threads", "bench --threads"} <= set(found["SPECLLM_THREADS"])
    assert {"run --ctx-size", "chat --ctx-size", "bench --ctx-size"} <= set(found["SPECLLM_CTX_SIZE"])
    assert not RESERVED & found.keys()  # SPECLLM_CACHE stays the cache folder
    help_text = run_specllm("run", "--help", env={"COLUMNS": "250"}).stdout
    assert re.search(r"--ctx-size .*\[env var: SPECLLM_CTX_SIZE\]", help_text)


def test_each_command_is_listed_on_one_line_for_the_terminal_to_wrap():
    """`specllm --help` on a wide terminal: each command's description is one row, not broken
    where its docstring's lines break."""
    rows = run_specllm("--help", env={"COLUMNS": "250"}).stdout.splitlines()
    listed = [row for row in rows if re.match(r"│ [a-z]+ +\S", row)]
    assert [row.split()[1] for row in listed] == ["run", "chat", "models", "pull", "rm", "doctor", "bench", "serve"]
    assert not [row for row in rows if re.match(r"│ {3,}\S", row)]  # no continuation rows


def test_a_variable_sets_a_default_and_a_flag_overrides_it(tiny_models):
    base = ["run", "Hello", "-m", tiny_models.target, "--drafter", "none", "--threads", 1, "--json"]
    env = {"SPECLLM_SEED": "7", "SPECLLM_MAX_TOKENS": "3", "SPECLLM_CTX_SIZE": "256", "SPECLLM_TEMPERATURE": "0"}
    proc = run_specllm(*base, env=env)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["seed"] == 7 and result["stats"]["generated_tokens"] == 3
    proc = run_specllm(*base, "--seed", 9, "-n", 5, env=env)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["seed"] == 9 and result["stats"]["generated_tokens"] == 5


def test_a_variable_gives_way_to_a_flag_it_cannot_go_with(tiny_models):
    """An exported SPECLLM_PAIR (or SPECLLM_SYSTEM, SPECLLM_DRAFTER) does not make a flag typed
    on the command line an error: the flag wins, as it does over its own variable."""
    base = ["run", "Hello", "-m", tiny_models.target, "--drafter", "none", "--threads", 1, "-n", 4, "--temp", 0]
    alone = run_specllm(*base, "--raw", "--json")
    assert alone.returncode == 0, alone.stderr
    for env, flag in [({"SPECLLM_PAIR": "qwen2.5-coder-1.5b"}, "--raw"), ({"SPECLLM_SYSTEM": "Be brief."}, "--raw")]:
        proc = run_specllm(*base, flag, "--json", env=env)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["tokens"] == json.loads(alone.stdout)["tokens"]
    # the variable still applies where nothing on the command line conflicts with it
    templated = json.loads(run_specllm(*base, "--json").stdout)
    with_system = json.loads(run_specllm(*base, "--json", env={"SPECLLM_SYSTEM": "Be brief."}).stdout)
    assert with_system["stats"]["prompt_tokens"] > templated["stats"]["prompt_tokens"]
    # both from variables: still refused
    both = run_specllm("run", "Hello", env={"SPECLLM_PAIR": "qwen2.5-coder-1.5b", "SPECLLM_TARGET": tiny_models.target})
    assert both.returncode == 1 and "not both" in both.stderr
    race = run_specllm("bench", "--drafts-for", tiny_models.target, env={"SPECLLM_DRAFTER": "model"})
    assert race.returncode == 1 and "no draft on disk fits" in race.stderr, race.stderr


@pytest.mark.parametrize(
    "env, flags",
    [
        ({"SPECLLM_REASONING_EFFORT": "low"}, ["--raw"]),
        ({"SPECLLM_SYSTEM": "Be brief."}, ["--suffix", "x"]),
        ({"SPECLLM_THINK": "0"}, ["--suffix", "x"]),
        ({"SPECLLM_SUFFIX": "x"}, ["--system", "Be brief."]),
        ({"SPECLLM_REASONING_EFFORT": "none"}, ["--think"]),
        ({"SPECLLM_THINK": "1"}, ["--reasoning-effort", "none"]),
    ],
)
def test_the_template_variables_give_way_to_a_flag_they_cannot_go_with(tiny_code_models, env, flags):
    """Each of these was an error naming the flag the user typed ("drop --system")."""
    base = ["run", "Hello", "-m", tiny_code_models.target, "--drafter", "none", "--threads", 1, "-n", 2, "--temp", 0]
    proc = run_specllm(*base, *flags, env=env)
    assert proc.returncode == 0, proc.stderr


def test_template_variables_that_clash_with_each_other_are_still_refused(tiny_models):
    base = ["run", "Hello", "-m", tiny_models.target, "--drafter", "none", "-n", 2]
    proc = run_specllm(*base, env={"SPECLLM_THINK": "1", "SPECLLM_REASONING_EFFORT": "none"})
    assert proc.returncode == 1 and "ask for opposite things" in proc.stderr, proc.stderr
    low = run_specllm(*base, "--think", env={"SPECLLM_REASONING_EFFORT": "low"})  # no clash: both apply
    assert low.returncode == 0, low.stderr


@pytest.mark.parametrize(
    "option, value, fragment",
    [
        ("--ctx-size", "2", "context size must be at least 256"),
        ("--threads", "abc", "Invalid value for '--threads' (env var: 'SPECLLM_THREADS')"),
        ("--temperature", "-1", "temperature must be >= 0"),
        ("--gamma", "0", "gamma (draft length) must be >= 1"),
        ("--top-p", "2", "top-p must be in [0, 1]"),
        ("--draft-gpu-layers", "-2", "GPU layers must be >= 0"),  # the draft's, not the target's
    ],
)
def test_a_bad_variable_is_the_same_one_line_as_the_bad_flag_naming_the_variable(tiny_models, option, value, fragment):
    base = ["run", "Hello", "-m", tiny_models.target]
    variable = "SPECLLM_" + option[2:].upper().replace("-", "_")
    from_env, from_flag = run_specllm(*base, env={variable: value}), run_specllm(*base, option, value)
    lines = from_env.stderr.strip().splitlines()
    assert from_env.returncode != 0 and len(lines) == 1 and lines[0].startswith("error: "), from_env.stderr
    assert fragment in lines[0] and variable in lines[0]
    assert from_flag.returncode == from_env.returncode
    assert lines[0].startswith(from_flag.stderr.strip())  # the flag's error, and where the value came from


BAD_UTF8 = os.fsdecode(b"\xff")


@pytest.mark.parametrize(
    "command, variable, value, message",
    [
        ("run", "SPECLLM_DRAFTER", "foo", "unknown drafter 'foo': use one of auto, model, mtp, ngram, none"),
        ("run", "SPECLLM_SYSTEM", BAD_UTF8, "--system is not valid UTF-8 text (at character 1)"),
        ("run", "SPECLLM_STOP", BAD_UTF8, "--stop is not valid UTF-8 text (at character 1)"),
        ("run", "SPECLLM_PAIR", "nosuch", "unknown pair 'nosuch'; known pairs: "),
        ("run", "SPECLLM_DRAFT", "/nonexistent.gguf", "model file not found: /nonexistent.gguf"),
        ("run", "SPECLLM_MODELS", "/nonexistent.toml", "pairs file not found: /nonexistent.toml"),
        ("chat", "SPECLLM_RESUME", "/nonexistent.json", "cannot read /nonexistent.json"),
        ("bench", "SPECLLM_DRAFTER", "foo", "unknown drafter 'foo': use auto, model, mtp, ngram"),
        ("bench", "SPECLLM_GAMMA", "abc", "--gamma takes comma-separated integers, e.g. 1,2,4,8; got 'abc'"),
        ("bench", "SPECLLM_GAMMA", "0", "gamma (draft length) must be >= 1, got 0"),
        ("bench", "SPECLLM_CATEGORIES", "nosuch", "no prompts in category nosuch: the suite has code-generation"),
        ("bench", "SPECLLM_CATEGORIES", ",", "empty category list"),
        ("bench", "SPECLLM_PROMPTS", "/nonexistent.jsonl", "cannot read prompts from /nonexistent.jsonl"),
        ("bench", "SPECLLM_PER_CATEGORY", "0", "prompts per category must be >= 1, got 0"),
        ("serve", "SPECLLM_API_KEY", BAD_UTF8, "the API key must have no spaces, line breaks or other control"),
    ],
)
def test_a_bad_value_checked_by_the_command_names_its_variable(tiny_models, command, variable, value, message):
    args = [command] + (["Hello"] if command == "run" else []) + ["-m", tiny_models.target]
    if variable == "SPECLLM_PAIR":
        args = ["run", "Hello"]  # a pair goes with no target
    proc = run_specllm(*args, env={variable: value})
    assert_one_line_error(proc, message, f"(set by {variable})", exit_code=1)


@pytest.mark.parametrize(
    "args",
    [
        ["bench", "--models", ""],
        ["rm", "x", "--models", ""],
        ["bench", "--prompts", ""],
        ["bench", "--json", ""],
        ["chat", "--resume", ""],
    ],
)
def test_an_empty_file_option_says_it_is_empty(args):
    """As a path "" is the current folder: "file '' is a directory" named a folder never given."""
    proc = run_specllm(*args)
    assert_one_line_error(proc, f"Invalid value for '{args[-2]}'", "the value is empty: give a file", exit_code=2)


@pytest.mark.parametrize(
    "args",
    [
        ["run", "Hello", "--drafter", ""],
        ["run", "Hello", "--rpc", ""],
        ["chat", "--draft-rpc", ""],
        ["bench", "--drafter", ""],
        ["bench", "--gamma", ""],
        ["bench", "--categories", ""],
        ["bench", "--drafts-for", ""],
        ["serve", "--host", ""],
        ["doctor", "--rpc", ""],
    ],
)
def test_an_empty_text_option_says_it_is_empty(args):
    """`--rpc "$SERVERS"` with the variable unset ran without RPC, and an empty --drafter, --gamma or
    --categories ran the defaults, as if the option had not been given."""
    proc = run_specllm(*args)
    assert_one_line_error(proc, f"Invalid value for '{args[-2]}'", "the value is empty", exit_code=2)


def test_an_empty_variable_counts_as_unset(tiny_models):
    proc = run_specllm("run", "Hello", "-m", tiny_models.target, "-n", "2", "--no-live", env={"SPECLLM_DRAFTER": ""})
    assert proc.returncode == 0, proc.stderr
    assert "drafter auto" in proc.stdout + proc.stderr


def test_a_bad_boolean_variable_is_one_line_naming_it(tiny_models):
    proc = run_specllm("run", "Hello", "-m", tiny_models.target, env={"SPECLLM_OFFLINE": "maybe"})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: Invalid value for '--offline' (env var: 'SPECLLM_OFFLINE')")


@pytest.mark.parametrize(
    "signum, line, code", [(signal.SIGINT, "interrupted", 130), (signal.SIGTERM, "terminated", 143)]
)
def test_a_signal_while_the_command_starts_is_its_one_line(signum, line, code):
    """Ctrl-C or SIGTERM while the command's modules are still being imported: the signal is sent
    from inside the import of typer, which the command imports early."""
    launch = (
        "import builtins, os, sys, specllm.__main__ as command\n"
        "real = builtins.__import__\n"
        "def importing(name, *args, **kwargs):\n"
        f"    if name == 'typer': os.kill(os.getpid(), {int(signum)})\n"
        "    return real(name, *args, **kwargs)\n"
        "builtins.__import__ = importing\n"
        "sys.argv = ['specllm', '--help']\n"
        "command.main()\n"
    )
    proc = subprocess.run([sys.executable, "-c", launch], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stderr) == (code, line + "\n")
