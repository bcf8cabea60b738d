"""GPU truth in one command: specllm on a CUDA machine (an NVIDIA H200), no network needed.

    python benchmarks/gpu_check.py --out OUTDIR [--budget SECONDS] [--tokens N]
    python benchmarks/gpu_check.py --dry-run --out OUTDIR      # every step on the CPU, tiny shapes
    python benchmarks/gpu_check.py --plan                      # the models it would write, and sizes

It writes shape-faithful random-weight GGUFs of the curated shapes (Qwen2.5 0.5B, 7B, 32B, 14B,
1.5B, then Llama 3.2 1B and 3.1 8B; Q4_K_M's mix of Q4_K and Q6_K blocks, with Q5_0 / Q8_0 where a
row is not a multiple of 256, as llama.cpp's quantizer does; a synthetic vocabulary of the real
size), and measures with every layer on the GPU:

- per model: the one-token step t1 and V(n) = T(n) / T(1) for n = 1..16, 32, 64 (specllm's own
  calibration.time_calls), so c = t1(draft) / t1(target) for each curated pair;
- per target: specllm target-only tok/s against llama.cpp's plain decoding of the same file (a small
  C loop compiled here against the same libllama: its greedy sampler chain, as llama-simple, and a
  raw argmax), and a ctypes loop calling llama_decode directly in this process (the Python floor);
- the loop's own time per step (decode time minus the time inside llama.cpp's calls) for
  target-only, model drafting and auto;
- speedups at controlled acceptance: random weights accept nothing, so a benchmark-only drafter
  (SyntheticDrafter below, a subclass of specllm.engine.drafters.ModelDrafter put in the engine's place for
  the run) makes the draft model's real calls but proposes the target's own greedy continuation
  (from a target-only pass; where the run's output leaves it at a near-tie, the continuation of
  the new context, decoded on the side and left out of the timing) with each token corrupted with
  probability 1 - alpha, and reports alpha as its confidence. tok/s of target-only, model
  g = 2..8 and auto at alpha 0.6, 0.75, 0.9
  for 0.5B -> 7B, 0.5B -> 32B, 0.5B -> 14B, 1.5B -> 14B (and Llama 1B -> 8B if time allows), with
  what auto chose and the prediction E / (k c + V(k+1)), E = 1 + alpha + ... + alpha^k;
- greedy fidelity: every speculative output against the target-only output; at a divergence, its
  position and the bench's replay verdict (a near-tie only if the verify call's batch shape
  reproduces the flip: specllm.bench.runner.check_fidelity).

Results go to OUTDIR/gpu_check.json and OUTDIR/gpu_check.md, rewritten after every section, with
progress on stdout, so a run cut short leaves what finished. The most valuable numbers come first
(0.5B -> 7B, then 0.5B -> 32B, ...); --budget SECONDS (default 450 on a GPU, counted from the
start, unpacking included) skips what would not fit, and says so in the report.

On a machine without a usable CUDA device (or with --dry-run) every step runs on the CPU with tiny
shapes in seconds: tests/test_gpu_check.py runs it in CI, so the script is known to work before a
GPU minute is spent. Its first runs on an H200 are in docs/results/2026-12-h200.md.

## On the CUDA machine

Here, once: `bash benchmarks/gpu_prepare.sh` fills `.device/` (ignored by git, ~41 MiB): the CUDA 13
/ sm_90 build of llama-cpp-python 0.3.36 from ../shared/device/, the pure-Python wheels that
`import specllm` needs beyond numpy, typer, rich, huggingface_hub and jinja2 (diskcache for
llama_cpp, filelock for the calibration cache, typing_extensions), and llama.cpp's headers for the
C loop, and specllm's compiled sampler built for Python 3.12, which the script puts beside its
source there. `.device` must be sent along with the working tree (it is an ignored path). There,
from the repository root, one line:

    site=$(mktemp -d) && tar xJf .device/llama_cpp_python-0.3.36-cuda13-sm90.tar.xz -C "$site" &&
      for w in .device/*.whl; do python3 -m zipfile -e "$w" "$site"; done &&
      PYTHONPATH="$site:$PWD" LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}" \\
      SPECLLM_GPU_CHECK_SITE="$site" python3 benchmarks/gpu_check.py --out OUTDIR

(`python3 benchmarks/gpu_check.py --out OUTDIR` alone does the same: where /dev/nvidia0 exists and
.device/ holds the archive, it unpacks it into a temporary folder and starts itself again with
PYTHONPATH and LD_LIBRARY_PATH set.) The first seconds are a smoke test (import, a tiny model
with every layer offloaded, a few tokens); if the CUDA build cannot load, the report says why.
Models are written to a temporary folder (--models-dir; in /dev/shm where the 32B fits there with
room to spare, so writing 20 GB costs a memory copy), never under OUTDIR, and each target is
deleted once measured. On a GPU the script asks for about 7.5 minutes (--budget 450); give the
command a limit of 9 to 10 minutes, and the report is written as it goes (a TERM signal saves it
too).
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import json
import math
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEVICE_DIR = REPO / ".device"
ENV_SITE = "SPECLLM_GPU_CHECK_SITE"  # set once the CUDA build is on PYTHONPATH
ENV_START = "SPECLLM_GPU_CHECK_START"  # when the first process started (the budget counts from it)
ENV_SETUP = "SPECLLM_GPU_CHECK_SETUP"  # what the bootstrap did, as JSON
SCHEMA = 1

ALPHAS = (0.6, 0.75, 0.9)
GAMMAS = tuple(range(2, 9))
FIXED_CONFIGS = tuple(f"model g={g}" for g in GAMMAS)
# model g=4 run a second time with the draft's catch-up the other way (by Model.one_token_catch_up)
CATCH_UP_CONFIGS = {True: "model g=4, catch-up one token a call", False: "model g=4, catch-up in one call"}
WIDTHS = (*range(1, 17), 32, 64)
MAX_REPLAYS = 4  # fidelity: divergences of a pair replayed in their batch shape (each costs ~2 generations)
FIRST_NORMAL = 261  # first ordinary token id of the synthetic vocabularies (after specials and bytes)

# --- model shapes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    name: str
    arch: str  # "qwen2" (attention biases) or "llama"
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int
    family_vocab: int  # ids past this are padding (Qwen's 7B+ carry 128 more than the 0.5B)
    tied: bool  # output layer shares the token embedding
    rope_base: float
    eps: float

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


def _qwen(name, n_embd, n_layer, n_head, n_kv, n_ff, vocab, tied, family=151936):
    return Shape(name, "qwen2", n_embd, n_layer, n_head, n_kv, n_ff, vocab, family, tied, 1e6, 1e-6)


def _llama(name, n_embd, n_layer, n_head, n_kv, n_ff, vocab, tied):
    return Shape(name, "llama", n_embd, n_layer, n_head, n_kv, n_ff, vocab, vocab, tied, 5e5, 1e-5)


# The published configurations of the curated models.
GPU_SHAPES = {
    "qwen2.5-0.5b": _qwen("qwen2.5-0.5b", 896, 24, 14, 2, 4864, 151936, True),
    "qwen2.5-1.5b": _qwen("qwen2.5-1.5b", 1536, 28, 12, 2, 8960, 151936, True),
    "qwen2.5-7b": _qwen("qwen2.5-7b", 3584, 28, 28, 4, 18944, 152064, False),
    "qwen2.5-14b": _qwen("qwen2.5-14b", 5120, 48, 40, 8, 13824, 152064, False),
    "qwen2.5-32b": _qwen("qwen2.5-32b", 5120, 64, 40, 8, 27648, 152064, False),
    "llama-3.2-1b": _llama("llama-3.2-1b", 2048, 16, 32, 8, 8192, 128256, True),
    "llama-3.1-8b": _llama("llama-3.1-8b", 4096, 32, 32, 8, 14336, 128256, False),
}
# The same roles in miniature: the 0.5B keeps a row length that is not a multiple of 256 (the
# Q5_0 / Q8_0 fallback), the others use the k-quants, the 7B+ carry 128 padding ids.
DRY_SHAPES = {
    "qwen2.5-0.5b": _qwen("qwen2.5-0.5b", 160, 2, 5, 1, 512, 4096, True, family=4096),
    "qwen2.5-1.5b": _qwen("qwen2.5-1.5b", 256, 2, 8, 2, 512, 4096, True, family=4096),
    "qwen2.5-7b": _qwen("qwen2.5-7b", 256, 3, 8, 2, 768, 4224, False, family=4096),
    "qwen2.5-14b": _qwen("qwen2.5-14b", 256, 4, 8, 2, 768, 4224, False, family=4096),
    "qwen2.5-32b": _qwen("qwen2.5-32b", 256, 5, 8, 2, 1024, 4224, False, family=4096),
    "llama-3.2-1b": _llama("llama-3.2-1b", 256, 2, 8, 2, 512, 3000, True),
    "llama-3.1-8b": _llama("llama-3.1-8b", 256, 3, 8, 2, 768, 3000, False),
}
SMOKE_SHAPE = _qwen("smoke", 256, 2, 4, 2, 512, 1024, False, family=1024)

# (draft, target): the curated pairs, for c; E2E pairs in the order they are measured end to end.
CURATED_PAIRS = [
    ("qwen2.5-0.5b", "qwen2.5-1.5b"),
    ("qwen2.5-0.5b", "qwen2.5-7b"),
    ("qwen2.5-0.5b", "qwen2.5-14b"),
    ("qwen2.5-0.5b", "qwen2.5-32b"),
    ("qwen2.5-1.5b", "qwen2.5-14b"),
    ("llama-3.2-1b", "llama-3.1-8b"),
]
# Stages, most valuable first: models to have, then the end-to-end pair measured with them. A
# target file is deleted after the last stage that needs it.
STAGES = [
    (["qwen2.5-0.5b", "qwen2.5-7b"], ("qwen2.5-0.5b", "qwen2.5-7b")),
    (["qwen2.5-32b"], ("qwen2.5-0.5b", "qwen2.5-32b")),
    (["qwen2.5-14b"], ("qwen2.5-0.5b", "qwen2.5-14b")),
    (["qwen2.5-1.5b"], ("qwen2.5-1.5b", "qwen2.5-14b")),
    (["llama-3.2-1b", "llama-3.1-8b"], ("llama-3.2-1b", "llama-3.1-8b")),
]
TARGETS = ["qwen2.5-7b", "qwen2.5-32b", "qwen2.5-14b", "qwen2.5-1.5b", "llama-3.1-8b"]


def chosen_stages(pairs: tuple) -> list:
    """STAGES in order, or only the named pairs' stages in the order named (each loads its pair)."""
    if not pairs:
        return STAGES
    by_name = {pair_name(*pair): (models, pair) for models, pair in STAGES}
    unknown = [p for p in pairs if p not in by_name]
    if unknown:
        raise ValueError(f"unknown pair {', '.join(unknown)} (known: {', '.join(by_name)})")
    return [by_name[p] for p in pairs]


