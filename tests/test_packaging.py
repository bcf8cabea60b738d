"""specllm as users install it: every package its code imports is one it declares, so that pip
installs a version the code works with rather than whatever another package let in;
scripts/setup.sh fails, in one line, where a step fails; and the sdist and wheels built as pip and
`python -m build` build them hold what specllm needs and nothing else, and install a specllm that
works from any folder as this tree does (the slow tests: about a minute)."""

from __future__ import annotations

import ast
import http.client
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from serving import serving

from specllm.models.registry import tomllib

ROOT = Path(__file__).resolve().parent.parent

# Imported by the code and installed by a declared dependency, which bounds it: jinja2 by
# llama-cpp-python (chat templates are compiled as its formatter does), starlette by fastapi,
# click by typer (before typer carried its own copy), typing_extensions by pydantic (imported for
# type checkers only: engine/loop.py's Unpack).
PROVIDED_BY_DEPENDENCIES = {"starlette", "click", "typing_extensions"}


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return {_normalized(re.match(r"[A-Za-z0-9_.-]+", r).group()) for r in project["dependencies"]}


def _imported() -> set[str]:
    """The top-level packages that specllm's modules import, other than its own and the standard library's."""
    names = set()
    for path in (ROOT / "specllm").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"specllm"}


def test_every_package_the_code_imports_is_a_declared_dependency():
    distributions = importlib.metadata.packages_distributions()
    undeclared = {
        module
        for module in _imported() - PROVIDED_BY_DEPENDENCIES
        if _normalized(distributions.get(module, [module])[0]) not in _declared()
    }
    assert not undeclared, f"imported but not declared in pyproject.toml: {sorted(undeclared)}"


# A python for setup.sh: its pip installs at once (a rebuild of llama-cpp-python writes down the
# CFLAGS it got), and its llama-cpp-python has RPC until a pip install -e (specllm with its
# dependencies) has run where NO_RPC_AFTER_INSTALL is set, and AMX kernels until a rebuild where
# AMX_BUILT_IN is set.
STUB_PYTHON = """#!/bin/sh
case "$*" in
  *"pip install"*"-e "*) touch "$STUBS/installed" ;;
  *"pip install"*"--force-reinstall"*) echo "$CFLAGS" > "$STUBS/rebuilt" ;;
  "-c "*AMX*) [ -n "$AMX_BUILT_IN" ] && [ ! -e "$STUBS/rebuilt" ] && exit 0; exit 1 ;;
  "-c "*) [ -n "$NO_RPC_AFTER_INSTALL" ] && [ -e "$STUBS/installed" ] && exit 1 ;;
esac
exit 0
"""


def _run_setup(tmp_path, build_script: str, **env_vars: str) -> subprocess.CompletedProcess:
    """scripts/setup.sh on a machine that has the rest already (a llama-cpp-python with RPC, a
    Chromium), with this benchmarks/build_llama_cpp_tools.sh."""
    for folder in ("scripts", "benchmarks", "bin"):
        (tmp_path / folder).mkdir(parents=True)
    for script in ("setup.sh", "no_amx_flags.sh"):
        shutil.copy(ROOT / "scripts" / script, tmp_path / "scripts" / script)
    (tmp_path / "benchmarks" / "build_llama_cpp_tools.sh").write_text(build_script)
    stubs = tmp_path / "bin"
    for name, text in (("python", STUB_PYTHON), ("chromium", "#!/bin/sh\nexit 0\n")):
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "CMAKE_ARGS"}
    env.update(PYTHON=str(stubs / "python"), PATH=f"{stubs}{os.pathsep}{env['PATH']}", STUBS=str(stubs), **env_vars)
    return subprocess.run(["bash", "scripts/setup.sh"], cwd=tmp_path, env=env, capture_output=True, text=True)


def test_setup_fails_when_the_rpc_server_cannot_be_built(tmp_path):
    done = _run_setup(tmp_path, "echo 'no network' >&2; exit 1\n")
    assert done.returncode == 1
    assert "ggml-rpc-server:" not in done.stdout
    assert done.stderr.splitlines()[-1] == "error: could not build ggml-rpc-server (the output above says why)"


def test_setup_fails_when_installing_specllm_leaves_llama_cpp_without_rpc(tmp_path):
    done = _run_setup(tmp_path, "echo /built\n", NO_RPC_AFTER_INSTALL="1")
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        "error: installing specllm upgraded llama-cpp-python to a build without RPC: run this script again"
    )
    assert _run_setup(tmp_path / "with_rpc", "echo /built\n").stdout == "ggml-rpc-server: /built/ggml-rpc-server\n"


