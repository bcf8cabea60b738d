"""Fill in the middle (engine/infill.py) on tiny models with Qwen2.5-Coder's FIM tokens."""

import itertools
from contextlib import closing

import pytest
import tiny_models as tm

import specllm
from specllm.engine import text as text_module
from specllm.engine.infill import CURRENT_FILE, REPO_NAME, SNIPPET_LINE, ContextFile, infill_prompt
from specllm.engine.prompt_cache import PromptCache
from specllm.engine.text import TextStream
from specllm.errors import SpecllmError
from specllm.llama.model import FimTokens, common_prefix

PREFIX = "def total(values):\n    result = 0\n    for value in values:\n"
SUFFIX = "\n    return result\n\nprint(total([1, 2]))\n"
FIM = {piece: tm.vocab_size("standard") + i for i, piece in enumerate(tm.FIM_PIECES)}
PRE, MID, SUF, REPO, SEP = (FIM[p] for p in ("<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|repo_name|>", "<|file_sep|>"))  # noqa: E501  # fmt: skip


@pytest.fixture(scope="module")
def engine(tiny_code_models):
    e = specllm.load(str(tiny_code_models.target), str(tiny_code_models.draft), n_ctx=512, n_threads=1)
    yield e
    e.close()


def text_tokens(engine, text: str) -> list[int]:
    return engine.target.tokenize(text, add_special=False, parse_special=False)


def test_the_gap_is_the_models_fim_tokens_around_the_text(engine):
    prompt = engine.infill_prompt(PREFIX, SUFFIX)
    expected = [tm.BOS_ID, PRE, *text_tokens(engine, PREFIX), SUF, *text_tokens(engine, SUFFIX), MID]
    assert prompt.tokens == expected
    assert prompt.left_out == 0


def line_tokens(engine, prefix: str, line: str) -> list[int]:
    """The tokens of the line as it is read after the prefix: those the prefix alone lacks."""
    written = text_tokens(engine, prefix + line)
    return written[common_prefix(written, text_tokens(engine, prefix)) :]


def test_the_line_is_read_with_the_prefix_and_empty_texts_add_nothing(engine):
    """SentencePiece puts a space before a text read on its own: the line (llama-server's
    `prompt`) is read as the file's text, after the prefix."""
    prompt = engine.infill_prompt(PREFIX, "", line="        res")
    assert prompt.tokens == [tm.BOS_ID, PRE, *text_tokens(engine, PREFIX + "        res"), SUF, MID]
    assert text_tokens(engine, PREFIX) + text_tokens(engine, "        res") != text_tokens(
        engine, PREFIX + "        res"
    )


def test_files_come_first_in_the_repository_form(engine):
    files = [ContextFile("a.py", "x = 1\n"), ContextFile("b.py", "y = 2\n")]
    prompt = engine.infill_prompt(PREFIX, SUFFIX, files=files)
    header = [REPO, *text_tokens(engine, REPO_NAME + "\n")]
    bodies = [[SEP, *text_tokens(engine, f.name + "\n"), *text_tokens(engine, f.text)] for f in files]
    current = [SEP, *text_tokens(engine, CURRENT_FILE + "\n")]
    gap = engine.infill_prompt(PREFIX, SUFFIX).tokens[1:]
    assert prompt.tokens == [tm.BOS_ID, *header, *bodies[0], *bodies[1], *current, *gap]


def test_control_token_text_in_the_code_stays_text(engine):
    prompt = engine.infill_prompt("a = '<|fim_suffix|>'", "<|file_sep|>")
    assert prompt.tokens.count(SUF) == 1 and SEP not in prompt.tokens


def test_the_files_fill_their_own_room_latest_first_whatever_the_code(engine):
    target = engine.target
    files = [ContextFile("old.py", "x = 1\n" * 20), ContextFile("new.py", "y = 2\n")]
    scaffold = 1 + len(text_tokens(engine, REPO_NAME + "\n")) + 1 + len(text_tokens(engine, CURRENT_FILE + "\n"))
    bodies = [1 + len(text_tokens(engine, f.name + "\n")) + len(text_tokens(engine, f.text)) for f in files]
    both = scaffold + sum(bodies)
    whole = infill_prompt(target, PREFIX, SUFFIX, budget=10_000, files_room=both, files=files)
    assert (
        whole.left_out == 0
        and whole.tokens[1 : 1 + both] == engine.infill_prompt(PREFIX, SUFFIX, files=files).tokens[1 : 1 + both]
    )
    no_old = infill_prompt(target, PREFIX, SUFFIX, budget=10_000, files_room=both - 1, files=files)
    assert no_old.left_out == bodies[0] and len(no_old.tokens) == len(whole.tokens) - bodies[0]
    # Another prefix, a tighter budget: the same files, for the KV cache to hold from one request to the next
    other = infill_prompt(target, PREFIX * 9, "", budget=len(no_old.tokens), files_room=both - 1, files=files)
    project = no_old.tokens[: 1 + scaffold + bodies[1]]
    assert other.tokens[: len(project)] == project and other.left_out > bodies[0]
    assert infill_prompt(
        target, PREFIX, SUFFIX, budget=10_000, files_room=scaffold + bodies[1] - 1, files=files
    ).left_out == sum(bodies)


