"""The command line's reporter (specllm/report.py): dim status lines and transient progress bars
on stderr, drawn with Rich. Installed for every command, so Rich's progress module is imported
only when a bar is drawn, not at start-up."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from specllm.report import Advance


class RichReporter:
    def say(self, line: str) -> None:
        """One line, never wrapped (it names files)."""
        from rich.console import Console
        from rich.markup import escape

        from specllm.engine.text import shown

        # (without emoji: Rich would show ":llama:" of a name such as ollama:llama:latest as one)
        console = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)
        console.print(f"[dim]specllm:[/] {escape(shown(line))}")

    @contextlib.contextmanager
    def progress(self, description: str, total: int | None) -> Iterator[Advance]:
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

        columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
        with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task(description, total=total)
            yield lambda n: bar.advance(task, n)
