"""Showing a generation: the only module that uses Rich's live display.

LiveView colours each piece by where it came from: draft tokens the target accepted, the target's
own tokens (the correction after a rejection, the bonus after a full accept), and rejected draft
tokens, struck through before the correction that replaces them. While it runs, the tail of the
text and a status line are redrawn in place; at the end the whole text is printed once, so the
scrollback holds it in full. PlainView prints bare text, for pipes, NO_COLOR and --no-live.

A thinking model's reasoning (engine/reasoning.py) is shown apart from its answer, without its think
block's tags: dimmed above the answer in LiveView, on stderr in PlainView.
"""

import contextlib
import os
import sys
import time

from rich.console import Console, Group
from rich.live import Live
from rich.text import Span, Text

from specllm.engine.loop import Result, Stats, Step
from specllm.engine.names import Drafter
from specllm.engine.reasoning import ReasoningSplitter, Split
from specllm.engine.text import shown
from specllm.suspend import suspending_cleanly

ACCEPTED = "green"
TARGET = "bold"
REJECTED = "red strike"
REASONING = "dim"
REDRAW_SECONDS = 1 / 12  # at most this often
REDRAW_SHARE = 0.05  # and at most this share of the time: a slow terminal or CPU redraws less often


def use_live(no_live: bool, console: Console) -> bool:
    return not no_live and console.is_terminal and not os.environ.get("NO_COLOR")  # empty: unset (no-color.org)


SOURCE_NAMES = {"ngram": "n-gram", "model": "model", "mtp": "MTP", "none": "none"}


def status_line(stats: Stats, drafter: str, finished: bool = False) -> str:
    """The live status, or with `finished` the same figures for the whole generation."""
    line = f"{stats.tokens_per_second:.1f} tok/s · {stats.generated_tokens} tokens"
    if drafter != Drafter.NONE:
        nothing = "- (nothing drafted)" if finished else "- (nothing drafted yet)"
        acceptance = f"{stats.acceptance_rate:.0%}" if stats.n_drafted else nothing
        line += f" · acceptance {acceptance} · {stats.mean_accepted_length:.2f} tokens/target call"
    if drafter == Drafter.AUTO:
        line += " · " + source_mix(stats)
    return line


def source_mix(stats: Stats) -> str:
    """What auto drafted with, e.g. "auto: n-gram 31%, model 0%, none 69% of steps"."""
    shares = stats.source_shares()
    names = [n for n in SOURCE_NAMES if n != Drafter.MTP or n in shares]  # MTP only for a model that has it
    return "auto: " + ", ".join(f"{SOURCE_NAMES[n]} {shares.get(n, 0.0):.0%}" for n in names) + " of steps"


def summary(result: Result, drafter: str) -> str:
    s = result.stats
    return (
        f"[{result.stop_reason}] {status_line(s, drafter, finished=True)} · drafter {drafter}"
        f" · prompt {s.prompt_tokens} tokens, prefilled in {s.prefill_seconds:.2f}s"
    )


def chat_summary(result: Result, drafter: str) -> str:
    """One chat turn: the KV reuse shows as how few of the prompt tokens needed a prefill."""
    s = result.stats
    return (
        f"[{result.stop_reason}] {status_line(s, drafter, finished=True)}"
        f" · prefill {s.prefill_tokens} of {s.prompt_tokens} prompt tokens in {s.prefill_seconds:.2f}s"
    )


