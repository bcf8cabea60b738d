"""The `specllm` command (and `python -m specllm`)."""

import os
import signal
import sys


def _exit_while_starting(signum, _frame):
    sys.stderr.write("interrupted\n" if signum == signal.SIGINT else "terminated\n")
    sys.stderr.flush()
    os._exit(128 + signum)


def main() -> None:
    """Run the command. Until its modules are imported (a fraction of a second, llama_cpp's
    mostly), Ctrl-C and SIGTERM end it with the line and exit code they get later, not with a
    traceback from the middle of an import."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _exit_while_starting)
    try:
        from specllm.cli.main import main as run_command
    except MemoryError:  # too little memory (`ulimit -v`) to import it: the command's own line, no traceback
        sys.stderr.write("error: out of memory\n")
        sys.exit(1)

    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C is KeyboardInterrupt again
    run_command()  # which handles SIGTERM its own way


if __name__ == "__main__":
    main()
