"""A draft model for a target that came without one.

In order: the curated draft of the target's family (a curated pair whose target differs from this
one only in size and quantisation, e.g. Qwen2.5-Coder 3B -> the 0.5B draft; a single-file entry
offers none), then every other GGUF on disk (specllm's cache and the HF cache), smallest first;
the first whose vocabulary passes the engine's own compatibility check (llama.vocab.ensure_compatible,
the rule llama.cpp's speculative example applies) is chosen. A cheap look at each GGUF header
(tokenizer type and vocabulary size) first rules out the plainly incompatible without asking
llama.cpp to load anything; llama.cpp then loads only the vocabularies of the rest (the target's
once), never their weights.

Nothing here loads a model, and only `--drafter model` downloads one (the family's curated draft,
when nothing on disk fits): the caller hands the chosen path to the engine, with `auto` as a
deferred draft, which the auto policy loads only if it can pay on this machine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from specllm import report
from specllm.errors import Incompatible, NeedsDraftModel, SpecllmError
from specllm.llama.gguf_header import read_metadata
from specllm.models.hub import fetch_file
from specllm.models.local import LocalModel, scan, size_on_disk
from specllm.models.registry import SPLIT_NAME, ModelFile, Pair, load_pairs

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


def choose(target: Path, pairs: dict[str, Pair], label: str | None = None) -> tuple[Candidate | None, str | None]:
    """The draft to use for `target` (or None), and one line saying which and why (None when
    there was nothing to choose from: no other GGUF on disk, no curated draft of its family).
    `label`: how the user named the target (an Ollama blob's file name says nothing)."""
    name = label or target.name
    tried = candidates(target, pairs, first_only=True)
    found = [c for c in tried if c.compatible]
    if found:
        c = found[0]
        why = (
            "the curated draft of its family"
            if "curated" in c.origin
            else (f"the smallest GGUF on disk whose vocabulary matches ({c.origin})")
        )
        return c, f"draft for {name}: {c.name} ({_mb(c.size)}), {why}; --draft none to go without"
    hint = ""
    curated = curated_drafts(target, pairs)
    if not tried and not curated:
        return None, None
    if curated:
        draft = curated[0][1]
        hint = f"; its family's curated draft is hf:{draft.label} (`--draft hf:{draft.label}` downloads it)"
    return None, (f"no draft on disk fits {name} (`specllm models --drafts-for {name}` lists why){hint}")


def find_draft(
    target: Path, drafter: str, *, models_file=None, source="auto", offline=False, verbose=False, label=None
) -> Path | None:
    """run/chat/bench with a target and no draft: the draft to hand the engine, saying on stderr
    which and why (or why none, when there was something to choose from or with `verbose`). Only
    `--drafter model` downloads one (its family's curated draft, when nothing on disk fits); auto
    takes what is on disk, and the engine loads it only if it can pay. A draft `bench --drafts-for`
    found fastest for this target on this machine (winners.py) is taken before any other."""
    from specllm.models.winners import remembered

    name = label or target.name
    fastest = remembered(target)  # measured here by `bench --drafts-for`: it comes first
    if fastest is not None:
        report.say(fastest.line(name))
        return Path(fastest.path)
    pairs = load_pairs(models_file)
    chosen, line = choose(target, pairs, name)
    path = chosen.path if chosen else None
    curated = curated_drafts(target, pairs)
    if path is None and drafter == "model":
        if not curated:
            raise NeedsDraftModel(none_fits=name)
        draft = curated[0][1]
        path = fetch_file(draft, source=source, offline=offline)
        line = f"draft for {name}: hf:{draft.label}, the curated draft of its family (downloaded)"
    if line is None and verbose:
        line = f"no draft for {name}: no other GGUF on disk"
    if line is not None:
        report.say(line)
    return path


def _candidate(model: LocalModel, origin: str, compatible: bool | None, reason: str) -> Candidate:
    return Candidate(model.path, model.spec, model.size, origin, compatible, reason)


def _same_file(a: Path, b: Path) -> bool:
    return a.resolve() == b.resolve()


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n < 1e9 else f"{n / 1e9:.1f} GB"


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
