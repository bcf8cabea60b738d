"""Tools for a model whose chat template renders none (Gemma 2's and 3's, Phi-3's, Mistral 7B v0.1's,
plain ChatML): llama.cpp's "generic" chat format, which llama-server long used for such templates.

- The prompt: the offered tools, as JSON, and how to answer are told in the system message (after
  the first system message's own text, or in a new one); the template renders no `tools`.
- The reply: a JSON schema (so a grammar) allows one JSON object, a call or an answer:
  `{"tool_calls": [{"name": ..., "arguments": {...}}, ...]}` (`{"tool_call": {...}}`, one call,
  where parallel calls are not allowed) or `{"response": "..."}` (the answer; beside a
  response_format, the structure's value). tool_choice `required` or a named tool allows only the
  call, to the named tool only.
- Earlier turns: an assistant's calls are written as its content, in the same JSON, and a tool's
  result as a user message, `{"tool_response": {"tool": NAME, "content": ...}}` (consecutive
  results in one message: templates such as Gemma's and Mistral's want roles to alternate).
- Reading the reply (GenericReader): an answer's string is handed out as it grows, a call once
  the reply has ended.
"""

import json
import re

from specllm.serve.tool_calls import ToolCall, ToolCallParser

RESPONSE, CALL, CALLS = "response", "tool_call", "tool_calls"
ANY_OBJECT = {"type": "object"}


def reply_schema(tools: list[dict], forced: str | None, required: bool, parallel: bool, answer: dict | None) -> dict:
    """The JSON schema of a reply: a call to one of `tools` (OpenAI's tool objects; to `forced`
    alone where named), or, unless a call is `required`, an answer (`answer`'s value, else a string).
    A tool's parameters or the answer's schema that refers within itself (pydantic's `$defs`)
    goes in the reply's `$defs`, its `$ref`s pointing there (they would point at nothing)."""
    defs: dict[str, dict] = {}
    calls = [
        _call_schema(tool["function"], f"tools.{i}.function.parameters", defs)
        for i, tool in enumerate(tools)
        if forced in (None, tool["function"]["name"])
    ]
    call = calls[0] if len(calls) == 1 else {"anyOf": calls}
    many: dict = {"type": "array", "items": call, "minItems": 1}
    calling = _object_of(CALLS, many) if parallel else _object_of(CALL, call)
    if required or forced is not None:
        return _with_defs(calling, defs)
    answering = _object_of(RESPONSE, _embedded(answer or {"type": "string"}, "response_format", defs))
    return _with_defs({"anyOf": [calling, answering]}, defs)


def _call_schema(function: dict, where: str, defs: dict[str, dict]) -> dict:
    name = {"type": "string", "const": function["name"]}
    arguments = function.get("parameters") or ANY_OBJECT  # none: any object, as a call's arguments are
    arguments = _embedded(arguments, where, defs)
    return {"type": "object", "properties": {"name": name, "arguments": arguments}, "required": ["name", "arguments"]}


def _object_of(key: str, value: dict) -> dict:
    return {"type": "object", "properties": {key: value}, "required": [key]}


def _embedded(schema: dict, key: str, defs: dict[str, dict]) -> dict:
    """`schema` as the reply's schema holds it: itself, or, where it refers within itself, a $ref
    to its copy in `defs` under `key`, each of its own $refs ("#", "#/...") pointing into that copy."""
    if not _refers_within(schema):
        return schema
    rerooted = _rerooted(schema, f"#/$defs/{key}")
    assert isinstance(rerooted, dict)  # a dict is copied as a dict
    defs[key] = rerooted
    return {"$ref": f"#/$defs/{key}"}


def _refers_within(node: object) -> bool:
    if isinstance(node, dict):
        ref = node.get("$ref")
        return (isinstance(ref, str) and ref.startswith("#")) or any(map(_refers_within, node.values()))
    return isinstance(node, list) and any(map(_refers_within, node))


def _rerooted(node: object, root: str) -> object:
    """`node` with each $ref within it ("#" and "#/..." alike) read from `root` instead."""
    if isinstance(node, list):
        return [_rerooted(item, root) for item in node]
    if not isinstance(node, dict):
        return node
    copy = {key: _rerooted(value, root) for key, value in node.items()}
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        copy["$ref"] = root + ref[1:]
    return copy


def _with_defs(schema: dict, defs: dict[str, dict]) -> dict:
    return schema | {"$defs": defs} if defs else schema


def instructions(tools: list[dict], forced: str | None, required: bool, parallel: bool) -> str:
    """What the system message tells the model: the tools, and the JSON its reply must be."""
    described = json.dumps(tools, indent=2, ensure_ascii=False)
    call = '{"name": "...", "arguments": {...}}'
    calling = f'{{"{CALLS}": [{call}, ...]}}' if parallel else f'{{"{CALL}": {call}}}'
    if forced is not None:
        told = f"Respond in JSON format with a call to the tool `{forced}`: {calling}"
    elif required:
        told = f"Respond in JSON format with a request to call tools: {calling}"
    else:
        told = (
            f"Respond in JSON format, either with `{CALLS if parallel else CALL}` (a request to call tools: "
            f'{calling}) or with `{RESPONSE}` (your reply to the user\'s request: {{"{RESPONSE}": "..."}})'
        )
    return f"You can call any of the following tools to satisfy the user's requests: {described}\n\n{told}"