def test_code_too_long_loses_its_far_ends(engine):
    before, after = text_tokens(engine, PREFIX * 4), text_tokens(engine, SUFFIX * 4)
    code_only = infill_prompt(engine.target, PREFIX * 4, SUFFIX * 4, budget=1 + 3 + 100, files_room=0)
    assert len(code_only.tokens) == 104  # BOS, the three FIM tokens, 75 of the prefix, 25 of the suffix
    assert code_only.tokens[2:77] == before[-75:] and code_only.tokens[78:103] == after[:25]
    assert code_only.left_out == len(before) + len(after) - 100


def test_an_editors_files_are_the_same_ahead_of_a_completion_as_in_it(engine):
    """llama.vscode sends its files ahead with n_predict 0 and an empty gap, then completions with
    them: both keep the latest that fit in a quarter of the context."""
    files = [ContextFile(f"f{i}.py", f"v = {i}\n") for i in range(30)]
    ahead = engine.infill_prompt("", "", files=files, max_tokens=1).tokens[:-3]  # but the gap
    for prefix, max_tokens in ((PREFIX, 128), (PREFIX * 30, 64), (PREFIX * 3, None)):
        assert engine.infill_prompt(prefix, SUFFIX, files=files, max_tokens=max_tokens).tokens[: len(ahead)] == ahead
    assert engine.target.n_ctx // 4 - 40 < len(ahead) - 1 <= engine.target.n_ctx // 4


def test_a_short_suffix_leaves_its_share_to_the_prefix(engine):
    before = text_tokens(engine, PREFIX * 4)
    prompt = infill_prompt(engine.target, PREFIX * 4, "x", budget=1 + 3 + 50, files_room=0)
    assert prompt.tokens[2:51] == before[-49:] and prompt.left_out == len(before) - 49


def test_a_cursor_line_longer_than_the_room_says_how_much_room_there_is(engine):
    line = "        result = result + value"
    typed = line_tokens(engine, PREFIX, line)
    n = len(typed)
    fits = infill_prompt(engine.target, PREFIX, SUFFIX, budget=1 + 3 + n, files_room=0, line=line)  # BOS, FIM tokens
    assert fits.tokens == [tm.BOS_ID, PRE, *typed, SUF, MID]
    message = f"the text on the cursor's line is {n} tokens, more than the {n - 1} the prompt has room for"
    with pytest.raises(SpecllmError, match=message):
        infill_prompt(engine.target, PREFIX, SUFFIX, budget=1 + 3 + n - 1, files_room=0, line=line)


def test_the_reply_keeps_room_for_max_tokens(engine):
    n_ctx = engine.target.n_ctx  # 512
    long = PREFIX * 40
    assert len(engine.infill_prompt(long, SUFFIX, max_tokens=100).tokens) == n_ctx - 100
    assert len(engine.infill_prompt(long, SUFFIX, max_tokens=10_000).tokens) == n_ctx // 2
    assert len(engine.infill_prompt(long, SUFFIX).tokens) == n_ctx - n_ctx // 4


def test_a_model_without_fim_tokens_is_told_so(tiny_models):
    message = "target.gguf has no fill-in-the-middle tokens"
    with (
        closing(specllm.load(str(tiny_models.target), n_ctx=256, n_threads=1)) as engine,
        pytest.raises(SpecllmError, match=message),
    ):
        engine.infill_prompt(PREFIX, SUFFIX)


def test_text_that_is_not_utf8_or_not_text_is_refused(engine):
    with pytest.raises(SpecllmError, match="not valid UTF-8"):
        engine.infill_prompt("x = '\udcff'", "")
    with pytest.raises(SpecllmError, match="is text"):
        engine.infill_prompt(PREFIX, None)  # type: ignore[arg-type]


@pytest.mark.parametrize("drafter", ["model", "ngram", "auto"])
def test_greedy_infill_equals_target_only(engine, drafter):
    prompt = engine.infill_prompt(PREFIX, SUFFIX).tokens
    alone = engine.generate(prompt, max_tokens=40, temperature=0, drafter="none")
    drafted = engine.generate(prompt, max_tokens=40, temperature=0, drafter=drafter)
    assert drafted.tokens == alone.tokens


def test_snippets_for_a_model_without_repository_tokens(tmp_path):
    """CodeLlama's FIM tokens are the gap's three only: the files come as text."""
    path = tm.write_model(tmp_path / "codellama.gguf", seed=0, vocab="codellama")
    with closing(specllm.load(str(path), n_ctx=256, n_threads=1)) as engine:
        pre, suf, mid = (tm.vocab_size("standard") + i for i in range(3))
        assert engine.target.fim_tokens == FimTokens(pre, suf, mid)
        prompt = engine.infill_prompt(PREFIX, SUFFIX, files=[ContextFile("a.py", "x = 1\n")])
        snippet = [*text_tokens(engine, SNIPPET_LINE), *text_tokens(engine, "x = 1\n")]
        gap = [pre, *text_tokens(engine, PREFIX), suf, *text_tokens(engine, SUFFIX), mid]
        assert prompt.tokens == [tm.BOS_ID, *snippet, *gap]


