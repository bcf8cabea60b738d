"""The OpenAI API's shapes for `specllm serve`: request validation and response objects, as plain
data (no HTTP, no engine). Errors are `ApiError`s carrying the OpenAI error body.

Requests are validated strictly (a string where a number belongs is refused, not converted), unknown
fields are ignored, and fields that ask for something specllm cannot do (logprobs, penalties, ...)
are refused rather than silently ignored. Chat requests may offer tools (see `ToolChoice` and
tool_calls.py); the model's calls come back as `tool_calls`.
"""

import codecs
import contextlib
import json
import os
import secrets
import string
import time
import uuid
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from specllm.engine.infill import ContextFile
from specllm.engine.loop import DRAFTERS, Result, Step
from specllm.engine.names import Drafter
from specllm.engine.reasoning import ReasoningSplitter, Split, reasoning_tokens
from specllm.engine.sampling import MAX_SEED
from specllm.errors import (
    CallLikeAnswer,
    CannotTakeBack,
    ContextFull,
    DraftNotLoaded,
    DraftTooLong,
    GammaTooLong,
    GrammarInvalid,
    NeedsDraftModel,
    NoMtpLayers,
    SpecllmError,
)
from specllm.llama.grammar import schema_text
from specllm.llama.templates import TEMPLATE_VARIABLES
from specllm.serve.generic_tools import GenericReader
from specllm.serve.tool_calls import ToolCall, ToolCallParser

# More than OpenAI's 4, as llama-server and vLLM take: an editor's autocompletion sends a dozen
# (Continue's: its FIM template's control tokens and its own). Each is looked for at every step.
MAX_STOPS = 64


class ApiError(Exception):
    """A request the server refuses: the HTTP status and OpenAI's {"error": {...}} body."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = "invalid_request_error" if status < 500 else "server_error"

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    @classmethod
    def of(cls, error: SpecllmError, drafters: tuple[str, ...]) -> "ApiError":
        """The 400 for a library error: for the errors a request can avoid, the request field to
        change (the library names no CLI flags, and a client cannot restart the server), offering
        only the `drafters` this server has. A draft model that could not be loaded is a 503: the
        server's draft, not the request, and another drafter is served now."""
        if isinstance(error, NeedsDraftModel):
            return cls(400, f"{error}: this server has none; ask for drafter {_one_of(drafters)}", "drafter")
        if isinstance(error, NoMtpLayers):
            return cls(400, f"{error}: ask for drafter {_one_of(drafters)}", "drafter")
        if isinstance(error, CannotTakeBack):
            return cls(400, f"{error}, or ask for drafter none", "drafter")
        if isinstance(error, DraftTooLong):
            return cls(400, f"{error}: ask for gamma {error.snapshots} or less", "gamma")
        if isinstance(error, GammaTooLong):
            return cls(400, str(error), "gamma")
        if isinstance(error, ContextFull):
            return cls(400, f"{error}: shorten the prompt", code="context_length_exceeded")
        if isinstance(error, CallLikeAnswer):
            return cls(400, f"tools cannot be offered with this response_format or grammar: {error}", "tools")
        if isinstance(error, GrammarInvalid):  # a schema's is found by the request's check
            return cls(400, str(error), "grammar")
        if isinstance(error, DraftNotLoaded):  # the server's draft, not the request: another drafter works
            others = tuple(d for d in drafters if d != Drafter.MODEL) or (Drafter.NONE,)
            message = f"the server's draft model could not be loaded: {error}; ask for drafter {_one_of(others)}"
            return cls(503, message, "drafter", "draft_model_unavailable")
        return cls(400, str(error))


def _one_of(drafters: tuple[str, ...]) -> str:
    return ", ".join(drafters[:-1]) + f" or {drafters[-1]}" if len(drafters) > 1 else drafters[0]


# Fields of the OpenAI API that ask for what specllm does not do, and their values that ask nothing:
# their defaults, of the field's own JSON type (a completions request's logprobs is a count: 0 asks
# for the chosen tokens' logprobs).
UNSUPPORTED: dict[str, tuple[object, ...]] = {
    "tools": (None, []),  # tools and tool_choice: chat requests have them
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "function_call": (None, "none"),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "logit_bias": (None, {}),
    "response_format": (None, {"type": "text"}),  # chat requests take it (ChatRequest.response_format)
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "echo": (None, False),
    "best_of": (None, 1),
    "modalities": (None, ["text"]),  # audio replies
    "audio": (None,),
}


