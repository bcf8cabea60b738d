"""A thinking model's reasoning, kept apart from its answer; pure text, no model.

Thinking models reason in a think block before they answer. Their chat template opens it at the
end of the generation prompt (Qwen3.5's prompt ends with "<think>\\n" unless `enable_thinking` is
false), or the model opens it itself at the start of its reply. The block's markers are
THINK_MARKERS: "<think>" and "</think>" for most (Qwen3 and Qwen3.5, DeepSeek-R1 distills,
SmolLM3, GLM, ...), "[THINK]" and "[/THINK]" for Magistral and Ministral 3, Gemma 4's thought
channel, Command A's, Seed-OSS's, MiniMax M3's, Hunyuan 3's and Kimi K3's, and Apriel 1.6's,
which are text. Where a tokenizer holds them as control tokens, the model's text shows them all
the same (llama/model.py writes them, as llama-server preserves them).

gpt-oss writes its reasoning in harmony's analysis channel instead: a reply that begins as a
harmony message (its channel or its recipient) is read by engine/harmony.py. functionary v3.2's
prompt ends with its first message's ">>>": that reply is read by engine/functionary.py.

`ReasoningSplitter` reads a reply as it is generated and hands out its reasoning and its answer
apart, so that any split of the text into chunks gives what reading it whole
(`split_reasoning`) gives. A block ends at its pair's closing marker (at the first of any pair's
where a prompt opened it and which is not known), where a call begins for the models whose calls
end it (`call_openings`: llama.cpp reads Ling 3.0's and Qwen3.5's so), or where what follows it
begins for the models that may leave it open (SUCCESSORS: Kimi K3's response section, Cohere2
MoE's text and calls); a reply that begins with a closing marker alone, where the prompt opened
no block, has an empty one (MiniMax M3's turn without reasoning). The reasoning is trimmed of
whitespace at its two ends, and the answer of the whitespace that follows the closing marker; a
reply without a think block is all answer, exactly as generated; a block the reply leaves open (it
reached max_tokens) is all reasoning. Only text is split: the tokens generated do not change.
"""

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from specllm.engine.functionary import FunctionaryReader
from specllm.engine.harmony import HarmonyReader, begins_harmony, may_begin_harmony
from specllm.engine.text import marker_start

# Markers that are text, not tokens: Apriel 1.6's prompt opens its reasoning with a sentence,
# which the model ends with a line of its own
TEXT_MARKERS = (("Here are my reasoning steps:", "[BEGIN FINAL RESPONSE]"),)
THINK_MARKERS = (
    ("<think>", "</think>"),
    ("[THINK]", "[/THINK]"),  # Magistral, Ministral 3
    ("<|channel>thought", "<channel|>"),  # Gemma 4
    ("<|START_THINKING|>", "<|END_THINKING|>"),  # Command A
    ("<seed:think>", "</seed:think>"),  # Seed-OSS
    ("<mm:think>", "</mm:think>"),  # MiniMax M3
    ("<think:opensource>", "</think:opensource>"),  # Hunyuan 3 (Hy3)
    ("<|open|>think<|sep|>", "<|close|>think<|sep|>"),  # Kimi K3's think section
    *TEXT_MARKERS,
)
THINK_OPEN, THINK_CLOSE = THINK_MARKERS[0]
OPENINGS = tuple(opening for opening, _ in THINK_MARKERS)
CLOSINGS = tuple(closing for _, closing in THINK_MARKERS)
BLOCK_MARKERS = OPENINGS + CLOSINGS  # what a reply's think block may begin with (a bare closing marker: an empty block)
# What a model may write after its think block without closing it, which ends the block as its
# closing marker does and begins the answer (llama.cpp reads them so): Kimi K3's response section,
# Cohere2 MoE's text and its calls
SUCCESSORS = {
    "<|close|>think<|sep|>": ("<|open|>response<|sep|>",),
    "<|END_THINKING|>": ("<|START_TEXT|>", "<|START_ACTION|>"),
}
# Kimi K3 writes its answer in a response section of its message (which its prompt opens where
# thinking is off), Command R7B and A between <|START_RESPONSE|> and <|END_RESPONSE|>, Cohere2 MoE
# between <|START_TEXT|> and <|END_TEXT|>: that markup and the message's end are left out of the
# answer, as llama.cpp leaves them out of the content.
ANSWER_MARKUP = (
    "<|open|>response<|sep|>",
    "<|close|>response<|sep|>",
    "<|close|>message<|sep|>",
    "<|START_RESPONSE|>",
    "<|END_RESPONSE|>",
    "<|START_TEXT|>",
    "<|END_TEXT|>",
)


MARKUP_LONGEST = max(map(len, ANSWER_MARKUP))  # each begins with "<|" (_without_answer_markup looks for that)


