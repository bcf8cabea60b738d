"""Hub downloads through the real huggingface_hub code, against a fake Hub on 127.0.0.1."""

import dataclasses
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import typer
from fakehub import COMMIT, model_file, pairs_file, single_file
from one_line import assert_one_line_error
from typer.testing import CliRunner

from specllm.cli import models as cli_models
from specllm.cli.models import models_command, pull_command
from specllm.errors import SpecllmError
from specllm.models import hub
from specllm.models.registry import ModelFile, default_pair

REPO = "tiny-org/tiny-GGUF"


def blobs_dir(isolated: Path, repo: str = REPO) -> Path:
    return isolated / "hf" / "hub" / f"models--{repo.replace('/', '--')}" / "blobs"


def big_gguf(n_bytes: int) -> bytes:
    """A file with a GGUF header and random content, bigger than huggingface_hub's 10 MB download
    chunk, so that a dropped connection happens after data was written (and can be resumed)."""
    return b"GGUF" + (3).to_bytes(4, "little") + bytes(16) + os.urandom(n_bytes)


def test_cache_folders_follow_the_environment(isolated, monkeypatch, tmp_path):
    assert hub.cache_dir() == isolated / "specllm"
    assert hub.hf_cache_dir() == isolated / "hf" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert hub.hf_cache_dir() == tmp_path / "elsewhere"
    for var in ("SPECLLM_CACHE", "HF_HOME", "HF_HUB_CACHE"):
        monkeypatch.delenv(var)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub.cache_dir() == tmp_path / "xdg" / "specllm"
    assert hub.hf_cache_dir() == tmp_path / "xdg" / "huggingface" / "hub"


# --- downloads ---------------------------------------------------------------------------------


def test_pull_downloads_into_the_hf_cache(fake_hub, isolated, tiny_models):
    content = tiny_models.target.read_bytes()
    fake_hub.add(REPO, "target.gguf", content)
    path = hub.fetch_file(model_file(REPO, "target.gguf", content), progress=False)
    assert path == isolated / "hf" / "hub" / "models--tiny-org--tiny-GGUF" / "snapshots" / COMMIT / "target.gguf"
    assert path.read_bytes() == content
    assert [r.range for r in fake_hub.gets("target.gguf")] == [None]  # one plain GET


def test_a_cached_file_needs_no_network(fake_hub, isolated, tiny_models, monkeypatch):
    content = tiny_models.draft.read_bytes()
    fake_hub.add(REPO, "draft.gguf", content)
    model = model_file(REPO, "draft.gguf", content)
    first = hub.fetch_file(model, progress=False)
    fake_hub.requests.clear()
    assert hub.fetch_file(model, progress=False) == first
    assert hub.fetch_file(model, offline=True, progress=False) == first
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.fetch_file(model, progress=False) == first
    assert fake_hub.requests == []
    assert hub.cached_path(model) == first


