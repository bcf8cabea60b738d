"""Tool calls in a model's output, read back as OpenAI's `tool_calls`; pure text, no model.

The forms recognized, whichever template the model was prompted with (small models drift from
their template's own form, so every form is tried):

    <tool_call>{"name": ..., "arguments": {...}}</tool_call>    Hermes, Qwen (closing tag optional)
    <tool_call>name<arg_key>key</arg_key><arg_value>value       GLM 4.5 to 4.7 (a value that reads
        </arg_value></tool_call>                                  as JSON is taken as such)
    <minimax:tool_call><invoke name="name"><parameter           MiniMax M2 (likewise)
        name="key">value</parameter></invoke></minimax:tool_call>
    <tool_call><function=name><parameter=key>value</parameter>  Qwen3.5, Qwen3-Coder (XML; a value
        ...</function></tool_call>                                that reads as JSON is taken as such)
    <|python_tag|>{"name": ..., "parameters": {...}}            Llama 3.x (`;` between calls)
    [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]        Mistral
    [TOOL_CALLS]name[ARGS]{...}                                 newer Mistral ([CALL_ID]id optional)
    <|tool_call>call:name{key:<|"|>value<|"|>}<tool_call|>      Gemma 4 (its own notation for values)
    <|start|>assistant to=functions.name<|channel|>commentary    gpt-oss (harmony): the form
        json<|message|>{...}<|call|>                              engine/harmony.py gives each call
    <|tool_call_start|>[name(key="value", n=3), ...]            LFM2, LFM2.5 (Python calls, read with
        <|tool_call_end|>                                         ast: literals only, never run)
    <|tool_calls_section_begin|><|tool_call_begin|>functions.   Kimi K2 (the section's markers and
        name:0<|tool_call_argument_begin|>{...}<|tool_call_end|>  each call's end optional)
    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>name<｜tool▁sep｜>   DeepSeek V3.1 (R1's: function<｜tool▁sep｜>
        {...}<｜tool▁call▁end｜><｜tool▁calls▁end｜>                  name, then the JSON in a ```json block)
    <｜DSML｜function_calls><｜DSML｜invoke name="name">...          DeepSeek V3.2, V4 (MiniMax M2's form;
                                                                 string="true" keeps a value text)
    <function name="name"><param name="key">value</param>       MiniCPM5 (MiniMax M2's form, call by
        </function>                                               call; <![CDATA[...]]> keeps a value text)
    <atem:function_calls>, ]<]minimax[>[<tool_call>,            MiniMax M2's form behind muse-glimmer's,
        <|open|>tools<|sep|><|open|>call tool="name"...           MiniMax M3's (<key>value</key>) and Kimi
                                                                 K3's markers (type="string": text);
                                                                 muse-glimmer's in the message to the
                                                                 tool engine/harmony.py gives
    <tool_calls:opensource><tool_call:opensource>name           Tencent Hy3 (GLM's form behind its tags)
        <tool_sep:opensource><arg_key:opensource>...
    <|tool_calls|><|tool_call:begin|>id<|tool_call:name|>name   Solar Open (a call id before the name)
        <|tool_call:args|>{...}<|tool_call:end|><|calls|>
    <function=name>{...}</function>                             functionary v3.1
    name\n{...}>>>name\n{...}                                   functionary v3.2, after its prompt's
                                                                 ">>>": engine/functionary.py gives
                                                                 each call in harmony's form
    <TOOLCALL>, <|tool_call|>, <tool_calls>, <seed:tool_call>,  the Hermes forms behind Nemotron Nano
        <|START_ACTION|>, <|tools_prefix|>, <|function_call|>,    v2's, Granite 3.3's, Apriel's and
        <|message_sep|>\n\nfunction call<|role_sep|>              MiniMax M1's, Seed-OSS's, Command
                                                                 R7B's, Apertus's, GigaChat 3.1's and
                                                                 3's markers (JSON values one after
                                                                 another: MiniMax M1's calls)
    ```json {"name": ..., "arguments": {...}} ```               a fenced block (object or list)
    {"name": ..., "arguments": {...}}  or  [{...}, ...]          bare JSON, as llama-server's generic
                                                                 handling accepts

A JSON object is a call only when it names one of the offered tools and has no keys but a call's
(name, arguments or parameters, id, type; or OpenAI's {"type", "function": {...}}, or
{"tool_call": ...} / {"tool_calls": [...]}; Command R7B's tool_name, parameters, tool_call_id; or
Apertus's {"NAME": {...arguments}}), so that an echoed tool schema or a JSON example in
prose is not one. Arguments may be an object or a string holding one. A region whose calls do not
all qualify (malformed JSON, an unknown tool) stays text.

`ToolCallParser` reads text as it is generated: it hands out text only once no continuation could
make it part of a call, and each call once it is complete, so that any split of the text into
chunks gives what parsing it whole (`parse_tool_calls`) gives. Text around calls is trimmed of
whitespace at its two ends. The forms are tried only where one of their opening markers begins
(OPENINGS: one check for all of them), so that a `<` of prose costs the same however many forms
there are.
"""

