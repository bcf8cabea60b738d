"""Call costs of the loaded models for the auto policy: measured once, cached on disk, refined.

A calibration times target calls of a few widths (logits at every row, as a verify call asks) and
draft calls of a few widths (one token drafts; wider ones are catch-up calls) on top of the real
context: about a second or two for the default pair on a small CPU. The result is cached per model
file (path, size, modification time), threads, GPU layers, RPC servers, huge pages and llama.cpp build, so the next run
starts calibrated; the engine keeps refining the table from its own timed calls (the machine's
speed drifts) and writes it back after a generation, at most once a minute (Engine.save_costs).
When a one-token call has become more than twice as slow or fast as when the table was measured
(another process wants the CPU, or stopped), the next generation measures it again.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from specllm.engine.policy import CostTable
from specllm.files import JsonCache, file_identity
from specllm.llama.devices import gpu_layers, physical_cores
from specllm.llama.huge_pages import weights_on_huge_pages
from specllm.llama.model import Decoder
from specllm.llama.options import ModelOptions
from specllm.llama.system import build_id

# Wider verify calls are learned when first used; 32 anchors the estimate of the widest copies
# (they cost about 0.35 one-token calls per token here, 0.5 at 16).
TARGET_WIDTHS = (1, 2, 3, 4, 5, 8, 12, 16, 32)
DRAFT_WIDTHS = (1, 2, 5)  # one-token drafting steps; wider calls are catch-ups
NARROW = 5  # widths up to this are timed in rounds, against the one-token call of each round
NARROW_ROUNDS = 3
DRAFT_CONTEXT = 32  # the draft is timed on a short prefix: a draft that cannot pay costs no prefill
# On a GPU each timed call is the last of this many back-to-back calls of its width. A CUDA build
# replays a captured graph of a call only from the third call in a row of one shape (the first
# after a change runs kernel by kernel, the second is captured), and llama.cpp builds its graph
# again at every change of shape. Timed round-robin, every call paid that: on an H200 the 0.5B
# draft's one-token call read 2.8-3.7 ms where back-to-back ones take 1.2, so auto priced the
# draft at 0.67 of a 14B target's step (truly 0.18), never drafted, and so never learned better.
# Steady calls are what the loop pays where it keeps a shape; where it switches, its own timed
# calls raise the estimates, while an estimate that is too high is never corrected.
GPU_BACK_TO_BACK = 3
CACHE_FILE = "calibration.json"
CACHE_VERSION = 1


# {"version": 1, "models": {model_key: CostTable.to_dict()}}; another version's file reads as empty
_CACHE = JsonCache(
    CACHE_FILE,
    load=lambda data: data["models"] if data["version"] == CACHE_VERSION else None,
    dump=lambda models: {"version": CACHE_VERSION, "models": models},
)


def cache_path() -> Path:
    return _CACHE.path


def model_key(path: str | Path, options: ModelOptions, huge_pages: bool | None = None) -> str:
    """What a model's call costs depend on: the file, threads, GPU layers, the RPC servers that
    hold them (a network round trip per call), whether its weights are on huge pages (a loaded
    model knows; otherwise it is decided as loading will) and the llama.cpp build (known without
    loading the model)."""
    file_id = file_identity(path) or str(Path(path).resolve())
    threads = options.n_threads or physical_cores()
    layers = gpu_layers(options)
    rpc = f"|rpc={','.join(options.rpc)}" if options.rpc else ""
    if huge_pages is None:
        huge_pages = weights_on_huge_pages(Path(path), layers)
    memory = "|huge_pages" if huge_pages else ""
    return f"{file_id}|threads={threads}|gpu_layers={layers}{rpc}{memory}|{build_id()}"


def load_costs(key: str) -> CostTable | None:
    entry = _CACHE.read().get(key)
    try:
        return CostTable.from_dict(entry) if entry else None
    except (KeyError, TypeError, ValueError, AttributeError):
        return None  # an entry this version cannot read: calibrate again


def save_costs(tables: dict[str, CostTable]) -> None:
    """Write the tables back, with the other entries of models whose files are still there as they
    were. A cache that cannot be written only costs the next run a calibration."""
    _CACHE.update({key: table.to_dict() for key, table in tables.items()})


def measure(model: Decoder, widths: tuple[int, ...], context: list[int]) -> CostTable:
    """Time calls of each width on top of `context` (its KV cache is left holding `context`).

    One-token and narrow calls, which decide short drafts, in NARROW_ROUNDS rounds of back-to-back
    calls: a narrow width costs the median of its ratios to the one-token call of the same round,
    so a slow spell of a busy machine, which slows both, cancels out, and so does the first call
    of a width (it sets up llama.cpp's graph for it). A ratio of unpaired fastest timings once read
    V(4) = 3.2 where it is 2.7, and a width believed that dear is never used, so never corrected.
    Wide calls, which cost the most, once: the engine refines them as it uses them."""
    usable = [w for w in widths if 1 < w <= model.n_batch and w < model.n_ctx - len(context)]
    narrow, wide = [w for w in usable if w <= NARROW], [w for w in usable if w > NARROW]
    in_a_row = back_to_back(model)
    rounds = [
        time_calls([(model, w) for w in (1, *narrow)], context, reps=1, in_a_row=in_a_row) for _ in range(NARROW_ROUNDS)
    ]
    step = statistics.median(r[0] for r in rounds)
    V = {w: statistics.median(r[i] / r[0] for r in rounds) for i, w in enumerate(narrow, start=1)}
    if wide:
        times = time_calls([(model, w) for w in wide], context, reps=1, in_a_row=in_a_row)
        V.update((w, t / step) for w, t in zip(wide, times))
    return CostTable.from_ratios(step, V)


def back_to_back(model: Decoder) -> int:
    """How many calls of one width in a row it takes to time the last as the loop pays it."""
    return GPU_BACK_TO_BACK if model.on_gpu else 1


def time_calls(jobs: Sequence[tuple[Decoder, int]], context: list[int], reps: int, in_a_row: int = 1) -> list[float]:
    """The median of `reps` timings of each (model, n) call: n tokens after `context`, logits for
    all n (and their argmax, part of every real step). Every round times every call, so a slow
    spell of a busy machine spreads over all of them; each timing is of the last of `in_a_row`
    such calls made back to back (see GPU_BACK_TO_BACK). Each model's cache is left holding
    `context`."""
    feed_len = max(n for _, n in jobs)
    # Real token ids: the context's own. An empty context (a one-token prompt) has none, and calls
    # on no tokens at all were timed instead: 2 us a step, cached for every later run.
    ids = context or [0]
    feed = (ids * (feed_len // len(ids) + 1))[-feed_len:]
    for model in dict.fromkeys(m for m, _ in jobs):
        model.sync(context)
        model.checkpoint()  # a recurrent state goes back to `context` from it after each call
    samples: list[list[float]] = [[] for _ in jobs]
    for _ in range(reps):
        for (model, n), ts in zip(jobs, samples):
            for _ in range(in_a_row):
                start = time.perf_counter()
                model.eval(feed[:n], n).argmax(axis=1)
                seconds = time.perf_counter() - start
                model.truncate(len(context))
            ts.append(seconds)
    return [statistics.median(ts) for ts in samples]