def asks_nothing(value: object, harmless: tuple[object, ...]) -> bool:
    """Whether `value` is one of `harmless`, type and all: in Python 0 == False and 1 == True."""
    return any(type(value) is type(h) and value == h for h in harmless)


def check_schema(schema: dict, param: str) -> None:
    """A JSON schema that cannot be turned into a grammar is the request's fault: a 400 naming it."""
    try:
        schema_text(schema)
    except GrammarInvalid as e:
        raise ApiError(400, f"{param}: {e}", param) from None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: bool = False


class BaseRequest(BaseModel):
    """Fields common to chat and completions requests."""

    model_config = ConfigDict(extra="allow", strict=True)
    UNSUPPORTED_FIELDS: ClassVar[dict[str, tuple[object, ...]]] = UNSUPPORTED  # refused, but at their harmless values
    model: str | None = None  # any name is accepted: the server has one model
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    # llama-server's max_tokens, which its OpenAI endpoints take too; -1: no limit; 0: one token,
    # as llama-server samples one before it checks the limit (the requests of llama.vscode and
    # llama.vim that only fill the KV cache: other files ahead of completions, a chat ahead of
    # an instruction)
    n_predict: int | None = Field(None, ge=-1)
    temperature: float | None = Field(None, ge=0, allow_inf_nan=False)
    top_p: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=0)  # extension
    min_p: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)  # extension
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    stop: str | list[str] | None = None
    n: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    drafter: str | None = None  # extension: auto | model | mtp | ngram | none
    gamma: int | None = Field(None, ge=1)  # extension: draft length
    specllm_steps: bool = False  # extension: streamed chunks carry each step's draft (specllm_step)
    # llama-server's structured output, which its OpenAI endpoints take too: a GBNF grammar, or a
    # JSON schema ({}: any JSON object)
    grammar: str | None = None
    json_schema: dict | None = None

    def check(self) -> None:
        """What the types alone do not say."""
        if self.n not in (None, 1):
            raise ApiError(400, f"only n = 1 is supported (one choice per request), got {self.n}", "n")
        if self.stream_options is not None and not self.stream:  # OpenAI refuses it too: a usage chunk of what?
            raise ApiError(400, "stream_options is only allowed when stream is true", "stream_options")
        if self.specllm_steps and not self.stream:  # a chunk per step of a reply sent whole: asked in vain
            raise ApiError(400, "specllm_steps is only allowed when stream is true", "specllm_steps")
        if isinstance(self.stop, list) and len(self.stop) > MAX_STOPS:
            raise ApiError(400, f"at most {MAX_STOPS} stop strings, got {len(self.stop)}", "stop")
        for name, harmless in self.UNSUPPORTED_FIELDS.items():
            if not asks_nothing((self.model_extra or {}).get(name), harmless):
                raise ApiError(400, f"{name} is not supported by specllm serve", name)
        if self.grammar and self.json_schema is not None:  # as llama-server refuses them
            raise ApiError(400, "give a grammar or a json_schema, not both", "grammar")
        if self.json_schema is not None:
            check_schema(self.json_schema, "json_schema")

    @property
    def structure(self) -> dict:
        """GenerationConfig's grammar or json_schema, where the request asks for structured output."""
        if self.json_schema is not None:
            return {"json_schema": self.json_schema}
        return {"grammar": self.grammar} if self.grammar else {}

    @property
    def requested_tokens(self) -> int | None:
        if self.n_predict is not None:  # over max_tokens, as llama-server reads them
            return None if self.n_predict == -1 else max(self.n_predict, 1)
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def limits(self) -> dict:
        """GenerationConfig's limits on a completion (/infill's n_indent and t_max_predict_ms)."""
        return {}

    def gap(self) -> "Gap | None":
        """The code around a gap to fill in the middle, for a request that asks for one."""
        return None

    def reply(self, model: str, left_out: int = 0, prompt_tokens: int = 0) -> "Reply":
        """The shape of this request's response objects (`left_out`: tokens of a gap's code cut
        to leave room for the reply, which only /infill's responses tell; `prompt_tokens`: the
        prompt's length, which a Messages API stream tells before the reply's first token)."""
        return Reply(isinstance(self, ChatRequest), model)

    @property
    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    @property
    def sampler(self) -> dict:
        """The sampler settings the request gives; the others keep specllm's defaults."""
        given = dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p)
        return {k: v for k, v in given.items() if v is not None}

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


