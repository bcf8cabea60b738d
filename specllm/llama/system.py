"""What runs here, for `specllm doctor`, `-v` and the caches' keys: the llama.cpp build, its
version and what it supports."""

import ctypes
from pathlib import Path

import llama_cpp as L

from specllm.llama import huge_pages, model
from specllm.llama.devices import amx_built_in, device_names, gpu_offload_supported, physical_cores
from specllm.llama.log import init_backend
from specllm.llama.options import DEFAULT_SNAPSHOTS
from specllm.llama.rpc import NO_RPC_HINT, rpc_supported


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


def system_info() -> dict:
    """Which llama.cpp build and devices are in use (for `specllm doctor` and `-v`)."""
    init_backend()
    return {
        "llama_cpp_python": L.__version__,
        "gpu_offload": gpu_offload_supported(),
        "rpc": "supported" if rpc_supported() else f"not supported ({NO_RPC_HINT})",
        "devices": device_names(),
        "physical_cores": physical_cores(),
        "transparent_huge_pages": huge_pages.thp_mode() or "unavailable",  # "never": CPU weights stay memory-mapped
        "cpu_weight_layouts": _cpu_weight_layouts(),
        "recurrent_models": _recurrent_support(),
        "mtp_drafting": "supported" if _mtp_supported() else "not supported by this llama-cpp-python",
        "llama_cpp": llama_cpp_build(),
        "system_info": L.llama_print_system_info().decode("utf-8", errors="replace").strip(),
    }


def _cpu_weight_layouts() -> str:
    """Whether llama.cpp may repack CPU weights for its faster kernels (see amx_built_in)."""
    if amx_built_in():
        return (
            "plain (this build has llama.cpp's AMX kernels, which crash on some machines: specllm does not "
            "use them, nor the repacked layouts that go with them; scripts/setup.sh builds without AMX)"
        )
    return "repacked where llama.cpp's kernels gain from it"


def _recurrent_support() -> str:
    """How rejected draft tokens leave a hybrid or recurrent model's state with this build."""
    if model.SNAPSHOT_API and model.STATE_API:
        return (
            f"snapshots (--snapshots, default {DEFAULT_SNAPSHOTS}: each one more copy of a hybrid model's "
            "recurrent state, whose size run -v shows) and checkpoints"
        )
    return (
        "checkpoints only"
        if model.STATE_API
        else "target-only (this llama-cpp-python can neither keep nor copy their state)"
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
