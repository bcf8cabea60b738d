"""llama-server's own endpoints for `specllm serve`, for clients made for llama.cpp: /infill (fill
in the middle, as editor plugins ask for it: llama.vscode, llama.vim) and /completion (a prompt
completed, as Continue's llama.cpp provider asks for it), whose responses are llama.cpp's
completion objects, not OpenAI's; and its utilities /tokenize, /detokenize and /props (and
/apply-template, which takes a chat request). Plain data, as openai_api.py: no HTTP, no engine.

The sampler is specllm's (temperature, top-k, top-p, min-p) whatever `samplers` lists. The limits
an editor puts on a completion, `n_indent` and `t_max_predict_ms`, end it as llama-server does.
"""

from dataclasses import dataclass
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from specllm.engine.infill import ContextFile
from specllm.engine.loop import Result
from specllm.engine.sampling import MAX_SEED
from specllm.serve.openai_api import UNSUPPORTED, ApiError, BaseRequest, Gap, Reply, specllm_stats, usage

# llama.cpp's fields that ask for what specllm does not do, and their values that ask nothing.
LLAMA_UNSUPPORTED: dict[str, tuple[object, ...]] = {
    "n_probs": (None, 0),
    "repeat_penalty": (None, 1, 1.0),
    "mirostat": (None, 0, 0.0),  # 1 and 2 are samplers of their own (Continue's llama.cpp provider sends it)
    "lora": (None, []),
}
LLAMA_DEFAULT_SEED = 0xFFFFFFFF  # llama-server's default seed, which asks for a fresh one
STOP_TYPES = {"eos": "eos", "stop": "word", "max_tokens": "limit", "context_full": "limit", "limit": "limit"}


