"""`specllm bench --drafts-for T`: the drafts on disk that fit T, measured on this machine and
ranked; the fastest is remembered for T and used when T is given alone. Real llama.cpp on tiny
models (the slow test: the real default target)."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tiny_models as tm
from one_line import assert_one_line_error

from specllm.bench.race import rank, winner
from specllm.files import cache_dir, file_identity
from specllm.models import winners

ROOT = Path(__file__).resolve().parents[2]


def specllm_cli(*args, env=None, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "specllm", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "250", **(env or {})},
    )


def flat(text: str) -> str:
    return " ".join(text.split())


# --- remembering ---------------------------------------------------------------------------------


def a_winner(path: Path, **changes) -> winners.Winner:
    fields = dict(
        path=str(path),
        name=f"lmstudio:pub/repo/{path.name}",
        tokens_per_second=80.0,
        speedup=1.25,
        acceptance=0.75,
        gamma=4,
        measured=2,
    )
    return winners.Winner(**{**fields, **changes})


def test_a_winner_is_remembered_per_target_while_both_files_are_as_they_were(tmp_path):
    files = {name: tmp_path / name for name in ("t1.gguf", "t2.gguf", "d1.gguf", "d2.gguf")}
    for path in files.values():
        path.write_bytes(b"GGUF" + path.name.encode())
    first, second = a_winner(files["d1.gguf"]), a_winner(files["d2.gguf"], speedup=None, gamma=2)
    winners.remember(files["t1.gguf"], first)
    winners.remember(files["t2.gguf"], second)
    assert winners.remembered(files["t1.gguf"]) == first
    assert winners.remembered(files["t2.gguf"]) == second
    assert winners.remembered(files["d1.gguf"]) is None  # not a target that was measured

    os.utime(files["d1.gguf"], ns=(1, 1))  # the draft changed since it was measured: not it any more
    assert winners.remembered(files["t1.gguf"]) is None
    winners.remember(files["t1.gguf"], first)
    assert winners.remembered(files["t1.gguf"]) == first
    files["d1.gguf"].unlink()  # removed: the usual search applies
    assert winners.remembered(files["t1.gguf"]) is None

    files["t2.gguf"].write_bytes(b"GGUF another model now")  # the target changed: its entry goes
    assert winners.remembered(files["t2.gguf"]) is None
    winners.remember(files["t1.gguf"], a_winner(files["d2.gguf"]))
    kept = json.loads((cache_dir() / winners.FILE_NAME).read_text())
    assert list(kept) == [file_identity(files["t1.gguf"])]

    (cache_dir() / winners.FILE_NAME).write_text('{"cut short')
    assert winners.remembered(files["t1.gguf"]) is None


def measured(name: str, tokens_per_second: float, accepted: int) -> dict:
    best = {
        "tokens_per_second": tokens_per_second,
        "n_accepted": accepted,
        "speedup": tokens_per_second / 100,
        "acceptance_rate": accepted / 50,
        "gamma": 4,
    }
    return {"name": name, "path": f"/m/{name}", "best": best}


def test_the_fastest_draft_that_was_ever_accepted_wins():
    drafts = [measured("slow", 60.0, 30), measured("never-accepted", 300.0, 0), measured("fast", 90.0, 40)]
    ranked = rank(drafts)
    assert [d["name"] for d in ranked] == ["fast", "slow", "never-accepted"]
    assert winner(ranked) == {
        "path": "/m/fast",
        "name": "fast",
        "tokens_per_second": 90.0,
        "speedup": 0.9,
        "acceptance": 0.8,
        "gamma": 4,
        "measured": 3,
    }
    assert winner(rank([measured("never-accepted", 300.0, 0)])) is None
    assert winner([]) is None


# --- measuring, on tiny models -------------------------------------------------------------------


@pytest.fixture
def two_drafts(tmp_path, monkeypatch, tiny_models):
    """The tiny target, and two drafts in other tools' stores: `same`, the target's own weights
    without its chat template (a smaller file that always agrees), in LM Studio's folder, and
    `other`, a one-layer model of another seed (it rarely agrees; the smallest, so the usual search
    takes it first), in llama.cpp's cache."""
    monkeypatch.setenv("SPECLLM_LMSTUDIO_HOME", str(tmp_path / "lmstudio"))
    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path / "llama.cpp"))
    target = Path(shutil.copyfile(tiny_models.target, tmp_path / "target.gguf"))
    (tmp_path / "lmstudio" / "models" / "tiny-org" / "Tiny-GGUF").mkdir(parents=True)
    (tmp_path / "llama.cpp").mkdir()
    same = tm.write_model(
        tmp_path / "lmstudio" / "models" / "tiny-org" / "Tiny-GGUF" / "same.gguf", seed=0, chat_template=None
    )
    other = tm.write_model(tmp_path / "llama.cpp" / "tiny-org_Tiny-GGUF_other.gguf", seed=2, n_layer=1)
    assert other.stat().st_size < same.stat().st_size < target.stat().st_size
    return {
        "target": target,
        "same": same,
        "other": other,
        "same_name": "lmstudio:tiny-org/Tiny-GGUF/same.gguf",
        "other_name": "llamacpp:tiny-org_Tiny-GGUF_other.gguf",
    }


