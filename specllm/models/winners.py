"""The fastest draft measured for each target, remembered.

`specllm bench --drafts-for T` measures every draft on disk that fits T on this machine; the
winner is kept in specllm's cache (best_drafts.json), keyed by the target file as it is (path,
size, modification time), so that T given alone (run, chat, bench, serve) gets that draft instead
of the first one the usual search finds. A target measured on RPC servers (--rpc) has winners of
its own per set of servers: there a target step costs more, and a bigger draft may pay. A
remembered draft is used only while its file is still on disk as it was measured: a removed or
changed draft is ignored and the usual search applies.
Entries of targets that were removed or changed are dropped on the next write.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from specllm.files import JsonCache, file_identity

FILE_NAME = "best_drafts.json"
_CACHE = JsonCache(FILE_NAME)  # {target key (see _key): Winner fields + the draft's "identity"}


@dataclass(frozen=True)
class Winner:
    path: str  # the draft as it is loaded (not symlinks resolved: a split model's parts sit beside it)
    name: str  # how `models` names it: hf:REPO/FILE, ollama:NAME, a path
    tokens_per_second: float
    speedup: float | None  # against target-only decoding in the same run
    acceptance: float  # accepted / drafted draft tokens
    gamma: int  # the draft length that was fastest
    measured: int  # how many drafts were measured


def _key(target: str | Path, rpc: Sequence[str]) -> str | None:
    """The target file as it is, and the RPC servers its layers were on (none: on this machine)."""
    identity = file_identity(target)
    if identity is None or not rpc:
        return identity
    return f"{identity}|rpc={','.join(rpc)}"


def remember(target: str | Path, winner: Winner, rpc: Sequence[str] = ()) -> None:
    """Keep `winner` for this target file on these RPC servers (a cache that cannot be written only
    costs the next run the usual search)."""
    key, identity = _key(target, rpc), file_identity(winner.path)
    if key is None or identity is None:
        return
    entry = {**asdict(winner), "identity": identity}
    _CACHE.update({key: entry})


def remembered(target: str | Path, rpc: Sequence[str] = ()) -> Winner | None:
    """The winner kept for this target file on these RPC servers, if its draft is still on disk as
    it was measured."""
    key = _key(target, rpc)
    entry = _CACHE.read().get(key) if key else None
    if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):  # damaged: measure again
        return None
    if file_identity(entry["path"]) != entry.get("identity"):
        return None
    try:
        winner = Winner(**{k: entry[k] for k in Winner.__dataclass_fields__})
    except (KeyError, TypeError):  # an entry another version wrote: measure again
        return None
    return winner if _as_measured(winner) else None


def _as_measured(winner: Winner) -> bool:
    """Are the fields what bench writes? A run formats them as numbers in the line that names the
    draft, and `models --drafts-for --json` prints them, so an entry damaged or edited by hand
    ("speedup": "1.5", NaN, a negative speed, 700% accepted) is measured again: NaN and Infinity
    made that output JSON that no strict parser reads."""
    rate = lambda v: type(v) in (int, float) and 0 < v < math.inf  # noqa: E731 (bool is not a number here)
    count = lambda v: type(v) is int and v >= 1  # noqa: E731
    return (
        isinstance(winner.name, str)
        and rate(winner.tokens_per_second)
        and (winner.speedup is None or rate(winner.speedup))
        and type(winner.acceptance) in (int, float)
        and 0 <= winner.acceptance <= 1
        and count(winner.gamma)
        and count(winner.measured)
    )
