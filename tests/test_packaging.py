"""specllm as users install it: every package its code imports is one it declares, so that pip
installs a version the code works with rather than whatever another package let in; and
scripts/setup.sh fails, in one line, where a step fails."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from specllm.models.registry import tomllib

ROOT = Path(__file__).resolve().parent.parent

# Imported by the code and installed by a declared dependency, which bounds it: jinja2 by
# llama-cpp-python (chat templates are compiled as its formatter does), starlette by fastapi,
# click by typer (before typer carried its own copy).
PROVIDED_BY_DEPENDENCIES = {"jinja2", "starlette", "click"}


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


def test_setup_fails_when_the_rpc_server_cannot_be_built(tmp_path):
    # set up as setup.sh finds a machine that has the rest already: a python whose llama-cpp-python
    # has RPC and whose pip installs at once (a stub answering success), and a Chromium
    for script in ("scripts/setup.sh", "benchmarks/build_llama_cpp_tools.sh"):
        (tmp_path / script).parent.mkdir(exist_ok=True)
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    (tmp_path / "benchmarks" / "build_llama_cpp_tools.sh").write_text("echo 'no network' >&2; exit 1\n")
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name in ("python", "chromium"):
        (stubs / name).write_text("#!/bin/sh\nexit 0\n")
        (stubs / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "CMAKE_ARGS"}
    env.update(PYTHON=str(stubs / "python"), PATH=f"{stubs}{os.pathsep}{env['PATH']}")
    done = subprocess.run(["bash", "scripts/setup.sh"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 1
    assert "ggml-rpc-server:" not in done.stdout
    assert done.stderr.splitlines()[-1] == "error: could not build ggml-rpc-server (the output above says why)"
