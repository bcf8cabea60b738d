"""specllm as pip installs it: every package its code imports is one it declares, so that pip
installs a version the code works with rather than whatever another package let in."""

from __future__ import annotations

import ast
import importlib.metadata
import re
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