def test_an_interrupted_download_is_resumed(fake_hub, isolated):
    content = big_gguf(24_000_000)
    fake_hub.add(REPO, "big.gguf", content)
    fake_hub.drop_after[f"{REPO}/big.gguf"] = 12_000_000  # the first GET hangs up half way
    path = hub.fetch_file(model_file(REPO, "big.gguf", content), progress=False)
    assert hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(content).digest()
    gets = fake_hub.gets("big.gguf")
    assert gets[0].range is None
    resumed_at = int(gets[-1].range.removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_at <= 12_000_000  # it asked only for the rest
    assert not list(blobs_dir(isolated).glob("*.incomplete"))


def test_a_download_that_keeps_failing_leaves_nothing_behind(fake_hub, isolated):
    content = big_gguf(1_000_000)
    fake_hub.add(REPO, "big.gguf", content)
    fake_hub.drop_always[f"{REPO}/big.gguf"] = 1000  # huggingface_hub retries, then gives up
    with pytest.raises(SpecllmError, match="could not download"):
        hub.fetch_file(model_file(REPO, "big.gguf", content), progress=False)
    assert [p for p in blobs_dir(isolated).iterdir()] == []  # no blob, no *.incomplete
    assert not list((isolated / "hf" / "hub").rglob("big.gguf"))


def test_a_file_with_a_wrong_checksum_is_refused_and_removed(fake_hub, isolated, tiny_models):
    content = tiny_models.target.read_bytes()
    tampered = content[:-1] + bytes([content[-1] ^ 1])
    fake_hub.add(REPO, "target.gguf", tampered)
    with pytest.raises(SpecllmError) as err:
        hub.fetch_file(model_file(REPO, "target.gguf", content), progress=False)
    message = str(err.value)
    assert "SHA-256" in message and "removed" in message and REPO in message and "\n" not in message
    assert list(blobs_dir(isolated).iterdir()) == []
    assert not list((isolated / "hf" / "hub").rglob("target.gguf"))


def test_a_cached_file_that_a_pairs_file_says_has_another_checksum_is_refused_but_kept(fake_hub, isolated, tiny_models):
    """The HF cache is shared with other tools: a file already there (the Hub's own bytes) is not
    deleted because a pairs file declares a different checksum for it; it is refused."""
    content = tiny_models.target.read_bytes()
    fake_hub.add(REPO, "target.gguf", content)
    cached = hub.fetch_file(hub.parse_hf_spec(f"hf:{REPO}/target.gguf", {}), progress=False)  # no checksum known
    wrong = dataclasses.replace(model_file(REPO, "target.gguf", content), sha256="0" * 64)
    with pytest.raises(SpecllmError) as err:
        hub.fetch_file(wrong, progress=False)
    message = str(err.value)
    assert "SHA-256" in message and "left there" in message and f"specllm rm hf:{REPO}/target.gguf" in message
    assert "\n" not in message
    assert cached.read_bytes() == content and len(fake_hub.gets("target.gguf")) == 1


def test_a_disk_without_room_for_the_file_is_one_line_before_downloading(fake_hub, isolated, tiny_models, monkeypatch):
    """huggingface_hub only warns, then fills the disk and fails; the pull stops before, in one line."""
    content = tiny_models.target.read_bytes()
    fake_hub.add(REPO, "target.gguf", content)
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=len(content) // 2))
    with pytest.raises(SpecllmError) as err:
        hub.fetch_file(model_file(REPO, "target.gguf", content), progress=False)
    assert "Not enough free disk space" in str(err.value) and "\n" not in str(err.value)
    assert fake_hub.gets("target.gguf") == [] and list(blobs_dir(isolated).iterdir()) == []


def test_a_file_of_the_wrong_size_is_refused_before_downloading(fake_hub, tiny_models):
    content = tiny_models.target.read_bytes()
    fake_hub.add(REPO, "target.gguf", content + b"more")
    with pytest.raises(SpecllmError, match="expected"):
        hub.fetch_file(model_file(REPO, "target.gguf", content), progress=False)
    assert fake_hub.gets("target.gguf") == []


def test_split_model_parts_land_in_one_folder(fake_hub, tiny_models):
    first, second = tiny_models.target.read_bytes(), tiny_models.draft.read_bytes()
    fake_hub.add(REPO, "m-00001-of-00002.gguf", first)
    fake_hub.add(REPO, "m-00002-of-00002.gguf", second)
    shard = model_file(REPO, "m-00002-of-00002.gguf", second)
    model = model_file(REPO, "m-00001-of-00002.gguf", first, shards=(shard,))
    path = hub.fetch_file(model, progress=False)
    assert path.name == "m-00001-of-00002.gguf"
    assert (path.parent / "m-00002-of-00002.gguf").read_bytes() == second
    assert hub.cached_path(model) == path


def test_a_split_model_named_by_any_part_fetches_every_part_and_loads_as_the_whole(fake_hub, tiny_models, tmp_path):
    """hf:REPO/NAME-0000i-of-0000N.gguf: every part lands in one folder and llama.cpp, given the
    first, loads the rest itself: greedy output is the unsplit model's."""
    import tiny_models as tm

    import specllm

    first = tm.write_model(tmp_path / "tiny.gguf", seed=0, split_max_tensors=8)  # the target's weights
    parts = sorted(first.parent.glob("tiny-*.gguf"))
    assert [p.name for p in parts] == [f"tiny-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    for part in parts:
        fake_hub.add(REPO, part.name, part.read_bytes())
    path, draft, _ = hub.resolve_models(target=f"hf:{REPO}/tiny-00002-of-00003.gguf", progress=False)
    assert path.name == "tiny-00001-of-00003.gguf" and draft is None
    assert sorted(p.name for p in path.parent.iterdir()) == [p.name for p in parts]
    assert [r.path.rsplit("/", 1)[-1] for r in fake_hub.requests if r.method == "GET"] == [p.name for p in parts]
    outputs = []
    for model in (path, tiny_models.target):
        engine = specllm.load(str(model), n_ctx=256, n_threads=1)
        outputs.append(engine.generate("def f(x):", max_tokens=16, temperature=0.0, drafter="none").tokens)
        engine.close()
    assert outputs[0] == outputs[1]


def test_hf_token_is_sent(fake_hub, tiny_models, monkeypatch):
    content = tiny_models.target.read_bytes()
    fake_hub.add(REPO, "target.gguf", content)
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    hub.fetch_file(model_file(REPO, "target.gguf", content), progress=False)
    assert {r.authorization for r in fake_hub.requests} == {"Bearer hf_test_token"}


def test_progress_bars_go_to_stderr(fake_hub, tiny_models, capfd):
    content = tiny_models.target.read_bytes()
    fake_hub.add(REPO, "target.gguf", content)
    hub.fetch_file(model_file(REPO, "target.gguf", content), progress=True)
    out, err = capfd.readouterr()
    assert out == "" and "target.gguf" in err


# --- failures ----------------------------------------------------------------------------------


def test_unreachable_hub_is_one_clear_line_and_quick(isolated):
    start = time.monotonic()
    with pytest.raises(SpecllmError) as err:
        hub.fetch_file(ModelFile(repo=REPO, file="x.gguf"), progress=False)
    assert time.monotonic() - start < 10  # no long retry loop
    message = str(err.value)
    assert message.startswith(f"could not download {REPO}/x.gguf. Hub: http://127.0.0.1:")
    assert "cannot connect" in message and "\n" not in message
    assert message.endswith("; check the connection, any proxy and HF_ENDPOINT, then try again")


def test_an_unreachable_hub_is_not_tried_again_for_the_next_file(isolated):
    for name in ("a.gguf", "b.gguf"):
        with pytest.raises(SpecllmError) as err:
            hub.fetch_file(ModelFile(repo=REPO, file=name), progress=False)
    assert "cannot connect" in str(err.value) and "(not tried again)" in str(err.value)


def test_a_hub_that_never_answers_says_what_to_do(isolated, monkeypatch):
    """A listening socket nobody accepts on: the connection is made, no answer ever comes."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
        monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "0.5")
        assert hub_error(ModelFile(repo=REPO, file="x.gguf")) == (
            "timed out; check the connection (and any proxy), then try again"
        )


def test_a_connection_that_keeps_breaking_off_says_to_try_again(fake_hub):
    content = big_gguf(100_000)
    fake_hub.add(REPO, "big.gguf", content)
    fake_hub.drop_always[f"{REPO}/big.gguf"] = 1000
    reason = hub_error(model_file(REPO, "big.gguf", content))
    assert reason.startswith("the connection broke off (") and reason.endswith("); try again")


@pytest.mark.parametrize("endpoint", ["not-a-url", "http://", "ftp://mirror.example", "127.0.0.1:8080"])
def test_an_hf_endpoint_that_is_no_http_url_is_named(fake_hub, monkeypatch, endpoint):
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    with pytest.raises(SpecllmError) as err:
        hub.fetch_file(ModelFile(repo=REPO, file="x.gguf"), progress=False)
    assert str(err.value) == (
        f"could not download {REPO}/x.gguf. Hub: HF_ENDPOINT is {endpoint!r}, not an http:// or https:// URL "
        "of a Hub: correct it, or unset it"
    )


@pytest.mark.parametrize("command", [["models"], ["run", "hi", "--target", "hf:o/r/x.gguf"]])
def test_an_hf_endpoint_python_cannot_split_is_one_line_before_anything(isolated, command):
    """huggingface_hub splits HF_ENDPOINT as it is imported: an unclosed "[" ended any command that
    looks at the HF cache in a traceback from that import."""
    proc = subprocess.run(
        [sys.executable, "-m", "specllm", *command],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_ENDPOINT": "http://[::1"},
    )
    assert_one_line_error(proc, "HF_ENDPOINT is 'http://[::1', not an http:// or https:// URL", exit_code=1)


def test_a_token_the_hub_refuses_is_named(fake_hub, tiny_models, monkeypatch):
    """The Hub answers an invalid token with 401 and this message, for a public repository too."""
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_valid_token")
    fake_hub.add(REPO, "target.gguf", tiny_models.target.read_bytes())
    fake_hub.fail(REPO, 401, "", "Invalid credentials in Authorization header")
    assert hub_error(ModelFile(repo=REPO, file="target.gguf")) == (
        "the Hub refused the token (HF_TOKEN, or the one `hf auth login` saved): check or renew it; "
        "a public repository needs none"
    )


def hub_error(model: ModelFile) -> str:
    """The one-line message of a download that the Hub refused."""
    with pytest.raises(SpecllmError) as err:
        hub.fetch_file(model, progress=False)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"could not download {model.label}. Hub: http://127.0.0.1:")
    return message.split(": ", 2)[-1]  # after "Hub: <endpoint>: "


# Each answer is the one the real Hub gives (its status code and X-Error-Code header, which
# huggingface_hub turns into its typed errors).
def test_a_missing_file_says_so(fake_hub, tiny_models):
    fake_hub.add(REPO, "target.gguf", tiny_models.target.read_bytes())
    assert hub_error(ModelFile(repo=REPO, file="absent.gguf")) == (
        f"{REPO} has no file absent.gguf at 'main'; check the file name on its Hub page"
    )


def test_a_missing_repository_says_so(fake_hub):
    fake_hub.fail("tiny-org/nope", 401, "RepoNotFound", "Repository not found")
    assert hub_error(ModelFile(repo="tiny-org/nope", file="m.gguf")) == (
        "no repository tiny-org/nope (or it is private: set HF_TOKEN); check its name"
    )


@pytest.mark.parametrize("status", [401, 403])  # anonymous, and logged in without access
def test_a_gated_repository_says_how_to_get_access(fake_hub, tiny_models, status):
    fake_hub.add("tiny-org/gated", "m.gguf", tiny_models.target.read_bytes())
    fake_hub.fail("tiny-org/gated", status, "GatedRepo", "Access to model tiny-org/gated is restricted.")
    assert hub_error(ModelFile(repo="tiny-org/gated", file="m.gguf")) == (
        "tiny-org/gated is gated: accept its conditions on its Hub page while logged in, "
        "then set HF_TOKEN (or run `hf auth login`)"
    )


def test_a_missing_revision_says_so(fake_hub, tiny_models):
    fake_hub.add(REPO, "target.gguf", tiny_models.target.read_bytes())
    fake_hub.fail(REPO, 404, "RevisionNotFound", "Invalid rev id: v9", revision="v9")
    assert hub_error(ModelFile(repo=REPO, file="target.gguf", revision="v9")) == (
        f"{REPO} has no revision 'v9'; check the branch, tag or commit after '@'"
    )


def test_a_hub_that_cannot_be_reached_after_the_first_request_says_so(fake_hub, tiny_models):
    """specllm's own first request gets through; huggingface_hub's next ones get a proxy's error
    (407, no X-Error-Code: not the Hub's answer), so it cannot locate the file and has none cached
    (LocalEntryNotFoundError). (A 5xx would do the same after half a minute of retries.)"""
    fake_hub.add(REPO, "target.gguf", tiny_models.target.read_bytes())
    fake_hub.heads_fail_after[f"{REPO}/target.gguf"] = (1, 407)
    assert hub_error(ModelFile(repo=REPO, file="target.gguf")) == (
        "the Hub could not be reached and the file is not in the HF cache; check the connection and try again"
    )


def test_huggingface_hubs_own_offline_mode_says_so(fake_hub, monkeypatch):
    """Offline mode set for huggingface_hub itself (its constant, read at its import) while
    specllm's own check (HF_HUB_OFFLINE now) says online."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert hub_error(ModelFile(repo=REPO, file="x.gguf")) == (
        "offline mode is on (HF_HUB_OFFLINE): unset it to download, or use only downloaded files"
    )
    assert fake_hub.requests == []


def test_offline_without_a_cached_copy(fake_hub, monkeypatch):
    model = ModelFile(repo=REPO, file="x.gguf")
    with pytest.raises(SpecllmError, match="not downloaded yet, and offline mode is on"):
        hub.fetch_file(model, offline=True, progress=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SpecllmError, match="offline"):
        hub.fetch_file(model, progress=False)
    assert fake_hub.requests == []


def test_an_unknown_source_or_a_mirror_without_the_file_is_refused(fake_hub):
    with pytest.raises(SpecllmError, match="unknown source"):
        hub.fetch_file(ModelFile(repo=REPO, file="x.gguf"), source="ftp")
    with pytest.raises(SpecllmError, match="no mirror is known"):
        hub.fetch_file(ModelFile(repo=REPO, file="x.gguf"), source="mirror")


def test_names_leading_out_of_the_caches_are_refused_before_any_download(fake_hub, isolated, tiny_models):
    """huggingface_hub writes refs/<revision> in its cache: a revision with '..' wrote outside it."""
    content = tiny_models.target.read_bytes()
    fake_hub.add(REPO, "target.gguf", content)
    escape = "../../../../escaped"  # from hf/hub/models--tiny-org--tiny-GGUF/refs/ to the test's folder
    with pytest.raises(SpecllmError, match=r"^bad model tiny-org/tiny-GGUF/target.gguf: the revision must be"):
        hub.fetch_file(ModelFile(repo=REPO, file="target.gguf", revision=escape), progress=False)
    models = pairs_file(isolated / "pairs.toml", REPO, content, content)
    models.write_text(
        models.read_text().replace('file = "target.gguf"', f'file = "target.gguf"\nrevision = "{escape}"')
    )
    result = CliRunner().invoke(cli(), ["pull", "tiny", "--models", str(models)])
    assert isinstance(result.exception, SpecllmError)
    assert str(result.exception).startswith(f"{models} line 3: pair 'tiny': target: field 'revision' must be")
    assert fake_hub.requests == [] and not (isolated / "escaped").exists()


@pytest.mark.parametrize("repo", ["a-/b", "a/b.", "a--b/c", "a/b..c", "a/b.git", f"{'a' * 97}/b", f"a/{'b' * 97}"])
def test_repository_ids_the_hub_refuses_are_one_line_before_any_request(fake_hub, repo):
    """huggingface_hub checks a repository id itself, and refused these with a traceback of its own."""
    for refused in (
        lambda: hub.parse_model_spec(f"hf:{repo}/x.gguf"),
        lambda: hub.fetch_file(ModelFile(repo=repo, file="x.gguf"), progress=False),
    ):
        with pytest.raises(SpecllmError, match="the repository must be a Hub repository id 'owner/name'"):
            refused()
    assert fake_hub.requests == []


def test_repository_ids_the_hub_takes_are_taken(isolated):
    for repo in ("Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF", "a_/b_", "0/1", f"{'a' * 96}/{'b' * 96}"):
        assert hub.parse_hf_spec(f"hf:{repo}/x.gguf", {}).repo == repo


def test_a_downloaded_file_that_is_not_gguf_is_refused(fake_hub, tiny_models):
    fake_hub.add(REPO, "notes.gguf", tiny_models.not_gguf.read_bytes())
    with pytest.raises(SpecllmError, match="not a GGUF model file"):
        hub.fetch_file(ModelFile(repo=REPO, file="notes.gguf"), progress=False)


# --- specs and resolve_models ------------------------------------------------------------------


def test_hf_references_name_repository_revision_file_and_every_split_part(isolated, tiny_models):
    assert hub.parse_model_spec("hf:me/repo/sub/m.gguf", {}) == ModelFile(repo="me/repo", file="sub/m.gguf")
    assert hub.parse_model_spec("hf:me/repo@v2/m.gguf", {}).revision == "v2"
    split = hub.parse_model_spec("hf:me/repo@v2/q/m-00003-of-00003.gguf", {})  # any part names the whole model
    assert [(p.file, p.revision) for p in split.parts] == [(f"q/m-0000{i}-of-00003.gguf", "v2") for i in (1, 2, 3)]
    draft = default_pair().draft
    assert hub.parse_model_spec(f"hf:{draft.repo}/{draft.file}") == draft  # curated: checksum and mirror
    assert hub.parse_model_spec(str(tiny_models.target)) == tiny_models.target
    for bad in ("hf:me/m.gguf", "hf:me/repo/m.bin", "hf://me/repo/m.gguf"):
        with pytest.raises(SpecllmError, match="expected hf:OWNER/REPO/FILE.gguf"):
            hub.parse_model_spec(bad, {})
    with pytest.raises(SpecllmError, match="model file not found"):
        hub.parse_model_spec("./no/such/model.gguf")
    with pytest.raises(SpecllmError, match="nothing after '@'"):
        hub.parse_model_spec("hf:me/repo@/m.gguf", {})  # not quietly the main branch
    # parts that would become paths outside the caches
    for bad, field in (
        ("hf:a/b/../x.gguf", "file"),
        ("hf:a/b/./x.gguf", "file"),
        ("hf:a/b@../../x/m.gguf", "file"),
        ("hf:a/b@..%2F/m.gguf", "revision"),
        ("hf:a/..@v1/m.gguf", "repository"),
        ("hf:a/-b/m.gguf", "repository"),
    ):
        with pytest.raises(SpecllmError, match=f"^bad model '{re.escape(bad)}': the {field} must be "):
            hub.parse_model_spec(bad, {})
    with pytest.raises(SpecllmError, match="not a GGUF"):
        hub.parse_model_spec(str(tiny_models.not_gguf))


def test_resolve_target_from_the_hub_and_a_local_draft(fake_hub, tiny_models):
    content = tiny_models.target.read_bytes()
    fake_hub.add(REPO, "target.gguf", content)
    target, draft, pair = hub.resolve_models(
        target=f"hf:{REPO}/target.gguf", draft=str(tiny_models.draft), progress=False
    )
    assert target.read_bytes() == content and draft == tiny_models.draft and pair is None
    target_only = hub.resolve_models(target=str(tiny_models.target), progress=False)
    assert target_only == (tiny_models.target, None, None)


def test_resolve_refuses_mixed_or_partial_choices(isolated):
    """In the library's words; the command line says it with its flags first (tests/cli)."""
    with pytest.raises(SpecllmError, match="either a pair or a target"):
        hub.resolve_models(pair="x", target="t.gguf")
    with pytest.raises(SpecllmError, match="a draft needs a target"):
        hub.resolve_models(draft="d.gguf")


def test_resolve_unknown_pair_lists_the_known_ones(isolated):
    with pytest.raises(SpecllmError, match="unknown pair 'nope'; known pairs: qwen2.5-coder-1.5b, "):
        hub.resolve_models(pair="nope")


@pytest.fixture
def tiny_pair(fake_hub, isolated, tiny_models):
    """A --models file with pairs 'tiny' (compatible) and 'bad' (incompatible vocabularies)."""
    target, draft = tiny_models.target.read_bytes(), tiny_models.draft.read_bytes()
    bad = tiny_models.incompatible.read_bytes()
    fake_hub.add(REPO, "target.gguf", target)
    fake_hub.add(REPO, "draft.gguf", draft)
    fake_hub.add("tiny-org/bad-GGUF", "target.gguf", target)
    fake_hub.add("tiny-org/bad-GGUF", "draft.gguf", bad)
    good = pairs_file(isolated / "a.toml", REPO, target, draft).read_text()
    wrong = pairs_file(isolated / "b.toml", "tiny-org/bad-GGUF", target, bad, name="bad").read_text()
    models = isolated / "pairs.toml"
    models.write_text(good + wrong)
    return models


def test_resolve_a_pair_fetches_and_checks_both(tiny_pair):
    pytest.importorskip("llama_cpp")
    target, draft, pair = hub.resolve_models(pair="tiny", models_file=tiny_pair, progress=False)
    assert pair.name == "tiny" and pair.gamma == 3
    assert target.name == "target.gguf" and draft.name == "draft.gguf"


def test_an_incompatible_pair_is_refused(tiny_pair):
    pytest.importorskip("llama_cpp")
    with pytest.raises(SpecllmError, match="cannot draft for"):
        hub.resolve_models(pair="bad", models_file=tiny_pair, progress=False)


# --- the commands ------------------------------------------------------------------------------


def cli() -> typer.Typer:
    app = typer.Typer()
    app.command("models")(models_command)
    app.command("pull")(pull_command)
    return app


def test_pull_command_prints_both_paths_and_sizes(tiny_pair, tiny_models):
    pytest.importorskip("llama_cpp")
    result = CliRunner().invoke(cli(), ["pull", "tiny", "--models", str(tiny_pair)])
    assert result.exit_code == 0, result.output
    flat = " ".join(result.output.split())
    assert "target.gguf" in flat and "draft.gguf" in flat and "ready" in flat
    assert f"{tiny_models.target.stat().st_size:,} bytes" in flat


def test_pull_of_a_single_file_entry_downloads_and_checks_the_one_file(fake_hub, isolated, tiny_models, monkeypatch):
    def no_vocabulary_check(*paths):
        raise AssertionError(f"a vocabulary check without a draft: {paths}")

    monkeypatch.setattr(hub, "check_pair_files", no_vocabulary_check)
    content = tiny_models.target.read_bytes()
    fake_hub.add(REPO, "target.gguf", content)
    fake_hub.add(REPO, "draft.gguf", tiny_models.draft.read_bytes())  # served, never asked for
    models = single_file(isolated / "one.toml", REPO, content)
    result = CliRunner().invoke(cli(), ["pull", "tiny-one", "--models", str(models)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    lines = [" ".join(line.split()) for line in result.output.splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith("specllm: ")]  # progress, on stderr
    assert [line.split()[0] for line in lines] == ["target", "ready:"]
    assert lines[0].endswith(f"target.gguf ({len(content):,} bytes, {cli_models._size(len(content))})")
    assert lines[1].startswith("ready: pair tiny-one, one file that drafts for itself") and lines[1].endswith("gamma 2")
    assert len(fake_hub.gets("target.gguf")) == 1 and fake_hub.gets("draft.gguf") == []
    assert hub.cached_path(models_target(models)).read_bytes() == content
    # the one file is checked as a pair's are: a wrong checksum is refused, and nothing is kept
    fake_hub.add("tiny-org/tampered-GGUF", "target.gguf", content[:-1] + bytes([content[-1] ^ 1]))
    single_file(models, "tiny-org/tampered-GGUF", content)
    tampered = CliRunner().invoke(cli(), ["pull", "tiny-one", "--models", str(models)])
    assert isinstance(tampered.exception, SpecllmError) and "SHA-256" in str(tampered.exception)
    assert hub.cached_path(models_target(models)) is None


def test_pull_of_one_hub_file_downloads_it_into_the_hf_cache_and_says_how_to_run_it(fake_hub, tiny_models):
    content = tiny_models.target.read_bytes()
    fake_hub.add(REPO, "target.gguf", content)
    spec = f"hf:{REPO}/target.gguf"
    result = CliRunner().invoke(cli(), ["pull", spec], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    lines = [" ".join(line.split()) for line in result.output.splitlines() if line.startswith(("target", "ready"))]
    path = hub.cached_path(model_file(REPO, "target.gguf", content))
    assert path is not None and path.is_relative_to(hub.hf_cache_dir()) and path.read_bytes() == content
    assert lines == [
        f"target {path} ({len(content):,} bytes, {cli_models._size(len(content))})",
        f"ready: {spec}; `specllm run --target {spec}` runs it",
    ]
    missing = CliRunner().invoke(cli(), ["pull", f"hf:{REPO}/nope.gguf"])
    assert isinstance(missing.exception, SpecllmError) and "nope.gguf" in str(missing.exception)


def models_target(models: Path):
    from specllm.models.registry import load_pairs

    return load_pairs(models)["tiny-one"].target


def test_pull_command_errors_are_specllm_errors(tiny_pair):
    result = CliRunner().invoke(cli(), ["pull", "nope", "--models", str(tiny_pair)])
    assert isinstance(result.exception, SpecllmError)


def test_models_command_lists_pairs_and_what_is_downloaded(tiny_pair):
    pytest.importorskip("llama_cpp")
    runner = CliRunner()
    before = runner.invoke(cli(), ["models", "--models", str(tiny_pair)], env={"COLUMNS": "200"})
    assert before.exit_code == 0, before.output
    row = next(line for line in before.output.splitlines() if " tiny " in line)
    assert "no" in row
    assert "qwen2.5-coder-1.5b *" in before.output  # the default marker
    runner.invoke(cli(), ["pull", "tiny", "--models", str(tiny_pair)])
    after = runner.invoke(cli(), ["models", "--models", str(tiny_pair)], env={"COLUMNS": "200"})
    row = next(line for line in after.output.splitlines() if " tiny " in line)
    assert "yes, HF cache" in row


def test_models_shows_the_missing_draft_of_a_single_file_entry_as_none(fake_hub, isolated, tiny_models):
    content = tiny_models.target.read_bytes()
    models = single_file(isolated / "one.toml", REPO, content)
    listing = CliRunner().invoke(cli(), ["models", "--json", "--models", str(models)])
    assert listing.exit_code == 0, listing.output
    pairs = {p["name"]: p for p in json.loads(listing.output)["pairs"]}
    assert pairs["tiny-one"]["draft"] is None and pairs["granite-4.0-h-1b"]["draft"] is None
    assert pairs["tiny-one"]["target"] == {"repo": REPO, "file": "target.gguf", "size": len(content), "path": None}
    assert pairs["qwen3.5-4b"]["draft"]["file"] == "Qwen3.5-0.8B-Q4_0.gguf"  # the pairs keep theirs
    table = CliRunner().invoke(cli(), ["models", "--models", str(models)], env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    lines = table.output.splitlines()
    at = next(i for i, line in enumerate(lines) if " tiny-one " in line)
    assert lines[at].split()[1:] == ["target", *cli_models._size(len(content)).split(), "2", "no"]
    assert lines[at + 1].split() == ["none", "-", "-"]


# --- run / chat / bench with --pair, as a user runs them ------------------------------------------


def specllm(*args, stdin=None):
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "specllm", *map(str, args)], input=stdin, capture_output=True, text=True, timeout=120
    )


def test_run_pulls_a_pair_on_first_use_and_uses_its_gamma(tiny_pair):
    run = ("run", "def f(x):", "--pair", "tiny", "--models", tiny_pair, "--threads", 1, "--temperature", 0, "-n", 12)
    proc = specllm(*run, "--json", "--drafter", "model")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["stats"]["generated_tokens"] == 12 and out["stats"]["n_drafted"] > 0
    assert len(out["stats"]["drafted_per_position"]) == 3  # a fixed drafter takes the pair's recommended gamma
    assert (hub.hf_cache_dir()).exists()  # downloaded through the Hub path into the HF cache
    offline = specllm(*run, "--json", "--offline")  # auto: the same text
    assert offline.returncode == 0 and json.loads(offline.stdout)["tokens"] == out["tokens"]


def test_run_a_single_file_entry_loads_the_target_alone(fake_hub, isolated, tiny_recurrent_models):
    """A qwen35 with an MTP layer as a single-file entry: auto and mtp draft with its own layers;
    no draft model is looked for, downloaded or loaded."""
    content = tiny_recurrent_models.qwen35_mtp.read_bytes()
    fake_hub.add(REPO, "q35-mtp.gguf", content)
    models = single_file(isolated / "one.toml", REPO, content, name="tiny-mtp", file="q35-mtp.gguf")
    args = (
        "run",
        "def f(x):",
        "--pair",
        "tiny-mtp",
        "--models",
        models,
        "--threads",
        1,
        "--temperature",
        0,
        "-n",
        12,
        "--json",
    )
    auto = specllm(*args, "-v")
    assert auto.returncode == 0, auto.stderr
    assert "1 MTP layer(s): it drafts for itself" in auto.stderr and "draft for" not in auto.stderr
    stats = json.loads(auto.stdout)["stats"]
    assert stats["policy"]["draft"] is None and "model" not in stats["sources"]
    assert stats["policy"]["calibration"]["measured"] == ["target", "mtp"]  # no draft model measured
    mtp = specllm(*args, "--drafter", "mtp", "--offline")
    assert mtp.returncode == 0, mtp.stderr
    out = json.loads(mtp.stdout)
    assert out["stats"]["sources"]["mtp"]["drafted"] > 0 and set(out["stats"]["sources"]) <= {"mtp", "none"}
    assert len(out["stats"]["drafted_per_position"]) == 2  # the entry's recommended gamma
    assert out["tokens"] == json.loads(auto.stdout)["tokens"]  # greedy: the target's own text either way
    gets = [r.path for r in fake_hub.requests if r.method == "GET" and r.path.endswith(".gguf")]
    assert [path.rsplit("/", 1)[-1] for path in gets] == ["q35-mtp.gguf"]  # one file, downloaded once


def test_chat_and_bench_take_a_pair(tiny_pair, tmp_path):
    """chat's /drafter model drafts the pair's recommended length (3), as run's --drafter model does."""
    saved = tmp_path / "chat.json"
    commands = f"/drafter model\n/stats\nhello\n/save {saved}\n"
    chat = specllm("chat", "--pair", "tiny", "--models", tiny_pair, "--threads", 1, "-n", 8, "-t", 0, stdin=commands)
    assert chat.returncode == 0, chat.stderr
    assert "[max_tokens]" in chat.stderr and "drafter model · gamma 3 ·" in chat.stdout + chat.stderr
    [turn] = json.loads(saved.read_text())["turns"]
    assert turn["stats"]["n_drafted"] > 0 and len(turn["stats"]["drafted_per_position"]) == 3
    report = tmp_path / "bench.json"
    bench = specllm(
        "bench",
        "--pair",
        "tiny",
        "--models",
        tiny_pair,
        "--threads",
        1,
        "--per-category",
        1,
        "--categories",
        "math",
        "--max-tokens",
        8,
        "--gamma",
        2,
        "--json",
        report,
    )
    assert bench.returncode == 0, bench.stderr
    results = json.loads(report.read_text())
    assert [r["configuration"] for r in results["results"]] == ["target-only", "auto", "model g=2", "ngram g=2"]


def test_an_unknown_pair_is_one_line_listing_the_known_ones(tiny_pair):
    proc = specllm("run", "hi", "--pair", "nope", "--models", tiny_pair)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "tiny" in proc.stderr


def test_a_target_spec_leaving_its_repository_is_one_line(isolated):
    proc = specllm("run", "hi", "--target", "hf:a/b/../x.gguf")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: bad model 'hf:a/b/../x.gguf': the file must be a relative path ending in .gguf "
        "(no '..', '.' or empty parts), not '../x.gguf'"
    ]


def test_the_python_api_loads_hf_references_as_the_command_line_does(fake_hub, tiny_models):
    """specllm.load("hf:OWNER/REPO/FILE.gguf", "hf:...") downloads both files into the cache and
    loads them: the pair generates what the local files generate."""
    import specllm

    fake_hub.add(REPO, "t.gguf", tiny_models.target.read_bytes())
    fake_hub.add(REPO, "d.gguf", tiny_models.draft.read_bytes())
    outputs = []
    for target, draft in ((f"hf:{REPO}/t.gguf", f"hf:{REPO}/d.gguf"), (tiny_models.target, tiny_models.draft)):
        engine = specllm.load(str(target), str(draft), n_ctx=256, n_threads=1)
        outputs.append(engine.generate("def f(x):", max_tokens=12, temperature=0.0, drafter="model").tokens)
        engine.close()
    assert outputs[0] == outputs[1]
    assert [len(fake_hub.gets(file)) for file in ("t.gguf", "d.gguf")] == [1, 1]
    with pytest.raises(SpecllmError, match="expected hf:OWNER/REPO/FILE.gguf"):
        specllm.load("hf:no-repo.gguf")
