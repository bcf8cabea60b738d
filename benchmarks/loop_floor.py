"""The least host work a Python loop over llama.cpp's logits can do per speculative step, on a
real pair: the draft's one-token calls, each followed by an argmax of its row, then the target's
verify call of gamma + 1 tokens and an argmax of each row it reads, then both caches cut back.
Nothing else: no drafter, no policy, no text, no bookkeeping. What it costs outside llama.cpp's
calls is what any Python loop pays per step on this machine, whatever it does besides.

    python benchmarks/loop_floor.py TARGET.gguf DRAFT.gguf [--gamma 4] [--steps 64] [--rows 5]

--rows is how many of the verify call's rows are read (1: the draft's first token is rejected,
gamma + 1: all are kept). The step repeats at the same position, so every step costs the same.
"""

import argparse
import statistics
import time

import llama_cpp as L
import numpy as np

from specllm.llama.model import Model, llama_get_logits


def one_call(model: Model, tokens: list[int], pos0: int) -> np.ndarray:
    """A call of `tokens` at pos0, every row's logits wanted; the rows, as a view."""
    batch, n = model._batch, len(tokens)
    batch.n_tokens = n
    token, pos, logits = batch.token, batch.pos, batch.logits
    for i in range(n):
        token[i], pos[i], logits[i] = tokens[i], pos0 + i, 1
    start = time.perf_counter()
    if L.llama_decode(model._ctx, batch) != 0:
        raise SystemExit("llama_decode failed")
    address = llama_get_logits(model._ctx)
    model.llama_seconds += time.perf_counter() - start
    return model._views.of(address, (n, model.n_vocab))


def measure(target: Model, draft: Model, prompt: list[int], gamma: int, steps: int, rows: int) -> list[float]:
    """Microseconds of host work per step, outside llama.cpp's calls."""
    n = len(prompt) - 1  # both models hold the prompt but its last token
    host = []
    for _ in range(steps):
        target.llama_seconds = draft.llama_seconds = 0.0
        start = time.perf_counter()
        drafted, token = [], prompt[-1]
        for j in range(gamma):
            token = int(one_call(draft, [token], n + j)[0].argmax())
            drafted.append(token)
        verify = one_call(target, [prompt[-1], *drafted], n)
        chosen = [int(verify[i].argmax()) for i in range(rows)]
        for model in (target, draft):
            L.llama_memory_seq_rm(model._memory, 0, n, -1)
        elapsed = time.perf_counter() - start
        host.append(1e6 * (elapsed - target.llama_seconds - draft.llama_seconds))
        assert len(chosen) == rows
    return host


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target")
    ap.add_argument("draft")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--rows", type=int, default=None, help="verify rows read (default: all, gamma + 1)")
    args = ap.parse_args()
    rows = args.gamma + 1 if args.rows is None else args.rows
    if not 1 <= rows <= args.gamma + 1:
        raise SystemExit(f"--rows must be in 1..{args.gamma + 1}")
    target, draft = Model(args.target), Model(args.draft)
    prompt = target.tokenize("Write a Python function that parses an ISO 8601 date string.")
    for model in (target, draft):
        model.sync(prompt[:-1])
    measure(target, draft, prompt, args.gamma, 4, rows)  # warm-up
    host = measure(target, draft, prompt, args.gamma, args.steps, rows)
    q = statistics.quantiles(host, n=10)
    print(
        f"host work per step outside llama.cpp (gamma {args.gamma}, {rows} verify rows read, {args.steps} steps): "
        f"median {statistics.median(host) / 1e3:.3f} ms (p10 {q[0] / 1e3:.3f}, p90 {q[-1] / 1e3:.3f})"
    )


if __name__ == "__main__":
    main()
