"""functionary v3.2's replies read into answer and calls; pure text, no model.

functionary v3.2 writes each message of its reply after a recipient line, ">>>RECIPIENT\\n": "all"
for text to the user, a tool's name for a call, whose body is the arguments as JSON. Its prompt
ends with the first message's ">>>", so the reply begins with the recipient alone:

    all\\nLet me check.                    the answer (text to the user)
    >>>get_weather\\n{"city": "Paris"}     a call, its arguments as JSON, up to the next ">>>"

`FunctionaryReader` hands out text messages as answer, as written, and, where tools were offered,
each call in the form engine/harmony.py gives a gpt-oss call (CALL_OPEN, "functions." and the
tool's name, CALL_HEADER, the body as written, CALL_CLOSE), which tool_calls.py reads as a call to
an offered tool and leaves as text otherwise. A call's body ends at the first ">>>" outside its
JSON strings (a string may hold one: Python's prompt, in code). A reply that leaves the format (a
recipient line longer than RECIPIENT_LIMIT, or with characters no name has) is answer from there
on, as written; a later recipient line that the reply's end cuts short is left out.

Without tools (`specllm chat` and `run`, a request that offers none), llama.cpp reads all that
follows the first "all\\n" as text, later calls as written: so does the reader, and a reply that
begins with a call shows it as functionary writes one, ">>>NAME\\n" and its arguments.
"""

import re

from specllm.engine.harmony import CALL_CLOSE, CALL_HEADER, CALL_OPEN
from specllm.engine.text import marker_start

RECIPIENT_MARK = ">>>"  # before each message's recipient (the prompt writes the first one)
TO_USER = "all"  # the recipient of text to the user
RECIPIENT = re.compile(r"[A-Za-z0-9_.-]+")  # a tool's name (OpenAI's names, and dotted ones)
RECIPIENT_LIMIT = 128  # characters before the recipient line's end: a tool's name has at most 64


def asks_recipient(prompt: str) -> bool:
    """Whether a rendered chat prompt ends with functionary v3.2's ">>>": the reply begins with
    its first message's recipient."""
    return prompt.endswith(RECIPIENT_MARK)


class FunctionaryReader:
    """Incremental: feed() the reply's text as it comes, then finish(); each returns (reasoning,
    answer) decided by then, as HarmonyReader's do (functionary writes no reasoning). Text that
    may be the start of ">>>" is held back until it is decided."""

    def __init__(self, calls: bool = True):
        """`calls`: tools were offered, and each message is read (else what follows the first
        recipient line is text as written)."""
        self.calls = calls
        self.pending = ""  # text not handed out yet
        self.kind: str | None = None  # the message being read: "text", "call"; None in a recipient line
        self.raw = False  # the reply left the format: the rest is answer as written
        self.ended = False
        self.begun = False  # a message was begun (the first one's recipient has no ">>>" before it)
        self.scanned = 0  # how much of what is pending a call's body was scanned for its strings
        self.in_string = False  # the body is inside a JSON string there (where ">>>" ends nothing)
        self.escaped = False

    @property
    def thinking(self) -> bool:
        return False

    def feed(self, text: str) -> tuple[str, str]:
        self.pending += text
        return "", self._decide()

    def finish(self) -> tuple[str, str]:
        self.ended = True
        return "", self._decide()

    def _decide(self) -> str:
        answer: list[str] = []
        while self.pending:
            if self.raw:
                answer.append(self.pending)
                self.pending = ""
            elif self.kind is None:
                if not self._read_recipient(answer):
                    break
            else:
                at, decided = self._message_end()
                cut = at if at >= 0 else len(self.pending) if self.ended else decided
                answer.append(self.pending[:cut])
                self.pending, self.scanned = self.pending[cut:], max(0, self.scanned - cut)
                if at < 0:
                    break
                self.pending = self.pending[len(RECIPIENT_MARK) :]
                answer.append(self._end_message())
        if self.ended and self.kind is not None:  # the last message ends with the reply
            answer.append(self._end_message())
        return "".join(answer)

    def _read_recipient(self, answer: list[str]) -> bool:
        """Reads the recipient line that begins what is pending; False when that needs more text."""
        end = self.pending.find("\n")
        line = self.pending[:end] if end >= 0 else self.pending
        if not RECIPIENT.fullmatch(line) and (line or end >= 0) or len(line) > RECIPIENT_LIMIT:
            self.raw = True  # no recipient: the model left the format, and what it writes is shown
            return True
        if end < 0:
            if self.ended and self.begun:
                self.pending = ""  # a later recipient line the reply's end cut short: no message
            elif self.ended:
                self.raw = True  # a reply that never began a message: as written
                return True
            return False
        self.pending, self.begun, self.scanned = self.pending[end + 1 :], True, 0
        if not self.calls:  # no tools: the rest is text, a call shown as functionary writes it
            self.raw = True
            answer.append("" if line == TO_USER else f"{RECIPIENT_MARK}{line}\n")
        elif line == TO_USER:
            self.kind = "text"
        else:
            self.kind, self.in_string, self.escaped = "call", False, False
            answer.append(CALL_OPEN + "functions." + line + CALL_HEADER)
        return True

    def _message_end(self) -> tuple[int, int]:
        """Where the ">>>" that ends the message being read begins in what is pending (-1: none
        yet), and how much of it is decided to be the message's without one (all but what may be
        the start of ">>>"). A call's body is scanned for its JSON strings once, as far as the text goes."""
        if self.kind == "text":
            at = self.pending.find(RECIPIENT_MARK)
            return at, len(self.pending) - marker_start(self.pending, RECIPIENT_MARK)
        for i in range(self.scanned, len(self.pending)):
            c = self.pending[i]
            if self.in_string:
                self.escaped, self.in_string = not self.escaped and c == "\\", self.escaped or c != '"'
            elif c == '"':
                self.in_string = True
            elif self.pending.startswith(RECIPIENT_MARK, i):
                return i, i
            elif c == ">" and RECIPIENT_MARK.startswith(self.pending[i:]):
                break  # ">>>" may be arriving: scanned again with the next text
            self.scanned = i + 1
        return -1, self.scanned

    def _end_message(self) -> str:
        kind, self.kind = self.kind, None
        return CALL_CLOSE if kind == "call" else ""