def test_bench_drafts_for_ranks_the_drafts_and_a_run_then_uses_the_fastest(two_drafts, tmp_path):
    out = tmp_path / "race.json"
    proc = specllm_cli(
        "bench", "--drafts-for", two_drafts["target"], "-n", 16, "--gamma", "2,4", "--threads", 1, "--json", out
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads(out.read_text())
    assert [d["name"] for d in results["drafts"]] == [two_drafts["same_name"], two_drafts["other_name"]]
    same, other = (d["best"] for d in results["drafts"])
    assert same["acceptance_rate"] > 0.9 > 0.5 > other["acceptance_rate"]
    assert same["tokens_per_second"] > other["tokens_per_second"]
    for d in results["drafts"]:  # each draft at both lengths, its fastest first and taken as its best
        speeds = [g["tokens_per_second"] for g in d["by_gamma"]]
        assert sorted(g["gamma"] for g in d["by_gamma"]) == [2, 4] and speeds == sorted(speeds, reverse=True)
        assert d["best"] == d["by_gamma"][0]
    assert results["settings"]["prompts"] == 5 and results["target_only"]["runs"] == 5
    assert results["winner"]["path"] == str(two_drafts["same"]) and results["remembered"]
    assert two_drafts["same_name"] in proc.stdout and "target-only" in proc.stdout and "Remembered" in proc.stdout

    used = specllm_cli("run", "def f(x):", "--target", two_drafts["target"], "-n", 8, "--threads", 1, "--json")
    assert used.returncode == 0, used.stderr
    assert (
        f"specllm: draft for target.gguf: {two_drafts['same_name']}, the fastest of 2 draft(s) measured here"
        in flat(used.stderr)
    )

    listed = specllm_cli("models", "--drafts-for", two_drafts["target"])
    assert (
        listed.returncode == 0
        and "Measured fastest here" in listed.stdout
        and two_drafts["same_name"] in flat(listed.stdout.split("Measured fastest")[1])
    )
    as_json = json.loads(specllm_cli("models", "--drafts-for", two_drafts["target"], "--json").stdout)
    assert as_json["measured_fastest"]["path"] == str(two_drafts["same"])

    chosen = specllm_cli(
        "run",
        "def f(x):",
        "--target",
        two_drafts["target"],
        "--draft",
        two_drafts["other"],
        "-n",
        8,
        "--threads",
        1,
        "--json",
    )
    assert chosen.returncode == 0 and "fastest" not in chosen.stderr  # --draft overrides

    two_drafts["same"].unlink()  # the winner is gone: the usual search (the smallest that fits)
    usual = specllm_cli("run", "def f(x):", "--target", two_drafts["target"], "-n", 8, "--threads", 1, "--json")
    assert usual.returncode == 0, usual.stderr
    assert (
        f"draft for target.gguf: {two_drafts['other_name']}" in flat(usual.stderr) and "smallest GGUF" in usual.stderr
    )


def test_bench_drafts_for_names_a_target_with_brackets_as_it_is(two_drafts, tmp_path):
    """The verdict names the target as given: brackets in its path are text, not Rich markup (a
    "[/]" with nothing to close was a MarkupError once the race had run)."""
    (tmp_path / "[bold]t[").mkdir()
    target = two_drafts["target"].rename(tmp_path / "[bold]t[" / "]x.gguf")  # its path holds "[bold]t[/]x"
    prompts = tmp_path / "one.jsonl"
    prompts.write_text('{"prompt": "def f(x):"}\n')
    proc = specllm_cli("bench", "--drafts-for", target, "-n", 4, "--gamma", 2, "--threads", 1, "--prompts", prompts)
    assert proc.returncode == 0, proc.stderr
    assert f"`specllm run --target {target}`" in flat(proc.stdout)


def test_bench_drafts_for_shows_an_escape_sequence_in_a_drafts_name_not_obeys_it(two_drafts, tmp_path):
    two_drafts["same"].rename(two_drafts["same"].with_name("s\x1b[31mame.gguf"))  # the winner: table and verdict
    prompts = tmp_path / "one.jsonl"
    prompts.write_text('{"prompt": "def f(x):"}\n')
    args = ("bench", "--drafts-for", two_drafts["target"], "-n", 4, "--gamma", 2, "--threads", 1, "--prompts", prompts)
    proc = specllm_cli(*args)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and flat(proc.stdout).count("lmstudio:tiny-org/Tiny-GGUF/s␛[31mame.gguf") == 2


def test_bench_drafts_for_without_a_draft_on_disk_or_with_a_pair_is_one_line(tiny_models):
    assert_one_line_error(
        specllm_cli("bench", "--drafts-for", tiny_models.target), "no draft on disk fits", "--drafts-for"
    )
    assert_one_line_error(
        specllm_cli("bench", "--drafts-for", tiny_models.target, "--target", tiny_models.target),
        "--drafts-for",
        "without --pair, --target",
    )


def test_bench_drafts_for_refuses_a_prompt_longer_than_the_context_before_it_races(two_drafts, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    lines = [{"prompt": "Hello there", "category": "short"}, {"prompt": "word " * 300, "category": "long"}]
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    proc = specllm_cli("bench", "--drafts-for", two_drafts["target"], "--prompts", prompts, "-c", 256, "-n", 4)
    assert_one_line_error(proc, "prompt 2 (long: 'word word", "but the context holds 256", "--ctx-size")
    assert winners.remembered(two_drafts["target"]) is None


def test_bench_drafts_for_keeps_the_default_lengths_within_a_hybrid_targets_snapshots(tmp_path, monkeypatch):
    """Without --gamma, the race's draft lengths (2,4) are cut to the target's snapshots, as bench's
    are: a hybrid target with one snapshot races at gamma 1 instead of refusing a length nobody gave."""
    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path / "llama.cpp"))
    (tmp_path / "llama.cpp").mkdir()
    target = tm.write_model(tmp_path / "hybrid.gguf", seed=0, arch="qwen35")
    tm.write_model(tmp_path / "llama.cpp" / "tiny-org_Tiny-GGUF_d.gguf", seed=0, chat_template=None)
    prompts = tmp_path / "one.jsonl"
    prompts.write_text('{"prompt": "def f(x):"}\n')
    out = tmp_path / "race.json"
    args = ("bench", "--drafts-for", target, "-n", 4, "--threads", 1, "--prompts", prompts, "--json", out)
    proc = specllm_cli(*args, "--snapshots", 1)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["settings"]["gammas"] == [1]
    given = specllm_cli(*args, "--snapshots", 1, "--gamma", 2)  # a length asked for is checked as it is
    assert_one_line_error(given, "gamma (draft length) 2 is longer than the 1 recurrent-state snapshots")


