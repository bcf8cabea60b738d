"""Models in other tools' stores (Ollama, LM Studio, llama.cpp's cache), used in place.

The stores are laid out as those tools lay them out (Ollama: manifest/paths.go, server/images.go;
LM Studio: <models>/<publisher>/<repo>/<file>.gguf, its home pointer and settings.json;
llama.cpp: common.cpp's cache folder and the names its downloads get), in temporary folders the
environment points at. The models are tiny real GGUFs run by real llama.cpp.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tiny_models as tm
from one_line import assert_one_line_error
from permissions import permission_bits_apply
from serving import serving

import specllm
from specllm.errors import SpecllmError
from specllm.models import local as local_models
from specllm.models import stores
from specllm.models.hub import parse_model_spec

REGISTRY = "registry.example"  # any registry folder: none is assumed (see stores.py)
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"


def specllm_cli(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "specllm", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "COLUMNS": "250", **(env or {})},
    )


# --- laying out stores as the tools do -----------------------------------------------------------


def write_blob(root: Path, content: bytes) -> str:
    """Ollama's blobs/sha256-<hex> for `content`; returns its digest, sha256:<hex>."""
    digest = hashlib.sha256(content).hexdigest()
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "blobs" / f"sha256-{digest}").write_bytes(content)
    return f"sha256:{digest}"


def ollama_pull(
    root: Path, model: Path, name: str, tag: str = "latest", namespace: str = "library", registry: str = REGISTRY
) -> Path:
    """What `ollama pull` leaves: blobs (model, template, params, config) and the manifest at
    manifests/<registry>/<namespace>/<model>/<tag>. Returns the model's blob."""

    def layer(media_type: str, content: bytes) -> dict:
        return {"mediaType": media_type, "digest": write_blob(root, content), "size": len(content)}

    config = layer("application/vnd.docker.container.image.v1+json", b'{"model_format":"gguf","model_family":"llama"}')
    manifest = {
        "schemaVersion": 2,
        "mediaType": DOCKER_MANIFEST,
        "config": config,
        "layers": [
            layer("application/vnd.ollama.image.model", model.read_bytes()),
            layer("application/vnd.ollama.image.template", b"{{ .Prompt }}"),
            layer("application/vnd.ollama.image.params", b'{"stop":["<|im_end|>"]}'),
        ],
    }
    path = root / "manifests" / registry / namespace / name / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return root / "blobs" / manifest["layers"][0]["digest"].replace(":", "-")


