"""Writing output files (chat's /save, bench --json): nothing half-written, never a file put in
the place of a device, a FIFO or a symlink, nor one made read-only replaced. Reading the files a
user names (/load, --resume, --prompts, --models): nothing but a regular file, never a wait."""

import os
import shutil
import stat
import subprocess
import sys
import threading
from contextlib import contextmanager, suppress

import pytest

from specllm.errors import SpecllmError
from specllm.files import check_writable, read_text_file, write_text_atomic


def test_a_regular_file_is_replaced_whole(tmp_path):
    path = tmp_path / "out.json"
    path.write_text("old")
    write_text_atomic(path, "new")
    assert path.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["out.json"]


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o755])
def test_a_replaced_file_keeps_its_permissions(tmp_path, mode):
    """A transcript saved over one made private must stay private."""
    path = tmp_path / "chat.json"
    path.write_text("old")
    path.chmod(mode)
    write_text_atomic(path, "new")
    assert path.read_text() == "new" and stat.S_IMODE(path.stat().st_mode) == mode


@pytest.mark.parametrize("name", ["c" * 250 + ".json", "ü" * 125 + ".json"], ids=["ascii", "two-byte characters"])
def test_a_name_as_long_as_the_file_system_takes_is_written(tmp_path, name):
    """Its temporary file's name, longer still, was refused: /save said "File name too long"."""
    path = tmp_path / name
    assert len(os.fsencode(name)) == 255
    write_text_atomic(path, "new")
    write_text_atomic(path, "newer")
    assert path.read_text() == "newer" and [p.name for p in tmp_path.iterdir()] == [name]


def test_a_symlink_is_written_through_and_stays_a_link(tmp_path):
    real, link = tmp_path / "real.json", tmp_path / "link.json"
    real.write_text("old")
    link.symlink_to("real.json")
    write_text_atomic(link, "new")
    assert link.is_symlink() and real.read_text() == "new"


def test_a_character_device_is_written_in_place_not_replaced_by_a_file():
    """As root, a rename onto /dev/null would put a file where the device was."""
    write_text_atomic("/dev/null", "discarded")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    with pytest.raises(OSError) as error:  # a device that refuses the write says so
        write_text_atomic("/dev/full", "x" * 100_000)
    assert error.value.errno == 28 and stat.S_ISCHR(os.stat("/dev/full").st_mode)  # ENOSPC


def test_a_fifo_is_refused_and_left_as_it_is(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        write_text_atomic(fifo, "x")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and [p.name for p in tmp_path.iterdir()] == ["pipe"]
    with pytest.raises(SpecllmError, match="not a regular file"):
        check_writable(fifo, "--json")


@pytest.mark.parametrize("through", ["the file", "a symlink"])
def test_a_read_only_file_is_refused_and_kept_even_by_root(tmp_path, through):
    """The rename of an atomic write needs only the folder's permission: /save replaced a file
    made read-only (chmod 444) to keep it. Root may write any file, yet is held to its mode."""
    path = tmp_path / "chat.json"
    path.write_text("kept")
    path.chmod(0o444)
    named = path
    if through == "a symlink":
        named = tmp_path / "link.json"
        named.symlink_to(path.name)
    with pytest.raises(PermissionError, match="the file is read-only"):
        write_text_atomic(named, "new")
    with pytest.raises(SpecllmError, match=f"^cannot write {named}: the file is read-only$"):
        check_writable(named, "--json")  # bench --json says it in the same words
    assert path.read_text() == "kept" and stat.S_IMODE(path.stat().st_mode) == 0o444
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({"chat.json", named.name})  # no temporary file


def test_a_file_of_another_user_that_only_they_may_write_is_refused(tmp_path):
    """Writable by its owner, not by the one who saves: the rename would replace it all the same."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root, to give the file to another user, and setpriv, to drop root's override")
    path = tmp_path / "theirs.json"
    path.write_text("kept")
    os.chown(path, 65534, 65534)  # nobody's, mode 644
    caps = "-dac_override,-dac_read_search,-fowner"
    script = "import sys; from specllm.files import write_text_atomic; write_text_atomic(sys.argv[1], 'new')"
    proc = subprocess.run(
        ["setpriv", "--bounding-set", caps, "--inh-caps", caps, sys.executable, "-c", script, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and "the file is read-only" in proc.stderr, proc.stderr
    assert path.read_text() == "kept" and [p.name for p in tmp_path.iterdir()] == ["theirs.json"]


def test_a_regular_file_is_read_as_text(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_bytes("\ufeffcaf\u00e9\r\nnext\n".encode())
    assert read_text_file(path, "utf-8-sig") == "caf\u00e9\nnext\n"
    with pytest.raises(FileNotFoundError):
        read_text_file(tmp_path / "missing.jsonl")


@contextmanager
def freed_after(fifo, seconds: float = 5):
    """A read of `fifo` that waits for a writer gets one after `seconds`, writing nothing: such a
    regression then fails the test instead of hanging it."""

    def be_the_writer():
        with suppress(OSError):  # ENXIO: no reader waits
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    timer = threading.Timer(seconds, be_the_writer)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with freed_after(fifo), pytest.raises(OSError, match="it is a FIFO, not a regular file"):
        read_text_file(fifo)


@pytest.mark.parametrize(
    "path, kind",
    [("{tmp}", "a folder"), ("/dev/null", "a device")],  # /dev/zero too, but a regression would read it for ever
)
def test_a_folder_or_a_device_is_refused(tmp_path, path, kind):
    with pytest.raises(OSError, match=f"it is {kind}, not a regular file"):
        read_text_file(path.replace("{tmp}", str(tmp_path)))


def test_a_file_too_large_for_text_is_refused_before_it_is_read(tmp_path, monkeypatch):
    """A model file named by mistake as a prompts file or a saved chat would be read whole into
    memory (and fail as text only then)."""
    from specllm import files

    big = tmp_path / "model.gguf"
    with open(big, "wb") as f:
        f.truncate(files.TEXT_FILE_MAX_BYTES + 1)  # sparse: no disk space taken
    with pytest.raises(OSError, match=r"it holds 268\.4 MB, more than a text file of 268\.4 MB"):
        read_text_file(big)
    monkeypatch.setattr(files, "TEXT_FILE_MAX_BYTES", 1000)
    at_the_limit = tmp_path / "prompts.jsonl"
    at_the_limit.write_text("x" * 1000)
    assert read_text_file(at_the_limit) == "x" * 1000
    at_the_limit.write_text("x" * 1001)
    with pytest.raises(OSError, match="it holds 1.0 KB"):
        read_text_file(at_the_limit)
