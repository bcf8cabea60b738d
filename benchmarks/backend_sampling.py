"""Token selection inside llama.cpp's graph (its experimental backend sampling) against selection
on the host, per verify call: is it cheaper to let llama.cpp pick each row's top-k (or argmax)
before the logits leave the graph?

    python benchmarks/backend_sampling.py MODEL.gguf [--width 5] [--top-k 40] [--calls 30]

Two contexts on the same weights evaluate the same verify calls (width tokens, a logit row
each), alternating call by call:
- host: llama.cpp hands over every row's full logits and specllm selects (argmax, or its top-k
  -> top-p -> min-p -> temperature chain, sampling.candidates);
- graph: the context carries a sampler chain (greedy, or top-k), llama.cpp selects in the graph
  and hands over only the token (greedy) or the k surviving logits and their ids, and the host
  applies the rest of the chain to those k values (exact: top-k comes first in the chain).
Reported: the median wall time of the whole call (decode plus selection), of the selection
alone, and of the call-by-call difference (robust to a busy machine's drift). Where the graph's
selection costs more inside the decode than it saves outside, the total shows it.
"""

import argparse
import ctypes
import statistics
import time

import llama_cpp as L
import numpy as np

from specllm.engine.sampling import SamplerSettings, candidates
from specllm.llama.model import Model
from specllm.llama.options import ModelOptions

PREFIX = list(range(1000, 1064))  # any tokens: the cost does not depend on them


def graph_context(model: Model, chain, width: int):
    params = L.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch = model.n_ctx, model.n_batch, model.n_batch
    params.n_threads = params.n_threads_batch = model.options.n_threads or 2
    params.n_outputs_max = params.n_outputs_max_per_seq = width
    config = L.llama_sampler_seq_config(0, ctypes.cast(chain, ctypes.c_void_p))
    params.samplers, params.n_samplers = ctypes.pointer(config), 1
    ctx = L.llama_init_from_model(model._model, params)
    if not ctx:
        raise SystemExit("llama.cpp refused a context with a backend sampler")
    return ctx, config


def decode(ctx, tokens: list[int], pos0: int, outputs: int) -> None:
    batch = L.llama_batch_init(len(tokens), 0, 1)
    batch.n_tokens = len(tokens)
    for i, t in enumerate(tokens):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t, pos0 + i, 1, i >= len(tokens) - outputs
        batch.seq_id[i][0] = 0
    try:
        if L.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed")
    finally:
        L.llama_batch_free(batch)


def host_select(ctx, n_vocab: int, width: int, s: SamplerSettings) -> list:
    rows = np.ctypeslib.as_array(L.llama_get_logits(ctx), shape=(width, n_vocab))
    if s.greedy:
        return [int(t) for t in rows.argmax(axis=1)]
    return [candidates(row, s) for row in rows]


def graph_select(ctx, width: int, s: SamplerSettings) -> list:
    if s.greedy:
        return [L.llama_get_sampled_token_ith(ctx, i) for i in range(width)]
    rest = SamplerSettings(s.temperature, 0, s.top_p, s.min_p)  # top-k was applied in the graph
    out = []
    for i in range(width):
        k = L.llama_get_sampled_logits_count_ith(ctx, i)
        values = np.ctypeslib.as_array(L.llama_get_sampled_logits_ith(ctx, i), shape=(k,))
        ids = np.ctypeslib.as_array(L.llama_get_sampled_candidates_ith(ctx, i), shape=(k,))
        kept, p = candidates(values, rest)
        out.append((ids[kept], p))
    return out


def compare(model: Model, width: int, top_k: int, calls: int) -> dict:
    """Host against graph selection on `model` (see the module's docstring), in milliseconds."""
    s = SamplerSettings(temperature=0.0) if top_k == 0 else SamplerSettings(top_k=top_k)
    chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_greedy() if s.greedy else L.llama_sampler_init_top_k(s.top_k))
    graph, _config = graph_context(model, chain, width)
    try:
        times = _alternate(model, graph, width, s, calls)
    finally:
        L.llama_free(graph)
        L.llama_sampler_free(chain)
    paired = [g - h for g, h in zip(times["graph"][0], times["host"][0])]
    quartiles = statistics.quantiles(paired, n=4) if len(paired) > 1 else [paired[0]] * 3
    ms = lambda xs: 1000 * statistics.median(xs)  # noqa: E731
    return {
        "width": width,
        "selection": "greedy" if s.greedy else f"top-k {top_k}",
        "calls": calls,
        **{f"{name}_call_ms": ms(total) for name, (total, _) in times.items()},
        **{f"{name}_select_ms": ms(select) for name, (_, select) in times.items()},
        "graph_minus_host_ms": ms(paired),
        "quartiles_ms": [1000 * q for q in (quartiles[0], quartiles[2])],
    }


def _alternate(model: Model, graph, width: int, s: SamplerSettings, calls: int) -> dict:
    model.truncate(0)
    host = model._ctx
    times = {"host": ([], []), "graph": ([], [])}
    draft = list(range(2000, 2000 + width))
    try:
        for ctx in (host, graph):
            decode(ctx, PREFIX, 0, 1)
        for call in range(calls + 2):  # the first two warm up
            for name, ctx in (("host", host), ("graph", graph)):
                L.llama_memory_seq_rm(L.llama_get_memory(ctx), 0, len(PREFIX), -1)
                start = time.perf_counter()
                decode(ctx, draft, len(PREFIX), width)
                decoded = time.perf_counter()
                picked = host_select(ctx, model.n_vocab, width, s) if name == "host" else graph_select(ctx, width, s)
                done = time.perf_counter()
                if call >= 2:
                    times[name][0].append(done - start)
                    times[name][1].append(done - decoded)
                if name == "host":
                    reference = picked
                elif s.greedy and picked != reference:
                    raise RuntimeError(f"the graph's argmax differs from the host's: {picked} != {reference}")
    finally:  # decoded behind the Model's back: leave its context empty, as the Model says it is
        L.llama_memory_seq_rm(L.llama_get_memory(host), 0, -1, -1)
    return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--width", type=int, default=5, help="tokens per verify call (gamma + 1)")
    ap.add_argument("--top-k", type=int, default=40, help="0: greedy")
    ap.add_argument("--calls", type=int, default=30)
    args = ap.parse_args()
    model = Model(args.model, ModelOptions(n_ctx=1024))
    r = compare(model, args.width, args.top_k, args.calls)
    what = "greedy" if args.top_k == 0 else f"top-k {args.top_k} then top-p/min-p/temperature"
    print(f"{model.path.name}: verify calls of {args.width} tokens, {what}, {args.calls} calls each, alternating")
    for name in ("host", "graph"):
        print(
            f"  {name:5s}  whole call {r[name + '_call_ms']:8.3f} ms   selection after the call "
            f"{r[name + '_select_ms']:7.3f} ms"
        )
    print(
        f"  graph - host, call by call: median {r['graph_minus_host_ms']:+.3f} ms "
        f"(quartiles {r['quartiles_ms'][0]:+.3f} .. {r['quartiles_ms'][1]:+.3f})"
    )
    model.close()


if __name__ == "__main__":
    main()
