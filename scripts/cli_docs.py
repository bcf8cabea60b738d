"""Write docs/cli.md from the installed CLI's own help.

    python scripts/cli_docs.py           # rewrite docs/cli.md
    python scripts/cli_docs.py --check   # exit 1 if docs/cli.md is not what this would write

The help is taken from the `specllm` command as a user runs it (`python -m specllm`, in a
subprocess), so this does not depend on where in the package the Typer app lives. It is rendered
at a fixed width, without colour, with no SPECLLM_* variable set (they would show as defaults),
so the page is the same on every machine and in every terminal.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI_MD = ROOT / "docs" / "cli.md"
WIDTH = 120
REGENERATE = "python scripts/cli_docs.py"

HEADER = f"""\
# Command-line reference

Every command's `--help`, as `specllm` prints it. This page is generated: do not edit it by hand;
after changing a command or an option, run `{REGENERATE}` (the tests check that it is current).
Each option can also be set by its environment variable, shown as `[env var: SPECLLM_...]`
(see [Configuration](../README.md#configuration)).
"""


def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECLLM_")}
    for name in ("FORCE_COLOR", "CLICOLOR_FORCE", "PY_COLORS", "TERMINAL_WIDTH", "LINES"):
        env.pop(name, None)
    env.update(COLUMNS=str(WIDTH), NO_COLOR="1", TERM="dumb", PYTHONIOENCODING="utf-8")
    return env


def help_text(*command: str) -> str:
    """`specllm COMMAND... --help`, at the fixed width, with trailing blanks removed."""
    proc = subprocess.run(
        [sys.executable, "-m", "specllm", *command, "--help"],
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=_environment(),
        cwd=ROOT,
    )
    if proc.returncode != 0:
        raise SystemExit(f"specllm {' '.join(command)} --help failed:\n{proc.stderr}")
    lines = [line.rstrip() for line in proc.stdout.splitlines()]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def commands(top_help: str) -> list[str]:
    """The command names listed in the Commands panel of `specllm --help`, in its order."""
    names, inside = [], False
    for line in top_help.splitlines():
        if "Commands" in line and line.lstrip().startswith("╭"):
            inside = True
        elif inside and line.lstrip().startswith("╰"):
            break
        elif inside:
            match = re.match(r"\s*│ (\S+)\s{2,}\S", line)
            if match:
                names.append(match.group(1))
    if not names:
        raise SystemExit("found no commands in `specllm --help`")
    return names


def render() -> str:
    top = help_text()
    parts = [
        HEADER,
        "Commands: " + ", ".join(f"[{c}](#specllm-{c})" for c in commands(top)) + ".\n",
        "## specllm\n",
        "```text\n" + top + "\n```\n",
    ]
    for name in commands(top):
        parts += [f"## specllm {name}\n", "```text\n" + help_text(name) + "\n```\n"]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write docs/cli.md from `specllm --help`.")
    parser.add_argument("--check", action="store_true", help="do not write; exit 1 if docs/cli.md is out of date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = CLI_MD.read_text(encoding="utf-8") if CLI_MD.exists() else None
        if current != text:
            print(f"docs/cli.md is out of date with the CLI's --help: run `{REGENERATE}`", file=sys.stderr)
            return 1
        return 0
    CLI_MD.parent.mkdir(parents=True, exist_ok=True)
    CLI_MD.write_text(text, encoding="utf-8")
    print(f"wrote {CLI_MD.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
