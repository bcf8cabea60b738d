"""specllm as users install it: every package its code imports is one it declares, so that pip
installs a version the code works with rather than whatever another package let in;
scripts/setup.sh fails, in one line, where a step fails; and a build holds what specllm needs."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from specllm.models.registry import tomllib

ROOT = Path(__file__).resolve().parent.parent

# Imported by the code and installed by a declared dependency, which bounds it: jinja2 by
# llama-cpp-python (chat templates are compiled as its formatter does), starlette by fastapi,
# click by typer (before typer carried its own copy).
PROVIDED_BY_DEPENDENCIES = {"starlette", "click"}


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


# --- builds ---------------------------------------------------------------------------------------

# The package's data files, as the built package holds them (models.toml: copied in by setup.py).
PACKAGE_DATA = ("bench/prompts.jsonl", "serve/web/index.html", "models/models.toml", "py.typed")
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