def test_setup_rebuilds_a_llama_cpp_python_that_has_the_amx_kernels_without_them(tmp_path):
    flags = subprocess.run(
        ["bash", ROOT / "scripts" / "no_amx_flags.sh"], capture_output=True, text=True
    ).stdout.split()
    done = _run_setup(tmp_path, "echo /built\n", AMX_BUILT_IN="1")
    assert done.returncode == 0, done.stderr
    rebuilt = tmp_path / "bin" / "rebuilt"
    if flags:  # x86-64, with a compiler that takes them
        assert set(flags) <= set(rebuilt.read_text().split())
    else:  # nothing to build without: the build is kept
        assert not rebuilt.exists()
    kept = _run_setup(tmp_path / "no_amx", "echo /built\n")
    assert kept.returncode == 0, kept.stderr
    assert not (tmp_path / "no_amx" / "bin" / "rebuilt").exists()


def test_no_amx_flags_are_given_only_where_the_compiler_takes_them():
    script = ROOT / "scripts" / "no_amx_flags.sh"
    with_cc = subprocess.run(["bash", script], capture_output=True, text=True)
    without = subprocess.run(["bash", script], capture_output=True, text=True, env=os.environ | {"CC": "false"})
    assert with_cc.returncode == without.returncode == 0
    assert without.stdout == ""
    if os.uname().machine in ("x86_64", "amd64") and shutil.which("cc"):
        assert with_cc.stdout.split() == ["-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16"]


# --- builds: the sdist, the wheel, and specllm installed from it ----------------------------------

