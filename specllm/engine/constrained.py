"""Structured output: where a generation's grammar applies, and a verify call's target rows under
it, each masked by the grammar state after the accepted text and the draft tokens before it.

A thinking model reasons before it answers, and only its answer is to follow the grammar (as
llama-server's grammar for a response format lets the reasoning be). Where the prompt opened a
think block (reasoning.closing_marker), the text is free up to the block's closing marker, but
for an end of generation (the answer is still to come), and the grammar applies after it, to the
answer and the whitespace before it that reasoning.py drops; a token whose text runs from the
marker into the answer is allowed where the grammar takes that answer text. Where the model may
open a block itself (its vocabulary holds a pair's opening marker as one token, as Qwen3's and
DeepSeek-R1's do, and the prompt did not close one), that token is allowed at the start beside
the grammar's own, and the reply goes on as if the prompt had opened it. While the text is free a
row's mask is a handful of ids: the ends of generation and the few tokens that would complete the
marker into text the grammar refuses; no token's text goes through the grammar.

Row i of a call on [last, d_1..d_k] predicts the token after d_1..d_i, so its mask is the one of
the grammar advanced over those tokens: a clone of the generation's grammar per row, each one the
clone before it advanced over one draft token (llama.cpp's clone copies its whole parse state). A
row is read (and its clone made) only once every draft token before it was accepted, so a clone
only ever advances over tokens its grammar allows. The grammar of the generation then advances
over the accepted tokens and the target's own token.

gpt-oss reasons in harmony's analysis channel (engine/harmony.py), and its answer is the final
channel's message: under a grammar its reply is analysis messages, then the final message, whose
body the grammar takes, as llama-server's grammar for gpt-oss with a response format has it
(common/parsers/gpt-oss.cpp). A message's header is the grammar's (Phase.HEADER: "<|start|>assistant",
then "<|channel|>analysis<|message|>" or "<|channel|>final", an optional constraint such as
" <|constrain|>json", and "<|message|>"); an analysis message's body is free up to its "<|end|>",
as reasoning is up to a closing marker, and the next header's grammar follows it. Beside tools (a
call's opening given), a header may also be a call's, "<|channel|>commentary to=functions.NAME"
or with the recipient in the role header (" to=functions.NAME<|channel|>commentary"), its channel
"analysis" in either (the forms llama.cpp's gpt-oss parser reads), a constraint, "<|message|>"
(as harmony.py reads calls): its body is free, its end of generation (<|call|>) too, up to its
"<|end|>" (Phase.CALL_MESSAGE). llama-server's grammar has no call there. A prompt that opened a
message goes on in its body: a call's as a call's, an analysis or a commentary one's (a preamble)
as an analysis message's; its end is read from the prompt's tail back to the message's
"<|start|>" (loop.prompt_end), however long the text the prompt wrote in it.

Tools offered beside the grammar (a call's opening given): the answer is the grammar's text or a
tool call, the opening (as the chat template writes it) followed by anything. The answer's
grammar takes the opening as an alternative to its own root, and once the answer's text holds the
whole opening the text is free to the end (Phase.CALL), as the reasoning is: the call is the tool
reader's to read, and nothing is masked but ids past the vocabulary. Where the model may begin a
call before it closes its think block (Qwen3.5's, Nemotron 3's, Ling 3.0's, DeepSeek V3.2's: the
call openings the reply reader ends the reasoning at), such an opening written inside the
reasoning ends it the same way: the call is free to the end, its end of generation allowed.
"""

import enum
import re
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from specllm.engine.harmony import CALL_CLOSE, CHANNEL_NAME, NO_CALL, RECIPIENT, START, begins_harmony
from specllm.engine.reasoning import CLOSINGS, THINK_MARKERS, closing_marker
from specllm.engine.sampling import SamplerSettings, masked
from specllm.errors import CallLikeAnswer, SpecllmError
from specllm.llama.grammar import Grammar, after_whitespace, call_opening, or_call
from specllm.llama.model import Model

RowT = TypeVar("RowT")


