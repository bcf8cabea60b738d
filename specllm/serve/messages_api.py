"""Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`) for `specllm
serve`, as plain data like responses_api.py: a request is read, checked and translated into a chat
request, which the chat endpoint's own path renders and generates from (as llama-server translates
it); `MessageReply` gives the reply as a message, or streams it as the API's events. Claude Code
and the `anthropic` SDK speak it.

The translation: `system`, and the text of any message of role system, is the system message
(chat templates take one at the start only); a user message's text blocks are a user message,
each `tool_result` a tool message, in the order given; an assistant message's text, `thinking` and
`tool_use` blocks are one assistant message with its content, reasoning and calls. Consecutive
messages of one role are one turn, as Anthropic combines them. Tools with a `type` other than
`custom` (Anthropic's server tools: web search, code execution, ...) are left out, as the Responses
API's hosted tools are: the model is shown the custom ones. What cannot be honoured is refused:
images and documents, a last message from the assistant (a reply to continue), MCP servers.
"""

import json
from dataclasses import dataclass, field
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

from specllm.engine.loop import DRAFTERS, Result
from specllm.serve.openai_api import (
    MAX_STOPS,
    ApiError,
    ChatReply,
    ChatRequest,
    Delta,
    Reply,
    asks_nothing,
    check_drafter,
    check_schema,
    finish_reason,
    refuse_non_text,
    specllm_stats,
    type_of,
    usage,
    validated,
)

# Fields that ask for what serve cannot do, and their values that ask nothing.
REFUSED: dict[str, tuple[object, ...]] = {
    "mcp_servers": (None, []),  # MCP servers for Anthropic's side to call: serve calls none
    "container": (None,),  # a container for code execution and skills to run in
}
# The chat request's fields of the same name and meaning, and serve's extensions, passed on as sent
PASSED = ("temperature", "top_p", "top_k", "stream", "seed", "min_p", "drafter", "gamma", "chat_template_kwargs")
# The blocks a message may hold, by role; images and documents are refused by name (NOT_TEXT)
BLOCKS = {
    "user": ("text", "tool_result"),
    "assistant": ("text", "thinking", "redacted_thinking", "tool_use"),
    "system": ("text",),
}
TAKEN = tuple(dict.fromkeys(kind for kinds in BLOCKS.values() for kind in kinds))
NOT_TEXT = ("image", "document")
BILLING_HEADER = "x-anthropic-billing-header:"
STAMP_LENGTH = 5  # the characters of the header's `cch=` stamp


def _text_only(blocks, refused: tuple[str, ...] = ()):
    """A block that is not text (any, or those `refused`: an image, a document) is refused by name."""
    return refuse_non_text(blocks, ("text",), "content blocks", refused)


def _known_blocks(blocks):
    """A block of a type serve does not take is refused by name, not by the union's words."""
    _text_only(blocks, NOT_TEXT)
    if blocks == []:
        raise ValueError("give at least one content block")
    for i, block in enumerate(blocks if isinstance(blocks, list) else ()):
        kind = type_of(block)
        if kind is None:
            raise ValueError(f"block {i} has no type")
        if kind not in TAKEN:
            only = ", ".join(TAKEN)
            raise ValueError(f"block {i} is a {kind!r} block, which specllm serve does not take (only {only})")
    return blocks


class TextBlock(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)  # cache_control, citations: nothing to a template
    type: Literal["text"]
    text: str


def _parts(blocks: list[TextBlock]) -> list[dict]:
    """Text blocks as a chat message's text parts, which the chat endpoint joins."""
    return [{"type": "text", "text": block.text} for block in blocks]


class ToolUseBlock(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict

    def to_chat(self) -> dict:
        arguments = json.dumps(self.input, ensure_ascii=False)
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": arguments}}


class ToolResultBlock(BaseModel):
    """A call's result, as a tool message. `is_error` is not told to the template (it has no place
    for it, and llama-server drops it too): the result's text says what went wrong."""

    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] = ""
    is_error: bool | None = None
    _text = field_validator("content", mode="before")(_text_only)

    def to_chat(self) -> dict:
        content = self.content if isinstance(self.content, str) else _parts(self.content)
        return {"role": "tool", "tool_call_id": self.tool_use_id, "content": content}


class ThinkingBlock(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)  # its signature: serve signs nothing, checks nothing
    type: Literal["thinking"]
    thinking: str