def into_folder(model: Path, dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(model, dest)
    return dest


@pytest.fixture(scope="module")
def small_draft(tmp_path_factory) -> Path:
    """A draft smaller than the tiny target (one layer), with its vocabulary."""
    d = tmp_path_factory.mktemp("small_draft")
    return tm.write_model(d / "small.gguf", seed=0, noise=tm.DRAFT_NOISE, n_layer=1)


@pytest.fixture
def store_env(tmp_path, monkeypatch) -> dict[str, Path]:
    """The three stores' folders, empty, with the environment pointing at them."""
    folders = {"ollama": tmp_path / "ollama", "lmstudio": tmp_path / "lmstudio", "llamacpp": tmp_path / "llama.cpp"}
    monkeypatch.setenv("OLLAMA_MODELS", str(folders["ollama"]))
    monkeypatch.setenv("SPECLLM_LMSTUDIO_HOME", str(folders["lmstudio"]))
    monkeypatch.setenv("LLAMA_CACHE", str(folders["llamacpp"]))
    return folders


@pytest.fixture
def filled(store_env, tiny_models, small_draft):
    """A model in each store: the tiny target in Ollama (twice: library/tiny:latest and
    team/tiny:q8), the small draft in LM Studio, the draft in llama.cpp's cache (as an older
    `-hf` download names it: <owner>_<repo>_<file>)."""
    blob = ollama_pull(store_env["ollama"], tiny_models.target, "tiny")
    ollama_pull(store_env["ollama"], tiny_models.target, "tiny", tag="q8", namespace="team")
    lms = into_folder(small_draft, store_env["lmstudio"] / "models" / "tiny-org" / "Tiny-GGUF" / "tiny-small.gguf")
    llama = into_folder(tiny_models.draft, store_env["llamacpp"] / "tiny-org_Tiny-GGUF_tiny-draft.gguf")
    (store_env["llamacpp"] / "tiny-org_Tiny-GGUF_tiny-draft.gguf.json").write_text('{"etag": "x"}')  # not a model
    return {"blob": blob, "lmstudio": lms, "llamacpp": llama}


# --- listing -------------------------------------------------------------------------------------


def test_models_lists_every_store_with_its_source_size_and_architecture(filled, small_draft, tiny_models):
    proc = specllm_cli("models", "--json")
    assert proc.returncode == 0, proc.stderr
    listing = json.loads(proc.stdout)
    found = {m["spec"]: (m["cache"], m["path"], m["size"], m["architecture"]) for m in listing["models"]}
    target_size = tiny_models.target.stat().st_size
    assert found == {
        "ollama:tiny:latest": ("Ollama", str(filled["blob"]), target_size, "llama"),
        "ollama:team/tiny:q8": ("Ollama", str(filled["blob"]), target_size, "llama"),
        "lmstudio:tiny-org/Tiny-GGUF/tiny-small.gguf": (
            "LM Studio",
            str(filled["lmstudio"]),
            small_draft.stat().st_size,
            "llama",
        ),
        "llamacpp:tiny-org_Tiny-GGUF_tiny-draft.gguf": (
            "llama.cpp cache",
            str(filled["llamacpp"]),
            tiny_models.draft.stat().st_size,
            "llama",
        ),
    }
    # one blob under two names is counted once
    assert listing["total_size"] == target_size + small_draft.stat().st_size + tiny_models.draft.stat().st_size
    assert listing["problems"] == [] and proc.stderr == ""

    table = specllm_cli("models")
    assert table.returncode == 0, table.stderr
    for spec, (source, *_) in found.items():
        row = next(line for line in table.stdout.splitlines() if spec in line)
        assert source in row and "llama" in row.replace(spec, "")


def test_a_name_in_two_registries_is_listed_with_its_registry_and_must_be_named_so(store_env, tiny_models):
    one = ollama_pull(store_env["ollama"], tiny_models.target, "tiny", registry="a.example")
    ollama_pull(store_env["ollama"], tiny_models.draft, "tiny", registry="b.example")
    listing = json.loads(specllm_cli("models", "--json").stdout)
    assert sorted(m["spec"] for m in listing["models"]) == [
        "ollama:a.example/library/tiny:latest",
        "ollama:b.example/library/tiny:latest",
    ]
    assert_one_line_error(
        specllm_cli("run", "hi", "--target", "ollama:tiny"),
        "more than one registry",
        "ollama:a.example/library/tiny:latest",
        "ollama:b.example/library/tiny:latest",
    )
    assert stores.resolve("ollama:a.example/library/tiny") == one


def test_ollama_names_resolve_as_ollama_parses_them(store_env, tiny_models):
    blob = ollama_pull(store_env["ollama"], tiny_models.target, "qwen2.5-coder", tag="7b")
    other = ollama_pull(store_env["ollama"], tiny_models.draft, "qwen2.5-coder")  # tag latest
    team = ollama_pull(store_env["ollama"], tiny_models.extended, "coder", tag="v1.5", namespace="team")
    assert stores.resolve("ollama:qwen2.5-coder:7b") == blob
    assert stores.resolve("ollama:library/qwen2.5-coder:7b") == blob
    assert stores.resolve(f"ollama:{REGISTRY}/library/qwen2.5-coder:7b") == blob
    assert stores.resolve("ollama:qwen2.5-coder") == other
    assert stores.resolve("ollama:team/coder:v1.5") == team
    ported = ollama_pull(store_env["ollama"], tiny_models.no_template, "tiny", registry="localhost:5000")
    assert stores.resolve("ollama:localhost:5000/library/tiny") == ported  # a port, not a tag
    assert stores.resolve("ollama:Qwen2.5-Coder:7B") == blob  # Ollama's names are read case-insensitively
    assert stores.resolve("ollama:LocalHost:5000/LIBRARY/Tiny:Latest") == ported


def test_lmstudio_models_folder_from_its_settings_and_its_home_pointer(tmp_path, monkeypatch, tiny_models):
    monkeypatch.delenv("SPECLLM_LMSTUDIO_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert stores.lmstudio_roots() == [tmp_path / ".lmstudio" / "models"]
    (tmp_path / ".cache" / "lm-studio").mkdir(parents=True)  # an older install's home
    assert stores.lmstudio_roots() == [tmp_path / ".cache" / "lm-studio" / "models"]
    home = tmp_path / "elsewhere"
    (tmp_path / ".lmstudio-home-pointer").write_text(f"{home}\n")
    assert stores.lmstudio_roots() == [home / "models"]
    home.mkdir()
    (home / "settings.json").write_text(json.dumps({"downloadsFolder": str(tmp_path / "big-disk"), "other": 1}))
    assert stores.lmstudio_roots() == [tmp_path / "big-disk", home / "models"]
    into_folder(tiny_models.target, tmp_path / "big-disk" / "pub" / "Repo-GGUF" / "m.gguf")
    assert [m.spec for m in stores.scan().models] == ["lmstudio:pub/Repo-GGUF/m.gguf"]


def test_a_file_of_the_same_name_in_both_lmstudio_folders_is_listed_by_a_name_that_finds_it(
    store_env, tiny_models, small_draft
):
    """Models moved to another disk (settings.json's downloadsFolder) and an older copy left in the
    default folder: lmstudio:NAME finds the moved one, so the other is listed by its path (both
    were listed as lmstudio:NAME, and a draft chosen there was named by a name that finds the other)."""
    home = store_env["lmstudio"]
    home.mkdir()
    (home / "settings.json").write_text(json.dumps({"downloadsFolder": str(home / "big-disk")}))
    moved = into_folder(tiny_models.target, home / "big-disk" / "pub" / "Repo-GGUF" / "m.gguf")
    left = into_folder(small_draft, home / "models" / "pub" / "Repo-GGUF" / "m.gguf")
    listed = {m.spec: m.path for m in stores.scan().models}
    assert listed == {"lmstudio:pub/Repo-GGUF/m.gguf": moved, str(left): left}
    assert all(parse_model_spec(spec) == path for spec, path in listed.items())


def test_llamacpp_cache_is_found_where_llama_cpp_puts_it(tmp_path, monkeypatch):
    monkeypatch.delenv("LLAMA_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if sys.platform not in ("win32", "darwin"):
        assert stores.llamacpp_roots() == [tmp_path / "xdg" / "llama.cpp"]
    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path / "mine"))
    assert stores.llamacpp_roots() == [tmp_path / "mine"]


def test_llamacpp_cache_in_the_hub_layout_is_listed_by_its_paths(store_env, tiny_models):
    """Newer llama.cpp keeps `-hf` downloads in LLAMA_CACHE in the HF cache's layout: a snapshot
    entry links to its blob (which has no .gguf name, and is not listed twice)."""
    repo = store_env["llamacpp"] / "models--tiny-org--Tiny-GGUF"
    blob = into_folder(tiny_models.target, repo / "blobs" / ("a" * 64))
    link = repo / "snapshots" / ("c" * 40) / "tiny.gguf"
    link.parent.mkdir(parents=True)
    link.symlink_to(Path("..", "..", "blobs", blob.name))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("c" * 40)
    name = f"llamacpp:models--tiny-org--Tiny-GGUF/snapshots/{'c' * 40}/tiny.gguf"
    assert [(m.spec, m.path, m.size) for m in stores.scan().models] == [(name, link, blob.stat().st_size)]
    assert stores.resolve(name) == link


def test_a_folder_linked_into_lmstudio_is_listed_and_a_loop_of_links_ends(store_env, tiny_models, tmp_path):
    """A publisher's folder moved to another disk and linked back: its models load by name, but
    `models` (and the search for a draft) passed over them. A link back up the tree is walked once."""
    moved = into_folder(tiny_models.target, tmp_path / "big-disk" / "pub" / "Repo-GGUF" / "m.gguf")
    models = store_env["lmstudio"] / "models"
    models.mkdir(parents=True)
    (models / "pub").symlink_to(moved.parents[1], target_is_directory=True)
    (moved.parent / "up").symlink_to(moved.parents[1], target_is_directory=True)  # a loop
    (models / "again").symlink_to(moved.parents[1], target_is_directory=True)  # the same folder twice
    found = stores.scan()
    assert [m.spec for m in found.models] == ["lmstudio:again/Repo-GGUF/m.gguf"] and found.problems == []
    assert parse_model_spec("lmstudio:pub/Repo-GGUF/m.gguf") == models / "pub" / "Repo-GGUF" / "m.gguf"


def test_folders_nested_deeper_than_python_recurses_are_listed(store_env, tiny_models, small_draft):
    """os.walk recurses a level a call: folders nested 1,100 deep in a store stopped `models`, and
    every run of a target given alone (it looks for a draft on disk), with a RecursionError."""
    models = store_env["lmstudio"] / "models"
    into_folder(small_draft, models / "pub" / "Repo-GGUF" / "small.gguf")
    deep = models / "deep"
    deep.mkdir()
    for _ in range(1100):  # (a level at a time: mkdir(parents=True) recurses too)
        deep = deep / "d"
        deep.mkdir()
    into_folder(small_draft, deep / "m.gguf")
    try:
        proc = specllm_cli("models", "--json")
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
        listed = [m["spec"] for m in json.loads(proc.stdout)["models"]]
        assert listed == [
            f"lmstudio:{(deep / 'm.gguf').relative_to(models).as_posix()}",
            "lmstudio:pub/Repo-GGUF/small.gguf",
        ]
        run = specllm_cli("run", "hi", "-n", "2", "--target", tiny_models.target)
        assert run.returncode == 0, run.stderr
    finally:  # (shutil.rmtree, as pytest cleans up, recurses as deep)
        (deep / "m.gguf").unlink()
        while deep != models:
            deep.rmdir()
            deep = deep.parent


# --- using them ----------------------------------------------------------------------------------


def greedy_tokens(*target_args, extra=()):
    proc = specllm_cli(
        "run", "def f(x):", *target_args, "--raw", "--json", "--temperature", 0, "-n", 24, "--threads", 1, *extra
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["tokens"], proc.stderr


def test_run_with_a_store_target_generates_what_its_file_generates(filled):
    by_path, _ = greedy_tokens("--target", filled["blob"], "--draft", "none")
    assert len(by_path) == 24
    by_name, _ = greedy_tokens("--target", "ollama:tiny", "--draft", "none")
    assert by_name == by_path
    tagged, _ = greedy_tokens(
        "--target",
        "ollama:team/tiny:q8",
        "--draft",
        "lmstudio:tiny-org/Tiny-GGUF/tiny-small.gguf",
        extra=("--drafter", "model", "--gamma", 3),
    )
    assert tagged == by_path  # greedy speculation is exact, whichever draft
    lms_path, _ = greedy_tokens("--target", filled["lmstudio"], "--draft", "none")
    lms_name, _ = greedy_tokens("--target", "lmstudio:tiny-org/Tiny-GGUF/tiny-small.gguf", "--draft", "none")
    assert lms_name == lms_path
    llama_path, _ = greedy_tokens("--target", filled["llamacpp"], "--draft", "none")
    llama_name, _ = greedy_tokens("--target", "llamacpp:tiny-org_Tiny-GGUF_tiny-draft.gguf", "--draft", "none")
    assert llama_name == llama_path


def test_the_python_api_loads_a_store_model(filled):
    prompt, args = "def f(x):", dict(max_tokens=16, temperature=0.0, drafter="none")
    engine = specllm.load("ollama:tiny:latest", n_ctx=256, n_threads=1)
    try:
        by_name = engine.generate(prompt, **args).tokens
        assert engine.target.path == filled["blob"]
    finally:
        engine.close()
    engine = specllm.load(str(filled["blob"]), n_ctx=256, n_threads=1)
    try:
        assert engine.generate(prompt, **args).tokens == by_name
    finally:
        engine.close()


def test_the_python_api_reads_a_path_in_the_home_folder_as_the_command_line_does(tmp_path, monkeypatch, tiny_models):
    """--target ~/m.gguf loads the file in the home folder; specllm.load said it was not found."""
    monkeypatch.setenv("HOME", str(tmp_path))
    target, draft = (Path(shutil.copy(m, tmp_path)) for m in (tiny_models.target, tiny_models.draft))
    engine = specllm.load("~/target.gguf", draft="~/draft.gguf", n_ctx=256, n_threads=1, defer_draft=True)
    try:
        assert engine.target.path == target and engine.generate("hi", max_tokens=4, drafter="model").tokens
        assert engine.draft is not None and engine.draft.path == draft
    finally:
        engine.close()


@pytest.mark.parametrize("scheme, folder", [("lmstudio", "lmstudio/models/pub/Split-GGUF"), ("llamacpp", "llama.cpp")])
def test_any_part_of_a_split_store_model_loads_the_whole_model(store_env, tmp_path, scheme, folder):
    """llama.cpp loads a split model only from its first part: a store name of any part means that
    one, as an hf: reference does; greedy output is the unsplit model's."""
    (tmp_path / "whole").mkdir()
    (tmp_path / "split").mkdir()
    whole = tm.write_model(tmp_path / "whole" / "tiny.gguf", seed=0)
    tm.write_model(tmp_path / "split" / "tiny.gguf", seed=0, split_max_tensors=8)
    place = tmp_path / folder
    for part in sorted((tmp_path / "split").glob("tiny-*.gguf")):
        into_folder(part, place / part.name)
    inside = place.relative_to(store_env[scheme] / "models" if scheme == "lmstudio" else store_env[scheme])
    prefix = f"{scheme}:" + (f"{inside.as_posix()}/" if inside.parts else "")
    assert stores.resolve(prefix + "tiny-00002-of-00003.gguf") == place / "tiny-00001-of-00003.gguf"
    prompt, args = "def f(x):", dict(max_tokens=16, temperature=0.0, drafter="none")
    outputs = []
    for model in (prefix + "tiny-00003-of-00003.gguf", str(whole)):
        engine = specllm.load(model, n_ctx=256, n_threads=1)
        try:
            outputs.append(engine.generate(prompt, **args).tokens)
        finally:
            engine.close()
    assert outputs[0] == outputs[1]


def test_a_split_store_model_without_its_first_part_says_that_part_is_missing(store_env, tmp_path):
    """models lists the parts there are by the first of them; that name said "no such model"."""
    tm.write_model(tmp_path / "tiny.gguf", seed=0, split_max_tensors=8)
    place = store_env["llamacpp"]
    for part in sorted(tmp_path.glob("tiny-*.gguf"))[1:]:
        into_folder(part, place / part.name)
    listing = specllm_cli("models", "--json")
    assert [m["spec"] for m in json.loads(listing.stdout)["models"]] == ["llamacpp:tiny-00002-of-00003.gguf"]
    proc = specllm_cli("run", "hi", "--target", "llamacpp:tiny-00002-of-00003.gguf")
    first = place / "tiny-00001-of-00003.gguf"
    assert_one_line_error(proc, f"the first part of this split model, {first}, is missing")


def test_a_part_numbered_past_its_count_is_listed_by_a_name_that_says_what_is_wrong(store_env, small_draft):
    """A part named beyond its count (tiny-00004-of-00003.gguf, renamed by hand): `models` lists it by
    that name, and the name said "no such model" of a file that is there."""
    part = into_folder(small_draft, store_env["llamacpp"] / "tiny-00004-of-00003.gguf")
    assert [m.spec for m in stores.scan().models] == ["llamacpp:tiny-00004-of-00003.gguf"]
    first = part.with_name("tiny-00001-of-00003.gguf")
    with pytest.raises(SpecllmError, match=f"the first part of this split model, {re.escape(str(first))}, is missing"):
        stores.resolve("llamacpp:tiny-00004-of-00003.gguf")


def test_a_target_alone_finds_its_draft_in_another_store(filled):
    proc = specllm_cli("models", "--drafts-for", "ollama:tiny", "--json")
    assert proc.returncode == 0, proc.stderr
    fits = {c["name"]: (c["origin"], c["compatible"]) for c in json.loads(proc.stdout)["candidates"]}
    assert fits == {
        "lmstudio:tiny-org/Tiny-GGUF/tiny-small.gguf": ("LM Studio", True),
        "llamacpp:tiny-org_Tiny-GGUF_tiny-draft.gguf": ("llama.cpp cache", None),  # not smaller than the target
    }
    _, stderr = greedy_tokens("--target", "ollama:tiny")
    assert (
        "draft for ollama:tiny: lmstudio:tiny-org/Tiny-GGUF/tiny-small.gguf" in stderr
    )  # named as given, not by its blob


def test_a_name_that_holds_an_emoji_code_is_shown_as_it_is(store_env, tiny_models, small_draft):
    """Rich reads ":llama:" as the code of an emoji: ollama:llama:latest was shown as "ollama🦙latest"
    in `models`, in `models --drafts-for` and in the line that names the draft chosen."""
    ollama_pull(store_env["ollama"], small_draft, "llama")
    name = "ollama:llama:latest"
    table = specllm_cli("models")
    assert table.returncode == 0 and name in table.stdout, table.stdout
    drafts = specllm_cli("models", "--drafts-for", tiny_models.target)
    assert drafts.returncode == 0 and name in drafts.stdout, drafts.stdout
    _, stderr = greedy_tokens("--target", tiny_models.target, extra=("--drafter", "model"))
    assert f"draft for target.gguf: {name}" in stderr


# --- what goes wrong -----------------------------------------------------------------------------


def test_a_missing_blob_is_one_line_and_the_listing_skips_it(filled, store_env):
    gone = ollama_pull(store_env["ollama"], tm.write_model(store_env["ollama"].parent / "x.gguf", seed=3), "gone")
    gone.unlink()
    assert_one_line_error(
        specllm_cli("run", "hi", "--target", "ollama:gone"), "ollama:gone", "blob", str(gone), "missing"
    )
    proc = specllm_cli("models", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "ollama:gone:latest" not in {m["spec"] for m in json.loads(proc.stdout)["models"]}
    assert proc.stderr.splitlines() == [
        f"warning: ollama:gone:latest: its model blob {gone} is missing (`ollama pull` fetches it again); skipped"
    ]


def test_a_blob_that_is_a_folder_is_not_called_missing(filled, store_env):
    """Something else where the model's blob should be (a folder) was "missing", with `ollama pull`
    to fetch it again: pulling does not replace it."""
    blob = filled["blob"]
    blob.unlink()
    blob.mkdir()
    assert_one_line_error(
        specllm_cli("run", "hi", "--target", "ollama:tiny"), f"its model blob {blob} is a folder, not a file"
    )


@pytest.mark.parametrize(
    "content, fragment",
    [
        ("{not json", "not JSON"),
        (
            json.dumps(
                {
                    "schemaVersion": 2,
                    "layers": [{"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64}],
                }
            ),
            "no layer of type application/vnd.ollama.image.model",
        ),
        (
            json.dumps({"layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:../../x"}]}),
            "digest",
        ),
        ("[1, 2]", "no layer of type"),
    ],
)
def test_a_bad_manifest_is_one_line_and_the_listing_skips_it(filled, store_env, content, fragment):
    manifest = store_env["ollama"] / "manifests" / REGISTRY / "library" / "broken" / "latest"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(content)
    assert_one_line_error(
        specllm_cli("run", "hi", "--target", "ollama:broken"), "bad Ollama manifest", str(manifest), fragment
    )
    proc = specllm_cli("models", "--json")
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)["models"]) == 4  # the good ones
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"warning: bad Ollama manifest {manifest}") and fragment in lines[0]


