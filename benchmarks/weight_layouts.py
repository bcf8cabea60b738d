"""What llama.cpp's repacked CPU weight layouts buy: one model loaded twice, with its extra layouts
(as specllm loads it where llama.cpp's AMX kernels are not built in) and in the plain layout alone
(as where they are), prompt and decoding speed timed in alternating rounds in one process.

    python benchmarks/weight_layouts.py MODEL.gguf [--rounds 4] [--tokens 48]

Run it with a build without AMX kernels (scripts/setup.sh makes one): with them, the first
layout would be AMX's, which crashes on some machines.
"""

import argparse
import statistics
import time

import specllm.llama.model as model_module
from specllm.llama.devices import amx_built_in

PROMPT = "def quicksort(items):\n    " * 8


def load(path: str, extra_layouts: bool) -> model_module.Model:
    """The model with or without llama.cpp's extra layouts, whatever the build (_load_model asks)."""
    model_module.amx_built_in = lambda: not extra_layouts
    try:
        return model_module.Model(path)
    finally:
        model_module.amx_built_in = amx_built_in


def one_round(model: model_module.Model, prompt: list[int], tokens: int) -> tuple[float, float]:
    """(prompt tokens per second, decoded tokens per second), greedy, from an empty cache."""
    model.truncate(0)
    start = time.perf_counter()
    token = int(model.eval(prompt, 1)[0].argmax())
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(tokens):
        token = int(model.eval([token], 1)[0].argmax())
    return len(prompt) / prefill, tokens / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=48)
    args = ap.parse_args()
    if amx_built_in():
        raise SystemExit("this llama.cpp has its AMX kernels built in: rebuild it with scripts/setup.sh first")
    models = {"repacked where it gains": load(args.model, True), "plain": load(args.model, False)}
    prompt = models["plain"].tokenize(PROMPT)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, model in models.items():
            times[name].append(one_round(model, prompt, args.tokens))
    print(f"{len(prompt)}-token prompt, {args.tokens} tokens decoded, {args.rounds} alternating rounds (median, range)")
    for name, samples in times.items():
        cells = []
        for part, what in ((0, "prompt"), (1, "decode")):
            values = [s[part] for s in samples]
            cells.append(f"{what} {statistics.median(values):6.1f} tok/s ({min(values):.1f}-{max(values):.1f})")
        print(f"{name:24s} " + "   ".join(cells))


if __name__ == "__main__":
    main()
