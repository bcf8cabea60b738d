"""The live view: what it shows, and that its redraws stay the same size however long the text."""

import io
import random

import pytest
from rich.console import Console
from rich.text import Text

from specllm.chat.view import ACCEPTED, REASONING, REJECTED, TARGET, LiveView
from specllm.engine.loop import Stats, Step

WIDTH, HEIGHT = 60, 12


def random_steps(n: int, seed: int = 0) -> list[Step]:
    rng = random.Random(seed)
    words = ["a", "bc", "def ", "\n", "  x", "é", "", "token "]
    steps = []
    for _ in range(n):
        accepted = "".join(rng.choice(words) for _ in range(rng.randrange(3)))
        rejected = "".join(rng.choice(words) for _ in range(rng.randrange(2)))
        steps.append(Step([1], 1, 2, accepted, rng.choice(words), rejected, Stats(), "model"))
    return steps


def live_view() -> LiveView:
    console = Console(file=io.StringIO(), force_terminal=True, width=WIDTH, height=HEIGHT)
    return LiveView(console, "auto")


def styles(text: Text, console: Console) -> list[str]:
    return [str(text.get_style_at_offset(console, i)) for i in range(len(text))]


def test_the_text_has_each_piece_in_its_colour_however_its_spans_are_joined():
    view = live_view()
    reference = Text()
    for step in random_steps(400):
        view.step(step)
        reference.append(step.accepted_text, ACCEPTED)
        reference.append(step.rejected_text.replace("\n", "⏎"), REJECTED)
        reference.append(step.token_text, TARGET)
    assert view.body.plain == reference.plain
    assert styles(view.body, view.console) == styles(reference, view.console)
    assert len(view.body.spans) < len(reference.spans)  # runs of one colour are one span


def test_a_redraw_shows_the_end_of_the_text_and_cuts_what_it_keeps_for_it():
    from specllm.chat.view import status_line

    view = live_view()
    status = Text(status_line(Stats(), "auto")).wrap(view.console, WIDTH)
    rows = HEIGHT - 2 - len(status)  # the text gets what the status line leaves, and 2 rows stay free
    window = (WIDTH + 1) * rows
    longest = 0
    with view:
        for i, step in enumerate(random_steps(5000, seed=1)):
            view.step(step)
            if i % 50 == 0:
                view._render()
                longest = max(longest, len(view._recent))
        shown = view._render().renderables[0]
    assert longest <= 2 * window + 40  # a step adds a few characters at most
    tail = view.body[-window:]  # what the whole text's last lines are, wrapped as the view wraps
    lines = tail.wrap(view.console, WIDTH)[-rows:]
    expected = Text("\n").join(lines)
    assert shown.plain == expected.plain
    assert styles(shown, view.console) == styles(expected, view.console)


def test_the_live_region_fits_the_screen_however_narrow_with_the_whole_status_line():
    """On a narrow terminal the status line wraps to several rows: the text gets what it leaves.
    A region taller than the screen had its status cut to "..." while it ran, and at the end its
    top line scrolled out of the redraw's reach, left behind as a stray line in the scrollback."""
    from specllm.chat.view import status_line

    for width, height in ((20, 24), (20, 12), (40, 8), (80, 6), (300, 5)):
        console = Console(file=io.StringIO(), force_terminal=True, width=width, height=height)
        view = LiveView(console, "auto")
        for step in random_steps(300, seed=2):
            view.step(step)
        lines = console.render_lines(view._render(), console.options, pad=False)
        assert len(lines) <= height - 1, (width, height)
        drawn = " ".join("".join(segment.text for segment in line).strip() for line in lines)
        assert " ".join(status_line(view._stats, "auto").split()) in drawn, (width, height)


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def redraw_share(monkeypatch, redraw_seconds: float) -> tuple[int, float]:
    """Steps of 5 ms for 10 s on a fake clock, each redraw taking `redraw_seconds`: how many
    redraws, and their share of the time."""
    import specllm.chat.view as view_module

    clock = FakeClock()
    monkeypatch.setattr(view_module.time, "monotonic", clock)
    view, redraws = live_view(), []

    def refresh():
        clock.now += redraw_seconds
        redraws.append(redraw_seconds)

    view._live.refresh = refresh
    start = clock.now
    for step in random_steps(2000):
        clock.now += 0.005
        view.step(step)
    return len(redraws), sum(redraws) / (clock.now - start)


