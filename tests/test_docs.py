"""The documentation: README.md as a short front door, docs/ for the rest, and nothing in them
(or in the code) that names a file, a command or an option the project does not have."""

from __future__ import annotations

import functools
import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"

# The project's own top-level folders: a path that starts with one of them is the project's and
# must exist; any other path (~/.cache/specllm/..., $XDG_CONFIG_HOME/..., OUTDIR/...) is the user's.
PROJECT_DIRS = ("specllm", "tests", "benchmarks", "scripts", "docs", ".ci")
# In code, only paths to files of these kinds are taken for references to the project's files
# (code also builds paths inside caches and prints ratios such as "specllm/llama.cpp").
SOURCE_SUFFIXES = (".py", ".md", ".sh", ".c", ".html", ".jsonl", ".toml", ".png", ".txt")

_PATH = re.compile(
    r"(?<![\w./~$%-])(?:\./)?((?:"
    + "|".join(re.escape(d) for d in PROJECT_DIRS)
    + r")/[\w.-]*[\w-](?:/[\w.-]*[\w-])*)/?"
)
_MD_NAME = re.compile(r"(?<![\w./~$%-])((?:\.\.?/)*[\w-][\w./-]*\.md)\b")
_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCE = re.compile(r"^(\s*)(```|~~~)(.*)$")


