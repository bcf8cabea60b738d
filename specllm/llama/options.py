"""The options a model is loaded with, checked: no llama_cpp import here, so that `--help` and
the CLI's defaults stay quick."""

import contextlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from specllm.errors import SpecllmError, whole_number

ALL_LAYERS = 0x7FFFFFFF  # n_gpu_layers for every layer (more than any model has)


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


def parse_rpc_servers(servers: str | Sequence[str]) -> tuple[str, ...]:
    """ "host:port,host:port" (or a list of such) -> ("host:port", ...), checked; one clear line
    for anything else."""
    if isinstance(servers, str):
        servers = servers.split(",")
    servers = servers or ()
    if isinstance(servers, (bytes, bytearray)) or not isinstance(servers, Iterable):  # bytes: one "address" per byte
        raise SpecllmError(f"RPC servers are given as 'HOST:PORT,...' or a list of them, not {type(servers).__name__}")
    parsed = []
    for server in servers:
        host, sep, port = str(server).strip().rpartition(":")
        ok = sep and host and ":" not in host and not any(c.isspace() for c in host)
        if not (ok and port.isascii() and port.isdigit() and 0 < int(port) < 65536):
            address = str(server).strip()
            ipv6 = "" if not _is_ipv6(address, host) else ": llama.cpp's RPC backend does not connect over IPv6"
            raise SpecllmError(
                f"malformed RPC server address {address!r}: expected HOST:PORT (e.g. 192.168.1.20:50052){ipv6}"
            )
        parsed.append(f"{host}:{int(port)}")
    return tuple(dict.fromkeys(parsed))


def _is_ipv6(address: str, host: str) -> bool:
    """An IPv6 address, with a port or not, in brackets or not: refused with the reason, since
    llama.cpp splits HOST:PORT at the first colon and resolves the host to IPv4 only."""
    import ipaddress

    for candidate in (host, address):
        with contextlib.suppress(ValueError):
            ipaddress.IPv6Address(candidate.removeprefix("[").removesuffix("]"))
            return True
    return False


# Recurrent-state snapshots a hybrid or recurrent model keeps per sequence, so that the last few
# tokens of a verify call can be rejected (llama.cpp's n_rs_seq): each costs one more copy of the
# recurrent state, and the longest draft such a model may verify is this long.
DEFAULT_SNAPSHOTS = 8
MAX_SNAPSHOTS = 64
MAX_THREADS = 1024  # llama.cpp starts a thread per count: a typo must not ask for 100000


@dataclass(frozen=True)
class ModelOptions:
    n_ctx: int = 4096
    n_threads: int | None = None  # None: one per physical core
    n_gpu_layers: int | None = None  # None: all when GPU offload or RPC servers are available, else 0
    n_batch: int = 512
    # llama.cpp rpc-servers that hold the offloaded layers: given as "host:port,..." or a sequence of
    # "host:port", kept parsed as a tuple of "host:port" (see __post_init__)
    rpc: str | Sequence[str] = ()
    snapshots: int = DEFAULT_SNAPSHOTS  # hybrid and recurrent models only (see DEFAULT_SNAPSHOTS)
    embeddings: bool = False  # a context that pools each text into one embedding (Model.embed), no logits

    def __post_init__(self):
        for name, what in (("n_ctx", "context size"), ("n_batch", "batch size"), ("snapshots", "snapshots")):
            object.__setattr__(self, name, whole_number(what, getattr(self, name)))
        for name, what in (("n_threads", "threads"), ("n_gpu_layers", "GPU layers")):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, whole_number(what, getattr(self, name)))
        check_context_size(self.n_ctx)
        object.__setattr__(self, "rpc", parse_rpc_servers(self.rpc))
        if self.n_threads is not None and not 1 <= self.n_threads <= MAX_THREADS:
            raise SpecllmError(f"threads must be between 1 and {MAX_THREADS}, got {self.n_threads}")
        if not 0 <= self.snapshots <= MAX_SNAPSHOTS:
            raise SpecllmError(f"snapshots must be between 0 and {MAX_SNAPSHOTS}, got {self.snapshots}")
        if self.n_gpu_layers is not None and self.n_gpu_layers < 0:
            raise SpecllmError(f"GPU layers must be >= 0, got {self.n_gpu_layers}")
