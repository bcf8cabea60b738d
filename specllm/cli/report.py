"""The command line's reporter (specllm/report.py): dim status lines and transient progress bars
on stderr, drawn with Rich. Installed for every command, so Rich's progress module is imported
only when a bar is drawn, not at start-up."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from specllm.report import Advance
from specllm.suspend import suspending_cleanly


def names_console(**options):
    """A Rich console that shows names as they are: Rich reads ":llama:" in ollama:llama:latest as
    an emoji's code, and shows 🦙 in its place."""
    from rich.console import Console

    return Console(emoji=False, **options)


class RichReporter:
    def say(self, line: str) -> None:
        """One line, never wrapped (it names files)."""
        from rich.markup import escape

        from specllm.engine.text import shown_on_one_line

        console = names_console(stderr=True, highlight=False, soft_wrap=True)
        console.print(f"[dim]specllm:[/] {escape(shown_on_one_line(line))}")

    @contextlib.contextmanager
    def progress(self, description: str, total: int | None) -> Iterator[Advance]:
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

        columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
        bar = Progress(*columns, console=Console(stderr=True), transient=True)
        # one row: redrawn after Ctrl-Z and `fg`, it erases its own line only
        with bar, suspending_cleanly(bar.stop, bar.start):
            task = bar.add_task(description, total=total)
            yield lambda n: bar.advance(task, n)
