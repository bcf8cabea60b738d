"""Models on disk: `specllm models` (the caches listed, with real sizes), `specllm rm` (only inside
the caches, asking first) and finding a draft for a target given alone. The HF cache is filled by
huggingface_hub's own download code from the fake Hub; the models are tiny real GGUFs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tiny_models as tm
import typer
from fakehub import model_file
from permissions import permission_bits_apply
from terminal import Terminal
from typer.testing import CliRunner

from specllm.cli.models import models_command, rm_command
from specllm.errors import SpecllmError
from specllm.files import human_size
from specllm.models import hub
from specllm.models import local as local_models
from specllm.models.drafts import candidates, curated_drafts, family
from specllm.models.registry import load_pairs

REPO = "tiny-org/drafts-GGUF"


@pytest.fixture(scope="module")
def small_models(tmp_path_factory):
    """Drafts smaller than the 2-layer tiny target: compatible ones of two sizes, an incompatible
    one smaller than both (so it is tried first and must be skipped), and one bigger than the target."""
    d = tmp_path_factory.mktemp("small_models")
    half = dict(n_layer=1, n_embd=32, n_head=4, n_ff=64)
    return {
        "small.gguf": tm.write_model(d / "small.gguf", seed=0, noise=tm.DRAFT_NOISE, n_layer=1),
        "smaller.gguf": tm.write_model(d / "smaller.gguf", seed=2, n_layer=1, n_embd=48, n_head=4, n_ff=96),
        "other-vocab.gguf": tm.write_model(d / "other-vocab.gguf", seed=0, vocab="incompatible", **half),
        "big.gguf": tm.write_model(d / "big.gguf", seed=0, n_layer=3),
    }


def download(fake_hub, repo: str, path: Path, name: str | None = None) -> Path:
    """Put a file into the HF cache the way a user gets it there: downloaded from the Hub."""
    content = path.read_bytes()
    fake_hub.add(repo, name or path.name, content)
    return hub.fetch_file(model_file(repo, name or path.name, content), progress=False)


def into_specllm_cache(path: Path, repo: str, name: str | None = None) -> Path:
    """Where a file assembled from the mirror lives."""
    dest = hub.cache_dir() / "models" / repo.replace("/", "--") / (name or path.name)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(path.read_bytes())
    return dest


def cli() -> typer.Typer:
    app = typer.Typer()
    app.command("models")(models_command)
    app.command("rm")(rm_command)
    return app


def invoke(*args, **kwargs):
    return CliRunner().invoke(cli(), [str(a) for a in args], env={"COLUMNS": "250"}, **kwargs)


def specllm(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "specllm", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


# --- models --------------------------------------------------------------------------------------


def test_models_lists_both_caches_with_real_sizes_and_a_total(fake_hub, tiny_models, small_models, tmp_path):
    hf_file = download(fake_hub, REPO, small_models["small.gguf"])
    split_first = tm.write_model(tmp_path / "whole.gguf", seed=0, split_max_tensors=8)
    split_parts = sorted(split_first.parent.glob("whole-*.gguf"))
    for part in split_parts:
        download(fake_hub, REPO, part)
    own = into_specllm_cache(small_models["smaller.gguf"], "tiny-org/mirror-GGUF")
    (own.parent / f".{own.name}.123.incomplete").write_bytes(b"GGUF half")  # a killed assembly's: not a model
    (
        hub.hf_cache_dir() / f"models--{REPO.replace('/', '--')}" / "snapshots" / hf_file.parent.name / "README.md"
    ).write_text("x")

    result = invoke("models", "--json")
    assert result.exit_code == 0, result.output
    listing = json.loads(result.output)
    models = {m["spec"]: m for m in listing["models"]}
    assert set(models) == {
        f"hf:{REPO}/small.gguf",
        f"hf:{REPO}/whole-00001-of-00003.gguf",
        "hf:tiny-org/mirror-GGUF/smaller.gguf",
    }
    split = models[f"hf:{REPO}/whole-00001-of-00003.gguf"]
    assert split["parts"] == [str(hf_file.parent / p.name) for p in split_parts] and split["complete"]
    assert split["size"] == sum(p.stat().st_size for p in split_parts)
    assert models[f"hf:{REPO}/small.gguf"]["cache"] == "HF cache" and models[f"hf:{REPO}/small.gguf"]["refs"] == [
        "main"
    ]
    assert models["hf:tiny-org/mirror-GGUF/smaller.gguf"]["path"] == str(own)
    sizes = [small_models["small.gguf"].stat().st_size, own.stat().st_size, split["size"]]
    assert listing["total_size"] == sum(sizes)
    assert listing["hf_cache"] == str(hub.hf_cache_dir()) and listing["pairs"][0]["name"] == "qwen2.5-coder-1.5b"

    table = invoke("models")
    assert table.exit_code == 0
    assert f"GGUF models on disk: 3, {sum(sizes) / 1e6:.1f} MB in all" in table.output
    assert f"hf:{REPO}/whole-00001-of-00003.gguf (3 files)" in table.output
    assert table.output.count("HF cache @main") == 2 and "specllm cache " in table.output  # where, at which ref


def test_models_with_empty_caches(isolated):
    listing = json.loads(invoke("models", "--json").output)
    assert listing["models"] == [] and listing["total_size"] == 0


def test_a_hub_repository_with_a_blob_missing_is_a_warning_not_a_silence(fake_hub, small_models, monkeypatch):
    """huggingface_hub's scan leaves a repository with a blob missing out whole, its sound files
    too; the listing says so. Other things in the cache that are not models are not mentioned."""
    kept = download(fake_hub, REPO, small_models["small.gguf"])
    broken = download(fake_hub, REPO, small_models["smaller.gguf"])
    broken.resolve().unlink()  # (deleted by hand, or by a cleanup cut short)
    cache = hub.hf_cache_dir()
    (cache / "version.txt").write_text("1")  # as other libraries leave it there
    (cache / "models--o--never-downloaded" / "refs").mkdir(parents=True)  # a first download cut short
    problems: list[str] = []
    assert local_models.scan(problems) == [] and kept.is_file()
    assert problems == [
        f"HF cache: Blob missing (broken symlink): {broken.resolve()}; that repository's models are not listed"
    ]
    result = invoke("models", "--json")
    assert json.loads(result.stdout)["problems"] == problems
    link = cache.parent.with_name("hf-link")  # the scan names resolved paths: the same through a link
    link.symlink_to(cache.parent)
    monkeypatch.setenv("HF_HOME", str(link))
    again: list[str] = []
    local_models.scan(again)
    assert again == problems


# --- rm ------------------------------------------------------------------------------------------


def test_rm_removes_a_hub_file_through_huggingface_hubs_cache_api(fake_hub, small_models):
    kept = download(fake_hub, REPO, small_models["small.gguf"])
    gone = download(fake_hub, REPO, small_models["smaller.gguf"])
    blob = gone.resolve()
    result = invoke("rm", f"hf:{REPO}/smaller.gguf", "--yes")
    assert result.exit_code == 0, result.output
    assert not gone.exists() and not blob.exists()  # the snapshot entry and its blob
    assert kept.is_file() and kept.resolve().is_file()  # the other file of the same revision stays
    assert [m.spec for m in local_models.scan()] == [f"hf:{REPO}/small.gguf"]


def test_rm_a_pair_removes_both_files_from_either_cache(fake_hub, isolated, tiny_models):
    from fakehub import pairs_file

    target, draft = tiny_models.target.read_bytes(), tiny_models.draft.read_bytes()
    pairs = pairs_file(isolated / "pairs.toml", REPO, target, draft)
    in_hf = download(fake_hub, REPO, tiny_models.target, "target.gguf")
    in_own = into_specllm_cache(tiny_models.draft, REPO, "draft.gguf")
    result = invoke("rm", "tiny", "--models", pairs, "--yes")
    assert result.exit_code == 0, result.output
    assert not in_hf.exists() and not in_own.exists() and not in_own.parent.exists()
    assert "removed 2 models" in result.output
    again = invoke("rm", "tiny", "--models", pairs, "--yes")
    assert str(again.exception) == "pair 'tiny' is not downloaded: nothing to remove"


def test_rm_removes_a_split_model_with_its_first_part_missing_by_the_name_models_lists(
    fake_hub, isolated, tiny_models, tmp_path
):
    """The parts a split model has left after its first was removed by hand are listed by the first
    part there is; that name, and the first part's, remove them from either cache."""
    first = tm.write_model(tmp_path / "whole.gguf", seed=0, split_max_tensors=8)
    parts = sorted(first.parent.glob("whole-*.gguf"))[1:]
    in_hf = [download(fake_hub, REPO, part) for part in parts]
    in_own = [into_specllm_cache(part, "tiny-org/mirror-GGUF") for part in parts]
    listed = sorted(m["spec"] for m in json.loads(invoke("models", "--json").output)["models"])
    assert listed == [f"hf:{repo}/whole-00002-of-00003.gguf" for repo in (REPO, "tiny-org/mirror-GGUF")]
    for spec, files in ((listed[0], in_hf), ("hf:tiny-org/mirror-GGUF/whole-00001-of-00003.gguf", in_own)):
        result = invoke("rm", spec, "--yes")
        assert result.exit_code == 0, result.output
        assert "removed 1 model," in result.output and not any(f.exists() for f in files)
    assert local_models.scan() == []


