"""llama.cpp's log and its one-time backend initialisation: quiet unless -v, but its last errors
are kept so that a failed load can say why."""

import collections
import ctypes
import sys

import llama_cpp as L

_LOG_LEVEL_ERROR = 4  # GGML_LOG_LEVEL_ERROR
_verbose = False
recent_errors: collections.deque[str] = collections.deque(maxlen=4)


@L.llama_log_callback
def _log_callback(level, text, _user_data):
    # llama.cpp logs a lot to stderr; keep it quiet unless -v, but remember its last errors so a
    # failed load can say why.
    message = text.decode("utf-8", errors="replace")
    if level == _LOG_LEVEL_ERROR and message.strip():
        recent_errors.append(message.strip())
    if _verbose:
        sys.stderr.write(message)


def set_verbose(verbose: bool) -> None:
    global _verbose
    _verbose = verbose


_initialised = False


def init_backend() -> None:
    global _initialised
    if not _initialised:
        L.llama_log_set(_log_callback, ctypes.c_void_p(0))
        L.llama_backend_init()
        _initialised = True


def first_error(default: str) -> str:
    """llama.cpp's first error line, which says why, without its function-name prefix."""
    if not recent_errors:
        return default
    return recent_errors[0].split(": ", 1)[-1]
