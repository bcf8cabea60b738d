"""Ctrl-Z under a live display: take it off the screen and show the cursor before the process
stops, and draw it again on `fg`. Left to the default, the process stops with the cursor hidden
(the shell's prompt then has none) and, resumed, redraws its display over the lines the shell
wrote meanwhile."""

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def suspending_cleanly(pause: Callable[[], None], resume: Callable[[], None]) -> Iterator[None]:
    """While in the block, SIGTSTP (Ctrl-Z) calls `pause`, stops the process as the default would,
    and calls `resume` once it is continued. Nothing changes where SIGTSTP is not at its default
    (a caller that handles or ignores it) or off the main thread, which cannot take signals."""
    stop = getattr(signal, "SIGTSTP", None)
    if stop is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    if signal.getsignal(stop) != signal.SIG_DFL:
        yield
        return

    def on_stop(signum, _frame) -> None:
        with contextlib.suppress(OSError):  # a terminal gone meanwhile: stop all the same
            pause()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)  # the process stops here, until it is continued
        signal.signal(signum, on_stop)
        with contextlib.suppress(OSError):
            resume()

    signal.signal(stop, on_stop)
    try:
        yield
    finally:
        signal.signal(stop, signal.SIG_DFL)