def test_rm_a_single_file_entry_removes_its_one_file(fake_hub, isolated, tiny_models, small_models):
    from fakehub import single_file

    pairs = single_file(isolated / "one.toml", REPO, tiny_models.target.read_bytes())
    target = download(fake_hub, REPO, tiny_models.target, "target.gguf")
    kept = download(fake_hub, REPO, small_models["small.gguf"])
    result = invoke("rm", "tiny-one", "--models", pairs, "--yes")
    assert result.exit_code == 0, result.output
    assert "removed 1 model," in result.output and not target.exists()
    assert [m.spec for m in local_models.scan()] == [f"hf:{REPO}/small.gguf"] and kept.is_file()
    again = invoke("rm", "tiny-one", "--models", pairs, "--yes")
    assert str(again.exception) == "pair 'tiny-one' is not downloaded: nothing to remove"


def test_a_download_left_unfinished_in_the_hf_cache_is_a_warning_with_its_size(fake_hub, small_models):
    """huggingface_hub writes a download to a file named after its own process: a pull that was
    killed leaves it for good, holding disk space that no listing showed."""
    kept = download(fake_hub, REPO, small_models["small.gguf"])
    left = kept.resolve().parent / "0123abcd.5f3e2a1b.incomplete"
    left.write_bytes(b"x" * 3000)
    result = invoke("models", "--json")
    assert result.exit_code == 0, result.output
    listing = json.loads(result.stdout)
    assert [m["spec"] for m in listing["models"]] == [f"hf:{REPO}/small.gguf"]
    assert listing["problems"] == [
        f"HF cache: {left} holds {human_size(3000)} of an unfinished download (a pull that was killed, "
        "unless one is under way now): delete it to free the space"
    ]


