"""How much slower the loop's host work runs after the CPU was busy elsewhere or idle: the
same small piece of work (an argmax over 64 floats, then one over a 152k-float logits row, and a
few Python statements) timed warm, after the thread spun or slept for a while, and after a
llama.cpp call. The small argmax runs first: it reads next to nothing, so what it costs beyond its
warm price is numpy's own code and data coming back into the caches, and the row's argmax after
it is then what reading the row costs.

    python benchmarks/cache_cooling.py [MODEL.gguf] [--rounds 60]

On a machine of one's own, a thread that spins for 20 ms keeps its caches and the work costs
what it costs warm; on a shared virtual machine other tenants evict them meanwhile. A GPU's call
leaves the CPU waiting like the spin does, so "after a spin" is what the loop pays between GPU
calls on that machine, and "after a llama.cpp call" what it pays between CPU calls, which stream
the weights through the caches as well.
"""

import argparse
import statistics
import time

import numpy as np

GAPS_MS = (0.1, 1.0, 5.0, 20.0, 50.0)
N_VOCAB = 151936  # the default pair's (Qwen2.5) vocabulary
SMALL = np.random.default_rng(1).random(64, dtype=np.float32)


def host_work(row: np.ndarray) -> tuple[float, float, float]:
    """Microseconds of (an argmax over 64 floats, an argmax over the row, a few Python statements of
    the kind a step runs)."""
    start = time.perf_counter_ns()
    int(np.argmax(SMALL))
    small = time.perf_counter_ns()
    token = int(np.argmax(row))
    middle = time.perf_counter_ns()
    step = {"tokens": [token], "accepted": 0, "source": "none"}
    step["tokens"].append(token + 1)
    _ = sum(step["tokens"]) + len(step) + step["accepted"]
    end = time.perf_counter_ns()
    return (small - start) / 1e3, (middle - small) / 1e3, (end - middle) / 1e3


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def measure(rounds: int, model_path: str | None) -> dict[str, list[tuple[float, float, float]]]:
    row = np.random.default_rng(0).random(N_VOCAB, dtype=np.float32)
    settings: dict[str, object] = {"warm": None}
    settings.update({f"after a {ms:g} ms spin": ("spin", ms / 1e3) for ms in GAPS_MS})
    settings.update({f"after a {ms:g} ms sleep": ("sleep", ms / 1e3) for ms in GAPS_MS})
    decode = None
    if model_path:
        from specllm.llama.model import Model

        model = Model(model_path)
        prompt = model.tokenize("def fibonacci(n):\n    ")
        model.sync(prompt[:-1])

        def decode() -> np.ndarray:  # the prompt's last token, then back: every call is the same
            logits = model.eval(prompt[-1:], 1)[0]
            model.truncate(len(prompt) - 1)
            return logits

        settings["after a one-token llama.cpp call"] = ("decode", 0.0)
    times: dict[str, list[tuple[float, float, float]]] = {name: [] for name in settings}
    for _ in range(rounds):
        for name, how in settings.items():
            target = row
            host_work(row)  # the same work just ran: caches warm
            if how is not None:
                kind, seconds = how
                if kind == "spin":
                    spin(seconds)
                elif kind == "sleep":
                    time.sleep(seconds)
                elif decode is not None:
                    target = decode()
            times[name].append(host_work(target))
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", help="a GGUF model: also time the work after a one-token call of it")
    ap.add_argument("--rounds", type=int, default=60)
    args = ap.parse_args()
    times = measure(args.rounds, args.model)
    print(f"host work, microseconds (median of {args.rounds}, p10-p90)")
    columns = ("argmax of 64 floats", "then argmax of a row", "Python statements")
    print(f"{'':36s}" + "".join(f" {c:>22s}" for c in columns))
    for name, samples in times.items():
        cells = []
        for part in range(len(columns)):
            values = sorted(s[part] for s in samples)
            p10, p90 = values[len(values) // 10], values[(9 * len(values)) // 10]
            cells.append(f"{statistics.median(values):7.1f} ({p10:5.1f}-{p90:5.1f})")
        print(f"{name:36s}" + "".join(f" {c:>22s}" for c in cells))


if __name__ == "__main__":
    main()
