"""Running a script of benchmarks/ as a user would: this Python, from the repository's root."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_benchmark(script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, f"benchmarks/{script}", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
