"""The only module that talks to llama.cpp (through llama-cpp-python's low-level API).

A `Model` owns one GGUF model and one context with a single sequence. It remembers which tokens
are in its KV cache, so callers can append, cut back and reuse a common prefix. Logits are asked
for only at the rows that need them; there is never an n_ctx x n_vocab buffer.
"""

import collections
import copy
import ctypes
import functools
import io
import os
import socket
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

import llama_cpp as L
import numpy as np

from .errors import SpecllmError
from .gguf_header import check_gguf_header

_LOG_LEVEL_ERROR = 4  # GGML_LOG_LEVEL_ERROR
_verbose = False
_recent_errors: collections.deque[str] = collections.deque(maxlen=4)


@L.llama_log_callback
def _log_callback(level, text, _user_data):
    # llama.cpp logs a lot to stderr; keep it quiet unless -v, but remember its last errors so a
    # failed load can say why.
    message = text.decode("utf-8", errors="replace")
    if level == _LOG_LEVEL_ERROR and message.strip():
        _recent_errors.append(message.strip())
    if _verbose:
        sys.stderr.write(message)


def set_verbose(verbose: bool) -> None:
    global _verbose
    _verbose = verbose


_initialised = False


def _init_backend() -> None:
    global _initialised
    if not _initialised:
        L.llama_log_set(_log_callback, ctypes.c_void_p(0))
        L.llama_backend_init()
        _initialised = True


def physical_cores() -> int:
    """Physical cores available to this process, as llama.cpp counts them (one thread per core)."""
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    siblings = set()
    for cpu in cpus:
        path = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings")
        try:
            siblings.add(path.read_text().strip())
        except OSError:
            siblings.add(str(cpu))
    return max(1, len(siblings))


def build_id() -> str:
    """Which llama.cpp build runs: llama-cpp-python's version and its shared library's size and
    modification time (a rebuild with other CMAKE_ARGS keeps the version but changes the file)."""
    lib = Path(getattr(getattr(L.llama_cpp, "_lib", None), "_name", "") or "")
    try:
        st = lib.stat()
        return f"llama-cpp-python {L.__version__} ({lib.name}:{st.st_size}:{st.st_mtime_ns})"
    except OSError:
        return f"llama-cpp-python {L.__version__}"


def llama_cpp_python_version() -> str:
    return L.__version__


def gpu_offload_supported() -> bool:
    """Whether this machine has a GPU llama.cpp can offload to. Not llama_supports_gpu_offload()
    alone: that is true in every build with the RPC backend, GPU or not."""
    if not L.llama_supports_gpu_offload():
        return False
    try:
        return bool(_local_gpus())
    except (ImportError, AttributeError, OSError):  # a llama-cpp-python without ggml's registry API
        return True


def default_gpu_layers() -> int:
    """Offload every layer when this llama-cpp-python build can, none otherwise."""
    return ALL_LAYERS if gpu_offload_supported() else 0


def gpu_layers(options: "ModelOptions") -> int:
    """The layers a model offloads: as asked, else all of them when it has RPC servers or a
    local GPU to put them on, else none."""
    if options.n_gpu_layers is not None:
        return options.n_gpu_layers
    return ALL_LAYERS if options.rpc else default_gpu_layers()


ALL_LAYERS = 0x7FFFFFFF

# The fallback for models that carry no chat template of their own.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


# llama.cpp rounds a context up to a multiple of 256 (GGML_PAD in llama-context.cpp) but sizes the
# batch from the size asked for, and its n_ctx is a uint32 that wraps around: so only sizes it uses
# as they are get through, and the context in use is always the one asked for.
CTX_STEP = 256
MAX_CTX = 2**31 - CTX_STEP  # positions are int32


