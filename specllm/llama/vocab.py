"""Whether a draft model can draft for a target: the same vocabulary, checked token by token as
llama.cpp's speculative example does."""

from pathlib import Path

from specllm.errors import Incompatible
from specllm.files import JsonCache, file_identity
from specllm.llama.model import Model
from specllm.llama.system import build_id

VOCAB_MAX_SIZE_DIFFERENCE = 128  # as llama.cpp's speculative example
VOCAB_CHECK_START_ID = 5


def check_compatible(target: Model, draft: Model) -> None:
    """Refuse a draft whose vocabulary differs from the target's, the way llama.cpp does."""
    if target.vocab_type != draft.vocab_type:
        raise Incompatible(
            target.path.name, draft.path.name, f"vocabulary types differ ({target.vocab_type} vs {draft.vocab_type})"
        )
    if (target.add_bos, target.bos) != (draft.add_bos, draft.bos) or (target.add_eos, target.eos) != (
        draft.add_eos,
        draft.eos,
    ):
        raise Incompatible(target.path.name, draft.path.name, "BOS/EOS tokens differ")
    if abs(target.n_vocab - draft.n_vocab) > VOCAB_MAX_SIZE_DIFFERENCE:
        raise Incompatible(
            target.path.name,
            draft.path.name,
            f"vocabulary sizes differ by more than {VOCAB_MAX_SIZE_DIFFERENCE} ({target.n_vocab} vs {draft.n_vocab})",
        )
    for token in range(VOCAB_CHECK_START_ID, min(target.n_vocab, draft.n_vocab)):
        a, b = target.token_text(token), draft.token_text(token)
        if a != b:
            raise Incompatible(
                target.path.name,
                draft.path.name,
                f"token {token} differs ({a.decode(errors='replace')!r} vs {b.decode(errors='replace')!r})",
            )


# --- every check goes through here: passes remembered ---
#
# Checking a draft against a target loads both vocabularies and compares them token by token: 1-2 s
# for the default pair, on every run. A pair of files that passed once passes again while neither
# file changed (path, size, modification time) and the llama.cpp build is the same, so a pass is
# kept in specllm's cache (compatible.json) and not redone. A failure is not kept: it is rare, and
# its message is worth saying again.

FILE_NAME = "compatible.json"
# {"compatible": ["TARGET_IDENTITY|DRAFT_IDENTITY|BUILD", ...]}: a pair is dropped once either file changes
_CACHE = JsonCache(
    FILE_NAME,
    load=lambda data: dict.fromkeys(data["compatible"], True) if isinstance(data["compatible"], list) else None,
    dump=lambda pairs: {"compatible": sorted(pairs)},
    files=2,
)


def ensure_compatible(
    target_path: str | Path, draft_path: str | Path, *, target: Model | None = None, draft: Model | None = None
) -> None:
    """Raise SpecllmError (Incompatible) unless the draft file can draft for the target file. A
    pair that passed before is not checked again; a pass is remembered. `target` and `draft`, the
    files' models where they are loaded already, are used as they are; the others are loaded
    vocabulary only, and closed again."""
    with Compatibility(target_path, target) as check:
        check.ensure(draft_path, draft)


def known_compatible(target_path: str | Path, draft_path: str | Path) -> bool:
    """Did this pair of files, as they are now, pass the check with this llama.cpp build?"""
    key = _pair_key(target_path, draft_path)
    return key is not None and key in _CACHE.read()


class Compatibility:
    """ensure_compatible for many drafts against one target, whose vocabulary is loaded once, on
    the first check the cache cannot answer (`target`, a loaded model, is used instead). Close it
    (or use it in a `with`) to close what it loaded."""

    def __init__(self, target_path: str | Path, target: Model | None = None):
        self.target_path = target_path
        self.target = target
        self._opened: Model | None = None

    def ensure(self, draft_path: str | Path, draft: Model | None = None) -> None:
        """Raise SpecllmError (Incompatible) unless `draft_path` can draft for the target. A
        SpecllmError from loading a file's vocabulary comes through as it is."""
        if known_compatible(self.target_path, draft_path):
            return
        if self.target is None:
            self.target = self._opened = Model(self.target_path, vocab_only=True)
        vocabulary = draft if draft is not None else Model(draft_path, vocab_only=True)
        try:
            check_compatible(self.target, vocabulary)
        finally:
            if vocabulary is not draft:
                vocabulary.close()
        key = _pair_key(self.target_path, draft_path)
        if key is not None:  # a cache that cannot be written costs the next run a check, not this run
            _CACHE.update({key: True})

    def close(self) -> None:
        if self._opened is not None:
            self._opened.close()
            self.target = self._opened = None

    def __enter__(self) -> "Compatibility":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _pair_key(target: str | Path, draft: str | Path) -> str | None:
    ids = [file_identity(target), file_identity(draft)]
    return None if None in ids else f"{ids[0]}|{ids[1]}|{build_id()}"