# --- an editor's limits on a completion (TextStream's min_indent and line_seconds) ---------------


def pushed(text: str, cuts: list[int], **limits) -> tuple[str, str, bool]:
    """`text` fed to a TextStream in the pieces `cuts` makes: what it released, its text, stopped."""
    stream, out, start = TextStream(**limits), "", 0
    for end in [*cuts, len(text)]:
        out += stream.push(text[start:end].encode())
        start = end
    return out + stream.finish(), stream.text, stream.limited


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("x = 1\n    y = 2\n    z\n  w = 3\n", "x = 1\n    y = 2\n    z\n  "),  # ends before the outdented "w"
        ("x\n    y\n\n    z\n", "x\n    y\n"),  # a blank line is indented by nothing
        ("x\n\ty\n", None),  # a tab counts as one
        ("  first line is not judged\n    y", None),
        ("x\n   ", None),  # the line's first character has not come
    ],
)
def test_min_indent_ends_before_the_first_outdented_line(text, kept):
    for cuts in ([], list(range(1, len(text))), [3, 9]):  # however the text comes in tokens
        out, whole, limited = pushed(text, cuts, min_indent=1 if "\t" in text else 4)
        assert (out, whole, limited) == ((kept, kept, True) if kept is not None else (text, text, False))


def test_line_seconds_end_at_the_first_line_break_after_them(monkeypatch):
    clock = itertools.count()  # a second more at every reading
    monkeypatch.setattr(text_module.time, "monotonic", lambda: next(clock))
    # pushes "a", "\n", "b", "\nc\n": the clock starts at the first, then reads 1, 2, 3 s after it
    assert pushed("a\nb\nc\n", [1, 2, 3], line_seconds=1.5)[1:] == ("a\nb\nc\n", True)  # "\n" at 1 s: too soon
    assert pushed("a\nb\nc\n", [1, 2, 3], line_seconds=0.5)[1:] == ("a\n", True)
    assert pushed("a\nb\nc\n", [1, 2, 3], line_seconds=3600)[1:] == ("a\nb\nc\n", False)


@pytest.mark.parametrize("drafter", ["none", "model", "ngram"])
def test_a_generation_limited_by_indent_is_the_unlimited_ones_text_cut(engine, drafter):
    prompt = engine.infill_prompt(PREFIX, SUFFIX).tokens
    free = engine.generate(prompt, max_tokens=200, temperature=0, drafter="none")
    cut = pushed(free.text, [], min_indent=1)[1]
    assert cut != free.text  # the tiny model writes lines that begin without indentation
    limited = engine.generate(prompt, max_tokens=200, temperature=0, drafter=drafter, min_indent=1)
    assert (limited.text, limited.stop_reason) == (cut, "limit")
    assert limited.tokens == free.tokens[: len(limited.tokens)]


@pytest.mark.parametrize("value", [-1, 1.5, True, "2"])
def test_bad_limits_are_refused(engine, value):
    with pytest.raises(SpecllmError, match="min_indent"):
        engine.generate("x", max_tokens=2, min_indent=value)
    with pytest.raises(SpecllmError, match="line_seconds"):
        engine.generate("x", max_tokens=2, line_seconds=value if value != 1.5 else float("nan"))


def test_a_reply_cut_by_a_limit_is_not_continued_from_its_tokens(engine):
    """The limit cuts the text within a token: the tokens spell more than the text, and a prompt
    that extends the text must not be read with them (engine/prompt_cache.py)."""
    prompt = "<|fim_prefix|>" + PREFIX + "<|fim_suffix|>" + SUFFIX + "<|fim_middle|>"  # control tokens read
    limited = engine.generate(prompt, max_tokens=200, temperature=0, drafter="none", min_indent=1)
    assert limited.stop_reason == "limit"
    cache = PromptCache(engine)
    cache.remember(prompt, engine.prompt_tokens(prompt), limited)
    assert cache.tokens is None
    assert not cache.prompt(prompt + limited.text + "x").extended


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda e: e.infill_prompt(PREFIX, SUFFIX, max_tokens=0), "max_tokens must be >= 1"),
        (lambda e: e.infill_prompt(PREFIX, SUFFIX, files=[{"name": "a", "text": ""}]), "files are ContextFile"),
        (lambda e: e.infill_prompt(PREFIX, SUFFIX, files=[ContextFile("a.py", "\udcff")]), "the text of a.py is not"),
        (lambda e: e.infill_prompt(PREFIX, SUFFIX, line="\udcff"), "the cursor's line is not valid UTF-8"),
    ],
)
def test_bad_arguments_of_a_gap_are_named(engine, call, message):
    with pytest.raises(SpecllmError, match=message):
        call(engine)