def closing_marker(prompt: str) -> str | None:
    """The marker that ends the think block a rendered chat prompt ends inside (its template
    began the reply's reasoning), or None: a block it opened and closed, as Qwen3.5's does
    without thinking, is no open one."""
    end = prompt.rstrip()
    return next((closing for opening, closing in THINK_MARKERS if end.endswith(opening)), None)


def opens_thinking(prompt: str) -> bool:
    """Whether a rendered chat prompt ends inside an open think block (closing_marker)."""
    return closing_marker(prompt) is not None


def without_opening(prompt: str) -> str:
    """A prompt that opens a think block (opens_thinking) without that opening: where a template
    that opens one in its generation prompt begins the assistant turns it renders itself."""
    end = prompt.rstrip()
    return next((end.removesuffix(opening) for opening in OPENINGS if end.endswith(opening)), end)


def without_empty_block(prompt: str) -> str:
    """A prompt without the empty think block it ends with, if it ends with one: a template that
    turns thinking off writes it there (Gemma 4's "<|channel>thought\\n<channel|>"), but not in
    the assistant turns it renders itself."""
    end = prompt.rstrip()
    for opening, closing in THINK_MARKERS:
        before, found, inside = end.removesuffix(closing).rpartition(opening)
        if end.endswith(closing) and found and not inside.strip():
            return before
    return prompt


def after_think_block(text: str, closing: str | None) -> str:
    """`text`, which a template writes after a reply's think block or in place of one (a call's
    start: Qwen3.5's "\\n</think>\\n\\n<tool_call>", Nemotron 3's "<think></think>\\n<tool_call>",
    MiniMax M2's "<minimax:tool_call>"), made to follow the prompt: one that opened a think block
    (`closing`: the marker that ends it) gets it closed first, else what followed would be
    reasoning; one that closed it, or has none, gets no second end tag."""
    if closing is None:
        before, close, after = _first_closing(text)
        return after.lstrip() if close else text
    opening = OPENINGS[CLOSINGS.index(closing)]
    before, close, after = text.partition(closing)
    if close:
        return before.replace(opening, "") + close + after
    return f"{closing}\n\n{text.lstrip()}"


def _first_closing(text: str, closings: tuple[str, ...] = CLOSINGS) -> tuple[str, str, str]:
    """text.partition at the first of these closing markers (any pair's by default)."""
    found = [(at, closing) for closing in closings if (at := text.find(closing)) >= 0]
    if not found:
        return text, "", ""
    at, closing = min(found)
    return text[:at], closing, text[at + len(closing) :]


def _without_answer_markup(text: str, ended: bool) -> tuple[str, str]:
    """(the answer text without ANSWER_MARKUP, what is held back: a part of it at the end). Each
    markup begins with "<|": text without one is looked at no further, as it streams."""
    if "<|" in text:
        for markup in ANSWER_MARKUP:
            text = text.replace(markup, "")
    may_begin = not ended and "<" in text[-MARKUP_LONGEST:]
    held = max(marker_start(text, markup) for markup in ANSWER_MARKUP) if may_begin else 0
    return text[: len(text) - held], text[len(text) - held :]


@dataclass(frozen=True)
class Split:
    reasoning: str
    answer: str


def split_reasoning(
    reply: str, opened: bool | str = False, call_openings: tuple[str, ...] = (), recipient: bool = False
) -> Split:
    """A whole reply's reasoning and answer, no tools offered; `opened`: the prompt opened the
    think block (the marker that ends it, or True), `call_openings` and `recipient`: as
    ReasoningSplitter takes them."""
    splitter = ReasoningSplitter(opened, call_openings, recipient)
    first, last = splitter.feed(reply), splitter.finish()
    return Split(first.reasoning + last.reasoning, first.answer + last.answer)


def reasoning_tokens(
    pieces: Iterable[str],
    opened: bool | str = False,
    call_openings: tuple[str, ...] = (),
    recipient: bool = False,
    before: str = "",
) -> int:
    """How many of a reply's tokens (each one's text, in order) are its reasoning's: those the
    reply is inside its reasoning before or after, which are the think block's tokens with its
    markers'. A token that holds the block's end and text after it counts (it began inside), one
    that opens the block too (it ends inside). `before`: text the reply begins with that is no
    generated token (a call the prompt begins); the other arguments as ReasoningSplitter's."""
    splitter = ReasoningSplitter(opened, call_openings, recipient)
    splitter.feed(before)
    counted = 0
    for piece in pieces:
        inside = splitter.thinking
        splitter.feed(piece)
        counted += inside or splitter.thinking
    return counted


class _Where(enum.Enum):
    START = enum.auto()  # nothing but whitespace yet: the reply may still open a block
    REASONING = enum.auto()  # inside the think block
    AFTER = enum.auto()  # just after the block's closing marker: its whitespace is dropped
    ANSWER = enum.auto()
    READER = enum.auto()  # a gpt-oss reply (HarmonyReader reads it), or functionary v3.2's (FunctionaryReader)


