"""Per-step Python time outside llama.cpp, and resident memory, for one generation.

    python benchmarks/overhead.py TARGET.gguf [DRAFT.gguf] [--drafter model] [--gamma 4] [-n 128]

Every llama.cpp call the engine makes (decode, logits, KV cut) is timed; what is left of the
decode time is the speculative loop's own Python/numpy work.
"""

import argparse
import os
import resource
import time

import llama_cpp

import specllm

PROMPT = "Write a Python function that parses an ISO 8601 date string and returns a datetime."


def timed(name, spent):
    original = getattr(llama_cpp, name)

    def wrapper(*args):
        start = time.perf_counter()
        try:
            return original(*args)
        finally:
            spent[0] += time.perf_counter() - start

    setattr(llama_cpp, name, wrapper)


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("target")
    ap.add_argument("draft", nargs="?")
    ap.add_argument("--drafter", default=None)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    args = ap.parse_args()
    drafter = args.drafter or ("model" if args.draft else "ngram")
    spent = [0.0]
    for name in ("llama_decode", "llama_get_logits", "llama_memory_seq_rm"):
        timed(name, spent)
    engine = specllm.load(args.target, args.draft, n_ctx=2048)
    after_load = rss_mib()
    prompt = engine.prompt_tokens(PROMPT, chat=True)
    engine.generate(prompt, max_tokens=8, temperature=args.temperature, drafter=drafter, gamma=args.gamma)  # warm-up
    spent[0] = 0.0
    start = time.perf_counter()
    result = engine.generate(prompt, max_tokens=args.n, temperature=args.temperature, drafter=drafter, gamma=args.gamma, seed=0)
    total = time.perf_counter() - start
    s = result.stats
    steps = s.target_calls
    print(f"drafter {drafter} gamma {args.gamma} temperature {args.temperature}: {s.generated_tokens} tokens, "
          f"{steps} target calls, {s.draft_calls} draft calls, {s.tokens_per_second:.1f} tok/s")
    print(f"time in llama.cpp calls: {spent[0]:.3f}s of {total:.3f}s")
    print(f"Python/numpy outside llama.cpp: {1000 * (total - spent[0]) / steps:.2f} ms per step, "
          f"{100 * (total - spent[0]) / total:.2f}% of the run")
    print(f"resident memory: {after_load:.0f} MiB after loading, {rss_mib():.0f} MiB after generating "
          f"(model files: {sum(os.path.getsize(p) for p in (args.target, args.draft) if p) / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main()