def _cli_docs():
    spec = importlib.util.spec_from_file_location("cli_docs", ROOT / "scripts" / "cli_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def _help(command: str | None) -> str:
    return _cli_docs().help_text(*([command] if command else []))


@functools.cache
def _option_names(command: str | None) -> frozenset[str]:
    """The option names (long, short and negative forms) in the first column of a help panel."""
    names = set()
    for line in _help(command).splitlines():
        if not line.startswith("│ -"):
            continue
        for word in line[1:].split():  # "--temperature,--temp  -t  <float>  0 is greedy."
            parts = word.split(",")
            if not all(re.fullmatch(r"-{1,2}[A-Za-z][\w-]*", part) for part in parts):
                break
            names.update(parts)
    return frozenset(names)


def _project_files() -> list[str]:
    """Tracked files and new ones not ignored, as paths relative to the root."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [p for p in out.splitlines() if (ROOT / p).exists()]


def _markdown_files() -> list[Path]:
    return [ROOT / p for p in _project_files() if p.endswith(".md")]


def _split_fences(text: str) -> tuple[str, list[tuple[str, str]]]:
    """The text outside fenced blocks (fenced lines blanked, so line numbers stay), and the
    blocks as (info string, body)."""
    prose, blocks, fence, info, body = [], [], None, "", []
    for line in text.splitlines():
        match = _FENCE.match(line)
        if fence is None and match:
            fence, info, body = match.group(2), match.group(3).strip(), []
            prose.append("")
        elif fence is not None and match and match.group(2) == fence and not match.group(3).strip():
            blocks.append((info, "\n".join(body)))
            fence = None
            prose.append("")
        elif fence is not None:
            body.append(line)
            prose.append("")
        else:
            prose.append(line)
    return "\n".join(prose), blocks


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*_~]|<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@functools.cache
def _anchors(path: Path) -> frozenset[str]:
    prose, _ = _split_fences(path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    anchors = set()
    for line in prose.splitlines():
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            slug = _slug(match.group(1))
            anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return frozenset(anchors)


def _local_links(path: Path) -> list[tuple[int, str]]:
    prose, _ = _split_fences(path.read_text(encoding="utf-8"))
    links = []
    for number, line in enumerate(prose.splitlines(), 1):
        for match in _LINK.finditer(line):
            target = match.group(1)
            if not re.match(r"[a-z][a-z0-9+.-]*:", target):  # not http:, mailto:, ...
                links.append((number, target))
    return links


def _missing_references(relative: str) -> list[str]:
    """The files and folders that `relative` names and the project does not have."""
    path = ROOT / relative
    text = path.read_text(encoding="utf-8", errors="replace")
    markdown = relative.endswith(".md")
    missing: list[str] = []
    reported: set[tuple[int, str]] = set()

    def report(number: int, name: str, what: str = "") -> None:
        if (number, name) not in reported:  # a link's target is also a path and a *.md name
            reported.add((number, name))
            missing.append(f"{relative}:{number}: {what}{name}")

    def exists(name: str, *bases: Path) -> bool:
        return any((base / name).exists() for base in bases)

    for number, line in enumerate(text.splitlines(), 1):
        if markdown:  # a link's label is words; its target is the reference
            line = _LINK.sub(lambda m: " " + m.group(1) + " ", line)
        for match in _PATH.finditer(line):
            name = match.group(1).rstrip(".")
            if not markdown and not name.endswith(SOURCE_SUFFIXES):
                continue
            if not exists(name, ROOT):
                report(number, name)
        for match in _MD_NAME.finditer(line):
            name = match.group(1)
            first = name.split("/")[0]
            if "/" in name and first not in PROJECT_DIRS and first not in (".", ".."):
                continue  # a user's path, e.g. OUTDIR/gpu_check.md
            if not markdown and "/" not in name:
                continue  # code names files it writes (gpu_check.md) by their bare names
            if not exists(name, ROOT, path.parent):
                report(number, name)
    if markdown:
        for number, target in _local_links(path):
            name = target.split("#")[0]
            if name and not exists(name, path.parent):
                report(number, name, "link ")
    return missing


def _readme_shell_lines() -> list[str]:
    """The command lines of README.md's sh blocks, continuation lines joined."""
    _, blocks = _split_fences(README.read_text(encoding="utf-8"))
    lines = []
    for info, body in blocks:
        if info.split()[:1] not in (["sh"], ["bash"], ["shell"], ["console"]):
            continue
        body = re.sub(r"\\\n\s*", " ", body)
        lines += [line.strip() for line in body.splitlines() if line.strip()]
    return lines


def _specllm_invocations(line: str) -> list[list[str]]:
    """Each `specllm ...` command of a shell line (pipes and lists split), as its arguments."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    segments, current = [], []
    for token in lexer:
        if token in ("|", "||", "&&", ";", "&"):
            segments.append(current)
            current = []
        else:
            current.append(token)
    segments.append(current)
    return [seg[1:] for seg in segments if seg and seg[0] == "specllm"]


def test_the_python_api_page_names_every_name_the_package_exports():
    import specllm

    page = (DOCS / "python-api.md").read_text(encoding="utf-8")
    for name in specllm.__all__:
        assert getattr(specllm, name) is not None
        assert re.search(rf"`(specllm\.)?{re.escape(name)}\b", page), f"docs/python-api.md does not name {name}"


def test_readme_is_a_front_door_of_at_most_250_lines():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail into docs/"


def test_cli_reference_is_what_the_cli_help_says_now():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "cli_docs.py"), "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr


def test_every_specllm_command_in_the_readme_is_a_real_command_with_real_options():
    commands = _cli_docs().commands(_help(None))
    invocations = [(line, args) for line in _readme_shell_lines() for args in _specllm_invocations(line)]
    assert len(invocations) >= 5, "README.md shows no specllm commands in sh blocks"
    problems = []
    for line, args in invocations:
        command = args[0] if args and not args[0].startswith("-") else None
        if command is not None and command not in commands:
            problems.append(f"{line!r}: no command {command!r} (commands: {', '.join(commands)})")
            continue
        for arg in args:
            if arg.startswith("-") and arg != "-":
                option = arg.split("=", 1)[0]
                if option not in _option_names(command):
                    problems.append(f"{line!r}: `specllm {command or ''}` has no option {option}")
    assert not problems, "\n".join(problems)


def test_readme_set_up_and_test_commands_are_the_ones_ci_runs():
    lines = _readme_shell_lines()
    commands = [line.split("#")[0].strip() for line in lines]
    assert "bash scripts/setup.sh" in commands
    assert (ROOT / "scripts" / "setup.sh").is_file()
    assert "python -m pytest" in commands
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    ci_commands = [line.strip() for line in ci if line.strip() and not line.lstrip().startswith("#")]
    assert "bash scripts/setup.sh" in ci_commands, ".ci/run does not set up as the README says"
    pytest_lines = [c for c in ci_commands if re.search(r"-m pytest\b", c)]
    assert pytest_lines, ".ci/run runs no tests"
    for command in pytest_lines:  # the same command, but for which python and -q
        words = [w for w in command.split() if w != "-q"]
        words[0] = re.sub(r"^python3?$", "python", words[0])
        assert " ".join(words) == "python -m pytest", f".ci/run runs {command!r}"


def test_no_file_names_a_document_or_path_the_project_does_not_contain():
    files = [p for p in _project_files() if p.endswith((".md", ".py", ".sh")) or p == ".ci/run"]
    assert "README.md" in files and "tests/test_docs.py" in files
    missing = [m for relative in files for m in _missing_references(relative)]
    assert not missing, "references to files the project does not have:\n" + "\n".join(missing)


def test_links_between_documents_lead_to_a_page_and_heading_that_exist():
    broken = []
    for path in _markdown_files():
        relative = path.relative_to(ROOT)
        for number, target in _local_links(path):
            name, _, anchor = target.partition("#")
            dest = (path.parent / name).resolve() if name else path
            if not dest.exists():
                broken.append(f"{relative}:{number}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{relative}:{number}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_readme_indexes_every_page_under_docs():
    readme_links = {(ROOT / t.split("#")[0]).resolve() for _, t in _local_links(README) if t.split("#")[0]}
    pages = [p for p in DOCS.rglob("*.md")]
    unlisted = [
        str(p.relative_to(ROOT))
        for p in pages
        if p.resolve() not in readme_links and p.parent.resolve() not in readme_links
    ]
    assert pages and not unlisted, f"README.md's index of docs/ lacks: {unlisted}"