class ReplyParts:
    """A reply's steps as the views show them, as (kind, text) pieces: `accepted`, `rejected` and
    `target` for steps that are all answer, as before; else the `reasoning` and `answer` the
    think block's split gives (its tags left out). Steps whose text is held back (it may open a
    think block) wait, and are shown by their kinds once they turn out to be answer.
    `opened`: the prompt ends inside a think block (the marker that ends it); `recipient`: it
    ends where the reply's first recipient goes (functionary v3.2's)."""

    def __init__(self, opened: bool | str = False, recipient: bool = False):
        self.splitter = ReasoningSplitter(opened, recipient=recipient)
        self.waiting: list[Step] = []  # steps whose text is not handed out yet

    def step(self, step: Step) -> list[tuple[str, str]]:
        self.waiting.append(step)
        return self._shown(self.splitter.feed(step.accepted_text + step.token_text))

    def finish(self) -> list[tuple[str, str]]:
        return self._shown(self.splitter.finish())

    def _shown(self, split: Split) -> list[tuple[str, str]]:
        raw = "".join(step.accepted_text + step.token_text for step in self.waiting)
        if split == Split("", raw) and not self.splitter.thinking:  # all of them answer, as generated
            pieces = [
                (kind, text)
                for step in self.waiting
                for kind, text in (("accepted", step.accepted_text), ("rejected", step.rejected_text),
                                   ("target", step.token_text))
                if text
            ]  # fmt: skip
        elif split.reasoning or split.answer:
            pieces = [(kind, text) for kind, text in (("reasoning", split.reasoning), ("answer", split.answer)) if text]
        else:
            return []  # held back: the steps wait
        self.waiting = []
        return pieces


class PlainView:
    """Bare text on stdout as it comes; the summary on stderr, so stdout can be piped. Piped, the
    text is the model's exactly; on a terminal its control characters show as symbols."""

    def __init__(
        self,
        drafter: str,
        show_summary: bool = True,
        describe=summary,
        opened: bool | str = False,
        recipient: bool = False,
    ):
        self.drafter = drafter
        self.show_summary = show_summary
        self.describe = describe
        self._show = shown if sys.stdout.isatty() else str
        self._show_reasoning = shown if sys.stderr.isatty() else str
        self.parts = ReplyParts(opened, recipient)
        self.reasoning = False  # reasoning written to stderr, its line not ended yet

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def step(self, step: Step) -> None:
        self._write(self.parts.step(step))

    def finish(self, result: Result) -> None:
        self._write(self.parts.finish())
        self._end_reasoning()
        sys.stdout.write("\n")
        sys.stdout.flush()
        if self.show_summary:
            print(self.describe(result, self.drafter), file=sys.stderr)

    def _write(self, pieces: list[tuple[str, str]]) -> None:
        """The answer on stdout, the model's text exactly when piped; the reasoning on stderr."""
        for kind, text in pieces:
            if kind == "reasoning":
                sys.stderr.write(self._show_reasoning(text))
                sys.stderr.flush()
                self.reasoning = True
            elif kind != "rejected":
                self._end_reasoning()
                sys.stdout.write(self._show(text))
        sys.stdout.flush()

    def _end_reasoning(self) -> None:
        if self.reasoning:
            sys.stderr.write("\n")
            sys.stderr.flush()
            self.reasoning = False


