"""A GGUF model and its context, through llama-cpp-python's low-level API.

A `Model` owns one GGUF model and one context with a single sequence. It remembers which tokens
are in its KV cache, so callers can append, cut back and reuse a common prefix. Logits are asked
for only at the rows that need them; there is never an n_ctx x n_vocab buffer.
"""

import contextlib
import copy
import ctypes
import functools
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeGuard

import llama_cpp as L
import numpy as np

from specllm.errors import ChatTemplateFailed, Interrupted, SpecllmError
from specllm.llama import huge_pages
from specllm.llama.devices import amx_built_in, gpu_layers, gpu_offload_supported, physical_cores, replays_cuda_graphs
from specllm.llama.gguf_header import check_gguf_header, check_vocabulary
from specllm.llama.log import first_error, init_backend, recent_errors
from specllm.llama.memory import NO_KV_CACHE, check_context_fits, kv_widths
from specllm.llama.options import CTX_STEP, ModelOptions
from specllm.llama.rpc import model_devices, rpc_connected
from specllm.llama.templates import (
    CHATML_TEMPLATE,
    TEMPLATE_VARIABLES,
    as_template_takes,
    compile_chat_template,
    render_bounded,
    turn_stops,
)

# Control tokens that a model's text shows, as llama-server preserves them for its parsers: the
# markers of think blocks (engine/reasoning.py's THINK_MARKERS: Magistral's and Ministral 3's
# [THINK], Gemma 4's thought channel, Command A's, MiniMax M3's, Hunyuan 3's, Kimi K3's sections),
# of an answer (Command R7B's and A's response, Cohere2 MoE's text: its ANSWER_MARKUP) and of tool
# calls (serve/tool_calls.py: Mistral's [TOOL_CALLS] and [ARGS], Llama 3's <|python_tag|>, Gemma
# 4's, MiniMax M2's, GLM's, Command R7B's action), where a tokenizer holds them as control tokens.
# Without them a reply's reasoning or calls could not be read.
SHOWN_CONTROL_TOKENS = (
    "<think>", "</think>", "[THINK]", "[/THINK]", "<|channel>", "<channel|>",
    "<|START_THINKING|>", "<|END_THINKING|>", "<seed:think>", "</seed:think>", "<mm:think>", "</mm:think>",
    "<think:opensource>", "</think:opensource>", "<|open|>", "<|close|>", "<|sep|>",
    "<tool_call>", "</tool_call>", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "<|python_tag|>",
    "<|tool_call>", "<tool_call|>", '<|"|>', "<minimax:tool_call>", "</minimax:tool_call>",
    "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
    "<|START_RESPONSE|>", "<|END_RESPONSE|>", "<|START_TEXT|>", "<|END_TEXT|>", "<|START_ACTION|>", "<|END_ACTION|>",
)  # fmt: skip

# What this llama-cpp-python can do with a recurrent state: keep snapshots of it (n_rs_seq), and
# copy it out and back in (checkpoints). Builds before 0.3.36 have neither.
SNAPSHOT_API = hasattr(L, "llama_n_rs_seq")
STATE_API = hasattr(L, "llama_state_seq_get_size_ext") and hasattr(L, "LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY")
DEFAULT_OPTIONS = ModelOptions()  # frozen: one instance serves every model loaded with the defaults
# Calls of up to this many tokens write their batch element by element through ctypes rather than
# with numpy's vector writes: on the cold caches after a model's call each numpy call costs tens of
# microseconds (a verify call of 5 tokens: 12 us against 35 on 2 cores), which a prompt's batch
# of hundreds of tokens amortises and a step's call does not.
ELEMENTWISE_BATCH = 32


class Decoder(Protocol):
    """What drafting and calibration use of a model: a Model, or a target's MtpHead standing in
    for a draft model."""

    path: Path
    n_vocab: int
    n_ctx: int
    n_batch: int
    on_gpu: bool
    one_token_catch_up: bool  # feed a few tokens one call each (see Model)

    def cached_prefix(self, tokens: list[int]) -> int: ...

    def sync(self, tokens: list[int], n_logits: int = 0) -> np.ndarray: ...

    def eval(self, tokens: list[int], n_logits: int = 1) -> np.ndarray: ...

    def truncate(self, n: int) -> None: ...

    def checkpoint(self) -> None: ...


class _Views:
    """numpy views of llama.cpp's float buffers, kept per address and shape. Making one costs
    ~50 us (numpy parses the ctypes type each time), and llama.cpp moves a buffer only when it
    grows, so a step's few calls reuse a handful of views; the last one is checked first, since
    a draft's one-token calls ask for the same view again and again."""

    def __init__(self):
        self._views: dict[tuple[int, tuple[int, ...]], np.ndarray] = {}
        self._last: tuple[int, tuple[int, ...], np.ndarray | None] = (0, (), None)

    def of(self, pointer, shape: tuple[int, ...]) -> np.ndarray:
        """The view of `shape` floats at `pointer` (a ctypes pointer, or an address as an int)."""
        address = pointer if isinstance(pointer, int) else _address(pointer)
        last_address, last_shape, view = self._last
        if address == last_address and shape == last_shape and view is not None:
            return view
        view = self._views.get((address, shape))
        if view is None:
            if len(self._views) > 256:  # a moved buffer leaves stale views behind
                self._views.clear()
            floats = ctypes.cast(address, ctypes.POINTER(ctypes.c_float))
            view = self._views[(address, shape)] = np.ctypeslib.as_array(floats, shape=shape)
        self._last = (address, shape, view)
        return view


def _address(pointer) -> int:
    return ctypes.cast(pointer, ctypes.c_void_p).value or 0  # NULL's value is None (as_array refuses it)


def _returning_address(function, *argtypes):
    """Another binding of a llama.cpp function that returns a pointer, returning it as a plain
    int. Reading llama_cpp's float pointer takes a ctypes.cast, which on the cold caches after a
    model's call costs tens of microseconds, and the loop fetches logits after every call."""
    return ctypes.CFUNCTYPE(ctypes.c_void_p, *argtypes)(_address(function))


# The logits of the last call's output rows, as an address (0 for none): see _returning_address.
llama_get_logits = _returning_address(L.llama_get_logits, ctypes.c_void_p)


@dataclass(frozen=True)
class FimTokens:
    """A code model's fill-in-the-middle tokens: the gap's three, and the repository-level pair
    (Qwen2.5-Coder's <|repo_name|> and <|file_sep|>) where the model has them."""

    prefix: int
    suffix: int
    middle: int
    repo: int | None = None
    file_sep: int | None = None


@dataclass(frozen=True)
class Pieces:
    """Every token's piece (Model.piece), both ways, by id."""

    text: tuple[bytes, ...]  # as text shows it
    special: tuple[bytes, ...]  # with special=True: as llama.cpp's grammar reads it