class ReasoningSplitter:
    """Incremental: feed() the reply's text as it comes, then finish(); each returns the
    reasoning and the answer decided by then. Text that may be the start of a marker is held
    back until it is decided, and so is the reasoning's trailing whitespace."""

    def __init__(
        self, opened: bool | str, call_openings: tuple[str, ...] = (), recipient: bool = False, tools: bool = False
    ):
        """`opened`: the prompt opened the think block; the marker that ends it (closing_marker)
        where known, else True. `call_openings`: the markers that begin a call, where a call ends
        the think block as its closing marker does (the call is the answer's: Ling 3.0's and
        Qwen3.5's, as llama.cpp reads them). `recipient`: the prompt ends where the reply's first
        recipient goes (functionary v3.2's ">>>": engine/functionary.py reads the reply, its calls
        where `tools` were offered)."""
        self.where = _Where.REASONING if opened else _Where.START
        self.pending = ""  # text not handed out yet
        self.started = False  # some reasoning was handed out (its leading whitespace is dropped)
        self.spaces = ""  # the reasoning's trailing whitespace, held back
        self.ended = False
        self.reader: HarmonyReader | FunctionaryReader = HarmonyReader()
        if recipient:
            self.where, self.reader = _Where.READER, FunctionaryReader(calls=tools)
        self.call_openings = call_openings
        # The markers that end the block: its own pair's, so that a Qwen3 reasoning about
        # Magistral's "[/THINK]" goes on reasoning; any pair's where the prompt opened one unnamed
        self._ended_by((opened,) if isinstance(opened, str) else CLOSINGS)

    @property
    def thinking(self) -> bool:
        """Whether the reply is (so far) inside its think block."""
        return self.where is _Where.REASONING or (self.where is _Where.READER and self.reader.thinking)

    def feed(self, text: str) -> Split:
        self.pending += text
        return self._decide()

    def finish(self) -> Split:
        self.ended = True
        return self._decide()

    def _decide(self) -> Split:
        reasoning, answer, closed = "", "", False
        while self.pending or self.ended:
            if self.where is _Where.START:
                body = self.pending.lstrip()
                marker = next((m for m in BLOCK_MARKERS if body.startswith(m)), None)
                if marker in OPENINGS:
                    self.where, self.pending = _Where.REASONING, body[len(marker) :]
                    self._ended_by((CLOSINGS[OPENINGS.index(marker)],))
                elif marker is not None:  # an empty block the prompt did not open (MiniMax M3's turn without reasoning)
                    self.where, self.pending = _Where.AFTER, body[len(marker) :]
                elif begins_harmony(body):
                    self.where = _Where.READER
                elif (any(m.startswith(body) for m in BLOCK_MARKERS) or may_begin_harmony(body)) and not self.ended:
                    break  # whitespace, or a part of a marker
                else:
                    self.where = _Where.ANSWER  # the reply is all answer, its whitespace too
            elif self.where is _Where.REASONING:
                before, close, after = _first_closing(self.pending, self.ends)
                if close in self.answer_openings:  # it ends the block and is the answer's (a call, a response section)
                    reasoning += before
                    self.where, self.pending, closed = _Where.ANSWER, close + after, True
                    continue
                if close:
                    reasoning += before
                    self.where, self.pending, closed = _Where.AFTER, after, True
                    continue
                keep = 0 if self.ended else max(marker_start(self.pending, c) for c in self.ends)
                reasoning += self.pending[: len(self.pending) - keep]
                self.pending = self.pending[len(self.pending) - keep :]
                break
            elif self.where is _Where.AFTER:
                self.pending = self.pending.lstrip()
                if not self.pending:
                    break
                self.where = _Where.ANSWER
            elif self.where is _Where.READER:
                return self._read()
            else:
                text, self.pending = _without_answer_markup(self.pending, self.ended)
                answer += text
                break
        return Split(self._trimmed(reasoning, closed or self.ended), answer)

    def _ended_by(self, closings: tuple[str, ...]) -> None:
        """The block ends at these closing markers, and at what begins the answer: a call
        (call_openings) or what follows the block where the model leaves it open (SUCCESSORS)."""
        successors = tuple(successor for closing in closings for successor in SUCCESSORS.get(closing, ()))
        self.answer_openings = successors + self.call_openings
        self.ends = closings + self.answer_openings

    def _read(self) -> Split:
        text, self.pending = self.pending, ""
        reasoning, answer = self.reader.feed(text)
        if self.ended:
            more = self.reader.finish()
            reasoning, answer = reasoning + more[0], answer + more[1]
        return Split(reasoning, answer)

    def _trimmed(self, text: str, done: bool) -> str:
        """Reasoning to hand out, without the block's leading and trailing whitespace."""
        if not self.started:
            text = text.lstrip()
            self.started = bool(text)
        text = self.spaces + text
        body = text.rstrip()
        self.spaces = "" if done else text[len(body) :]
        return body
