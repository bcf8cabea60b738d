"""The Responses API (`POST /v1/responses`) for `specllm serve`, as plain data like openai_api.py:
a request is read, checked and translated into a chat request, which the chat endpoint's own path
renders and generates from (as llama-server translates it); `ResponseReply` gives the reply as a
response object, or streams it as the API's events.

What the request says is translated as llama-server translates it: `instructions` is the system
message, the input's items are messages, an assistant's items in a row (its text, reasoning and
calls) one assistant message, `function_call_output` a tool message. Tools other than functions
(web search, file search, Codex's custom and local shell tools) are left out, as llama-server
leaves them: the model is shown the functions only. What cannot be honoured is refused: a stored
response or conversation to go on from, logprobs. Structured output (`text.format`) is chat's
response_format.
"""

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, PrivateAttr, Tag, field_validator

from specllm.engine.loop import DRAFTERS, Result
from specllm.serve.openai_api import (
    ApiError,
    ChatReply,
    ChatRequest,
    Delta,
    Reply,
    asks_nothing,
    check_drafter,
    finish_reason,
    refuse_non_text,
    specllm_stats,
    usage,
    validated,
)

# Fields that ask for what serve cannot do, and their values that ask nothing.
REFUSED: dict[str, tuple[object, ...]] = {
    "conversation": (None,),  # a conversation kept by the server: serve keeps none
    "prompt": (None,),  # a prompt template stored with OpenAI
    "background": (None, False),
    "truncation": (None, "disabled"),  # "auto" drops input to fit: serve refuses a prompt too long instead
    "top_logprobs": (None, 0),
    "max_tool_calls": (None,),
}
# The chat request's fields of the same name and meaning, and serve's extensions, passed on as sent
PASSED = (
    "temperature", "top_p", "parallel_tool_calls", "stream",
    "seed", "top_k", "min_p", "drafter", "gamma", "chat_template_kwargs", "stop",
)  # fmt: skip
TEXT_PARTS = ("input_text", "output_text")
# The chat request's fields that a Responses request names otherwise: a refusal names them as sent
RENAMED = {"reasoning_effort": "reasoning.effort"}


def _text_parts_only(content):
    """An image or file part is refused by name."""
    return refuse_non_text(content, TEXT_PARTS, "content parts")


class TextContent(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["input_text", "output_text"]
    text: str


def _text(content: "str | list[TextContent]") -> str:
    """Content as a chat message's text: parts joined as the chat endpoint joins them."""
    return content if isinstance(content, str) else "\n".join(part.text for part in content)


class MessageItem(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)  # its id and status say nothing to a template
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[TextContent]
    _parts = field_validator("content", mode="before")(_text_parts_only)


class FunctionCallItem(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str  # JSON, as the API gives it


class FunctionCallOutputItem(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[TextContent]
    _parts = field_validator("output", mode="before")(_text_parts_only)


class ReasoningText(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    text: str


class ReasoningItem(BaseModel):
    """A reasoning item given back: its text (`content`) goes to the template as the assistant's
    reasoning. Its summary is not the reasoning, and encrypted content (OpenAI's models') cannot
    be read: an item with neither text gives none."""

    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["reasoning"]
    summary: list[ReasoningText] = []
    content: list[ReasoningText] | None = None

    @property
    def text(self) -> str:
        return "".join(part.text for part in self.content or ())


ITEMS = {"message": MessageItem, "function_call": FunctionCallItem}
ITEMS |= {"function_call_output": FunctionCallOutputItem, "reasoning": ReasoningItem}


def _item_type(item) -> str:
    """An input item's type: a message's may be left out."""
    kind = item.get("type", "message") if isinstance(item, dict) else getattr(item, "type", "message")
    return kind if isinstance(kind, str) else "message"


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_type),
]


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["function"]
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")  # as the chat endpoint's, as OpenAI's
    description: str | None = None
    parameters: dict | None = None  # a JSON schema
    strict: bool | None = None

    def to_chat(self) -> dict:
        function = self.model_dump(exclude_none=True, exclude={"type"})
        return {"type": "function", "function": function}


class HostedTool(BaseModel):
    """A tool the model cannot call through a chat template (web_search, file_search, Codex's
    custom and local_shell, ...): left out of the tools the model is shown."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: str


def _tool_type(tool) -> str:
    kind = tool.get("type") if isinstance(tool, dict) else getattr(tool, "type", None)
    return "function" if kind == "function" or not isinstance(kind, str) else "hosted"


ResponsesTool = Annotated[
    Annotated[FunctionTool, Tag("function")] | Annotated[HostedTool, Tag("hosted")], Discriminator(_tool_type)
]


class FunctionChoice(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["function"]
    name: str


class ReasoningOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)  # summary: the reasoning is given whole
    effort: str | None = None


class TextFormat(BaseModel):
    """The Responses API's structured output (the Agents SDK's `output_type`): chat's
    response_format in a flatter shape, the schema beside its type."""

    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict | None = Field(None, alias="schema")
    strict: bool | None = None

    def response_format(self) -> dict:
        """As chat's response_format says it."""
        if self.type != "json_schema":
            return {"type": self.type}
        wrapped = {"name": self.name, "schema": self.schema_, "strict": self.strict}
        return {"type": "json_schema", "json_schema": {k: v for k, v in wrapped.items() if v is not None}}


class TextOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)  # verbosity: a hint to OpenAI's models
    format: TextFormat | None = None