class Phase(enum.Enum):
    OPTIONAL = enum.auto()  # the reply may open a think block first, or begin its answer
    REASONING = enum.auto()  # inside the think block: free up to its closing marker
    ANSWER = enum.auto()  # the grammar's
    HEADER = enum.auto()  # gpt-oss: a harmony message's header, the grammar's up to its "<|message|>"
    CALL = enum.auto()  # after a tool call's opening: free to the end
    CALL_MESSAGE = enum.auto()  # gpt-oss: a call's body, free (its end of generation too) up to its "<|end|>"


# gpt-oss's harmony markup (engine/harmony.py): the reply's prompt ends with REPLY_START, and its
# vocabulary holds CHANNEL as one token
REPLY_START, CHANNEL, MESSAGE, END = "<|start|>assistant", "<|channel|>", "<|message|>", "<|end|>"
ANALYSIS = CHANNEL + "analysis" + MESSAGE
MESSAGE_ENDS = (END, CALL_CLOSE, "<|return|>")  # what ends a message in a prompt: a text's, a call's, the final one's
# A call's recipient, before or after its channel (commentary or analysis), up to its tool's name:
# the call headers llama.cpp's gpt-oss parser reads, which harmony.py reads as calls
CALL_RECIPIENT = " to=functions."
# A final message's header, up to its body: a constraint such as " <|constrain|>json" may come before
# "<|message|>" (llama.cpp's grammar allows one; here its type comes after spaces, tabs or
# "<|constrain|>": not after a new line, which harmony.py takes for the end of a header, as text)
FINAL_HEADER = re.compile(
    r"<\|channel\|>final(?:(?:[ \t]+(?:<\|constrain\|>)?|<\|constrain\|>)[A-Za-z0-9_-]+)?<\|message\|>$"
)


@dataclass(frozen=True)
class _MarkerTokens:
    """What a vocabulary holds of a closing marker: the tokens whose text holds all of it, those
    whose text begins with each of its tails (they complete it after its head), the ends of
    generation, and a token for each byte (an answer's text after the marker goes to the grammar
    byte by byte)."""

    whole: tuple[int, ...]
    tails: dict[int, tuple[int, ...]]  # the marker's head length -> tokens beginning with the rest
    eog: np.ndarray
    byte_tokens: dict[int, int]

    def completing(self, marker: bytes, tail: bytes) -> list[int]:
        """The tokens that would complete the marker after reasoning text ending with `tail`."""
        found = list(self.whole)
        for head, tokens in self.tails.items():
            if tail.endswith(marker[:head]):
                found += tokens
        return found


_MARKER_TOKENS: "weakref.WeakKeyDictionary[Model, dict[bytes, _MarkerTokens]]" = weakref.WeakKeyDictionary()


def _marker_tokens(model: Model, marker: bytes) -> _MarkerTokens:
    """A vocabulary's _MarkerTokens, found once per model and marker (from Model.pieces)."""
    known = _MARKER_TOKENS.setdefault(model, {})
    if marker not in known:
        pieces = model.pieces.text
        # a token that completes the marker holds its last byte
        ending = [(t, piece) for t, piece in enumerate(pieces) if marker[-1:] in piece]
        tails = {
            head: tuple(t for t, piece in ending if piece.startswith(marker[head:])) for head in range(1, len(marker))
        }
        byte_tokens: dict[int, int] = {}
        for t, piece in enumerate(pieces):
            if len(piece) == 1 and not model.is_eog(t):
                byte_tokens.setdefault(piece[0], t)
        eog = np.array(sorted(t for t in model.markup_tokens if model.is_eog(t)), dtype=np.intp)
        whole = tuple(t for t, piece in ending if marker in piece)
        known[marker] = _MarkerTokens(whole, tails, eog, byte_tokens)
    return known[marker]