class Model:
    """One GGUF model with a single-sequence context (or only its vocabulary, `vocab_only`)."""

    def __init__(self, path: str | Path, options: ModelOptions = DEFAULT_OPTIONS, *, vocab_only=False):
        init_backend()
        self.path = Path(path)
        self.options = options
        self._model = self._ctx = None
        # How many open models use these weights: this one and its siblings, which share the list.
        # The last of them to close frees the weights, whichever it is.
        self._weights_users = [1]
        check_gguf_header(self.path)
        check_vocabulary(self.path)  # before llama.cpp, which aborts the process on a token given twice
        self._devices = model_devices(options.rpc)  # kept alive while loading
        self.on_huge_pages = not vocab_only and huge_pages.weights_on_huge_pages(self.path, gpu_layers(options))
        self._model = _load_model(self.path, options, vocab_only, self._devices, self.on_huge_pages)
        rpc_connected.update(options.rpc)  # llama.cpp now holds a connection to each until close()
        self.on_gpu = gpu_offload_supported() and gpu_layers(options) > 0  # then batched calls cost about one call
        # With CUDA graphs a one-token call takes half as long in a row of one-token calls as after
        # a call of another width (a 0.5B on an H200: 1.2 ms against 2.2-2.9, and the wider call
        # 3.5-4.7): a draft feeds its catch-up of a few tokens one call each (drafters.ModelDrafter).
        self.one_token_catch_up = self.on_gpu and replays_cuda_graphs()
        self._vocab_handle = L.llama_model_get_vocab(self._model)
        self.n_vocab: int = L.llama_vocab_n_tokens(self._vocab)
        # A recurrent state (Mamba, RWKV) or a hybrid's recurrent layers (Qwen3.5, Granite 4, LFM2,
        # ...) sum up every earlier token: it cannot simply be cut back to a position (see _rewind).
        self.hybrid = bool(L.llama_model_is_hybrid(self._model))
        self.recurrent = self.hybrid or bool(L.llama_model_is_recurrent(self._model))
        self.n_nextn = _nextn_layers(self._model)  # MTP layers: the model can draft for itself
        self._hidden: np.ndarray | None = None  # per position, the hidden state its MTP layers read
        self._pieces: dict[int, bytes] = {}
        self._special_pieces: dict[int, bytes] = {}  # piece(special=True)'s
        self.llama_seconds = 0.0  # inside llama.cpp's evaluating calls: the loop's own time is the rest
        self.tokens: list[int] = []  # what the KV cache holds, position by position
        if not vocab_only:
            self._open_context()

    def _open_context(self) -> None:
        kv_cache = self.metadata("general.architecture") not in NO_KV_CACHE
        check_context_fits(
            self.path.name, self._kv_widths, self.options.n_ctx, self.options.n_batch, self._layers_on_cpu, kv_cache
        )
        self._ctx = _new_context(self._model, self.options, self.path, self.recurrent)
        self.n_ctx: int = L.llama_n_ctx(self._ctx)
        self.n_batch: int = L.llama_n_batch(self._ctx)  # llama.cpp caps it at n_ctx
        self._memory = L.llama_get_memory(self._ctx)  # its KV cache (and recurrent state), for the context's life
        self._batch = L.llama_batch_init(self.n_batch, 0, 1)  # reused by every decode
        for i in range(self.n_batch):
            self._batch.n_seq_id[i] = 1
            self._batch.seq_id[i][0] = 0
        # The batch's arrays: a prompt's batch is written by numpy views of them, one vector write
        # per field, and a step's call by ctypes element by element (see ELEMENTWISE_BATCH).
        self._batch_fields = (self._batch.token, self._batch.pos, self._batch.logits)
        self._batch_token, self._batch_pos, self._batch_logits = (
            np.ctypeslib.as_array(array, shape=(self.n_batch,)) for array in self._batch_fields
        )
        self._views = _Views()
        # Snapshots llama.cpp really keeps: it turns them off for architectures whose kernels
        # write none (Mamba, RWKV, Jamba, ...).
        self.snapshots = L.llama_n_rs_seq(self._ctx) if self.recurrent and SNAPSHOT_API else 0
        self._rollback_room = 0  # trailing tokens the snapshots can take back right now
        self._checkpoints: dict[str, _Checkpoint] = {}  # by slot: "prompt", "step"
        self.n_evaluated = 0  # tokens llama.cpp has evaluated, all calls together
        self._unsure = False  # a state change was interrupted: the state must be rebuilt

    @functools.cached_property
    def _kv_widths(self) -> tuple[int, ...] | None:
        """Per layer, the K and V values a token adds to the KV cache (memory.kv_widths)."""
        return kv_widths(self.metadata, self.hybrid)

    @property
    def _layers_on_cpu(self) -> int:
        """The repeating layers whose KV cache is in this process's memory: those not offloaded
        (llama.cpp offloads the last ones, the output layer first)."""
        offloaded = gpu_layers(self.options) if gpu_offload_supported() or self.options.rpc else 0
        n_layer = L.llama_model_n_layer(self._model)
        return n_layer - min(max(offloaded - 1, 0), n_layer)

    def sibling(self) -> "Model":
        """The same loaded weights with a KV cache of its own, so that two generations can run
        side by side (bench interleaves its configurations step by step). The weights are freed
        when the last model on them is closed, this one or a sibling."""
        self._weights_users[0] += 1  # first: an interrupt before the copy leaks them, never frees them early
        twin = copy.copy(self)  # shares the weights, the vocabulary and its caches
        twin.tokens, twin._ctx = [], None  # a failed open frees nothing of ours
        twin._open_context()
        if self._hidden is not None:
            twin._hidden = None
            twin.keep_hidden_states()
        return twin

    def keep_hidden_states(self) -> None:
        """From now on keep, for every position evaluated, the hidden state that the model's MTP
        layers take as input (llama.cpp's "nextn" embeddings, one row per token)."""
        if self._hidden is None:
            from llama_cpp import llama_cpp_ext

            llama_cpp_ext.llama_set_embeddings_nextn(self._ctx, True, False)  # a row for every token
            self._hidden = np.zeros((0, L.llama_model_n_embd_out(self._model)), dtype=np.float32)

    def hidden_state(self, position: int) -> np.ndarray:
        """The hidden state kept for a position the model holds (see keep_hidden_states)."""
        if self._hidden is None or not 0 <= position < len(self.tokens):
            raise ValueError(f"no hidden state kept for position {position}")
        return self._hidden[position]

    @property
    def can_take_back(self) -> bool:
        """Can rejected draft tokens be taken back without evaluating everything again: always
        for attention models; with snapshots or checkpoints for recurrent ones."""
        return not self.recurrent or self.snapshots > 0 or STATE_API

    @property
    def max_draft(self) -> int | None:
        """The longest draft whose rejected tokens this model can take back after a verify call
        without restoring a checkpoint: None (no limit) for attention models, the snapshots for
        hybrid and recurrent ones (0 where llama.cpp keeps none)."""
        return self.snapshots if self.recurrent else None

    def __repr__(self) -> str:
        state = "closed" if getattr(self, "_model", None) is None else f"n_ctx={getattr(self, 'n_ctx', None)}"
        return f"<Model {str(self.path)!r}, {state}>"

    def close(self) -> None:
        # Each handle is forgotten before it is freed: an interrupt (Ctrl-C) landing just after a
        # free would otherwise leave it to be freed again by the next close() or __del__.
        ctx, self._ctx = getattr(self, "_ctx", None), None
        if ctx is not None:
            batch, self._batch = getattr(self, "_batch", None), None  # an __init__ interrupted before it: none
            if batch is not None:
                L.llama_batch_free(batch)
            L.llama_free(ctx)
        model, self._model = getattr(self, "_model", None), None
        if model is not None:
            self._weights_users[0] -= 1
            if self._weights_users[0] == 0:
                L.llama_model_free(model)
                rpc_connected.subtract(self.options.rpc)

    def __del__(self):
        close_to_the_end(self)

    def _check_open(self) -> None:
        """Refuse a call once closed: llama.cpp would read freed memory, and crash the process."""
        if self._model is None:
            raise SpecllmError(f"{self.path.name} is closed: load the model again")

    # --- vocabulary -------------------------------------------------------------------------

    @property
    def _vocab(self):
        self._check_open()  # the vocabulary is freed with the weights
        return self._vocab_handle

    @property
    def bos(self) -> int:
        return L.llama_vocab_bos(self._vocab)

    @property
    def eos(self) -> int:
        return L.llama_vocab_eos(self._vocab)

    @property
    def add_bos(self) -> bool:
        return bool(L.llama_vocab_get_add_bos(self._vocab))

    @property
    def add_eos(self) -> bool:
        return bool(L.llama_vocab_get_add_eos(self._vocab))

    @property
    def sep(self) -> int:
        return L.llama_vocab_sep(self._vocab)

    @property
    def add_sep(self) -> bool:
        """Whether a text pair is read with SEP between its texts (a BERT's, a reranker's)."""
        return bool(L.llama_vocab_get_add_sep(self._vocab))

    @property
    def vocab_type(self) -> int:
        return L.llama_vocab_type(self._vocab)

    @property
    def pre_tokenizer_missing(self) -> bool:
        """A BPE vocabulary whose GGUF names no pre-tokenizer (tokenizer.ggml.pre, which files
        converted before llama.cpp had it lack): llama.cpp then splits text into words by its
        default rules, which may not be the model's, and says so only in its log."""
        return self.vocab_type == L.LLAMA_VOCAB_TYPE_BPE and not self.metadata("tokenizer.ggml.pre")

    def metadata(self, key: str) -> str | None:
        """A GGUF metadata value as text, as llama.cpp loaded it (None: the file has no such key)."""
        self._check_open()
        buf = ctypes.create_string_buffer(256)
        n = L.llama_model_meta_val_str(self._model, key.encode("utf-8"), buf, len(buf))
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            n = L.llama_model_meta_val_str(self._model, key.encode("utf-8"), buf, len(buf))
        return None if n < 0 else buf.value.decode("utf-8", errors="replace")

    @functools.cached_property
    def fim_tokens(self) -> "FimTokens | None":
        """The control tokens of a fill-in-the-middle prompt, as llama.cpp found them (by the GGUF's
        tokenizer.ggml.fim_*_token_id, or by their text: Qwen's <|fim_prefix|>, CodeLlama's <PRE>,
        ...); None for a model without the three a gap needs."""
        v = self._vocab
        prefix, suffix, middle = L.llama_vocab_fim_pre(v), L.llama_vocab_fim_suf(v), L.llama_vocab_fim_mid(v)
        if min(prefix, suffix, middle) < 0:  # LLAMA_TOKEN_NULL
            return None
        repo, file_sep = L.llama_vocab_fim_rep(v), L.llama_vocab_fim_sep(v)
        return FimTokens(prefix, suffix, middle, repo if repo >= 0 else None, file_sep if file_sep >= 0 else None)

    def is_eog(self, token: int) -> bool:
        return bool(L.llama_vocab_is_eog(self._vocab, token))

    @functools.cached_property
    def markup_tokens(self) -> frozenset[int]:
        """Control and end-of-generation tokens: the chat template's markup (end of turn, role
        headers), never text that an answer repeats. Read once (a pass over the vocabulary takes
        ~50 ms for 150k tokens)."""
        v = self._vocab
        return frozenset(t for t in range(self.n_vocab) if L.llama_vocab_is_control(v, t) or L.llama_vocab_is_eog(v, t))

    def token_text(self, token: int) -> bytes:
        return L.llama_vocab_get_text(self._vocab, token) or b""

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Text -> token ids; adds BOS where the model asks for it (add_special)."""
        data = text.encode("utf-8")
        size = len(data) + 8
        while True:
            buf = (L.llama_token * size)()
            n = L.llama_tokenize(self._vocab, data, len(data), buf, size, add_special, parse_special)
            if n >= 0:
                return list(buf[:n])
            size = -n

    @functools.cached_property
    def shown_controls(self) -> frozenset[int]:
        """The control tokens that text shows (SHOWN_CONTROL_TOKENS) in this vocabulary."""
        found = (self.tokenize(text, add_special=False) for text in SHOWN_CONTROL_TOKENS)
        return frozenset(t[0] for t in found if len(t) == 1 and L.llama_vocab_is_control(self._vocab, t[0]))

    def piece(self, token: int, *, special: bool = False) -> bytes:
        """The bytes one token stands for (control tokens render as nothing, but those of
        SHOWN_CONTROL_TOKENS; with `special` every one as its text, as llama-server's /tokenize
        and /detokenize write them)."""
        cache = self._special_pieces if special else self._pieces
        cached = cache.get(token)
        if cached is None:
            if not 0 <= token < self.n_vocab:  # llama.cpp would throw through ctypes: terminate
                raise SpecllmError(f"token id {token} is outside {self.path.name}'s vocabulary (0..{self.n_vocab - 1})")
            cached = cache[token] = _token_to_piece(self._vocab, token, special or token in self.shown_controls)
        return cached

    @functools.cached_property
    def pieces(self) -> Pieces:
        """Every token's piece, both ways, read in one pass over the vocabulary (about 1 s for
        Qwen2.5's 152k tokens on 2 cores): what looks through the whole vocabulary reads it here
        (a grammar's narrowing by first bytes, the tokens that complete a marker)."""
        text, special = [], []
        for t in range(self.n_vocab):
            text.append(self.piece(t))
            special.append(self.piece(t, special=True))
        return Pieces(tuple(text), tuple(special))

    def detokenize(self, tokens: list[int], *, special: bool = False) -> bytes:
        return b"".join(self.piece(t, special=special) for t in tokens)

    def chat_template(self, name: str | None = None) -> str | None:
        """The GGUF's chat template, or the one of that name (tokenizer.chat_template.NAME)."""
        self._check_open()
        raw = L.llama_model_chat_template(self._model, name.encode() if name else None)
        try:
            return raw.decode("utf-8") if raw else None
        except UnicodeDecodeError:  # (llama.cpp loads a damaged template's bytes as they are)
            raise ChatTemplateFailed(f"the chat template in {self.path} is not UTF-8 text: a damaged file") from None

    def render_chat(
        self,
        messages: list[dict],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
        variables: dict | None = None,
    ) -> str:
        """Render messages with the GGUF's chat template (ChatML when it has none) in a sandboxed
        Jinja environment configured like llama-cpp-python's, with bounded loops and output.
        `tools` (OpenAI's function tools) go in the template's `tools` variable, as llama.cpp and
        transformers pass them; with tools, a model that carries a template of its own for them
        (tokenizer.chat_template.tool_use: Hermes 2 Pro and 3, Command R) is rendered with that one,
        as they do. `variables` are more of the template's variables (`enable_thinking`, say: a
        template that does not read one ignores it). Any template error, from compiling it or
        rendering it, is a SpecllmError."""
        self._check_open()  # before the template's own errors, which these are not
        named = isinstance(variables, Mapping) and all(isinstance(name, str) for name in variables)
        if variables is not None and not named:
            raise SpecllmError(f"a chat template's variables are a dict of names (str) to values, got {variables!r}")
        taken = sorted(TEMPLATE_VARIABLES & set(variables or {}))
        if taken:
            them = "it" if len(taken) == 1 else "them"
            raise SpecllmError(f"a chat template's variables cannot set {', '.join(taken)}: the rendering sets {them}")
        check_messages(messages, tools)
        try:
            source = (tools and self.chat_template("tool_use")) or self.chat_template() or CHATML_TEMPLATE
            template = compile_chat_template(source)
            return render_bounded(
                template,
                **(variables or {}),
                messages=as_template_takes(source, messages),
                eos_token=self.token_text(self.eos).decode("utf-8", errors="replace"),
                bos_token=self.token_text(self.bos).decode("utf-8", errors="replace"),
                add_generation_prompt=add_generation_prompt,
                tools=tools,
            )
        except ChatTemplateFailed:
            raise
        except Exception as e:  # a template can raise anything from inside Jinja
            raise ChatTemplateFailed(f"the chat template of {self.path.name} failed: {e}") from None

    @property
    def chat_stops(self) -> tuple[str, ...]:
        """Stop strings of a reply to a prompt rendered with this model's chat template: the end of
        a turn it may spell out as text (templates.turn_stops), as llama-server adds them."""
        return turn_stops(self.chat_template() or "")

    def describe(self) -> str:
        self._check_open()
        buf = ctypes.create_string_buffer(256)
        L.llama_model_desc(self._model, buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    # --- evaluation -------------------------------------------------------------------------

    def eval(self, tokens: list[int], n_logits: int = 1) -> np.ndarray:
        """Append `tokens` after what the KV cache holds and return the logits of the last
        `n_logits` of them, shape (n_logits, n_vocab). The array is a view into llama.cpp's buffer,
        valid until the next call: copy what must outlive it."""
        check_context(self)
        if len(self.tokens) + len(tokens) > self.n_ctx:
            raise SpecllmError(f"context full: {len(self.tokens) + len(tokens)} tokens > {self.n_ctx}")
        n_logits = min(n_logits, len(tokens))
        if n_logits > self.n_batch:
            raise ValueError(f"at most n_batch={self.n_batch} logit rows per call")
        cancelled = _cancelled.get()
        if cancelled is None:  # a step's call: nothing more to do per call
            self._decode_batches(tokens, n_logits)
        elif len(tokens) < ASKED_FROM_TOKENS:  # a short prompt: done before a stop would matter
            self._decode_batches(tokens, n_logits, cancelled)
        else:
            with self._abortable(cancelled):
                self._decode_batches(tokens, n_logits, cancelled)
        if n_logits == 0:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        # with a GPU, llama_decode only queues the work: fetching the logits waits for it
        return self._views.of(timed(self, llama_get_logits, self._ctx) or 0, (n_logits, self.n_vocab))

    def _decode_batches(self, tokens: list[int], n_logits: int, cancelled: Callable[[], bool] | None = None) -> None:
        for start in range(0, len(tokens), self.n_batch):
            if start and cancelled is not None and cancelled():
                raise Interrupted("the generation was cancelled during its prefill")
            chunk = tokens[start : start + self.n_batch]
            n_out = max(0, n_logits - (len(tokens) - start - len(chunk)))  # rows in this chunk
            self._decode(chunk, n_out)

    @contextlib.contextmanager
    def _abortable(self, cancelled: Callable[[], bool]) -> Iterator[None]:
        """Within `interruptible`, llama.cpp's CPU backend asks after each node of its graph
        whether to stop (a batch of 512 prompt tokens takes 5-15 s on a small CPU), and the
        batch then ends with status 2, its entries removed from the KV cache. A Python call per
        node is nothing beside a prefill's, but would weigh on a step's: only set here.

        On the main thread a Ctrl-C's KeyboardInterrupt is raised in that Python call, where
        ctypes cannot pass it on (it reports it as unraisable and carries on): it is kept, the
        next question stops the batch, and it is raised here as it would have been."""
        signals: list[BaseException] = []
        asks = L.ggml_abort_callback(lambda _data: bool(signals) or cancelled())
        L.llama_set_abort_callback(self._ctx, asks, None)
        try:
            with _keeping_signals(signals):
                yield
        except Interrupted:
            if signals:
                raise signals[0] from None
            raise
        finally:
            L.llama_set_abort_callback(self._ctx, L.ggml_abort_callback(), None)  # none
        if signals:  # one that came with the last question
            raise signals[0]

    def _decode(self, chunk: list[int], n_out: int) -> None:
        batch, pos0, n = self._batch, len(self.tokens), len(chunk)
        batch.n_tokens = n
        if n <= ELEMENTWISE_BATCH:  # a step's call
            token, pos, wants_logits = self._batch_fields
            first_out = n - n_out  # the rows whose logits are asked for: the last n_out
            for i in range(n):
                token[i], pos[i], wants_logits[i] = chunk[i], pos0 + i, i >= first_out
        else:
            self._batch_token[:n] = chunk
            self._batch_pos[:n] = range(pos0, pos0 + n)
            self._batch_logits[: n - n_out] = 0
            self._batch_logits[n - n_out : n] = 1
        self._unsure = self.recurrent  # until llama.cpp has taken the batch: then sync starts over
        status = timed(self, L.llama_decode, self._ctx, batch)
        if status == 2 and _cancelled.get() is not None:  # its abort callback said so (a recurrent state: _unsure)
            raise Interrupted("the generation was cancelled during its prefill")
        if status != 0:
            raise SpecllmError(f"llama.cpp could not evaluate the batch (llama_decode returned {status})")
        if self._hidden is not None:
            self._keep_rows(self._hidden, pos0, n)
        self.tokens.extend(chunk)
        self.n_evaluated += n
        # llama.cpp's recurrent kernels write a snapshot for each token of this batch but the last
        # (and keeps the last n_rs_seq + 1 tokens in one micro-batch): so a call of n tokens can
        # take back at most n - 1 of them. Taking back more answers True and leaves a wrong state.
        self._rollback_room = min(self.snapshots, n - 1)
        self._unsure = False

    def _keep_rows(self, hidden: np.ndarray, pos0: int, n: int) -> None:
        """Copy the hidden states the MTP layers read at the n positions from pos0 into `hidden`
        (self._hidden), growing it first if they do not fit."""
        from llama_cpp import llama_cpp_ext

        if pos0 + n > len(hidden):  # grow by doubling, up to the context
            grown = np.zeros((min(self.n_ctx, max(2 * len(hidden), pos0 + n, 64)), hidden.shape[1]), np.float32)
            grown[: len(hidden)] = hidden
            self._hidden = hidden = grown
        rows = timed(self, llama_cpp_ext.llama_get_embeddings_nextn, self._ctx)  # waits for a GPU, as the logits
        hidden[pos0 : pos0 + n] = self._views.of(rows, (n, hidden.shape[1]))

    def truncate(self, n: int) -> None:
        """Cut the KV cache back to its first n tokens. Always asks llama.cpp, even when our
        record says there is nothing to cut, and forgets the tokens first: an interrupt (Ctrl-C)
        landing mid-way then leaves the cache holding extra tokens (removed by the next call),
        never fewer than `tokens` says. A recurrent state is rewound (see _rewind) and the tokens
        between the point it could go back to and n are evaluated again."""
        check_context(self)
        if not self.recurrent:
            del self.tokens[n:]
            L.llama_memory_seq_rm(self._memory, 0, n, -1)  # always True without recurrence
            return
        replay = self.tokens[:n]
        self.eval(replay[self._rewind(n) :], 0)

    def cached_prefix(self, tokens: list[int]) -> int:
        """How many leading `tokens` the KV cache holds already."""
        return common_prefix(self.tokens, tokens)

    def sync(self, tokens: list[int], n_logits: int = 0) -> np.ndarray:
        """Make the KV cache hold exactly `tokens`, reusing the longest common prefix; return the
        logits of the last `n_logits` tokens (re-evaluating them if they were already cached)."""
        check_context(self)
        keep = min(common_prefix(self.tokens, tokens), len(tokens) - n_logits)
        if self.recurrent:
            keep = self._rewind(keep)
        else:
            self.truncate(keep)
        return self.eval(tokens[keep:], n_logits)

    # --- saved states (serve keeps other conversations' KV caches in memory) --------------------

    def saved_state(self, limit: int | None = None) -> "SavedState | None":
        """What the KV cache holds, as llama.cpp serialises it, with its tokens, for `restore`
        later; None for an empty cache, one of more than `limit` bytes (not copied: a large
        context's is gigabytes, over the network with RPC), or a recurrent or hybrid model (a
        restored recurrent state cannot be cut back to a shorter prompt's start)."""
        check_context(self)
        if self.recurrent or not self.tokens:
            return None
        size = L.llama_state_seq_get_size(self._ctx, 0)
        if limit is not None and size > limit:
            return None
        data = (ctypes.c_uint8 * size)()
        if L.llama_state_seq_get_data(self._ctx, data, size, 0) != size:
            return None
        return SavedState(list(self.tokens), data, size)

    def restore(self, state: "SavedState") -> bool:
        """Make the KV cache hold `state` again (saved_state's, of this model); False, the cache
        emptied, where llama.cpp does not take it."""
        check_context(self)
        self.truncate(0)  # first: an interrupt leaves the cache holding more than `tokens` says, never less
        if L.llama_state_seq_set_data(self._ctx, state.data, state.size, 0) != state.size:
            L.llama_memory_seq_rm(self._memory, 0, 0, -1)
            return False
        self.tokens = list(state.tokens)
        return True

    # --- embeddings (a context opened with ModelOptions.embeddings) --------------------------

    @property
    def pooling(self) -> int:
        """How the context pools a text's token embeddings into one (llama.cpp's
        LLAMA_POOLING_TYPE_*): the GGUF's <arch>.pooling_type, none where it has none."""
        check_context(self)
        return L.llama_pooling_type(self._ctx)

    @property
    def n_embd_out(self) -> int:
        """The length of an embedding."""
        self._check_open()
        return L.llama_model_n_embd_out(self._model)

    @property
    def n_pooled(self) -> int:
        """The length of what the context pools a text into: an embedding, or a reranker's scores
        (one per class of its head, llama.cpp's n_cls_out: one for a reranker)."""
        if self.pooling == L.LLAMA_POOLING_TYPE_RANK:
            return L.llama_model_n_cls_out(self._model)
        return self.n_embd_out

    def embed(self, tokens: list[int]) -> np.ndarray:
        """The pooled embedding of `tokens` alone (a reranker's: its scores of them, n_pooled): the
        cache is emptied first, and the tokens go to llama.cpp in one call of at most n_batch
        tokens, which must be one micro-batch (n_ubatch = n_batch: open_embedding_model), as
        llama.cpp pools each micro-batch on its own (a mean over only the last one's tokens
        otherwise)."""
        check_context(self)
        if not 0 < len(tokens) <= self.n_batch:
            raise ValueError(f"an embedding takes 1 to n_batch={self.n_batch} tokens, got {len(tokens)}")
        self._clear_state()
        self._decode(tokens, 0)  # every token is an output in an embeddings context
        pooled = timed(self, L.llama_get_embeddings_seq, self._ctx, 0)
        if not pooled:  # pooling none: an embedding per token, none for the text
            raise SpecllmError(f"{self.path.name}: llama.cpp pooled no embedding for the text")
        embedding = np.ctypeslib.as_array(pooled, shape=(self.n_pooled,)).copy()
        if not np.isfinite(embedding).all():  # a broken model's, which no JSON can carry
            raise SpecllmError(f"{self.path.name} gave an embedding that is not finite numbers (NaN or infinite)")
        return embedding

    # --- recurrent state ----------------------------------------------------------------------

    def checkpoint(self, slot: str = "step") -> None:
        """Remember the recurrent state here, so that a later rewind to any position from here
        on restores it and evaluates only the tokens after it again, instead of starting over.
        Only the recurrent part is copied (a hybrid's attention cache is cut back as usual). One
        checkpoint is kept per slot: "prompt" (after a prompt: the next one resumes there) and
        "step" (before a draft or verify call). Nothing to do for attention models."""
        check_context(self)
        if not self.recurrent or self._unsure or not STATE_API:
            return
        flags = L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        size = L.llama_state_seq_get_size_ext(self._ctx, 0, flags)
        old = self._checkpoints.pop(slot, None)  # until the new one is whole
        data = old.data if old is not None and len(old.data) >= size else (ctypes.c_uint8 * size)()
        written = timed(self, L.llama_state_seq_get_data_ext, self._ctx, data, size, 0, flags)
        if written:
            self._checkpoints[slot] = _Checkpoint(len(self.tokens), data, written)

    @functools.cached_property
    def state_bytes(self) -> int:
        """Bytes of one copy of this model's recurrent state (0 for attention models): what a
        checkpoint holds and what each snapshot costs. llama.cpp only says once a sequence holds a
        token: before that, it is measured on a small scratch context."""
        check_context(self)
        if not self.recurrent or not STATE_API:
            return 0
        if self.tokens and not self._unsure:
            return L.llama_state_seq_get_size_ext(self._ctx, 0, L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)
        ctx = _new_context(self._model, ModelOptions(n_ctx=CTX_STEP, n_threads=1, snapshots=0), self.path, True)
        try:
            batch = L.llama_batch_get_one((L.llama_token * 1)(self.bos if self.bos >= 0 else 0), 1)
            if L.llama_decode(ctx, batch) != 0:
                return 0
            return L.llama_state_seq_get_size_ext(ctx, 0, L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)
        finally:
            L.llama_free(ctx)

    def _rewind(self, n: int) -> int:
        """Bring a recurrent state back to at most its first n tokens, as cheaply as it can: by
        llama.cpp's snapshots when the last call wrote enough of them, else from the checkpoint,
        else from nothing. Returns how many tokens it holds now (those after it are to be
        evaluated again)."""
        if self._unsure:
            self._clear_state()
        if n >= len(self.tokens):
            return len(self.tokens)
        back = len(self.tokens) - n
        self._unsure = True
        if n > 0 and back <= self._rollback_room and L.llama_memory_seq_rm(self._memory, 0, n, -1):
            del self.tokens[n:]
            self._rollback_room = 0  # llama.cpp takes one partial removal per decode
        elif cp := self._latest_checkpoint(n):
            flags = L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
            if not timed(self, L.llama_state_seq_set_data_ext, self._ctx, cp.data, cp.size, 0, flags):
                raise SpecllmError(f"{self.path.name}: llama.cpp could not restore the recurrent state")
            L.llama_memory_seq_rm(self._memory, 0, cp.n_tokens, -1)  # the attention cache after it
            del self.tokens[cp.n_tokens :]
            self._rollback_room = 0
        else:
            self._clear_state()
        self._unsure = False
        for slot, cp in list(self._checkpoints.items()):
            if cp.n_tokens > len(self.tokens):
                del self._checkpoints[slot]  # it holds tokens that are gone
        return len(self.tokens)

    def _latest_checkpoint(self, n: int) -> "_Checkpoint | None":
        """The checkpoint closest to n tokens without going past them."""
        usable = [cp for cp in self._checkpoints.values() if 0 < cp.n_tokens <= n]
        return max(usable, key=lambda cp: cp.n_tokens, default=None)

    def _clear_state(self) -> None:
        L.llama_memory_clear(self._memory, True)
        self.tokens.clear()
        self._checkpoints.clear()
        self._rollback_room, self._unsure = 0, False


class MtpHead:
    """A target's own MTP ("nextn") layers as a draft model: a Decoder, the interface ModelDrafter
    and calibration use (n_ctx, n_vocab, n_batch, sync, eval, truncate, checkpoint, cached_prefix).

    As llama.cpp's draft-mtp: a context of type MTP over the target's loaded weights. Its position p
    holds token p together with the target's hidden state at p - 1, so what it predicts there is
    token p + 1. The first draft step pairs the last context token with the target's hidden
    state before it; each further step pairs the drafted token with the MTP layer's own hidden
    state. Only the entries built from the target's hidden states are kept from one proposal to
    the next (`_exact`): a drafted token that the target then accepts is entered again with the
    target's state for it."""

    def __init__(self, target: Model):
        from llama_cpp import llama_cpp_ext

        if not target.n_nextn:
            raise SpecllmError(
                f"{target.path.name} has no MTP layers (nextn): drafter 'mtp' needs a model that carries them"
            )
        self.target, self.path, self.options = target, target.path, target.options
        self.n_vocab, self.n_ctx, self.n_batch = target.n_vocab, target.n_ctx, target.n_batch
        self.on_gpu = target.on_gpu
        self.one_token_catch_up = False  # its calls read the target's hidden states, one per token fed
        self.recurrent, self.snapshots, self.max_draft = False, 0, None
        target.keep_hidden_states()
        self._ctx = _new_context(target._model, target.options, target.path, False, mtp_of=target._ctx)
        llama_cpp_ext.llama_set_embeddings_nextn(self._ctx, True, True)  # the MTP layer's own rows, where asked
        self._memory = L.llama_get_memory(self._ctx)
        self._batch = L.llama_batch_ext_init(self._ctx)
        self._n_embd = L.llama_model_n_embd_out(target._model)
        self._zeros = np.zeros(self._n_embd, dtype=np.float32)
        self._own = self._zeros  # the MTP layer's hidden state at its last output
        self._views = _Views()
        self.tokens: list[int] = []
        self._exact = 0  # leading entries made with the target's hidden states
        self.llama_seconds = 0.0  # as Model's

    def close(self) -> None:
        ctx, self._ctx = getattr(self, "_ctx", None), None  # forgotten first, as Model.close
        if ctx is not None:
            L.llama_batch_ext_free(self._batch)
            L.llama_free(ctx)

    def __del__(self):
        close_to_the_end(self)

    def cached_prefix(self, tokens: list[int]) -> int:
        return min(common_prefix(self.tokens, tokens), self._exact)

    def checkpoint(self) -> None:
        pass  # attention only: cut back like any KV cache

    def truncate(self, n: int) -> None:
        check_context(self)
        del self.tokens[n:]
        self._exact = min(self._exact, n)
        L.llama_memory_seq_rm(self._memory, 0, n, -1)

    def sync(self, tokens: list[int], n_logits: int = 0) -> np.ndarray:
        """Hold `tokens` (all but the last one already evaluated by the target, whose hidden
        states go with them); the logits of the last `n_logits` (0 or 1) of them."""
        keep = min(self.cached_prefix(tokens), len(tokens) - n_logits)
        if len(tokens) - 1 > len(self.target.tokens):
            raise ValueError("the MTP layers run one token behind the target at most")
        self.truncate(keep)
        states = [self.target.hidden_state(p - 1) if p else self._zeros for p in range(keep, len(tokens))]
        logits = self._process(tokens[keep:], states, n_logits)
        self._exact = len(self.tokens)
        return logits

    def eval(self, tokens: list[int], n_logits: int = 1) -> np.ndarray:
        """Draft steps: each token with the MTP layer's own hidden state at the last output."""
        return self._process(tokens, [self._own] * len(tokens), n_logits)

    def _process(self, tokens: list[int], states: list[np.ndarray], n_logits: int) -> np.ndarray:
        check_context(self)
        if len(self.tokens) + len(tokens) > self.n_ctx:
            raise SpecllmError(f"context full: {len(self.tokens) + len(tokens)} tokens > {self.n_ctx}")
        batch, pos0, n = self._batch, len(self.tokens), len(tokens)
        L.llama_batch_ext_clear(batch)
        rows = np.ascontiguousarray(np.stack(states), dtype=np.float32) if n else self._zeros[:0]
        pointer = ctypes.POINTER(ctypes.c_float)
        outputs = []
        for i, token in enumerate(tokens):
            index = L.llama_batch_ext_add_token(batch, 0, token)
            position = ctypes.c_int32(pos0 + i)
            L.llama_batch_ext_set_pos(batch, index, ctypes.byref(position))
            row = rows[i].ctypes.data_as(pointer)
            L.llama_batch_ext_set_embd_token(batch, index, L.llama_embd(row, 1, self._n_embd))
            if i >= n - n_logits:
                L.llama_batch_ext_set_output_logits(batch, index, True)
                outputs.append(index)
        if n:
            status = timed(self, L.llama_process, self._ctx, L.LLAMA_PROCESS_TYPE_DECODE, batch)
            if status != 0:
                raise SpecllmError(f"llama.cpp could not evaluate the MTP batch (llama_process returned {status})")
        self.tokens.extend(tokens)
        if not outputs:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        from llama_cpp import llama_cpp_ext

        last = timed(self, llama_cpp_ext.llama_get_embeddings_nextn_ith, self._ctx, outputs[-1])  # waits, as above
        self._own = self._views.of(last, (self._n_embd,)).copy()
        logits = [self._views.of(L.llama_get_logits_ith(self._ctx, i), (self.n_vocab,)) for i in outputs]
        return logits[0][np.newaxis] if len(logits) == 1 else np.stack(logits)  # a view, as Model.eval's


def check_messages(messages: object, tools: object = None) -> None:
    """A conversation (and its tools) in the shape chat templates read, OpenAI's: refused in one
    line, not blamed on the model's template when it fails on a tuple or a missing role. Content
    may be missing only where an assistant's message calls tools, as serve checks it."""
    if not _is_list(messages):
        raise SpecllmError(
            f"messages are a list of {{'role': ..., 'content': ...}} dicts, not {type(messages).__name__}"
        )
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise SpecllmError(f"messages[{i}] is a {type(message).__name__}, not a dict with a role and content")
        if not isinstance(message.get("role"), str):
            raise SpecllmError(f"messages[{i}] has no role (a str such as 'user')")
        content, role = message.get("content"), message["role"]
        if content is None and not (role == "assistant" and message.get("tool_calls")):
            raise SpecllmError(f"messages[{i}] ({role}) has no content")
        if content is not None and not isinstance(content, (str, list)):
            raise SpecllmError(f"messages[{i}]'s content is text or a list of parts, not {type(content).__name__}")
    if tools is not None and not (_is_list(tools) and all(isinstance(tool, Mapping) for tool in tools)):
        raise SpecllmError(f"tools are a list of dicts (OpenAI's function tools), not {type(tools).__name__}")


def _is_list(value: object) -> TypeGuard[Sequence[object]]:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray))