def test_a_hub_repository_that_cannot_be_read_hides_only_its_own_models(fake_hub, small_models):
    """One repository folder without permission (another user's, or a copy made as root) ends
    huggingface_hub's scan of the whole cache: the others are still listed. Removing needs a scan
    of the whole cache, as a blob may be shared: it is refused, and nothing is removed."""
    kept = download(fake_hub, REPO, small_models["small.gguf"])
    download(fake_hub, "tiny-org/other-GGUF", small_models["smaller.gguf"])
    locked = hub.hf_cache_dir().resolve() / "models--tiny-org--other-GGUF"
    prefix = permission_bits_apply()
    locked.chmod(0)
    try:
        listing = subprocess.run(
            [*prefix, sys.executable, "-m", "specllm", "models", "--json"], capture_output=True, text=True, timeout=120
        )
        removal = subprocess.run(
            [*prefix, sys.executable, "-m", "specllm", "rm", f"hf:{REPO}/small.gguf", "--yes"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        locked.chmod(0o755)
    assert listing.returncode == 0 and "Traceback" not in listing.stderr, listing.stderr
    found = json.loads(listing.stdout)
    assert [m["spec"] for m in found["models"]] == [f"hf:{REPO}/small.gguf"]
    assert found["problems"] == [f"cannot read {locked} in the HF cache: Permission denied; its models are not listed"]
    assert removal.returncode == 1 and "Traceback" not in removal.stderr, removal.stderr
    last = removal.stderr.strip().splitlines()[-1]  # (after the list of what was asked for)
    assert last.startswith(f"error: cannot read {locked}/") and "Permission denied; nothing removed" in last
    assert kept.is_file()


def test_a_folder_of_specllms_cache_that_cannot_be_read_hides_only_its_own_models(isolated, tiny_models, small_models):
    """A download folder or a mirror repository folder without permission (a copy made as root)
    stopped `models`, and every run that looks for a draft on disk, with "error: Permission
    denied": it is a warning, and the rest is listed."""
    into_specllm_cache(small_models["small.gguf"], REPO)
    into_specllm_cache(small_models["smaller.gguf"], "tiny-org/other-GGUF")
    download = hub.cache_dir() / "downloads" / ("0" * 64)
    download.mkdir(parents=True)
    (download / "model.json").write_text(json.dumps({"repo": REPO, "file": "cut.gguf"}))
    locked = [download, hub.cache_dir() / "models" / "tiny-org--other-GGUF"]
    prefix = permission_bits_apply()
    for folder in locked:
        folder.chmod(0)
    try:
        listing = subprocess.run(
            [*prefix, sys.executable, "-m", "specllm", "models", "--json"], capture_output=True, text=True, timeout=120
        )
        run = subprocess.run(
            [*prefix, sys.executable, "-m", "specllm", "run", "Hi", "--target", tiny_models.target, "-n", "2"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        for folder in locked:
            folder.chmod(0o755)
    assert listing.returncode == 0 and "Traceback" not in listing.stderr, listing.stderr
    found = json.loads(listing.stdout)
    assert [m["spec"] for m in found["models"]] == [f"hf:{REPO}/small.gguf"]
    why = "Permission denied; its models are not listed"
    assert found["problems"] == [f"cannot read {folder} in specllm's cache: {why}" for folder in reversed(locked)]
    assert run.returncode == 0 and "error" not in run.stderr, run.stderr
    assert "small.gguf" in run.stderr  # the draft it could read


def test_specllms_models_folder_that_cannot_be_read_is_a_warning_and_its_pairs_are_not_downloaded(isolated):
    """The pairs' files are looked for in that folder: one that cannot be searched is not there."""
    locked = hub.cache_dir() / "models"
    locked.mkdir(parents=True)
    prefix = permission_bits_apply()
    locked.chmod(0)
    try:
        listing = subprocess.run(
            [*prefix, sys.executable, "-m", "specllm", "models", "--json"], capture_output=True, text=True, timeout=120
        )
    finally:
        locked.chmod(0o755)
    assert listing.returncode == 0 and "Traceback" not in listing.stderr, listing.stderr
    found = json.loads(listing.stdout)
    why = "Permission denied; its models are not listed"
    assert found["problems"] == [f"cannot read {locked} in specllm's cache: {why}"]
    assert found["pairs"] and all(pair["target"]["path"] is None for pair in found["pairs"])


@pytest.mark.parametrize("what", ["", " "])
def test_rm_of_an_empty_name_says_it_names_no_model(isolated, what):
    """Not "refusing to remove .": an empty path is the current folder, which was never asked for."""
    result = invoke("rm", what, "--yes")
    assert isinstance(result.exception, SpecllmError)
    assert str(result.exception) == (
        f"no model named {what!r}: give a pair name, hf:REPO/FILE or the path of a GGUF in a cache"
    )


def test_rm_never_touches_a_file_outside_the_caches(isolated, tiny_models, tmp_path):
    outside = tmp_path / "mine.gguf"
    outside.write_bytes(tiny_models.target.read_bytes())
    link = hub.cache_dir() / "models" / "tiny-org--evil-GGUF" / "evil.gguf"  # inside, leading out
    link.parent.mkdir(parents=True)
    link.symlink_to(outside)
    for what in (outside, link):
        result = invoke("rm", what, "--yes")
        assert isinstance(result.exception, SpecllmError)
        assert str(result.exception).startswith(f"refusing to remove {what}: it is not in specllm's cache")
    assert local_models.scan() == []  # a file reached from outside the cache is not listed as one of its models
    by_name = invoke("rm", "hf:tiny-org/evil-GGUF/evil.gguf", "--yes")
    assert (
        str(by_name.exception)
        == "hf:tiny-org/evil-GGUF/evil.gguf is not in specllm's cache or the HF cache: nothing to remove"
    )
    assert outside.read_bytes() == tiny_models.target.read_bytes()
    assert link.is_symlink()


def test_rm_asks_and_without_a_terminal_needs_yes(fake_hub, small_models):
    path = download(fake_hub, REPO, small_models["small.gguf"])
    proc = specllm("rm", f"hf:{REPO}/small.gguf")  # stdin: not a terminal
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: standard input is not a terminal: give --yes to remove without asking (nothing removed)"
    )
    assert path.is_file()
    no = Terminal(["rm", f"hf:{REPO}/small.gguf"])
    no.expect(r"Remove this \(.*\)\? \[y/N\]")
    no.send("n\r")
    assert no.wait() == 1 and "nothing removed" in no.text and path.is_file()
    eof = Terminal(["rm", f"hf:{REPO}/small.gguf"])
    eof.expect(r"Remove this \(.*\)\? \[y/N\]")
    eof.send("\x04")  # Ctrl-D: no answer is no, not an interrupt
    assert eof.wait() == 1 and "nothing removed" in eof.text and "interrupted" not in eof.text and path.is_file()
    yes = Terminal(["rm", f"hf:{REPO}/small.gguf"])
    yes.expect(r"Remove this \(.*\)\? \[y/N\]")
    yes.send("y\r")
    assert yes.wait() == 0 and "removed 1 model" in yes.text and not path.exists()


# --- a draft for a target given alone ------------------------------------------------------------


def test_family_ignores_size_quantisation_and_split():
    assert family("Qwen2.5-Coder-7B-Instruct-Q4_K_M-00001-of-00002.gguf") == "qwen2.5-coder-*-instruct"
    assert family("qwen2.5-coder-0.5b-instruct-q8_0.gguf") == "qwen2.5-coder-*-instruct"
    assert family("gemma-3-12b-it-Q4_K_M.gguf") == family("gemma-3-1b-it-f16.gguf") == "gemma-3-*-it"
    assert family("Llama-3.2-3B-Instruct-Q4_K_M.gguf") != family("Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf")


@pytest.fixture
def drafts_on_disk(fake_hub, small_models):
    """Every small model in one of the caches."""
    download(fake_hub, REPO, small_models["small.gguf"])
    download(fake_hub, REPO, small_models["other-vocab.gguf"])
    download(fake_hub, REPO, small_models["big.gguf"])
    into_specllm_cache(small_models["smaller.gguf"], "tiny-org/mirror-GGUF")
    return small_models


def test_an_entry_without_a_draft_offers_no_curated_draft(isolated):
    pairs = load_pairs()  # qwen3.5-4b-mtp (no draft) comes before the qwen3.5-4b pair of the same family
    assert family(pairs["qwen3.5-4b-mtp"].target.file) == family("Qwen3.5-9B-Q8_0.gguf") == "qwen3.5-*"
    assert curated_drafts(Path("Qwen3.5-9B-Q8_0.gguf"), pairs) == [(pairs["qwen3.5-4b"], pairs["qwen3.5-4b"].draft)]
    assert curated_drafts(Path("granite-4.0-h-3b-Q8_0.gguf"), pairs) == []  # its family's only entry is one file
    assert curated_drafts(Path("LFM2.5-350M-Instruct-Q8_0.gguf"), pairs) == []


def test_a_blob_named_by_its_hash_has_the_family_its_header_names(isolated, tmp_path):
    """An Ollama blob (sha256-HEX) says nothing of its family in its name: the GGUF header's
    basename, size label and finetune do, so it still gets its family's curated draft."""
    import gguf

    pairs = load_pairs()
    blob = tmp_path / ("sha256-" + "ab" * 32)
    writer = gguf.GGUFWriter(blob, "qwen2")
    for key, value in (
        ("general.basename", "Qwen2.5-Coder"),
        ("general.size_label", "7B"),
        ("general.finetune", "Instruct"),
    ):
        writer.add_string(key, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    coder = [(pair, pair.draft) for pair in pairs.values() if pair.name.startswith("qwen2.5-coder") and pair.draft]
    assert curated_drafts(blob, pairs) == [coder[0]]
    assert curated_drafts(tmp_path / "no-such-file", pairs) == []  # a name alone that says nothing: none


def test_candidates_are_tried_smallest_first_and_checked(drafts_on_disk, tiny_models):
    found = candidates(tiny_models.target, {})
    assert [Path(c.name).name for c in found] == ["other-vocab.gguf", "smaller.gguf", "small.gguf", "big.gguf"]
    assert [c.compatible for c in found] == [False, True, True, None]
    assert found[0].reason == "token 261 differs ('▁' vs '▁return')"  # the engine's own check, as run/chat apply it
    assert found[1].reason == "vocabulary matches" and found[1].origin == "specllm cache"
    assert found[3].reason == "not smaller than the target"
    assert [c.name for c in candidates(tiny_models.target, {}, first_only=True)][
        -1
    ] == "hf:tiny-org/mirror-GGUF/smaller.gguf"


def vocabulary_only(model: Path, dest: Path) -> Path:
    """A copy of `model` without its tensors, as llama.cpp's ggml-vocab-*.gguf files are."""
    import gguf

    last = list(gguf.GGUFReader(model).fields.values())[-1]
    end = last.offset + sum(part.nbytes for part in last.parts)
    data = model.read_bytes()
    dest.write_bytes(data[:8] + (0).to_bytes(8, "little") + data[16:end])  # no tensors, the metadata
    return dest


def test_a_vocabulary_without_weights_is_no_draft(drafts_on_disk, tiny_models, tmp_path):
    """Its vocabulary passes the check and it is the smallest file on disk: it was chosen, and a run
    of a target given alone failed to load it."""
    vocabulary = vocabulary_only(tiny_models.target, tmp_path / "ggml-vocab-tiny.gguf")
    into_specllm_cache(vocabulary, "tiny-org/vocab-GGUF")
    first = candidates(tiny_models.target, {})[0]
    assert (first.name, first.compatible) == ("hf:tiny-org/vocab-GGUF/ggml-vocab-tiny.gguf", False)
    assert first.reason == "a vocabulary without weights, not a model"
    proc = specllm("run", "hi", "--target", tiny_models.target, "--drafter", "model", "-n", 2, "--threads", 1)
    assert proc.returncode == 0, proc.stderr
    assert "draft for target.gguf: hf:tiny-org/mirror-GGUF/smaller.gguf" in proc.stderr


def test_names_that_look_like_markup_are_shown_as_they_are(isolated, tiny_models, small_models):
    """A file "]b.gguf" in a folder "a[" is named a[/]b.gguf, which the tables read as markup (a
    closing tag with nothing to close): models --drafts-for and rm ended in a traceback."""
    odd = into_specllm_cache(small_models["smaller.gguf"], "tiny-org/odd-GGUF", "a[/]b.gguf")
    proc = specllm("models", "--drafts-for", tiny_models.target, env={"COLUMNS": "250"})
    assert proc.returncode == 0, proc.stderr
    assert "hf:tiny-org/odd-GGUF/a[/]b.gguf" in proc.stdout
    removed = invoke("rm", "hf:tiny-org/odd-GGUF/a[/]b.gguf", "--yes")
    assert removed.exit_code == 0, removed.output
    assert "hf:tiny-org/odd-GGUF/a[/]b.gguf  (" in removed.output and not odd.exists()


def test_an_escape_sequence_in_a_file_name_is_shown_not_obeyed(isolated, tiny_models, small_models):
    """And a tab or a newline as a symbol too, which would split the name's row of the table."""
    into_specllm_cache(small_models["smaller.gguf"], "tiny-org/odd-GGUF", "red\x1b[31m.gguf")
    into_specllm_cache(small_models["smaller.gguf"], "tiny-org/odd-GGUF", "two\tlines\nof.gguf")
    for args in (["models"], ["models", "--drafts-for", tiny_models.target]):
        proc = specllm(*args, env={"COLUMNS": "250"})
        assert proc.returncode == 0, proc.stderr
        assert "hf:tiny-org/odd-GGUF/red␛[31m.gguf" in proc.stdout and "\x1b" not in proc.stdout
        assert "hf:tiny-org/odd-GGUF/two␉lines␤of.gguf" in proc.stdout


def test_run_finds_the_smallest_compatible_draft_and_says_so(drafts_on_disk, tiny_models):
    args = (
        "run",
        "def f(x):",
        "--target",
        tiny_models.target,
        "--threads",
        1,
        "--ctx-size",
        256,
        "--temperature",
        0,
        "-n",
        16,
        "--json",
    )
    proc = specllm(*args, "--drafter", "model")
    assert proc.returncode == 0, proc.stderr
    size = human_size(drafts_on_disk["smaller.gguf"].stat().st_size)
    assert proc.stderr.splitlines()[0] == (  # one line, unwrapped, on stderr
        f"specllm: draft for target.gguf: hf:tiny-org/mirror-GGUF/smaller.gguf ({size}), the smallest GGUF "
        "on disk whose vocabulary matches (specllm cache); --draft none to go without"
    )
    out = json.loads(proc.stdout)  # stdout is the JSON alone
    assert out["stats"]["sources"]["model"]["drafted"] > 0
    alone = specllm(*args, "--drafter", "none")
    assert json.loads(alone.stdout)["tokens"] == out["tokens"]  # greedy: the target's own output

    fixed = specllm(*args, "--gamma", 3)  # --gamma alone: model, with the draft found on disk
    assert fixed.returncode == 0 and "hf:tiny-org/mirror-GGUF/smaller.gguf" in fixed.stderr, fixed.stderr
    stats = json.loads(fixed.stdout)["stats"]
    assert (
        stats["policy"] is None and stats["drafted_per_position"][2] > 0 and set(stats["sources"]) <= {"model", "none"}
    )
    assert json.loads(fixed.stdout)["tokens"] == out["tokens"]

    refused = specllm(*args, "--draft", "none", "--drafter", "auto")
    assert refused.returncode == 0, refused.stderr
    assert "draft for" not in refused.stderr
    stats = json.loads(refused.stdout)["stats"]
    assert "model" not in stats["sources"] and stats["policy"]["draft"] is None  # no draft model at all


def test_draft_none_needs_a_target(isolated):
    proc = specllm("run", "hi", "--draft", "none")
    assert proc.returncode == 1
    assert (
        proc.stderr.strip()
        == "error: --draft none goes with --target (for a pair without its draft use --drafter ngram or none)"
    )


def test_no_compatible_draft_on_disk_is_said(fake_hub, small_models, tiny_models):
    download(fake_hub, REPO, small_models["other-vocab.gguf"])
    proc = specllm(
        "run", "def f(x):", "--target", tiny_models.target, "--threads", 1, "--ctx-size", 256, "-n", 4, "--json"
    )
    assert proc.returncode == 0, proc.stderr
    assert "no draft on disk fits target.gguf" in " ".join(proc.stderr.split())
    assert json.loads(proc.stdout)["stats"]["policy"]["draft"] is None


def test_the_curated_draft_of_the_family_comes_first_and_model_downloads_it(
    fake_hub, isolated, tiny_models, small_models, tmp_path
):
    """A pairs file whose pair is 'fam-2b' drafted by 'fam-0.1b'; the target is 'fam-7b' (same
    family, not curated). Smaller compatible models on disk come after the curated draft."""
    from fakehub import pairs_file

    draft = small_models["small.gguf"]
    pairs = pairs_file(isolated / "pairs.toml", "tiny-org/fam-GGUF", b"x", draft.read_bytes())
    pairs.write_text(
        pairs.read_text().replace('"target.gguf"', '"fam-2b-q8_0.gguf"').replace('"draft.gguf"', '"fam-0.1b-q8_0.gguf"')
    )
    fake_hub.add("tiny-org/fam-GGUF", "fam-0.1b-q8_0.gguf", draft.read_bytes())
    into_specllm_cache(small_models["smaller.gguf"], "tiny-org/mirror-GGUF")  # smaller, compatible
    target = tmp_path / "fam-7b-f32.gguf"
    target.write_bytes(tiny_models.target.read_bytes())
    args = (
        "run",
        "def f(x):",
        "--target",
        target,
        "--models",
        pairs,
        "--threads",
        1,
        "--ctx-size",
        256,
        "-n",
        4,
        "--json",
    )

    auto = specllm(*args)  # auto never downloads: it takes what is on disk
    assert "draft for fam-7b-f32.gguf: hf:tiny-org/mirror-GGUF/smaller.gguf" in " ".join(auto.stderr.split())
    assert fake_hub.gets("fam-0.1b-q8_0.gguf") == []
    model = specllm(*args, "--drafter", "model")
    assert model.returncode == 0, model.stderr
    # the smaller model on disk fits, so nothing is downloaded either
    assert fake_hub.gets("fam-0.1b-q8_0.gguf") == []
    local_models.remove([m for m in local_models.scan() if m.repo == "tiny-org/mirror-GGUF"])
    model = specllm(*args, "--drafter", "model")
    assert model.returncode == 0, model.stderr
    assert "hf:tiny-org/fam-GGUF/fam-0.1b-q8_0.gguf, the curated draft of its family (downloaded)" in " ".join(
        model.stderr.split()
    )
    into_specllm_cache(small_models["smaller.gguf"], "tiny-org/mirror-GGUF")
    listed = json.loads(invoke("models", "--drafts-for", target, "--models", pairs, "--json").output)
    assert [(Path(c["name"]).name, c["origin"]) for c in listed["candidates"]] == [
        ("fam-0.1b-q8_0.gguf", "HF cache, curated draft of tiny"),
        ("smaller.gguf", "specllm cache"),
    ]
    auto = specllm(*args)
    assert "fam-0.1b-q8_0.gguf" in auto.stderr and "the curated draft of its family;" in " ".join(auto.stderr.split())


def test_drafts_for_lists_every_candidate_and_why(drafts_on_disk, tiny_models):
    result = invoke("models", "--drafts-for", tiny_models.target)
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line for line in result.output.splitlines() if line.strip().startswith("hf:")}
    assert "no" in rows[f"hf:{REPO}/other-vocab.gguf"].split() and "differs" in rows[f"hf:{REPO}/other-vocab.gguf"]
    assert "yes" in rows["hf:tiny-org/mirror-GGUF/smaller.gguf"].split()
    assert "not smaller than the target" in rows[f"hf:{REPO}/big.gguf"]
    missing = invoke("models", "--drafts-for", "hf:tiny-org/absent-GGUF/x.gguf")
    assert str(missing.exception).startswith("hf:tiny-org/absent-GGUF/x.gguf is not downloaded")