class OutputGrammar:
    """A generation's grammar and where it applies (see the module's docstring): `allowed`,
    `masked`, `accept` and `clone` as llama/grammar.py's Grammar, over the target's vocabulary
    (an id past it, from a larger draft vocabulary, is refused)."""

    def __init__(
        self,
        grammar: Grammar,
        phase: Phase = Phase.ANSWER,
        closing: bytes = b"",
        after: Grammar | None = None,
        opening: int | None = None,
        tail: bytes = b"",
        header: Grammar | None = None,
        call: "CallOpening | None" = None,
        calls_in_reasoning: tuple[bytes, ...] = (),
    ):
        self.model = grammar.model
        self.grammar = grammar  # the answer's (in REASONING, after whitespace)
        self.phase, self.closing, self.tail = phase, closing, tail  # tail: the reasoning's last bytes
        self.after, self.opening = after, opening  # OPTIONAL: the grammar after a block, the block's opening
        # gpt-oss: the grammar of the header after an analysis message, cloned for each one (in
        # HEADER, tail holds the header's text so far)
        self.header = header
        self.call = call  # while the answer may yet be a tool call: its opening's grammar over the answer so far
        # The call openings that end the reasoning where it writes one: the call is the answer's
        self.calls_in_reasoning = calls_in_reasoning

    @property
    def free(self) -> bool:
        """Whether the text is free (but for its end in the reasoning): inside the reasoning, or
        after a tool call's opening."""
        return self.phase in (Phase.REASONING, Phase.CALL, Phase.CALL_MESSAGE)

    def allowed(self, ids: np.ndarray) -> np.ndarray:
        inside = ids < self.model.n_vocab
        if self.free:
            return inside & ~np.isin(ids, self._refused())
        allowed = self.grammar.allowed(ids[inside])
        if self.phase is Phase.OPTIONAL:
            allowed |= ids[inside] == self.opening
        inside[inside] = allowed
        return inside

    def masked(self, logits: np.ndarray, sampler: SamplerSettings) -> np.ndarray:
        """The row with every token the grammar refuses here set to -inf (sampling.masked)."""
        if not self.free:
            return masked(logits, self.allowed, sampler)
        row = np.array(logits, copy=True)
        row[self._refused()] = -np.inf
        row[self.model.n_vocab :] = -np.inf
        return row

    def accept(self, token: int) -> None:
        """Advance over `token` (an end of generation leaves the state as it is)."""
        if self.model.is_eog(token):
            return
        if not self.allowed(np.array([token]))[0]:
            raise SpecllmError(f"token {token} is not allowed by the grammar here")
        if self.phase is Phase.ANSWER:
            self.grammar.accept(token)
            self._answered(self.model.piece(token, special=True))
        elif self.phase is Phase.HEADER:
            self.grammar.accept(token)
            self._read_header(self.model.piece(token))
        elif self.phase is Phase.OPTIONAL:
            self._begin(token)
        elif self.phase in (Phase.REASONING, Phase.CALL_MESSAGE):
            self._reason(token)

    def clone(self) -> "OutputGrammar":
        after = self.after.clone() if self.after is not None else None
        header = self.header.clone() if self.header is not None else None
        return OutputGrammar(
            self.grammar.clone(),
            self.phase,
            self.closing,
            after,
            self.opening,
            self.tail,
            header,
            self.call.clone() if self.call is not None else None,
            self.calls_in_reasoning,
        )

    def close(self) -> None:
        self.grammar.close()
        for other in (self.after, self.header, self.call):
            if other is not None:
                other.close()

    def _begin(self, token: int) -> None:
        """The reply's first token: the block's opening, or the answer's."""
        assert self.after is not None
        if token == self.opening:
            self.grammar.close()
            self.grammar, self.phase = self.after, Phase.REASONING
        else:
            self.after.close()
            self.grammar.accept(token)
            self.phase = Phase.ANSWER
            self._answered(self.model.piece(token, special=True))
        self.after = None

    def _reason(self, token: int) -> None:
        text = self.tail + self.model.piece(token)
        at, marker = _first_marker(text, (self.closing, *self.calls_in_reasoning))
        if at < 0:
            longest = max(map(len, (self.closing, *self.calls_in_reasoning)))
            self.tail = text[max(0, len(text) - (longest - 1)) :]
            return
        if marker != self.closing:  # a call begun inside the reasoning ends it (the reply reader reads so)
            self.phase, self.tail = Phase.CALL, b""
            self._forget_call()
            return
        rest = text[at + len(self.closing) :]
        self.phase, self.tail = (Phase.ANSWER if self.header is None else Phase.HEADER), b""
        _fed(self.grammar, rest, _marker_tokens(self.model, self.closing).byte_tokens)
        if self.phase is Phase.HEADER:
            self._read_header(rest)
            return
        self._answered(rest)

    def _read_header(self, text: bytes) -> None:
        """gpt-oss: the header goes on with `text`, which its grammar took. Once it reaches its
        "<|message|>", an analysis message's body is free up to its end, and a call's (its end of
        generation too), and the next header's grammar follows it; a final message's body is the
        grammar's answer."""
        self.tail += text
        if MESSAGE.encode() not in self.tail:
            return
        if CALL_RECIPIENT.encode() in self.tail:  # before the analysis: a call may be on its channel
            phase = Phase.CALL_MESSAGE
        elif ANALYSIS.encode() in self.tail:
            phase = Phase.REASONING
        else:
            self.phase, self.tail = Phase.ANSWER, b""
            return
        assert self.header is not None
        self.grammar.close()
        self.grammar, self.phase = self.header.clone(), phase
        self.tail = self.tail[self.tail.find(MESSAGE.encode()) + len(MESSAGE) :]

    def _answered(self, text: bytes) -> None:
        """The answer goes on with `text`: once it holds a whole tool call's opening, it is a
        call, free from then on; once it cannot be one, the opening is no longer watched for."""
        if self.call is None:
            return
        self.call.then(text)
        if self.call.written:
            self.phase = Phase.CALL
        if self.call.written or not self.call.possible:
            self._forget_call()

    def _forget_call(self) -> None:
        if self.call is not None:
            self.call.close()
            self.call = None

    def _refused(self) -> np.ndarray:
        """The tokens refused in the reasoning: the ends of generation, and those that complete
        its closing marker into answer text the grammar refuses (after a call's opening: none; in
        gpt-oss's call, those that complete its end alone)."""
        if self.phase is Phase.CALL:
            return np.zeros(0, dtype=np.intp)
        tokens = _marker_tokens(self.model, self.closing)
        refused = [t for t in tokens.completing(self.closing, self.tail) if not self._answer_taken(t, tokens)]
        ends = tokens.eog if self.phase is Phase.REASONING else np.zeros(0, dtype=np.intp)
        return np.concatenate([ends, np.array(refused, dtype=np.intp)])

    def _answer_taken(self, token: int, tokens: _MarkerTokens) -> bool:
        """Whether the grammar takes what `token`'s text has after the closing marker it completes
        (or the text is a call's, begun before the marker)."""
        text = self.tail + self.model.piece(token)
        at, marker = _first_marker(text, (self.closing, *self.calls_in_reasoning))
        if marker != self.closing:
            return True
        rest = text[at + len(self.closing) :]
        if not rest:
            return True
        state = self.grammar.clone()
        taken = _fed(state, rest, tokens.byte_tokens)
        state.close()
        return taken