def close_to_the_end(model: "Model | MtpHead") -> None:
    """model.close() from its __del__, whatever signal lands meanwhile. Python cannot pass an
    exception out of a finalizer: it prints "Exception ignored in ... __del__" with a traceback and
    drops it. A command interrupted by Ctrl-C frees its models on its way out (~0.2 s for the
    default pair), and a second Ctrl-C (or a SIGTERM) landing then printed that traceback and left
    the rest unfreed. close() forgets each handle before freeing it, so calling it again frees
    only what is left; the signal is dropped, as Python would drop it."""
    while True:
        try:
            model.close()
            return
        except Exception:
            raise
        except BaseException:  # KeyboardInterrupt, the command's SIGTERM exception: free the rest
            continue


def check_context(owner: "Model | MtpHead") -> None:
    """Refuse a call on a closed model's context (its KV cache, its recurrent state): llama.cpp
    would use the freed memory, and crash the process."""
    if owner._ctx is None:
        raise SpecllmError(f"{owner.path.name} is closed: load the model again")


def timed(owner: "Model | MtpHead", call, *args):
    """call(*args), its wall time added to owner.llama_seconds."""
    start = time.perf_counter()
    result = call(*args)
    owner.llama_seconds += time.perf_counter() - start
    return result


# What a prompt's evaluation asks as it goes: stop here? (a prefill of minutes on a CPU must not
# hold a server that is stopping, or whose client has left). Set per thread of execution by
# `interruptible`: asked between two batches, and by llama.cpp's CPU backend within one.
_cancelled: ContextVar[Callable[[], bool] | None] = ContextVar("cancelled", default=None)
# llama.cpp asks within a batch only from this many tokens on. Its question is a Python call per
# node of the graph, which waits for the GIL: with another thread of the process busy in Python,
# up to its switch interval (5 ms) a node, which made a 256-token prefill 2.4x slower. A prompt
# shorter than this is evaluated in a second or two on a small CPU: it ends before a stop matters.
ASKED_FROM_TOKENS = 64