def check_context_size(n_ctx: int) -> None:
    if n_ctx < CTX_STEP:
        raise SpecllmError(f"context size must be at least {CTX_STEP} tokens (llama.cpp's smallest), got {n_ctx}")
    if n_ctx > MAX_CTX:
        raise SpecllmError(f"context size must be at most {MAX_CTX} tokens, got {n_ctx}")
    if n_ctx % CTX_STEP:
        rounded = -(-n_ctx // CTX_STEP) * CTX_STEP
        raise SpecllmError(
            f"context size must be a multiple of {CTX_STEP} (llama.cpp would make {n_ctx} {rounded}), got {n_ctx}"
        )


def parse_rpc_servers(servers) -> tuple[str, ...]:
    """ "host:port,host:port" (or a list of such) -> ("host:port", ...), checked; one clear line
    for anything else."""
    if isinstance(servers, str):
        servers = servers.split(",")
    servers = servers or ()
    parsed = []
    for server in servers:
        host, sep, port = str(server).strip().rpartition(":")
        ok = sep and host and ":" not in host and not any(c.isspace() for c in host)
        if not (ok and port.isascii() and port.isdigit() and 0 < int(port) < 65536):
            raise SpecllmError(
                f"malformed RPC server address {str(server).strip()!r}: expected HOST:PORT (e.g. 192.168.1.20:50052)"
            )
        parsed.append(f"{host}:{int(port)}")
    return tuple(dict.fromkeys(parsed))


# Recurrent-state snapshots a hybrid or recurrent model keeps per sequence, so that the last few
# tokens of a verify call can be rejected (llama.cpp's n_rs_seq): each costs one more copy of the
# recurrent state, and the longest draft such a model may verify is this long.
DEFAULT_SNAPSHOTS = 8
MAX_SNAPSHOTS = 64
# What this llama-cpp-python can do with a recurrent state: keep snapshots of it (n_rs_seq), and
# copy it out and back in (checkpoints). Builds before 0.3.36 have neither.
SNAPSHOT_API = hasattr(L, "llama_n_rs_seq")
STATE_API = hasattr(L, "llama_state_seq_get_size_ext") and hasattr(L, "LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY")
MAX_THREADS = 1024  # llama.cpp starts a thread per count: a typo must not ask for 100000


@dataclass(frozen=True)
class ModelOptions:
    n_ctx: int = 4096
    n_threads: int | None = None  # None: one per physical core
    n_gpu_layers: int | None = None  # None: all when GPU offload or RPC servers are available, else 0
    n_batch: int = 512
    rpc: tuple[str, ...] = ()  # llama.cpp rpc-servers ("host:port") that hold the offloaded layers
    snapshots: int = DEFAULT_SNAPSHOTS  # hybrid and recurrent models only (see DEFAULT_SNAPSHOTS)

    def __post_init__(self):
        check_context_size(self.n_ctx)
        object.__setattr__(self, "rpc", parse_rpc_servers(self.rpc))
        if self.n_threads is not None and not 1 <= self.n_threads <= MAX_THREADS:
            raise SpecllmError(f"threads must be between 1 and {MAX_THREADS}, got {self.n_threads}")
        if not 0 <= self.snapshots <= MAX_SNAPSHOTS:
            raise SpecllmError(f"snapshots must be between 0 and {MAX_SNAPSHOTS}, got {self.snapshots}")
        if self.n_gpu_layers is not None and self.n_gpu_layers < 0:
            raise SpecllmError(f"GPU layers must be >= 0, got {self.n_gpu_layers}")


class _Views:
    """numpy views of llama.cpp's float buffers, kept per address and shape. Making one costs
    ~50 us (numpy parses the ctypes type each time), and llama.cpp moves a buffer only when it
    grows, so a step's few calls reuse a handful of views."""

    def __init__(self):
        self._views: dict[tuple[int, tuple[int, ...]], np.ndarray] = {}

    def of(self, pointer, shape: tuple[int, ...]) -> np.ndarray:
        address = ctypes.cast(pointer, ctypes.c_void_p).value
        view = self._views.get((address, shape))
        if view is None:
            if len(self._views) > 256:  # a moved buffer leaves stale views behind
                self._views.clear()
            floats = ctypes.cast(address, ctypes.POINTER(ctypes.c_float))
            view = self._views[(address, shape)] = np.ctypeslib.as_array(floats, shape=shape)
        return view


class Model:
    """One GGUF model with a single-sequence context (or only its vocabulary, `vocab_only`)."""

    def __init__(self, path: str | Path, options: ModelOptions = ModelOptions(), *, vocab_only=False):
        _init_backend()
        self.path = Path(path)
        self.options = options
        self._model = self._ctx = None
        self._weights_of: Model | None = None  # a sibling's: the model whose weights it uses
        check_gguf_header(self.path)
        self._devices = _model_devices(options.rpc)  # kept alive while loading
        self.on_huge_pages = not vocab_only and weights_on_huge_pages(self.path, gpu_layers(options))
        self._model = _load_model(self.path, options, vocab_only, self._devices, self.on_huge_pages)
        _rpc_connected.update(options.rpc)  # llama.cpp now holds a connection to each until close()
        self.on_gpu = gpu_offload_supported() and gpu_layers(options) > 0  # then batched calls cost about one call
        self._vocab = L.llama_model_get_vocab(self._model)
        self.n_vocab = L.llama_vocab_n_tokens(self._vocab)
        # A recurrent state (Mamba, RWKV) or a hybrid's recurrent layers (Qwen3.5, Granite 4, LFM2,
        # ...) sum up every earlier token: it cannot simply be cut back to a position (see _rewind).
        self.hybrid = bool(L.llama_model_is_hybrid(self._model))
        self.recurrent = self.hybrid or bool(L.llama_model_is_recurrent(self._model))
        self.n_nextn = _nextn_layers(self._model)  # MTP layers: the model can draft for itself
        self._hidden: np.ndarray | None = None  # per position, the hidden state its MTP layers read
        self._pieces: dict[int, bytes] = {}
        self.tokens: list[int] = []  # what the KV cache holds, position by position
        if not vocab_only:
            self._open_context()

    def _open_context(self) -> None:
        self._ctx = _new_context(self._model, self.options, self.path, self.recurrent)
        self.n_ctx = L.llama_n_ctx(self._ctx)
        self.n_batch = L.llama_n_batch(self._ctx)  # llama.cpp caps it at n_ctx
        self._batch = L.llama_batch_init(self.n_batch, 0, 1)  # reused by every decode
        for i in range(self.n_batch):
            self._batch.n_seq_id[i] = 1
            self._batch.seq_id[i][0] = 0
        # numpy views of the batch's arrays: one vector write per field instead of a ctypes
        # assignment per token and field
        self._batch_token, self._batch_pos, self._batch_logits = (
            np.ctypeslib.as_array(array, shape=(self.n_batch,))
            for array in (self._batch.token, self._batch.pos, self._batch.logits)
        )
        self._views = _Views()
        # Snapshots llama.cpp really keeps: it turns them off for architectures whose kernels
        # write none (Mamba, RWKV, Jamba, ...).
        self.snapshots = L.llama_n_rs_seq(self._ctx) if self.recurrent and SNAPSHOT_API else 0
        self._rollback_room = 0  # trailing tokens the snapshots can take back right now
        self._checkpoints: dict[str, _Checkpoint] = {}  # by slot: "prompt", "step"
        self.n_evaluated = 0  # tokens llama.cpp has evaluated, all calls together
        self._unsure = False  # a state change was interrupted: the state must be rebuilt

    def sibling(self) -> "Model":
        """The same loaded weights with a KV cache of its own, so that two generations can run
        side by side (bench interleaves its configurations step by step). Close it before this."""
        twin = copy.copy(self)  # shares the weights, the vocabulary and its caches
        twin._weights_of, twin.tokens, twin._ctx = self, [], None  # a failed open frees nothing of ours
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

    def close(self) -> None:
        if getattr(self, "_ctx", None) is not None:
            if getattr(self, "_batch", None) is not None:  # an __init__ interrupted before it: none
                L.llama_batch_free(self._batch)
                self._batch = None
            L.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None) is not None and self._weights_of is None:
            L.llama_model_free(self._model)
            _rpc_connected.subtract(self.options.rpc)
        self._model = None

    def __del__(self):
        self.close()

    # --- vocabulary -------------------------------------------------------------------------

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
    def vocab_type(self) -> int:
        return L.llama_vocab_type(self._vocab)

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

    def piece(self, token: int) -> bytes:
        """The bytes one token stands for (special tokens render as nothing)."""
        cached = self._pieces.get(token)
        if cached is None:
            if not 0 <= token < self.n_vocab:  # llama.cpp would throw through ctypes: terminate
                raise SpecllmError(f"token id {token} is outside {self.path.name}'s vocabulary (0..{self.n_vocab - 1})")
            cached = self._pieces[token] = _token_to_piece(self._vocab, token)
        return cached

    def detokenize(self, tokens: list[int]) -> bytes:
        return b"".join(self.piece(t) for t in tokens)

    def chat_template(self) -> str | None:
        raw = L.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8") if raw else None

    def render_chat(
        self, messages: list[dict], *, add_generation_prompt: bool = True, tools: list[dict] | None = None
    ) -> str:
        """Render messages with the GGUF's chat template (ChatML when it has none) in a sandboxed
        Jinja environment configured like llama-cpp-python's, with bounded loops and output.
        `tools` (OpenAI's function tools) go in the template's `tools` variable, as llama.cpp and
        transformers pass them. Any template error, from compiling it or rendering it, is a
        SpecllmError."""
        try:
            template = _compile_chat_template(self.chat_template() or CHATML_TEMPLATE)
            return _render_bounded(
                template,
                messages=messages,
                eos_token=self.token_text(self.eos).decode("utf-8", errors="replace"),
                bos_token=self.token_text(self.bos).decode("utf-8", errors="replace"),
                add_generation_prompt=add_generation_prompt,
                tools=tools,
            )
        except Exception as e:  # a template can raise anything from inside Jinja
            raise SpecllmError(f"the chat template of {self.path.name} failed: {e}") from None

    def describe(self) -> str:
        buf = ctypes.create_string_buffer(256)
        L.llama_model_desc(self._model, buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    # --- evaluation -------------------------------------------------------------------------

    def eval(self, tokens: list[int], n_logits: int = 1) -> np.ndarray:
        """Append `tokens` after what the KV cache holds and return the logits of the last
        `n_logits` of them, shape (n_logits, n_vocab). The array is a view into llama.cpp's buffer,
        valid until the next call: copy what must outlive it."""
        if len(self.tokens) + len(tokens) > self.n_ctx:
            raise SpecllmError(f"context full: {len(self.tokens) + len(tokens)} tokens > {self.n_ctx}")
        n_logits = min(n_logits, len(tokens))
        if n_logits > self.n_batch:
            raise ValueError(f"at most n_batch={self.n_batch} logit rows per call")
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            n_out = max(0, n_logits - (len(tokens) - start - len(chunk)))  # rows in this chunk
            self._decode(chunk, n_out)
        if n_logits == 0:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        return self._views.of(L.llama_get_logits(self._ctx), (n_logits, self.n_vocab))

    def _decode(self, chunk: list[int], n_out: int) -> None:
        batch, pos0, n = self._batch, len(self.tokens), len(chunk)
        batch.n_tokens = n
        self._batch_token[:n] = chunk
        self._batch_pos[:n] = range(pos0, pos0 + n)
        self._batch_logits[: n - n_out] = 0
        self._batch_logits[n - n_out : n] = 1
        self._unsure = self.recurrent  # until llama.cpp has taken the batch: then sync starts over
        status = L.llama_decode(self._ctx, batch)
        if status != 0:
            raise SpecllmError(f"llama.cpp could not evaluate the batch (llama_decode returned {status})")
        if self._hidden is not None:
            self._keep_rows(pos0, n)
        self.tokens.extend(chunk)
        self.n_evaluated += n
        # llama.cpp's recurrent kernels write a snapshot for each token of this batch but the last
        # (and keeps the last n_rs_seq + 1 tokens in one micro-batch): so a call of n tokens can
        # take back at most n - 1 of them. Taking back more answers True and leaves a wrong state.
        self._rollback_room = min(self.snapshots, n - 1)
        self._unsure = False

    def _keep_rows(self, pos0: int, n: int) -> None:
        from llama_cpp import llama_cpp_ext

        hidden = self._hidden
        if pos0 + n > len(hidden):  # grow by doubling, up to the context
            grown = np.zeros((min(self.n_ctx, max(2 * len(hidden), pos0 + n, 64)), hidden.shape[1]), np.float32)
            grown[: len(hidden)] = hidden
            self._hidden = hidden = grown
        rows = llama_cpp_ext.llama_get_embeddings_nextn(self._ctx)
        hidden[pos0 : pos0 + n] = self._views.of(rows, (n, hidden.shape[1]))

    def truncate(self, n: int) -> None:
        """Cut the KV cache back to its first n tokens. Always asks llama.cpp, even when our
        record says there is nothing to cut, and forgets the tokens first: an interrupt (Ctrl-C)
        landing mid-way then leaves the cache holding extra tokens (removed by the next call),
        never fewer than `tokens` says. A recurrent state is rewound (see _rewind) and the tokens
        between the point it could go back to and n are evaluated again."""
        if not self.recurrent:
            del self.tokens[n:]
            L.llama_memory_seq_rm(L.llama_get_memory(self._ctx), 0, n, -1)  # always True without recurrence
            return
        replay = self.tokens[:n]
        self.eval(replay[self._rewind(n) :], 0)

    def cached_prefix(self, tokens: list[int]) -> int:
        """How many leading `tokens` the KV cache holds already."""
        return common_prefix(self.tokens, tokens)

    def sync(self, tokens: list[int], n_logits: int = 0) -> np.ndarray:
        """Make the KV cache hold exactly `tokens`, reusing the longest common prefix; return the
        logits of the last `n_logits` tokens (re-evaluating them if they were already cached)."""
        keep = min(common_prefix(self.tokens, tokens), len(tokens) - n_logits)
        if self.recurrent:
            keep = self._rewind(keep)
        else:
            self.truncate(keep)
        return self.eval(tokens[keep:], n_logits)

    # --- recurrent state ----------------------------------------------------------------------

    def checkpoint(self, slot: str = "step") -> None:
        """Remember the recurrent state here, so that a later rewind to any position from here
        on restores it and evaluates only the tokens after it again, instead of starting over.
        Only the recurrent part is copied (a hybrid's attention cache is cut back as usual). One
        checkpoint is kept per slot: "prompt" (after a prompt: the next one resumes there) and
        "step" (before a draft or verify call). Nothing to do for attention models."""
        if not self.recurrent or self._unsure or not STATE_API:
            return
        flags = L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        size = L.llama_state_seq_get_size_ext(self._ctx, 0, flags)
        old = self._checkpoints.pop(slot, None)  # until the new one is whole
        data = old.data if old is not None and len(old.data) >= size else (ctypes.c_uint8 * size)()
        written = L.llama_state_seq_get_data_ext(self._ctx, data, size, 0, flags)
        if written:
            self._checkpoints[slot] = _Checkpoint(len(self.tokens), data, written)

    @functools.cached_property
    def state_bytes(self) -> int:
        """Bytes of one copy of this model's recurrent state (0 for attention models): what a
        checkpoint holds and what each snapshot costs. llama.cpp only says once a sequence holds a
        token: before that, it is measured on a small scratch context."""
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
        memory = L.llama_get_memory(self._ctx)
        back = len(self.tokens) - n
        self._unsure = True
        if n > 0 and back <= self._rollback_room and L.llama_memory_seq_rm(memory, 0, n, -1):
            del self.tokens[n:]
            self._rollback_room = 0  # llama.cpp takes one partial removal per decode
        elif cp := self._latest_checkpoint(n):
            flags = L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
            if not L.llama_state_seq_set_data_ext(self._ctx, cp.data, cp.size, 0, flags):
                raise SpecllmError(f"{self.path.name}: llama.cpp could not restore the recurrent state")
            L.llama_memory_seq_rm(memory, 0, cp.n_tokens, -1)  # the attention cache after it
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
        L.llama_memory_clear(L.llama_get_memory(self._ctx), True)
        self.tokens.clear()
        self._checkpoints.clear()
        self._rollback_room, self._unsure = 0, False


class MtpHead:
    """A target's own MTP ("nextn") layers as a draft model, with the interface ModelDrafter uses
    (tokens, n_ctx, n_vocab, sync, eval, truncate, checkpoint, cached_prefix).

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
        self.recurrent, self.snapshots, self.max_draft = False, 0, None
        target.keep_hidden_states()
        self._ctx = _new_context(target._model, target.options, target.path, False, mtp_of=target._ctx)
        llama_cpp_ext.llama_set_embeddings_nextn(self._ctx, True, True)  # the MTP layer's own rows, where asked
        self._batch = L.llama_batch_ext_init(self._ctx)
        self._n_embd = L.llama_model_n_embd_out(target._model)
        self._zeros = np.zeros(self._n_embd, dtype=np.float32)
        self._own = self._zeros  # the MTP layer's hidden state at its last output
        self._views = _Views()
        self.tokens: list[int] = []
        self._exact = 0  # leading entries made with the target's hidden states

    def close(self) -> None:
        if getattr(self, "_ctx", None) is not None:
            L.llama_batch_ext_free(self._batch)
            L.llama_free(self._ctx)
            self._ctx = None

    def __del__(self):
        self.close()

    def cached_prefix(self, tokens: list[int]) -> int:
        return min(common_prefix(self.tokens, tokens), self._exact)

    def checkpoint(self) -> None:
        pass  # attention only: cut back like any KV cache

    def truncate(self, n: int) -> None:
        del self.tokens[n:]
        self._exact = min(self._exact, n)
        L.llama_memory_seq_rm(L.llama_get_memory(self._ctx), 0, n, -1)

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
            status = L.llama_process(self._ctx, L.LLAMA_PROCESS_TYPE_DECODE, batch)
            if status != 0:
                raise SpecllmError(f"llama.cpp could not evaluate the MTP batch (llama_process returned {status})")
        self.tokens.extend(tokens)
        if not outputs:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        from llama_cpp import llama_cpp_ext

        last = llama_cpp_ext.llama_get_embeddings_nextn_ith(self._ctx, outputs[-1])
        self._own = self._views.of(last, (self._n_embd,)).copy()
        rows = [self._views.of(L.llama_get_logits_ith(self._ctx, i), (self.n_vocab,)) for i in outputs]
        return rows[0][np.newaxis] if len(rows) == 1 else np.stack(rows)  # a view, as Model.eval's


# --- chat templates -----------------------------------------------------------------------------

# A template comes from the model file, so it is untrusted: beyond the sandbox (no file or attribute
# access), rendering is bounded so that nested loops cannot grow memory or run without end.
TEMPLATE_RANGE_BUDGET = 1_000_000  # items all range() calls of one rendering may produce together
TEMPLATE_MAX_CHARS = 32 * 2**20  # far more than any context holds (a token is a few characters)


@functools.lru_cache(maxsize=8)
def _compile_chat_template(source: str):
    """The template compiled as llama-cpp-python's Jinja2ChatFormatter does (same sandbox, options,
    extensions and tojson); a syntax error raises here."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter as Formatter

    env = ImmutableSandboxedEnvironment(
        loader=jinja2.BaseLoader(),
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[Formatter.IgnoreGenerationTags, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = Formatter.tojson
    return env.from_string(source)


def _render_bounded(template, tools=None, **variables) -> str:
    """template.render(**variables) with what Jinja2ChatFormatter passes too, but with a range()
    that gives at most TEMPLATE_RANGE_BUDGET items in all, and at most TEMPLATE_MAX_CHARS characters
    of output (counted as they are produced, so a runaway template stops early)."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter as Formatter

    budget = [TEMPLATE_RANGE_BUDGET]

    def bounded_range(*args):
        items = range(*args)
        budget[0] -= len(items)
        if budget[0] < 0:
            raise ValueError(f"its loops ask range() for more than {TEMPLATE_RANGE_BUDGET} items")
        return items

    def raise_exception(message: str):
        raise ValueError(message)

    out = io.StringIO()
    chunks = template.generate(
        **variables, raise_exception=raise_exception, strftime_now=Formatter.strftime_now, range=bounded_range,
        functions=None, function_call=None, tools=tools, tool_choice=None,
    )  # fmt: skip
    for chunk in chunks:
        if out.tell() + len(chunk) > TEMPLATE_MAX_CHARS:
            raise ValueError(f"it renders more than {TEMPLATE_MAX_CHARS} characters")
        out.write(chunk)
    return out.getvalue()


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _nextn_layers(model) -> int:
    """MTP ("nextn") layers a model carries; llama.cpp also counts a router layer there."""
    try:
        return max(0, int(L.llama_model_n_layer_nextn(model)))
    except AttributeError:  # a llama-cpp-python without MTP support
        return 0


def _load_model(path: Path, options: ModelOptions, vocab_only: bool, devices, huge_pages: bool):
    params = L.llama_model_default_params()
    params.n_gpu_layers = gpu_layers(options)
    params.vocab_only = vocab_only
    params.load_mtp = not vocab_only  # the MTP layers of a model that has them (a few % of its weights)
    if devices is not None:
        params.devices = ctypes.cast(devices, ctypes.c_void_p)
    if huge_pages:
        params.load_mode = L.LLAMA_LOAD_MODE_NONE  # read into the process's memory, not mapped
        params.progress_callback = _ADVISE_HUGE_PAGES_ONCE  # called once the buffers exist, before they are filled
    _recent_errors.clear()
    model = _passing_signals_through(
        L.llama_model_load_from_file, L.llama_model_free, str(path).encode("utf-8"), params
    )
    if not model:
        if options.rpc:
            why = _first_error("out of memory on an RPC server?")
            raise SpecllmError(f"cannot load {path} over RPC ({','.join(options.rpc)}): {why}")
        raise SpecllmError(f"cannot load {path}: {_first_error('truncated, corrupt or unsupported')}")
    return model


# --- huge pages for the weights ----------------------------------------------------------------
#
# A one-token step on a CPU streams every weight of the model once. With 4 KiB pages that is one TLB
# miss per 4 KiB (a two-level page walk in a virtual machine); with 2 MiB transparent huge pages it
# is 512 times fewer. Measured on this project's 2-core machine with the default 1.5B target: 26
# tok/s with llama.cpp's default (the file memory-mapped, the repacked part in 4 KiB pages), 31
# tok/s with every weight on huge pages. Linux gives huge pages to a private anonymous mapping
# only when asked (THP "madvise" mode, the common default) and before its pages are touched, so the
# weights are read into the process's memory instead of mapped, and the loader's first progress
# callback, which llama.cpp calls after allocating the weight buffers and before filling them,
# marks every large anonymous mapping MADV_HUGEPAGE. Advice is only advice: where the kernel has
# no huge page to give, the pages are ordinary ones and nothing else changes.
MADV_HUGEPAGE = 14
HUGE_PAGE_REGION_MIN = 32 * 2**20  # smaller mappings are not weight buffers worth advising
HUGE_PAGE_RAM_SHARE = 0.5  # copy the weights only when they take at most this share of free memory


def weights_on_huge_pages(path: Path, n_gpu_layers: int) -> bool:
    """Read a CPU model's weights into huge-page memory rather than memory-map the file? Linux only
    (where transparent huge pages exist and are not switched off), CPU only (offloaded weights live
    in the GPU's memory), and only when the copy fits comfortably in the free memory: a mapped
    file can be larger than RAM, a copy cannot."""
    if sys.platform != "linux" or n_gpu_layers > 0 or _thp_mode() in (None, "never"):
        return False
    available = _available_memory()
    try:
        size = path.stat().st_size
    except OSError:  # loading will say what is wrong with the file
        return False
    return available is not None and size <= HUGE_PAGE_RAM_SHARE * available


def _thp_mode() -> str | None:
    """The bracketed word of /sys/kernel/mm/transparent_hugepage/enabled, None without THP."""
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else None


def _available_memory() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def advise_huge_pages() -> int:
    """Mark every large private anonymous mapping of this process MADV_HUGEPAGE; returns how many
    bytes were advised. Pages touched later are then huge where the kernel can; pages already
    touched keep their content (the advice never changes data)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    advised = 0
    for start, end in _anonymous_mappings(Path("/proc/self/maps").read_text()):
        if end - start >= HUGE_PAGE_REGION_MIN and libc.madvise(start, end - start, MADV_HUGEPAGE) == 0:
            advised += end - start
    return advised


def _anonymous_mappings(maps: str) -> list[tuple[int, int]]:
    """(start, end) of the writable private anonymous mappings in a /proc/PID/maps text."""
    out = []
    for line in maps.splitlines():
        fields = line.split()
        if len(fields) == 5 and fields[1].startswith("rw") and fields[1].endswith("p") and fields[4] == "0":
            start, end = (int(x, 16) for x in fields[0].split("-"))
            out.append((start, end))
    return out


def _passing_signals_through(call, free, *args):
    """call(*args), but a Ctrl-C (or SIGTERM) that lands while one of llama.cpp's callbacks (its
    log, a load's progress) runs Python code is not lost: ctypes cannot pass an exception out of a
    callback (it reports it as unraisable; a progress callback then answers False, which aborts a
    load), so it is caught there and raised again here, after free(result) if there is one, as it
    would be without a callback."""
    signals: list[BaseException] = []
    previous = sys.unraisablehook

    def keep_signals(unraisable):
        if isinstance(unraisable.exc_value, BaseException) and not isinstance(unraisable.exc_value, Exception):
            signals.append(unraisable.exc_value)
        else:
            previous(unraisable)

    sys.unraisablehook = keep_signals
    try:
        result = call(*args)
        if signals and result:
            free(result)  # its log lines may be interrupted too
    finally:
        sys.unraisablehook = previous
    if signals:
        raise signals[0]
    return result


@L.llama_progress_callback
def _ADVISE_HUGE_PAGES_ONCE(progress: float, _user_data) -> bool:
    if progress == 0.0:  # the first call: buffers allocated, nothing read into them yet
        try:
            advise_huge_pages()
        except (OSError, AttributeError, ValueError):
            pass  # no madvise here: ordinary pages
    return True  # go on loading


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
    if SNAPSHOT_API:
        params.n_rs_seq = options.snapshots if recurrent else 0
    params.n_threads = params.n_threads_batch = options.n_threads or physical_cores()
    params.swa_full = True  # sliding-window caches must keep every position to allow rollback
    params.no_perf = True
    _recent_errors.clear()
    ctx = _passing_signals_through(L.llama_init_from_model, L.llama_free, model, params)
    if not ctx:
        why = _first_error("out of memory?")
        raise SpecllmError(f"cannot create a context for {path.name} (n_ctx={options.n_ctx}): {why}")
    return ctx


def _first_error(default: str) -> str:
    """llama.cpp's first error line, which says why, without its function-name prefix."""
    if not _recent_errors:
        return default
    return _recent_errors[0].split(": ", 1)[-1]


def _token_to_piece(vocab, token: int) -> bytes:
    buf = ctypes.create_string_buffer(64)
    n = L.llama_token_to_piece(vocab, token, buf, len(buf), 0, False)
    if n < 0:
        buf = ctypes.create_string_buffer(-n)
        n = L.llama_token_to_piece(vocab, token, buf, len(buf), 0, False)
    return buf.raw[:n]


# --- pair compatibility -------------------------------------------------------------------------

VOCAB_MAX_SIZE_DIFFERENCE = 128  # as llama.cpp's speculative example
VOCAB_CHECK_START_ID = 5


def check_compatible(target: Model, draft: Model) -> None:
    """Refuse a draft whose vocabulary differs from the target's, the way llama.cpp does."""
    names = f"{draft.path.name} cannot draft for {target.path.name}"
    if target.vocab_type != draft.vocab_type:
        raise SpecllmError(f"{names}: vocabulary types differ ({target.vocab_type} vs {draft.vocab_type})")
    if (target.add_bos, target.bos) != (draft.add_bos, draft.bos) or (target.add_eos, target.eos) != (
        draft.add_eos,
        draft.eos,
    ):
        raise SpecllmError(f"{names}: BOS/EOS tokens differ")
    if abs(target.n_vocab - draft.n_vocab) > VOCAB_MAX_SIZE_DIFFERENCE:
        raise SpecllmError(
            f"{names}: vocabulary sizes differ by more than {VOCAB_MAX_SIZE_DIFFERENCE} "
            f"({target.n_vocab} vs {draft.n_vocab})"
        )
    for token in range(VOCAB_CHECK_START_ID, min(target.n_vocab, draft.n_vocab)):
        a, b = target.token_text(token), draft.token_text(token)
        if a != b:
            raise SpecllmError(
                f"{names}: token {token} differs ({a.decode(errors='replace')!r} vs {b.decode(errors='replace')!r})"
            )


def check_pair(target_path: str | Path, draft_path: str | Path) -> None:
    """Check two GGUF files for compatibility by loading only their vocabularies."""
    target = Model(target_path, vocab_only=True)
    draft = Model(draft_path, vocab_only=True)
    try:
        check_compatible(target, draft)
    finally:
        target.close()
        draft.close()


# --- system -------------------------------------------------------------------------------------


def system_info() -> dict:
    """Which llama.cpp build and devices are in use (for `specllm doctor` and `-v`)."""
    _init_backend()
    return {
        "llama_cpp_python": L.__version__,
        "gpu_offload": gpu_offload_supported(),
        "rpc": "supported" if rpc_supported() else f"not supported ({NO_RPC_HINT})",
        "devices": _device_names(),
        "physical_cores": physical_cores(),
        "transparent_huge_pages": _thp_mode() or "unavailable",  # "never": CPU weights stay memory-mapped
        "recurrent_models": _recurrent_support(),
        "mtp_drafting": "supported" if _mtp_supported() else "not supported by this llama-cpp-python",
        "llama_cpp": llama_cpp_build(),
        "system_info": L.llama_print_system_info().decode("utf-8", errors="replace").strip(),
    }


def _recurrent_support() -> str:
    """How rejected draft tokens leave a hybrid or recurrent model's state with this build."""
    if SNAPSHOT_API and STATE_API:
        return (
            f"snapshots (--snapshots, default {DEFAULT_SNAPSHOTS}: each one more copy of a hybrid model's "
            "recurrent state, whose size run -v shows) and checkpoints"
        )
    return (
        "checkpoints only" if STATE_API else "target-only (this llama-cpp-python can neither keep nor copy their state)"
    )


def _mtp_supported() -> bool:
    try:
        from llama_cpp import llama_cpp_ext

        return hasattr(L, "llama_batch_ext_init") and hasattr(llama_cpp_ext, "llama_get_embeddings_nextn")
    except ImportError:
        return False


def llama_cpp_build() -> str:
    """The llama.cpp inside llama-cpp-python: its version, and its ggml's version and commit, as
    the libraries report them (builds that lack one of these functions leave it out)."""
    llama = L.llama_version().decode() if hasattr(L, "llama_version") else "version unknown"
    try:
        from llama_cpp import _ggml

        ggml = {}
        for name in ("ggml_version", "ggml_commit"):
            fn = getattr(_ggml.libggml, name)
            fn.argtypes, fn.restype = [], ctypes.c_char_p
            ggml[name] = fn().decode("utf-8", errors="replace")
    except (ImportError, AttributeError, OSError):
        return llama
    return f"{llama}, ggml {ggml['ggml_version']} (commit {ggml['ggml_commit']})"


# --- ggml's device registry, through ctypes on llama_cpp's own ggml library ----------------------

_DEV_GPU, _DEV_IGPU = 1, 2  # enum ggml_backend_dev_type


def _ggml(lib=None):
    """llama_cpp's loaded ggml library (or `lib`), its registry functions typed for ctypes."""
    return _llama_cpp_ggml() if lib is None else _typed(lib)


@functools.cache
def _llama_cpp_ggml():
    """llama_cpp's own ggml library, typed once (an error is not cached: it is raised each time)."""
    from llama_cpp import _ggml as ggml_module

    return _typed(ggml_module.libggml)


def _typed(lib):
    p, s = ctypes.c_void_p, ctypes.c_size_t
    for name, args, result in (
        ("ggml_backend_dev_count", [], s),
        ("ggml_backend_dev_get", [s], p),
        ("ggml_backend_dev_name", [p], ctypes.c_char_p),
        ("ggml_backend_dev_description", [p], ctypes.c_char_p),
        ("ggml_backend_dev_type", [p], ctypes.c_int),
        ("ggml_backend_dev_backend_reg", [p], p),
        ("ggml_backend_dev_memory", [p, ctypes.POINTER(s), ctypes.POINTER(s)], None),
        ("ggml_backend_reg_name", [p], ctypes.c_char_p),
        ("ggml_backend_reg_by_name", [ctypes.c_char_p], p),
        ("ggml_backend_reg_get_proc_address", [p, ctypes.c_char_p], p),
        ("ggml_backend_reg_dev_count", [p], s),
        ("ggml_backend_reg_dev_get", [p, s], p),
        ("ggml_backend_register", [p], None),
    ):
        fn = getattr(lib, name)  # AttributeError: not a ggml library with a device registry
        fn.argtypes, fn.restype = args, result
    return lib


def _all_devices() -> list[int]:
    lib = _ggml()
    return [lib.ggml_backend_dev_get(i) for i in range(lib.ggml_backend_dev_count())]


def _device_names() -> list[str]:
    try:
        return [f"{_dev_name(d)} ({_dev_description(d)})" for d in _all_devices()]
    except (ImportError, AttributeError, OSError):  # a llama-cpp-python without ggml's registry API
        return []


def _dev_name(dev) -> str:
    return _ggml().ggml_backend_dev_name(dev).decode()


def _dev_description(dev) -> str:
    return _ggml().ggml_backend_dev_description(dev).decode()


def _local_gpus() -> list[int]:
    """The GPUs llama.cpp would offload to by default, RPC servers left out (integrated GPUs only
    when there is no discrete one, as llama_model_load does)."""
    lib = _ggml()
    local = [d for d in _all_devices() if lib.ggml_backend_reg_name(lib.ggml_backend_dev_backend_reg(d)) != b"RPC"]
    gpus = [d for d in local if lib.ggml_backend_dev_type(d) == _DEV_GPU]
    return gpus or [d for d in local if lib.ggml_backend_dev_type(d) == _DEV_IGPU]


# --- llama.cpp's RPC backend ---------------------------------------------------------------------
# A model's offloaded layers can live on llama.cpp `ggml-rpc-server`s on other machines. The servers
# are registered in llama.cpp's backend registry exactly as its `--rpc` option does (common/arg.cpp:
# the RPC registry's ggml_backend_rpc_add_server, then ggml_backend_register), and each model is
# given its device list explicitly: a model with servers gets theirs and the local GPUs, any other
# model only the local GPUs (registered servers would otherwise take every model's layers).

NO_RPC_HINT = (  # --no-cache-dir: pip would reuse a cached build of the same version without RPC
    'this llama-cpp-python build has no RPC backend: reinstall it with CMAKE_ARGS="-DGGML_RPC=on" pip install '
    f"--no-cache-dir --force-reinstall --no-deps llama-cpp-python=={L.__version__} (or run scripts/setup.sh)"
)
RPC_TIMEOUT = 5.0  # seconds for a server to accept a connection and answer its greeting
# ggml-rpc.h of the vendored llama.cpp: RPC_CMD_HELLO, its request (24 bytes of transport
# capabilities, none offered) and its answer (major, minor, patch, padding, 24 bytes). llama.cpp
# aborts the whole process on a server that does not answer or speaks another major version, and
# waits forever on one that accepts but never answers (a server serves one client at a time).
RPC_CMD_HELLO = 14
RPC_CAPS_SIZE = 24
RPC_PROTO_MAJOR = 7

_rpc_servers: dict[str, list[int]] = {}  # "host:port" -> its devices, registered once per process
# Servers -> this process's loaded models on them. While one is loaded, llama.cpp keeps a connection
# open and the server (one client at a time) would not answer a greeting on another.
_rpc_connected: collections.Counter = collections.Counter()


def rpc_supported() -> bool:
    try:
        rpc_add_server_function()
        return True
    except SpecllmError:
        return False


def rpc_add_server_function(lib=None):
    """llama.cpp's ggml_backend_rpc_add_server, found as common/arg.cpp finds it: through the
    "RPC" entry of the ggml library's backend registry. A SpecllmError saying how to get an RPC
    build when the library (llama_cpp's own, or `lib`) has none."""
    _init_backend()
    try:
        lib = _ggml(lib)
    except AttributeError:
        raise SpecllmError(NO_RPC_HINT) from None
    registry = lib.ggml_backend_reg_by_name(b"RPC")
    address = registry and lib.ggml_backend_reg_get_proc_address(registry, b"ggml_backend_rpc_add_server")
    if not address:
        raise SpecllmError(NO_RPC_HINT)
    return ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(address)


def probe_rpc_server(server: str, timeout: float = RPC_TIMEOUT) -> tuple[int, int, int]:
    """Connect to an rpc-server and exchange llama.cpp's greeting, within `timeout` seconds: its
    protocol version, or a SpecllmError saying why it cannot be used."""
    host, port = server.rsplit(":", 1)
    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout)
    except OSError as e:
        why = "timed out" if isinstance(e, socket.timeout) else e.strerror or str(e) or type(e).__name__
        raise SpecllmError(f"RPC server {server} does not answer ({why}): is ggml-rpc-server running there?") from None
    with sock:
        try:
            sock.sendall(struct.pack("<BQ", RPC_CMD_HELLO, RPC_CAPS_SIZE) + bytes(RPC_CAPS_SIZE))
            answer = _recv_exactly(sock, 8 + 4 + RPC_CAPS_SIZE)
        except TimeoutError:
            raise SpecllmError(
                f"RPC server {server} did not answer within {timeout:g} s (an rpc-server serves one client "
                "at a time: is another program using it?)"
            ) from None
        except OSError:
            answer = b""
    size, major, minor, patch = struct.unpack("<QBBB", answer[:11]) if len(answer) >= 11 else (0, 0, 0, 0)
    if size != 4 + RPC_CAPS_SIZE:
        raise SpecllmError(
            f"RPC server {server} does not answer as a llama.cpp ggml-rpc-server of protocol {RPC_PROTO_MAJOR}.x"
        )
    if major != RPC_PROTO_MAJOR:
        raise SpecllmError(
            f"RPC server {server} speaks RPC protocol {major}.{minor}.{patch}, this llama.cpp "
            f"{RPC_PROTO_MAJOR}.x: build ggml-rpc-server from the installed llama-cpp-python's llama.cpp"
        )
    return major, minor, patch


def _recv_exactly(sock, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("connection closed")
        data += chunk
    return data


def add_rpc_servers(servers: tuple[str, ...]) -> list[int]:
    """Register each server's devices in llama.cpp's registry (once per process); their devices."""
    add_server = rpc_add_server_function()
    devices = []
    for server in servers:
        if not _rpc_connected[server]:  # checked before every load: a server can die between two
            probe_rpc_server(server)
        if server not in _rpc_servers:
            registry = add_server(server.encode())
            if not registry:
                raise SpecllmError(f"RPC server {server} offers no devices")
            lib = _ggml()
            lib.ggml_backend_register(registry)
            _rpc_servers[server] = [
                lib.ggml_backend_reg_dev_get(registry, i) for i in range(lib.ggml_backend_reg_dev_count(registry))
            ]
        devices += _rpc_servers[server]
    return devices


def rpc_server_memory(server: str) -> list[tuple[str, int, int]]:
    """Each device a server offers: its name, free and total bytes (registering the server)."""
    lib, free, total = _ggml(), ctypes.c_size_t(), ctypes.c_size_t()
    result = []
    for dev in add_rpc_servers((server,)):
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        result.append((_dev_name(dev), free.value, total.value))
    return result


def _model_devices(servers: tuple[str, ...]):
    """The NULL-terminated device list for a model's params, or None (llama.cpp's own choice)
    while no RPC server is registered in this process."""
    if not servers and not _rpc_servers:
        return None
    devices = add_rpc_servers(servers) + _local_gpus()
    return (ctypes.c_void_p * (len(devices) + 1))(*devices, None)