def with_system_text(messages: list[dict], text: str) -> list[dict]:
    """`text` after the first system message's own (a blank line between), or as a new system message."""
    if messages and messages[0].get("role") == "system":
        first = messages[0]
        return [first | {"content": f"{first['content']}\n\n{text}" if first["content"] else text}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def in_text(messages: list[dict], parallel: bool) -> list[dict]:
    """The conversation (messages as a template gets them) with its earlier calls and their results
    written as text any template takes: an assistant's calls as JSON content, in the form its reply
    takes (`{"tool_call": ...}` for one call where parallel calls are not allowed); a tool's result
    as a user message, a run of results as one."""
    names = {call["id"]: call["function"]["name"] for m in messages for call in m.get("tool_calls") or ()}
    written: list[dict] = []
    after_result = False  # the last message written is a tool's result
    for message in messages:
        if message["role"] == "tool":
            result = _result_as_text(message, names)
            if after_result:
                written[-1] = written[-1] | {"content": written[-1]["content"] + "\n" + result}
            else:
                written.append({"role": "user", "content": result})
        else:
            written.append(_calls_as_content(message, parallel) if message.get("tool_calls") else message)
        after_result = message["role"] == "tool"
    return written


def _calls_as_content(message: dict, parallel: bool) -> dict:
    calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in message["tool_calls"]]
    written: dict[str, object] = {CALL: calls[0]} if len(calls) == 1 and not parallel else {CALLS: calls}
    if message.get("content"):  # text beside the calls is kept, as llama.cpp kept it
        written["content"] = message["content"]
    rest = {key: value for key, value in message.items() if key not in ("tool_calls", "content")}
    return rest | {"content": json.dumps(written, ensure_ascii=False)}


def _result_as_text(message: dict, names: dict[str, str]) -> str:
    name = message.get("name") or names.get(message.get("tool_call_id") or "")
    result = ({"tool": name} if name else {}) | {"content": message["content"]}
    return json.dumps({"tool_response": result}, ensure_ascii=False)


# The reply, as the schema makes it: whitespace where the grammar allows it.
_ANSWER_STRING = re.compile(r'\s*\{\s*"response"\s*:\s*"')
_ANSWER_VALUE = re.compile(r'\s*\{\s*"response"\s*:\s*')
_OBJECT_END = re.compile(r"\s*\}\s*")


class GenericReader:
    """A generic reply read as it is generated, as ToolCallParser is read (feed_in_order, then
    finish_in_order): an answer's string is handed out as its characters come (an escape once
    whole), so a client sees it grow; a call, or a structured answer (its JSON as the model wrote
    it), once the reply has ended. What is not a whole call or answer (a reply cut short by
    max_tokens) is text as written."""

    def __init__(self, tool_names: list[str]):
        self.names = tool_names
        self.text = ""  # the reply so far
        self.at: int | None = None  # where the answer's string characters not handed out yet begin
        self.closed = False  # the answer's string has ended

    def feed_in_order(self, text: str) -> "list[str | ToolCall]":
        self.text += text
        return self._answer_so_far()

    def finish_in_order(self) -> "list[str | ToolCall]":
        parts = self._answer_so_far()
        return parts if self.at is not None else self._whole()

    def _answer_so_far(self) -> "list[str | ToolCall]":
        if self.at is None:
            head = _ANSWER_STRING.match(self.text)
            if head is None:
                return []
            self.at = head.end()
        if self.closed:
            return []
        end, self.closed = _string_end(self.text, self.at)
        piece, self.at = _decoded(self.text[self.at : end]), end
        return [piece] if piece else []

    def _whole(self) -> "list[str | ToolCall]":
        """The reply once ended, when it is no answer's string: its calls, or the structured
        answer's JSON, or its text."""
        text = self.text.strip()
        parser = ToolCallParser(self.names)
        parts = parser.feed_in_order(text) + parser.finish_in_order()
        if any(isinstance(part, ToolCall) for part in parts):
            return parts
        answer = _answer_value(text)
        return [answer if answer is not None else text] if text else []


def _answer_value(text: str) -> str | None:
    """The structured answer's JSON as written ({"response": VALUE}), or None where the text is no answer."""
    head = _ANSWER_VALUE.match(text)
    if head is None:
        return None
    try:
        _, end = json.JSONDecoder().raw_decode(text, head.end())
    except ValueError:
        return None
    return text[head.end() : end] if _OBJECT_END.fullmatch(text, end) else None


def _string_end(text: str, i: int) -> tuple[int, bool]:
    """Where the JSON string's characters from `i` may be decoded up to (not into an escape that
    is not all here yet), and whether the string's closing quote is there."""
    while i < len(text):
        if text[i] == '"':
            return i, True
        if text[i] != "\\":
            i += 1
            continue
        length = _escape_length(text, i)
        if length is None:
            return i, False
        i += length
    return i, False


def _escape_length(text: str, i: int) -> int | None:
    """The length of the escape at `i`; None while it is not all here. A high surrogate's escape
    takes the low one's after it with it (an emoji's pair is never split between two pieces)."""
    if i + 1 == len(text):
        return None
    if text[i + 1] != "u":
        return 2
    if i + 6 > len(text):
        return None
    if not _HIGH_SURROGATE.fullmatch(text, i, i + 6):
        return 6
    after = text[i + 6 : i + 12]
    if len(after) < 6 and "\\u".startswith(after[:2]):  # the low one may be coming
        return None
    return 12 if _LOW_SURROGATE.fullmatch(after) else 6


_HIGH_SURROGATE = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}")
_LOW_SURROGATE = re.compile(r"\\u[dD][c-fC-F][0-9a-fA-F]{2}")


def _decoded(characters: str) -> str:
    """A JSON string's characters as text; a lone surrogate (no UTF-8 can carry one) as U+FFFD."""
    try:
        text = json.loads(f'"{characters}"', strict=False)
    except ValueError:  # the grammar allows no bad escape; without one, the characters as written
        return characters
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