def test_a_manifest_under_a_path_that_is_no_ollama_name_is_a_warning_not_a_name_that_fails(filled, store_env):
    """Ollama skips a manifest whose path is not a model name it accepts (a tag with a space, a
    namespace with a dot); `models` listed it under that name, which then failed as "bad Ollama
    model name" (and a draft found there was named so). A hidden file (.DS_Store) is no manifest."""
    manifests = store_env["ollama"] / "manifests" / REGISTRY
    good = (manifests / "library" / "tiny" / "latest").read_text()
    odd = [manifests / "library" / "tiny" / "with space", manifests / "te.am" / "tiny" / "latest"]
    for path in [*odd, manifests / "library" / "tiny" / ".DS_Store"]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(good)
    proc = specllm_cli("models", "--json")
    assert proc.returncode == 0, proc.stderr
    listed = [m["spec"] for m in json.loads(proc.stdout)["models"]]
    assert len(listed) == 4 and all(parse_model_spec(spec) for spec in listed), listed
    assert sorted(proc.stderr.splitlines()) == sorted(
        f"warning: {path}: not an Ollama model name (Ollama skips it too); skipped" for path in odd
    )


def test_a_huge_manifest_is_not_read_whole(filled, store_env):
    """A manifest holds a few KB; one of 64 MiB (a damaged file: a 1 GiB one took 2 GB of memory and
    8 s, in `models` and in every search for a draft) is refused by its size, unread."""
    manifest = store_env["ollama"] / "manifests" / REGISTRY / "library" / "huge" / "latest"
    manifest.parent.mkdir(parents=True)
    with manifest.open("wb") as f:
        f.truncate(64 * 2**20)  # sparse: no room taken on disk
    assert_one_line_error(specllm_cli("run", "hi", "--target", "ollama:huge"), str(manifest), "67.1 MB")
    proc = specllm_cli("models", "--json")
    assert proc.returncode == 0 and len(json.loads(proc.stdout)["models"]) == 4, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"warning: cannot read the Ollama manifest {manifest}: ") and "67.1 MB" in line


