"""The cores and devices llama.cpp runs on: physical cores, ggml's device registry (through
ctypes on llama_cpp's own ggml library) and how many layers a model offloads."""

import ctypes
import functools
import os
from pathlib import Path

import llama_cpp as L

from specllm.llama.log import init_backend
from specllm.llama.options import ALL_LAYERS, ModelOptions


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


@functools.cache
def amx_built_in() -> bool:
    """Whether llama.cpp's CPU backend was compiled with AMX kernels: a build made with
    -march=native on an Intel Xeon that has AMX (Sapphire Rapids, 2023, and later). At load they
    repack the quantized weights they support, and then their matrix products crash the process
    (SIGILL or SIGSEGV inside ggml_backend_amx_mul_mat) on the first call of more than one token on
    some of these machines, virtual ones among them: so these kernels go unused (_load_model)."""
    init_backend()
    return "AMX_INT8 = 1" in L.llama_print_system_info().decode("utf-8", errors="replace")


def gpu_offload_supported() -> bool:
    """Whether this machine has a GPU llama.cpp can offload to. Not llama_supports_gpu_offload()
    alone: that is true in every build with the RPC backend, GPU or not."""
    if not L.llama_supports_gpu_offload():
        return False
    try:
        return bool(local_gpus())
    except (ImportError, AttributeError, OSError):  # a llama-cpp-python without ggml's registry API
        return True


def default_gpu_layers() -> int:
    """Offload every layer when this llama-cpp-python build can, none otherwise."""
    return ALL_LAYERS if gpu_offload_supported() else 0


def gpu_layers(options: ModelOptions) -> int:
    """The layers a model offloads: as asked, else all of them when it has RPC servers or a
    local GPU to put them on, else none."""
    if options.n_gpu_layers is not None:
        return options.n_gpu_layers
    return ALL_LAYERS if options.rpc else default_gpu_layers()


# --- ggml's device registry, through ctypes on llama_cpp's own ggml library ----------------------

_DEV_GPU, _DEV_IGPU = 1, 2  # enum ggml_backend_dev_type


def ggml_lib(lib=None):
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
    lib = ggml_lib()
    return [lib.ggml_backend_dev_get(i) for i in range(lib.ggml_backend_dev_count())]


def device_names() -> list[str]:
    try:
        return [f"{dev_name(d)} ({_dev_description(d)})" for d in _all_devices()]
    except (ImportError, AttributeError, OSError):  # a llama-cpp-python without ggml's registry API
        return []


def dev_name(dev) -> str:
    return ggml_lib().ggml_backend_dev_name(dev).decode()


def _dev_description(dev) -> str:
    return ggml_lib().ggml_backend_dev_description(dev).decode()


def replays_cuda_graphs() -> bool:
    """Does llama.cpp capture and replay CUDA graphs here: a local CUDA GPU, and graphs not turned
    off (GGML_CUDA_DISABLE_GRAPHS)? Such a build replays a call's graph only after calls of the same
    shape in a row, so a context that switches shapes runs its kernels one by one (benchmarks/
    gpu_check.py times this: "call sequences")."""
    if os.environ.get("GGML_CUDA_DISABLE_GRAPHS") is not None:
        return False
    try:
        lib = ggml_lib()
        return any(lib.ggml_backend_reg_name(lib.ggml_backend_dev_backend_reg(d)) == b"CUDA" for d in local_gpus())
    except (ImportError, AttributeError, OSError):  # a llama-cpp-python without ggml's registry API
        return False


def local_gpus() -> list[int]:
    """The GPUs llama.cpp would offload to by default, RPC servers left out (integrated GPUs only
    when there is no discrete one, as llama_model_load does)."""
    lib = ggml_lib()
    local = [d for d in _all_devices() if lib.ggml_backend_reg_name(lib.ggml_backend_dev_backend_reg(d)) != b"RPC"]
    gpus = [d for d in local if lib.ggml_backend_dev_type(d) == _DEV_GPU]
    return gpus or [d for d in local if lib.ggml_backend_dev_type(d) == _DEV_IGPU]
