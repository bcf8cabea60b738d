"""gpt-oss's replies (OpenAI's harmony format) read into reasoning and answer; pure text, no model.

A gpt-oss prompt ends with "<|start|>assistant", and the reply is one message or more, each a
header, "<|message|>", then its body up to "<|end|>":

    <|channel|>analysis<|message|>We need the weather.<|end|>         reasoning
    <|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>  a preamble: answer
    <|start|>assistant<|channel|>final<|message|>It is sunny.           the answer
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}
                                                                        a call (the recipient may
                                                                        also come before the channel)

llama.cpp writes these markers as text for gpt-oss (it marks them so when it loads the vocabulary)
and ends generation at "<|return|>" (after the answer) and "<|call|>" (after a call), which are
left out of the text: the reply's last message ends with it.

`HarmonyReader` hands out the analysis channel as reasoning and every other message as answer, in
order; a message of text is set apart from the one before by a blank line. A message to a
recipient (a call) goes into the answer in one form, whatever form the model wrote it in:
CALL_OPEN, the recipient, CALL_HEADER, the body as written, CALL_CLOSE. tool_calls.py reads that
form as a call to an offered tool; anything else it leaves as text, so a call to a tool nobody
offered stays visible. A reply that leaves the format (a header longer than HEADER_LIMIT or with a
line break before its "<|message|>", or text after a message that begins no header) is answer from
there on, as written. A header that the reply's end cuts short (max_tokens, a stop string) is left
out, the first one too: a reply cut inside it has no answer, as llama-server's parser gives no
content for a header it has only a part of. Only a first "header" of text with no markup after
its recipient ("to=5 is the answer", from a model that writes no harmony) stays, as written.

Muse Glimmer writes the same messages without channels, and ends them with "<|eom|>" (more
messages follow) or "<|eot|>" (the turn's end) as well: its recipient says what a message is,
"self" reasoning, "user" answer, any other a call:

    to=self<|message|>We need the weather.<|eom|><|start|>assistant to=user<|message|>Checking.
"""

import re

from specllm.engine.text import marker_start

START, CHANNEL, MESSAGE, END = "<|start|>", "<|channel|>", "<|message|>", "<|end|>"
ENDS = (END, "<|eom|>", "<|eot|>")  # what ends a message: gpt-oss's, Muse Glimmer's two
REASONER, USER = "self", "user"  # Muse Glimmer's recipients of reasoning and of an answer
NO_CALL = ("assistant", REASONER, USER)  # recipients of a message that is no call
CALL_OPEN, CALL_HEADER, CALL_CLOSE = "<|start|>assistant to=", "<|channel|>commentary json<|message|>", "<|call|>"
HEADER_LIMIT = 256  # characters before "<|message|>": a real header has a few dozen
RECIPIENT = re.compile(r"\bto=([^\s<]+)")
CHANNEL_NAME = re.compile(re.escape(CHANNEL) + r"([A-Za-z_]+)")
SEPARATOR = "\n\n"
BEGINNINGS = (CHANNEL, START, "to=")  # what a header begins with: its start, its channel or its recipient
# A header cut short, not text: it begins with markup, or with a recipient that markup or the cut follows
CUT_HEADER = re.compile(r"(?:<\|start\|>|<\|channel\|>|to=[^\s<]*(?:<\||$))")


def begins_harmony(text: str) -> bool:
    """Whether a reply (its leading whitespace dropped) begins as a harmony message does: with its
    channel, or with its recipient, written before the channel."""
    return text.startswith(BEGINNINGS)


def may_begin_harmony(text: str) -> bool:
    """Whether more text could make `text` begin a harmony message."""
    return any(marker.startswith(text) for marker in BEGINNINGS)


def _may_be_header(text: str, complete: bool) -> bool:
    """Whether `text` begins a header (with its start, its channel or its recipient, or with a
    stray end: a message's "<|end|>" written twice), or, not `complete`, may still begin one."""
    begins = (*BEGINNINGS, *ENDS)
    return any(text.startswith(begin) or (not complete and begin.startswith(text)) for begin in begins)


def _first_end(text: str) -> tuple[str, int]:
    """The first message end in `text` and where it is (-1: none)."""
    found = [(at, end) for end in ENDS if (at := text.find(end)) >= 0]
    at, end = min(found) if found else (-1, END)
    return end, at


