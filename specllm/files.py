"""Writing files so that nothing half-written is ever left behind, under either name, and reading
the files a user names without waiting for ever on one that is no file."""

import errno
import glob
import json
import os
import re
import stat
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from specllm.errors import SpecllmError

try:
    import resource  # imported now: a process out of file descriptors cannot import it then
except ImportError:  # Windows
    resource = None  # type: ignore[assignment]

NAME_MAX = 255  # bytes in a file name, on the usual file systems
PID_DIGITS = 7  # process ids stay below 2**22 on Linux


def _temp_stem(dest: Path, tag: str) -> str:
    """dest's name as its temporary files begin, cut short where the temporary file's name would
    be too long: a name the file system takes (/save with a 250-byte name) was refused for the
    name of its temporary file."""
    room = NAME_MAX - len(f"..{'9' * PID_DIGITS}.{tag}".encode())
    name = os.fsencode(dest.name)
    return dest.name if len(name) <= room else os.fsdecode(name[:room])


@contextmanager
def temp_beside(dest: Path, tag: str = "tmp") -> Iterator[Path]:
    """A temporary path in dest's folder (so that os.replace onto dest is atomic). It is removed
    on the way out, whatever happens, unless the caller has renamed it onto dest by then."""
    tmp = dest.with_name(f".{_temp_stem(dest, tag)}.{os.getpid()}.{tag}")
    try:
        yield tmp
    finally:
        tmp.unlink(missing_ok=True)


def remove_stale_temps(dest: Path, tag: str = "tmp") -> None:
    """Remove temp_beside's temporary files of `dest` left by processes that were killed (the
    process id in their names means no later process reuses them). Only for a caller holding a
    lock that every writer of `dest` holds while writing: then no such file is in use."""
    stem = _temp_stem(dest, tag)
    own = re.compile(rf"\.{re.escape(stem)}\.[0-9]+\.{re.escape(tag)}")
    for stale in dest.parent.glob(f".{glob.escape(stem)}.*.{glob.escape(tag)}"):
        if own.fullmatch(stale.name):  # not the temporary file of another name that starts alike
            stale.unlink(missing_ok=True)


def kind_of_file(mode: int) -> str:
    """What a file that is not a regular one is, as a message names it."""
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "something else"


def _check_regular(path: str | Path, mode: int) -> None:
    if not stat.S_ISREG(mode):
        raise OSError(errno.EINVAL, f"it is {kind_of_file(mode)}, not a regular file", str(path))


# Far more than any prompt file, pairs file or saved chat holds; far less than a model file, which
# a slip of the finger can name instead (reading one whole would take its size in memory).
TEXT_FILE_MAX_BYTES = 256 * 2**20


def read_text_file(path: str | Path, encoding: str = "utf-8", max_bytes: int | None = None) -> str:
    """The text of a file a user named (a saved chat, prompts, pairs) or another tool wrote.
    Anything but a regular file is refused, without waiting or reading for ever: opening a FIFO
    waits for a writer (for ever when none comes), and a device such as /dev/zero never ends; so is
    a file larger than `max_bytes` (default TEXT_FILE_MAX_BYTES). Raises OSError, and
    UnicodeDecodeError for text that is not in `encoding`."""
    _check_regular(path, os.stat(path).st_mode)  # before opening: opening a device may do something
    # Non-blocking, so that a FIFO put in its place since cannot hold the open up; binary, so that
    # Windows neither translates line ends twice nor stops at a Ctrl-Z.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    with open(fd, encoding=encoding) as f:
        info = os.fstat(fd)
        _check_regular(path, info.st_mode)
        limit_bytes = TEXT_FILE_MAX_BYTES if max_bytes is None else max_bytes
        if info.st_size > limit_bytes:
            size, limit = human_size(info.st_size), human_size(limit_bytes)
            raise OSError(errno.EFBIG, f"it holds {size}, more than a text file of {limit}", str(path))
        return f.read()


