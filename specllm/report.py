"""What the library tells the user while it works (a download starting, a draft chosen, a file
being checked), without printing itself: it calls `say` and `progress`, and whoever drives it
decides how that looks. The command line installs a reporter that draws with Rich
(specllm/cli/report.py); a library user gets plain lines on stderr and no bars."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Protocol

Advance = Callable[[int], None]  # moves a progress bar on by this many units


class Reporter(Protocol):
    def say(self, line: str) -> None: ...

    def progress(self, description: str, total: int | None) -> AbstractContextManager[Advance]: ...


class PlainReporter:
    """Lines on stderr, no bars."""

    def say(self, line: str) -> None:
        print(f"specllm: {line}", file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def progress(self, description: str, total: int | None) -> Iterator[Advance]:
        yield lambda n: None


_reporter: Reporter = PlainReporter()


def use(reporter: Reporter) -> None:
    """Report through `reporter` from now on."""
    global _reporter
    _reporter = reporter


def say(line: str, enabled: bool = True) -> None:
    """Tell the user `line` (nothing when not `enabled`)."""
    if enabled:
        _reporter.say(line)


@contextlib.contextmanager
def progress(description: str, total: int | None, enabled: bool = True) -> Iterator[Advance]:
    """A progress bar for work of `total` units (None: unknown), as a function that advances it;
    nothing at all when not `enabled`."""
    if not enabled:
        yield lambda n: None
        return
    with _reporter.progress(description, total) as advance:
        yield advance
