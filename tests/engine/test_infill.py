"""Fill in the middle (engine/infill.py) on tiny models with Qwen2.5-Coder's FIM tokens."""

from contextlib import closing

import pytest
import tiny_models as tm

import specllm
from specllm.engine.infill import CURRENT_FILE, REPO_NAME, SNIPPET_LINE, ContextFile, infill_prompt
from specllm.errors import SpecllmError
from specllm.llama.model import FimTokens

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


def test_the_line_follows_the_prefix_and_empty_texts_add_nothing(engine):
    prompt = engine.infill_prompt(PREFIX, "", line="        res")
    assert prompt.tokens == [
        tm.BOS_ID,
        PRE,
        *text_tokens(engine, PREFIX),
        *text_tokens(engine, "        res"),
        SUF,
        MID,
    ]


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


def test_a_prompt_too_long_loses_the_oldest_files_then_the_far_ends_of_the_code(engine):
    target = engine.target
    before, after = text_tokens(engine, PREFIX * 4), text_tokens(engine, SUFFIX * 4)
    files = [ContextFile("old.py", "x = 1\n" * 20), ContextFile("new.py", "y = 2\n")]
    whole = infill_prompt(target, PREFIX * 4, SUFFIX * 4, budget=10_000, files=files)
    assert whole.left_out == 0
    bodies = [1 + len(text_tokens(engine, f.name + "\n")) + len(text_tokens(engine, f.text)) for f in files]
    old_file = bodies[0]
    no_old = infill_prompt(target, PREFIX * 4, SUFFIX * 4, budget=len(whole.tokens) - 1, files=files)
    assert no_old.left_out == old_file and len(no_old.tokens) == len(whole.tokens) - old_file
    code_only = infill_prompt(target, PREFIX * 4, SUFFIX * 4, budget=1 + 3 + 100, files=files)
    assert len(code_only.tokens) == 104  # BOS, the three FIM tokens, 75 of the prefix, 25 of the suffix
    assert code_only.tokens[2:77] == before[-75:] and code_only.tokens[78:103] == after[:25]
    assert code_only.left_out == len(before) + len(after) - 100 + sum(bodies)


def test_a_short_suffix_leaves_its_share_to_the_prefix(engine):
    before = text_tokens(engine, PREFIX * 4)
    prompt = infill_prompt(engine.target, PREFIX * 4, "x", budget=1 + 3 + 50)
    assert prompt.tokens[2:51] == before[-49:] and prompt.left_out == len(before) - 49


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