class ResponsesRequest(BaseModel):
    """A Responses API request. Unknown fields are ignored, as the chat endpoint ignores them
    (service_tier, safety_identifier, prompt_cache_retention, stream_options, ...)."""

    model_config = ConfigDict(extra="allow", strict=True)
    model: str | None = None  # any name: the server has one model
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[ResponsesTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    reasoning: ReasoningOptions | None = None
    text: TextOptions | None = None
    include: list[str] | None = None
    previous_response_id: str | None = None
    # taken and ignored: serve stores nothing, and its KV cache is reused whatever the key
    store: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    prompt_cache_key: str | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _known_items(cls, value):
        """An item of a type serve does not take is refused by name, not by the union's words."""
        for i, item in enumerate(value if isinstance(value, list) else ()):
            if (kind := _item_type(item)) not in ITEMS:
                taken = ", ".join(ITEMS)
                raise ValueError(f"input.{i} is a {kind!r} item, which specllm serve does not take (only {taken})")
        return value

    def check(self) -> None:
        """What the types alone do not say."""
        if self.previous_response_id is not None:
            message = (
                "previous_response_id is not supported by specllm serve: it keeps no responses; "
                "send the whole conversation as input"
            )
            raise ApiError(400, message, "previous_response_id")
        for name, harmless in REFUSED.items():
            if not asks_nothing((self.model_extra or {}).get(name), harmless):
                raise ApiError(400, f"{name} is not supported by specllm serve", name)
        if "message.output_text.logprobs" in (self.include or ()):
            raise ApiError(400, "include: message.output_text.logprobs is not supported by specllm serve", "include")
        if self.input == [] and self.instructions is None:
            raise ApiError(400, "input: give at least one item", "input")

    def chat_body(self) -> dict:
        """The chat request this request asks for, as JSON."""
        extra = self.model_extra or {}
        body = {name: extra[name] for name in PASSED if name in extra}
        body["messages"] = self.messages()
        tools = [tool.to_chat() for tool in self.tools or () if isinstance(tool, FunctionTool)]
        if tools:
            body["tools"] = tools
        if isinstance(self.tool_choice, FunctionChoice):
            body["tool_choice"] = {"type": "function", "function": {"name": self.tool_choice.name}}
        elif self.tool_choice is not None:
            body["tool_choice"] = self.tool_choice
        if self.max_output_tokens is not None:
            body["max_tokens"] = self.max_output_tokens
        if self.reasoning is not None and self.reasoning.effort is not None:
            body["reasoning_effort"] = self.reasoning.effort
        if self.text is not None and self.text.format is not None:
            body["response_format"] = self.text.format.response_format()
        return body

    def messages(self) -> list[dict]:
        """The conversation as chat messages: an assistant's items in a row are one message."""
        messages = [{"role": "system", "content": self.instructions}] if self.instructions is not None else []
        if isinstance(self.input, str):
            return [*messages, {"role": "user", "content": self.input}]
        for item in self.input:
            if isinstance(item, MessageItem) and item.role != "assistant":
                messages.append({"role": item.role, "content": _text(item.content)})
            elif isinstance(item, FunctionCallOutputItem):
                messages.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output)})
            else:
                _add_to_assistant_turn(messages, item)
        return messages

    def _format(self) -> dict:
        """text.format as a response repeats it."""
        if self.text is None or self.text.format is None:
            return {"type": "text"}
        return self.text.format.model_dump(by_alias=True, exclude_none=True)

    def echo(self) -> dict:
        """The request's settings, as a response object repeats them."""
        extra, choice = self.model_extra or {}, self.tool_choice or "auto"
        return {
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "parallel_tool_calls": extra.get("parallel_tool_calls", True),
            "previous_response_id": None,
            "reasoning": {"effort": self.reasoning.effort if self.reasoning else None, "summary": None},
            "store": False,  # nothing is kept
            "temperature": extra.get("temperature"),
            "text": {"format": self._format()},
            "tool_choice": choice.model_dump() if isinstance(choice, BaseModel) else choice,
            "tools": [tool.model_dump() for tool in self.tools or ()],
            "top_p": extra.get("top_p"),
            "truncation": "disabled",
            "user": self.user,
            "metadata": self.metadata or {},
        }