import ast
import json
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from specllm.engine.functionary import asks_recipient
from specllm.engine.harmony import CALL_CLOSE, CALL_HEADER, CALL_OPEN
from specllm.engine.reasoning import CLOSINGS, opens_thinking, without_empty_block, without_opening

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
# The markers around the Hermes forms' calls (JSON, the XML form, GLM's), as each model writes them;
# the closing one is optional (a model may stop or go on without it), None where there is none.
WRAPPERS = (
    (HERMES_OPEN, HERMES_CLOSE),  # Hermes, Qwen, Granite 4, GLM, Qwen3.5
    ("<TOOLCALL>", "</TOOLCALL>"),  # Nemotron Nano v2
    ("<|tool_call|>", None),  # Granite 3.3
    ("<tool_calls>", "</tool_calls>"),  # Apriel
    ("<seed:tool_call>", "</seed:tool_call>"),  # Seed-OSS
    ("<|START_ACTION|>", "<|END_ACTION|>"),  # Command R7B, Cohere2 MoE
    ("<|tools_prefix|>", "<|tools_suffix|>"),  # Apertus
    ("<|function_call|>", None),  # GigaChat 3.1
    ("<|message_sep|>\n\nfunction call<|role_sep|>", None),  # GigaChat 3
)
PYTHON_TAG = "<|python_tag|>"
MISTRAL_CALLS, MISTRAL_ARGS, MISTRAL_CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
XML_FUNCTION, XML_FUNCTION_END = "<function=", "</function>"
XML_PARAMETER, XML_PARAMETER_END = "<parameter=", "</parameter>"
XML_KEY = re.compile(r"[^<>\s]+")
GLM_KEY, GLM_VALUE = ("<arg_key>", "</arg_key>"), ("<arg_value>", "</arg_value>")
DSML = "<｜DSML｜"  # DeepSeek V3.2's and V4's markup: MiniMax M2's behind other markers
TAG_NAME = re.compile(r'([^"\n]+)"((?:\s+[\w:-]+="[^"\n]*")*)')  # NAME" key="value" ...: a tag's name, attributes
TAG_ATTRIBUTE = re.compile(r'([\w:-]+)="([^"\n]*)"')
BARE_TAG_NAME = re.compile(r"[^\s<>/\"]+")  # MiniMax M3's parameter tags: <KEY>
# A parameter tag's attributes that say its value is text as written (DSML's, Kimi K3's)
TEXT_ATTRIBUTES = (("string", "true"), ("type", "string"))
CDATA, CDATA_END = "<![CDATA[", "]]>"
HARMONY_CALL = CALL_OPEN + "functions."
DEEPSEEK_CALLS, DEEPSEEK_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DEEPSEEK_CALL, DEEPSEEK_SEP, DEEPSEEK_CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
KIMI_CALLS, KIMI_CALLS_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
KIMI_INDEX = re.compile(r":[0-9]*")
SOLAR_CALL = "<|tool_call:begin|>"  # then the call's id, <|tool_call:name|>, the name
LFM2_OPEN, LFM2_CLOSE = "<|tool_call_start|>", "<|tool_call_end|>"
PYTHON_LITERALS = {"true": True, "false": False, "null": None}  # JSON's, which LFM2 writes too
GEMMA_CALL, GEMMA_CALL_END, GEMMA_QUOTE = "<|tool_call>call:", "<tool_call|>", '<|"|>'
GEMMA_KEY = re.compile(r"[^:}]+")
GEMMA_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
GEMMA_NUMBER_CHARS = re.compile(r"[-+0-9.eE]+")
GEMMA_LITERALS = {"true": True, "false": False, "null": None}
FENCE = "```"
CALL_KEYS = {"name", "arguments", "parameters", "id", "type"}
ACTION_KEYS = {"tool_call_id", "tool_name", "parameters"}  # Command R7B's call
WRAPPER_KEYS = {"type", "function", "id"}
MISTRAL_NAME = re.compile(r"[A-Za-z0-9_.-]+")
FENCE_LANGUAGE = re.compile(r"[A-Za-z0-9_+-]*")


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object, as text (OpenAI's function.arguments)


@dataclass(frozen=True)
class Parsed:
    content: str | None  # the text around the calls; None when there is none
    calls: list[ToolCall]


class _More:
    """The text so far does not decide: wait for more (or for its end)."""


MORE = _More()


@dataclass(frozen=True)
class _Match:
    end: int  # where the call region ends in the text it was matched on
    calls: list[ToolCall]  # none: the region is text, all of it (its JSON is not all calls)


@dataclass(frozen=True)
class _Named:
    """A call written as a marker, the tool's name, a separator, its arguments as JSON, and an
    end marker; such calls may come one after another in a block (`blocks`)."""

    head: str
    separator: str
    tail: str
    tail_optional: bool = False
    index: bool = False  # ":N" after the name (Kimi's call ids, functions.NAME:N)
    call_id: str = ""  # written before the name, after the call's id (Solar Open's ID<|tool_call:name|>NAME)


NAMED_FORMS = (
    _Named(HARMONY_CALL, CALL_HEADER, CALL_CLOSE),  # gpt-oss: the form engine/harmony.py gives each call
    _Named("<|tool_call_begin|>functions.", "<|tool_call_argument_begin|>", "<|tool_call_end|>", True, True),  # Kimi K2
    _Named(DEEPSEEK_CALL + "function" + DEEPSEEK_SEP, "\n```json\n", "```" + DEEPSEEK_CALL_END),  # DeepSeek R1
    _Named(DEEPSEEK_CALL, DEEPSEEK_SEP, DEEPSEEK_CALL_END),  # DeepSeek V3.1
    _Named(XML_FUNCTION, ">", XML_FUNCTION_END),  # functionary v3.1
    _Named(SOLAR_CALL, "<|tool_call:args|>", "<|tool_call:end|>", call_id="<|tool_call:name|>"),  # Solar Open
)
NAMED_BLOCKS = ((KIMI_CALLS, KIMI_CALLS_END), (DEEPSEEK_CALLS, DEEPSEEK_CALLS_END), ("<|tool_calls|>", "<|calls|>"))


@dataclass(frozen=True)
class _Invokes:
    """Calls, each an invoke tag naming the tool (NAME" and maybe attributes, then `tag_end`), with
    a parameter tag per argument (MiniMax M2's form), in a block, or one by one where `block` is
    None. A parameter's closing tag may name its key ({key}: MiniMax M3's <KEY>value</KEY>)."""

    block: tuple[str, str] | None
    invoke: tuple[str, str]
    parameter: tuple[str, str]
    tag_end: str = ">"
    bare_keys: bool = False  # a parameter's tag is its key, unquoted (MiniMax M3's)
    cdata: bool = False  # a value may be a CDATA section (MiniCPM5's)


MUSE_INVOKES = _Invokes(
    ("<atem:function_calls>", "</atem:function_calls>"), ('<atem:invoke name="', "</atem:invoke>"),
    ('<atem:parameter name="', "</atem:parameter>"),
)  # fmt: skip
M3 = "]<]minimax[>["  # MiniMax M3's namespace before each of its tags
K3_OPEN, K3_CLOSE, K3_SEP = "<|open|>", "<|close|>", "<|sep|>"
INVOKE_FORMS = (
    _Invokes(
        ("<minimax:tool_call>", "</minimax:tool_call>"), ('<invoke name="', "</invoke>"),
        ('<parameter name="', "</parameter>"),
    ),  # MiniMax M2
    _Invokes(
        (DSML + "function_calls>", "</｜DSML｜function_calls>"), (DSML + 'invoke name="', "</｜DSML｜invoke>"),
        (DSML + 'parameter name="', "</｜DSML｜parameter>"),
    ),  # DeepSeek V3.2
    _Invokes(
        (DSML + "tool_calls>", "</｜DSML｜tool_calls>"), (DSML + 'invoke name="', "</｜DSML｜invoke>"),
        (DSML + 'parameter name="', "</｜DSML｜parameter>"),
    ),  # DeepSeek V4
    _Invokes(None, ('<function name="', "</function>"), ('<param name="', "</param>"), cdata=True),  # MiniCPM5
    MUSE_INVOKES,  # muse-glimmer
    _Invokes(
        (M3 + "<tool_call>", M3 + "</tool_call>"), (M3 + '<invoke name="', M3 + "</invoke>"),
        (M3 + "<", M3 + "</{key}>"), bare_keys=True,
    ),  # MiniMax M3
    _Invokes(
        (K3_OPEN + "tools" + K3_SEP, K3_CLOSE + "tools" + K3_SEP),
        (K3_OPEN + 'call tool="', K3_CLOSE + "call" + K3_SEP),
        (K3_OPEN + 'argument key="', K3_CLOSE + "argument" + K3_SEP), tag_end=K3_SEP,
    ),  # Kimi K3
)  # fmt: skip


@dataclass(frozen=True)
class _Tagged:
    """A call as GLM writes it: the tool's name (then `separator`), then each argument's key and
    value between tags."""

    call: tuple[str, str]
    separator: str
    key: tuple[str, str]
    value: tuple[str, str]


GLM = _Tagged((HERMES_OPEN, HERMES_CLOSE), "", GLM_KEY, GLM_VALUE)  # GLM 4.5 to 4.7 (in WRAPPERS' tags)
HY = ":opensource"  # Tencent Hy3's tags are GLM's with this after their names
HY3 = _Tagged(
    (f"<tool_call{HY}>", f"</tool_call{HY}>"),
    f"<tool_sep{HY}>",
    (f"<arg_key{HY}>", f"</arg_key{HY}>"),
    (f"<arg_value{HY}>", f"</arg_value{HY}>"),
)
TAGGED_BLOCKS = (((f"<tool_calls{HY}>", f"</tool_calls{HY}>"), HY3),)  # fmt: skip

# Each form's opening markers, by the form's method: where none begins, no form is tried.
OPENINGS = {
    "_wrapped": [opening for opening, _ in WRAPPERS],
    "_python_tag": [PYTHON_TAG],
    "_mistral": [MISTRAL_CALLS],
    "_gemma": [GEMMA_CALL],
    "_invokes": [(form.block or form.invoke)[0] for form in INVOKE_FORMS],
    "_named_blocks": [opening for opening, _ in NAMED_BLOCKS],
    "_tagged_blocks": [opening for (opening, _), _ in TAGGED_BLOCKS],
    "_named": [form.head for form in NAMED_FORMS],
    "_harmony_invokes": [CALL_OPEN],
    "_pythonic": [LFM2_OPEN],
    "_fenced": [FENCE],
    "_bare": ["{", "["],
}
FORMS_AT = {
    c: [form for form, openings in OPENINGS.items() if any(opening[0] == c for opening in openings)]
    for c in {opening[0] for openings in OPENINGS.values() for opening in openings}
}  # the forms, in the order they are tried, by the first character of their openings
CANDIDATE = re.compile("[" + re.escape("".join(FORMS_AT)) + "]")
MARKERS = sorted({opening for openings in OPENINGS.values() for opening in openings}, key=len, reverse=True)
OPENING = re.compile("|".join(map(re.escape, MARKERS)))
OPENING_LONGEST = len(MARKERS[0])
OPENING_PREFIXES = frozenset(marker[:n] for marker in MARKERS for n in range(1, len(marker)))


def parse_tool_calls(
    text: str, tool_names: Iterable[str], texts: Mapping[str, Collection[str]] | None = None
) -> Parsed:
    """The calls in a whole reply, and the text around them."""
    parser = ToolCallParser(tool_names, texts)
    content, calls = parser.feed(text)
    rest, more = parser.finish()
    content += rest
    return Parsed(content or None, calls + more)


def _run(parts: list) -> list[str]:
    """The run of text pieces the parts end with (a new one after a call)."""
    if not isinstance(parts[-1], list):
        parts.append([])
    return parts[-1]


def _text_and_calls(parts: "list[str | ToolCall]") -> tuple[str, list[ToolCall]]:
    """Parts in order as (their text joined, their calls)."""
    return "".join(p for p in parts if isinstance(p, str)), [p for p in parts if isinstance(p, ToolCall)]


class ToolCallParser:
    """Incremental: feed() the text as it comes, then finish(); each returns the text and the
    calls decided by then. feed_in_order() and finish_in_order() return the same as the parts the
    model wrote them in: text, a call, text after it, ..."""

    def __init__(self, tool_names: Iterable[str], texts: Mapping[str, Collection[str]] | None = None):
        self.names = frozenset(tool_names)
        self.texts = texts or {}  # per tool, the arguments its schema says are strings (text_arguments)
        self.pending = ""  # text not decided yet: it may start a call
        self.ended = False
        self.started = False  # some text was handed out (leading whitespace is dropped)
        self.spaces = ""  # trailing whitespace held back: dropped if nothing but calls follows
        self.scans: dict[int, tuple] = {}  # an unfinished JSON value's scan so far (see _balanced_end)
        self.gemma: _GemmaReader | None = None  # an unfinished Gemma 4 call's arguments read so far

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        return _text_and_calls(self.feed_in_order(text))

    def finish(self) -> tuple[str, list[ToolCall]]:
        return _text_and_calls(self.finish_in_order())

    def feed_in_order(self, text: str) -> "list[str | ToolCall]":
        self.pending += text
        return self._decide()

    def finish_in_order(self) -> "list[str | ToolCall]":
        self.ended = True
        return self._decide()

    def _decide(self) -> "list[str | ToolCall]":
        """The text and calls decided by now, in the reply's order (no empty text)."""
        text, i = self.pending, 0
        parts: list[list[str] | ToolCall] = [[]]  # runs of text pieces, and calls between them
        while i < len(text):
            start = _next_candidate(text, i)
            _run(parts).append(text[i:start])
            i = start
            if i == len(text):
                break
            found = self._match(text[i:]) if self._may_open(text, i) else None
            if isinstance(found, _More):
                break
            if found is None:  # not a call: the character is text
                _run(parts).append(text[i])
                i += 1
            else:
                if not found.calls:  # a call inside it is no call: an example, a list with a bad one
                    _run(parts).append(text[i : i + found.end])
                parts += found.calls
                i += found.end
        self.pending = text[i:]
        if self.ended:  # the rest can no longer become a call (_match said so): it is text
            _run(parts).append(self.pending)
            self.pending = ""
        runs = [n for n, part in enumerate(parts) if isinstance(part, list)]
        decided: list[str | ToolCall] = []
        for n, part in enumerate(parts):
            if isinstance(part, ToolCall):
                decided.append(part)
            elif trimmed := self._trimmed("".join(part), last=n == runs[-1]):
                decided.append(trimmed)
        return decided

    def _trimmed(self, text: str, last: bool = True) -> str:
        """Text to hand out, without the whole reply's leading and trailing whitespace: whitespace
        before a call is held back with the text's end, and handed out before the text after it."""
        if not self.started:
            text = text.lstrip()
            self.started = bool(text)
        text = self.spaces + text
        body = text.rstrip()
        self.spaces = "" if self.ended and last else text[len(body) :]
        return body

    def _match(self, text: str) -> "_Match | _More | None":
        """The call region at the start of `text`, None when there is none, MORE when the text
        so far cannot tell (`text` begins with a form's opening, or may: _may_open)."""
        for form in FORMS_AT[text[0]]:
            found = getattr(self, form)(text)
            if found is not None:
                return found
        return None

    def _may_open(self, text: str, i: int) -> bool:
        """Whether a call's opening marker begins at `i`, or may (the text ends inside one): one
        check for all the forms, so that a `<` of prose is not tried by each of them."""
        if text[i] in "[{`" or OPENING.match(text, i):  # bare JSON, Mistral's, fences: their forms decide
            return True
        return not self.ended and len(text) - i < OPENING_LONGEST and text[i:] in OPENING_PREFIXES

    @staticmethod
    def _first(found: "Iterable[_Match | _More | None]"):
        """The first form that matches or may (the forms of a table: no marker of one begins another's)."""
        return next((each for each in found if each is not None), None)

    # --- the forms: each returns a _Match, MORE, or None (not this form) --------------------

    def _wrapped(self, text: str):
        return self._first(self._wrapped_in(text, opening, closing) for opening, closing in WRAPPERS)

    def _wrapped_in(self, text: str, opening: str, closing: str | None):
        """A call after `opening`: JSON (one value), the XML form or GLM's, then `closing` if it follows."""
        after = _after_marker(text, opening, self.ended)
        if not isinstance(after, int):
            return after
        start = _skip_spaces(text, after)
        xml = _after_marker(text[start:], XML_FUNCTION, self.ended)
        if xml is MORE:
            return MORE
        if isinstance(xml, int):
            found = self._xml_call(text, start + xml)
        elif start < len(text) and text[start] not in "[{":
            found = self._glm_call(text, start, closing or "")
        else:
            found = self._json_run(text, start)
        return found if closing is None else self._closed(text, found, closing)

    def _closed(self, text: str, found, closing: str):
        """`found` (a _Match, MORE or None) with the closing tag after it, if it follows: it is
        optional (a model may stop or go on without it)."""
        if not isinstance(found, _Match):
            return found
        close = _skip_spaces(text, found.end)
        tag = _after_marker(text[close:], closing, self.ended)
        if tag is MORE:
            return MORE
        return _Match(close + tag, found.calls) if isinstance(tag, int) else found

    def _json_run(self, text: str, i: int):
        """JSON values one after another (MiniMax M1 writes a call per line in one <tool_calls>):
        their calls, up to what is no JSON value. Where one is not all calls, the region up to
        its end is text (a _Match without calls)."""
        calls: list[ToolCall] = []
        end = i
        while True:
            found = self._json_calls(text, i)
            if found is None and calls:
                return _Match(end, calls)
            if not isinstance(found, _Match) or not found.calls:
                return found
            calls, end = calls + found.calls, found.end
            i = _skip_spaces(text, end)
            if i == len(text) and not self.ended:
                return MORE
            if i == len(text) or text[i] not in "[{":
                return _Match(end, calls)

    def _xml_call(self, text: str, i: int):
        """After <function=: name>, then <parameter=key>\nvalue\n</parameter> for each argument,
        then </function> (Qwen3.5's and Qwen3-Coder's calls)."""
        found = self._name_at(text, i)
        if not isinstance(found, tuple):
            return found
        name, head = found
        if text[head] != ">" or name not in self.names:
            return None
        arguments: dict[str, object] = {}
        i = head + 1
        while True:
            i = _skip_spaces(text, i)
            end = _after_marker(text[i:], XML_FUNCTION_END, self.ended)
            if isinstance(end, int):
                given = _arguments(arguments)
                return _Match(i + end, [ToolCall(name, given)]) if given is not None else None
            parameter = _after_marker(text[i:], XML_PARAMETER, self.ended)
            if end is MORE or parameter is MORE:
                return MORE
            if not isinstance(parameter, int):
                return None
            key = XML_KEY.match(text, i + parameter)
            after_key = key.end() if key else i + parameter
            close = text.find(XML_PARAMETER_END, after_key)
            if after_key == len(text) or (close < 0 and text[after_key] == ">"):  # not all here yet
                return None if self.ended else MORE
            if key is None or text[after_key] != ">" or close < 0:
                return None
            arguments[key.group()] = self._value(name, key.group(), text[after_key + 1 : close])
            i = close + len(XML_PARAMETER_END)

    def _glm_call(self, text: str, i: int, closing: str, form: _Tagged = GLM):
        """After <tool_call>: name, then <arg_key>key</arg_key><arg_value>value</arg_value> for
        each argument (GLM's calls, or `form`'s tags; the closing tag, `closing`, is the caller's)."""
        found = self._name_at(text, i)
        if not isinstance(found, tuple):
            return found
        name, head = found
        if name not in self.names:
            return None
        separator = _after_marker(text[head:], form.separator, self.ended)
        if not isinstance(separator, int):
            return separator
        arguments: dict[str, object] = {}
        end = head + separator
        while True:
            i = _skip_spaces(text, end)
            if i == len(text) and not self.ended:
                return MORE
            pair = self._tagged(text, i, form.key) if i < len(text) else None
            if pair is None:  # the arguments end: a call only if the closing tag or the reply follows
                ends = i == len(text) or (closing != "" and text.startswith(closing[: len(text) - i], i))
                given = _arguments(arguments)
                return _Match(end, [ToolCall(name, given)]) if ends and given is not None else None
            if pair is MORE:
                return MORE
            key, after_key = pair
            value = self._tagged(text, _skip_spaces(text, after_key), form.value)
            if not isinstance(value, tuple):
                return value
            arguments[key], end = self._value(name, key, value[0]), value[1]

    def _tagged_blocks(self, text: str):
        """GLM's calls behind other tags, in a block (TAGGED_BLOCKS: Tencent Hy3's)."""
        return self._first(
            self._block(text, markers, lambda text, i, form=form: self._tagged_call(text, i, form))
            for markers, form in TAGGED_BLOCKS
        )

    def _tagged_call(self, text: str, i: int, form: _Tagged):
        """(the call, where it ends) of `form` at `i`, its closing tag optional; None, or MORE."""
        after = _after_marker(text[i:], form.call[0], self.ended)
        if not isinstance(after, int):
            return after
        found = self._closed(text, self._glm_call(text, i + after, form.call[1], form), form.call[1])
        return (found.calls[0], found.end) if isinstance(found, _Match) else found

    def _tagged(self, text: str, i: int, tags: tuple[str, str]):
        """(the text between the two tags at `i`, where the closing one ends); None if the text
        at `i` does not open them, MORE while it may."""
        opening, closing = tags
        after = _after_marker(text[i:], opening, self.ended)
        if not isinstance(after, int):
            return after
        close = text.find(closing, i + after)
        if close < 0:
            return None if self.ended else MORE
        return text[i + after : close], close + len(closing)

    def _invokes(self, text: str):
        """Invokes (INVOKE_FORMS: MiniMax M2's, DeepSeek V3.2's, ...), in a block or one by one."""
        return self._first(self._invokes_of(text, form) for form in INVOKE_FORMS)

    def _invokes_of(self, text: str, form: _Invokes):
        if form.block is not None:
            return self._block(text, form.block, lambda text, i: self._invoke(text, i, form))
        found = self._invoke(text, 0, form)
        return _Match(found[1], [found[0]]) if isinstance(found, tuple) else found

    def _block(self, text: str, markers: tuple[str, str], read_call: Callable):
        """The opening marker, then calls (`read_call`: (the call, where it ends), None or MORE),
        then the closing marker, which the reply's end may stand for."""
        opening, closing = markers
        after = _after_marker(text, opening, self.ended)
        if not isinstance(after, int):
            return after
        calls: list[ToolCall] = []
        i = after
        while True:
            i = _skip_spaces(text, i)
            if i == len(text):
                return (_Match(i, calls) if calls else None) if self.ended else MORE
            close = _after_marker(text[i:], closing, self.ended)
            if isinstance(close, int):
                return _Match(i + close, calls) if calls else None
            found = read_call(text, i)
            if not isinstance(found, tuple):
                return MORE if found is MORE or close is MORE else None
            call, i = found
            calls.append(call)

    def _invoke(self, text: str, i: int, form: _Invokes):
        """(the call, where it ends) of the invoke tag at `i`, with a parameter tag per argument;
        None, or MORE."""
        head = self._named_tag(text, i, form.invoke[0], form.tag_end)
        if not isinstance(head, tuple):
            return head
        name, _, i = head
        if name not in self.names:
            return None
        arguments: dict[str, object] = {}
        while True:
            i = _skip_spaces(text, i)
            end = _after_marker(text[i:], form.invoke[1], self.ended)
            if isinstance(end, int):
                given = _arguments(arguments)
                return (ToolCall(name, given), i + end) if given is not None else None
            parameter = self._named_tag(text, i, form.parameter[0], form.tag_end, form.bare_keys)
            if not isinstance(parameter, tuple):
                return MORE if parameter is MORE or end is MORE else None
            key, attributes, i = parameter
            value = self._parameter_value(text, i, form.parameter[1].replace("{key}", key), form.cdata)
            if not isinstance(value, tuple):
                return value
            written, cdata, i = value
            as_text = cdata or any(attributes.get(attribute) == says for attribute, says in TEXT_ATTRIBUTES)
            arguments[key] = written if as_text else self._value(name, key, written)

    def _parameter_value(self, text: str, i: int, closing: str, cdata: bool):
        """(the value written from `i`, whether it was a CDATA section, where its closing tag
        ends); None, or MORE. A CDATA section's text is the value as written, whatever it holds."""
        section = _after_marker(text[i:], CDATA, self.ended) if cdata else None
        if section is MORE:
            return MORE
        if isinstance(section, int):
            end = text.find(CDATA_END, i + section)
            if end < 0:
                return None if self.ended else MORE
            close = _after_marker(text[end + len(CDATA_END) :], closing, self.ended)
            if not isinstance(close, int):
                return close
            return text[i + section : end], True, end + len(CDATA_END) + close
        close = text.find(closing, i)
        if close < 0:
            return None if self.ended else MORE
        return text[i:close], False, close + len(closing)

    def _named_tag(self, text: str, i: int, opening: str, tag_end: str, bare: bool = False):
        """(the name, the attributes, where the tag ends) of `opening`NAME" key="value"...`tag_end`
        at `i` (`bare`: `opening`NAME`tag_end`); None, or MORE."""
        after = _after_marker(text[i:], opening, self.ended)
        if not isinstance(after, int):
            return after
        end = text.find(tag_end, i + after)
        if end < 0:
            return None if self.ended or "\n" in text[i + after :] else MORE
        tag = (BARE_TAG_NAME if bare else TAG_NAME).fullmatch(text, i + after, end)
        if tag is None:
            return None
        if bare:
            return tag.group(), {}, end + len(tag_end)
        return tag.group(1), dict(TAG_ATTRIBUTE.findall(tag.group(2))), end + len(tag_end)

    def _value(self, name: str, key: str, written: str):
        """An argument of the forms that write values bare (XML, GLM's, MiniMax's): as written
        where the tool's schema says it is a string, as llama-server reads it (a zip code 10001,
        a file's JSON content stay text), else as _xml_value reads it."""
        if key in self.texts.get(name, ()):
            return written.removeprefix("\n").removesuffix("\n")
        return _xml_value(written)

    def _python_tag(self, text: str):
        after = _after_marker(text, PYTHON_TAG, self.ended)
        if not isinstance(after, int):
            return after
        calls, i = [], after
        while True:  # calls separated by ";"
            found = self._json_calls(text, _skip_spaces(text, i))
            if not isinstance(found, _Match):
                return found
            if not found.calls:  # not all calls: each value is read on its own, as bare JSON
                return None
            calls += found.calls
            j = _skip_spaces(text, found.end)
            if j == len(text) and not self.ended:
                return MORE
            if j == len(text) or text[j] != ";":
                return _Match(found.end, calls)
            i = j + 1

    def _mistral(self, text: str):
        after = _after_marker(text, MISTRAL_CALLS, self.ended)
        if not isinstance(after, int):
            return after
        i = _skip_spaces(text, after)
        if i == len(text):
            return None if self.ended else MORE
        if text[i] in "[{":
            return self._json_calls(text, i)
        return self._mistral_named(text, i)

    def _mistral_named(self, text: str, i: int):
        """name[ARGS]{...}, or name[CALL_ID]id[ARGS]{...}."""
        found = self._name_at(text, i)
        if not isinstance(found, tuple):
            return found
        name, j = found
        call_id = _after_marker(text[j:], MISTRAL_CALL_ID, self.ended)
        if call_id is MORE:
            return MORE
        if isinstance(call_id, int):
            j = self._past_id(text, j + call_id)
            if not isinstance(j, int):
                return j
        args = _after_marker(text[j:], MISTRAL_ARGS, self.ended)
        if not isinstance(args, int):
            return args
        value = self._json_at(text, _skip_spaces(text, j + args))
        if not isinstance(value, tuple):
            return value
        end, arguments = value
        call = self._call({"name": name, "arguments": arguments})
        return _Match(end, [call]) if call else None

    def _past_id(self, text: str, i: int):
        """Where the call id at `i` ends (it may be empty); MORE or None where the text ends there."""
        given = MISTRAL_NAME.match(text, i)
        end = given.end() if given else i
        if end == len(text):
            return None if self.ended else MORE
        return end

    def _name_after(self, text: str, marker: str):
        """(the tool name after `marker` at the start of `text`, where it ends); None where the
        text does not begin so, MORE while it may."""
        after = _after_marker(text, marker, self.ended)
        return self._name_at(text, after) if isinstance(after, int) else after

    def _name_at(self, text: str, i: int):
        """(the tool name at `i`, where it ends); None where no name is there, MORE while it may
        still be growing."""
        name = MISTRAL_NAME.match(text, i)
        head = name.end() if name else i
        if head == len(text):
            return None if self.ended else MORE
        return (name.group(), head) if name else None

    def _gemma(self, text: str):
        """Gemma 4's call: the arguments in its own notation (gemma_value), then its end marker."""
        found = self._name_after(text, GEMMA_CALL)
        if not isinstance(found, tuple):
            return found
        name, head = found
        if name not in self.names or text[head] != "{":
            return None
        kept = self.gemma
        reader = kept if kept is not None and kept.goes_on(text, head) else _GemmaReader(head)
        self.gemma = None
        try:
            arguments, end = reader.read(text)
        except _Cut:
            self.gemma = reader  # the next step goes on from here
            return None if self.ended else MORE
        except ValueError:
            return None
        self.gemma = reader  # kept while the end marker may still be coming
        close = _after_marker(text[end:], GEMMA_CALL_END, self.ended)
        if not isinstance(close, int):
            return close
        call = self._call({"name": name, "arguments": arguments})
        return _Match(end + close, [call]) if call else None

    def _named(self, text: str):
        """A call of NAMED_FORMS on its own (a harmony message to a function: its arguments are
        its whole body, which ends at CALL_CLOSE)."""
        for form in NAMED_FORMS:
            found = self._named_call(text, 0, form)
            if found is not None:
                return _Match(found[1], [found[0]]) if isinstance(found, tuple) else found
        return None

    def _harmony_invokes(self, text: str):
        """muse-glimmer's call as engine/harmony.py gives it: a message to the tool (its name the
        recipient) whose body is muse-glimmer's invokes of that tool."""
        found = self._name_after(text, CALL_OPEN)
        if not isinstance(found, tuple):
            return found
        name, head = found
        header = _after_marker(text[head:], CALL_HEADER, self.ended)
        if not isinstance(header, int):
            return header
        body = head + header
        block = self._invokes_of(text[body:], MUSE_INVOKES)
        if not isinstance(block, _Match):
            return block
        close = _skip_spaces(text, body + block.end)
        end = _after_marker(text[close:], CALL_CLOSE, self.ended)
        if not isinstance(end, int):
            return end
        # A message to one tool that invokes another is no call: text, all of it
        return _Match(close + end, block.calls if all(call.name == name for call in block.calls) else [])

    def _named_blocks(self, text: str):
        """Calls of NAMED_FORMS in a block (Kimi K2's section, DeepSeek's)."""
        return self._first(self._block(text, markers, self._named_any) for markers in NAMED_BLOCKS)

    def _named_any(self, text: str, i: int):
        return self._first(self._named_call(text, i, form) for form in NAMED_FORMS)

    def _named_call(self, text: str, i: int, form: _Named):
        """(the call, where it ends) of `form` at `i`; None, or MORE."""
        start = _after_marker(text[i:], form.head, self.ended)
        if not isinstance(start, int):
            return start
        start += i
        if form.call_id:  # the call's id, then its marker, then the name
            past = self._past_id(text, start)
            if not isinstance(past, int):
                return past
            marker = _after_marker(text[past:], form.call_id, self.ended)
            if not isinstance(marker, int):
                return marker
            start = past + marker
        found = self._name_at(text, start)
        if not isinstance(found, tuple):
            return found
        name, head = found
        if name not in self.names:
            return None
        if form.index:
            index = KIMI_INDEX.match(text, head)
            if index is None or (index.end() < len(text) and index.group() == ":"):
                return None
            if index.end() == len(text):
                return None if self.ended else MORE
            head = index.end()
        separator = _after_marker(text[head:], form.separator, self.ended)
        if not isinstance(separator, int):
            return separator
        value = self._json_at(text, _skip_spaces(text, head + separator))
        if not isinstance(value, tuple):
            return value
        end, arguments = value
        call = self._call({"name": name, "arguments": arguments})
        close = _after_marker(text[_skip_spaces(text, end) :], form.tail, self.ended)
        if close is MORE or call is None:
            return None if call is None else MORE
        if isinstance(close, int):
            return call, _skip_spaces(text, end) + close
        return (call, end) if form.tail_optional else None

    def _pythonic(self, text: str):
        """LFM2's calls: a Python list of calls between its markers, [name(key=value, ...), ...]."""
        after = _after_marker(text, LFM2_OPEN, self.ended)
        if not isinstance(after, int):
            return after
        close = text.find(LFM2_CLOSE, after)
        if close < 0:
            return None if self.ended else MORE
        calls = self._python_calls(text[after:close])
        return _Match(close + len(LFM2_CLOSE), calls) if calls else None

    def _python_calls(self, source: str) -> list[ToolCall]:
        """The calls a Python list of calls holds, read with `ast` (never run); none unless every
        one is a call to an offered tool with keyword arguments whose values are literals."""
        try:
            tree = ast.parse(source.strip(), mode="eval").body
        except (SyntaxError, ValueError, RecursionError, MemoryError):  # ValueError: a NUL in it
            return []
        if not isinstance(tree, ast.List):
            return []
        calls = [self._python_call(item) for item in tree.elts]
        return [call for call in calls if call] if calls and all(calls) else []

    def _python_call(self, node: ast.expr) -> ToolCall | None:
        if not isinstance(node, ast.Call) or node.args or any(k.arg is None for k in node.keywords):
            return None
        try:
            arguments = {k.arg: _python_value(k.value) for k in node.keywords}
        except ValueError:
            return None
        return self._call({"name": _dotted_name(node.func), "arguments": arguments})

    def _fenced(self, text: str):
        """A fenced block of nothing but calls: one JSON value, or several one after another."""
        after = _after_marker(text, FENCE, self.ended)
        if not isinstance(after, int):
            return after
        language = FENCE_LANGUAGE.match(text, after)
        assert language is not None  # its pattern matches the empty string
        calls: list[ToolCall] = []
        i = _skip_spaces(text, language.end())
        while True:
            if i == len(text):  # the block may end with the reply
                return (_Match(i, calls) if calls else None) if self.ended else MORE
            if text[i] not in "[{":
                fence = _after_marker(text[i:], FENCE, self.ended)
                if fence is MORE:
                    return MORE
                return _Match(i + fence, calls) if calls and isinstance(fence, int) else None
            found = self._json_calls(text, i)
            if not isinstance(found, _Match):
                return found
            if not found.calls:  # not all calls: each value is read on its own, as bare JSON
                return None
            calls += found.calls
            i = _skip_spaces(text, found.end)

    def _bare(self, text: str):
        if text[0] not in "[{":
            return None
        opening = _opens_call(text, self.ended)
        if opening is not True:
            return opening
        return self._json_calls(text, 0)

    # --- JSON -------------------------------------------------------------------------------

    def _json_calls(self, text: str, start: int):
        """The call or list of calls written as one JSON value at `start`; a value that is not
        all calls is a region of text (a _Match without calls)."""
        value = self._json_at(text, start)
        if not isinstance(value, tuple):
            return value
        end, parsed = value
        return _Match(end, self._calls(parsed))

    def _json_at(self, text: str, start: int):
        """(end, value) of the JSON value at `start`; MORE while it may still begin or go on;
        None if it is not JSON."""
        if start == len(text):
            return None if self.ended else MORE
        if text[start] not in "[{":  # no object or array: no continuation makes it one
            return None
        return _json_value(text, start, self.ended, self.scans)

    def _calls(self, value) -> list[ToolCall]:
        """The calls a JSON value holds; none unless every part of it is a call to an offered tool."""
        if isinstance(value, dict) and set(value) == {"tool_calls"}:
            value = value["tool_calls"]
        items = value if isinstance(value, list) else [value]
        calls = [self._call(item) for item in items]
        return [call for call in calls if call] if calls and all(calls) else []

    def _call(self, item) -> ToolCall | None:
        if not isinstance(item, dict):
            return None
        if set(item) == {"tool_call"}:
            item = item["tool_call"]
        elif "function" in item and set(item) <= WRAPPER_KEYS:  # OpenAI's own shape
            item = item["function"]
        elif "tool_name" in item and set(item) <= ACTION_KEYS:  # Command R7B's
            item = {"name": item["tool_name"], "parameters": item.get("parameters", {})}
        elif len(item) == 1 and set(item) <= self.names and isinstance(next(iter(item.values())), dict):
            item = {"name": next(iter(item)), "arguments": next(iter(item.values()))}  # Apertus's {NAME: {...}}
        if not isinstance(item, dict) or not set(item) <= CALL_KEYS:
            return None
        if not isinstance(item.get("name"), str) or item["name"] not in self.names:
            return None
        if "arguments" in item and "parameters" in item:
            return None
        arguments = _arguments(item.get("arguments", item.get("parameters", {})))
        return ToolCall(item["name"], arguments) if arguments is not None else None


def _arguments(value) -> str | None:
    """Arguments as OpenAI gives them: a JSON object as text (a model may write either). Only
    standard JSON: Python reads NaN and Infinity, which a client's parser may refuse, and a lone
    surrogate escape ("\\ud800"), which no UTF-8 response can carry."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            return None
    if not isinstance(value, dict):
        return None
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
        text.encode("utf-8")
    except (ValueError, RecursionError):  # NaN or Infinity; a lone surrogate (UnicodeEncodeError)
        return None
    return text


class _Cut(Exception):
    """The text ends inside the value: more may complete it."""


def gemma_value(text: str, i: int) -> tuple[object, int]:
    """The value Gemma 4 writes at `i`, and where it ends: a string between <|"|> quotes, a dict
    of bare keys ({key:value,...}), a list, a JSON number, true, false or null. Raises _Cut where
    the text ends inside it, ValueError where it is no such value."""
    return _GemmaReader(i).read(text)


@dataclass
class _Open:
    """A dict or list begun and not yet closed, with its items so far."""

    closing: str
    items: dict | list
    key: str = ""  # in a dict, the key whose value is being read


class _GemmaReader:
    """Gemma 4's notation read as the text grows: where the text runs out, the reader keeps its
    place (the containers open, their items so far), and a longer text that begins with the one
    read goes on from there. Read again from its start at every step, as a streamed reply is, a
    long call's arguments would cost time quadratic in their length (minutes for 20k characters
    of small items). No recursion: nesting is bounded by memory, not by Python's stack."""

    def __init__(self, start: int):
        self.start = start
        self.text = ""  # the text read so far
        self.i, self.state = start, "value"  # where to go on, and what is expected there
        self.open: list[_Open] = []
        self.done: tuple[object, int] | None = None  # the value and its end, once read whole

    def goes_on(self, text: str, start: int) -> bool:
        return start == self.start and text.startswith(self.text)

    def read(self, text: str) -> tuple[object, int]:
        """The value and where it ends in `text` (read once: a longer text has the same); raises
        _Cut where the text ends inside it (the place is kept), ValueError where it is no value
        (the reader is then of no more use)."""
        self.text = text
        while self.done is None:
            self.done = self._step(text, self.i)
        return self.done

    def _step(self, text: str, i: int) -> tuple[object, int] | None:
        """One move from the place kept; the value when the outermost one is complete. The
        place changes only once a move is decided, so that a _Cut leaves it to be tried again."""
        if self.state == "value":
            i = _skip_spaces(text, i) if self.open else i
            if i < len(text) and text[i] in "{[":
                self.open.append(_Open("}", {}) if text[i] == "{" else _Open("]", []))
                self.i, self.state = i + 1, "first"
                return None
            return self._add(*_gemma_scalar(text, i))
        i = _skip_spaces(text, i)
        if i == len(text):
            raise _Cut
        top = self.open[-1]
        if self.state in ("first", "after") and text[i] == top.closing:
            self.open.pop()
            return self._add(top.items, i + 1)
        if self.state == "after":
            if text[i] != ",":
                raise ValueError(f"no ',' or {top.closing!r} at {i}")
            self.i, self.state = i + 1, "item"
        elif isinstance(top.items, dict):
            key = GEMMA_KEY.match(text, i)
            if key is None or key.end() == len(text):
                raise _Cut if key is not None else ValueError(f"no key at {i}")
            if text[key.end()] != ":":
                raise ValueError(f"no ':' after the key at {i}")
            top.key, self.i, self.state = key.group(), key.end() + 1, "value"
        else:
            self.i, self.state = i, "value"
        return None

    def _add(self, value: object, end: int) -> tuple[object, int] | None:
        """A value read whole: the result, or an item of the container it is in."""
        if not self.open:
            return value, end
        top = self.open[-1]
        if isinstance(top.items, dict):
            top.items[top.key] = value
        else:
            top.items.append(value)
        self.i, self.state = end, "after"
        return None