@pytest.mark.parametrize("kind", ["settings a FIFO", "settings nested too deeply", "home pointer a FIFO"])
def test_lmstudio_settings_that_cannot_be_read_are_passed_over(filled, store_env, tmp_path, monkeypatch, kind):
    """LM Studio's settings.json (or ~/.lmstudio-home-pointer) read as a FIFO waited for a writer for
    ever: `models`, and every run that looks for a draft on disk, hung; arrays nested 100,000 deep
    were a traceback. Either is passed over, as an unreadable one is."""
    if "FIFO" in kind and not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    settings = store_env["lmstudio"] / "settings.json"
    if kind == "settings a FIFO":
        os.mkfifo(settings)
    elif kind == "settings nested too deeply":
        settings.write_text("[" * 100_000 + "]" * 100_000)
    else:
        monkeypatch.delenv("SPECLLM_LMSTUDIO_HOME")
        monkeypatch.setenv("HOME", str(tmp_path))
        os.mkfifo(tmp_path / ".lmstudio-home-pointer")
    proc = subprocess.run(
        [sys.executable, "-m", "specllm", "models", "--json"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    found = {m["spec"] for m in json.loads(proc.stdout)["models"]}
    assert ("lmstudio:tiny-org/Tiny-GGUF/tiny-small.gguf" in found) == kind.startswith("settings")


@pytest.mark.parametrize("scheme", ["lmstudio", "llamacpp"])
def test_a_link_to_a_file_that_is_gone_is_named_not_passed_over(filled, store_env, tmp_path, scheme):
    """A model linked into the store from elsewhere (another disk, an Ollama blob since removed)
    whose file is gone: `models` passed over it without a word, and its name was "no such model"."""
    root = store_env["lmstudio"] / "models" if scheme == "lmstudio" else store_env[scheme]
    link, gone = root / "pub" / "Linked-GGUF" / "gone.gguf", tmp_path / "unmounted" / "gone.gguf"
    link.parent.mkdir(parents=True)
    link.symlink_to(gone)
    proc = specllm_cli("run", "hi", "--target", f"{scheme}:pub/Linked-GGUF/gone.gguf")
    assert_one_line_error(proc, f"{link} is a link to {gone}, which is not a file")
    proc = specllm_cli("models", "--json")
    assert proc.returncode == 0 and len(json.loads(proc.stdout)["models"]) == 4, proc.stderr
    assert proc.stderr.splitlines() == [f"warning: {link} is a link to {gone}, which is not a file; skipped"]


@pytest.mark.parametrize(
    "store, spec",
    [
        ("ollama", "ollama:tiny"),
        ("lmstudio", "lmstudio:tiny-org/Tiny-GGUF/tiny-small.gguf"),
        ("llamacpp", "llamacpp:tiny-org_Tiny-GGUF_tiny-draft.gguf"),
    ],
)
def test_an_unreadable_store_is_one_line_and_the_listing_says_so(filled, store_env, store, spec):
    """A store folder that cannot be listed: a file where the folder should be (the test runs as
    root, for whom no permission bit makes a folder unreadable; see the next test for that)."""
    folder = store_env[store] / "models" if store == "lmstudio" else store_env[store]
    shutil.rmtree(folder)
    folder.write_text("a file where a folder should be")
    assert_one_line_error(specllm_cli("run", "hi", "--target", spec), "cannot read", str(folder), "Not a directory")
    proc = specllm_cli("models", "--json")
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)["models"]) == {"ollama": 2, "lmstudio": 3, "llamacpp": 3}[store]
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: cannot read") and str(folder) in lines[0]


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root reads a folder whatever its permissions"
)
def test_a_folder_without_read_permission_is_one_line(filled, store_env):
    manifests = store_env["ollama"] / "manifests"
    manifests.chmod(0)
    try:
        assert_one_line_error(
            specllm_cli("run", "hi", "--target", "ollama:tiny"), "cannot read", str(manifests), "Permission denied"
        )
        proc = specllm_cli("models", "--json")
        assert proc.returncode == 0 and "cannot read" in proc.stderr
    finally:
        manifests.chmod(0o755)