def pair_name(draft: str, target: str) -> str:
    return f"{short(draft)}->{short(target)}"


def short(name: str) -> str:
    family, size = name.rsplit("-", 1)
    return ("L" if family.startswith("llama") else "") + size.upper()


@dataclass(frozen=True)
class Settings:
    mode: str  # "gpu" or "dry-run"
    shapes: dict
    prompt_tokens: int
    tokens: int  # generated per run
    reps: int  # calibration rounds (after one warm-up round)
    n_ctx: int
    gpu_layers: int
    threads: int | None  # None: one per physical core (a dry run takes one: it measures nothing)
    budget: float  # seconds from the start; 0: none
    alphas: tuple = ALPHAS
    pairs: tuple = ()  # pair names to measure, in this order (empty: every stage, in STAGES' order)


# --- GGUF writing -------------------------------------------------------------------------------
#
# Written directly (no gguf package on the CUDA machine): header, key/values, tensor infos, then
# every tensor's bytes aligned to 32. Quantised blocks are random bytes with sane scales, laid out
# as gguf-py's quants.py reads them:
#   Q4_K (256 values, 144 bytes): d f16, dmin f16, 12 bytes of packed 6-bit scales/mins, 128 bytes
#        of 4-bit q; x = d * sc * q - dmin * m
#   Q6_K (256, 210): ql[128], qh[64], int8 scales[16], d f16; x = d * scale * (q - 32)
#   Q5_0 (32, 22): d f16, qh[4], qs[16]; x = d * (q - 16)
#   Q8_0 (32, 34): d f16, int8 qs[32]; x = d * q
# d is set so that the values have about the standard deviation asked for (mean ~0).

F32, Q5_0, Q8_0, Q4_K, Q6_K = 0, 6, 8, 12, 14
QUANT = {F32: (1, 4), Q5_0: (32, 22), Q8_0: (32, 34), Q4_K: (256, 144), Q6_K: (256, 210)}
QUANT_NAMES = {F32: "F32", Q5_0: "Q5_0", Q8_0: "Q8_0", Q4_K: "Q4_K", Q6_K: "Q6_K"}
FALLBACK = {Q4_K: Q5_0, Q6_K: Q8_0}  # llama.cpp's quantizer, for rows not a multiple of 256
D_OFFSET = {Q4_K: 0, Q6_K: 208, Q5_0: 0, Q8_0: 0}
STD_PER_D = {Q4_K: 243.0, Q6_K: 1365.0, Q5_0: 9.2, Q8_0: 74.0}  # value std / d for random blocks
FILE_TYPE_Q4_K_M = 15
ALIGN = 32
POOL_BYTES = 16 * 2**20  # layer matrices repeat a random pool of blocks (per type and scale)

GGUF_UINT32, GGUF_INT32, GGUF_FLOAT32, GGUF_BOOL, GGUF_STRING, GGUF_ARRAY = 4, 5, 6, 7, 8, 9


@dataclass(frozen=True)
class Tensor:
    name: str
    ne: tuple[int, ...]  # ggml order: ne[0] is the row length
    qtype: int
    kind: str  # "ones", "bias", "matrix" (tiled random pool) or "vocab" (all random, special rows 0)
    std: float = 0.0

    @property
    def nbytes(self) -> int:
        block, size = QUANT[self.qtype]
        n = math.prod(self.ne)
        return n // block * size


def _kquant(qtype: int, row: int) -> int:
    return qtype if row % 256 == 0 else FALLBACK[qtype]


def _more_bits(layer: int, n_layer: int) -> bool:
    """llama.cpp's use_more_bits: the layers where Q4_K_M keeps attn_v and ffn_down in Q6_K."""
    return layer < n_layer // 8 or layer >= 7 * n_layer // 8 or (layer - n_layer // 8) % 3 == 2


def tensors(shape: Shape) -> list[Tensor]:
    e, hd, v = shape.n_embd, shape.head_dim, shape.n_vocab
    q_dim, kv_dim = shape.n_head * hd, shape.n_head_kv * hd
    out: list[Tensor] = []
    if shape.tied:  # llama.cpp quantizes a tied embedding as the output layer
        out.append(Tensor("token_embd.weight", (e, v), _kquant(Q6_K, e), "vocab", 3.5 / math.sqrt(e)))
    else:
        out.append(Tensor("token_embd.weight", (e, v), _kquant(Q4_K, e), "vocab", 1.0))
    for i in range(shape.n_layer):
        p, more = f"blk.{i}.", _more_bits(i, shape.n_layer)
        out.append(Tensor(p + "attn_norm.weight", (e,), F32, "ones"))
        out.append(Tensor(p + "attn_q.weight", (e, q_dim), _kquant(Q4_K, e), "matrix", 1 / math.sqrt(e)))
        out.append(Tensor(p + "attn_k.weight", (e, kv_dim), _kquant(Q4_K, e), "matrix", 1 / math.sqrt(e)))
        out.append(
            Tensor(p + "attn_v.weight", (e, kv_dim), _kquant(Q6_K if more else Q4_K, e), "matrix", 1 / math.sqrt(e))
        )
        if shape.arch == "qwen2":
            out += [
                Tensor(p + f"attn_{x}.bias", (n,), F32, "bias", 0.02)
                for x, n in (("q", q_dim), ("k", kv_dim), ("v", kv_dim))
            ]
        out.append(Tensor(p + "attn_output.weight", (q_dim, e), _kquant(Q4_K, q_dim), "matrix", 1 / math.sqrt(q_dim)))
        out.append(Tensor(p + "ffn_norm.weight", (e,), F32, "ones"))
        out.append(Tensor(p + "ffn_gate.weight", (e, shape.n_ff), _kquant(Q4_K, e), "matrix", 1 / math.sqrt(e)))
        out.append(Tensor(p + "ffn_up.weight", (e, shape.n_ff), _kquant(Q4_K, e), "matrix", 1 / math.sqrt(e)))
        down = _kquant(Q6_K if more else Q4_K, shape.n_ff)
        out.append(Tensor(p + "ffn_down.weight", (shape.n_ff, e), down, "matrix", 1 / math.sqrt(shape.n_ff)))
    out.append(Tensor("output_norm.weight", (e,), F32, "ones"))
    if not shape.tied:
        out.append(Tensor("output.weight", (e, v), _kquant(Q6_K, e), "vocab", 3.5 / math.sqrt(e)))
    return out