def _gemma_scalar(text: str, i: int) -> tuple[object, int]:
    """A string, number, true, false or null at `i` (tested on lengths before slicing the rest of
    the text: a slice per value is quadratic in a long text)."""
    rest = len(text) - i
    if rest == 0 or (rest < len(GEMMA_QUOTE) and GEMMA_QUOTE.startswith(text[i:])):
        raise _Cut
    if text.startswith(GEMMA_QUOTE, i):
        end = text.find(GEMMA_QUOTE, i + len(GEMMA_QUOTE))
        if end < 0:
            raise _Cut
        return text[i + len(GEMMA_QUOTE) : end], end + len(GEMMA_QUOTE)
    for word, value in GEMMA_LITERALS.items():
        if text.startswith(word, i):
            return value, i + len(word)
        if rest < len(word) and word.startswith(text[i:]):
            raise _Cut
    run = GEMMA_NUMBER_CHARS.match(text, i)
    end = run.end() if run else i
    if end == len(text):  # the number may go on
        raise _Cut
    if not GEMMA_NUMBER.fullmatch(text, i, end):
        raise ValueError(f"no value at {i}")
    return json.loads(text[i:end]), end


def text_arguments(tools: Iterable[dict]) -> dict[str, frozenset[str]]:
    """Per tool (OpenAI's {"type": "function", "function": {...}}), the arguments its parameters'
    schema types as strings only: those an XML form's call gives as text whatever they read as."""
    found = {}
    for tool in tools:
        function = tool.get("function") or {}
        properties = (function.get("parameters") or {}).get("properties")
        # A schema is the client's JSON, unchecked: properties that are no object type nothing
        typed = properties.items() if isinstance(properties, dict) else ()
        strings = [key for key, schema in typed if isinstance(schema, dict) and _is_string(schema)]
        found[function.get("name", "")] = frozenset(strings)
    return found


