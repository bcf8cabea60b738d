"""The live view: what it shows, and that its redraws stay the same size however long the text."""

import io
import random

from rich.console import Console
from rich.text import Text

from specllm.chat.view import ACCEPTED, REJECTED, TARGET, LiveView
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
    view = live_view()
    window = (WIDTH + 1) * (HEIGHT - 3)
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
    lines = tail.wrap(view.console, WIDTH)[-(HEIGHT - 3) :]
    expected = Text("\n").join(lines)
    assert shown.plain == expected.plain
    assert styles(shown, view.console) == styles(expected, view.console)