@pytest.mark.parametrize(
    "locked, spec",
    [
        ("ollama/blobs", "ollama:tiny"),
        ("ollama/manifests/" + REGISTRY + "/library", "ollama:tiny"),
        ("lmstudio/models/tiny-org", "lmstudio:tiny-org/Tiny-GGUF/tiny-small.gguf"),
    ],
)
def test_a_folder_that_cannot_be_searched_is_one_line_and_the_listing_says_so(filled, store_env, locked, spec):
    """A folder on the way to a model without the permission to go through it: Path.is_file()
    raises for that instead of answering."""
    folder = store_env["ollama"].parent / locked
    prefix = permission_bits_apply()
    folder.chmod(0)
    try:
        proc = subprocess.run(
            [*prefix, sys.executable, "-m", "specllm", "run", "hi", "--target", spec],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert_one_line_error(proc, "cannot read", str(folder), "Permission denied")
        listing = subprocess.run(
            [*prefix, sys.executable, "-m", "specllm", "models", "--json"], capture_output=True, text=True, timeout=180
        )
        assert listing.returncode == 0 and "Traceback" not in listing.stderr, listing.stderr
        assert spec not in {m["spec"] for m in json.loads(listing.stdout)["models"]}
        warnings = [line for line in listing.stderr.splitlines() if f"cannot read {folder}" in line]
        assert warnings and all(w.endswith("Permission denied; skipped") for w in warnings), listing.stderr
    finally:
        folder.chmod(0o755)


@pytest.mark.parametrize("kind", ["a file", "a folder without permission"])
def test_an_hf_cache_that_cannot_be_read_is_a_warning_and_the_rest_is_used(filled, tmp_path, monkeypatch, kind):
    """An HF cache that cannot be scanned is a warning of the listing: the stores are still listed,
    and a run of a local target (which looks for drafts on disk) still runs."""
    cache = tmp_path / "hf-cache"
    locked = cache
    if kind == "a file":
        cache.write_text("a file where a folder should be")
    else:
        (cache / "models--o--r" / "snapshots").mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    prefix = permission_bits_apply() if kind != "a file" else []
    if kind != "a file":
        locked.chmod(0)
    try:
        listing = subprocess.run(
            [*prefix, sys.executable, "-m", "specllm", "models", "--json"], capture_output=True, text=True, timeout=180
        )
        run = subprocess.run(
            [*prefix, sys.executable, "-m", "specllm", "run", "hi", "-n", "2", "--target", str(filled["llamacpp"])],
            capture_output=True,
            text=True,
            timeout=180,
        )
    finally:
        if kind != "a file":
            locked.chmod(0o755)
    assert listing.returncode == 0, listing.stderr
    assert len(json.loads(listing.stdout)["models"]) == 4  # every store model
    warning = f"warning: cannot read the HF cache {cache}: "
    assert [line for line in listing.stderr.splitlines() if line.startswith(warning)], listing.stderr
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("ollama:nothing-here", "no Ollama model ollama:nothing-here"),
        ("ollama:../../etc/passwd", "bad Ollama model name"),
        ("ollama:", "nothing after 'ollama:'"),
        ("ollama:a/b/c/d:e", "bad Ollama model name"),
        ("lmstudio:tiny-org/Tiny-GGUF/nope.gguf", "no lmstudio:tiny-org/Tiny-GGUF/nope.gguf"),
        (
            "lmstudio:../lmstudio/models/tiny-org/Tiny-GGUF/tiny-small.gguf",
            "expected a .gguf file's path inside LM Studio's folder",
        ),
        ("llamacpp:/etc/x.gguf", "expected a .gguf file's path inside llama.cpp cache's folder"),
    ],
)
def test_a_name_that_names_nothing_is_one_line(filled, spec, fragment):
    assert_one_line_error(specllm_cli("run", "hi", "--target", spec), fragment)