def _add_to_assistant_turn(messages: list[dict], item: MessageItem | FunctionCallItem | ReasoningItem) -> None:
    """An assistant's message, call or reasoning, added to the assistant message the conversation
    ends with, or to a new one: its texts and its reasonings each joined by lines, as the chat
    endpoint joins a message's text parts."""
    if not messages or messages[-1]["role"] != "assistant":
        messages.append({"role": "assistant", "content": ""})
    turn = messages[-1]
    if isinstance(item, MessageItem):
        turn["content"] = "\n".join(filter(None, (turn["content"], _text(item.content))))
    elif isinstance(item, FunctionCallItem):
        call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
        turn.setdefault("tool_calls", []).append(call)
    elif item.text:
        turn["reasoning_content"] = "\n".join(filter(None, (turn.get("reasoning_content"), item.text)))


class ResponsesChat(ChatRequest):
    """The chat request a Responses request is translated into: generated as any chat request,
    answered in the Responses API's shapes."""

    _echo: dict = PrivateAttr(default_factory=dict)
    _call_items: list[int] = PrivateAttr(default_factory=list)  # each call's input item, in order

    def reply(self, model: str, left_out: int = 0, prompt_tokens: int = 0) -> "ResponseReply":
        return ResponseReply(True, model, echo=self._echo)

    def arguments_not_an_object(self) -> str | None:
        """The field as the client sent it (`input.N.arguments`), not as the chat request has it."""
        at = self.call_not_an_object()
        return None if at is None else f"input.{self._call_items[at[2]]}.arguments"


def parse_responses(body: bytes, drafters: tuple[str, ...] = DRAFTERS) -> ResponsesChat:
    """A Responses request body (JSON bytes), checked and translated; every problem is an ApiError 400."""
    request = validated(ResponsesRequest, body)
    request.check()
    chat = validated(ResponsesChat, json.dumps(request.chat_body()).encode())
    try:
        chat.check()
    except ApiError as e:
        if e.param in RENAMED:
            e.message, e.param = e.message.replace(e.param, RENAMED[e.param], 1), RENAMED[e.param]
        raise
    check_drafter(chat, drafters)
    chat._echo = request.echo()
    chat._call_items = [i for i, item in enumerate(request.input) if isinstance(item, FunctionCallItem)]
    return chat


# --- responses ----------------------------------------------------------------------------------


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def reasoning_item(item_id: str, text: str, status: str) -> dict:
    content = [{"type": "reasoning_text", "text": text}] if text else []
    return {"id": item_id, "type": "reasoning", "summary": [], "content": content, "status": status}