def check_not_read_only(path: Path) -> None:
    """Refuse to replace a file that its user may not write: the rename of an atomic write needs
    only the folder's permission, so it would replace a file made read-only to keep it. Root, whom
    os.access lets write anything, is held to the mode bits: a file nobody may write is kept."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return
    if not mode & 0o222 or not os.access(path, os.W_OK):
        raise PermissionError(errno.EACCES, "the file is read-only", str(path))


def write_text_atomic(path: Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` in one rename. A symlink is written through (the file it
    leads to is replaced, not the link); a character device (/dev/null, /dev/stdout) is written
    to in place, as a rename would put a file where the device was; anything else that is not a
    regular file (a FIFO, a socket, a disk) is refused, and so is a read-only file (see
    check_not_read_only). Raises OSError."""
    path = Path(os.path.realpath(path))
    if path.is_char_device():
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return
    if path.exists():
        _check_regular(path, path.stat().st_mode)
        check_not_read_only(path)
    # A file replaced keeps its permissions: a transcript made private (chmod 600) came back
    # readable by everyone. They are set before the text goes in, so it is never more exposed.
    # (Windows has only a read-only flag, which would keep the temporary file from being removed.)
    mode = stat.S_IMODE(path.stat().st_mode) if path.exists() and os.name != "nt" else None
    with temp_beside(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            if mode is not None:
                os.chmod(tmp, mode)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename: a crash then leaves the old file or the new
        os.replace(tmp, path)


def check_writable(path: Path, option: str) -> None:
    """Refuse, before any work is done for it, an output file that cannot be written."""
    if str(path) == "-":
        raise SpecllmError(f"{option} takes a file name, not - (standard output)")
    if path.is_dir():
        raise SpecllmError(f"cannot write {path}: it is a folder")
    if not path.parent.is_dir():
        raise SpecllmError(f"cannot write {path}: there is no folder {path.parent}")
    if not os.access(path.parent, os.W_OK):
        raise SpecllmError(f"cannot write {path}: permission denied")
    if path.exists() and not path.is_char_device():  # a device is written in place, not replaced
        try:
            _check_regular(path, path.stat().st_mode)
            check_not_read_only(path)
        except OSError as e:  # in the words of write_text_atomic's refusal at the end of the run
            raise SpecllmError(f"cannot write {path}: {e.strerror}") from None


def read_json(path: Path):
    """A cache file's JSON, or None where there is none or it cannot be read (damaged, cut short,
    nested too deeply to parse): a cache is then rebuilt, never a reason to fail."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None


CACHE_LOCK_SECONDS = 10.0


def update_json(path: Path, update: Callable[[object], object]) -> None:
    """Replace a cache file's JSON with update(its JSON or None), holding a lock beside it, so two
    processes that write at once both keep their entries (without it, a read-modify-write of one
    lost the other's). Temporary files of writers that were killed are removed under the lock. A
    cache that cannot be written (a read-only folder, a lock held too long) only costs a later run
    some work, so nothing is raised."""
    from filelock import FileLock, Timeout

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(path.with_name(f".{path.name}.lock")), timeout=CACHE_LOCK_SECONDS):
            remove_stale_temps(path)
            write_text_atomic(path, json.dumps(update(read_json(path)), indent=1, allow_nan=False))
    except OSError as e:
        _tell_unwritable(path, e)
    except (Timeout, ValueError):
        pass


_told_unwritable: set[Path] = set()
NOT_KEPT = "what it measures is not kept, so later runs measure it again"


def _tell_unwritable(path: Path, error: OSError) -> None:
    """Once a process and folder: a cache that cannot be written is no error, but a user whose
    SPECLLM_CACHE names a file would otherwise pay for calibration in every run without a word.
    Where the cache file itself is in the way (a folder, a read-only file, a symlink to nowhere),
    the note names it: "cannot write specllm's cache in FOLDER (it is a folder ...)" sent the
    user to the folder, which was fine."""
    folder = path.parent
    if folder not in _told_unwritable:
        _told_unwritable.add(folder)
        from specllm import report

        why = _file_in_the_way(folder) or error.strerror or str(error)
        # (os.path.islink answers False, where Path.is_symlink raises, in a folder it cannot read)
        the_file = error.filename == os.path.realpath(path) or os.path.islink(path)
        where = f"file {path}" if the_file else f"in {folder}"
        report.say(f"note: cannot write specllm's cache {where} ({why}): {NOT_KEPT}")


def _file_in_the_way(folder: Path) -> str | None:
    """Where a file stands in the place of `folder` or of a folder above it (XDG_CACHE_HOME naming
    a file: "Not a directory" left the user to find which), which."""
    existing = next((above for above in (folder, *folder.parents) if os.path.lexists(above)), None)
    if existing is None or not existing.is_file():
        return None
    return "it is a file" if existing == folder else f"{existing} is a file"


def file_identity(path: str | Path) -> str | None:
    """ "PATH:SIZE:MTIME" of a file, symlinks resolved: while it stays the same, so does the file's
    content (as caches keyed by it assume); None when the file cannot be read."""
    try:
        path = Path(path).resolve()
        st = path.stat()
    except OSError:
        return None
    return f"{path}:{st.st_size}:{st.st_mtime_ns}"


class JsonCache:
    """A JSON file in specllm's cache (cache_dir() / name) whose entries are keyed by the files
    they were made from: a key starts with `files` file identities ("PATH:SIZE:MTIME|...|the
    rest", see file_identity). Every cache is read and written through this class:

    - read(): the entries, a dict; none where the file is missing, damaged or of another layout
      (a cache is rebuilt, never a reason to fail);
    - update(changes): `changes` written over the entries under a lock (see update_json), so two
      processes writing at once both keep theirs; entries of files that were removed or changed
      since are dropped, so a cache does not grow for ever.

    `load` takes the file's JSON to the entries and `dump` the entries back (each cache keeps its
    own layout); a `load` that meets something else may raise (KeyError, TypeError, ...): no
    entries."""

    def __init__(self, name: str, load=lambda data: data, dump=lambda entries: entries, files: int = 1):
        self.name, self._load, self._dump, self._files = name, load, dump, files

    @property
    def path(self) -> Path:
        return cache_dir() / self.name  # SPECLLM_CACHE read on each use (every test sets its own)

    def read(self) -> dict:
        return self._entries(read_json(self.path))

    def update(self, changes: dict) -> None:
        """Write `changes` over the entries, keeping the others whose files are still as they
        were. A cache that cannot be written only costs a later run some work: nothing is raised."""
        update_json(self.path, lambda data: self._dump({**self._current(self._entries(data)), **changes}))

    def _entries(self, data) -> dict:
        try:
            entries = self._load(data)
        except (KeyError, TypeError, AttributeError, ValueError):
            return {}
        return {k: v for k, v in entries.items() if isinstance(k, str)} if isinstance(entries, dict) else {}

    def _current(self, entries: dict) -> dict:
        return {key: entry for key, entry in entries.items() if self._files_unchanged(key)}

    def _files_unchanged(self, key: str) -> bool:
        """Are the files a key starts with still as they were? A path may hold "|" itself (split
        there, a model in a folder named "a | b" read as gone: its entries were dropped by every
        write of another model's), so each identity runs to its size and modification time."""
        for _ in range(self._files):
            identity = _IDENTITY.match(key)
            if identity is None or not _still_as_it_was(identity[1]):
                return False
            key = key[identity.end() :]
        return True


_IDENTITY = re.compile(r"(.*?:[0-9]+:-?[0-9]+)(?:\||$)")  # a file_identity, then "|" or the end


def _still_as_it_was(identity: str) -> bool:
    """Does a file_identity still name the file as it is?"""
    return file_identity(identity.rsplit(":", 2)[0]) == identity


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


def open_files_hint(error: OSError) -> str:
    """For an error of a process out of file descriptors (EMFILE: more open files and connections
    than `ulimit -n` allows), what the limit is and how to raise it; else nothing."""
    if error.errno != errno.EMFILE or resource is None:
        return ""
    return f" (the limit is {resource.getrlimit(resource.RLIMIT_NOFILE)[0]} open files: `ulimit -n` raises it)"


def memory_limit_hint() -> str:
    """Where the process runs under a limit on its memory (`ulimit -v`, RLIMIT_AS), what it is and
    how to raise it; else nothing."""
    limit = resource.getrlimit(resource.RLIMIT_AS)[0] if resource is not None else None
    if limit is None or limit == resource.RLIM_INFINITY:
        return ""
    return f" (the process may use {human_size(limit)} of memory: `ulimit -v` raises it)"


def human_size(n: float) -> str:
    """Bytes as people read them: 812 B, 3.4 KB, 1.6 GB."""
    if n < 1000:
        return f"{n:.0f} B"
    for unit in ("KB", "MB"):
        n /= 1000
        if n < 1000:
            return f"{n:.1f} {unit}"
    return f"{n / 1000:.1f} GB"