def with_a_token_twice(model: Path, dest: Path) -> Path:
    """A copy of `model` whose vocabulary has the byte token <0x00> twice (the next one, <0x01>,
    renamed): llama.cpp's vocabulary loader aborts the process on such a file."""
    data = model.read_bytes()
    at = data.index(b"<0x01>")
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(data[:at] + b"<0x00>" + data[at + 6 :])
    return dest


def test_a_vocabulary_with_a_token_twice_is_one_line_not_an_abort(store_env, tiny_models, small_draft):
    """As a target it is one line; in a store, where a target given alone looks for its draft, it is
    a candidate that does not fit, and the run goes on."""
    damaged = with_a_token_twice(small_draft, store_env["llamacpp"] / "damaged.gguf")
    proc = specllm_cli("run", "hi", "-n", "2", "--target", damaged)
    assert_one_line_error(proc, f"cannot load {damaged}", "'<0x00>' twice (ids 5 and 6)", exit_code=1)
    listing = specllm_cli("models", "--drafts-for", tiny_models.target, "--json")
    assert listing.returncode == 0, listing.stderr
    (found,) = [c for c in json.loads(listing.stdout)["candidates"] if c["name"] == "llamacpp:damaged.gguf"]
    assert found["compatible"] is False and "twice" in found["reason"]
    run = specllm_cli("run", "hi", "-n", "2", "--target", tiny_models.target)
    assert run.returncode == 0, run.stderr
    data = small_draft.read_bytes()  # a token's length damaged: far beyond the file, not read
    at = data.index(b"<0x01>") - 8
    huge = store_env["llamacpp"] / "huge.gguf"
    huge.write_bytes(data[:at] + (1 << 40).to_bytes(8, "little") + data[at + 8 :])
    proc = specllm_cli("run", "hi", "-n", "2", "--draft", "none", "--target", huge)
    assert_one_line_error(proc, f"cannot load {huge}")