def _first_marker(text: bytes, markers: tuple[bytes, ...]) -> tuple[int, bytes]:
    """Where the first of `markers` in `text` begins, and which (the earlier one where two begin
    at one place); (-1, b"") where none is in it."""
    found = [(at, i) for i, marker in enumerate(markers) if (at := text.find(marker)) >= 0]
    if not found:
        return -1, b""
    at, i = min(found)
    return at, markers[i]


def _fed(grammar: Grammar, text: bytes, byte_tokens: dict[int, int]) -> bool:
    """Advance the grammar over `text` a byte at a time (its byte tokens: llama.cpp's grammar reads
    a character's bytes across tokens); False, part-way, where it refuses one or the vocabulary
    has no token for one."""
    for byte in text:
        token = byte_tokens.get(byte)
        if token is None or not grammar.allowed(np.array([token]))[0]:
            return False
        grammar.accept(token)
    return True


class CallOpening:
    """While the answer may yet be a tool call: the grammar of a call's opening (grammar.call_opening,
    the alternative to the answer's own root that or_call's grammar takes) advanced over the
    answer's text so far, a byte at a time. Once it may end, the answer holds a whole opening: it
    is a call (`written`); once it refuses a byte, the answer is no call (`possible` is False)."""

    def __init__(self, grammar: Grammar, tokens: _MarkerTokens, written: bool = False, possible: bool = True):
        self.grammar, self.tokens = grammar, tokens  # tokens: the vocabulary's byte and end tokens
        self.written, self.possible = written, possible

    @classmethod
    def of(cls, model: Model, opening: str, names: tuple[str, ...] = ()) -> "CallOpening":
        grammar = Grammar(model, f"root ::= {call_opening(opening, names)}\n")
        return cls(grammar, _marker_tokens(model, opening.encode()))

    def then(self, text: bytes) -> None:
        """The answer goes on with `text` (taken by or_call's grammar)."""
        for byte in text:
            if not _fed(self.grammar, bytes([byte]), self.tokens.byte_tokens):
                self.possible = False
                return
            if self.grammar.allowed(self.tokens.eog).any():  # an end allowed: the opening is whole
                self.written = True
                return

    def clone(self) -> "CallOpening":
        return CallOpening(self.grammar.clone(), self.tokens, self.written, self.possible)

    def close(self) -> None:
        self.grammar.close()


