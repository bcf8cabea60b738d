"""`specllm serve` as a real process, for the tests of the command itself."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def serving(args: list, env: dict | None = None) -> Iterator[tuple[subprocess.Popen, list[str], str]]:
    """`python -m specllm ARGS` (a `serve` command with `--port 0`): yields the process, its stderr
    lines up to the startup line, and the server's URL; the process is killed at the end."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "specllm", *map(str, args)], stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        lines = []
        while not lines or not lines[-1].startswith("specllm serve:"):
            lines.append(proc.stderr.readline())
            assert lines[-1], "".join(lines)
        yield proc, lines, re.search(r"http://127\.0\.0\.1:\d+", lines[-1])[0]
    finally:
        proc.kill()
        proc.wait()