def message_item(item_id: str, text: str, status: str) -> dict:
    content = [output_text(text)] if text or status != "in_progress" else []
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}


def output_text(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def function_call_item(call: dict, status: str, arguments: str | None = None) -> dict:
    """A call as ToolReply reads it, as an output item (`arguments`: in place of the call's own)."""
    function = call["function"]
    return {
        "id": f"fc_{call['id']}",
        "type": "function_call",
        "status": status,
        "call_id": call["id"],  # as the reader made it: Mistral's templates take back only its 9 characters
        "name": function["name"],
        "arguments": function["arguments"] if arguments is None else arguments,
    }


def response_usage(result: Result, read: ChatReply | None) -> dict:
    counts = usage(result, read)
    return {
        "input_tokens": counts["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": counts["prompt_tokens_details"]["cached_tokens"]},
        "output_tokens": counts["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": read.reasoning_tokens if read is not None else 0},
        "total_tokens": counts["total_tokens"],
    }


def ended(result: Result, read: ChatReply | None) -> tuple[str, dict | None]:
    """A finished response's status and incomplete_details: incomplete when the reply was cut
    (max_output_tokens, or the context full) rather than ended by the model or a call."""
    finish = finish_reason(result.stop_reason)
    if (read.finish_reason(finish) if read is not None else finish) == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    return "completed", None


class OutputItems:
    """A response's output items as its deltas open, fill and close them, and the events that say
    so, numbered. An item is closed when an item of another kind begins: reasoning, the answer's
    text and each call, in the order the reply gives them (text after a call is a new message
    item). A whole response's items are made the same way, from its reply's parts."""

    TEXT_EVENTS = {"reasoning": "response.reasoning_text", "message": "response.output_text"}

    def __init__(self):
        self.items: list[dict] = []
        self.open: str | None = None  # the kind of the last item, while it is being written
        self.text = ""  # the open item's text so far
        self.sequence = 0

    def event(self, kind: str, **fields) -> dict:
        event = {"type": kind, "sequence_number": self.sequence} | fields
        self.sequence += 1
        return event

    def add(self, part: dict) -> list[dict]:
        """The events of a part of a delta: reasoning, text or calls."""
        if "tool_calls" in part:
            return [event for call in part["tool_calls"] for event in self.call(call)]
        return self.write("reasoning" if "reasoning" in part else "message", part.get("reasoning") or part["text"])

    def write(self, kind: str, text: str) -> list[dict]:
        """The events of `text` added to the reasoning or to the answer (`kind`). The text after
        a call begins a new message item at its first character that is not whitespace (the
        whitespace between a call's markup and the text is neither's)."""
        if kind == "message" and self.open != kind and self.items and self.items[-1]["type"] == "function_call":
            text = text.lstrip()
            if not text:
                return []
        events = [] if self.open == kind else self.close() + self._begin(kind)
        self.text += text
        delta = self.event(f"{self.TEXT_EVENTS[kind]}.delta", **self._where(), delta=text, **self._logprobs(kind))
        return [*events, delta]

    def call(self, call: dict) -> list[dict]:
        """The events of a call, which the reader gives whole."""
        events, index = self.close(), len(self.items)
        item = function_call_item(call, "completed")
        self.items.append(item)
        where, arguments = {"item_id": item["id"], "output_index": index}, item["arguments"]
        added = function_call_item(call, "in_progress", "")
        return [
            *events,
            self.event("response.output_item.added", output_index=index, item=added),
            self.event("response.function_call_arguments.delta", **where, delta=arguments),
            self.event("response.function_call_arguments.done", **where, name=item["name"], arguments=arguments),
            self.event("response.output_item.done", output_index=index, item=item),
        ]  # fmt: skip

    def close(self, status: str = "completed") -> list[dict]:
        """The events that end the item being written, if any (`status`: the item's at its end)."""
        if self.open is None:
            return []
        kind, where = self.open, self._where()
        part = self._part(kind, self.text)
        self.items[-1] = item = self._item(kind, self.items[-1]["id"], self.text, status)
        self.open, self.text = None, ""
        return [
            self.event(f"{self.TEXT_EVENTS[kind]}.done", **where, text=part["text"], **self._logprobs(kind)),
            self.event("response.content_part.done", **where, part=part),
            self.event("response.output_item.done", output_index=where["output_index"], item=item),
        ]

    def _begin(self, kind: str) -> list[dict]:
        item = self._item(kind, _item_id("rs" if kind == "reasoning" else "msg"), "", "in_progress")
        self.items.append(item)
        self.open = kind
        where = self._where()
        return [
            self.event("response.output_item.added", output_index=where["output_index"], item=item),
            self.event("response.content_part.added", **where, part=self._part(kind, "")),
        ]

    def _where(self) -> dict:
        return {"item_id": self.items[-1]["id"], "output_index": len(self.items) - 1, "content_index": 0}

    @staticmethod
    def _item(kind: str, item_id: str, text: str, status: str) -> dict:
        return (reasoning_item if kind == "reasoning" else message_item)(item_id, text, status)

    @staticmethod
    def _logprobs(kind: str) -> dict:
        """An answer's text events carry (empty) logprobs; reasoning's none."""
        return {"logprobs": []} if kind == "message" else {}

    @staticmethod
    def _part(kind: str, text: str) -> dict:
        return output_text(text) if kind == "message" else {"type": "reasoning_text", "text": text}


@dataclass(frozen=True)
class ResponseReply(Reply):
    """The Responses API's objects: the response, or its events, each with an `event:` line, a
    `type` and a `sequence_number`, ending with response.completed, response.incomplete or
    response.failed (no [DONE]). `echo`: the request's settings the response repeats."""

    echo: dict = field(default_factory=dict)
    items: OutputItems = field(default_factory=OutputItems)
    END_OF_STREAM: ClassVar[str | None] = None

    def complete(self, result: Result, seed: int, read: ChatReply | None = None) -> dict:
        """The whole response: its items made as a stream of the reply's parts makes them."""
        status, details = ended(result, read)
        items = OutputItems()
        for part in read.parts if read is not None else [{"text": result.text}] if result.text else []:
            items.add(part)
        items.close("incomplete" if status == "incomplete" else "completed")  # the item that was cut, if any
        return self._response(status, items.items, result, seed, read) | {"incomplete_details": details}

    def opening(self) -> list[dict]:
        snapshot = self._response("in_progress", [])
        return [
            self.items.event("response.created", response=snapshot),
            self.items.event("response.in_progress", response=snapshot),
        ]

    def deltas(self, delta: Delta) -> list[dict]:
        return [event for part in delta for event in self.items.add(part)]

    def closing(self, result: Result, seed: int, read: ChatReply | None, include_usage: bool) -> list[dict]:
        status, details = ended(result, read)
        events = self.items.close("incomplete" if status == "incomplete" else "completed")
        response = self._response(status, self.items.items, result, seed, read) | {"incomplete_details": details}
        return [*events, self.items.event(f"response.{status}", response=response)]

    def failure(self, error: ApiError) -> list[dict]:
        events = self.items.close("incomplete")
        response = self._response("failed", self.items.items) | {
            "error": {"code": error.code or "server_error", "message": error.message}
        }
        return [*events, self.items.event("response.failed", response=response)]

    def sse(self, event: dict | str) -> str:
        assert isinstance(event, dict)  # no [DONE]
        return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"

    def _response(
        self,
        status: str,
        output: list[dict],
        result: Result | None = None,
        seed: int = 0,
        read: ChatReply | None = None,
    ) -> dict:
        texts = [part["text"] for item in output if item["type"] == "message" for part in item["content"]]
        body = {
            "id": f"resp_{self.id}",
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": None,
            "incomplete_details": None,
            "model": self.model,
            "output": list(output),
            "output_text": "".join(texts),  # the SDKs' convenience, for a client that reads it from the JSON
            "usage": response_usage(result, read) if result is not None else None,
        }
        if result is not None:
            body |= {"completed_at": int(time.time()), "specllm": specllm_stats(result, seed)}
        return body | self.echo