def _is_string(schema: dict) -> bool:
    kind = schema.get("type")
    if isinstance(kind, list):  # a union of types: a string, maybe null
        return "string" in kind and all(k in ("string", "null") for k in kind)
    return kind == "string"


def _xml_value(written: str):
    """An argument as an XML call writes it, on lines of its own: JSON when it reads as JSON (a
    number, an object, a quoted string), else the text itself. NaN and Infinity stay text."""
    value = written.removeprefix("\n").removesuffix("\n")
    try:
        return json.loads(value, parse_constant=_not_json)
    except (ValueError, RecursionError):
        return value


def _python_value(node: ast.expr):
    """A literal as Python writes it (a string, number, True, False, None, a list, tuple or dict of
    them; a dict's keys strings), or as JSON does (true, false, null); ValueError for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, type(None))):
        return node.value  # (bool is an int)
    if isinstance(node, ast.Name) and node.id in PYTHON_LITERALS:
        return PYTHON_LITERALS[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _python_value(node.operand)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError("a sign before no number")
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_python_value(item) for item in node.elts]
    if isinstance(node, ast.Dict):
        keys = [_python_value(key) if key is not None else None for key in node.keys]
        if not all(isinstance(key, str) for key in keys):
            raise ValueError("a dict key that is no string")
        return dict(zip(keys, (_python_value(value) for value in node.values)))
    raise ValueError(f"no literal: {type(node).__name__}")


def _dotted_name(node: ast.expr) -> str | None:
    """A function's name as a call writes it: a name, or names with dots between (Calendar.create_event)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        owner = _dotted_name(node.value)
        return f"{owner}.{node.attr}" if owner else None
    return None