@contextlib.contextmanager
def interruptible(cancelled: Callable[[], bool]) -> Iterator[None]:
    """Within this block, a model's evaluation raises Interrupted once `cancelled()` is true:
    within a batch on a CPU, else before the next batch. The KV cache then holds the batches
    done, as the model's tokens say."""
    token = _cancelled.set(cancelled)
    try:
        yield
    finally:
        _cancelled.reset(token)


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens `a` and `b` share. Compared by slices (a list comparison runs in
    C): equal blocks of doubling size, then a bisection of the block that differs. A draft model
    checks its cache against the context on every step, and a Python loop over the whole context
    made each step of a long generation slower (1 ms of a step's own time at 4k tokens, 10 at
    32k, 8x what this takes)."""
    n = min(len(a), len(b))
    lo, size = 0, 64
    while lo < n and a[lo : lo + size] == b[lo : lo + size]:
        lo, size = lo + size, size * 2
    if lo >= n:
        return n
    hi = min(lo + size, n)  # the first difference is in [lo, hi), or the shorter list is the other one's prefix
    while hi - lo > 16:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    while lo < hi and a[lo] == b[lo]:
        lo += 1
    return lo


def _nextn_layers(model) -> int:
    """MTP ("nextn") layers a model carries; llama.cpp also counts a router layer there. None
    where this llama-cpp-python cannot draft with them: 0.3.35 counts them but has no batch
    API to feed them (MtpHead), older ones do neither."""
    if not (hasattr(L, "llama_model_n_layer_nextn") and hasattr(L, "llama_batch_ext_init")):
        return 0
    return max(0, int(L.llama_model_n_layer_nextn(model)))


def _load_model(path: Path, options: ModelOptions, vocab_only: bool, devices, on_huge_pages: bool):
    params = L.llama_model_default_params()
    params.n_gpu_layers = gpu_layers(options)
    params.vocab_only = vocab_only
    params.load_mtp = not vocab_only  # the MTP layers of a model that has them (a few % of its weights)
    # llama.cpp's extra CPU weight layouts are AMX's and its repacked ones: with AMX built in, both
    # go, since the API cannot drop AMX's alone (a build without AMX keeps the repacked ones)
    params.use_extra_bufts = not amx_built_in()
    if devices is not None:
        params.devices = ctypes.cast(devices, ctypes.c_void_p)
    if on_huge_pages:
        _read_not_mapped(params)
        # called once the buffers exist, before they are filled
        params.progress_callback = huge_pages.ADVISE_HUGE_PAGES_ONCE
    recent_errors.clear()
    # the file name's own bytes: a name that is not UTF-8 (held as surrogates) cannot be encoded as UTF-8
    model = passing_signals_through(L.llama_model_load_from_file, L.llama_model_free, os.fsencode(path), params)
    if not model:
        if options.rpc:
            why = first_error("out of memory on an RPC server?")
            raise SpecllmError(f"cannot load {path} over RPC ({','.join(options.rpc)}): {why}")
        raise SpecllmError(f"cannot load {path}: {first_error('truncated, corrupt or unsupported')}")
    return model


def _read_not_mapped(params) -> None:
    """Have llama.cpp read the weights into the process's memory rather than map the file: its
    load_mode where llama-cpp-python has one (0.3.35 on), its use_mmap flag before that."""
    if hasattr(L, "LLAMA_LOAD_MODE_NONE"):
        params.load_mode = L.LLAMA_LOAD_MODE_NONE
    else:
        params.use_mmap = False


def passing_signals_through(call, free, *args):
    """call(*args), but a Ctrl-C (or SIGTERM) that lands while one of llama.cpp's callbacks (its
    log, a load's progress) runs Python code is not lost: ctypes cannot pass an exception out of a
    callback (it reports it as unraisable; a progress callback then answers False, which aborts a
    load), so it is caught there and raised again here, after free(result) if there is one, as it
    would be without a callback."""
    signals: list[BaseException] = []
    with _keeping_signals(signals):
        result = call(*args)
        if signals and result:
            free(result)  # its log lines may be interrupted too
    if signals:
        raise signals[0]
    return result


@contextlib.contextmanager
def _keeping_signals(signals: list[BaseException]) -> Iterator[None]:
    """Within this block, what a signal's handler raised in a callback from llama.cpp (reported
    as unraisable: ctypes cannot pass it on) is appended to `signals` instead. Only on the main
    thread, where signals' handlers run: the hook is the process's."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = sys.unraisablehook

    def keep_signals(unraisable):
        if isinstance(unraisable.exc_value, BaseException) and not isinstance(unraisable.exc_value, Exception):
            signals.append(unraisable.exc_value)
        else:
            previous(unraisable)

    sys.unraisablehook = keep_signals
    try:
        yield
    finally:
        sys.unraisablehook = previous


