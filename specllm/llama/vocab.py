"""Whether a draft model can draft for a target: the same vocabulary, checked token by token as
llama.cpp's speculative example does."""

from collections.abc import Callable
from pathlib import Path

from specllm.errors import SpecllmError
from specllm.files import cache_dir, file_identity, is_current, read_json, update_json
from specllm.llama.model import Model
from specllm.llama.system import build_id

# --- pair compatibility -------------------------------------------------------------------------

VOCAB_MAX_SIZE_DIFFERENCE = 128  # as llama.cpp's speculative example
VOCAB_CHECK_START_ID = 5


def check_compatible(target: Model, draft: Model) -> None:
    """Refuse a draft whose vocabulary differs from the target's, the way llama.cpp does."""
    names = f"{draft.path.name} cannot draft for {target.path.name}"
    if target.vocab_type != draft.vocab_type:
        raise SpecllmError(f"{names}: vocabulary types differ ({target.vocab_type} vs {draft.vocab_type})")
    if (target.add_bos, target.bos) != (draft.add_bos, draft.bos) or (target.add_eos, target.eos) != (
        draft.add_eos,
        draft.eos,
    ):
        raise SpecllmError(f"{names}: BOS/EOS tokens differ")
    if abs(target.n_vocab - draft.n_vocab) > VOCAB_MAX_SIZE_DIFFERENCE:
        raise SpecllmError(
            f"{names}: vocabulary sizes differ by more than {VOCAB_MAX_SIZE_DIFFERENCE} "
            f"({target.n_vocab} vs {draft.n_vocab})"
        )
    for token in range(VOCAB_CHECK_START_ID, min(target.n_vocab, draft.n_vocab)):
        a, b = target.token_text(token), draft.token_text(token)
        if a != b:
            raise SpecllmError(
                f"{names}: token {token} differs ({a.decode(errors='replace')!r} vs {b.decode(errors='replace')!r})"
            )


def check_pair(target_path: str | Path, draft_path: str | Path) -> None:
    """Check two GGUF files for compatibility by loading only their vocabularies."""
    target = Model(target_path, vocab_only=True)
    draft = Model(draft_path, vocab_only=True)
    try:
        check_compatible(target, draft)
    finally:
        target.close()
        draft.close()


# --- passed checks, remembered ---
#
# Vocabulary checks, remembered. Checking a draft against a target loads both vocabularies and
# compares them token by token: 1-2 s for the default pair, on every run. A pair of files that passed
# once passes again while neither file changed (path, size, modification time) and the llama.cpp
# build is the same, so a pass is kept in specllm's cache (compatible.json) and not redone. A failure
# is not kept: it is rare, and its message is worth saying again.


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
    return _pairs(read_json(_path()))


def _pairs(data) -> set[str]:
    """The pairs a cache holds; none from one that cannot be read (check again)."""
    pairs = data.get("compatible") if isinstance(data, dict) else None
    return {p for p in pairs if isinstance(p, str)} if isinstance(pairs, list) else set()


def remember_compatible(target: str | Path, draft: str | Path) -> None:
    """Keep a pass, with the others whose files are still as they were (a cache that cannot be
    written costs the next run a check, not this run)."""
    key = _pair_key(target, draft)
    if key is not None:
        update_json(
            _path(), lambda data: {"compatible": sorted({p for p in _pairs(data) if _still_current(p)} | {key})}
        )


def _still_current(pair_key: str) -> bool:
    target, draft = pair_key.split("|", 2)[:2]
    return is_current(target) and is_current(draft)