# The package's data files, as the built package holds them (models.toml: copied in by setup.py).
PACKAGE_DATA = ("bench/prompts.jsonl", "serve/web/index.html", "models/models.toml", "py.typed")
SDIST_TOP = {"PKG-INFO", "setup.cfg", "pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "models.toml"}
EXT_SUFFIX = sysconfig.get_config_var("EXT_SUFFIX")


def _source_copy(dest: Path) -> Path:
    """What a build of this tree reads, copied as it is here: the built sampler, caches and all,
    as a user's checkout has them after `pip install -e .` and a test run."""
    dest.mkdir(parents=True)
    for name in ("setup.py", "pyproject.toml", "MANIFEST.in", "README.md", "models.toml"):
        shutil.copy(ROOT / name, dest / name)
    for folder in ("specllm", "tests"):
        shutil.copytree(ROOT / folder, dest / folder)
    return dest


def _checked(*command, **kwargs) -> str:
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{command}: {done.stderr}"
    return done.stdout


def _build_py(tree: Path) -> Path:
    """setup.py's build_py (the package's modules and data files, not the compiled sampler) into
    tree/build/lib.PLATFORM, where build_ext puts the sampler and a second build finds what the
    first left; returns the built package."""
    _checked(sys.executable, "setup.py", "-q", "build_py", cwd=tree)
    (build_lib,) = (tree / "build").glob("lib*")
    return build_lib / "specllm"


def test_the_built_package_holds_its_data_files_and_not_the_samplers_c_source(tmp_path):
    built = _build_py(_source_copy(tmp_path / "tree"))
    assert [name for name in PACKAGE_DATA if not (built / name).is_file()] == []
    assert (built / "models" / "models.toml").read_bytes() == (ROOT / "models.toml").read_bytes()
    assert not (built / "engine" / "_sampler.c").exists()


def test_a_build_in_a_built_tree_leaves_out_a_module_the_source_no_longer_has(tmp_path):
    tree = _source_copy(tmp_path / "tree")
    (tree / "specllm" / "leftover.py").write_text("")
    built = _build_py(tree)
    assert (built / "leftover.py").is_file()
    compiled = built / "engine" / f"_sampler{EXT_SUFFIX}"  # as build_ext left it, of this source
    compiled.write_bytes(b"")
    (tree / "specllm" / "leftover.py").unlink()
    _build_py(tree)
    assert not (built / "leftover.py").exists()
    assert (built / "__init__.py").is_file() and (built / "models" / "models.toml").is_file()
    assert compiled.is_file()  # not compiled again while its source is unchanged


def _venv(path: Path, system_site_packages: bool) -> Path:
    """A virtual environment of this Python; returns its bin folder."""
    _checked(sys.executable, "-m", "venv", *(["--system-site-packages"] if system_site_packages else []), path)
    return path / "bin"


BUILD = "import sys; from setuptools import build_meta; print(getattr(build_meta, sys.argv[1])(sys.argv[2]))"


@dataclass(frozen=True)
class Built:
    sdist: Path
    wheel: Path
    wheel_without_cc: Path  # built where the C compiler fails


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Built:
    """The sdist of a copy of this tree and the wheels built from it, as `python -m build` and pip
    make them: by the setuptools that pyproject.toml asks for, from the package index (or pip's
    cache), in an environment of its own."""
    tmp = tmp_path_factory.mktemp("built")
    builder = _venv(tmp / "builder", system_site_packages=False)
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["build-system"]["requires"]
    _checked(builder / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check", *requires)
    out = tmp / "dist"
    sdist = (
        out / _checked(builder / "python", "-c", BUILD, "build_sdist", out, cwd=_source_copy(tmp / "tree")).split()[-1]
    )
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp / "unpacked", filter="data")
    unpacked = tmp / "unpacked" / sdist.name.removesuffix(".tar.gz")

    def wheel(into: Path, **env_vars: str) -> Path:
        shutil.rmtree(unpacked / "build", ignore_errors=True)
        name = _checked(builder / "python", "-c", BUILD, "build_wheel", into, cwd=unpacked, env=os.environ | env_vars)
        return into / name.split()[-1]

    return Built(sdist, wheel(out / "with_cc"), wheel(out / "without_cc", CC="false"))


@pytest.mark.slow
def test_the_sdist_holds_the_package_the_c_source_and_models_toml_and_nothing_else(built):
    with tarfile.open(built.sdist) as archive:
        names = {Path(*Path(m.name).parts[1:]) for m in archive.getmembers() if m.isfile()}
    top = {name.parts[0] for name in names}
    assert top == SDIST_TOP | {"specllm", "specllm.egg-info"}
    source = ROOT / "specllm"
    expected = {
        Path("specllm", path.relative_to(source))
        for path in source.rglob("*")
        if path.suffix in (".py", ".pyi", ".c") and "__pycache__" not in path.parts
    } | {Path("specllm", name) for name in PACKAGE_DATA if name != "models/models.toml"}
    assert {name for name in names if name.parts[0] == "specllm"} == expected


def _wheel_files(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return {name for name in archive.namelist() if not name.startswith("specllm-")}


@pytest.mark.slow
def test_the_wheel_holds_the_package_its_data_and_the_compiled_sampler_and_not_its_c_source(built):
    files = _wheel_files(built.wheel)
    assert [name for name in PACKAGE_DATA if f"specllm/{name}" not in files] == []
    assert f"specllm/engine/_sampler{EXT_SUFFIX}" in files
    assert "specllm/engine/_sampler.c" not in files
    assert _wheel_files(built.wheel_without_cc) == files - {f"specllm/engine/_sampler{EXT_SUFFIX}"}


def _installed(wheel: Path, venv: Path) -> Path:
    """specllm installed from `wheel` in a new virtual environment that sees this Python's packages
    (llama-cpp-python among them, which takes many minutes to build); returns its bin folder."""
    bin_dir = _venv(venv, system_site_packages=True)
    _pip_install(bin_dir, wheel)
    return bin_dir


def _pip_install(bin_dir: Path, wheel: Path, *options: str) -> None:
    _checked(bin_dir / "python", "-m", "pip", "install", "-q", "--no-deps", "--no-index", *options, wheel)


@pytest.fixture(scope="module")
def installed(built, tmp_path_factory) -> Path:
    return _installed(built.wheel, tmp_path_factory.mktemp("installed") / "venv")


def _elsewhere(tmp_path: Path) -> dict:
    """Where an installed specllm runs in these tests (and this tree's, to compare): a folder of its
    own, no PYTHONPATH (which could bring this tree's package in), a cache of its own."""
    (tmp_path / "cwd").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"SPECLLM_CACHE": str(tmp_path / "cache")}
    return {"cwd": tmp_path / "cwd", "env": env}


def _here(*args, env: dict, **_) -> str:
    """specllm ARGS as this tree's package runs it."""
    return _checked(sys.executable, "-m", "specllm", *args, cwd=ROOT, env=env)


@pytest.mark.slow
def test_the_installed_wheel_says_its_version_and_reads_its_own_files(installed, tmp_path):
    from specllm._version import __version__

    where = _elsewhere(tmp_path)
    location = _checked(installed / "python", "-c", "import specllm; print(specllm.__file__)", **where)
    assert location.startswith(str(installed.parent))
    assert _checked(installed / "specllm", "--version", **where).splitlines()[0] == f"specllm {__version__}"
    assert f"Version: {__version__}" in _checked(installed / "python", "-m", "pip", "show", "specllm").splitlines()
    assert "sampler: compiled (C)" in _checked(installed / "specllm", "doctor", **where).splitlines()
    assert _checked(installed / "specllm", "models", **where) == _here("models", **where)
    assert "Usage: specllm" in _checked(installed / "python", "-m", "specllm", "--help", **where)


# Sampled output is compared only where the drafts do not depend on timing, as auto's do.
RUNS = [(drafter, ("--temperature", "0")) for drafter in ("ngram", "model", "auto")] + [
    (drafter, ("--temperature", "0.8", "--seed", "3")) for drafter in ("ngram", "model")
]


def _run_args(tiny_models, drafter: str, sampling) -> list:
    return ["run", "--target", tiny_models.target, "--draft", tiny_models.draft, "--drafter", drafter, *sampling,
            "-n", "12", "Hello"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(("drafter", "sampling"), RUNS)
def test_the_installed_wheel_generates_what_this_tree_does(installed, tiny_models, tmp_path, drafter, sampling):
    args, where = _run_args(tiny_models, drafter, sampling), _elsewhere(tmp_path)
    assert _checked(installed / "specllm", *args, **where) == _here(*args, **where)


@pytest.mark.slow
def test_the_installed_wheel_benches_on_its_built_in_prompts(installed, tiny_models, tmp_path):
    report = tmp_path / "bench.json"
    models = ["--target", tiny_models.target, "--draft", tiny_models.draft]
    options = ["--drafter", "ngram", "--per-category", "1", "--rounds", "1", "-n", "4", "--json", report]
    _checked(installed / "specllm", "bench", *models, *options, **_elsewhere(tmp_path))
    prompts = resources.files("specllm.bench").joinpath("prompts.jsonl").read_text(encoding="utf-8")
    categories = {json.loads(line)["category"] for line in prompts.splitlines()}
    assert set(json.loads(report.read_text())["results"][0]["categories"]) == categories


def _request(url: str, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(urlsplit(url).netloc, timeout=60)
    conn.request(method, path, body=body and json.dumps(body), headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    reply = response.status, response.read()
    conn.close()
    return reply


@pytest.mark.slow
def test_the_installed_wheel_serves_its_chat_page_and_completions(installed, tiny_models, tmp_path):
    args = ["serve", "--target", tiny_models.target, "--draft", tiny_models.draft, "--port", "0"]
    with serving(args, python=str(installed / "python"), **_elsewhere(tmp_path)) as (_, _, url):
        assert _request(url, "GET", "/") == (200, (ROOT / "specllm" / "serve" / "web" / "index.html").read_bytes())
        status, body = _request(url, "POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 4})
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 4


@pytest.mark.slow
def test_a_reinstalled_wheel_works_and_uninstalling_it_leaves_nothing(built, tmp_path):
    venv = tmp_path / "venv"
    bin_dir, where = _installed(built.wheel, venv), _elsewhere(tmp_path)
    _checked(bin_dir / "specllm", "models", **where)  # which writes the modules' bytecode caches
    _pip_install(bin_dir, built.wheel, "--force-reinstall")
    _checked(bin_dir / "specllm", "models", **where)
    _checked(bin_dir / "python", "-m", "pip", "uninstall", "-y", "-q", "specllm")
    assert [path for path in venv.rglob("*") if "specllm" in path.name.lower()] == []


@pytest.mark.slow
def test_a_wheel_built_without_a_c_compiler_samples_in_numpy_the_same_tokens(built, tiny_models, tmp_path):
    bin_dir, where = _installed(built.wheel_without_cc, tmp_path / "venv"), _elsewhere(tmp_path)
    doctor = _checked(bin_dir / "specllm", "doctor", **where).splitlines()
    assert any(line.startswith("sampler: numpy") for line in doctor), doctor
    args = _run_args(tiny_models, "model", ("--temperature", "0.8", "--seed", "3"))
    assert _checked(bin_dir / "specllm", *args, **where) == _here(*args, **where)
