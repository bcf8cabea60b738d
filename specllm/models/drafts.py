"""A draft model for a target that came without one.

In order: the curated draft of the target's family (a curated pair whose target differs from this
one only in size and quantisation, e.g. Qwen2.5-Coder 3B -> the 0.5B draft; a single-file entry
offers none), then every other GGUF on disk (specllm's cache and the HF cache), smallest first;
the first whose vocabulary passes the engine's own compatibility check (llama.vocab.ensure_compatible,
the rule llama.cpp's speculative example applies) is chosen. A cheap look at each GGUF header
(tokenizer type and vocabulary size) first rules out the plainly incompatible without asking
llama.cpp to load anything; llama.cpp then loads only the vocabularies of the rest (the target's
once), never their weights.

Nothing here loads a model or downloads one. The command line's automatic choice for a target
given alone (specllm/cli/drafts.py) picks from these candidates and says which and why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from specllm.errors import Incompatible, SpecllmError
from specllm.llama.gguf_header import read_metadata, tensor_count
from specllm.models.local import LocalModel, scan, size_on_disk
from specllm.models.registry import SPLIT_NAME, ModelFile, Pair

if TYPE_CHECKING:  # imported where it is used: it loads llama.cpp
    from specllm.llama.vocab import Compatibility

_SIZE = re.compile(r"(?<=[-_])\d+(?:\.\d+)?[bm](?=[-_]|$)")  # "-1.5b-", "-500m"
_QUANT = re.compile(r"[-_.](?:i?q\d\w*|f16|f32|bf16|fp16)$")  # "-q4_k_m", "-Q8_0", "-f16"
_VOCAB_KEYS = {"tokenizer.ggml.model", "tokenizer.ggml.tokens"}


@dataclass(frozen=True)
class Candidate:
    path: Path
    name: str  # how to name it: hf:REPO/FILE or a path
    size: int
    origin: str  # "HF cache" or "specllm cache", and ", curated draft of <pair>" for one
    compatible: bool | None  # None: not checked
    reason: str  # why it can or cannot draft for the target

    def to_dict(self) -> dict:
        keys = ("name", "size", "origin", "compatible", "reason")
        return {"path": str(self.path), **{k: getattr(self, k) for k in keys}}


def family(file_name: str) -> str:
    """A model's family from its file name: lower case, without .gguf, the split suffix, the
    quantisation and the parameter count. "Qwen2.5-Coder-7B-Instruct-Q4_K_M-00001-of-00002.gguf"
    -> "qwen2.5-coder-*-instruct"."""
    name = file_name.rsplit("/", 1)[-1]
    split = SPLIT_NAME.fullmatch(name)
    stem = (split["stem"] if split else name.removesuffix(".gguf")).lower()
    return _SIZE.sub("*", _QUANT.sub("", stem))


_NAME_KEYS = ("general.basename", "general.size_label", "general.finetune")


def target_family(target: Path) -> str:
    """The family of a target file: from its name, or, for a name that says nothing of it (an
    Ollama blob is sha256-HEX), from the name parts its GGUF header gives."""
    key = family(target.name)
    if "*" in key or not target.is_file():
        return key
    try:
        meta = read_metadata(target, set(_NAME_KEYS))
    except SpecllmError:
        return key
    parts = [meta.get(k) for k in _NAME_KEYS]
    if not all(isinstance(p, str) and p for p in parts[:2]):
        return key
    return family("-".join(p for p in parts if isinstance(p, str) and p) + ".gguf")


def curated_drafts(target: Path, pairs: dict[str, Pair]) -> list[tuple[Pair, ModelFile]]:
    """The curated drafts of the target's family (a pair's draft, once per file; an entry without
    a draft offers none)."""
    key, seen, found = target_family(target), set(), []
    for pair in pairs.values():
        draft = pair.draft
        if draft is not None and family(pair.target.file) == key and "*" in key and draft.label not in seen:
            seen.add(draft.label)
            found.append((pair, draft))
    return found


def candidates(target: Path, pairs: dict[str, Pair], *, first_only: bool = False) -> list[Candidate]:
    """Every model on disk that might draft for `target`, in the order they are tried (curated
    drafts of its family first, then by size), each checked unless it is not smaller than the
    target. With first_only, checking stops at the first compatible one."""
    target_size = size_on_disk(target)
    curated = {m.label: pair for pair, m in curated_drafts(target, pairs)}
    on_disk = [m for m in scan() if m.complete and not _same_file(m.path, target)]
    ranked = sorted(on_disk, key=lambda m: (f"{m.repo}/{m.file}" not in curated, m.size, m.spec))
    checker = _Checker(target)
    found: list[Candidate] = []
    try:
        for model in ranked:
            pair = curated.get(f"{model.repo}/{model.file}")
            origin = f"{model.cache}, curated draft of {pair.name}" if pair else model.cache
            if model.size >= target_size:
                found.append(_candidate(model, origin, None, "not smaller than the target"))
                continue
            problem = checker.problem(model.path)
            found.append(_candidate(model, origin, problem is None, problem or "vocabulary matches"))
            if first_only and problem is None:
                break
    finally:
        checker.close()
    return found


def _candidate(model: LocalModel, origin: str, compatible: bool | None, reason: str) -> Candidate:
    return Candidate(model.path, model.spec, model.size, origin, compatible, reason)


def _same_file(a: Path, b: Path) -> bool:
    return a.resolve() == b.resolve()


class _Checker:
    """Checks drafts against one target: its header and vocabulary read once."""

    def __init__(self, target: Path):
        self.target_path = target
        self.header = read_metadata(target, _VOCAB_KEYS)
        self.vocabulary: Compatibility | None = None  # the vocabulary check, made on first need

    def problem(self, draft: Path) -> str | None:
        """Why `draft` cannot draft for the target (None: it can)."""
        try:
            header = read_metadata(draft, _VOCAB_KEYS)
        except SpecllmError as e:
            return str(e)
        problem = _header_problem(self.header, header)
        if problem:
            return problem
        if SPLIT_NAME.fullmatch(draft.name) is None and _no_weights(draft):  # (its vocabulary would pass)
            return "a vocabulary without weights, not a model"
        from specllm.llama.vocab import Compatibility  # llama.cpp, only for files that got this far

        if self.vocabulary is None:
            self.vocabulary = Compatibility(self.target_path)
        try:
            self.vocabulary.ensure(draft)
        except Incompatible as e:
            return e.reason  # without "D cannot draft for T"
        except SpecllmError as e:
            if self.vocabulary.target is None:  # the target's own vocabulary would not load
                raise
            return str(e)
        return None

    def close(self) -> None:
        if self.vocabulary is not None:
            self.vocabulary.close()


def _no_weights(path: Path) -> bool:
    try:
        return tensor_count(path) == 0
    except OSError:
        return False  # (llama.cpp says why when it loads the vocabulary)


def _header_problem(target: dict, draft: dict) -> str | None:
    """The parts of the engine's check that a header can tell: tokenizer type, vocabulary size."""
    from specllm.llama.vocab import VOCAB_MAX_SIZE_DIFFERENCE as MAX_DIFFERENCE

    kinds = (target.get("tokenizer.ggml.model"), draft.get("tokenizer.ggml.model"))
    if kinds[0] != kinds[1]:
        return f"tokenizer types differ ({kinds[0]} vs {kinds[1]})"
    sizes = (target.get("tokenizer.ggml.tokens", 0), draft.get("tokenizer.ggml.tokens", 0))
    if abs(sizes[0] - sizes[1]) > MAX_DIFFERENCE:
        return f"vocabulary sizes differ by more than {MAX_DIFFERENCE} ({sizes[0]} vs {sizes[1]})"
    return None