def model_bytes(shape: Shape) -> int:
    return sum(-(-t.nbytes // ALIGN) * ALIGN for t in tensors(shape))


def quant_mix(shape: Shape) -> dict[str, int]:
    mix: dict[str, int] = {}
    for t in tensors(shape):
        mix[QUANT_NAMES[t.qtype]] = mix.get(QUANT_NAMES[t.qtype], 0) + t.nbytes
    return mix


def vocab_pieces(shape: Shape) -> list[str]:
    """A synthetic vocabulary of the real size: the same text for the same id across a family."""
    special = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    pieces = special + [f"<0x{b:02X}>" for b in range(256)]
    pieces += [f"\u2581t{i}" for i in range(FIRST_NORMAL, shape.family_vocab)]
    pieces += [f"[PAD{i}]" for i in range(shape.family_vocab, shape.n_vocab)]
    return pieces[: shape.n_vocab]


def _sane_blocks(qtype: int, n_blocks: int, std: float, rng: np.random.Generator) -> np.ndarray:
    block, size = QUANT[qtype]
    raw = np.frombuffer(rng.bytes(n_blocks * size), dtype=np.uint8).reshape(n_blocks, size).copy()
    d = (std / STD_PER_D[qtype] * rng.uniform(0.8, 1.2, n_blocks)).astype(np.float16)
    o = D_OFFSET[qtype]
    raw[:, o : o + 2] = d.view(np.uint8).reshape(n_blocks, 2)
    if qtype == Q4_K:  # dmin: centres d * sc * q (mean 7.5 d sc) against dmin * m
        raw[:, 2:4] = (d.astype(np.float32) * 7.5).astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    return raw


def _zero_scales(blocks: np.ndarray, qtype: int) -> None:
    """Every value of these blocks 0 (their scales 0): a logit of exactly 0 for their rows, which
    the maximum of the other random logits always beats."""
    o = D_OFFSET[qtype]
    blocks[:, o : o + 2] = 0
    if qtype == Q4_K:
        blocks[:, 2:4] = 0


def _kv(key: str, vtype: int, payload: bytes) -> bytes:
    return _str(key) + struct.pack("<I", vtype) + payload


def _str(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _header(shape: Shape, infos: list[Tensor]) -> bytes:
    a = shape.arch
    pieces = vocab_pieces(shape)
    types = np.ones(len(pieces), dtype=np.int32)  # NORMAL
    types[0], types[1:5], types[5:FIRST_NORMAL] = 2, 3, 6  # UNKNOWN, CONTROL, BYTE
    scores = -np.arange(len(pieces), dtype=np.float32) * 1e-4
    u32 = lambda k, x: _kv(k, GGUF_UINT32, struct.pack("<I", x))  # noqa: E731
    f32 = lambda k, x: _kv(k, GGUF_FLOAT32, struct.pack("<f", x))  # noqa: E731
    kvs = [
        _kv("general.architecture", GGUF_STRING, _str(a)),
        _kv("general.name", GGUF_STRING, _str(f"specllm-gpu-check-{shape.name}")),
        u32("general.file_type", FILE_TYPE_Q4_K_M),
        u32(f"{a}.context_length", 32768),
        u32(f"{a}.embedding_length", shape.n_embd),
        u32(f"{a}.block_count", shape.n_layer),
        u32(f"{a}.feed_forward_length", shape.n_ff),
        u32(f"{a}.attention.head_count", shape.n_head),
        u32(f"{a}.attention.head_count_kv", shape.n_head_kv),
        f32(f"{a}.rope.freq_base", shape.rope_base),
        f32(f"{a}.attention.layer_norm_rms_epsilon", shape.eps),
        u32(f"{a}.vocab_size", shape.n_vocab),
        _kv("tokenizer.ggml.model", GGUF_STRING, _str("llama")),
        _kv(
            "tokenizer.ggml.tokens",
            GGUF_ARRAY,
            struct.pack("<IQ", GGUF_STRING, len(pieces)) + b"".join(map(_str, pieces)),
        ),
        _kv("tokenizer.ggml.scores", GGUF_ARRAY, struct.pack("<IQ", GGUF_FLOAT32, len(pieces)) + scores.tobytes()),
        _kv("tokenizer.ggml.token_type", GGUF_ARRAY, struct.pack("<IQ", GGUF_INT32, len(pieces)) + types.tobytes()),
        u32("tokenizer.ggml.unknown_token_id", 0),
        u32("tokenizer.ggml.bos_token_id", 1),
        u32("tokenizer.ggml.eos_token_id", 2),
        u32("tokenizer.ggml.eot_token_id", 4),
        _kv("tokenizer.ggml.add_bos_token", GGUF_BOOL, b"\0"),
        _kv("tokenizer.ggml.add_eos_token", GGUF_BOOL, b"\0"),
    ]
    out = [b"GGUF", struct.pack("<IQQ", 3, len(infos), len(kvs)), *kvs]
    offset = 0
    for t in infos:
        out.append(_str(t.name) + struct.pack("<I", len(t.ne)) + struct.pack(f"<{len(t.ne)}Q", *t.ne))
        out.append(struct.pack("<IQ", t.qtype, offset))
        offset += -(-t.nbytes // ALIGN) * ALIGN
    head = b"".join(out)
    return head + b"\0" * (-len(head) % ALIGN)


def _prime_at_least(n: int) -> int:
    n |= 1
    while any(n % p == 0 for p in range(3, math.isqrt(n) + 1, 2)):
        n += 2
    return n


def write_gguf(path: Path, shape: Shape, seed: int = 0) -> Path:
    """Write a random-weight GGUF of `shape` (Q4_K_M's mix) in about the time its bytes take to
    write: every quantised tensor repeats a pool of random blocks from a random start. Layer
    matrices share a 16 MiB pool per type and scale; the embedding and output layers have a pool
    of a prime number of blocks, at least one per vocabulary row, so no two of their rows are
    alike (each row is its own window of the pool). The special and padding rows are written with
    zero scales."""
    rng = np.random.default_rng(seed)
    infos = tensors(shape)
    pools: dict[tuple, np.ndarray] = {}
    tmp = path.with_name(path.name + ".partial")

    def pool_for(t: Tensor, n_blocks: int) -> np.ndarray:
        key = (t.qtype, round(t.std, 9), n_blocks)
        if key not in pools:
            pools[key] = _sane_blocks(t.qtype, n_blocks, t.std, rng)
        return pools[key]

    def write_blocks(f, pool: np.ndarray, start: int, n: int, zero: bool = False) -> int:
        """n blocks of the pool from `start` on, wrapping around; with their scales 0 if `zero`."""
        size, written, flat = pool.shape[1], 0, memoryview(pool).cast("B")
        while n:
            take = min(n, len(pool) - start)
            if zero:
                chunk = pool[start : start + take].copy()
                _zero_scales(chunk, t.qtype)
                written += f.write(chunk.tobytes())
            else:
                written += f.write(flat[start * size : (start + take) * size])
            n, start = n - take, 0
        return written

    with open(tmp, "wb") as f:
        f.write(_header(shape, infos))
        for t in infos:
            written = 0
            if t.kind == "ones":
                written = f.write(np.ones(t.ne, dtype=np.float32).tobytes())
            elif t.kind == "bias":
                written = f.write((rng.standard_normal(t.ne) * t.std).astype(np.float32).tobytes())
            elif t.kind == "vocab":
                per_row = t.ne[0] // QUANT[t.qtype][0]
                pool = pool_for(t, _prime_at_least(max(t.ne[1], POOL_BYTES // QUANT[t.qtype][1])))
                start = int(rng.integers(len(pool)))
                # specials (0..4) and padding (family_vocab..) never win the argmax: scales 0
                for first, last, zero in (
                    (0, 5, True),
                    (5, shape.family_vocab, False),
                    (shape.family_vocab, t.ne[1], True),
                ):
                    n = max(0, last - first) * per_row
                    written += write_blocks(f, pool, (start + first * per_row) % len(pool), n, zero)
            else:
                pool = pool_for(t, (POOL_BYTES // QUANT[t.qtype][1]) | 1)
                written = write_blocks(f, pool, int(rng.integers(len(pool))), t.nbytes // QUANT[t.qtype][1])
            assert written == t.nbytes, (t.name, written, t.nbytes)
            f.write(b"\0" * (-written % ALIGN))
    os.replace(tmp, path)
    return path


def default_models_dir(largest: int) -> Path:
    """A temporary folder in memory (/dev/shm) where the largest model fits there with room to
    spare (writing 20 GB costs a memory copy, not a disk's speed), else in the temporary folder."""
    shm = Path("/dev/shm")
    try:
        if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 1.3 * largest + 2**30:
            return Path(tempfile.mkdtemp(prefix="specllm-gpu-models-", dir=shm))
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix="specllm-gpu-models-"))


# --- the CUDA build from .device/ ----------------------------------------------------------------


def nvidia_present() -> bool:
    return Path("/dev/nvidia0").exists() or Path("/proc/driver/nvidia/version").exists()


def _cuda_lib_dirs() -> list[str]:
    """Folders holding CUDA 13's runtime and cuBLAS (libggml-cuda needs both)."""
    import glob

    candidates = ["/usr/local/cuda/lib64", "/usr/local/cuda/lib", "/usr/local/cuda/targets/x86_64-linux/lib"]
    for pattern in (
        "/usr/local/cuda*/lib64",
        "/usr/local/cuda*/lib",
        "/usr/local/cuda*/targets/*/lib",
        "/opt/*/lib64",
        "/opt/*/lib",
        "/opt/*/*/lib64",
        "/opt/*/*/targets/*/lib",
        "/usr/lib/*-linux-gnu",
    ):
        candidates += sorted(glob.glob(pattern))
    for entry in sys.path:  # CUDA libraries installed as Python packages
        candidates += sorted(glob.glob(os.path.join(entry, "nvidia", "*", "lib")))
    found = []
    for d in dict.fromkeys(candidates):
        if any(Path(d, name).exists() for name in ("libcudart.so.13", "libcublas.so.13")):
            found.append(d)
    return found


def _place_compiled_sampler() -> str | None:
    """Copy .device/'s build of specllm's sampler for this Python (gpu_prepare.sh makes one for
    3.12) beside its source, where specllm imports it; the name of what was placed, or None (then
    the loop samples with numpy, as the report's machine section says)."""
    import importlib.machinery
    import shutil

    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        built = DEVICE_DIR / f"_sampler{suffix}"
        if built.exists():
            shutil.copy2(built, REPO / "specllm" / "engine" / built.name)
            return built.name
    return None


def bootstrap(args) -> dict:
    """Where a CUDA device and .device/'s archive are here, unpack the CUDA build (and the wheels
    of the modules this Python lacks) into a temporary folder and start again with it first on
    PYTHONPATH. Returns what was done (in the second process: what the first one did)."""
    if os.environ.get(ENV_SITE):
        try:
            return json.loads(os.environ.get(ENV_SETUP) or "{}") or {"used": True, "site": os.environ[ENV_SITE]}
        except ValueError:
            return {"used": True, "site": os.environ[ENV_SITE]}
    archives = sorted(DEVICE_DIR.glob("llama_cpp_python-*.tar.xz"))
    if args.dry_run:
        return {"used": False, "why": "--dry-run"}
    if not archives:
        return {
            "used": False,
            "why": "no llama-cpp-python archive in .device/ (benchmarks/gpu_prepare.sh puts it there)",
        }
    if not nvidia_present() and not args.use_device_build:
        return {"used": False, "why": "no NVIDIA device here (/dev/nvidia0)"}
    import importlib.util
    import tarfile
    import zipfile

    start = time.time()
    site = Path(tempfile.mkdtemp(prefix="specllm-gpu-site-"))
    print(f"unpacking {archives[-1].name} into {site}", flush=True)
    with tarfile.open(archives[-1]) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(site, filter="data")
        else:
            tar.extractall(site)
    wheels = []
    for wheel in sorted(DEVICE_DIR.glob("*.whl")):
        module = wheel.name.split("-")[0].lower()
        if importlib.util.find_spec(module) is None:
            with zipfile.ZipFile(wheel) as z:
                z.extractall(site)
            wheels.append(wheel.name)
    sampler = _place_compiled_sampler()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    cuda = _cuda_lib_dirs()
    env["LD_LIBRARY_PATH"] = os.pathsep.join([*cuda, *filter(None, [env.get("LD_LIBRARY_PATH")])])
    env[ENV_SITE] = str(site)
    setup = {
        "used": True,
        "archive": archives[-1].name,
        "site": str(site),
        "wheels": wheels,
        "compiled_sampler": sampler,
        "cuda_lib_dirs": cuda,
        "unpack_seconds": round(time.time() - start, 2),
    }
    env[ENV_SETUP] = json.dumps(setup)
    os.execve(sys.executable, [sys.executable, str(Path(__file__).resolve()), *sys.argv[1:]], env)
    raise AssertionError("unreachable")


# --- the report ---------------------------------------------------------------------------------


def now_s(start: float) -> float:
    return time.time() - start


class Report:
    """One JSON document and its Markdown rendering, written after every section."""

    def __init__(self, out: Path, settings: Settings, start: float):
        self.out, self.start = out, start
        self.data: dict = {
            "schema": SCHEMA,
            "mode": settings.mode,
            "mode_reason": "",
            "status": "running",
            "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(start)),
            "elapsed_seconds": 0.0,
            "budget_seconds": settings.budget,
            "settings": {
                "prompt_tokens": settings.prompt_tokens,
                "tokens": settings.tokens,
                "calibration_reps": settings.reps,
                "n_ctx": settings.n_ctx,
                "gpu_layers": settings.gpu_layers,
                "threads": settings.threads,
                "alphas": list(settings.alphas),
                "pairs": list(settings.pairs) or "all",
                "gammas": list(GAMMAS),
                "widths": list(WIDTHS),
                "auto_costs": "specllm's own calibration"
                if settings.mode == "gpu"
                else "GPU-like costs given (dry run)",
            },
            "machine": {},
            "setup": {},
            "smoke": {},
            "models": {},
            "calibration": {},
            "pairs": {},
            "plain_decoding": {},
            "loop": {},
            "speedups": {},
            "selection": {},
            "patterns": {},
            "fidelity": {"runs": 0, "identical": 0, "divergences": []},
            "skipped": [],
            "errors": [],
        }

    def log(self, message: str) -> None:
        print(f"[{now_s(self.start):7.1f}s] {message}", flush=True)

    def error(self, where: str, exc: BaseException) -> None:
        tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
        self.data["errors"].append(
            {"where": where, "error": f"{type(exc).__name__}: {exc}", "traceback": "".join(tb[-4:])}
        )
        self.log(f"ERROR in {where}: {type(exc).__name__}: {exc}")
        self.save()

    def skip(self, what: str, why: str) -> None:
        self.data["skipped"].append({"what": what, "why": why})
        self.log(f"skipped {what}: {why}")
        self.save()

    def save(self) -> None:
        self.data["elapsed_seconds"] = round(now_s(self.start), 2)
        self.out.mkdir(parents=True, exist_ok=True)
        for name, text in (
            ("gpu_check.json", json.dumps(self.data, indent=1, default=_json_default)),
            ("gpu_check.md", render_markdown(self.data)),
        ):
            tmp = self.out / f".{name}.tmp"
            tmp.write_text(text + "\n", encoding="utf-8")
            os.replace(tmp, self.out / name)


def _json_default(x):
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, Path):
        return str(x)
    raise TypeError(type(x).__name__)


def _f(x, digits=2, suffix="") -> str:
    return "-" if x is None else f"{x:.{digits}f}{suffix}"


def render_markdown(d: dict) -> str:
    s = d["settings"]
    lines = [
        f"# specllm GPU check ({d['mode']}{', ' + d['mode_reason'] if d['mode_reason'] else ''})",
        "",
        f"Status: {d['status']}; {d['elapsed_seconds']:.0f} s; started {d['started']}; "
        f"budget {d['budget_seconds'] or 'none'} s. Device: {', '.join(d['machine'].get('devices') or ['none'])}; "
        f"llama-cpp-python {d['machine'].get('llama_cpp_python', '?')}; sampler "
        f"{d['machine'].get('sampler', '?').split(' (')[0]}. Prompt {s['prompt_tokens']} tokens, "
        f"{s['tokens']} generated per run, greedy; random-weight GGUFs of the real shapes (Q4_K_M mix).",
        "",
        "## Call costs (specllm calibration.time_calls, median of the rounds; on a GPU each the last of "
        "calibration.GPU_BACK_TO_BACK calls of its width in a row)",
        "",
        "| model | size GB | t1 ms | " + " | ".join(f"V({w})" for w in WIDTHS[1:]) + " |",
        "|---|---|---|" + "---|" * (len(WIDTHS) - 1),
    ]
    for name, cal in d["calibration"].items():
        size = d["models"].get(name, {}).get("bytes")
        lines.append(
            f"| {name} | {_f(size and size / 1e9)} | {_f(cal['t1_ms'], 3)} | "
            + " | ".join(_f(cal["V"].get(str(w))) for w in WIDTHS[1:])
            + " |"
        )
    if d.get("patterns"):
        lines += [
            "",
            "## Call sequences (median ms a call; widths called in this order, again and again)",
            "",
            "| model | 1 1 1 1: width 1 | 2 1 1 1: width 2 | 2 1 1 1: width 1 | 5 5: width 5 | 1 5: width 1 "
            "| 1 5: width 5 |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, r in d["patterns"].items():
            lines.append(
                f"| {name} | {_f(r['1 1 1 1']['1'], 3)} | {_f(r['2 1 1 1']['2'], 3)} | {_f(r['2 1 1 1']['1'], 3)} | "
                f"{_f(r['5 5']['5'], 3)} | {_f(r['1 5']['1'], 3)} | {_f(r['1 5']['5'], 3)} |"
            )
    lines += [
        "",
        "## c per pair (draft step / target step)",
        "",
        "| pair | draft t1 ms | target t1 ms | c |",
        "|---|---|---|---|",
    ]
    for name, p in d["pairs"].items():
        lines.append(f"| {name} | {_f(p['draft_t1_ms'], 3)} | {_f(p['target_t1_ms'], 3)} | {_f(p['c'], 3)} |")
    lines += [
        "",
        "## specllm target-only against llama.cpp's plain decoding (tok/s)",
        "",
        "| target | specllm | ctypes loop | llama.cpp C, greedy sampler | llama.cpp C, argmax | specllm / C sampler "
        "| specllm loop ms/step | (the engine's own figure) | step ms | loop share |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, p in d["plain_decoding"].items():
        c = p.get("c_loop") or {}
        lines.append(
            f"| {name} | {_f(p['specllm_tok_s'], 1)} | {_f(p['ctypes_tok_s'], 1)} | {_f(c.get('sampler_tok_s'), 1)} | "
            f"{_f(c.get('argmax_tok_s'), 1)} | {_f(p.get('specllm_vs_c_sampler'), 3)} | "
            f"{_f(p['loop_ms_per_step'], 3)} | {_f(p.get('engine_loop_ms_per_step'), 3)} | "
            f"{_f(p['step_ms'], 3)} | {_f(p['loop_share'] and 100 * p['loop_share'], 1, '%')} |"
        )
    notes = [f"{n}: {p['c_loop_note']}" for n, p in d["plain_decoding"].items() if p.get("c_loop_note")]
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    lines += [
        "",
        "## Choosing each row's token in llama.cpp's graph against on the host (verify call of 5 tokens, ms)",
        "",
        "| target | selection | host: call | host: choosing after it | graph: call | graph: choosing after it "
        "| graph - host, call by call |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, results in d.get("selection", {}).items():
        for r in results:
            lines.append(
                f"| {name} | {r['selection']} | {_f(r['host_call_ms'], 3)} | {_f(r['host_select_ms'], 3)} | "
                f"{_f(r['graph_call_ms'], 3)} | {_f(r['graph_select_ms'], 3)} | {_f(r['graph_minus_host_ms'], 3)} |"
            )
    lines += [
        "",
        "## The loop's own time per step (decode time minus llama.cpp's calls; greedy at alpha 0.75; sampled: the "
        "real draft, temperature 0.8)",
        "",
        "| pair | target-only ms | model g=4 ms | auto ms | model g=4 sampled ms | target step ms |",
        "|---|---|---|---|---|---|",
    ]
    for name, p in d["loop"].items():
        lines.append(
            f"| {name} | {_f(p['target-only'], 3)} | {_f(p['model g=4'], 3)} | {_f(p['auto'], 3)} | "
            f"{_f(p.get('model g=4 sampled'), 3)} | {_f(p['target_step_ms'], 3)} |"
        )
    lines += [
        "",
        "## Speedups at controlled acceptance (measured x / predicted x, against target-only in the same round)",
        "",
        "| pair | alpha | target-only tok/s | "
        + " | ".join(f"g={g}" for g in GAMMAS)
        + " | g=4, catch-up the other way | auto | auto chose | best predicted |",
        "|---|---|---|" + "---|" * len(GAMMAS) + "---|---|---|---|",
    ]
    for name, by_alpha in d["speedups"].items():
        for alpha, r in by_alpha.items():
            runs = {x["config"]: x for x in r["runs"]}
            cells = []
            for g in GAMMAS:
                x = runs.get(f"model g={g}")
                cells.append("-" if x is None else f"{_f(x['speedup'])}/{_f(x['predicted'])}")
            other = next((runs[c] for c in CATCH_UP_CONFIGS.values() if c in runs), None)
            cells.append("-" if other is None else f"{_f(other['speedup'])} ({other['config'].split(', ')[1]})")
            a = runs.get("auto")
            auto = "-" if a is None else f"{_f(a['speedup'])}/{_f(a['predicted'])}"
            chose = "-" if a is None else a["auto"]["summary"]
            best = f"{_f(r['best_predicted'])} (k={r['best_k']})" if r.get("best_predicted") else "-"
            lines.append(
                f"| {name} | {alpha} | {_f(r['target_only_tok_s'], 1)} | "
                + " | ".join(cells)
                + f" | {auto} | {chose} | {best} |"
            )
    fid = d["fidelity"]
    lines += [
        "",
        "## Greedy fidelity (speculative output against target-only, token for token)",
        "",
        f"{fid['identical']} of {fid['runs']} runs equal the target-only output. A divergence is replayed in the "
        "batch shape of the verify call that produced it: a near-tie if that call itself picks the speculative "
        "token, a bug if not. The synthetic drafter re-anchors on the new continuation after a divergence "
        "(its time is left out of tok/s).",
        "",
    ]
    if fid["divergences"]:
        lines += [
            "| pair | alpha | config | position | kind | top-2 gap | batch gap |",
            "|---|---|---|---|---|---|---|",
        ]
        for x in fid["divergences"]:
            lines.append(
                f"| {x['pair']} | {x['alpha']} | {x['config']} | {x['position']} | {x['kind']} | "
                f"{_f(x.get('top2_gap'), 4)} | {_f(x.get('batch_gap'), 4)} |"
            )
    if d["skipped"]:
        lines += ["", "## Skipped", ""] + [f"- {x['what']}: {x['why']}" for x in d["skipped"]]
    if d["errors"]:
        lines += ["", "## Errors", ""] + [f"- {x['where']}: {x['error']}" for x in d["errors"]]
    return "\n".join(lines)


# --- measuring ----------------------------------------------------------------------------------


class CallTimer:
    """Seconds spent inside llama.cpp's calls (as benchmarks/overhead.py counts them): every
    llama_cpp function the backend calls on a step is wrapped. `mark` is the count at the end of
    the current generation's prefill (set by the patched _Run._prefill)."""

    NAMES = (
        "llama_decode",
        "llama_get_logits",
        "llama_get_logits_ith",
        "llama_memory_seq_rm",
        "llama_memory_clear",
        "llama_process",
        "llama_state_seq_get_data_ext",
        "llama_state_seq_set_data_ext",
    )

    def __init__(self):
        import llama_cpp

        from specllm.llama import model

        self.seconds, self.mark = 0.0, 0.0
        self.original = {}  # llama_cpp's own
        for module in (llama_cpp, model):  # specllm binds a few of them again (llama_get_logits)
            for name in self.NAMES:
                fn = getattr(module, name, None)
                if fn is not None:
                    self.original.setdefault(name, fn)
                    setattr(module, name, self._wrap(fn))

    def _wrap(self, fn):
        clock = time.perf_counter

        def wrapper(*args):
            start = clock()
            try:
                return fn(*args)
            finally:
                self.seconds += clock() - start

        return wrapper


def synthetic_drafter_class(plan: SyntheticPlan):
    """A ModelDrafter that makes the draft model's real calls (catch-up, one call per further
    token, the same host work on each logits row) but proposes the target's own greedy
    continuation, each token replaced by another with probability 1 - alpha, and reports alpha as
    its confidence (a calibrated draft that cannot tell its good tokens from its bad ones)."""
    from specllm.engine.drafters import Draft, ModelDrafter
    from specllm.engine.policy import CONFIDENCE_EDGES
    from specllm.engine.sampling import candidates, top_probability

    class SyntheticDrafter(ModelDrafter):
        def propose(self, context, gamma, keep_going=None):
            plan.follow(context)  # before the clock starts: no part of drafting
            start = time.perf_counter()
            gamma = min(gamma, self.model.n_ctx - len(context))
            if gamma <= 0 or not self.can_read(context):
                return Draft(source=self.name)
            width = self.catch_up(context)
            logits, calls = self._catch_up_to(context, width)
            first_call = (width, time.perf_counter() - start, calls)
            if gamma > 1:
                self.model.checkpoint()
            tokens, confidences = [], []
            position = len(context) - plan.prompt_len
            while True:
                # the host work a real draft does on its row
                token = int(logits.argmax())
                if not self.sampler.greedy:
                    candidates(logits, self.sampler)
                if keep_going is not None:
                    top_probability(
                        logits, token, CONFIDENCE_EDGES[0]
                    )  # likewise (auto's confidence); alpha is reported
                    if not keep_going(confidences, plan.alpha, time.perf_counter() - start):
                        break
                    confidences.append(plan.alpha)
                tokens.append(plan.token(position + len(tokens), self.model.n_vocab))
                if len(tokens) == gamma:
                    break
                logits = self.model.eval([tokens[-1]], 1)[0]
                calls += 1
            return Draft(tokens, None, calls, time.perf_counter() - start, self.name, confidences, first_call)

    return SyntheticDrafter


class SyntheticPlan:
    """What the synthetic drafter proposes: the target's greedy continuation of the context, each
    token kept with probability alpha. The continuation is the recorded target-only output; where
    the run's output leaves it (a near-tie that a verify call's batch shape flips, which random
    weights meet often), a sibling context of the target decodes the new context's greedy
    continuation one token at a time (`oracle`) and proposals follow that from then on, so
    acceptance stays at alpha. That decoding is no part of the run: its wall time is taken out of
    the run's decode time and its llama.cpp calls out of the call timer."""

    def __init__(self, prompt_len: int, reference: list[int], alpha: float, max_tokens: int, oracle, timer: CallTimer):
        self.prompt_len, self.reference, self.alpha, self.max_tokens = prompt_len, reference, alpha, max_tokens
        self.oracle, self.timer = oracle, timer
        self.reset(0)

    def reset(self, seed) -> None:
        self.rng = np.random.default_rng(seed)
        self.current, self.checked = list(self.reference), 0
        self.oracle_seconds, self.reanchors = 0.0, 0

    def follow(self, context: list[int]) -> None:
        """Check the tokens generated since the last call against the continuation followed."""
        i, n, cur, p = self.checked, len(context) - self.prompt_len, self.current, self.prompt_len
        while i < n and i < len(cur) and context[p + i] == cur[i]:
            i += 1
        if i < n:
            start, in_calls = time.perf_counter(), self.timer.seconds
            self.current = list(context[p:]) + self.oracle(context, max(0, self.max_tokens - n))
            self.timer.seconds = in_calls
            self.oracle_seconds += time.perf_counter() - start
            self.reanchors += 1
            i = n
        self.checked = i

    def token(self, index: int, n_vocab: int) -> int:
        true = self.current[index] if 0 <= index < len(self.current) else None
        if true is not None and self.rng.random() < self.alpha:
            return true
        while True:
            t = int(self.rng.integers(FIRST_NORMAL, n_vocab))
            if t != true:
                return t


def gpu_like_policy(t1: float):
    """A dry run's auto policy starts from a GPU's kind of costs (c = 0.1, V(n) close to 1)
    instead of its CPU calibration, where a draft model never pays: so that auto's drafting path
    (the synthetic drafter under its keep-going rule) runs too. Its own timings then pull the
    estimates towards the CPU's."""
    from specllm.engine.policy import AutoPolicy, CostTable

    target = CostTable.from_ratios(t1, {n: 1 + 0.03 * (n - 1) for n in (2, 3, 4, 5, 8, 12, 16, 32)})
    policy = AutoPolicy(target, CostTable.from_ratios(0.1 * t1, {2: 1.05, 5: 1.1}))
    policy.replays = False
    return policy


def expected_tokens(alpha: float, k: int) -> float:
    return sum(alpha**i for i in range(k + 1))


# Sequences of call widths, repeated from the same context: steady one-token decoding, the draft
# model's proposal of 4 (a catch-up call of 2 tokens, then one-token steps), steady verify calls of
# 5, and auto switching between a one-token step and a verify call of 5.
CALL_PATTERNS = {"1 1 1 1": (1, 1, 1, 1), "2 1 1 1": (2, 1, 1, 1), "5 5": (5, 5), "1 5": (1, 5)}


def call_pattern(model, context: list[int], widths: tuple, cycles: int) -> dict:
    """Median milliseconds of each width's calls when `widths` is called in that order, each call
    after the last (the KV cache grows), and then cut back to `context`, `cycles` times after one
    warm-up cycle. Calls are timed with their logits' argmax, as calibration.time_calls does."""
    feed = (context * (sum(widths) // max(1, len(context)) + 1))[-sum(widths) :]
    model.sync(context)
    model.checkpoint()
    times: dict[int, list[float]] = {w: [] for w in widths}
    for cycle in range(cycles + 1):
        at = 0
        for w in widths:
            start = time.perf_counter()
            model.eval(feed[at : at + w], w).argmax(axis=1)
            if cycle:
                times[w].append(time.perf_counter() - start)
            at += w
        model.truncate(len(context))
    return {str(w): 1000 * float(np.median(ts)) for w, ts in times.items()}


def predicted_speedup(alpha: float, k: int, c: float, V: dict) -> float | None:
    v = V.get(str(k + 1))
    return None if v is None or c is None else expected_tokens(alpha, k) / (k * c + v)


class Check:
    """The measurements, in stages, with the budget."""

    def __init__(self, settings: Settings, report: Report, models_dir: Path, keep_models: bool):
        self.s, self.r, self.models_dir, self.keep = settings, report, models_dir, keep_models
        self.files: dict[str, Path] = {}
        self.loaded: dict = {}
        self.write_rate = 1.5e9  # bytes/s, refined by the first file
        self.load_rate = 3e9
        self.prompt = [int(t) for t in np.random.default_rng(7).integers(FIRST_NORMAL, 2000, settings.prompt_tokens)]
        self.references: dict[str, list[int]] = {}
        self.siblings: dict = {}
        self.continuations: dict[str, dict] = {}  # target -> {context: its greedy continuation}
        self.plain_tried: set[str] = set()
        self.replays: dict[str, int] = {}

    def loaded_name(self, model) -> str:
        return next(name for name, m in self.loaded.items() if m is model)

    # budget ---------------------------------------------------------------------------------

    def left(self) -> float:
        return math.inf if not self.s.budget else self.s.budget - now_s(self.r.start)

    def fits(self, what: str, seconds: float) -> bool:
        if seconds <= self.left():
            return True
        self.r.skip(what, f"needs ~{seconds:.0f} s, {max(0.0, self.left()):.0f} s of the budget left")
        return False

    # models ---------------------------------------------------------------------------------

    def have(self, name: str) -> bool:
        """Write (if needed) and load a model; False if it did not fit or failed."""
        if name in self.loaded:
            return True
        from specllm.llama.model import Model
        from specllm.llama.options import ModelOptions

        shape = self.s.shapes[name]
        size = model_bytes(shape)
        if not self.fits(f"model {name}", size / self.write_rate + size / self.load_rate + 5):
            return False
        free = shutil.disk_usage(self.models_dir).free
        if size > free - 2**30:
            self.r.skip(
                f"model {name}",
                f"{size / 1e9:.1f} GB does not fit in the {free / 1e9:.1f} GB free in {self.models_dir}",
            )
            return False
        info = self.r.data["models"].setdefault(name, {})
        info.update(shape=dataclasses.asdict(shape), bytes=size, quant_bytes=quant_mix(shape))
        try:
            path = self.models_dir / f"{name}.gguf"
            self.r.log(f"writing {name} ({size / 1e9:.2f} GB)")
            t = time.perf_counter()
            write_gguf(path, shape, seed=zlib.crc32(name.encode()))
            dt = time.perf_counter() - t
            if size > 2**28:
                self.write_rate = size / dt
            info["write_seconds"] = round(dt, 2)
            self.files[name] = path
            t = time.perf_counter()
            options = ModelOptions(
                n_ctx=self.s.n_ctx, n_threads=self.s.threads, n_gpu_layers=self.s.gpu_layers, snapshots=0
            )
            model = Model(path, options)
            dt = time.perf_counter() - t
            if size > 2**28:
                self.load_rate = size / dt
            info.update(
                load_seconds=round(dt, 2),
                on_gpu=bool(model.on_gpu),
                n_vocab=model.n_vocab,
                description=model.describe(),
            )
            self.loaded[name] = model
            self.r.log(
                f"{name}: written in {info['write_seconds']} s, loaded in {info['load_seconds']} s (on GPU: "
                f"{model.on_gpu})"
            )
            self.r.save()
            return True
        except Exception as e:  # noqa: BLE001 - the report says what failed; the next stage may still run
            self.r.error(f"model {name}", e)
            return False

    def drop(self, name: str) -> None:
        self.continuations.pop(name, None)
        sibling = self.siblings.pop(name, None)
        if sibling is not None:
            sibling.close()  # before the model whose weights it uses
        model = self.loaded.pop(name, None)
        if model is not None:
            model.close()
        path = self.files.pop(name, None)
        if path is not None and not self.keep:
            path.unlink(missing_ok=True)

    # calibration ----------------------------------------------------------------------------

    def calibrate(self, name: str) -> None:
        if name in self.r.data["calibration"]:
            return
        from specllm.engine.calibration import back_to_back, time_calls

        model = self.loaded[name]
        context = self.prompt
        widths = [w for w in WIDTHS if w <= model.n_batch and len(context) + w < model.n_ctx]
        jobs = [(model, w) for w in widths]
        in_a_row = back_to_back(model)  # as specllm's calibration times them (steady calls on a GPU)
        time_calls(jobs, context, reps=1, in_a_row=in_a_row)  # warm-up
        times = time_calls(jobs, context, reps=self.s.reps, in_a_row=in_a_row)
        t1 = times[0]
        self.r.data["calibration"][name] = {
            "t1_ms": 1000 * t1,
            "call_ms": {str(w): 1000 * t for w, t in zip(widths, times)},
            "V": {str(w): t / t1 for w, t in zip(widths, times)},
            "context_tokens": len(context),
            "calls_in_a_row": in_a_row,
        }
        self.r.log(
            f"{name}: t1 {1000 * t1:.3f} ms, V(2) {times[1] / t1:.2f}, V(5) {times[4] / t1:.2f}, V(16) "
            f"{times[15] / t1:.2f}"
        )
        self.update_pairs()
        self.r.save()

    def patterns(self, name: str) -> None:
        """One model's call time in the sequences of widths the loop makes, against the same width
        called again and again. A CUDA build replays a captured graph of a call only after two
        calls of the same shape in a row, so the draft's catch-up call (2 tokens, then one-token
        steps) and the target's switching between one-token steps and verify calls may each run
        every kernel launch by launch."""
        if name in self.r.data["patterns"]:
            return
        model = self.loaded[name]
        t1 = self.r.data["calibration"][name]["t1_ms"] / 1000
        cycles = 12 if self.s.mode == "gpu" else 3
        if not self.fits(f"call patterns {name}", 3 * sum(map(len, CALL_PATTERNS.values())) * cycles * t1 + 1):
            return
        result = {label: call_pattern(model, self.prompt, widths, cycles) for label, widths in CALL_PATTERNS.items()}
        self.r.data["patterns"][name] = result
        steady, draft = result["1 1 1 1"]["1"], result["2 1 1 1"]["1"]
        self.r.log(
            f"{name}: one-token call {steady:.3f} ms steady, {draft:.3f} ms after a catch-up call; "
            f"verify(5) {result['5 5']['5']:.3f} ms steady, {result['1 5']['5']:.3f} ms after a one-token step"
        )
        self.r.save()

    def update_pairs(self) -> None:
        cal = self.r.data["calibration"]
        for draft, target in CURATED_PAIRS:
            if draft in cal and target in cal:
                self.r.data["pairs"][pair_name(draft, target)] = {
                    "draft": draft,
                    "target": target,
                    "draft_t1_ms": cal[draft]["t1_ms"],
                    "target_t1_ms": cal[target]["t1_ms"],
                    "c": cal[draft]["t1_ms"] / cal[target]["t1_ms"],
                    "draft_V2": cal[draft]["V"].get("2"),
                }

    # generation -----------------------------------------------------------------------------

    def generate(
        self,
        engine,
        drafter: str,
        gamma: int | None,
        tokens: int | None = None,
        plan: SyntheticPlan | None = None,
        seed=0,
        temperature: float = 0.0,
    ) -> dict:
        """One generation (greedy unless a temperature is given) from empty KV caches. tok/s and the
        loop's time leave out the synthetic drafter's re-anchoring (SyntheticPlan.follow), which no
        real drafter does."""
        from specllm.engine.loop import GenerationConfig
        from specllm.engine.sampling import SamplerSettings

        for model in (engine.target, engine.draft):
            if model is not None:
                model.truncate(0)  # every generation from empty KV caches, prefill timed alike
        if plan is not None:
            plan.reset(seed)
        config = GenerationConfig(
            max_tokens=tokens or self.s.tokens,
            sampler=SamplerSettings(temperature=temperature, seed=0),
            drafter=drafter,
            gamma=gamma,
        )
        calls = []
        with engine.start(list(self.prompt), config) as generation:
            for step in generation:
                if step.drafted or step.token != -1:
                    calls.append((list(step.drafted), step.accepted))
        result = generation.result
        llama = self.timer.seconds - self.timer.mark
        st = result.stats
        steps = max(1, st.target_calls)
        excluded = plan.oracle_seconds if plan is not None else 0.0
        decode = st.decode_seconds - excluded
        return {
            "tokens": list(result.tokens),
            "calls": calls,
            "stats": st,
            "tok_s": st.generated_tokens / decode if decode > 0 else 0.0,
            "decode_seconds": decode,
            "loop_ms_per_step": 1000 * (decode - llama) / steps,
            "llama_ms_per_step": 1000 * llama / steps,
            "reanchors": plan.reanchors if plan is not None else 0,
            "reanchor_seconds": excluded,
        }

    def oracle(self, target: str):
        """The target's greedy continuation of a context, one token per call, on a sibling context
        (the same weights, a KV cache of its own): for SyntheticPlan. Each is kept: the runs of a
        pair meet the same near-ties at the same places (on the H200 the 32B's re-anchoring took
        most of its time until then)."""
        if target not in self.siblings:
            self.siblings[target] = self.loaded[target].sibling()
        model = self.siblings[target]
        known: dict[tuple[int, ...], list[int]] = self.continuations.setdefault(target, {})

        def continuation(context: list[int], n: int) -> list[int]:
            key = tuple(context)
            if len(known.get(key, ())) >= n:
                return known[key][:n]
            known[key] = out = decode(context, n)
            return out

        def decode(context: list[int], n: int) -> list[int]:
            out: list[int] = []
            if n <= 0 or len(context) + n > model.n_ctx:
                return out
            logits = model.sync(context, n_logits=1)
            while True:
                out.append(int(logits[0].argmax()))
                if len(out) == n:
                    return out
                logits = model.eval([out[-1]], 1)

        return continuation

    # plain decoding -------------------------------------------------------------------------

    def plain(self, name: str) -> None:
        from specllm.engine.loop import Engine

        target = self.loaded[name]
        t1 = self.r.data["calibration"][name]["t1_ms"] / 1000
        size = self.r.data["models"][name]["bytes"]
        if not self.fits(f"plain decoding {name}", 6 * self.s.tokens * t1 + size / self.load_rate + 5):
            return
        engine = Engine(target)
        self.generate(engine, "none", None, tokens=max(4, self.s.tokens // 4))  # warm-up
        runs = [self.generate(engine, "none", None) for _ in range(2)]
        best = max(runs, key=lambda x: x["tok_s"])
        self.references[name] = runs[0]["tokens"]
        same = runs[0]["tokens"] == runs[1]["tokens"]
        entry = {
            "specllm_tok_s": best["tok_s"],
            "loop_ms_per_step": best["loop_ms_per_step"],
            # the engine's own accounting (Stats.llama_seconds), beside this script's call timer
            "engine_loop_ms_per_step": 1000 * best["stats"].loop_seconds_per_step,
            "step_ms": best["llama_ms_per_step"],
            "loop_share": best["loop_ms_per_step"] / (best["loop_ms_per_step"] + best["llama_ms_per_step"]),
            "target_only_repeatable": same,
            "ctypes_tok_s": self.ctypes_floor(target),
            "c_loop": None,
            "c_loop_note": "",
            "specllm_vs_c_sampler": None,
        }
        self.r.data["plain_decoding"][name] = entry
        self.r.save()
        try:
            c = self.c_loop(target)
            entry["c_loop"] = c
            entry["specllm_vs_c_sampler"] = entry["specllm_tok_s"] / c["sampler_tok_s"]
        except Exception as e:  # noqa: BLE001 - no compiler or headers: the ctypes loop is the floor
            entry["c_loop_note"] = f"C loop not run ({type(e).__name__}: {e}); the ctypes loop is the floor"
        self.r.log(
            f"{name}: specllm target-only {entry['specllm_tok_s']:.1f} tok/s, ctypes loop {entry['ctypes_tok_s']:.1f}, "
            f"C loop {_f((entry['c_loop'] or {}).get('sampler_tok_s'), 1)} (sampler) / "
            f"{_f((entry['c_loop'] or {}).get('argmax_tok_s'), 1)} (argmax); loop {entry['loop_ms_per_step']:.3f} "
            "ms/step"
        )
        self.r.save()
        self.selection(name)

    def selection(self, name: str) -> None:
        """Each verify row's token choice made in llama.cpp's graph (its backend sampling) against
        the host's, for a greedy and a top-k verify call of 5 tokens (benchmarks/backend_sampling.py)."""
        import backend_sampling

        t1 = self.r.data["calibration"][name]["t1_ms"] / 1000
        calls = 10 if self.s.mode == "gpu" else 3
        if not self.fits(f"selection in the graph {name}", 2 * 2 * (calls + 2) * 3 * t1 + 2):
            return
        results = []
        for top_k in (0, 40):
            try:
                results.append(backend_sampling.compare(self.loaded[name], 5, top_k, calls))
            except Exception as e:  # noqa: BLE001 - an experimental API: report, go on
                self.r.error(f"selection in the graph {name} top-k {top_k}", e)
        self.r.data["selection"][name] = results
        for r in results:
            self.r.log(
                f"{name} {r['selection']}: host {r['host_call_ms']:.3f} ms a call ({r['host_select_ms']:.3f} "
                "selecting), "
                f"graph {r['graph_call_ms']:.3f} ms ({r['graph_select_ms']:.3f}); graph - host "
                f"{r['graph_minus_host_ms']:+.3f} ms"
            )
        self.r.save()

    def ctypes_floor(self, model) -> float:
        """llama_decode one token at a time, argmax of the logits row in numpy: in this process,
        on the loaded weights, with a context of its own."""
        import llama_cpp as L

        from specllm.llama.model import _new_context

        decode, logits_ith = self.timer.original["llama_decode"], self.timer.original["llama_get_logits_ith"]
        ctx = _new_context(model._model, model.options, model.path, False)
        try:
            prompt = (L.llama_token * len(self.prompt))(*self.prompt)
            if decode(ctx, L.llama_batch_get_one(prompt, len(self.prompt))) != 0:
                raise RuntimeError("llama_decode failed on the prompt")
            n_vocab = model.n_vocab
            row = lambda: np.ctypeslib.as_array(logits_ith(ctx, -1), shape=(n_vocab,))  # noqa: E731
            one = (L.llama_token * 1)(int(row().argmax()))
            warm, n = 4, self.s.tokens
            for i in range(warm + n):
                if i == warm:
                    start = time.perf_counter()
                if decode(ctx, L.llama_batch_get_one(one, 1)) != 0:
                    raise RuntimeError("llama_decode failed")
                one[0] = int(row().argmax())
            return n / (time.perf_counter() - start)
        finally:
            L.llama_free(ctx)

    def c_loop(self, model) -> dict:
        from specllm.llama.devices import amx_built_in

        exe = self.c_binary()
        n, warm = self.s.tokens, 4
        cmd = [
            str(exe),
            str(model.path),
            str(n),
            str(warm),
            str(self.s.gpu_layers),
            str(self.s.n_ctx),
            str(model.options.n_threads or _physical_cores()),
            ",".join(map(str, self.prompt)),
            "0" if amx_built_in() else "1",  # llama.cpp's extra weight layouts: as specllm loads it
        ]
        t = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=max(30.0, min(180.0, self.left())))
        if out.returncode != 0:
            raise RuntimeError(f"exit {out.returncode}: {out.stderr.strip()[-300:]}")
        res = json.loads(out.stdout.strip().splitlines()[-1])
        return {
            "sampler_tok_s": n / res["sampler_seconds"],
            "argmax_tok_s": n / res["argmax_seconds"],
            "load_seconds": res["load_seconds"],
            "wall_seconds": round(time.perf_counter() - t, 2),
        }

    def c_binary(self) -> Path:
        if getattr(self, "_c_exe", None) is not None:
            return self._c_exe
        if getattr(self, "_c_error", None) is not None:
            raise self._c_error
        try:
            import llama_cpp

            cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
            if cc is None:
                raise RuntimeError("no C compiler")
            pkg = Path(llama_cpp.__file__).parent
            includes = [DEVICE_DIR / "include", pkg / "include", pkg.parent / "include"]
            include = next((d for d in includes if (d / "llama.h").exists()), None)
            if include is None:
                raise RuntimeError("llama.h not found (benchmarks/gpu_prepare.sh copies it to .device/include)")
            lib = pkg / "lib"
            build = Path(tempfile.mkdtemp(prefix="c-", dir=WORK[0]))
            (build / "plain.c").write_text(C_LOOP)
            exe = build / "plain_decode"
            out = subprocess.run(
                [
                    cc,
                    "-O2",
                    "-std=c11",
                    "-o",
                    str(exe),
                    str(build / "plain.c"),
                    f"-I{include}",
                    f"-L{lib}",
                    "-lllama",
                    f"-Wl,-rpath,{lib}",
                ],
                capture_output=True,
                text=True,
                timeout=120,
            )
            if out.returncode != 0:
                raise RuntimeError(f"compiling failed: {out.stderr.strip()[-300:]}")
            self._c_exe = exe
            return exe
        except Exception as e:
            self._c_error = e
            raise

    # speedups -------------------------------------------------------------------------------

    def e2e_estimate(self, draft: str, target: str) -> float:
        cal = self.r.data["calibration"]
        t1, c, V = cal[target]["t1_ms"] / 1000, cal[draft]["t1_ms"] / cal[target]["t1_ms"], cal[target]["V"]
        per_token = 0.0
        for alpha in self.s.alphas:
            per_token += 1.0 + 2.0  # target-only, auto's warm-up and measured run (at most a target step each)
            for g in (*GAMMAS, 4):  # g = 4 twice: the catch-up both ways
                p = predicted_speedup(alpha, g, c, V)
                per_token += 1.0 / max(0.2, p or 1.0)
        return 1.3 * per_token * self.s.tokens * t1 + 2.0

    def e2e(self, draft: str, target: str) -> None:
        import specllm.engine.loop as engine_module
        from specllm.engine.loop import Engine

        name = pair_name(draft, target)
        if not self.fits(f"speedups {name}", self.e2e_estimate(draft, target)):
            return
        reference = self.references.get(target)
        if reference is None:
            reference = self.generate(Engine(self.loaded[target]), "none", None)["tokens"]
            self.references[target] = reference
        cal = self.r.data["calibration"]
        c, V = cal[draft]["t1_ms"] / cal[target]["t1_ms"], cal[target]["V"]
        results = self.r.data["speedups"].setdefault(name, {})
        original = engine_module.ModelDrafter
        try:
            for i, alpha in enumerate(self.s.alphas):
                if i and not self.fits(
                    f"speedups {name} alpha {alpha}", self.e2e_estimate(draft, target) / len(self.s.alphas)
                ):
                    break
                plan = SyntheticPlan(len(self.prompt), reference, alpha, self.s.tokens, self.oracle(target), self.timer)
                engine_module.ModelDrafter = synthetic_drafter_class(plan)
                engine = Engine(self.loaded[target], self.loaded[draft])  # a fresh auto policy per alpha
                if self.s.mode == "dry-run":  # see gpu_like_policy
                    engine.policy = gpu_like_policy(cal[target]["t1_ms"] / 1000)
                    engine.calibration = {"measured": [], "seconds": 0.0, "cache": "dry run: GPU-like costs given"}
                base = self.generate(engine, "none", None)
                runs = []
                self.generate(engine, "model", 4, tokens=max(4, self.s.tokens // 4), plan=plan)  # warm-up: draft widths
                for g in GAMMAS:
                    run = self.generate(engine, "model", g, plan=plan, seed=[1000 + i, g])
                    runs.append(
                        self.summarise(
                            name, alpha, f"model g={g}", run, base, reference, engine, predicted_speedup(alpha, g, c, V)
                        )
                    )
                runs.append(self.other_catch_up(name, alpha, engine, plan, base, reference, seed=[1000 + i, 4]))
                # auto: one generation to calibrate (or read the cache) and learn this text's acceptance,
                # then the measured one
                self.generate(engine, "auto", None, plan=plan, seed=[1000 + i, 98])
                run = self.generate(engine, "auto", None, plan=plan, seed=[1000 + i, 99])
                auto = self.summarise(name, alpha, "auto", run, base, reference, engine, None)
                st = run["stats"]
                model_steps = st.sources.get("model", {})
                mean_k = model_steps["drafted"] / model_steps["steps"] if model_steps.get("steps") else None
                shares = st.source_shares()
                auto["auto"] = {
                    "sources": {k: dict(v) for k, v in st.sources.items()},
                    "shares": shares,
                    "mean_model_draft": mean_k,
                    "policy_c": (st.policy or {}).get("c"),
                    "policy_V": ((st.policy or {}).get("target") or {}).get("V"),
                    "summary": ", ".join(
                        f"{k} {100 * v:.0f}%" for k, v in sorted(shares.items(), key=lambda kv: -kv[1])
                    )
                    + (f", k~{mean_k:.1f}" if mean_k else ""),
                }
                auto["predicted"] = predicted_speedup(alpha, max(1, round(mean_k)), c, V) if mean_k else 1.0
                runs.append(auto)
                base_summary = self.summarise(name, alpha, "target-only", base, base, reference, engine, 1.0)
                best = max(((predicted_speedup(alpha, k, c, V) or 0.0, k) for k in range(1, 16)), default=(None, None))
                results[str(alpha)] = {
                    "alpha": alpha,
                    "c": c,
                    "target_only_tok_s": base["tok_s"],
                    "target_only": base_summary,
                    "runs": runs,
                    "best_predicted": best[0],
                    "best_k": best[1],
                }
                if alpha == 0.75 or (alpha == self.s.alphas[0] and name not in self.r.data["loop"]):
                    by = {x["config"]: x for x in runs}
                    self.r.data["loop"][name] = {
                        "alpha": alpha,
                        "target-only": base["loop_ms_per_step"],
                        "model g=4": by["model g=4"]["loop_ms_per_step"],
                        "auto": by["auto"]["loop_ms_per_step"],
                        "target_step_ms": base["llama_ms_per_step"],
                    }
                g_best = max((x for x in runs if x["config"] in FIXED_CONFIGS), key=lambda x: x["speedup"])
                self.r.log(
                    f"{name} alpha {alpha}: target-only {base['tok_s']:.1f} tok/s; best fixed {g_best['config']} "
                    f"{g_best['speedup']:.2f}x (predicted {_f(g_best['predicted'])}); auto {auto['speedup']:.2f}x "
                    f"({auto['auto']['summary']}); re-anchored {sum(x['reanchors'] for x in runs)} times"
                )
                self.r.save()
        finally:
            engine_module.ModelDrafter = original
        self.sampled_loop(draft, target)

    def other_catch_up(self, name, alpha, engine, plan, base, reference, seed) -> dict:
        """model g=4 again with the draft catching up the other way (Model.one_token_catch_up: one
        token a call where CUDA graphs are replayed, else one call), side by side in the round."""
        draft = engine.draft
        draft.one_token_catch_up = not draft.one_token_catch_up
        try:
            run = self.generate(engine, "model", 4, plan=plan, seed=seed)
            config = CATCH_UP_CONFIGS[draft.one_token_catch_up]
        finally:
            draft.one_token_catch_up = not draft.one_token_catch_up
        return self.summarise(name, alpha, config, run, base, reference, engine, None)

    def sampled_loop(self, draft: str, target: str) -> None:
        """The loop's own time per step when sampling (temperature 0.8, top-k 40: every verify row
        and draft row goes through the sampler chain), with the real draft model at g=4."""
        from specllm.engine.loop import Engine

        name = pair_name(draft, target)
        loop = self.r.data["loop"].get(name)
        t1 = self.r.data["calibration"][target]["t1_ms"] / 1000
        if loop is None or not self.fits(f"sampled loop {name}", 2 * self.s.tokens * t1 + 2):
            return
        run = self.generate(Engine(self.loaded[target], self.loaded[draft]), "model", 4, temperature=0.8)
        loop["model g=4 sampled"] = run["loop_ms_per_step"]
        self.r.save()

    def summarise(
        self, pair: str, alpha: float, config: str, run: dict, base: dict, reference: list[int], engine, predicted
    ) -> dict:
        st = run["stats"]
        out = {
            "config": config,
            "tok_s": run["tok_s"],
            "speedup": run["tok_s"] / base["tok_s"] if base["tok_s"] else None,
            "predicted": predicted,
            "generated": st.generated_tokens,
            "target_calls": st.target_calls,
            "draft_calls": st.draft_calls,
            "acceptance": st.acceptance_rate,
            "mean_accepted_length": st.mean_accepted_length,
            "loop_ms_per_step": run["loop_ms_per_step"],
            "llama_ms_per_step": run["llama_ms_per_step"],
            "identical": run["tokens"] == reference,
            "reanchors": run["reanchors"],
            "reanchor_seconds": run["reanchor_seconds"],
        }
        if run is base:
            return out
        fid = self.r.data["fidelity"]
        fid["runs"] += 1
        if out["identical"]:
            fid["identical"] += 1
        else:
            from specllm.bench.runner import check_fidelity

            replays = self.replays.get(pair, 0)
            t1 = self.r.data["calibration"][self.loaded_name(engine.target)]["t1_ms"] / 1000
            if replays >= MAX_REPLAYS or not self.fits(
                f"fidelity replay {pair} {alpha} {config}", 3 * len(run["tokens"]) * t1 + 1
            ):
                position = next((k for k, (a, b) in enumerate(zip(reference, run["tokens"])) if a != b), None)
                div = {"kind": f"not replayed (at most {MAX_REPLAYS} a pair, and the budget)", "position": position}
            else:
                self.replays[pair] = replays + 1
                try:
                    div = check_fidelity(engine.target, self.prompt, reference, run["tokens"], run["calls"]) or {}
                except Exception as e:  # noqa: BLE001
                    div = {"kind": f"replay failed: {e}", "position": None}
            keep = ("position", "kind", "top2_gap", "gap", "batch_gap", "target_token", "speculative_token", "call")
            fid["divergences"].append({"pair": pair, "alpha": alpha, "config": config, **{k: div.get(k) for k in keep}})
            out["divergence_position"] = div.get("position")
        return out

    # stages ---------------------------------------------------------------------------------

    def run(self) -> None:
        from specllm.engine.loop import _Run

        self.timer = CallTimer()
        original_prefill = _Run._prefill

        def prefill(run_self):
            original_prefill(run_self)
            self.timer.mark = self.timer.seconds

        _Run._prefill = prefill
        try:
            stages = chosen_stages(self.s.pairs)
            needed_later = {
                name: max((i for i, (models, pair) in enumerate(stages) if name in (*models, *pair)), default=-1)
                for name in self.s.shapes
            }
            for i, (models, (draft, target)) in enumerate(stages):
                ok = True
                for name in (*models, draft, target):
                    if name not in self.loaded and not self.have(name):
                        ok = False
                        break
                    try:
                        self.calibrate(name)
                    except Exception as e:  # noqa: BLE001
                        self.r.error(f"calibrating {name}", e)
                        ok = False
                        continue
                    try:
                        self.patterns(name)
                    except Exception as e:  # noqa: BLE001
                        self.r.error(f"call patterns {name}", e)
                    if name in TARGETS and name not in self.plain_tried:
                        self.plain_tried.add(name)
                        try:
                            self.plain(name)
                        except Exception as e:  # noqa: BLE001
                            self.r.error(f"plain decoding {name}", e)
                if ok:
                    try:
                        self.e2e(draft, target)
                    except Exception as e:  # noqa: BLE001
                        self.r.error(f"speedups {pair_name(draft, target)}", e)
                for name in list(self.loaded):
                    if needed_later.get(name, -1) <= i:
                        self.drop(name)
        finally:
            _Run._prefill = original_prefill
            for name in list(self.loaded):
                self.drop(name)


def _physical_cores() -> int:
    from specllm.llama.devices import physical_cores

    return physical_cores()


def smoke(settings: Settings, report: Report, models_dir: Path) -> bool:
    """Import, a tiny model with every layer offloaded (none in a dry run), a few tokens."""
    from specllm.llama.model import Model
    from specllm.llama.options import ModelOptions

    t = time.perf_counter()
    path = write_gguf(models_dir / "smoke.gguf", SMOKE_SHAPE, seed=3)
    model = Model(path, ModelOptions(n_ctx=256, n_threads=settings.threads, n_gpu_layers=settings.gpu_layers))
    try:
        tokens = []
        logits = model.eval([300, 301, 302, 303], 1)
        for _ in range(8):
            tokens.append(int(logits[0].argmax()))
            logits = model.eval([tokens[-1]], 1)
        finite = bool(np.isfinite(logits).all())
        ok = finite and (model.on_gpu or settings.mode != "gpu")
        report.data["smoke"] = {
            "ok": ok,
            "finite": finite,
            "on_gpu": bool(model.on_gpu),
            "tokens": tokens,
            "seconds": round(time.perf_counter() - t, 2),
        }
    finally:
        model.close()
        path.unlink(missing_ok=True)
    report.log(f"smoke test: {report.data['smoke']}")
    report.save()
    return ok


C_LOOP = r"""
/* llama.cpp's plain greedy decoding of a model: its greedy sampler chain (as llama-simple) and a
   raw argmax of the logits row, one token per llama_decode, after the same prompt. */
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "llama.h"

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void quiet(enum ggml_log_level level, const char *text, void *data) { (void)level; (void)text; (void)data; }
static llama_token argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[best]) best = i;
    return best;
}

int main(int argc, char **argv) {
    if (argc != 9) {
        fprintf(stderr, "usage: %s MODEL N_GEN N_WARM GPU_LAYERS N_CTX THREADS ID,ID,... EXTRA_BUFTS\n", argv[0]);
        return 2;
    }
    int n_gen = atoi(argv[2]), n_warm = atoi(argv[3]), ngl = atoi(argv[4]);
    int n_ctx = atoi(argv[5]), threads = atoi(argv[6]);
    int n_prompt = 1;
    for (const char *c = argv[7]; *c; c++) n_prompt += *c == ',';
    llama_token *prompt = malloc(sizeof(llama_token) * n_prompt);
    char *s = argv[7];
    for (int i = 0; i < n_prompt; i++) { prompt[i] = (llama_token)strtol(s, &s, 10); if (*s == ',') s++; }
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = ngl;
    mp.use_extra_bufts = atoi(argv[8]);
    double t0 = now();
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
    double load = now() - t0;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx; cp.n_batch = cp.n_ubatch = 512; cp.n_seq_max = 1;
    cp.n_threads = cp.n_threads_batch = threads; cp.no_perf = 1;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "cannot create a context\n"); return 1; }
    int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    struct llama_sampler *smpl = llama_sampler_chain_init(llama_sampler_chain_default_params());
    llama_sampler_chain_add(smpl, llama_sampler_init_greedy());
    double secs[2];
    for (int mode = 0; mode < 2; mode++) {
        llama_memory_clear(llama_get_memory(ctx), 1);
        if (llama_decode(ctx, llama_batch_get_one(prompt, n_prompt))) return 1;
        llama_token tok = mode == 0 ? llama_sampler_sample(smpl, ctx, -1)
                                    : argmax(llama_get_logits_ith(ctx, -1), n_vocab);
        double start = now();
        for (int i = 0; i < n_warm + n_gen; i++) {
            if (i == n_warm) start = now();
            if (llama_decode(ctx, llama_batch_get_one(&tok, 1))) return 1;
            tok = mode == 0 ? llama_sampler_sample(smpl, ctx, -1) : argmax(llama_get_logits_ith(ctx, -1), n_vocab);
        }
        secs[mode] = now() - start;
    }
    printf("{\"load_seconds\": %.4f, \"tokens\": %d, \"sampler_seconds\": %.6f, \"argmax_seconds\": %.6f}\n",
           load, n_gen, secs[0], secs[1]);
    llama_sampler_free(smpl);
    llama_free(ctx);
    llama_model_free(model);
    free(prompt);
    return 0;
}
"""


WORK: list = [None]


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _cleanup() -> None:
    if WORK[0]:
        shutil.rmtree(WORK[0], ignore_errors=True)
    site = os.environ.get(ENV_SITE)
    if site and Path(site).name.startswith("specllm-gpu-site-"):  # unpacked by bootstrap()
        shutil.rmtree(site, ignore_errors=True)


def print_plan(shapes: dict) -> None:
    for name, shape in shapes.items():
        mix = ", ".join(f"{k} {v / 1e9:.2f}" for k, v in quant_mix(shape).items())
        print(
            f"{name:14s} {model_bytes(shape) / 1e9:6.2f} GB  ({mix} GB)  {shape.n_layer} layers, n_embd "
            f"{shape.n_embd}, "
            f"vocab {shape.n_vocab}{', tied' if shape.tied else ''}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, help="folder for gpu_check.json and gpu_check.md")
    ap.add_argument("--dry-run", action="store_true", help="every step on the CPU with tiny shapes")
    ap.add_argument(
        "--budget", type=float, default=None, help="seconds from the start (default 450 on a GPU, none in a dry run)"
    )
    ap.add_argument("--tokens", type=int, default=None, help="tokens generated per run (default 128 on a GPU, 12 dry)")
    ap.add_argument(
        "--models-dir", type=Path, default=None, help="where to write the GGUFs (default: a temporary folder)"
    )
    ap.add_argument("--keep-models", action="store_true", help="keep the GGUFs (with --models-dir)")
    ap.add_argument(
        "--pairs",
        default="",
        help="comma-separated pairs to measure, in this order (e.g. 1.5B->14B,0.5B->14B; default: all)",
    )
    ap.add_argument(
        "--alphas", default="", help="comma-separated acceptance rates for the speedups (default 0.6,0.75,0.9)"
    )
    ap.add_argument("--plan", action="store_true", help="print the models a GPU run writes, and exit")
    ap.add_argument(
        "--use-device-build",
        action="store_true",
        help="unpack and use .device/'s llama-cpp-python build even where no /dev/nvidia0 is seen",
    )
    args = ap.parse_args(argv)
    if args.plan:
        print_plan(DRY_SHAPES if args.dry_run else GPU_SHAPES)
        return 0
    if args.out is None:
        ap.error("--out is required")
    pairs = tuple(p.strip() for p in args.pairs.split(",") if p.strip())
    try:
        chosen_stages(pairs)
        alphas = tuple(float(a) for a in args.alphas.split(",") if a.strip()) or ALPHAS
    except ValueError as e:
        ap.error(str(e))
    if not all(0.0 <= a <= 1.0 for a in alphas):
        ap.error("--alphas: each between 0 and 1")
    start = float(os.environ.get(ENV_START) or time.time())
    os.environ[ENV_START] = repr(start)
    setup = bootstrap(args)  # may start this script again with the CUDA build

    WORK[0] = tempfile.mkdtemp(prefix="specllm-gpu-check-")  # the C loop, specllm's cache; removed at exit
    atexit.register(_cleanup)
    os.environ["SPECLLM_CACHE"] = os.path.join(WORK[0], "cache")  # calibration, verdicts: this run's own
    failure = None
    try:
        import llama_cpp  # noqa: F401

        from specllm.llama.devices import gpu_offload_supported
        from specllm.llama.options import ALL_LAYERS
        from specllm.llama.system import system_info
    except Exception as e:  # noqa: BLE001 - the CUDA build could not load: say why in the report
        failure = e
    gpu = failure is None and not args.dry_run and gpu_offload_supported()
    mode = "gpu" if gpu else "dry-run"
    settings = Settings(
        mode=mode,
        shapes=GPU_SHAPES if gpu else DRY_SHAPES,
        prompt_tokens=128 if gpu else 16,
        tokens=args.tokens or (128 if gpu else 12),
        reps=5 if gpu else 2,
        n_ctx=1024 if gpu else 256,
        gpu_layers=ALL_LAYERS if gpu else 0,
        threads=None if gpu else 1,
        budget=args.budget if args.budget is not None else (450.0 if gpu else 0.0),
        alphas=alphas,
        pairs=pairs,
    )
    report = Report(args.out, settings, start)
    report.data["setup"] = setup
    if failure is not None:
        report.data["status"] = "failed"
        report.error("importing llama_cpp / specllm", failure)
        report.log(
            "hint: libggml-cuda needs libcudart.so.13 and libcublas.so.13 (LD_LIBRARY_PATH) and the NVIDIA driver"
        )
        return 1
    if not gpu:
        report.data["mode_reason"] = (
            "--dry-run"
            if args.dry_run
            else "the CUDA build loaded but llama.cpp sees no GPU (driver?): CPU, tiny shapes"
            if setup.get("used")
            else "no GPU offload here: CPU, tiny shapes"
        )
    try:
        info = system_info()
        info.pop("system_info", None)
        from specllm.engine.sampling import implementation

        report.data["machine"] = {
            **info,
            "sampler": implementation(),
            "python": sys.version.split()[0],
            "cpus": os.cpu_count(),
        }
    except Exception as e:  # noqa: BLE001
        report.error("system info", e)
    report.log(
        f"mode {mode}{' (' + report.data['mode_reason'] + ')' if report.data['mode_reason'] else ''}; "
        f"devices: {report.data['machine'].get('devices')}; budget {settings.budget or 'none'} s"
    )
    report.save()

    signal.signal(signal.SIGTERM, _interrupt)  # a time limit's TERM: save the report and clean up first
    own_dir = args.models_dir is None
    largest = max(model_bytes(shape) for shape in settings.shapes.values())
    models_dir = args.models_dir or default_models_dir(largest)
    models_dir.mkdir(parents=True, exist_ok=True)
    try:
        if not smoke(settings, report, models_dir):
            report.data["status"] = "failed"
            report.log("smoke test failed: non-finite logits, or the model is not on the GPU")
            return 1
        Check(settings, report, models_dir, args.keep_models).run()
        report.data["status"] = "done" if not report.data["errors"] else "done with errors"
    except KeyboardInterrupt:
        report.data["status"] = "interrupted"
    except Exception as e:  # noqa: BLE001
        report.data["status"] = "failed"
        report.error("gpu_check", e)
    finally:
        if own_dir and not args.keep_models:
            shutil.rmtree(models_dir, ignore_errors=True)
        report.save()
        report.log(f"{report.data['status']}: {args.out / 'gpu_check.json'}, {args.out / 'gpu_check.md'}")
    return 0 if report.data["status"] == "done" else 1


if __name__ == "__main__":
    sys.exit(main())