def type_of(part) -> str | None:
    """The `type` of a content part, block or item as sent (a dict) or as made (a model)."""
    kind = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
    return kind if isinstance(kind, str) else None


def refuse_non_text(parts, text: Collection[str], what: str, only: Collection[str] = ()):
    """A message's content as sent, its parts (`what`: "content parts", "content blocks") checked:
    one whose type is not among `text` (and, where `only` is given, is among `only`) is refused by
    name, where the union's types alone would say "a valid string". Anything else passes on to the
    field's own validation."""
    for part in parts if isinstance(parts, list) else ():
        kind = type_of(part)
        if kind is not None and kind not in text and (not only or kind in only):
            raise ValueError(f"{what} of type {kind!r} are not supported by specllm serve: text only")
    return parts


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    name: str
    arguments: str  # JSON, as OpenAI sends it


class AssistantToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall

    def to_template(self, object_arguments: bool) -> dict:
        """As a template wants it: most write the arguments with tojson, from an object."""
        arguments = self.function.arguments
        if object_arguments:
            with contextlib.suppress(ValueError):  # not JSON: the template gets the text the client sent
                arguments = json.loads(arguments)
        return {"id": self.id, "type": "function", "function": {"name": self.function.name, "arguments": arguments}}


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[AssistantToolCall] | None = None  # an assistant's calls
    tool_call_id: str | None = None  # a tool message: the call it answers
    name: str | None = None
    reasoning_content: str | None = None  # an assistant's reasoning, as a reply gave it back

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, content):
        """An image or audio part is refused by name."""
        return refuse_non_text(content, ("text",), "content parts")

    @model_validator(mode="after")
    def _has_content(self):
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            needs = "an assistant message needs content or tool_calls" if self.role == "assistant" else None
            raise ValueError(needs or f"a {self.role} message needs content")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id of the call it answers")
        return self

    def to_template(self, object_arguments: bool = True) -> dict:
        """The message as a chat template gets it: OpenAI's "developer" is the system role, and
        content is text (empty beside tool calls: templates concatenate it)."""
        content = self.content if not isinstance(self.content, list) else "\n".join(p.text for p in self.content)
        message: dict[str, object] = {
            "role": "system" if self.role == "developer" else self.role,
            "content": content or "",
        }
        if self.tool_calls:
            message["tool_calls"] = [call.to_template(object_arguments) for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            message["name"] = self.name
        if self.reasoning_content is not None:  # Qwen3.5's template renders it in a think block
            message["reasoning_content"] = self.reasoning_content
        return message


class Function(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")  # as OpenAI
    description: str | None = None
    parameters: dict | None = None  # a JSON schema
    strict: bool | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["function"]
    function: Function

    def to_template(self) -> dict:
        """As llama-server passes a tool, with a description even when it has none: templates
        write it as text ("// " + tool.description in gpt-oss's), which no description fails."""
        function = self.function.model_dump(exclude_none=True)
        return {"type": "function", "function": {"name": function.pop("name"), "description": ""} | function}


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    name: str | None = None  # OpenAI's requires it; llama-server reads only the schema
    schema_: dict | None = Field(None, alias="schema")  # none given: any JSON object, as llama-server reads it
    strict: bool | None = None  # the output always follows the schema: strict or not
    description: str | None = None


class ResponseFormat(BaseModel):
    """OpenAI's response_format, as llama-server reads it: JSON mode (any JSON object, or the
    `schema` llama-server also takes there) or a JSON schema."""

    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None
    schema_: dict | None = Field(None, alias="schema")

    @property
    def output_schema(self) -> dict | None:
        """The schema the output must follow, or None for plain text."""
        if self.type == "json_object":
            return self.schema_ or {}
        if self.type == "json_schema":
            return (self.json_schema.schema_ if self.json_schema else None) or {}
        return None


class ChatRequest(BaseRequest):
    messages: list[Message] = Field(min_length=1)
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict | None = None  # variables for the template, as llama-server and vLLM take
    reasoning_effort: str | None = None  # OpenAI's; "none" turns thinking off, as llama-server reads it

    def arguments_not_an_object(self) -> str | None:
        """The field (`messages.I.tool_calls.J.function.arguments`) of the first earlier call whose
        arguments are not a JSON object, or None: a template that writes them from an object
        fails on it, with an error that would not say which field is at fault."""
        at = self.call_not_an_object()
        return None if at is None else f"messages.{at[0]}.tool_calls.{at[1]}.function.arguments"

    def call_not_an_object(self) -> tuple[int, int, int] | None:
        """Where the first earlier call whose arguments are not a JSON object is: its message,
        its place among the message's calls and among the conversation's; None when none is."""
        calls = (
            (i, j, call) for i, message in enumerate(self.messages) for j, call in enumerate(message.tool_calls or ())
        )
        for k, (i, j, call) in enumerate(calls):
            try:
                arguments = json.loads(call.function.arguments)
            except ValueError:
                arguments = None
            if not isinstance(arguments, dict):
                return i, j, k
        return None

    def check(self) -> None:
        super().check()
        taken = sorted(TEMPLATE_VARIABLES & set(self.chat_template_kwargs or {}))
        if taken:
            verb = "is" if len(taken) == 1 else "are"
            message = f"chat_template_kwargs: {', '.join(taken)} {verb} set by the server, not the request"
            raise ApiError(400, message, "chat_template_kwargs")
        if self.reasoning_effort is not None and not self.reasoning_effort.strip():
            raise ApiError(400, "reasoning_effort: give a level (low, medium, high) or none", "reasoning_effort")
        if (schema := self.format_schema) is not None:
            if super().structure:
                message = "give response_format or a grammar or json_schema, not two of them"
                raise ApiError(400, message, "response_format")
            check_schema(schema, "response_format")
        names = [tool.function.name for tool in self.tools or []]
        if len(set(names)) < len(names):
            raise ApiError(400, "tools: two tools have the same name", "tools")
        if self.tool_choice not in (None, "none", "auto") and not names:
            raise ApiError(400, "tool_choice: a call is asked for but no tools are given", "tool_choice")
        if isinstance(self.tool_choice, NamedToolChoice) and self.tool_choice.function.name not in names:
            raise ApiError(400, f"tool_choice: no tool is named {self.tool_choice.function.name!r}", "tool_choice")

    def template_variables(self, defaults: dict | None = None) -> dict | None:
        """The template's variables: the server's `defaults` (serve --no-think, ...), then
        chat_template_kwargs over them, then reasoning_effort as llama-server passes it: as the
        variable of that name (gpt-oss's template reads it), or, for "none", as enable_thinking
        false."""
        variables = dict(defaults or {}) | (self.chat_template_kwargs or {})
        if self.reasoning_effort == "none":
            variables.pop("reasoning_effort", None)
            variables["enable_thinking"] = False
        elif self.reasoning_effort is not None:
            variables["reasoning_effort"] = self.reasoning_effort
        return variables or None

    @property
    def format_schema(self) -> dict | None:
        """The schema response_format asks the output to follow, or None (plain text)."""
        return self.response_format.output_schema if self.response_format is not None else None

    @property
    def structure(self) -> dict:
        schema = self.format_schema
        return {"json_schema": schema} if schema is not None else super().structure

    @property
    def offered_tools(self) -> list[Tool]:
        """The tools the model is shown: none with tool_choice "none" (it must not call)."""
        return [] if self.tool_choice == "none" else list(self.tools or [])

    @property
    def forced_tool(self) -> str | None:
        """The tool a call must be to: the named one, or the only one when a call is required."""
        if isinstance(self.tool_choice, NamedToolChoice):
            return self.tool_choice.function.name
        if self.tool_choice == "required" and len(self.offered_tools) == 1:
            return self.offered_tools[0].function.name
        return None

    @property
    def call_required(self) -> bool:
        return self.tool_choice == "required" or isinstance(self.tool_choice, NamedToolChoice)


@dataclass(frozen=True)
class Gap:
    """What a fill-in-the-middle request gives: the code before and after the gap (Engine.infill_prompt)."""

    prefix: str
    suffix: str
    files: tuple[ContextFile, ...] = ()
    line: str = ""


class CompletionRequest(BaseRequest):
    prompt: str | list[int] | list[str] | list[list[int]]  # OpenAI's batch forms: one prompt each
    suffix: str | None = None  # the text after the completion: the prompt is the text before the gap

    def gap(self) -> Gap | None:
        if not self.suffix:  # "" asks for nothing, as Ollama reads it
            return None
        assert isinstance(self.prompt, str)  # check() saw to it
        return Gap(self.prompt, self.suffix)

    def check(self) -> None:
        super().check()
        match self.prompt:  # a string, or a list of token ids, stays as it is
            case [str() as text]:  # a list of one string: that string
                self.prompt = text
            case [list() as ids] if ids:  # a list of one list of token ids: those ids
                self.prompt = ids
            case [] | [str() | list(), *_]:  # an empty list, or several prompts
                raise ApiError(400, "give one prompt per request (a string or a list of token ids)", "prompt")
        if self.suffix and not isinstance(self.prompt, str):
            raise ApiError(400, "a suffix needs the prompt as text: the code before the gap", "suffix")


Body = TypeVar("Body", bound=BaseModel)


def parse(kind: type[BaseRequest], body: bytes, drafters: tuple[str, ...] = DRAFTERS) -> BaseRequest:
    """Validate a request body (JSON bytes) as `kind`; every problem is an ApiError 400. An
    unknown drafter is offered the `drafters` this server has."""
    request = validated(kind, body)
    request.check()
    check_drafter(request, drafters)
    return request


def check_drafter(request: BaseRequest, drafters: tuple[str, ...]) -> None:
    """An unknown drafter is refused, offering the `drafters` this server has."""
    if request.drafter is not None and request.drafter not in DRAFTERS:
        raise ApiError(400, f"unknown drafter {request.drafter!r}: ask for drafter {_one_of(drafters)}", "drafter")


def validated(kind: type[Body], body: bytes) -> Body:
    """A request body (JSON bytes) read as `kind`, its types checked; every problem is an
    ApiError 400 naming the field."""
    try:
        return kind.model_validate_json(body)
    except ValidationError as e:
        errors = e.errors(include_url=False)
        if errors[0]["type"] == "json_invalid":
            raise ApiError(400, _not_json(body, errors[0]["msg"])) from None
        # A field of several types (stop: a string or a list) fails once per type: name the field,
        # and tell the failure that went deepest into the request (a tool_choice object without its
        # "type" is told that, not that a string was expected).
        paths = _input_paths(errors, body)
        where = ".".join(os.path.commonprefix(paths))
        deepest = max(range(len(errors)), key=lambda i: len(paths[i]))  # the first of the deepest
        what = ".".join(paths[deepest]) or "body"
        raise ApiError(400, f"{what}: {errors[deepest]['msg']}", where or None) from None


def _not_json(body: bytes, message: str) -> str:
    """Why a body is not JSON the server reads. Its parser refuses a lone UTF-16 surrogate escape
    ("\\ud800" without its pair: a string cut inside an emoji), which JSON allows and which is no
    text: that is said in words of its own."""
    try:
        json.dumps(json.loads(body), ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return "the body holds a lone UTF-16 surrogate (an escape such as \\ud800 without its pair), which is no text"
    except (ValueError, RecursionError):  # not JSON for Python either, or nested too deep for it
        pass
    return f"the body is not valid JSON: {message}"


def _input_paths(errors: list, body: bytes) -> list[list[str]]:
    """Where in the request each validation error is: its location without the names pydantic
    gives a union's members ("str", "list[str]", "NamedToolChoice"), found as the parts of it the
    request's JSON does not have (but a missing field's own name)."""
    try:
        request = json.loads(body)
    except (ValueError, RecursionError):  # what pydantic read, json may not: the locations as they are
        return [[str(part) for part in error["loc"]] for error in errors]
    paths = []
    for error in errors:
        path, value, loc = [], request, error["loc"]
        for i, part in enumerate(loc):
            if (isinstance(value, dict) and part in value) or (
                isinstance(value, list) and isinstance(part, int) and 0 <= part < len(value)
            ):
                path.append(str(part))
                value = value[part]
            elif i == len(loc) - 1 and error["type"] == "missing":
                path.append(str(part))
        paths.append(path)
    return paths


# --- responses ----------------------------------------------------------------------------------


def finish_reason(stop_reason: str) -> str:
    """OpenAI's finish_reason for the engine's stop reason."""
    return "length" if stop_reason in ("max_tokens", "context_full") else "stop"


def usage(result: Result, read: "ChatReply | None" = None) -> dict:
    """Exact token counts. The prompt's last token is evaluated with the first generated one, so
    the tokens served from the KV cache are those neither prefilled nor that last one. A chat
    reply's (`read`) tell its reasoning's tokens apart, as OpenAI's do (llama-server's do not)."""
    prompt, generated = result.stats.prompt_tokens, len(result.tokens)
    cached = max(0, prompt - 1 - result.stats.prefill_tokens)
    counts = {
        "prompt_tokens": prompt,
        "completion_tokens": generated,
        "total_tokens": prompt + generated,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
    if read is not None:
        counts["completion_tokens_details"] = {"reasoning_tokens": read.reasoning_tokens}
    return counts


def specllm_stats(result: Result, seed: int) -> dict:
    """The `specllm` object: `run --json`'s fields but the text and tokens, and but where the
    server's files are (a client has no business knowing the server's paths)."""
    stats = result.stats.to_dict()
    if stats.get("policy"):
        stats["policy"] = dict(stats["policy"], calibration=dict(stats["policy"]["calibration"]))
        stats["policy"]["calibration"].pop("cache", None)
    return {"stop_reason": result.stop_reason, "seed": seed, "stats": stats}


# A step's live stats: the counts and rates a status line needs, not the per-position lists.
STEP_STATS = (
    "generated_tokens", "n_drafted", "n_accepted", "target_calls",
    "acceptance_rate", "mean_accepted_length", "tokens_per_second", "sources",
)  # fmt: skip


def specllm_step(step: Step) -> dict:
    """The `specllm` object of a streamed chunk when `specllm_steps` is asked for: what the step
    drafted and where from, split as the terminal view colours it. accepted + target is the
    chunk's text; rejected is the draft the target turned down, shown but never part of it."""
    stats = step.stats.to_dict()
    return {
        "source": step.source,
        "accepted": step.accepted_text,
        "rejected": step.rejected_text,
        "target": step.token_text,
        "stats": {name: stats[name] for name in STEP_STATS},
    }


@dataclass(frozen=True)
class Reply:
    """The id, time and model shared by every object of one response; `chat` picks the shape."""

    chat: bool
    model: str
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))
    END_OF_STREAM: ClassVar[str | None] = "[DONE]"  # the last event of a stream

    def _object(self, kind: str, choices: list[dict]) -> dict:
        prefix = "chatcmpl" if self.chat else "cmpl"
        return {
            "id": f"{prefix}-{self.id}",
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def complete(self, result: Result, seed: int, read: "ChatReply | None" = None) -> dict:
        """The whole response of a request that was not streamed; `read` has read its reply (its
        reasoning apart, its calls)."""
        finish = finish_reason(result.stop_reason)
        choice: dict[str, object] = {"index": 0, "finish_reason": finish, "logprobs": None}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": result.text}
            if read is not None:
                choice["message"] = read.message()
                choice["finish_reason"] = read.finish_reason(finish)
        else:
            choice["text"] = result.text
        body = self._object("chat.completion" if self.chat else "text_completion", [choice])
        return body | {"usage": usage(result, read), "specllm": specllm_stats(result, seed)}

    def chunk(
        self,
        text: str | None = None,
        *,
        first: bool = False,
        finish: str | None = None,
        tool_calls: list | None = None,
        reasoning: str | None = None,
    ) -> dict:
        """One streamed chunk: new reasoning, text or calls, or (with `finish`) the end of the choice."""
        choice: dict[str, object] = {"index": 0, "finish_reason": finish, "logprobs": None}
        if self.chat:
            choice["delta"] = (
                ({"role": "assistant", "content": ""} if first else {})
                | ({"reasoning_content": reasoning} if reasoning else {})
                | ({"content": text} if text else {})
                | ({"tool_calls": tool_calls} if tool_calls else {})
            )
        else:
            choice["text"] = text or ""
        return self._object("chat.completion.chunk" if self.chat else "text_completion", [choice])

    def last_chunk(self, result: Result, seed: int, read: "ChatReply | None" = None) -> dict:
        """The chunk that ends the choice, with the speculative stats."""
        finish = finish_reason(result.stop_reason)
        if read is not None:
            finish = read.finish_reason(finish)
        return self.chunk(finish=finish) | {"specllm": specllm_stats(result, seed)}

    def usage_chunk(self, result: Result, read: "ChatReply | None" = None) -> dict:
        """stream_options.include_usage: a chunk with no choices and the usage, after the last."""
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return self._object(kind, []) | {"usage": usage(result, read)}

    # A stream's events, as server.stream sends them: these shapes' chunks; the Responses API's
    # events (responses_api.py) are several to a delta.

    def opening(self) -> list[dict]:
        """The events a stream begins with, before its first step."""
        return [self.chunk(first=True)] if self.chat else []

    def deltas(self, delta: "Delta") -> list[dict]:
        """The chunks of a delta: its parts in order, a new chunk where a part comes after one its
        chunk would give after it (text after a call, reasoning after text): a client that reads a
        chunk's reasoning, content and tool_calls in that order reads the reply in its order."""
        chunks: list[Delta] = []
        for part in delta:
            if not chunks or _rank(part) < max(map(_rank, chunks[-1])):
                chunks.append([])
            chunks[-1].append(part)
        return [self.chunk(**joined(parts)) for parts in chunks]

    def closing(self, result: Result, seed: int, read: "ChatReply | None", include_usage: bool) -> list[dict]:
        """The events that end a stream whose generation has ended."""
        last = self.last_chunk(result, seed, read)
        return [last, self.usage_chunk(result, read)] if include_usage else [last]

    def failure(self, error: ApiError) -> list[dict]:
        """The events of a stream whose generation failed or was stopped: the error's body."""
        return [error.body()]

    def sse(self, event: dict | str) -> str:
        """An event as server-sent events write it."""
        return f"data: {event if isinstance(event, str) else json.dumps(event, ensure_ascii=False)}\n\n"


# A delta: what a step adds to a reply, as parts in the order the model wrote them, each one
# keyword argument of Reply.chunk: {"reasoning": text}, {"text": text} or {"tool_calls": [call]}.
Delta = list[dict]
FIELD_ORDER = ("reasoning", "text", "tool_calls")  # a chunk's fields, in the order a client reads them


def _rank(part: dict) -> int:
    (kind,) = part
    return FIELD_ORDER.index(kind)


def joined(delta: Delta) -> dict:
    """A delta's parts as one chunk's keyword arguments (its texts joined, its calls listed)."""
    fields: dict = {}
    for part in delta:
        (kind,) = part
        fields[kind] = fields.get(kind, type(part[kind])()) + part[kind]
    return fields


class ChatReply:
    """A chat reply read as it is generated: its reasoning kept apart from its answer
    (engine/reasoning.py), and the answer alone read for tool calls when tools were offered (ToolReply).
    `opened`: the prompt ends inside a think block (the marker that ends it); `call_openings` and
    `recipient`: as ReasoningSplitter takes them. The reply may begin with `prefill`, the start of
    a call the prompt ends with (tool_choice "required" or a named function): it is read as the
    reply's first text. Streamed or not, the same reading gives the same reply."""

    def __init__(
        self,
        opened: bool | str,
        tools: "ToolReply | None" = None,
        prefill: str = "",
        call_openings: tuple[str, ...] = (),
        recipient: bool = False,
    ):
        self.splitter = ReasoningSplitter(opened, call_openings, recipient, tools is not None)
        self.reading = (opened, call_openings, recipient)  # how the splitter reads: count_reasoning reads so again
        self.tools, self.prefill, self.begins = tools, prefill, prefill
        self.reasoning_tokens = 0  # the generated tokens of its reasoning (count_reasoning)
        self.reasoning = ""  # what the deltas so far hold
        self.text = ""
        self.parts: Delta = []  # the deltas so far, one after another: the whole reply in its order

    def feed(self, text: str) -> Delta:
        """The delta that `text` decides."""
        text, self.prefill = self.prefill + text, ""
        return self._delta(self.splitter.feed(text), ended=False)

    def finish(self) -> Delta:
        """The delta the end of the reply decides."""
        return self._delta(self.splitter.finish(), ended=True)

    def count_reasoning(self, pieces: Iterable[bytes]) -> None:
        """Count the reply's reasoning tokens from its generated tokens' bytes, in order: read
        again token by token, as engine/reasoning.py's reasoning_tokens says."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # as the engine's TextStream
        texts = (decoder.decode(piece) for piece in pieces)
        self.reasoning_tokens = reasoning_tokens(texts, *self.reading, before=self.begins)

    def message(self) -> dict:
        """The whole reply as a message (after finish)."""
        message = self.tools.message() if self.tools is not None else {"role": "assistant", "content": self.text}
        return message | ({"reasoning_content": self.reasoning} if self.reasoning else {})

    def finish_reason(self, otherwise: str) -> str:
        return self.tools.finish_reason(otherwise) if self.tools is not None else otherwise

    def _delta(self, split: Split, ended: bool) -> Delta:
        self.reasoning += split.reasoning
        if self.tools is None:
            self.text += split.answer
            answer = [{"text": split.answer}] if split.answer else []
        else:
            answer = self.tools.feed(split.answer) + (self.tools.finish() if ended else [])
        delta = ([{"reasoning": split.reasoning}] if split.reasoning else []) + answer
        self.parts += delta
        return delta


class ToolReply:
    """A chat reply read for tool calls as it is generated: its deltas hold text decided not to be
    a call, and calls once complete (tool_calls.py). Streamed or not, the same reading gives the
    same calls and text. (A call the prompt begins is given as the reply's first text: ChatReply.)"""

    def __init__(
        self,
        tool_names: list[str],
        parallel: bool = True,
        texts: dict[str, frozenset[str]] | None = None,
        generic: bool = False,
    ):
        """`generic`: the reply is the one JSON object of the generic format (generic_tools.py)."""
        self.parser = GenericReader(tool_names) if generic else ToolCallParser(tool_names, texts)
        self.parallel = parallel
        self.text = ""  # what the deltas so far hold: text and calls
        self.calls: list[dict] = []

    def feed(self, text: str) -> Delta:
        """The delta (text and calls, in order) that `text` decides."""
        return self._delta(self.parser.feed_in_order(text))

    def finish(self) -> Delta:
        """The delta the end of the reply decides."""
        return self._delta(self.parser.finish_in_order())

    def message(self) -> dict:
        """The whole reply as a message (after finish)."""
        if not self.calls:
            return {"role": "assistant", "content": self.text}
        calls = [{k: v for k, v in call.items() if k != "index"} for call in self.calls]  # index: streams only
        return {"role": "assistant", "content": self.text or None, "tool_calls": calls}

    def finish_reason(self, otherwise: str) -> str:
        return "tool_calls" if self.calls else otherwise

    def _delta(self, parts: "list[str | ToolCall]") -> Delta:
        delta: Delta = []
        for part in parts:
            if isinstance(part, str):
                self.text += part
                delta.append({"text": part})
            elif self.parallel or not self.calls:  # parallel_tool_calls false: the first call only
                self.calls.append(call := self._call(part, len(self.calls)))
                delta.append({"tool_calls": [call]})
        return delta

    @staticmethod
    def _call(call: ToolCall, index: int) -> dict:
        function = {"name": call.name, "arguments": call.arguments}
        return {"index": index, "id": call_id(), "type": "function", "function": function}


def call_id() -> str:
    """A new call's id: 9 letters and digits, the only ids Mistral's templates take back."""
    return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))
