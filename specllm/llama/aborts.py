"""What runs when llama.cpp ends the process itself. Some faults abort it from C (GGML_ABORT): an
RPC server gone in the middle of a generation, a GPU's error. Nothing returns to Python after that,
so nothing can recover; but ggml calls its abort callback first, with its message, and there what
the user would lose (a conversation not yet saved) can still be written down."""

import contextlib
import ctypes
import sys
from collections.abc import Callable, Iterator

_hooks: list[Callable[[], None]] = []
_ABORT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
_installed: list = []  # the ctypes function ggml holds (kept alive here), once installed


@contextlib.contextmanager
def before_abort(hook: Callable[[], None]) -> Iterator[None]:
    """Within the block, `hook` runs if llama.cpp aborts the process, after its message (which
    then comes without ggml's backtrace). A hook must not call llama.cpp."""
    _install()
    _hooks.append(hook)
    try:
        yield
    finally:
        _hooks.remove(hook)


def _install() -> None:
    if _installed:
        return
    from llama_cpp import _ggml

    set_callback = getattr(_ggml.libggml, "ggml_set_abort_callback", None)
    if set_callback is None:  # a ggml without it: the process ends as it would anyway
        return
    set_callback.argtypes, set_callback.restype = [_ABORT_CALLBACK], ctypes.c_void_p
    _installed.append(_ABORT_CALLBACK(_on_abort))
    set_callback(_installed[0])


def _on_abort(message: bytes | None) -> None:
    """ggml's abort callback: its message, as ggml prints it without one, then the hooks. The
    process ends when this returns (abort()), whatever a hook does."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    print((message or b"").decode(errors="replace"), file=sys.stderr, flush=True)
    for hook in list(_hooks):
        with contextlib.suppress(Exception):
            hook()