class ExtraChunk(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    text: str
    filename: str = "tmp"  # llama-server's name for a chunk that has none


class LlamaRequest(BaseRequest):
    """The fields llama-server's endpoints share."""

    UNSUPPORTED_FIELDS: ClassVar[dict[str, tuple[object, ...]]] = UNSUPPORTED | LLAMA_UNSUPPORTED

    response_fields: list[str] | None = None  # only these fields ("timings/prompt_n": nested ones)
    n_indent: int = Field(0, ge=0)  # end before a new line indented less (TextStream)
    t_max_predict_ms: int | float = Field(0, ge=0, allow_inf_nan=False)  # end at a line break after this; 0: never
    seed: int | None = Field(None, ge=-1, le=MAX_SEED)  # -1 or 2^32-1: a fresh one, as llama-server reads them

    def check(self) -> None:
        super().check()
        if self.seed in (-1, LLAMA_DEFAULT_SEED):
            self.seed = None

    @property
    def limits(self) -> dict:
        seconds = self.t_max_predict_ms / 1000 if self.t_max_predict_ms > 0 else None
        return {"min_indent": self.n_indent, "line_seconds": seconds}

    @property
    def include_usage(self) -> bool:
        return False  # llama.cpp's stream has no usage chunk: its last chunk carries the counts

    def reply(self, model: str, left_out: int = 0, prompt_tokens: int = 0) -> "LlamaReply":
        return LlamaReply(False, model, fields=tuple(self.response_fields or ()), left_out=left_out)


class NativeCompletionRequest(LlamaRequest):
    prompt: str | list[int]  # text (its control tokens read as such) or token ids

    def check(self) -> None:
        super().check()
        if self.prompt == []:
            raise ApiError(400, "the prompt has no token ids", "prompt")


class InfillRequest(LlamaRequest):
    input_prefix: str
    input_suffix: str
    input_extra: list[ExtraChunk] = []
    prompt: str = ""  # follows the prefix: the text typed on the cursor's line

    def gap(self) -> Gap:
        files = tuple(ContextFile(chunk.filename, chunk.text) for chunk in self.input_extra)
        return Gap(self.input_prefix, self.input_suffix, files, self.prompt)


@dataclass(frozen=True)
class LlamaReply(Reply):
    """llama.cpp's completion objects: the whole one, or streamed chunks of `content` ending with
    the whole one (its content empty), and no [DONE] after them. `fields`: response_fields;
    `left_out`: tokens of the request's code cut to leave room for the reply."""

    fields: tuple[str, ...] = ()
    left_out: int = 0
    END_OF_STREAM: ClassVar[str | None] = None

    def complete(self, result: Result, seed: int, read=None) -> dict:
        return self._body(result, seed, result.text)

    def chunk(self, text=None, *, first=False, finish=None, tool_calls=None, reasoning=None) -> dict:
        return {"content": text or "", "stop": False}

    def last_chunk(self, result: Result, seed: int, read=None) -> dict:
        return self._body(result, seed, "")  # the content has come in the chunks

    def _body(self, result: Result, seed: int, content: str) -> dict:
        counts, stats = usage(result), result.stats
        body = {
            "content": content,
            "stop": True,
            "stop_type": STOP_TYPES[result.stop_reason],
            "model": self.model,
            "tokens_predicted": counts["completion_tokens"],
            "tokens_evaluated": counts["prompt_tokens"],
            "tokens_cached": tokens_cached(result),
            "truncated": self.left_out > 0,
            "timings": {
                "prompt_n": stats.prefill_tokens,
                "prompt_ms": stats.prefill_seconds * 1000,
                "prompt_per_second": _rate(stats.prefill_tokens, stats.prefill_seconds),
                "predicted_n": stats.generated_tokens,
                "predicted_ms": stats.decode_seconds * 1000,
                "predicted_per_second": _rate(stats.generated_tokens, stats.decode_seconds),
            },
            "specllm": specllm_stats(result, seed),
        }
        return _only(self.fields, body) if self.fields else body


def tokens_cached(result: Result) -> int:
    """llama-server's tokens_cached: what the KV cache holds of this prompt and reply at the end.
    The reply's last token is never evaluated, but for an end-of-text token, which is not part of
    the reply: the token before it was. It tells nothing of other clients' requests."""
    generated = len(result.tokens)
    return result.stats.prompt_tokens + (generated if result.stop_reason == "eos" else max(generated - 1, 0))


def _rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else 0.0


def _only(paths: tuple[str, ...], body: dict) -> dict:
    """llama-server's response_fields: each path ("timings/prompt_n") found in the body, under
    that path as its key."""
    picked = {}
    for path in paths:
        value: object = body
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            picked[path] = value
    return picked


# --- the utilities: tokens, and what the server is ----------------------------------------------


class TokenizeRequest(BaseModel):
    """/tokenize: `content` is text, or text and token ids mixed (ids kept as they are, and only a
    first text gets the BOS `add_special` asks for), as llama-server reads it."""

    model_config = ConfigDict(extra="ignore", strict=True)
    content: str | list[str | int] = ""  # none: no tokens, as llama-server answers
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False

    def parts(self) -> list[str | int]:
        return [self.content] if isinstance(self.content, str) else self.content


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    tokens: list[int] = []


def check_ids(tokens: list[int], n_vocab: int, field: str) -> None:
    """Token ids a request gives, each in the vocabulary (0..n_vocab-1)."""
    for i, token in enumerate(tokens):
        if not 0 <= token < n_vocab:
            raise ApiError(400, f"{field}: token id {token} (at {i}) is not in 0..{n_vocab - 1}", field)


def with_pieces(tokens: list[int], pieces: list[bytes]) -> list[dict]:
    """/tokenize's `with_pieces`: each token's id and piece, as text, or as its bytes where they
    are not UTF-8 (a token that holds part of a character), as llama-server gives them."""
    return [{"id": token, "piece": _text_or_bytes(piece)} for token, piece in zip(tokens, pieces)]


def _text_or_bytes(piece: bytes) -> str | list[int]:
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return list(piece)


def props(model: str, n_ctx: int, chat_template: str, tool_use_template: str | None) -> dict:
    """/props: what clients made for llama-server read of it (the context: llama.vscode's agent;
    the chat templates the server renders with), and never where the model's file is
    (llama-server's model_path)."""
    answer = {
        "default_generation_settings": {"n_ctx": n_ctx},
        "total_slots": 1,  # one generation at a time
        "model_alias": model,
        "chat_template": chat_template,
    }
    return answer | ({"chat_template_tool_use": tool_use_template} if tool_use_template else {})