def test_a_header_string_of_a_damaged_length_is_one_line_and_the_listing_goes_on(store_env, small_draft):
    """A metadata key whose length is damaged (1 TiB): reading the header asked for that much memory."""
    data = small_draft.read_bytes()
    damaged = store_env["llamacpp"] / "damaged.gguf"
    damaged.parent.mkdir(parents=True)
    damaged.write_bytes(data[:24] + (1 << 40).to_bytes(8, "little") + data[32:])  # the first key's length
    listing = specllm_cli("models", "--json")
    assert listing.returncode == 0, listing.stderr
    assert [(m["spec"], m["architecture"]) for m in json.loads(listing.stdout)["models"]] == [
        ("llamacpp:damaged.gguf", None)
    ]
    proc = specllm_cli("run", "hi", "-n", "2", "--draft", "none", "--target", damaged)
    assert_one_line_error(proc, str(damaged))


def with_arrays_nested(model: Path, dest: Path, depth: int) -> Path:
    """A copy of `model` whose first metadata value is an array of arrays `depth` deep: reading
    the header went as deep in Python's recursion, past its limit."""
    data = model.read_bytes()
    array, string = (9).to_bytes(4, "little"), (8).to_bytes(4, "little")
    one = (1).to_bytes(8, "little")
    nested = array + (array + one) * depth + string + (0).to_bytes(8, "little")  # ... of 0 strings
    n_kv = int.from_bytes(data[16:24], "little") + 1
    key = b"nested"
    dest.parent.mkdir(parents=True, exist_ok=True)
    entry = len(key).to_bytes(8, "little") + key + nested  # the first key, before the model's own
    dest.write_bytes(data[:16] + n_kv.to_bytes(8, "little") + entry + data[24:])
    return dest


def test_arrays_nested_without_end_in_a_header_are_one_line_and_the_listing_goes_on(store_env, small_draft):
    damaged = with_arrays_nested(small_draft, store_env["llamacpp"] / "nested.gguf", depth=100_000)
    listing = specllm_cli("models", "--json")
    assert listing.returncode == 0, listing.stderr
    assert [(m["spec"], m["architecture"]) for m in json.loads(listing.stdout)["models"]] == [
        ("llamacpp:nested.gguf", None)
    ]
    proc = specllm_cli("run", "hi", "-n", "2", "--draft", "none", "--target", damaged)
    assert_one_line_error(proc, f"cannot load {damaged}", "invalid GGUF type 9")