class RedactedThinkingBlock(BaseModel):
    """Reasoning Anthropic's models encrypted: it cannot be read, and gives none."""

    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["redacted_thinking"]


Block = Annotated[
    Annotated[TextBlock, Tag("text")]
    | Annotated[ToolUseBlock, Tag("tool_use")]
    | Annotated[ToolResultBlock, Tag("tool_result")]
    | Annotated[ThinkingBlock, Tag("thinking")]
    | Annotated[RedactedThinkingBlock, Tag("redacted_thinking")],
    Discriminator(type_of),
]


class MessageParam(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["user", "assistant", "system"]
    content: str | list[Block]
    _blocks = field_validator("content", mode="before")(_known_blocks)

    @model_validator(mode="after")
    def _blocks_of_its_role(self):
        for i, block in enumerate(self.blocks):
            if block.type not in BLOCKS[self.role]:
                belongs = next(role for role, kinds in BLOCKS.items() if block.type in kinds)
                raise ValueError(f"content.{i}: a {block.type} block belongs in a message of role {belongs}")
        return self

    @property
    def blocks(self) -> list:
        return [TextBlock(type="text", text=self.content)] if isinstance(self.content, str) else list(self.content)

    def to_chat(self) -> list[dict]:
        """The message as chat messages: a user's text blocks in a row are one user message, each
        tool result a tool message; an assistant's blocks are one assistant message."""
        if self.role == "assistant":
            return [self._assistant()]
        messages: list[dict] = []
        for block in self.blocks:
            if isinstance(block, ToolResultBlock):
                messages.append(block.to_chat())
            elif messages and messages[-1]["role"] == self.role:
                messages[-1]["content"] += _parts([block])
            else:
                messages.append({"role": self.role, "content": _parts([block])})
        return messages

    def _assistant(self) -> dict:
        """Its texts as the content, its thinking as the reasoning (joined by lines, as the chat
        endpoint joins text parts), its tool_use blocks as calls."""
        blocks = self.blocks
        texts = [block for block in blocks if isinstance(block, TextBlock)]
        message: dict = {"role": "assistant", "content": _parts(texts) or ""}
        if calls := [block.to_chat() for block in blocks if isinstance(block, ToolUseBlock)]:
            message["tool_calls"] = calls
        if thoughts := [block.thinking for block in blocks if isinstance(block, ThinkingBlock)]:
            message["reasoning_content"] = "\n".join(thoughts)
        return message


def turns(messages: list[MessageParam]) -> list[MessageParam]:
    """The messages with those of one role in a row made one, as Anthropic combines them."""
    merged: list[MessageParam] = []
    for message in messages:
        if merged and merged[-1].role == message.role:
            content = merged[-1].blocks + message.blocks
            merged[-1] = MessageParam.model_construct(role=message.role, content=content)
        else:
            merged.append(message)
    return merged


class CustomTool(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)  # cache_control, strict, defer_loading, ...
    type: Literal["custom"] | None = None
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")  # as Anthropic's, as the chat endpoint's
    description: str | None = None
    input_schema: dict

    def to_chat(self) -> dict:
        function = {"name": self.name, "parameters": self.input_schema}
        if self.description is not None:
            function["description"] = self.description
        return {"type": "function", "function": function}


class ServerTool(BaseModel):
    """A tool Anthropic's side runs, or one of its own schema (web_search_20250305, bash_20250124,
    ...): left out of the tools the model is shown."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: str


def _tool_type(tool) -> str:
    kind = type_of(tool)
    return "custom" if kind in (None, "custom") else "server"


AnthropicTool = Annotated[
    Annotated[CustomTool, Tag("custom")] | Annotated[ServerTool, Tag("server")], Discriminator(_tool_type)
]


class ToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _named(self):
        if self.type == "tool" and self.name is None:
            raise ValueError("a tool_choice of type tool names the tool: give its name")
        return self

    def to_chat(self) -> str | dict:
        if self.type == "tool":
            return {"type": "function", "function": {"name": self.name}}
        return {"any": "required"}.get(self.type, self.type)


class ThinkingConfig(BaseModel):
    """Whether the model thinks. "disabled" turns a thinking template's thinking off (as
    reasoning_effort "none" does); the others leave the template's and the server's choice, and
    budget_tokens is not enforced: serve has no budget for reasoning."""

    model_config = ConfigDict(extra="ignore", strict=True)  # display: the reasoning is given whole
    type: Literal["enabled", "adaptive", "disabled", "between_tools"]
    budget_tokens: int | None = Field(None, ge=1)


class OutputFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["json_schema"]
    schema_: dict = Field(alias="schema")


class OutputConfig(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)  # effort: no setting of the models serve runs
    format: OutputFormat | None = None


class MessagesRequest(BaseModel):
    """A Messages API request. Unknown fields are ignored, as the chat endpoint ignores them
    (service_tier, context_management, cache_control, ...)."""

    model_config = ConfigDict(extra="allow", strict=True)
    model: str | None = None  # any name: the server has one model
    max_tokens: int | None = Field(None, ge=1)  # required to generate, not to count tokens
    messages: list[MessageParam]
    system: str | list[TextBlock] | None = None
    stop_sequences: list[str] | None = Field(None, max_length=MAX_STOPS)
    tools: list[AnthropicTool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    output_format: OutputFormat | None = None  # the beta's name for output_config.format
    metadata: dict | None = None  # taken and ignored (user_id)

    def check(self, counting: bool = False) -> None:
        """What the types alone do not say (`counting`: a count_tokens request, with no max_tokens)."""
        if self.max_tokens is None and not counting:
            raise ApiError(400, "max_tokens: Field required", "max_tokens")
        for name, harmless in REFUSED.items():
            if not asks_nothing((self.model_extra or {}).get(name), harmless):
                raise ApiError(400, f"{name} is not supported by specllm serve", name)
        if not self.messages:
            raise ApiError(400, "messages: give at least one message", "messages")
        if self.conversation and self.conversation[-1].role == "assistant":
            message = (
                "messages: the last message is the assistant's, which specllm serve does not continue "
                "(prefill): end with a user message"
            )
            raise ApiError(400, message, "messages")
        if self.output_config is not None and self.output_config.format is not None and self.output_format:
            raise ApiError(400, "give output_config.format or output_format, not both", "output_format")
        if (schema := self.output_schema) is not None:
            given = "output_config.format" if self.output_format is None else "output_format"
            check_schema(schema, f"{given}.schema")

    @property
    def output_schema(self) -> dict | None:
        given = self.output_format or (self.output_config.format if self.output_config else None)
        return given.schema_ if given is not None else None

    def chat_body(self) -> dict:
        """The chat request this request asks for, as JSON."""
        extra = self.model_extra or {}
        body = {name: extra[name] for name in PASSED if name in extra}
        body["messages"] = self.chat_messages()
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        if self.stop_sequences:
            body["stop"] = self.stop_sequences
        if tools := [tool.to_chat() for tool in self.tools or () if isinstance(tool, CustomTool)]:
            body["tools"] = tools
        if self.tool_choice is not None:
            body["tool_choice"] = self.tool_choice.to_chat()
            body["parallel_tool_calls"] = not self.tool_choice.disable_parallel_tool_use
        if self.thinking is not None and self.thinking.type == "disabled":
            body["reasoning_effort"] = "none"
        if (schema := self.output_schema) is not None:
            body["response_format"] = {"type": "json_schema", "json_schema": {"schema": schema}}
        return body

    def chat_messages(self) -> list[dict]:
        """The conversation as chat messages, the system message first."""
        system = self._system() + [part for m in self.messages if m.role == "system" for part in _parts(m.blocks)]
        messages = [{"role": "system", "content": system}] if system else []
        for turn in turns(self.conversation):
            messages += turn.to_chat()
        return messages

    @property
    def conversation(self) -> list["MessageParam"]:
        """The messages but those of role system, which are the system message's (Claude Code
        sends its environment as one after the first user message): many chat templates take a
        system message only at the start (Qwen3.5's refuses one elsewhere, gpt-oss's and
        Mistral's leave it out)."""
        return [message for message in self.messages if message.role != "system"]

    def _system(self) -> list[dict]:
        """`system` as text parts: the chat endpoint joins them as it joins a message's."""
        blocks = [TextBlock(type="text", text=self.system)] if isinstance(self.system, str) else self.system or []
        return [{"type": "text", "text": steady_billing_header(block.text)} for block in blocks]


def steady_billing_header(text: str) -> str:
    """Claude Code's system prompt begins with a header whose `cch=` stamp changes with every
    request ("x-anthropic-billing-header: cc_version=...; cc_entrypoint=cli; cch=a5145;"): the
    prompt would differ from the previous one at its start, and every request would prefill the
    whole conversation again. The stamp is made the same each time, as llama-server makes it."""
    if not text.startswith(BILLING_HEADER):
        return text
    at = text.find("cch=", len(BILLING_HEADER)) + len("cch=")
    if at < len("cch=") or text[at + STAMP_LENGTH : at + STAMP_LENGTH + 1] != ";":
        return text
    return text[:at] + "f" * STAMP_LENGTH + text[at + STAMP_LENGTH :]


class MessagesChat(ChatRequest):
    """The chat request a Messages request is translated into: generated as any chat request,
    answered in the Messages API's shapes."""

    def reply(self, model: str, left_out: int = 0, prompt_tokens: int = 0) -> "MessageReply":
        return MessageReply(True, model, stop_sequences=self.stops, prompt_tokens=prompt_tokens)


def parse_messages(body: bytes, drafters: tuple[str, ...] = DRAFTERS, counting: bool = False) -> MessagesChat:
    """A Messages request body (JSON bytes), checked and translated (`counting`: for count_tokens,
    which needs no max_tokens); every problem is an ApiError 400."""
    request = validated(MessagesRequest, body)
    request.check(counting)
    chat = validated(MessagesChat, json.dumps(request.chat_body()).encode())
    chat.check()
    check_drafter(chat, drafters)
    return chat


# --- replies ------------------------------------------------------------------------------------

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def error_body(error: ApiError) -> dict:
    """An error in Anthropic's shape. A prompt longer than the context is said in Anthropic's
    words, which Claude Code reads to compact the conversation."""
    kind = ERROR_TYPES.get(error.status, "api_error" if error.status >= 500 else "invalid_request_error")
    message = error.message
    if error.code == "context_length_exceeded":
        message = f"prompt is too long: {message}"
    return {"type": "error", "error": {"type": kind, "message": message}}


def message_usage(result: Result, read: ChatReply | None) -> dict:
    """The usage in Anthropic's terms: input_tokens are the prompt's tokens not read from the KV
    cache, cache_read_input_tokens those that were (none is written to a cache of Anthropic's
    kind: the KV cache keeps the last request's tokens, whatever the request asks)."""
    counts = usage(result, read)
    cached = counts["prompt_tokens_details"]["cached_tokens"]
    return {
        "input_tokens": counts["prompt_tokens"] - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": counts["completion_tokens"],
    }


def stop_reason(result: Result, read: ChatReply | None, stop_sequences: tuple[str, ...]) -> tuple[str, str | None]:
    """Anthropic's stop_reason and stop_sequence: tool_use where the chat endpoint's finish_reason
    is tool_calls, model_context_window_exceeded where the reply filled the context, max_tokens
    where it reached max_tokens, stop_sequence where it met one of the request's, else end_turn."""
    finish = finish_reason(result.stop_reason)
    if (read.finish_reason(finish) if read is not None else finish) == "tool_calls":
        return "tool_use", None
    if result.stop_reason == "context_full":
        return "model_context_window_exceeded", None
    if finish == "length":
        return "max_tokens", None
    if result.stop_reason == "stop" and result.stop_string in stop_sequences:
        return "stop_sequence", result.stop_string
    return "end_turn", None


class ContentBlocks:
    """A message's content blocks as a reply's deltas open, fill and close them, and the events
    that say so. A block is closed when a block of another kind begins: thinking, text and each
    call, in the order the reply gives them (text after a call is a new text block). A whole
    message's blocks are made the same way, from its reply's parts."""

    DELTAS = {"thinking": "thinking_delta", "text": "text_delta"}

    def __init__(self):
        self.blocks: list[dict] = []
        self.open: str | None = None  # the kind of the last block, while it is being written

    def add(self, part: dict) -> list[dict]:
        """The events of a part of a delta: reasoning, text or calls."""
        if "tool_calls" in part:
            return [event for call in part["tool_calls"] for event in self.call(call)]
        if "reasoning" in part:
            return self.write("thinking", part["reasoning"])
        return self.write("text", part["text"])

    def write(self, kind: str, text: str) -> list[dict]:
        """The events of `text` added to the thinking or the answer (`kind`). Text after a call
        begins at its first character that is not whitespace (the whitespace between a call's
        markup and the text is neither's)."""
        if kind == "text" and self.open != kind and self.blocks and self.blocks[-1]["type"] == "tool_use":
            text = text.lstrip()
            if not text:
                return []
        events = [] if self.open == kind else self.close() + self._begin(kind)
        self.blocks[-1][kind] += text
        return [*events, self._delta({"type": self.DELTAS[kind], kind: text})]

    def call(self, call: dict) -> list[dict]:
        """The events of a call, which the reader gives whole: its input as one JSON delta."""
        events = self.close()
        function = call["function"]
        block = {"type": "tool_use", "id": call["id"], "name": function["name"]}
        self.blocks.append(block | {"input": json.loads(function["arguments"])})
        return [
            *events,
            {"type": "content_block_start", "index": len(self.blocks) - 1, "content_block": block | {"input": {}}},
            self._delta({"type": "input_json_delta", "partial_json": function["arguments"]}),
            self._stop(),
        ]

    def close(self) -> list[dict]:
        """The events that end the block being written, if any: a thinking block's signature
        first, which Anthropic's clients wait for (empty: serve signs nothing)."""
        if self.open is None:
            return []
        signature = [self._delta({"type": "signature_delta", "signature": ""})] if self.open == "thinking" else []
        self.open = None
        return [*signature, self._stop()]

    def _begin(self, kind: str) -> list[dict]:
        block = {"type": kind, kind: ""} | ({"signature": ""} if kind == "thinking" else {})
        self.blocks.append(block)
        self.open = kind
        return [{"type": "content_block_start", "index": len(self.blocks) - 1, "content_block": dict(block)}]

    def _delta(self, delta: dict) -> dict:
        return {"type": "content_block_delta", "index": len(self.blocks) - 1, "delta": delta}

    def _stop(self) -> dict:
        return {"type": "content_block_stop", "index": len(self.blocks) - 1}


@dataclass(frozen=True)
class MessageReply(Reply):
    """The Messages API's objects: the message, or its events, each with an `event:` line naming
    its `type`: message_start, the content blocks' events, message_delta (stop_reason, usage),
    message_stop (no [DONE]); a failure once under way is an `error` event. `stop_sequences`: the
    request's; `prompt_tokens`: the prompt's length, which message_start tells."""

    stop_sequences: tuple[str, ...] = ()
    prompt_tokens: int = 0
    content: ContentBlocks = field(default_factory=ContentBlocks)
    END_OF_STREAM: ClassVar[str | None] = None

    def complete(self, result: Result, seed: int, read: ChatReply | None = None) -> dict:
        """The whole message: its blocks made as a stream of the reply's parts makes them."""
        content = ContentBlocks()
        for part in read.parts if read is not None else [{"text": result.text}] if result.text else []:
            content.add(part)
        reason, sequence = stop_reason(result, read, self.stop_sequences)
        usage = message_usage(result, read)
        return self._message(content.blocks, reason, sequence, usage) | {"specllm": specllm_stats(result, seed)}

    def opening(self) -> list[dict]:
        """message_start: the usage so far is the whole prompt's (what of it the KV cache held is
        known once it has been read: message_delta tells it)."""
        usage = {"input_tokens": self.prompt_tokens, "cache_creation_input_tokens": 0}
        usage |= {"cache_read_input_tokens": 0, "output_tokens": 0}
        return [{"type": "message_start", "message": self._message([], None, None, usage)}]

    def deltas(self, delta: Delta) -> list[dict]:
        return [event for part in delta for event in self.content.add(part)]

    def closing(self, result: Result, seed: int, read: ChatReply | None, include_usage: bool) -> list[dict]:
        reason, sequence = stop_reason(result, read, self.stop_sequences)
        last = {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": message_usage(result, read),
            "specllm": specllm_stats(result, seed),
        }
        return [*self.content.close(), last, {"type": "message_stop"}]

    def failure(self, error: ApiError) -> list[dict]:
        return [error_body(error)]

    def sse(self, event: dict | str) -> str:
        assert isinstance(event, dict)  # no [DONE]
        return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"

    def _message(self, content: list[dict], reason: str | None, sequence: str | None, usage: dict) -> dict:
        return {
            "id": f"msg_{self.id}",
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": usage,
        }
