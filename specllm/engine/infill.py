"""Fill in the middle: the prompt that asks a code model for the text between a prefix and a
suffix (an editor's completion at its cursor), from the model's own FIM tokens:

    <|fim_prefix|>PREFIX<|fim_suffix|>SUFFIX<|fim_middle|>

With other files of the project for context it is the repository-level form, as llama-server's
/infill lays it out (its placeholder names too, since a request names neither the project nor the
file being edited):

    <|repo_name|>myproject\\n<|file_sep|>NAME\\nTEXT ... <|file_sep|>filename\\n<|fim_prefix|>...

A model without the repository tokens gets the files as text, each after a snippet line, as
llama-server does. The text is never read for control tokens: code that contains "<|endoftext|>"
is code.

The files take at most a room that depends on the context alone (FILES_SHARE of it), filled with
the latest of them (editors send their most recent last): so one request after another keeps the
same files, whatever its prefix or reply, and the KV cache holds them from one to the next (an
editor sends them ahead, to be read while the user types). The code then takes what the reply
leaves: when it does not fit, the prefix loses its start and the suffix its end, the prefix
keeping up to three quarters of the room (the code just before the cursor says most about what
comes next).
"""

from collections.abc import Sequence
from dataclasses import dataclass

from specllm.errors import SpecllmError
from specllm.llama.model import FimTokens, Model, common_prefix

REPO_NAME = "myproject"  # llama-server's placeholders
CURRENT_FILE = "filename"
SNIPPET_LINE = "\n\n--- snippet ---\n\n"  # a file's header for a model without <|file_sep|>
PREFIX_SHARE = 3 / 4
FILES_SHARE = 1 / 4  # of the context, at most, for the other files


@dataclass(frozen=True)
class ContextFile:
    """Another file of the project, shown to the model before the gap."""

    name: str
    text: str


@dataclass(frozen=True)
class InfillPrompt:
    tokens: list[int]
    left_out: int  # tokens of the files, prefix and suffix cut to leave room for the reply


def fim_tokens(target: Model) -> FimTokens:
    """The target's FIM tokens, or a SpecllmError for a model that has none."""
    fim = target.fim_tokens
    if fim is None:
        raise SpecllmError(
            f"{target.path.name} has no fill-in-the-middle tokens (such as <|fim_prefix|>): use a code "
            "model trained for it (Qwen2.5-Coder, CodeLlama, StarCoder, Granite Code, ...)"
        )
    return fim


def infill_prompt(
    target: Model,
    prefix: str,
    suffix: str,
    *,
    budget: int,
    files_room: int,
    files: Sequence[ContextFile] = (),
    line: str = "",
) -> InfillPrompt:
    """The FIM prompt for the gap between `prefix` and `suffix`, at most `budget` tokens, of which
    the files take at most `files_room`. `line` (llama-server's `prompt`) follows the prefix and is
    never cut: the text typed on the cursor's line."""
    fim = fim_tokens(target)
    tokenize = _tokenizer(target)
    # The line is read with the prefix, as the file's text is (a SentencePiece vocabulary would
    # put a space before a text read on its own); its tokens, those the prefix alone lacks, stay.
    written, after = tokenize(prefix + line), tokenize(suffix)
    typed = written[common_prefix(written, tokenize(prefix)) :] if line else []
    before = written[: len(written) - len(typed)]
    fixed = [target.bos] if target.add_bos else []
    line_room = budget - len(fixed) - 3  # what the line may take: the rest of the prompt may be cut
    if len(typed) > line_room:
        raise SpecllmError(
            f"the text on the cursor's line is {len(typed)} tokens, more than the {max(line_room, 0)} "
            "the prompt has room for"
        )
    project = _project(target, fim, files, min(files_room, line_room - len(typed)))
    room = line_room - len(typed) - len(project.tokens)
    after_kept = min(len(after), room - min(len(before), int(room * PREFIX_SHARE)))
    before_kept = min(len(before), room - after_kept)
    left_out = len(before) - before_kept + len(after) - after_kept + project.left_out
    gap = [fim.prefix, *before[len(before) - before_kept :], *typed, fim.suffix, *after[:after_kept], fim.middle]
    return InfillPrompt(fixed + project.tokens + gap, left_out)


def _tokenizer(target: Model):
    return lambda text: target.tokenize(text, add_special=False, parse_special=False) if text else []


def _project(target: Model, fim: FimTokens, files: Sequence[ContextFile], room: int) -> InfillPrompt:
    """The files before the gap, as many of the latest as fit in `room` (none: no header at all)."""
    if not files:
        return InfillPrompt([], 0)
    tokenize = _tokenizer(target)
    if fim.repo is not None and fim.file_sep is not None:
        head = [fim.repo, *tokenize(REPO_NAME + "\n")]
        tail = [fim.file_sep, *tokenize(CURRENT_FILE + "\n")]
        bodies = [[fim.file_sep, *tokenize(f.name + "\n"), *tokenize(f.text)] for f in files]
    else:
        head, tail = [], []
        bodies = [tokenize(SNIPPET_LINE) + tokenize(f.text) for f in files]
    total, first_kept, used = sum(map(len, bodies)), len(bodies), len(head) + len(tail)
    while first_kept > 0 and used + len(bodies[first_kept - 1]) <= room:  # the latest first, while they fit
        first_kept -= 1
        used += len(bodies[first_kept])
    kept = bodies[first_kept:]
    if not kept:
        return InfillPrompt([], total)
    tokens = head + [t for body in kept for t in body] + tail
    return InfillPrompt(tokens, total - sum(map(len, kept)))