@dataclass(frozen=True)
class SavedState:
    """A model's KV cache as llama.cpp serialised it (Model.saved_state), and the tokens it holds."""

    tokens: list[int]  # never changed: restore copies it
    data: ctypes.Array
    size: int


@dataclass
class _Checkpoint:
    n_tokens: int  # the state after this many tokens
    data: ctypes.Array  # llama.cpp's serialised recurrent state (reused by the next checkpoint)
    size: int


def _new_context(model, options: ModelOptions, path: Path, recurrent: bool, mtp_of=None):
    params = L.llama_context_default_params()
    if mtp_of is not None:  # the MTP layers of the model whose context this is
        params.ctx_type = L.LLAMA_CONTEXT_TYPE_MTP
        params.ctx_other = mtp_of
    params.n_ctx = options.n_ctx
    params.n_batch = params.n_ubatch = options.n_batch
    params.n_seq_max = 1
    params.embeddings = options.embeddings  # pooled as the GGUF's <arch>.pooling_type says
    if SNAPSHOT_API:
        params.n_rs_seq = options.snapshots if recurrent else 0
    params.n_threads = params.n_threads_batch = options.n_threads or physical_cores()
    params.swa_full = True  # sliding-window caches must keep every position to allow rollback
    params.no_perf = True
    recent_errors.clear()
    ctx = passing_signals_through(L.llama_init_from_model, L.llama_free, model, params)
    if not ctx:
        why = first_error("out of memory?")
        raise SpecllmError(f"cannot create a context for {path.name} (n_ctx={options.n_ctx}): {why}")
    return ctx


def _token_to_piece(vocab, token: int, special: bool = False) -> bytes:
    buf = ctypes.create_string_buffer(64)
    n = L.llama_token_to_piece(vocab, token, buf, len(buf), 0, special)
    if n < 0:
        buf = ctypes.create_string_buffer(-n)
        n = L.llama_token_to_piece(vocab, token, buf, len(buf), 0, special)
    return buf.raw[:n]
