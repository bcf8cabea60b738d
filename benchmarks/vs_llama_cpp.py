"""specllm against llama.cpp's own speculative loop, side by side in one run.

    python benchmarks/vs_llama_cpp.py [--bin DIR] [--gamma 4] [-n 128] [--rounds 2]

DIR holds llama-speculative-simple, as built by shared/tools/build-llama-cpp-tools.sh from the
llama.cpp sources of the installed llama-cpp-python (default: ~/.cache/specllm-anchor/VERSION/bin).
Both run the default pair with the same raw prompts (no chat template), draft length, threads and
greedy sampling; prompts alternate between the two so machine noise hits both alike. Reported:
decode tokens/s of each and their ratio, with target-only decoding through specllm for reference.
"""

import argparse
import re
import statistics
import subprocess
from pathlib import Path

import llama_cpp

import specllm
from specllm.backend import physical_cores
from specllm.hub import resolve_models

PROMPTS = [
    "Write a Python function that checks whether a number is prime, with a docstring and type hints.",
    "Write a C function that reverses a singly linked list in place.",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Explain in a few sentences what a hash map is and when to use one.",
]
SPEED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s")


def cpp_speculative(binary: Path, target, draft, prompt, gamma, n, threads) -> float:
    out = subprocess.run(
        [str(binary), "-m", str(target), "-md", str(draft), "--spec-type", "draft-simple",
         "-t", str(threads), "-td", str(threads), "--spec-draft-n-max", str(gamma),
         "--temp", "0", "-n", str(n), "-p", prompt],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    match = SPEED.search(out.stdout + out.stderr)
    if not match:
        raise SystemExit(f"no speed line in the output of {binary.name}")
    return float(match.group(3))


def main():
    ap = argparse.ArgumentParser()
    default_bin = Path.home() / ".cache/specllm-anchor" / llama_cpp.__version__ / "bin"
    ap.add_argument("--bin", type=Path, default=default_bin)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    threads = physical_cores()
    target, draft, _ = resolve_models()
    engine = specllm.load(str(target), str(draft), n_ctx=2048, n_threads=threads)
    engine.generate("warm up", max_tokens=8, temperature=0)
    rows = []
    for r in range(args.rounds):
        for prompt in PROMPTS:
            cpp = cpp_speculative(args.bin / "llama-speculative-simple", target, draft, prompt, args.gamma, args.n, threads)
            kw = dict(max_tokens=args.n, temperature=0, gamma=args.gamma)
            spec = engine.generate(prompt, drafter="model", **kw).stats
            alone = engine.generate(prompt, drafter="none", **kw).stats
            rows.append((cpp, spec.tokens_per_second, alone.tokens_per_second, spec.acceptance_rate))
            print(f"round {r + 1} prompt {PROMPTS.index(prompt) + 1}: llama-speculative-simple {cpp:.2f} tok/s, "
                  f"specllm {spec.tokens_per_second:.2f} tok/s ({spec.tokens_per_second / cpp:.2f}x, "
                  f"acceptance {spec.acceptance_rate:.0%}), specllm target-only {alone.tokens_per_second:.2f} tok/s",
                  flush=True)  # fmt: skip
    cpp, spec, alone = (statistics.median(col) for col in list(zip(*rows))[:3])
    ratio = statistics.median(s / c for c, s, _, _ in rows)
    print(f"\nmedian over {len(rows)} runs (threads {threads}, gamma {args.gamma}, {args.n} tokens, greedy):")
    print(f"  llama-speculative-simple  {cpp:6.2f} tok/s")
    print(f"  specllm --drafter model   {spec:6.2f} tok/s   {ratio:.2f}x llama-speculative-simple (median of ratios)")
    print(f"  specllm --drafter none    {alone:6.2f} tok/s   (target-only)")


if __name__ == "__main__":
    main()
