"""The command line's reporter (specllm/report.py): dim status lines and transient progress bars
on stderr, drawn with Rich."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from specllm.report import Advance


class RichReporter:
    def say(self, line: str) -> None:
        """One line, never wrapped (it names files)."""
        Console(stderr=True, highlight=False, soft_wrap=True).print(f"[dim]specllm:[/] {escape(line)}")

    @contextlib.contextmanager
    def progress(self, description: str, total: int | None) -> Iterator[Advance]:
        columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
        with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task(description, total=total)
            yield lambda n: bar.advance(task, n)