def test_redraws_come_12_times_a_second_and_take_at_most_5_percent_of_the_time(monkeypatch):
    count, share = redraw_share(monkeypatch, 0.001)  # a quick terminal: every 1/12 s
    assert 100 <= count <= 121 and share < 0.02
    count, share = redraw_share(monkeypatch, 0.020)  # a slow one: less often, 5% of the time
    assert 10 <= count <= 26 and 0.03 < share <= 0.05


HOSTILE = "hi\x1b[2J\x1b]0;owned\x07 there\r\nnext\rover\x9b31m"  # clear screen, set the title, CR, 8-bit CSI


def test_on_a_terminal_the_models_control_characters_are_shown_not_obeyed(monkeypatch):
    """A model's escape sequence would clear the screen or set the window title: the live view and
    the plain view on a terminal show each control character as a symbol; piped, the plain view
    passes the model's text on exactly."""
    from specllm.chat.view import PlainView

    view = live_view()
    view.__enter__()
    view.step(Step([1, 2], 1, 3, HOSTILE, "\x1b[3J", "\x1bc", Stats(), "model"))  # accepted, token, rejected
    view.finish(specllm_result())
    out = view.console.file.getvalue()
    for sequence in ("\x1b[2J", "\x1b]0;", "\x07", "\x1b[3J", "\x1bc", "\x9b"):  # none of them Rich's own
        assert sequence not in out, repr(sequence)
    assert "hi␛[2J␛]0;owned␇ there" in out and "next␍over" in out and "␛[3J" in out and "␛c" in out

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for stream, expected in ((Terminal(), "hi␛[2J␛]0;owned␇ there\nnext␍over\ufffd31m"), (io.StringIO(), HOSTILE)):
        monkeypatch.setattr("sys.stdout", stream)
        plain = PlainView("auto", show_summary=False)
        plain.step(Step([], 0, 3, HOSTILE, "", "", Stats(), "none"))
        assert stream.getvalue() == expected


def specllm_result():
    from specllm.engine.loop import Result

    return Result("", [], "eos", Stats())


def test_the_summary_of_a_generation_that_drafted_nothing_does_not_say_yet():
    """Live, nothing drafted so far may change; at the end of a run or a chat turn it cannot."""
    from specllm.chat.view import chat_summary, status_line, summary
    from specllm.engine.loop import Result

    result = Result("", [], "max_tokens", Stats(generated_tokens=3, target_calls=3))
    assert "acceptance - (nothing drafted yet)" in status_line(result.stats, "auto")
    for line in (summary(result, "auto"), chat_summary(result, "ngram")):
        assert "acceptance - (nothing drafted) ·" in line, line


def test_runs_summary_counts_the_prompt_as_a_prompt_not_as_a_prefill():
    """The last prompt token is evaluated with the first step, so --json's prefill_tokens is one
    fewer than the prompt: the summary said "prefill 19 tokens" next to prefill_tokens 18."""
    from specllm.chat.view import summary
    from specllm.engine.loop import Result

    stats = Stats(generated_tokens=3, target_calls=3, prompt_tokens=19, prefill_tokens=18, prefill_seconds=0.25)
    assert summary(Result("", [], "max_tokens", stats), "auto").endswith(" · prompt 19 tokens, prefilled in 0.25s")


# A thinking model's reply, as steps (accepted, rejected, target): its prompt opened the think
# block, which the second step closes.
THINKING = [("Hmm,", "", " so"), ("\n</think>", "x", "\n\n"), ("Par", "", "is"), (" is", " was", " big")]