def where_it_applies(
    model: Model,
    text: str,
    prompt_end: str,
    call_opening: str = "",
    calls_in_reasoning: tuple[str, ...] = (),
    call_names: tuple[str, ...] = (),
) -> OutputGrammar:
    """The grammar of GBNF `text` for a generation after a prompt ending with `prompt_end`: in
    gpt-oss's final message, after its free analysis messages (_harmony); after the reasoning where
    the prompt opened a think block; after an optional one where the model opens its own and the
    prompt closed none; else from the first token. With a tool call's `call_opening`, the answer
    is the grammar's or a call (the module's docstring), and a call that begins with one of
    `calls_in_reasoning` inside the reasoning ends it and is free too; for gpt-oss, whose calls
    and answers are both harmony messages, any `call_opening` allows a call's message beside the
    final one. With the tools' `call_names`, a call may also be a fenced JSON call naming one
    (grammar.call_opening), where the grammar refuses a fence as an answer's start."""
    harmony = _harmony(model, text, prompt_end, calls=bool(call_opening))
    if harmony is not None:
        return harmony
    if begins_harmony(call_opening):
        raise CallLikeAnswer(
            f"a tool call begins with {call_opening!r}, a harmony message's header, which is told from an answer"
            " only in a gpt-oss reply (its markup tokens in the vocabulary, the prompt ending where a reply begins)"
        )
    root, call = "root", None
    if call_opening:
        _check_distinct(model, text, call_opening)
        names = call_names if not _takes(model, text, b"```") else ()
        text, root = or_call(text, call_opening, names)
        call = CallOpening.of(model, call_opening, names)
    in_reasoning = tuple(opening.encode() for opening in calls_in_reasoning) if call_opening else ()
    closing = closing_marker(prompt_end)
    if closing is not None:
        grammar = _after_whitespace(model, text, root)
        return OutputGrammar(grammar, Phase.REASONING, closing.encode(), call=call, calls_in_reasoning=in_reasoning)
    opening = None if prompt_end.rstrip().endswith(CLOSINGS) else own_opening(model)
    if opening is None:
        return OutputGrammar(Grammar(model, text, root=root), call=call)
    token, closing = opening
    after = _after_whitespace(model, text, root)
    grammar = Grammar(model, text, root=root)
    return OutputGrammar(
        grammar, Phase.OPTIONAL, closing.encode(), after, token, call=call, calls_in_reasoning=in_reasoning
    )


