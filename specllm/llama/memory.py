"""Whether a context fits in memory, checked before llama.cpp is asked for it: pure arithmetic on a
GGUF's metadata, no llama_cpp import.

llama.cpp refuses a KV cache larger than the system will give (a failed allocation), but one the
system grants and cannot back (Linux overcommits: anything up to RAM plus swap is granted) it
fills with zeros at once, and the kernel kills the process as it does: no message, exit 137. So
a context whose KV cache and attention mask need more than the memory available is refused here
with what it needs and what fits. The estimate counts the memory that grows with the context; what
does not (the weights, the fixed part of the compute buffers) is there at any size.
"""

import os
import sys
from collections.abc import Callable
from pathlib import Path

from specllm.errors import ContextTooLarge
from specllm.files import human_size
from specllm.llama.options import CTX_STEP, MAX_CTX

# Set to 1 to skip the check: with swap, or unified memory the check cannot see, a user may know
# that a larger context fits.
SKIP_VARIABLE = "SPECLLM_NO_MEMORY_CHECK"
KV_TYPE_BYTES = 2  # llama.cpp's KV cache is F16 unless asked otherwise (specllm never asks)
MASK_TYPE_BYTES = 2  # the attention mask: F16, n_ctx x n_ubatch, in the compute buffer
# Architectures llama.cpp gives no KV cache (llama_model::create_memory): encoders that read a text
# whole (BERTs, EmbeddingGemma) and diffusion models; their attention mask is one micro-batch square.
NO_KV_CACHE = frozenset({
    "bert", "modern-bert", "nomic-bert", "nomic-bert-moe", "neo-bert", "jina-bert-v2", "jina-bert-v3", "eurobert",
    "gemma-embedding", "wavtokenizer-dec", "dream", "llada", "llada-moe", "rnd1",
})  # fmt: skip