class LiveView:
    def __init__(
        self,
        console: Console,
        drafter: str,
        *,
        show_legend: bool = True,
        describe=summary,
        opened: bool | str = False,
        recipient: bool = False,
    ):
        self.console = console
        self.drafter = drafter
        self.show_legend = show_legend  # chat shows the legend once, not after every reply
        self.describe = describe
        self.body = Text()
        # the end of body, what a redraw shows: slicing a Text walks all its spans, so slicing
        # body itself would make each redraw slower the longer the text (25 ms at 100k characters)
        self._recent = Text()
        self._stats: Stats | None = None
        # Redrawn from this thread, never Rich's refresh thread: that one would wrap `body` while
        # step() appends to it (an IndexError inside Text.wrap that kills it, seen on long replies).
        self._live = self._new_live()
        self._ending = contextlib.ExitStack()
        self._drawn_at = 0.0
        self._redraw_gap = REDRAW_SECONDS
        self.parts = ReplyParts(opened, recipient)
        self._reasoned = self._answered = False  # some reasoning, some answer shown

    def _new_live(self) -> Live:
        return Live(console=self.console, auto_refresh=False, transient=True, get_renderable=self._render)

    def __enter__(self):
        self._live.start(refresh=True)
        self._ending.callback(lambda: self._live.stop())
        self._ending.enter_context(suspending_cleanly(lambda: self._live.stop(), self._draw_anew))
        return self

    def _draw_anew(self) -> None:
        """After Ctrl-Z and `fg`: a new Live, since the stopped one would begin its first redraw by
        erasing as many lines above the cursor as it last drew (the shell's lines, now)."""
        self._live = self._new_live()
        self._live.start(refresh=True)

    def __exit__(self, *exc):
        self._ending.close()
        if exc[0] is not None and self.body:  # interrupted: keep what was shown
            self.console.print(self.body)
        return False

    def step(self, step: Step) -> None:
        self._show(self.parts.step(step))
        self._stats = step.stats
        now = time.monotonic()
        if now - self._drawn_at >= self._redraw_gap:
            self._live.refresh()
            self._drawn_at = time.monotonic()
            self._redraw_gap = max(REDRAW_SECONDS, (self._drawn_at - now) / REDRAW_SHARE)

    def _show(self, pieces: list[tuple[str, str]]) -> None:
        for kind, piece in pieces:
            if kind == "rejected":  # a rejected newline would move the real text around: a symbol instead
                piece = piece.replace("\n", "⏎")
            elif kind != "reasoning":
                if self._reasoned and not self._answered:  # the answer begins below the reasoning
                    piece = "\n\n" + piece
                self._answered = True
            else:
                self._reasoned = True
            for text in (self.body, self._recent):
                _append(text, shown(piece), STYLES[kind])

    def finish(self, result: Result) -> None:
        self._show(self.parts.finish())
        self._ending.close()
        self.console.print(self.body)
        if self.show_legend:
            self.console.print(legend(self.drafter))
        self.console.print(self.describe(result, self.drafter), style="dim", highlight=False, markup=False)
        self.body, self._recent = Text(), Text()

    def _render(self):
        # Only the last screenful of text, so the live region never scrolls away: the text gets the
        # rows the status line leaves, however many it wraps to on a narrow terminal. A region
        # taller than the screen would lose its top line out of the redraw's reach (left behind in
        # the scrollback) and, while it runs, have its status line cut to "...".
        status = Text(status_line(self._stats, self.drafter) if self._stats else "prefilling…", style="dim")
        width = self.console.size.width
        height = max(1, self.console.size.height - 2 - len(status.wrap(self.console, width)))
        # The last `height` lines hold at most (width + 1) * height characters: wrap only those.
        window = (width + 1) * height
        if len(self._recent) > 2 * window:  # cut now and then, so each cut is short
            self._recent = self._recent[-window:]
        body = self._recent[-window:] if len(self._recent) > window else self._recent
        lines = body.wrap(self.console, width)
        tail = Text("\n").join(lines[-height:]) if len(lines) > height else body
        return Group(tail, status)


STYLES = {"accepted": ACCEPTED, "rejected": REJECTED, "target": TARGET, "reasoning": REASONING, "answer": ""}


def _append(text: Text, piece: str, style: str) -> None:
    """Text.append, but a piece in the style of the span it follows extends that span: a redraw
    wraps and draws span by span, and a span per token (all of target-only decoding) made it
    several times slower."""
    if not piece:
        return
    spans = text.spans
    if spans and spans[-1].style == style and spans[-1].end == len(text):
        text.append(piece)
        spans[-1] = Span(spans[-1].start, len(text), style)
    else:
        text.append(piece, style)


def legend(drafter: str) -> Text:
    if drafter == Drafter.NONE:
        return Text("target-only decoding", style="dim")
    return Text.assemble(
        ("accepted draft", ACCEPTED), "  ", ("target token", TARGET), "  ", ("rejected draft", REJECTED)
    )
