"""The OpenAI API's shapes for `specllm serve`: request validation and response objects, as plain
data (no HTTP, no engine). Errors are `ApiError`s carrying the OpenAI error body.

Requests are validated strictly (a string where a number belongs is refused, not converted), unknown
fields are ignored, and fields that ask for something specllm cannot do (tools, logprobs,
penalties, ...) are refused rather than silently ignored.
"""

import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .engine import DRAFTERS, Result, Step

MAX_SEED = 2**32 - 1  # as the CLI's --seed
MAX_STOPS = 4  # as OpenAI


class ApiError(Exception):
    """A request the server refuses: the HTTP status and OpenAI's {"error": {...}} body."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = "invalid_request_error" if status < 500 else "server_error"

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


# Fields of the OpenAI API that ask for what specllm does not do, and their values that ask nothing.
UNSUPPORTED = (
    "tools", "functions", "tool_choice", "function_call", "logprobs", "top_logprobs", "logit_bias",
    "response_format", "presence_penalty", "frequency_penalty", "suffix", "echo", "best_of",
)  # fmt: skip
HARMLESS = (None, False, "", [], {}, {"type": "text"}, "none")  # False == 0: a zero penalty too


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: bool = False


class _Request(BaseModel):
    """Fields common to chat and completions requests."""

    model_config = ConfigDict(extra="allow", strict=True)
    model: str | None = None  # any name is accepted: the server has one model
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)  # extension
    min_p: float | None = Field(None, ge=0, lt=1)  # extension
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    stop: str | list[str] | None = None
    n: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    drafter: str | None = None  # extension: auto | model | mtp | ngram | none
    gamma: int | None = Field(None, ge=1)  # extension: draft length
    specllm_steps: bool = False  # extension: streamed chunks carry each step's draft (specllm_step)

    def check(self) -> None:
        """What the types alone do not say."""
        if self.n not in (None, 1):
            raise ApiError(400, f"only n = 1 is supported (one choice per request), got {self.n}", "n")
        if self.drafter is not None and self.drafter not in DRAFTERS:
            raise ApiError(400, f"unknown drafter {self.drafter!r}: use one of {', '.join(DRAFTERS)}", "drafter")
        if isinstance(self.stop, list) and len(self.stop) > MAX_STOPS:
            raise ApiError(400, f"at most {MAX_STOPS} stop strings, got {len(self.stop)}", "stop")
        for name in UNSUPPORTED:
            value = (self.model_extra or {}).get(name)
            if value not in HARMLESS:
                raise ApiError(400, f"{name} is not supported by specllm serve", name)

    @property
    def requested_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

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


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

    def to_template(self) -> dict:
        """The message as a chat template gets it: OpenAI's "developer" is the system role."""
        content = self.content if isinstance(self.content, str) else "\n".join(p.text for p in self.content)
        return {"role": "system" if self.role == "developer" else self.role, "content": content}


class ChatRequest(_Request):
    messages: list[Message] = Field(min_length=1)


class CompletionRequest(_Request):
    prompt: str | list[int] | list[str]

    def check(self) -> None:
        super().check()
        if isinstance(self.prompt, list) and (not self.prompt or isinstance(self.prompt[0], str)):
            if len(self.prompt) != 1:
                raise ApiError(400, "give one prompt per request (a string or a list of token ids)", "prompt")
            self.prompt = self.prompt[0]


def parse(kind: type[_Request], body: bytes) -> _Request:
    """Validate a request body (JSON bytes) as `kind`; every problem is an ApiError 400."""
    try:
        request = kind.model_validate_json(body)
    except ValidationError as e:
        errors = e.errors(include_url=False)
        if errors[0]["type"] == "json_invalid":
            raise ApiError(400, f"the body is not valid JSON: {errors[0]['msg']}") from None
        # A field of several types (stop: a string or a list) fails once per type: name the field.
        where = ".".join(str(part) for part in os.path.commonprefix([error["loc"] for error in errors]))
        raise ApiError(400, f"{where or 'body'}: {errors[0]['msg']}", where or None) from None
    request.check()
    return request


# --- responses ----------------------------------------------------------------------------------


def finish_reason(stop_reason: str) -> str:
    """OpenAI's finish_reason for the engine's stop reason."""
    return "length" if stop_reason in ("max_tokens", "context_full") else "stop"


def usage(result: Result) -> dict:
    """Exact token counts. The prompt's last token is evaluated with the first generated one, so
    the tokens served from the KV cache are those neither prefilled nor that last one."""
    prompt, generated = result.stats.prompt_tokens, len(result.tokens)
    cached = max(0, prompt - 1 - result.stats.prefill_tokens)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": generated,
        "total_tokens": prompt + generated,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


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

    def _object(self, kind: str, choices: list[dict]) -> dict:
        prefix = "chatcmpl" if self.chat else "cmpl"
        return {"id": f"{prefix}-{self.id}", "object": kind, "created": self.created, "model": self.model, "choices": choices}

    def complete(self, result: Result, seed: int) -> dict:
        """The whole response of a request that was not streamed."""
        choice = {"index": 0, "finish_reason": finish_reason(result.stop_reason), "logprobs": None}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": result.text}
        else:
            choice["text"] = result.text
        body = self._object("chat.completion" if self.chat else "text_completion", [choice])
        return body | {"usage": usage(result), "specllm": specllm_stats(result, seed)}

    def chunk(self, text: str | None = None, *, first: bool = False, finish: str | None = None) -> dict:
        """One streamed chunk: new text, or (with `finish`) the end of the choice."""
        choice = {"index": 0, "finish_reason": finish, "logprobs": None}
        if self.chat:
            choice["delta"] = ({"role": "assistant", "content": ""} if first else {}) | (
                {"content": text} if text else {}
            )
        else:
            choice["text"] = text or ""
        return self._object("chat.completion.chunk" if self.chat else "text_completion", [choice])

    def last_chunk(self, result: Result, seed: int) -> dict:
        """The chunk that ends the choice, with the speculative stats."""
        return self.chunk(finish=finish_reason(result.stop_reason)) | {"specllm": specllm_stats(result, seed)}

    def usage_chunk(self, result: Result) -> dict:
        """stream_options.include_usage: a chunk with no choices and the usage, after the last."""
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return self._object(kind, []) | {"usage": usage(result)}