class HarmonyReader:
    """Incremental: feed() the reply's text as it comes, then finish(); each returns (reasoning,
    answer) decided by then. Each reasoning message is trimmed of whitespace at its two ends; the
    answer is the bodies as written. Text that may be the start of a marker is held back until it
    is decided."""

    def __init__(self):
        self.pending = ""  # text not handed out yet
        self.kind: str | None = None  # the message being read: "reasoning", "answer", "call"; None in a header
        self.raw = False  # the reply left the format: the rest is answer as written
        self.ended = False
        self.n_messages = 0  # messages begun
        self.wrote = False  # the message being read wrote answer text
        self.separate = False  # answer text was written by an earlier message: set the next one apart
        self.reasoned = False  # reasoning was handed out
        self.began = False  # the reasoning message being read handed out text
        self.gap = ""  # what sets that text apart from an earlier message's
        self.spaces = ""  # its trailing whitespace, held back

    @property
    def thinking(self) -> bool:
        """Whether the reply is (so far) in a message of reasoning."""
        return self.kind == "reasoning"

    def feed(self, text: str) -> tuple[str, str]:
        self.pending += text
        return self._decide()

    def finish(self) -> tuple[str, str]:
        self.ended = True
        return self._decide()

    def _decide(self) -> tuple[str, str]:
        reasoning: list[str] = []
        answer: list[str] = []
        while self.pending:
            if self.raw:
                answer.append(self._answer(self.pending))
                self.pending = ""
            elif self.kind is None:
                if not self._read_header(answer):
                    break
            else:
                end, at = _first_end(self.pending)
                held = 0 if self.ended else max(marker_start(self.pending, e) for e in ENDS)
                cut = at if at >= 0 else len(self.pending) - held
                body, self.pending = self.pending[:cut], self.pending[cut:]
                if self.kind == "reasoning":
                    reasoning.append(self._reasoning(body))
                else:
                    answer.append(self._answer(body))
                if at < 0:
                    break
                self.pending = self.pending[len(end) :]
                answer.append(self._end_message())
        if self.ended and self.kind is not None:  # the last message ends with the reply
            answer.append(self._end_message())
        return "".join(reasoning), "".join(answer)

    def _read_header(self, answer: list[str]) -> bool:
        """Reads the header that begins what is pending; False when that needs more text."""
        at = self.pending.find(MESSAGE)
        header = self.pending[:at] if at >= 0 else self.pending
        # Where "<|message|>" begins, or the first place it still could (it may be arriving)
        begins = at if at >= 0 else len(self.pending) - len(MESSAGE) + 1
        lead = header.lstrip()
        # No header: the model left the format (text after a message's end that begins none, as
        # much as one that runs on too long) and what it writes is shown, not left out at the end
        if "\n" in lead or begins > HEADER_LIMIT or not _may_be_header(lead, complete=at >= 0):
            self.raw = True
            return True
        if at < 0:
            if self.ended and (self.n_messages or CUT_HEADER.match(lead)):
                self.pending = ""  # a header the reply's end cut short: no message
            elif self.ended:
                self.raw = True  # a first "header" of plain text, which no message followed: as written
                return True
            return False
        self.pending = self.pending[at + len(MESSAGE) :]
        self.n_messages += 1
        found = RECIPIENT.search(header)
        recipient = found.group(1) if found else None
        channels = CHANNEL_NAME.findall(header)
        if recipient is not None and recipient not in NO_CALL:
            self.kind = "call"
            answer.append(self._answer(CALL_OPEN + recipient + CALL_HEADER))
        elif recipient == REASONER or (channels and channels[-1] == "analysis"):
            self.kind, self.began, self.spaces = "reasoning", False, ""
            self.gap = SEPARATOR if self.reasoned else ""
        else:
            self.kind = "answer"
        return True

    def _end_message(self) -> str:
        """What ends the message: a call's end. A text message that wrote something sets the
        next message apart by a blank line; a call does not, so that the text around calls
        (tool_calls.py keeps it, whitespace and all) has one blank line where a call stood."""
        kind, self.kind = self.kind, None
        if kind == "call":
            close, self.separate = self._answer(CALL_CLOSE), False
        else:
            close, self.separate = "", self.separate if kind == "reasoning" else self.separate or self.wrote
        self.wrote = False
        return close

    def _answer(self, text: str) -> str:
        """Answer text, after a blank line where it is the first of a message after another's."""
        if not text:
            return ""
        lead = SEPARATOR if self.separate and not self.wrote else ""
        self.wrote = True
        return lead + text

    def _reasoning(self, text: str) -> str:
        """Reasoning to hand out: each message's without its leading and trailing whitespace."""
        if not self.began:
            text = text.lstrip()
            if not text:
                return ""
            text, self.began, self.reasoned = self.gap + text, True, True
        else:
            text = self.spaces + text
        body = text.rstrip()
        self.spaces = text[len(body) :]
        return body
