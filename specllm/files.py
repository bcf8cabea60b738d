"""Writing files so that nothing half-written is ever left behind, under either name."""

import glob
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def temp_beside(dest: Path, tag: str = "tmp") -> Iterator[Path]:
    """A temporary path in dest's folder (so that os.replace onto dest is atomic). It is removed
    on the way out, whatever happens, unless the caller has renamed it onto dest by then."""
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.{tag}")
    try:
        yield tmp
    finally:
        tmp.unlink(missing_ok=True)


def remove_stale_temps(dest: Path, tag: str = "tmp") -> None:
    """Remove temp_beside's temporary files of `dest` left by processes that were killed (the
    process id in their names means no later process reuses them). Only for a caller holding a
    lock that every writer of `dest` holds while writing: then no such file is in use."""
    own = re.compile(rf"\.{re.escape(dest.name)}\.[0-9]+\.{re.escape(tag)}")
    for stale in dest.parent.glob(f".{glob.escape(dest.name)}.*.{glob.escape(tag)}"):
        if own.fullmatch(stale.name):  # not the temporary file of another name that starts alike
            stale.unlink(missing_ok=True)


def write_text_atomic(path: Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` in one rename. Raises OSError."""
    with temp_beside(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)


def file_identity(path: str | Path) -> str | None:
    """"PATH:SIZE:MTIME" of a file, symlinks resolved: while it stays the same, so does the file's
    content (as caches keyed by it assume); None when the file cannot be read."""
    try:
        path = Path(path).resolve()
        st = path.stat()
    except OSError:
        return None
    return f"{path}:{st.st_size}:{st.st_mtime_ns}"


def cache_dir() -> Path:
    """specllm's own cache: SPECLLM_CACHE, else $XDG_CACHE_HOME/specllm, else ~/.cache/specllm."""
    if os.environ.get("SPECLLM_CACHE"):
        return Path(os.environ["SPECLLM_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "specllm"


def state_dir() -> Path:
    """Where specllm keeps what outlives a session but is no cache (the chat's history):
    $XDG_STATE_HOME/specllm, else the platform's place for it: %LOCALAPPDATA%\\specllm on Windows,
    ~/Library/Application Support/specllm on macOS, ~/.local/state/specllm elsewhere."""
    if os.environ.get("XDG_STATE_HOME"):
        return Path(os.environ["XDG_STATE_HOME"]).expanduser() / "specllm"
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"]) / "specllm"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "specllm"
    return Path.home() / ".local" / "state" / "specllm"


def human_size(n: float) -> str:
    """Bytes as people read them: 812 B, 3.4 KB, 1.6 GB."""
    if n < 1000:
        return f"{n:.0f} B"
    for unit in ("KB", "MB"):
        n /= 1000
        if n < 1000:
            return f"{n:.1f} {unit}"
    return f"{n / 1000:.1f} GB"
