"""Showing a generation: the only module that uses Rich's live display.

LiveView colours each piece by where it came from: draft tokens the target accepted, the target's
own tokens (the correction after a rejection, the bonus after a full accept), and rejected draft
tokens, struck through before the correction that replaces them. While it runs, the tail of the
text and a status line are redrawn in place; at the end the whole text is printed once, so the
scrollback holds it in full. PlainView prints bare text, for pipes, NO_COLOR and --no-live.
"""

import os
import sys

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from .engine import Result, Stats, Step

ACCEPTED = "green"
TARGET = "bold"
REJECTED = "red strike"


def use_live(no_live: bool, console: Console) -> bool:
    return not no_live and console.is_terminal and "NO_COLOR" not in os.environ


def status_line(stats: Stats, drafter: str) -> str:
    line = f"{stats.tokens_per_second:.1f} tok/s · {stats.generated_tokens} tokens"
    if drafter != "none":
        line += (
            f" · acceptance {stats.acceptance_rate:.0%}"
            f" · {stats.mean_accepted_length:.2f} tokens/target call"
        )
    return line


def summary(result: Result, drafter: str) -> str:
    s = result.stats
    return (
        f"[{result.stop_reason}] {status_line(s, drafter)} · drafter {drafter}"
        f" · prefill {s.prompt_tokens} tokens in {s.prefill_seconds:.2f}s"
    )


class PlainView:
    """Bare text on stdout as it comes; the summary on stderr, so stdout can be piped."""

    def __init__(self, drafter: str, show_summary: bool = True):
        self.drafter = drafter
        self.show_summary = show_summary

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def step(self, step: Step) -> None:
        sys.stdout.write(step.accepted_text + step.token_text)
        sys.stdout.flush()

    def finish(self, result: Result) -> None:
        sys.stdout.write("\n")
        sys.stdout.flush()
        if self.show_summary:
            print(summary(result, self.drafter), file=sys.stderr)


class LiveView:
    def __init__(self, console: Console, drafter: str):
        self.console = console
        self.drafter = drafter
        self.body = Text()
        self._stats: Stats | None = None
        self._live = Live(console=console, refresh_per_second=12, transient=True, get_renderable=self._render)

    def __enter__(self):
        self._live.__enter__()
        return self

    def __exit__(self, *exc):
        self._live.__exit__(*exc)
        if exc[0] is not None and self.body:  # interrupted: keep what was shown
            self.console.print(self.body)
        return False

    def step(self, step: Step) -> None:
        self.body.append(step.accepted_text, ACCEPTED)
        if step.rejected_text:
            self.body.append(step.rejected_text, REJECTED)
        self.body.append(step.token_text, TARGET)
        self._stats = step.stats

    def finish(self, result: Result) -> None:
        self._live.__exit__(None, None, None)
        self.console.print(self.body)
        self.console.print(legend(self.drafter))
        self.console.print(summary(result, self.drafter), style="dim", highlight=False)
        self.body = Text()

    def _render(self):
        # Only the last screenful of text, so the live region never scrolls away.
        height = max(3, self.console.size.height - 3)
        lines = self.body.wrap(self.console, self.console.size.width)
        tail = Text("\n").join(lines[-height:]) if len(lines) > height else self.body
        status = status_line(self._stats, self.drafter) if self._stats else "prefilling…"
        return Group(tail, Text(status, style="dim"))


def legend(drafter: str) -> Text:
    if drafter == "none":
        return Text("target-only decoding", style="dim")
    return Text.assemble(
        ("accepted draft", ACCEPTED), "  ", ("target token", TARGET), "  ", ("rejected draft", REJECTED)
    )
