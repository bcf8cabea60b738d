"""The command line's draft for a target given alone (run, chat, bench and serve with --target
and no --draft): the fastest measured here by `bench --drafts-for`, else the first candidate of
specllm/models/drafts.py that fits, saying which and why, and which flag to give to choose
otherwise."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from specllm import report
from specllm.errors import NeedsDraftModel
from specllm.files import human_size
from specllm.models.drafts import Candidate, candidates, curated_drafts
from specllm.models.hub import fetch_file
from specllm.models.registry import Pair, load_pairs
from specllm.models.winners import Winner


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
        return c, f"draft for {name}: {c.name} ({human_size(c.size)}), {why}; --draft none to go without"
    hint = ""
    curated = curated_drafts(target, pairs)
    if not tried and not curated:
        return None, None
    if curated:
        draft = curated[0][1]
        hint = f"; its family's curated draft is hf:{draft.label} (`--draft hf:{draft.label}` downloads it)"
    return None, (f"no draft on disk fits {name} (`specllm models --drafts-for {name}` lists why){hint}")


def find_draft(
    target: Path,
    drafter: str,
    *,
    models_file=None,
    source="auto",
    offline=False,
    verbose=False,
    label=None,
    rpc: Sequence[str] = (),
) -> Path | None:
    """run/chat/bench with a target and no draft: the draft to hand the engine, saying on stderr
    which and why (or why none, when there was something to choose from or with `verbose`). Only
    `--drafter model` downloads one (its family's curated draft, when nothing on disk fits); auto
    takes what is on disk, and the engine loads it only if it can pay. A draft `bench --drafts-for`
    found fastest for this target on this machine (winners.py) is taken before any other."""
    from specllm.models.winners import remembered

    name = label or target.name
    fastest = remembered(target, rpc)  # measured here (on these RPC servers) by `bench --drafts-for`: it comes first
    if fastest is not None:
        report.say(_winner_line(fastest, name))
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


def _winner_line(winner: Winner, target_name: str) -> str:
    """What a run says when it uses the draft measured fastest for its target."""
    speed = f"{winner.speedup:.2f}x target-only, " if winner.speedup is not None else ""
    return (
        f"draft for {target_name}: {winner.name}, the fastest of {winner.measured} draft(s) measured here by "
        f"`specllm bench --drafts-for` ({speed}{winner.acceptance:.0%} accepted at gamma {winner.gamma}); "
        "--draft to choose another, --draft none to go without"
    )
