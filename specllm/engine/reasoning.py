"""A thinking model's reasoning, kept apart from its answer; pure text, no model.

Thinking models (Qwen3 and Qwen3.5, DeepSeek-R1 distills, SmolLM3, GLM, ...) reason in a think
block before they answer. Their chat template opens it at the end of the generation prompt
(Qwen3.5's prompt ends with "<think>\\n" unless `enable_thinking` is false), or the model writes
"<think>" itself at the start of its reply; "</think>" ends it.

gpt-oss writes its reasoning in harmony's analysis channel instead: a reply that begins as a
harmony message (its channel or its recipient) is read by engine/harmony.py.

`ReasoningSplitter` reads a reply as it is generated and hands out its reasoning and its answer
apart, so that any split of the text into chunks gives what reading it whole
(`split_reasoning`) gives. The reasoning is trimmed of whitespace at its two ends, and the answer
of the whitespace that follows "</think>"; a reply without a think block is all answer, exactly as
generated; a block the reply leaves open (it reached max_tokens) is all reasoning. Only text is
split: the tokens generated do not change.
"""

import enum
from dataclasses import dataclass

from specllm.engine.harmony import HarmonyReader, begins_harmony, may_begin_harmony
from specllm.engine.text import marker_start

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def opens_thinking(prompt: str) -> bool:
    """Whether a rendered chat prompt ends inside an open think block: its template began the
    reply's reasoning (a block it opened and closed, as Qwen3.5's does without thinking, is no
    open one)."""
    return prompt.rstrip().endswith(THINK_OPEN)


def without_opening(prompt: str) -> str:
    """A prompt that opens a think block (opens_thinking) without that opening: where a template
    that opens one in its generation prompt begins the assistant turns it renders itself."""
    return prompt.rstrip().removesuffix(THINK_OPEN)


def after_think_block(text: str, opened: bool) -> str:
    """`text`, which a template writes after a reply's think block or in place of one (a call's
    start: Qwen3.5's "\\n</think>\\n\\n<tool_call>", Nemotron 3's "<think></think>\\n<tool_call>",
    MiniMax M2's "<minimax:tool_call>"), made to follow the prompt: one that opened a think block
    (`opened`) gets it closed first, else what followed would be reasoning; one that closed it, or
    has none, gets no second end tag."""
    before, close, after = text.partition(THINK_CLOSE)
    if not opened:
        return after.lstrip() if close else text
    if close:
        return before.replace(THINK_OPEN, "") + close + after
    return f"{THINK_CLOSE}\n\n{text.lstrip()}"


@dataclass(frozen=True)
class Split:
    reasoning: str
    answer: str


def split_reasoning(reply: str, opened: bool = False) -> Split:
    """A whole reply's reasoning and answer; `opened`: the prompt opened the think block."""
    splitter = ReasoningSplitter(opened)
    first, last = splitter.feed(reply), splitter.finish()
    return Split(first.reasoning + last.reasoning, first.answer + last.answer)


class _Where(enum.Enum):
    START = enum.auto()  # nothing but whitespace yet: the reply may still open a block
    REASONING = enum.auto()  # inside the think block
    AFTER = enum.auto()  # just after "</think>": its whitespace is dropped
    ANSWER = enum.auto()
    HARMONY = enum.auto()  # a gpt-oss reply: HarmonyReader reads it


class ReasoningSplitter:
    """Incremental: feed() the reply's text as it comes, then finish(); each returns the
    reasoning and the answer decided by then. Text that may be the start of a marker is held
    back until it is decided, and so is the reasoning's trailing whitespace."""

    def __init__(self, opened: bool):
        self.where = _Where.REASONING if opened else _Where.START
        self.pending = ""  # text not handed out yet
        self.started = False  # some reasoning was handed out (its leading whitespace is dropped)
        self.spaces = ""  # the reasoning's trailing whitespace, held back
        self.ended = False
        self.harmony = HarmonyReader()

    @property
    def thinking(self) -> bool:
        """Whether the reply is (so far) inside its think block."""
        return self.where is _Where.REASONING or (self.where is _Where.HARMONY and self.harmony.thinking)

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
                if body.startswith(THINK_OPEN):
                    self.where, self.pending = _Where.REASONING, body[len(THINK_OPEN) :]
                elif begins_harmony(body):
                    self.where = _Where.HARMONY
                elif (THINK_OPEN.startswith(body) or may_begin_harmony(body)) and not self.ended:
                    break  # whitespace, or a part of a marker
                else:
                    self.where = _Where.ANSWER  # the reply is all answer, its whitespace too
            elif self.where is _Where.REASONING:
                at = self.pending.find(THINK_CLOSE)
                if at >= 0:
                    reasoning += self.pending[:at]
                    self.where, self.pending, closed = _Where.AFTER, self.pending[at + len(THINK_CLOSE) :], True
                    continue
                keep = 0 if self.ended else marker_start(self.pending, THINK_CLOSE)
                reasoning += self.pending[: len(self.pending) - keep]
                self.pending = self.pending[len(self.pending) - keep :]
                break
            elif self.where is _Where.AFTER:
                self.pending = self.pending.lstrip()
                if not self.pending:
                    break
                self.where = _Where.ANSWER
            elif self.where is _Where.HARMONY:
                return self._harmony()
            else:
                answer, self.pending = answer + self.pending, ""
                break
        return Split(self._trimmed(reasoning, closed or self.ended), answer)

    def _harmony(self) -> Split:
        text, self.pending = self.pending, ""
        reasoning, answer = self.harmony.feed(text)
        if self.ended:
            more = self.harmony.finish()
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
