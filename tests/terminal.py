"""A real process on a pseudo-terminal, for tests that need what a user's terminal gives: Rich's
live view, readline, Ctrl-C as SIGINT."""

from __future__ import annotations

import fcntl
import os
import re
import struct
import subprocess
import sys
import termios
import threading
import time

ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][0-9A-Za-z]|\x1b[=>]")

# Start the command in a new session whose controlling terminal is the pty, so that ^C typed
# into the terminal becomes SIGINT for it, as in a real terminal.
LAUNCH = "import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); os.execv(sys.argv[1], sys.argv[1:])"

# As LAUNCH, but the command runs as a shell's foreground job: in a process group of its own, so
# that Ctrl-Z stops it (the kernel does not stop a group with no parent in its session, such as
# the session's own). Stopped, it writes STOPPED and takes the terminal back; a line typed then
# (`fg`) continues the job. Its exit code is the job's, 128 + the signal where one ended it.
STOPPED = "[job stopped]"
JOB_CONTROL = f"""
import fcntl, os, signal, sys, termios
fcntl.ioctl(0, termios.TIOCSCTTY, 0)
signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # so that the shell may hand the terminal over
job = os.fork()
if job == 0:
    os.setpgid(0, 0)
    os.tcsetpgrp(0, os.getpgrp())
    signal.signal(signal.SIGTTOU, signal.SIG_DFL)
    os.execv(sys.argv[1], sys.argv[1:])
while True:
    _, status = os.waitpid(job, os.WUNTRACED)
    if not os.WIFSTOPPED(status):
        sys.exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
    os.tcsetpgrp(0, os.getpgrp())
    os.write(1, b"\\r\\n{STOPPED}\\r\\n")
    sys.stdin.readline()
    os.tcsetpgrp(0, job)
    os.killpg(job, signal.SIGCONT)
"""


class Terminal:
    """`python -m specllm ARGS` on a pseudo-terminal; `expect` waits for a regex in its output,
    ANSI removed; `raw` is everything it wrote."""

    def __init__(self, args: list, rows: int = 30, cols: int = 120, env: dict | None = None, job_control: bool = False):
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        base = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS", "LINES")}
        env = {**base, "TERM": "xterm-256color", **(env or {})}
        launch = JOB_CONTROL if job_control else LAUNCH
        command = [sys.executable, "-c", launch, sys.executable, "-m", "specllm", *map(str, args)]
        self.proc = subprocess.Popen(command, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True)
        os.close(slave)
        self.fd, self.raw, self.pos = master, b"", 0
        self.done = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.fd, 65536)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            self.raw += data
        self.done.set()

    @property
    def text(self) -> str:
        return ANSI.sub("", self.raw.decode("utf-8", errors="replace")).replace("\r", "")

    def expect(self, pattern: str, timeout: float = 60) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = re.compile(pattern).search(self.text, self.pos)
            if match:
                self.pos = match.end()
                return match
            if self.done.is_set():
                break
            time.sleep(0.02)
        raise AssertionError(f"no {pattern!r} in the output after:\n{self.text[self.pos :][-3000:]}")

    def send(self, data: str) -> None:
        os.write(self.fd, data.encode())

    def wait(self, timeout: float = 30) -> int:
        rc = self.proc.wait(timeout=timeout)
        self.done.wait(5)
        os.close(self.fd)
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def output(self, timeout: float = 60) -> str:
        """Wait for the process to finish successfully; everything it wrote, escape codes kept."""
        rc = self.wait(timeout)
        text = self.raw.decode("utf-8", errors="replace")
        assert rc == 0, text
        return text