# --- the real default target ---------------------------------------------------------------------


def write_random_draft_with_vocabulary_of(source: Path, dest: Path) -> Path:
    """A tiny model with random weights and `source`'s tokenizer (benchmarks/random_pair.py): a
    draft that passes the vocabulary check and almost never agrees."""
    spec = importlib.util.spec_from_file_location("random_pair", ROOT / "benchmarks" / "random_pair.py")
    random_pair = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(random_pair)
    return random_pair.write_random_model(source, dest)


@pytest.mark.slow
def test_bench_drafts_for_the_real_default_target_ranks_two_drafts_and_a_run_uses_the_winner(tmp_path):
    """The real 1.5B target; its real 0.5B draft linked into a fake LM Studio folder (the same
    file, not a copy), and a random-weight draft with Qwen's vocabulary in llama.cpp's cache. The
    winner is remembered in a cache of the test's own, not the user's."""
    from specllm.models.hub import resolve_models

    target, draft, _ = resolve_models(progress=False)  # the default pair, from the real cache
    linked = tmp_path / "lmstudio" / "models" / "Qwen" / "Qwen2.5-Coder-0.5B-Instruct-GGUF" / draft.name
    linked.parent.mkdir(parents=True)
    linked.symlink_to(draft)
    random = write_random_draft_with_vocabulary_of(draft, tmp_path / "llama.cpp" / "random-qwen-vocab.gguf")
    env = {
        "SPECLLM_CACHE": str(tmp_path / "cache"),
        "HF_HOME": str(tmp_path / "hf"),
        "OLLAMA_MODELS": str(tmp_path / "ollama"),
        "SPECLLM_LMSTUDIO_HOME": str(tmp_path / "lmstudio"),
        "LLAMA_CACHE": str(tmp_path / "llama.cpp"),
    }
    out = tmp_path / "race.json"
    proc = specllm_cli(
        "bench",
        "--drafts-for",
        target,
        "-n",
        16,
        "--gamma",
        4,
        "--ctx-size",
        1024,
        "--categories",
        "code-editing,code-generation",
        "--json",
        out,
        env=env,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads(out.read_text())
    names = [d["name"] for d in results["drafts"]]
    lms_name = f"lmstudio:Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF/{draft.name}"
    assert names == [lms_name, "llamacpp:random-qwen-vocab.gguf"]
    real, rand = (d["best"] for d in results["drafts"])
    assert real["acceptance_rate"] > 0.3 > 0.05 > rand["acceptance_rate"]
    assert results["winner"]["name"] == lms_name and results["remembered"]
    print(proc.stdout)
    used = specllm_cli("run", "def f(x):", "--target", target, "-n", 8, "--json", env=env, timeout=600)
    assert used.returncode == 0, used.stderr
    assert f"draft for {target.name}: {lms_name}, the fastest of 2 draft(s) measured here" in flat(used.stderr)
    assert random.is_file()


def test_the_race_goes_on_without_a_draft_that_cannot_be_loaded(two_drafts, monkeypatch):
    """The target took the memory the first draft's context needs (the check refuses it) and the
    second's file went bad after the drafts were found: each failed the whole race. Each is left
    out with its error (the view says so under the table) and the others are raced; with none
    left, one error naming each."""
    import specllm
    from specllm.bench.race import race
    from specllm.bench.runner import BenchPrompt, BenchSettings, configurations
    from specllm.bench.view import render_draft_race
    from specllm.cli.report import names_console
    from specllm.errors import SpecllmError
    from specllm.llama import memory
    from specllm.llama.options import ModelOptions
    from specllm.models.drafts import candidates

    third = two_drafts["other"].with_name("tiny-org_Tiny-GGUF_third.gguf")
    tm.write_model(third, seed=3, n_layer=1, n_embd=32)
    found = [c for c in candidates(two_drafts["target"], {}) if c.compatible]
    assert [c.path for c in found] == [third, two_drafts["other"], two_drafts["same"]]  # smallest first
    whole = two_drafts["other"].read_bytes()
    two_drafts["other"].write_bytes(whole[: len(whole) - 4096])
    settings = BenchSettings(tuple(configurations(["model"], [2])), max_tokens=4)
    options = ModelOptions(n_ctx=256, n_threads=1)
    engine = specllm.load(str(two_drafts["target"]), n_ctx=256, n_threads=1)
    refusals = iter([1024])  # the first draft's check: 1 KiB left; then nothing known (not checked)
    monkeypatch.setattr(memory, "available_memory", lambda: next(refusals, None))
    try:
        results = race(engine, found, [BenchPrompt("def f(x):")], settings, options)
        refusals = iter([1024])
        two_drafts["same"].write_bytes(b"")  # gone bad too: none left
        with pytest.raises(SpecllmError) as none_left:
            race(engine, found, [BenchPrompt("def f(x):")], settings, options)
    finally:
        engine.close()
    assert [d["path"] for d in results["drafts"]] == [str(two_drafts["same"])]
    assert results["winner"]["path"] == str(two_drafts["same"]) and results["winner"]["measured"] == 1
    third_error, other_error = (s["error"] for s in results["skipped"])
    assert third_error.startswith("a context of 256 tokens for tiny-org_Tiny-GGUF_third.gguf needs about")
    assert other_error.startswith(f"cannot load {two_drafts['other']}: ")
    console = names_console(record=True, width=250, file=io.StringIO())
    render_draft_race(results, console)
    shown = flat(console.export_text())
    assert f"Not raced: llamacpp:tiny-org_Tiny-GGUF_third.gguf could not be loaded: {flat(third_error)}" in shown
    assert f"Not raced: {two_drafts['other_name']} could not be loaded: cannot load" in shown
    assert str(none_left.value).startswith(
        "no draft for target.gguf could be loaded: llamacpp:tiny-org_Tiny-GGUF_third"
    )
    assert str(none_left.value).count("; ") == 2
