"""llama.cpp's RPC backend: a model's offloaded layers on `ggml-rpc-server`s on other machines.

The servers are registered in llama.cpp's backend registry exactly as its `--rpc` option does
(common/arg.cpp: the RPC registry's ggml_backend_rpc_add_server, then ggml_backend_register), and
each model is given its device list explicitly: a model with servers gets theirs and the local
GPUs, any other model only the local GPUs (registered servers would otherwise take every model's
layers).
"""

import collections
import ctypes
import socket
import struct
from collections.abc import Sequence

import llama_cpp as L

from specllm.errors import SpecllmError
from specllm.llama.devices import dev_name, ggml_lib, local_gpus
from specllm.llama.log import init_backend

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
_first_names: dict[tuple[str, int], str] = {}  # (IP, port) -> the "host:port" first used for it
# Servers -> this process's loaded models on them. While one is loaded, llama.cpp keeps a connection
# open and the server (one client at a time) would not answer a greeting on another.
rpc_connected: collections.Counter = collections.Counter()


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
    init_backend()
    try:
        lib = ggml_lib(lib)
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
            _reset(sock)
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


def _reset(sock) -> None:
    """Make closing `sock` a reset instead of a goodbye. A busy server reads our greeting once it
    is free and, on a connection closed the usual way, would die of SIGPIPE writing its answer
    (ggml-rpc-server does not ignore it); on a reset one its write fails and it goes on serving."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def _recv_exactly(sock, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("connection closed")
        data += chunk
    return data


def _first_name(server: str) -> str:
    """The name this process first gave the server at this address. llama.cpp opens a connection
    per name, and a server (one client at a time) never answers our second one: 127.0.0.1:50052
    and localhost:50052 in one list would wait forever, and across two models time out."""
    host, port = server.rsplit(":", 1)
    try:
        address = (socket.gethostbyname(host), int(port))  # resolved as llama.cpp does (IPv4)
    except OSError:
        return server  # the greeting says why
    return _first_names.setdefault(address, server)


def add_rpc_servers(servers: Sequence[str]) -> list[int]:
    """Register each server's devices in llama.cpp's registry (once per process); their devices."""
    add_server = rpc_add_server_function()
    devices = []
    for server in dict.fromkeys(map(_first_name, servers)):
        if not rpc_connected[server]:  # checked before every load: a server can die between two
            probe_rpc_server(server)
        if server not in _rpc_servers:
            registry = add_server(server.encode())
            if not registry:
                raise SpecllmError(f"RPC server {server} offers no devices")
            lib = ggml_lib()
            lib.ggml_backend_register(registry)
            _rpc_servers[server] = [
                lib.ggml_backend_reg_dev_get(registry, i) for i in range(lib.ggml_backend_reg_dev_count(registry))
            ]
        devices += _rpc_servers[server]
    return devices


def rpc_server_memory(server: str) -> list[tuple[str, int, int]]:
    """Each device a server offers: its name, free and total bytes (registering the server)."""
    lib, free, total = ggml_lib(), ctypes.c_size_t(), ctypes.c_size_t()
    result = []
    for dev in add_rpc_servers((server,)):
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        result.append((dev_name(dev), free.value, total.value))
    return result


def model_devices(servers: Sequence[str]):
    """The NULL-terminated device list for a model's params, or None (llama.cpp's own choice)
    while no RPC server is registered in this process."""
    if not servers and not _rpc_servers:
        return None
    devices = add_rpc_servers(servers) + local_gpus()
    return (ctypes.c_void_p * (len(devices) + 1))(*devices, None)
