"""What a grammar's check of a whole vocabulary costs, narrowed by first bytes (Grammar.allowed)
against llama.cpp's grammar sampler asked about every token (Grammar._allowed), in each state along
a JSON text: the check sampling.masked makes where fewer than top-k tokens are allowed (a JSON
object's first token, after a key, between values), and for every row without top-k. Both answers
are compared in every state; the times are the median of --repeats, the two alternating.

    python benchmarks/grammar_mask.py MODEL.gguf [--repeats 5]

With no model, the default pair's target (pulled on first use).
"""

import argparse
import statistics
import time

import numpy as np

from specllm.llama.grammar import Grammar, _prefixes, schema_grammar
from specllm.llama.model import Model
from specllm.llama.options import ModelOptions

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "languages": {"type": "array", "items": {"type": "string"}},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "languages", "active"],
}
TEXT = '{"name": "Ada Lovelace", "age": 36, "languages": ["Python", "C++"], "active": true}'
FEW = 1000  # states with at most this many tokens allowed: the structure's, not a string's


def timed(check, ids: np.ndarray) -> tuple[float, np.ndarray]:
    start = time.perf_counter()
    answer = check(ids)
    return time.perf_counter() - start, answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    path = args.model
    if path is None:
        from specllm.models.hub import resolve_models

        path = str(resolve_models(progress=False)[0])
    model = Model(path, ModelOptions(n_ctx=256))
    start = time.perf_counter()
    _prefixes(model)
    print(f"{model.path.name}: {model.n_vocab} tokens; probes found in {time.perf_counter() - start:.2f} s (once)")
    everything = np.arange(model.n_vocab)
    state = Grammar(model, schema_grammar(SCHEMA))
    rows = []
    tokens = model.tokenize(TEXT, add_special=False)
    if model.detokenize(tokens) != TEXT.encode():  # a SentencePiece vocabulary's space before it
        tokens = tokens[1:]
    for token in tokens:
        whole, narrowed = [], []
        for _ in range(args.repeats):
            t, expected = timed(state._allowed, everything)
            whole.append(t)
            t, answer = timed(state.allowed, everything)
            narrowed.append(t)
            assert (answer == expected).all()
        rows.append((int(expected.sum()), statistics.median(whole), statistics.median(narrowed)))
        state.accept(token)
    print(f"{'allowed':>8} {'every token':>12} {'narrowed':>9}")
    for allowed, whole_s, narrowed_s in rows:
        print(f"{allowed:8} {whole_s * 1e3:9.1f} ms {narrowed_s * 1e3:6.2f} ms")
    for label, group in (("few allowed", [r for r in rows if r[0] <= FEW]), ("many", [r for r in rows if r[0] > FEW])):
        if group:
            whole_ms = statistics.median(r[1] for r in group) * 1e3
            narrowed_ms = statistics.median(r[2] for r in group) * 1e3
            print(
                f"{label} ({len(group)} states): every token {whole_ms:.1f} ms, narrowed {narrowed_ms:.2f} ms (medians)"
            )
    model.close()


if __name__ == "__main__":
    main()