def _not_json(constant: str):
    raise ValueError(f"{constant} is not standard JSON")


def _next_candidate(text: str, i: int) -> int:
    """The first position from i where a call region could start."""
    found = CANDIDATE.search(text, i)
    return found.start() if found else len(text)


def _after_marker(text: str, marker: str, ended: bool) -> "int | _More | None":
    """The position after `marker` at the start of text; MORE if text is a beginning of it."""
    if text.startswith(marker):
        return len(marker)
    if marker.startswith(text) and not ended:
        return MORE
    return None


def _skip_spaces(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def _opens_call(text: str, ended: bool) -> "bool | _More | None":
    """Whether text can begin a bare call: `{"` or `[{"` (whitespace between): held back only
    then, so that a brace or bracket in prose is handed out at once."""
    i = 0
    for expected in ("[{" if text[0] == "[" else "{") + '"':
        i = _skip_spaces(text, i)
        if i == len(text):
            return None if ended else MORE
        if text[i] != expected:
            return None
        i += 1
    return True


def _json_value(text: str, start: int, ended: bool, scans: dict | None = None):
    """(end, value) of the JSON object or array at `start`; MORE while it is unfinished; None
    if it is not JSON."""
    end = _balanced_end(text, start, scans)
    if end is None:
        return None if ended else MORE
    try:
        return end, json.loads(text[start:end])
    except RecursionError:  # nested deeper than Python reads (a model in a loop): JSON, but no call
        return end, None
    except ValueError:
        return None


def _balanced_end(text: str, start: int, scans: dict | None = None) -> int | None:
    """Where the bracketed JSON value at `start` closes (strings and escapes skipped), or None.
    `scans` keeps, per start, how far an unfinished value was scanned and the state there: a
    held-back value (a long call's arguments, an unclosed brace in prose) is read again at every
    step as the reply grows, and would otherwise be scanned from its start each time (quadratic
    in its length). The state at a point depends only on the text before it, so a text that
    begins with the scanned one resumes where that scan stopped."""
    if text[start] not in "[{":
        return None
    depth, in_string, escaped, resume = 0, False, False, start
    earlier = scans.get(start) if scans is not None else None
    if earlier is not None and text.startswith(earlier[0]):
        _, resume, depth, in_string, escaped = earlier
    for i in range(resume, len(text)):
        c = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
            if depth == 0:
                return i + 1
    if scans is not None:
        if len(scans) > 16:
            scans.clear()
        scans[start] = (text, len(text), depth, in_string, escaped)
    return None


# --- what a chat template does with tools --------------------------------------------------------

PROBE_TOOL, PROBE_ARG, PROBE_VALUE = "specllm_probe_tool", "specllm_probe_arg", "specllm_probe_value"
PROBE_CALL_ID = "call00001"  # 9 alphanumeric characters: Mistral's templates refuse other ids
GENERIC_START, GENERIC_NAME_TO_ARGUMENTS = '{"name": "', '", "arguments": '
# Calls that end a think block the reply left open, as llama.cpp's parsers for these templates
# read them (the model calls before it closes its reasoning): what the probe conversation holds,
# and the call's opening. Other templates' reasoning may write a call's markup and reason on.
CALLS_END_THINKING = (
    ((HERMES_OPEN + "\n" + XML_FUNCTION, XML_PARAMETER), HERMES_OPEN),  # Qwen3-Coder's parser: Qwen3.5, Nemotron 3
    (("<role>ASSISTANT</role>", HERMES_OPEN, GLM_KEY[0]), HERMES_OPEN),  # Ling 3.0
    ((DSML + "function_calls>",), DSML + "function_calls>"),  # DeepSeek V3.2
    ((DSML + "tool_calls>",), DSML + "tool_calls>"),  # DeepSeek V4
)


@dataclass(frozen=True)
class ToolTemplate:
    """What a chat template does with tools, found by rendering a probe tool and call."""

    renders_tools: bool
    object_arguments: bool = True  # it writes a call's arguments from an object (tojson), not a string
    call_start: str = GENERIC_START  # what it writes before a call's tool name
    name_to_arguments: str = GENERIC_NAME_TO_ARGUMENTS  # between the name and the arguments
    call_openings: tuple[str, ...] = ()  # a call's openings that end an open think block (CALLS_END_THINKING)

    def prefill(self, name: str | None) -> str:
        """The start of a call, to begin a reply with: up to the tool name (None: the model
        chooses it) or, given the name, up to its arguments."""
        if name is None:
            return self.call_start
        # A template may write the name twice (muse-glimmer's recipient, then its invoke tag)
        return self.call_start + name + self.name_to_arguments.replace(PROBE_TOOL, name)

    @property
    def call_marker(self) -> str:
        """What a call begins with after the reply's think block, up to the end of its first tag
        that names a call (`<tool_call>`, `[TOOL_CALLS]`, Kimi K3's `...<|open|>tools<|sep|>`), or
        its whole start where none does (functionary v3.1's `<function=`, Llama 3.1's bare JSON):
        text an answer beside tools is told from (GenerationConfig.call_opening). What follows
        the tag (a call id, the JSON's spacing) is the model's to write."""
        start = self.call_start
        for closing in CLOSINGS:  # Qwen3.5's starts "\n</think>\n\n": the reply's block, not the call
            start = start[start.rfind(closing) + len(closing) :] if closing in start else start
        start = start.strip()
        tag = next((m for m in _TAG_ENDS.finditer(start) if _NAMES_A_CALL.search(start[: m.end()])), None)
        return start[: tag.end()] if tag else start


_TAG_ENDS = re.compile(r"[>\]]")
_NAMES_A_CALL = re.compile(r"tool|call|function|action", re.IGNORECASE)
Render = Callable[[list[dict], "list[dict] | None", bool], str]  # (messages, tools, add_generation_prompt)


def inspect_template(render: Render) -> ToolTemplate:
    """Render a probe tool: a template that does not write it does not take tools. Then render a
    probe call, to learn how the template wants its arguments and how it writes a call."""
    user = {"role": "user", "content": "Hello"}
    tools = [probe_tool()]
    try:
        prompt = render([user], tools, True)
    except Exception:  # a template can raise anything: then it takes no tools
        return ToolTemplate(False)
    if PROBE_TOOL not in prompt:
        return ToolTemplate(False)
    for object_arguments in (True, False):
        try:
            reply = render([user, probe_call(object_arguments)], tools, False)
        except Exception:
            continue
        # An object the template only prints comes out as Python's repr: it wants a string.
        if object_arguments and (PROBE_VALUE not in reply or f"'{PROBE_ARG}': " in reply):
            continue
        return _call_form(prompt, reply, object_arguments)
    return ToolTemplate(True)


def _call_form(prompt: str, whole: str, object_arguments: bool) -> ToolTemplate:
    """How the template writes a call: the reply part of `whole` (the conversation with the
    probe call) after `prompt` (the conversation up to the reply)."""
    generic = ToolTemplate(True, object_arguments)
    if not whole.startswith(prompt) and opens_thinking(prompt):
        # Its prompt opens a think block that its own assistant turns write otherwise (Nemotron
        # 3's "<think></think>", GLM 4.7's "</think>") or not at all (MiniMax M2): they begin
        # where the opening does. (The call's start is placed after the prompt's block when a
        # call is prefilled: reasoning.after_think_block.)
        prompt = without_opening(prompt)
    elif not whole.startswith(prompt):
        prompt = without_empty_block(prompt)  # Gemma 4's, where thinking is off
    if not whole.startswith(prompt):
        return generic
    reply = whole[len(prompt) :]
    at = reply.find(PROBE_TOOL)
    start = reply[:at]  # as the template writes it; nothing where the prompt ends with its start (functionary v3.2's)
    if at < 0 or not (start.strip() or asks_recipient(prompt)):
        return generic
    after = at + len(PROBE_TOOL)
    # The arguments begin with a JSON object's brace, or, in the XML forms (Qwen3.5 and
    # Qwen3-Coder's <parameter=...>, GLM's <arg_key>), with the tag that names the argument, or in
    # LFM2's Python calls with a parenthesis: whichever comes last before the argument's name.
    argument = max(reply.find(PROBE_ARG, after), after)
    opening = max(reply.rfind(c, after, argument) for c in "{<(")
    between = reply[after:opening] if opening >= 0 else GENERIC_NAME_TO_ARGUMENTS
    openings = tuple(opening for held, opening in CALLS_END_THINKING if all(part in whole for part in held))
    return ToolTemplate(True, object_arguments, start, between, openings)


def probe_tool() -> dict:
    parameters = {"type": "object", "properties": {PROBE_ARG: {"type": "string"}}, "required": [PROBE_ARG]}
    return {"type": "function", "function": {"name": PROBE_TOOL, "description": "A probe", "parameters": parameters}}


def probe_call(object_arguments: bool) -> dict:
    arguments = {PROBE_ARG: PROBE_VALUE}
    function = {"name": PROBE_TOOL, "arguments": arguments if object_arguments else json.dumps(arguments)}
    call = {"id": PROBE_CALL_ID, "type": "function", "function": function}
    return {"role": "assistant", "content": "", "tool_calls": [call]}