def thinking_steps() -> list[Step]:
    return [Step([1], 1, 2, accepted, target, rejected, Stats(), "model") for accepted, rejected, target in THINKING]


def test_a_thinking_models_reasoning_is_shown_apart_and_its_answer_by_kind():
    """The reasoning as one piece, the step that closes the block as nothing, the answer's start
    as text, then its steps by kind; a reply without a block is shown by kind, held back or not."""
    from specllm.chat.view import ReplyParts

    parts = ReplyParts(opened=True)
    shown = [parts.step(step) for step in thinking_steps()] + [parts.finish()]
    assert shown == [
        [("reasoning", "Hmm, so")],
        [],
        [("answer", "Paris")],
        [("accepted", " is"), ("rejected", " was"), ("target", " big")],
        [],
    ]
    plain = ReplyParts()
    steps = [Step([1], 1, 2, "\n", "", "", Stats(), "model"), Step([1], 1, 2, "Hi", "!", "x", Stats(), "model")]
    assert [plain.step(s) for s in steps] == [
        [],
        [("accepted", "\n"), ("accepted", "Hi"), ("rejected", "x"), ("target", "!")],
    ]


def test_the_live_view_dims_the_reasoning_above_the_answer():
    console = Console(file=io.StringIO(), force_terminal=True, width=WIDTH, height=HEIGHT)
    view = LiveView(console, "model", opened=True)
    for step in thinking_steps():
        view.step(step)
    assert view.body.plain == "Hmm, so\n\nParis is was big"
    assert styles(view.body, console)[0] == str(console.get_style(REASONING))
    assert "</think>" not in view.body.plain


def test_the_plain_view_writes_the_answer_to_stdout_and_the_reasoning_to_stderr(capsys):
    from specllm.chat.view import PlainView

    view = PlainView("model", show_summary=False, opened=True)
    for step in thinking_steps():
        view.step(step)
    view.finish(None)
    out, err = capsys.readouterr()
    assert (out, err) == ("Paris is big\n", "Hmm, so\n")


@pytest.mark.parametrize(
    "pieces,shown",
    [
        (["all", "\nPar", "is is", " big"], "Paris is big"),
        (["get_weather\n", '{"city": ', '"Paris"}'], '>>>get_weather\n{"city": "Paris"}'),
    ],
)
def test_functionarys_reply_is_shown_after_its_first_recipient(capsys, pieces, shown):
    """Its prompt ends with ">>>": a text reply is shown without "all\\n" (it was shown), a call
    as functionary writes one, the prompt's ">>>" before it, in the live view and piped."""
    from specllm.chat.view import PlainView

    steps = [Step([1], 1, 2, "", piece, "", Stats(), "model") for piece in pieces]
    console = Console(file=io.StringIO(), force_terminal=True, width=WIDTH, height=HEIGHT)
    live, plain = LiveView(console, "model", recipient=True), PlainView("model", show_summary=False, recipient=True)
    for step in steps:
        live.step(step)
        plain.step(step)
    plain.finish(None)
    assert live.body.plain == shown
    assert capsys.readouterr() == (shown + "\n", "")


def test_a_gpt_oss_reply_is_shown_without_its_markup():
    """Harmony's analysis channel is the reasoning, the final channel the answer; the markers
    between are shown as nothing."""
    pieces = ["<|channel|>", "analysis", "<|message|>", "Hmm", ", so", "<|end|>", "<|start|>", "assistant",
              "<|channel|>", "final", "<|message|>", "Paris", " is big"]  # fmt: skip
    steps = [Step([1], 1, 2, "", piece, "", Stats(), "model") for piece in pieces]
    console = Console(file=io.StringIO(), force_terminal=True, width=WIDTH, height=HEIGHT)
    view = LiveView(console, "model")
    for step in steps:
        view.step(step)
    assert view.body.plain == "Hmm, so\n\nParis is big"
    assert styles(view.body, console)[0] == str(console.get_style(REASONING))
