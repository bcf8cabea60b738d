"""Reading the chat's messages. On a terminal, prompt_toolkit's line editor (it runs on Linux,
macOS and Windows alike, with no readline or select on stdin): arrow keys, history kept in a
file across sessions, a bracketed paste or lines pasted at once arrive as one message, and a line
ending in a backslash continues on the next. From a pipe, plain lines.

Both readers give the same answers: read() returns the next message, None to quit (Ctrl-D or
end of input, or Ctrl-C twice at an empty prompt), or "" after a Ctrl-C at the prompt, whose
`notice` then says what to print (None: nothing). A terminal's read(default) starts with that
text typed in, to edit or send.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from prompt_toolkit import PromptSession
from prompt_toolkit.history import FileHistory, History, InMemoryHistory
from prompt_toolkit.key_binding import KeyBindings
from prompt_toolkit.keys import Keys

from specllm.files import state_dir

PROMPT = "> "
CONTINUATION = ". "
ASK_AGAIN = "(press Ctrl-C again or type /exit to quit)"


def history_file() -> Path:
    return state_dir() / "history"


def message_reader(interactive: bool | None = None):
    """The terminal reader when stdin and stdout are terminals, else the plain one."""
    if interactive is None:
        interactive = sys.stdin.isatty() and sys.stdout.isatty()
    return TerminalReader(history_file()) if interactive else PlainReader()


class _CtrlC:
    """Ctrl-C at the prompt: a typed line is discarded; the first one at an empty prompt asks,
    the second quits."""

    def __init__(self):
        self.armed = False
        self.notice: str | None = None
        self.history_note: str | None = None  # why the history is not kept, if it is not

    def interrupted(self, typed: bool, ask: str, discarded: str | None) -> str | None:
        if self.armed and not typed:
            return None
        self.armed = not typed
        self.notice = ask if self.armed else discarded
        return ""


class PlainReader(_CtrlC):
    """Lines from a pipe (or a terminal without the line editor): a line ending in a backslash
    continues on the next."""

    def read(self, default: str = "") -> str | None:
        lines: list[str] = []
        try:
            lines.append(input(PROMPT))
            while lines[-1].endswith("\\"):
                lines[-1] = lines[-1][:-1]
                lines.append(input(""))
        except EOFError:
            # The input ended in a continued message ("...\\" on its last line): the message is
            # sent as it is, not dropped unsaid; the next read() ends the chat.
            return "\n".join(lines) if lines else None
        except KeyboardInterrupt:
            return self.interrupted(False, "\n" + ASK_AGAIN, "\n")
        self.armed = False
        return "\n".join(lines)


class TerminalReader(_CtrlC):
    def __init__(self, history: Path):
        super().__init__()
        try:
            history.parent.mkdir(parents=True, exist_ok=True)
            kept: History = QuietFileHistory(str(history))
        except OSError as e:
            self.history_note = f"history is not kept: cannot create {history.parent} ({e.strerror or e})"
            kept = InMemoryHistory()
        self.typed = False
        self.session: PromptSession[str] = PromptSession(
            PROMPT, prompt_continuation=CONTINUATION, history=kept, key_bindings=self._bindings()
        )

    def read(self, default: str = "") -> str | None:
        self.typed = False
        try:
            text = self.session.prompt(default=default)
        except EOFError:  # Ctrl-D at an empty prompt
            return None
        except KeyboardInterrupt:
            # prompt_toolkit has already ended the line: nothing to say when a typed line goes
            return self.interrupted(self.typed, ASK_AGAIN, None)
        self.armed = False
        return text

    def _bindings(self) -> KeyBindings:
        bindings = KeyBindings()

        @bindings.add("enter")
        def _enter(event):
            buffer = event.current_buffer
            if buffer.text.endswith("\\"):  # wherever the cursor is, as Enter sends the whole line
                buffer.cursor_position = len(buffer.text)
                buffer.delete_before_cursor()
                buffer.newline(copy_margin=False)
            elif any(k.key != Keys.CPRResponse for k in event.key_processor.input_queue):
                # more keys already arrived with this Enter: lines pasted at once (a terminal
                # without bracketed paste), one message
                buffer.newline(copy_margin=False)
            else:
                buffer.validate_and_handle()

        @bindings.add("escape", "enter")  # Alt-Enter: a new line in the message
        def _newline(event):
            event.current_buffer.newline(copy_margin=False)

        @bindings.add("c-c")
        def _interrupt(event):
            self.typed = bool(event.current_buffer.text)
            event.app.exit(exception=KeyboardInterrupt, style="class:aborting")

        return bindings


class QuietFileHistory(FileHistory):
    """A history file that cannot be read or written (no permission, a full disk) costs the
    history, not the chat."""

    def load_history_strings(self):
        try:
            yield from super().load_history_strings()
        except OSError:
            return

    def store_string(self, string: str) -> None:
        if not _is_utf8(string):
            # Bytes a terminal sent that are not UTF-8 (a Latin-1 terminal): the message is refused
            # as such, and written here it was prompt_toolkit's traceback ("surrogates not allowed").
            # It stays in this session's history.
            return
        with contextlib.suppress(OSError):
            # private from the start, as shells keep theirs: it holds every message typed
            os.close(os.open(self.filename, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
            super().store_string(string)


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