def _harmony(model: Model, text: str, prompt_end: str, calls: bool = False) -> OutputGrammar | None:
    """gpt-oss's grammar (see the module's docstring) where the prompt ends where its reply
    begins (REPLY_START, on a vocabulary holding CHANNEL as one token) or inside a reply it
    began: in the body of a message it opened (its text begun, perhaps), after one's end, or at
    the final channel's body; None for any other prompt. With `calls`, a message's header may be
    a call's."""
    # A SentencePiece vocabulary's word after a markup token begins with a space ("<|start|> assistant")
    tail = re.sub(r"(?<=\|>)\s+", "", prompt_end)
    if FINAL_HEADER.search(tail):
        return OutputGrammar(Grammar(model, text))  # the answer from the first token
    inside = _open_message(tail)
    after_message = tail.endswith(END) and _open_message(tail.removesuffix(END)) is not None
    if not (inside or after_message or tail.endswith(REPLY_START) and _one_token(model, CHANNEL)):
        return None
    grammar, first, following = _harmony_rules(text, calls)
    header = Grammar(model, grammar, root=following)
    if inside is not None:
        return OutputGrammar(header.clone(), inside, END.encode(), header=header)
    if after_message:  # the next message's header, from its REPLY_START
        return OutputGrammar(header.clone(), Phase.HEADER, END.encode(), header=header)
    return OutputGrammar(Grammar(model, grammar, root=first), Phase.HEADER, END.encode(), header=header)


def _open_message(tail: str) -> Phase | None:
    """Where a prompt's `tail` ends in the body of a message it opened, the phase the reply goes
    on in: a call's body (a recipient, as harmony.py reads a call) is free, its end of generation
    too (CALL_MESSAGE); an analysis message's or a commentary one's (a preamble: the answer is yet
    to come) is free but for an end of generation (REASONING). None where the tail ends in no
    body (one it ended: a call's "<|call|>" too), or in a final message's or one without a
    channel. The message begins at the tail's last "<|start|>" (its last channel where it has
    none), its header up to its first "<|message|>"."""
    begins = tail.rfind(START)
    header, found, body = tail[begins if begins >= 0 else tail.rfind(CHANNEL) :].partition(MESSAGE)
    channels, ended = CHANNEL_NAME.findall(header), any(end in body for end in MESSAGE_ENDS)
    if not found or ended or not channels or channels[-1] not in ("analysis", "commentary"):
        return None
    recipient = RECIPIENT.search(header)
    if recipient is not None and recipient.group(1) not in NO_CALL:
        return Phase.CALL_MESSAGE
    return Phase.REASONING


def _harmony_rules(text: str, calls: bool = False) -> tuple[str, str, str]:
    """GBNF `text` with rules for gpt-oss's messages added, and the names of two: a message's
    header (an analysis message's, or a final one's followed by `text`'s root, or with `calls` a
    call's: CALL_RECIPIENT and the tool's name before or after a commentary or analysis channel,
    and a constraint), and the same after the REPLY_START that begins a message after another.
    Their names are not `text`'s."""
    prefix = "harmony"
    while prefix in text:
        prefix += "x"
    message, after, constraint = f"{prefix}-message", f"{prefix}-after", f"{prefix}-constraint"
    # a tool's name as harmony.py reads a recipient: up to whitespace or markup
    recipient, channel = f'"{CALL_RECIPIENT}" [^ \\t\\r\\n<]+', f'"{CHANNEL}" ("commentary" | "analysis")'
    call = f' | ({channel} {recipient} | {recipient} {channel}) {constraint} "{MESSAGE}"' if calls else ""
    rules = (
        f'{message} ::= "{ANALYSIS}" | "{CHANNEL}final" {constraint} "{MESSAGE}" root{call}\n'
        f'{constraint} ::= (([ \\t]+ "<|constrain|>"? | "<|constrain|>") [A-Za-z0-9_-]+)?\n'
        f'{after} ::= "{REPLY_START}" {message}\n'
    )
    return f"{text}\n{rules}", message, after


