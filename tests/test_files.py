"""Writing output files (chat's /save, bench --json): nothing half-written, and never a file put
in the place of a device, a FIFO or a symlink."""

import os
import stat

import pytest

from specllm.errors import SpecllmError
from specllm.files import check_writable, write_text_atomic


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