@pytest.mark.skipif(sys.platform in ("win32", "darwin"), reason="file names there are always Unicode")
def test_a_file_name_that_is_not_utf8_loads_and_is_a_candidate_draft(store_env, tiny_models, small_draft):
    """A store file named with bytes that are not UTF-8 (Python holds them as surrogates): handing
    its path to llama.cpp raised UnicodeEncodeError, so `models --drafts-for` of any larger target,
    and a run of the file itself, ended in a traceback."""
    name = os.fsdecode(b"small-\xff.gguf")
    into_folder(small_draft, store_env["llamacpp"] / name)
    listing = specllm_cli("models", "--drafts-for", tiny_models.target, "--json")
    assert listing.returncode == 0 and "Traceback" not in listing.stderr, listing.stderr
    (found,) = json.loads(listing.stdout)["candidates"]
    assert found["compatible"] is True, found
    proc = specllm_cli("run", "hi", "-n", "2", "--draft", "none", "--target", f"llamacpp:{name}")
    assert proc.returncode == 0, proc.stderr


def test_a_chat_template_that_is_not_utf8_is_one_line(tmp_path, tiny_models):
    """llama.cpp hands back a damaged template's bytes as they are."""
    data = tiny_models.target.read_bytes()
    key = b"tokenizer.chat_template"
    at = data.index(key) + len(key) + 4 + 8  # the value: after the key, its type and its length
    damaged = tmp_path / "damaged-template.gguf"
    damaged.write_bytes(data[:at] + b"\xff" + data[at + 1 :])
    proc = specllm_cli("run", "hi", "-n", "2", "--draft", "none", "--target", damaged)
    message = f"the chat template in {damaged} is not UTF-8 text: a damaged file"
    assert_one_line_error(proc, exit_code=1)
    assert proc.stderr == f"error: {message} (--raw runs without it)\n"
    raw = specllm_cli("run", "hi", "-n", "2", "--draft", "none", "--raw", "--target", damaged)
    assert raw.returncode == 0, raw.stderr
    engine = specllm.load(str(damaged), n_ctx=256, n_threads=1)
    try:  # the library's own words: no flag, and not blamed on the template a second time
        with pytest.raises(SpecllmError, match=f"^{re.escape(message)}$"):
            engine.chat_prompt("hi")
    finally:
        engine.close()


# --- rm never touches them -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "what, store",
    [
        ("ollama:tiny", "Ollama"),
        ("lmstudio:tiny-org/Tiny-GGUF/tiny-small.gguf", "LM Studio"),
        ("llamacpp:tiny-org_Tiny-GGUF_tiny-draft.gguf", "llama.cpp cache"),
        ("blob", "Ollama"),
        ("lmstudio", "LM Studio"),
        ("llamacpp", "llama.cpp cache"),
    ],
)
def test_rm_refuses_another_tools_models(filled, store_env, what, store):
    before = {p: p.read_bytes() for folder in store_env.values() for p in folder.rglob("*") if p.is_file()}
    proc = specllm_cli("rm", filled.get(what, what), "--yes")
    assert_one_line_error(proc, "refusing to remove", f"it is in {store}'s store", "not specllm's")
    after = {p: p.read_bytes() for folder in store_env.values() for p in folder.rglob("*") if p.is_file()}
    assert after == before


@pytest.mark.parametrize(
    "what, missing",
    [
        ("ollama:nosuch", "no Ollama model ollama:nosuch in"),
        ("lmstudio:tiny-org/Tiny-GGUF/nosuch.gguf", "no lmstudio:tiny-org/Tiny-GGUF/nosuch.gguf in"),
        ("llamacpp:nosuch.gguf", "no llamacpp:nosuch.gguf in"),
    ],
)
def test_rm_of_a_store_model_that_is_not_there_says_it_is_not_there(filled, what, missing):
    """Not "refusing to remove": that would say the model exists."""
    proc = specllm_cli("rm", what, "--yes")
    assert_one_line_error(proc, exit_code=1)
    assert proc.stderr.startswith(f"error: nothing to remove: {missing} "), proc.stderr
    assert "refusing" not in proc.stderr


def test_remove_refuses_a_store_model_even_when_handed_one(filled):
    """The last guard: local_models.remove never acts on another tool's model."""
    model = next(m for m in local_models.scan() if m.cache == "Ollama")
    with pytest.raises(SpecllmError, match="refusing to remove ollama:"):
        local_models.remove([model])
    assert model.path.read_bytes() == filled["blob"].read_bytes() and model.path.is_file()


def test_serve_a_store_model_under_its_name(filled):
    import signal
    import urllib.request

    args = ["serve", "--target", "ollama:tiny", "--draft", "none", "--threads", 1, "--ctx-size", 512, "--port", 0]
    with serving(args) as (proc, _, url):
        with urllib.request.urlopen(url + "/v1/models", timeout=30) as response:
            assert [m["id"] for m in json.load(response)["data"]] == ["ollama:tiny"]  # not its blob's hash
        body = json.dumps({"prompt": "def f(x):", "max_tokens": 4, "temperature": 0}).encode()
        request = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            assert json.load(response)["usage"]["completion_tokens"] == 4
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 130