def message_start(model: Model, prompt: list[int]) -> int:
    """Where the gpt-oss message that `prompt` ends in begins (_open_message reads its header):
    at its last "<|start|>" token, or at its last "<|channel|>" where it has none (a prompt that
    begins a reply without a role); len(prompt) where it has neither, or the vocabulary does not
    hold them as one token each."""
    for marker in (START, CHANNEL):
        if _one_token(model, marker):
            token = model.tokenize(marker, add_special=False)[0]
            if token in prompt:
                return len(prompt) - 1 - prompt[::-1].index(token)
    return len(prompt)


def _one_token(model: Model, text: str) -> bool:
    """Whether the vocabulary holds `text` as one token."""
    ids = model.tokenize(text, add_special=False)
    return len(ids) == 1 and model.piece(ids[0]) == text.encode()


def _after_whitespace(model: Model, text: str, root: str = "root") -> Grammar:
    grammar, start = after_whitespace(text, root)
    return Grammar(model, grammar, root=start)


def _check_distinct(model: Model, text: str, call_opening: str) -> None:
    """Refuses a call's opening that the grammar takes as the start of an answer: a reply that
    begins so could be either, and would be left free as a call (Llama 3.1's calls are bare JSON)."""
    if _takes(model, text, call_opening.encode()):
        raise CallLikeAnswer(
            f"a tool call begins with {call_opening!r}, which the grammar also takes as the start of an answer"
        )


def _takes(model: Model, text: str, start: bytes) -> bool:
    """Whether GBNF `text` takes `start` as the start of an answer."""
    answer = Grammar(model, text)
    try:
        return _fed(answer, start, _marker_tokens(model, start).byte_tokens)
    finally:
        answer.close()


def own_opening(model: Model) -> tuple[int, str] | None:
    """The token of a think block's opening marker that the vocabulary holds as one token, and the
    block's closing marker: a model that opens its block itself writes it so."""
    for opening, closing in THINK_MARKERS:
        ids = model.tokenize(opening, add_special=False)
        if len(ids) == 1 and model.piece(ids[0]) == opening.encode():
            return ids[0], closing
    return None


class GrammarRows(Generic[RowT]):
    """What verification reads of each target row (see loop._LazyRows), masked by the grammar."""

    def __init__(
        self,
        logits: np.ndarray,
        read: Callable[[np.ndarray], RowT],
        grammar: OutputGrammar,
        draft: list[int],
        sampler: SamplerSettings,
    ):
        self._logits, self._read, self._draft, self._sampler = logits, read, draft, sampler
        self._states = [grammar]  # _states[i]: the grammar after draft tokens 0..i-1
        self._rows: dict[int, RowT] = {}

    def __len__(self) -> int:
        return len(self._logits)

    def __getitem__(self, i: int) -> RowT:
        if i not in self._rows:
            state = self._state(i)
            self._rows[i] = self._read(state.masked(self._logits[i], self._sampler))
        return self._rows[i]

    def _state(self, i: int) -> OutputGrammar:
        while len(self._states) <= i:
            state = self._states[-1].clone()
            state.accept(self._draft[len(self._states) - 1])
            self._states.append(state)
        return self._states[i]

    def advance(self, n_accepted: int, token: int) -> OutputGrammar:
        """The grammar after the n accepted draft tokens and the target's `token`; the other
        rows' clones are freed."""
        grammar = self._state(n_accepted)
        grammar.accept(token)
        for state in self._states:
            if state is not grammar:
                state.close()
        return grammar


def allowed_prefix(grammar: OutputGrammar, tokens: list[int]) -> list[int]:
    """A copied draft (one-hot q: an n-gram copy) up to its first token the grammar forbids. That
    token would be rejected for certain (p = 0) and its residual, p less a one-hot q where p is 0,
    is p itself: verifying the prefix alone and drawing the target's own token after it gives the
    same distribution, without the target evaluating tokens it cannot keep."""
    state, kept = grammar.clone(), []
    for token in tokens:
        if not state.allowed(np.array([token]))[0]:
            break
        kept.append(token)
        if grammar.model.is_eog(token):  # nothing follows an end
            break
        state.accept(token)
    state.close()
    return kept
