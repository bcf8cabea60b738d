"""What one sampled row's host work costs, part by part, with the compiled sampler (specllm's
_sampler.c) and with numpy's, warm and right after a one-token call of a model; and a greedy draft
row's under auto (its argmax, then its confidence).

    python benchmarks/sampled_row.py MODEL.gguf [--rounds 60] [--top-k 40] [--temperature 0.8]
                                                [--prompt TEXT]

The parts are a draft row's (the chain over the row, the draw, the row's sparse form by id) and a
verify row's (the target's row, its lookups of the drafted token, a rejection's residual and its
draw), as the loop runs them, on rows of the model's vocabulary size. The two implementations
alternate round by round in one process, each after its own model call, so that both see the same
machine. On a CPU the call streams the weights through the caches, and every kind of numpy call
costs tens of microseconds the first time after it: that is what the compiled sampler saves. The
sampled rows are random; the greedy row is the model's own after --prompt's text (how many of its
logits lie within 20 of the top decides the confidence's cost: the script prints that share), the
same call each round.
"""

import argparse
import statistics
import time

import numpy as np

from specllm.engine import sampling
from specllm.engine.sampling import SamplerSettings, Sparse, candidates, sample, sparse_distribution, top_probability
from specllm.engine.speculative import residual
from specllm.llama.model import Model
from specllm.llama.options import ModelOptions

PARTS = ("chain", "draw", "by id", "target row", "lookups", "residual", "its draw")
GREEDY_PARTS = ("argmax", "confidence")


def sampled_row(draft_row: np.ndarray, target_row: np.ndarray, s: SamplerSettings, rng) -> list[float]:
    """Microseconds of each of PARTS."""
    times = [time.perf_counter_ns()]
    ids, p = candidates(draft_row, s)
    times.append(time.perf_counter_ns())
    token = int(ids[sample(p, rng)])
    times.append(time.perf_counter_ns())
    q = Sparse.of(ids, p, draft_row.size)
    times.append(time.perf_counter_ns())
    target = sparse_distribution(target_row, s)
    times.append(time.perf_counter_ns())
    _ = rng.random() * q[token] < target[token]
    times.append(time.perf_counter_ns())
    r = residual(target, q)
    times.append(time.perf_counter_ns())
    r.sample(rng)
    times.append(time.perf_counter_ns())
    return [(b - a) / 1e3 for a, b in zip(times, times[1:])]


def greedy_draft_row(row: np.ndarray) -> list[float]:
    """Microseconds of each of GREEDY_PARTS."""
    times = [time.perf_counter_ns()]
    token = int(row.argmax())
    times.append(time.perf_counter_ns())
    top_probability(row, token)
    times.append(time.perf_counter_ns())
    return [(b - a) / 1e3 for a, b in zip(times, times[1:])]


def measure(model_path: str, rounds: int, s: SamplerSettings, text: str) -> tuple[dict, dict, float]:
    """Each implementation's samples of sampled_row and of greedy_draft_row, warm and cold, and the
    share of the greedy row's logits within 20 of its top."""
    model = Model(model_path, ModelOptions(n_ctx=256))
    prompt = model.tokenize(text)
    model.sync(prompt[:-1])

    def call() -> np.ndarray:  # the caches as a model call leaves them; the same call every time
        row = model.eval(prompt[-1:], 1)[0]
        model.truncate(len(prompt) - 1)
        return row

    row = call()
    near_top = float(np.count_nonzero(row >= row.max() - 20.0)) / row.size
    generator = np.random.default_rng(0)
    compiled = sampling._compiled
    implementations = {"compiled": compiled, "numpy": None} if compiled is not None else {"numpy": None}
    names = [f"{name}, {when}" for name in implementations for when in ("warm", "cold")]
    sampled: dict[str, list[list[float]]] = {name: [] for name in names}
    greedy: dict[str, list[list[float]]] = {name: [] for name in names}
    rng = np.random.default_rng(1)
    try:
        for _ in range(rounds):
            for name, module in implementations.items():
                sampling._compiled = module
                draft_row, target_row = generator.normal(0, 3, (2, model.n_vocab)).astype(np.float32)
                call()
                sampled[f"{name}, cold"].append(sampled_row(draft_row, target_row, s, rng))
                sampled[f"{name}, warm"].append(sampled_row(draft_row, target_row, s, rng))  # the same, again
                row = call()
                greedy[f"{name}, cold"].append(greedy_draft_row(row))
                greedy[f"{name}, warm"].append(greedy_draft_row(row))
    finally:
        sampling._compiled = compiled
        model.close()
    return sampled, greedy, near_top


def table(samples: dict[str, list[list[float]]], parts: tuple[str, ...]) -> None:
    print(f"{'':16s}" + "".join(f" {part:>10s}" for part in parts) + f" {'total':>10s}")
    for name, rows in samples.items():
        medians = [statistics.median(row[i] for row in rows) for i in range(len(parts))]
        total = statistics.median(sum(row) for row in rows)
        print(f"{name:16s}" + "".join(f" {m:10.1f}" for m in medians) + f" {total:10.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a GGUF model: its one-token calls cool the caches, its vocabulary sizes the rows")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--top-k", type=int, default=40)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--prompt", default="def fibonacci(n):\n    ", help="the text before the greedy row (raw)")
    args = ap.parse_args()
    s = SamplerSettings(temperature=args.temperature, top_k=args.top_k)
    sampled, greedy, near_top = measure(args.model, args.rounds, s, args.prompt)
    print(f"a sampled row's host work, microseconds (median of {args.rounds}; cold: right after a model call)")
    table(sampled, PARTS)
    print()
    print(
        f"a greedy draft row's under auto, the model's own row ({100 * near_top:.1f}% of its logits within 20 "
        "of the top), microseconds (the same)"
    )
    table(greedy, GREEDY_PARTS)


if __name__ == "__main__":
    main()
