"""Vocabulary checks, remembered. Checking a draft against a target loads both vocabularies and
compares them token by token: 1-2 s for the default pair, on every run. A pair of files that passed
once passes again while neither file changed (path, size, modification time) and the llama.cpp
build is the same, so a pass is kept in specllm's cache (compatible.json) and not redone. A failure
is not kept: it is rare, and its message is worth saying again."""

import json
from collections.abc import Callable
from pathlib import Path

from .backend import build_id
from .files import cache_dir, file_identity, write_text_atomic

FILE_NAME = "compatible.json"


def check_once(target: str | Path, draft: str | Path, check: Callable[[], None]) -> None:
    """Run `check` (it raises SpecllmError for an incompatible pair) unless this pair passed it
    before; remember a pass."""
    if not known_compatible(target, draft):
        check()
        remember_compatible(target, draft)


def known_compatible(target: str | Path, draft: str | Path) -> bool:
    key = _pair_key(target, draft)
    return key is not None and key in _read()


def _pair_key(target: str | Path, draft: str | Path) -> str | None:
    ids = [file_identity(target), file_identity(draft)]
    return None if None in ids else f"{ids[0]}|{ids[1]}|{build_id()}"


def _path() -> Path:
    return cache_dir() / FILE_NAME


def _read() -> set[str]:
    try:
        return set(json.loads(_path().read_text(encoding="utf-8"))["compatible"])
    except (OSError, ValueError, KeyError, TypeError):
        return set()  # no cache yet, or one that cannot be read: check again


def remember_compatible(target: str | Path, draft: str | Path) -> None:
    key = _pair_key(target, draft)
    if key is None:
        return
    pairs = _read() | {key}
    try:
        _path().parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(_path(), json.dumps({"compatible": sorted(pairs)}, indent=1))
    except OSError:
        pass  # a cache that cannot be written costs the next run a check, not this run