def kv_widths(meta: Callable[[str], str | None], recurrent: bool) -> tuple[int, ...] | None:
    """Per layer, the K and V values one token adds to the KV cache (0 for a layer without
    attention), read from the GGUF's metadata as llama.cpp reads it; None where the metadata does
    not say enough to tell, or the model has no attention (Mamba, RWKV: nothing grows with the
    context).

    `meta(key)` is a metadata value as text (an array as "[a, b, ...]"), None where absent.
    `recurrent`: a hybrid model, whose recurrent layers keep no KV cache: it names its attention
    layers by a per-layer head_count_kv that is 0 elsewhere (Granite 4, LFM2, Nemotron-H, Jamba)
    or by full_attention_interval (Qwen3.5: every n-th layer). Multi-head latent attention
    (DeepSeek, Kimi, GLM 4.7 Flash: key_length_mla in the metadata) keeps K alone, V being a view
    of it. Where llama.cpp keeps less than this (layers sharing a cache), the estimate is high."""
    arch = meta("general.architecture")
    n_layer = _ints(meta(f"{arch}.block_count"), 1)
    n_embd = _ints(meta(f"{arch}.embedding_length"), 1)
    if not arch or len(n_layer) != 1 or len(n_embd) != 1:
        return None
    n_head = _ints(meta(f"{arch}.attention.head_count"), n_layer[0])
    n_head_kv = _ints(meta(f"{arch}.attention.head_count_kv"), n_layer[0]) or n_head
    if len(n_head_kv) != n_layer[0] or not max(n_head, default=0):
        return None  # a model without attention (Mamba, RWKV), or metadata llama.cpp reads otherwise
    key_length = _ints(meta(f"{arch}.attention.key_length"), 1) or [n_embd[0] // max(n_head)]
    value_length = _ints(meta(f"{arch}.attention.value_length"), 1) or key_length
    per_head = key_length[0] if meta(f"{arch}.attention.key_length_mla") else key_length[0] + value_length[0]
    interval = max(_ints(meta(f"{arch}.full_attention_interval"), 1), default=0)
    return tuple(
        heads * per_head if not (recurrent and interval and (il + 1) % interval) else 0
        for il, heads in enumerate(n_head_kv)
    )


def _ints(text: str | None, n_layer: int) -> list[int]:
    """A metadata value as one int per layer ("8" for each of n_layer layers, or "[0, 8, ...]");
    [] where absent or not whole numbers."""
    if text is None:
        return []
    items = text.strip().removeprefix("[").removesuffix("]").split(",")
    try:
        values = [int(item) for item in items]
    except ValueError:
        return []
    if any(v < 0 for v in values):
        return []
    return values * n_layer if len(values) == 1 and not text.lstrip().startswith("[") else values


def context_bytes(widths: tuple[int, ...], n_ctx: int, n_batch: int, layers_on_cpu: int, kv_cache: bool = True) -> int:
    """The memory a context of n_ctx tokens takes that grows with n_ctx: the KV cache of the
    layers on the CPU, and the attention mask (n_ctx x n_ubatch; llama.cpp caps the batch at n_ctx)
    where any attention layer is. Without a KV cache (`kv_cache` False: NO_KV_CACHE), the mask
    alone, over the micro-batch's tokens only (n_ubatch x n_ubatch)."""
    on_cpu = widths[:layers_on_cpu]
    n_ubatch = min(n_batch, n_ctx)
    kv = sum(on_cpu) * n_ctx * KV_TYPE_BYTES if kv_cache else 0
    mask = (n_ctx if kv_cache else n_ubatch) * n_ubatch * MASK_TYPE_BYTES if any(on_cpu) else 0
    return kv + mask


def largest_context(
    widths: tuple[int, ...], n_batch: int, layers_on_cpu: int, available: int, kv_cache: bool = True
) -> int:
    """The largest context size llama.cpp takes (a multiple of CTX_STEP) whose memory fits in
    `available` bytes; 0 where not even the smallest does."""
    low, high = 0, MAX_CTX // CTX_STEP  # in steps: low fits (0 always), high is the most asked
    while low < high:
        mid = (low + high + 1) // 2
        if context_bytes(widths, mid * CTX_STEP, n_batch, layers_on_cpu, kv_cache) <= available:
            low = mid
        else:
            high = mid - 1
    return low * CTX_STEP


def check_context_fits(
    name: str, widths: tuple[int, ...] | None, n_ctx: int, n_batch: int, layers_on_cpu: int, kv_cache: bool = True
) -> None:
    """Refuse (ContextTooLarge) a context of n_ctx tokens for the model `name` whose memory
    exceeds what the system has available now, unless SKIP_VARIABLE is set or nothing is known."""
    if widths is None or os.environ.get(SKIP_VARIABLE, "") not in ("", "0"):
        return
    needed = context_bytes(widths, n_ctx, n_batch, layers_on_cpu, kv_cache)
    available = available_memory()
    if available is None or needed <= available:
        return
    fits = largest_context(widths, n_batch, layers_on_cpu, available, kv_cache)
    kv = context_bytes(widths, n_ctx, 0, layers_on_cpu, kv_cache)
    enough = f"enough for {fits} tokens" if fits else "not enough for the smallest context"
    raise ContextTooLarge(
        f"a context of {n_ctx} tokens for {name} needs about {human_size(needed)} of memory "
        f"(KV cache {human_size(kv)}, attention mask {human_size(needed - kv)}), and "
        f"{human_size(available)} is available, {enough} ({SKIP_VARIABLE}=1 skips this check)",
        n_ctx=n_ctx,
        fits=fits,
    )


def available_memory() -> int | None:
    """Bytes the system can give this process now without swapping: on Linux, the least of
    MemAvailable and the room left under its cgroup's memory limit (a container's, which
    MemAvailable does not see: past it the kernel kills the process as surely); where there is no
    MemAvailable (macOS, which compresses and swaps rather than kill), the physical memory; None
    where unknown."""
    if sys.platform == "linux":
        known = [room for room in (_mem_available(), _cgroup_room()) if room is not None]
        return min(known, default=None)
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return pages * page_size if pages > 0 and page_size > 0 else None


# Where Linux says what memory there is (module constants, so that tests can point them elsewhere).
MEMINFO = Path("/proc/meminfo")
PROC_CGROUP = Path("/proc/self/cgroup")
CGROUP_ROOT = Path("/sys/fs/cgroup")
NO_LIMIT = 2**62  # cgroup v1 writes "no limit" as the largest page-aligned int64


def _mem_available() -> int | None:
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None  # a kernel before 3.14 has none


def _cgroup_room() -> int | None:
    """The room left under the tightest memory limit of this process's cgroup and its ancestors
    (cgroup v2's memory.max, v1's memory.limit_in_bytes): the limit less what the group holds,
    its inactive file pages aside (the kernel drops those first; docker stats counts the same);
    None where no limit is set or none can be read."""
    try:
        lines = PROC_CGROUP.read_text().splitlines()
    except OSError:
        return None
    rooms = []
    for line in lines:
        fields = line.split(":", 2)  # hierarchy id, controllers, the group's path
        if len(fields) != 3:
            continue
        _, controllers, group = fields
        if controllers == "":  # v2: one hierarchy
            base, files = CGROUP_ROOT, ("memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):
            base, files = (
                CGROUP_ROOT / "memory",
                ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),
            )
        else:
            continue
        # From the process's group up to the mount's root: in a container the mount is its own
        # group, and the path /proc names (the host's) may not exist under it.
        folder = base / group.strip("/")
        for level in (folder, *folder.parents):
            if level == base or base in level.parents:
                rooms.append(_room(level, *files))
    return min((room for room in rooms if room is not None), default=None)


def _room(folder: Path, limit_file: str, usage_file: str, inactive_key: str) -> int | None:
    try:
        limit_text = (folder / limit_file).read_text().strip()
        if limit_text == "max" or int(limit_text) >= NO_LIMIT:
            return None
        usage = int((folder / usage_file).read_text())
    except (OSError, ValueError):
        return None
    return max(int(limit_text) - max(usage - _stat(folder, inactive_key), 0), 0)


def _stat(folder: Path, key: str) -> int:
    """A value of the group's memory.stat; 0 where it is not there."""
    try:
        for line in (folder / "memory.stat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0
