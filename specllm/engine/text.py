"""Streaming detokenization: token bytes in, printable text out.

A character can span several tokens, and a model can emit bytes that are not UTF-8 at all. The
incremental decoder holds back an incomplete sequence until it completes and replaces invalid
bytes with U+FFFD, so the stream never shows broken UTF-8. Text that could still become a stop
string is held back too, so a stop string is never shown.
"""

import codecs
import time
from collections.abc import Iterable

from specllm.errors import SpecllmError


def check_utf8(text: str | None, what: str) -> None:
    """Python keeps bytes that are not UTF-8 (in arguments, stdin in a C locale, "\\ud800" in
    JSON) as lone surrogates, which no tokenizer takes and no UTF-8 file can hold: say so now."""
    try:
        (text or "").encode("utf-8")
    except UnicodeEncodeError as e:
        raise SpecllmError(f"{what} is not valid UTF-8 text (at character {e.start + 1})") from None


def marker_start(text: str, marker: str) -> int:
    """The length of the longest end of `text` that is a beginning of `marker`: what to hold back
    while the text streams, until it is known whether the marker follows."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


# C0 controls but newline and tab, DEL and C1 controls: on a terminal the model's escape sequence
# would be obeyed (move the cursor, clear the screen, set the window title, write the clipboard),
# so each is shown as a symbol (ESC as ␛, a carriage return as ␍).
_CONTROLS = {c: chr(0x2400 + c) for c in range(0x20) if chr(c) not in "\n\t"}
_CONTROLS.update({0x7F: "\u2421", **{c: "\ufffd" for c in range(0x80, 0xA0)}})


def shown(text: str) -> str:
    """Text as a terminal may show it: its control characters made visible. For a model's text,
    and for any line that quotes what a model or a user wrote (a file name, a template's error)."""
    return text.replace("\r\n", "\n").translate(_CONTROLS)


_LINE_BREAKS = str.maketrans({"\n": "\u2424", "\t": "\u2409"})


def shown_on_one_line(text: str) -> str:
    """A name, or a line that quotes one, as shown(), and its newlines and tabs as symbols too (␤,
    ␉): a file name may hold either, and would split its row of a table or its line."""
    return shown(text).translate(_LINE_BREAKS)


class TextStream:
    """`min_indent` and `line_seconds` are an editor's limits on a completion, as llama-server
    applies them (its n_indent and t_max_predict_ms): the text ends before the first character of
    a line after the first that is indented by fewer than `min_indent` spaces or tabs (a blank
    line included), and at the first token with a line break once `line_seconds` have passed
    since the first token."""

    def __init__(self, stop: Iterable[str] = (), min_indent: int = 0, line_seconds: float | None = None):
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = tuple(s for s in stop if s)
        self._min_indent, self._line_seconds = min_indent, line_seconds
        self.text = ""  # everything decoded so far, cut at a stop string once one is seen
        self._shown = 0  # how much of self.text has been handed out
        self._scanned = 0  # min_indent: the text read so far,
        self._indent: int | None = None  # and the indentation of the line it is in (None: in its text)
        self._started: float | None = None  # when the first token came (line_seconds)
        self.stopped = False  # a stop string was seen, or a limit reached
        self.stop_string: str | None = None  # the stop string the text was cut at
        self.limited = False  # stopped by min_indent or line_seconds, not a stop string

    def push(self, data: bytes) -> str:
        """Feed a token's bytes; return the new text that is safe to show."""
        if self.stopped:
            return ""
        new = self._decoder.decode(data)
        self.text += new
        self._cut_at_stop()
        if not self.stopped and (self._min_indent or self._line_seconds is not None):
            self._apply_limits("\n" in new)
        return self._release(len(self.text) if self.stopped else self._safe_end())

    def _apply_limits(self, line_break: bool) -> None:
        if self._started is None:
            self._started = time.monotonic()
        if self._min_indent:
            self._cut_at_outdent()
        seconds = self._line_seconds
        if not self.stopped and seconds is not None and line_break and time.monotonic() - self._started > seconds:
            self.stopped = self.limited = True

    def _cut_at_outdent(self) -> None:
        """End the text before the first character of a new line indented less than min_indent
        (a blank line's first character is its line break). Each character is read once."""
        text = self.text
        for at in range(self._scanned, len(text)):
            char = text[at]
            if self._indent is None:  # in a line's text (the first line is never judged)
                if char == "\n":
                    self._indent = 0
            elif char in " \t":
                self._indent += 1
            elif self._indent < self._min_indent:
                self.text, self.stopped, self.limited = text[:at], True, True
                return
            else:
                self._indent = 0 if char == "\n" else None
        self._scanned = len(text)

    def finish(self) -> str:
        """End of generation: flush whatever is held back (an unfinished byte sequence becomes U+FFFD)."""
        if not self.stopped:
            self.text += self._decoder.decode(b"", final=True)
            self._cut_at_stop()
        return self._release(len(self.text))

    def _cut_at_stop(self) -> None:
        hits = [(at, stop) for stop in self._stop if (at := self.text.find(stop, self._shown)) >= 0]
        if hits:
            at, self.stop_string = min(hits, key=lambda hit: hit[0])  # ties: the first given
            self.text = self.text[:at]
            self.stopped = True

    def _safe_end(self) -> int:
        """End of the text that cannot be the start of a stop string. Only the text not yet
        handed out can be (what was handed out could not, and never can): looking further back
        made each push cost the whole text's length squared with a long stop string."""
        unshown = self.text[self._shown :]
        return len(self.text) - max((marker_start(unshown, s) for s in self._stop), default=0)

    def _release(self, end: int) -> str:
        end = max(end, self._shown)
        out = self.text[self._shown : end]
        self._shown = end
        return out
