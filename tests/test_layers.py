"""The package's layering (docs/architecture.md), checked on every import, lazy ones included:
layers import only downward, siblings never import each other, llama/ alone imports llama_cpp,
and Rich is imported only by the views and the command line."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "specllm"

# Lowest first. Groups in one layer are siblings. The package's own __init__ (specllm.load and the
# lazy public names) sits above the features and below the command line that uses it.
LAYERS = [
    {"base": ("errors", "files", "report", "suspend", "_version")},
    {"llama": ("llama",)},
    {"engine": ("engine",), "models": ("models",)},
    {"chat": ("chat",), "serve": ("serve",), "bench": ("bench",)},
    {"api": ("__init__",)},
    {"cli": ("cli", "__main__")},
]
RICH_ALLOWED = ("specllm.chat.view", "specllm.chat.repl", "specllm.bench.view", "specllm.cli")


def group_of(module: str) -> tuple[int, str]:
    """(layer, group) of a dotted module name inside specllm."""
    parts = module.split(".")
    first = parts[1] if len(parts) > 1 else "__init__"
    for rank, groups in enumerate(LAYERS):
        for group, names in groups.items():
            if first in names:
                return rank, group
    raise AssertionError(f"{module} is in no layer: add it to LAYERS and to docs/architecture.md")


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, root: Path = PACKAGE) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in a file, relative ones resolved."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            # `from specllm import engine` imports the subpackage, not the package's __init__ API
            if target == "specllm":
                found += [(node.lineno, _submodule_or_api(alias.name)) for alias in node.names]
            else:
                found.append((node.lineno, target))
    return found


def _submodule_or_api(name: str) -> str:
    """`from specllm import X`: the subpackage or module X, else a name of the package's API."""
    exists = (PACKAGE / name).is_dir() or (PACKAGE / f"{name}.py").is_file()
    return f"specllm.{name}" if exists else "specllm"


def violations(path: Path, root: Path = PACKAGE) -> list[str]:
    importer = module_name(path, root)
    rank, group = group_of(importer)
    found = []
    for line, target in imports(path, root):
        where = f"{path.relative_to(root.parent)}:{line}: {importer} imports {target}"
        top = target.split(".")[0]
        if top == "llama_cpp" and group != "llama":
            found.append(f"{where} (only specllm.llama talks to llama.cpp)")
        if top == "rich" and not importer.startswith(RICH_ALLOWED):
            found.append(f"{where} (Rich lives in the views and the command line)")
        if top != "specllm":
            continue
        their_rank, their_group = group_of(target)
        if their_rank > rank or (their_rank == rank and their_group != group):
            found.append(f"{where} (a layer imports only downward, never a sibling)")
    return found


def test_every_module_imports_only_downward_and_never_a_sibling():
    found = [v for path in sorted(PACKAGE.rglob("*.py")) for v in violations(path)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    ("importer", "line", "why"),
    [
        ("engine/loop.py", "from specllm.chat import session", "downward"),
        ("serve/server.py", "from specllm.chat.session import ChatSession", "sibling"),
        ("engine/policy.py", "import llama_cpp", "llama.cpp"),
        ("engine/text.py", "from rich.text import Text", "Rich"),
        ("models/hub.py", "from ..cli import main", "downward"),
    ],
)
def test_a_planted_upward_or_sideways_import_is_caught(tmp_path, importer, line, why):
    """The check itself bites: the same file with one bad import added is reported."""
    copy = tmp_path / "specllm" / importer
    copy.parent.mkdir(parents=True)
    copy.write_text((PACKAGE / importer).read_text() + f"\n{line}\n")
    before = violations(PACKAGE / importer)
    added = [v for v in violations(copy, tmp_path / "specllm") if v not in before]
    assert len(added) == 1 and why in added[0], added
