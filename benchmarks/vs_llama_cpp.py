"""specllm against llama.cpp's own speculative loop, side by side in one run.

    python benchmarks/vs_llama_cpp.py [--bin DIR] [--gamma 4] [-n 128] [--rounds 2]
    python benchmarks/vs_llama_cpp.py --ngram [--bin DIR] [-n 128] [--rounds 2] [--prompts 4,5] [--cpp-huge-pages]

With --ngram: specllm's default (auto) drafting and target-only decoding against llama.cpp's
n-gram speculation (llama-speculative-simple --spec-type ngram-simple | ngram-map-k | ngram-mod,
their default settings: a 12-token key, drafts of up to 48 or 64 tokens) on the grounded prompts of
benchmarks/prompts/grounded.jsonl (edit a given function and return it whole, reorder given rows),
rendered with the target's chat template and given to both as the same text. Also reported: how
many tokens each llama.cpp mode drafted, and llama.cpp's plain decoding (CPP_PLAIN) next to
specllm's target-only: where a mode drafted nothing, its speed is that of llama.cpp's plain loop.
At the end, per prompt: medians over the rounds, auto against llama.cpp's fastest way through
the prompt (the best drafting mode, or plain decoding pooled over every run that drafted nothing).
specllm reads a CPU model's weights into memory on transparent huge pages (specllm/llama/huge_pages.py says why);
llama.cpp memory-maps them by default. --cpp-huge-pages runs llama.cpp with the same memory, so
that what is left between the two is the drafting.

DIR holds llama-speculative-simple, as built by benchmarks/build_llama_cpp_tools.sh from the
llama.cpp sources of the installed llama-cpp-python (default: ~/.cache/specllm-anchor/VERSION/bin).
Both run the default pair with the same raw prompts (no chat template), draft length, threads and
greedy sampling; the two alternate, and which goes first alternates by round, so machine noise hits
both alike. Reported: decode tokens/s of each and their ratio, with target-only decoding through
specllm for reference.

Both loops are also profiled, per step: time in draft-model calls, in the target's verify call, and
outside the model. For the C++ binary a small LD_PRELOAD shim (llama_process_timer.c, compiled here
with `cc` when one is installed) times each llama_process() call; for specllm, llama_decode is timed.
"""

import argparse
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import median

import llama_cpp

import specllm
import specllm.llama.model
from specllm.llama.devices import physical_cores
from specllm.models.hub import resolve_models

PROMPTS = [
    "Write a Python function that checks whether a number is prime, with a docstring and type hints.",
    "Write a C function that reverses a singly linked list in place.",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "Explain in a few sentences what a hash map is and when to use one.",
]
DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s")
HERE = Path(__file__).resolve().parent


@dataclass
class Run:
    """One generation: speed, and its decode time split per step (seconds)."""

    tokens_per_second: float
    steps: int = 0
    drafting: float = 0.0  # draft-model calls that produce draft tokens
    draft_reprocess: float = 0.0  # draft-model calls that re-read the verified batch (C++ only)
    verify: float = 0.0  # target calls
    outside: float = 0.0  # everything else: sampling, bookkeeping, Python

    def per_step_ms(self) -> list[float]:
        parts = (self.drafting, self.draft_reprocess, self.verify, self.outside)
        return [1000 * p / self.steps for p in parts] if self.steps else [float("nan")] * 4


def build_timer(workdir: Path) -> Path | None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None
    lib = workdir / "llama_process_timer.so"
    built = subprocess.run(
        [cc, "-O2", "-shared", "-fPIC", str(HERE / "llama_process_timer.c"), "-o", str(lib), "-ldl"],
        capture_output=True,
    )
    return lib if built.returncode == 0 else None


def cpp_speculative(binary: Path, target, draft, prompt, gamma, n, threads, timer: Path | None) -> Run:
    env = dict(os.environ)
    log = None
    if timer:
        log = timer.with_suffix(".log")
        env.update(LD_PRELOAD=str(timer), LLAMA_TIMER_OUT=str(log))
    out = subprocess.run(
        [
            str(binary),
            "-m",
            str(target),
            "-md",
            str(draft),
            "--spec-type",
            "draft-simple",
            "-t",
            str(threads),
            "-td",
            str(threads),
            "--spec-draft-n-max",
            str(gamma),
            "--temp",
            "0",
            "-n",
            str(n),
            "-p",
            prompt,
        ],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    match = DECODED.search(out.stdout + out.stderr)
    if not match:
        raise SystemExit(f"no speed line in the output of {binary.name}")
    run = Run(float(match.group(3)))
    if log and log.exists():
        _split_cpp_calls(run, log.read_text().split("\n"), float(match.group(2)))
    return run


def _split_cpp_calls(run: Run, lines: list[str], decode_seconds: float) -> None:
    """llama-speculative-simple warms up both models (target first), evaluates the prompt on the
    target, then on the draft. Each step then drafts (draft calls), verifies (one target call) and
    re-evaluates the verified batch on the draft (the draft call right after the target's)."""
    calls = [(ctx, float(seconds)) for ctx, seconds in (line.split() for line in lines if line)]
    target = calls[0][0]
    is_target = [ctx == target for ctx, _ in calls]
    # The prompt is the target call followed by two draft calls: the draft's prompt, then drafting.
    prompt = next(i for i in range(len(calls) - 2) if is_target[i : i + 3] == [True, False, False])
    previous = None
    for ctx, seconds in calls[prompt + 2 :]:
        if ctx == target:
            run.steps += 1
            run.verify += seconds
        elif previous == target:
            run.draft_reprocess += seconds
        else:
            run.drafting += seconds
        previous = ctx
    run.outside = decode_seconds - run.drafting - run.draft_reprocess - run.verify


class DecodeTimer:
    """Times specllm's llama_decode calls that return logits (the prefill returns none)."""

    def __init__(self):
        self.calls: list[tuple[int, float]] = []
        self._decode = specllm.llama.model.L.llama_decode
        specllm.llama.model.L.llama_decode = self._timed

    def _timed(self, ctx, batch):
        start = time.perf_counter()
        status = self._decode(ctx, batch)
        if any(batch.logits[i] for i in range(batch.n_tokens)):
            self.calls.append((ctx, time.perf_counter() - start))
        return status

    def run(self, engine, prompt, **kw) -> Run:
        self.calls.clear()
        result = engine.generate(prompt, **kw)
        stats, target = result.stats, engine.target._ctx
        run = Run(tokens_per_second_as_llama_cpp(result), steps=stats.target_calls)
        run.verify = sum(s for ctx, s in self.calls if ctx == target)
        run.drafting = sum(s for ctx, s in self.calls if ctx != target)
        run.outside = stats.decode_seconds - run.verify - run.drafting
        return run


NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-mod")
# llama.cpp's plain decoding through the same binary (`--spec-type none` is refused by the tool):
# ngram-simple with its largest key, 1024 tokens, looks nothing up before the context holds 1073
# tokens (key + 48-token draft + 1), far more than these prompts and answers, so every step is a
# one-token target call. The run reports 0 tokens drafted, which is checked.
CPP_PLAIN = "cpp-plain"
CPP_RUNS = {t: ["--spec-type", t] for t in NGRAM_TYPES} | {
    CPP_PLAIN: ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "1024"]
}
GROUNDED = HERE / "prompts" / "grounded.jsonl"
DRAFTED = re.compile(r"n_drafted\s*=\s*(\d+)")


# llama.cpp with the memory specllm gives its weights (huge_pages.weights_on_huge_pages): read into the
# process's memory rather than mapped, and glibc's malloc asked to put its large blocks on
# transparent huge pages. llama.cpp has no option of its own for huge pages.
CPP_HUGE_PAGES_ARGS = ["--load-mode", "none"]
CPP_HUGE_PAGES_ENV = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}


def cpp_ngram(
    binary: Path, target, prompt_file: Path, spec_args: list[str], n: int, threads: int, huge_pages: bool = False
) -> tuple[float, int]:
    """Decode tokens/s of llama.cpp's n-gram speculation (default settings of the type that
    `spec_args` names) and how many tokens it drafted; with `huge_pages`, its weights are in memory
    as specllm's are."""
    memory = CPP_HUGE_PAGES_ARGS if huge_pages else []
    out = subprocess.run(
        [
            str(binary),
            "-m",
            str(target),
            *spec_args,
            *memory,
            "-t",
            str(threads),
            "--temp",
            "0",
            "-n",
            str(n),
            "-f",
            str(prompt_file),
        ],
        capture_output=True,
        text=True,
        check=True,
        env=os.environ | CPP_HUGE_PAGES_ENV if huge_pages else None,
    )
    text = out.stdout + out.stderr
    match, drafted = DECODED.search(text), DRAFTED.search(text)
    if not match or not drafted:
        raise SystemExit(f"no speed or n_drafted line in the output of {binary.name} {' '.join(spec_args)}")
    return float(match.group(3)), int(drafted.group(1))


def tokens_per_second_as_llama_cpp(result) -> float:
    """Decode speed counted as llama-speculative-simple counts it: the end-of-generation token is
    one of the tokens decoded (it took a target call like any other), where specllm's stats leave
    it out of the text's tokens. On a 78-token answer that is 1.3%."""
    return (len(result.tokens) + (result.stop_reason == "eos")) / result.stats.decode_seconds


def ngram_comparison(args, binary: Path, threads: int) -> None:
    import json

    prompts = [json.loads(line) for line in GROUNDED.read_text().splitlines() if line.strip()]
    chosen = args.prompts or range(1, len(prompts) + 1)
    if not set(chosen) <= set(range(1, len(prompts) + 1)):  # before loading anything
        raise SystemExit(f"--prompts: numbers from 1 to {len(prompts)}")
    target, draft, _ = resolve_models()
    engine = specllm.load(str(target), str(draft), n_ctx=2048, n_threads=threads, defer_draft=True)
    engine.generate("warm up", max_tokens=8, temperature=0)  # and the auto policy's calibration
    rows = []  # (prompt number, category, {name: tok/s}, {llama.cpp mode: tokens drafted})
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for i in chosen:
                p = prompts[i - 1]
                text = engine.target.render_chat([{"role": "user", "content": p["prompt"]}])
                prompt_file = Path(tmp) / f"prompt{i}.txt"
                prompt_file.write_text(text)
                ids = engine.prompt_tokens(text)
                speeds, drafted = {}, {}
                order = [*CPP_RUNS, "auto", "none"]
                for name in order if r % 2 == 0 else order[::-1]:  # alternate who goes first
                    if name in CPP_RUNS:
                        speeds[name], drafted[name] = cpp_ngram(
                            binary, target, prompt_file, CPP_RUNS[name], args.n, threads, args.cpp_huge_pages
                        )
                        if name == CPP_PLAIN and drafted[name] != 0:
                            raise SystemExit(f"llama.cpp's plain decoding drafted {drafted[name]} tokens")
                    else:
                        result = engine.generate(ids, max_tokens=args.n, temperature=0, drafter=name)
                        speeds[name] = tokens_per_second_as_llama_cpp(result)
                rows.append((i, p["category"], speeds, drafted))
                best = max(NGRAM_TYPES, key=speeds.get)
                print(
                    f"round {r + 1} prompt {i} ({p['category']}): specllm auto {speeds['auto']:.2f}, "
                    f"target-only {speeds['none']:.2f} tok/s ({speeds['auto'] / speeds['none']:.2f}x); "
                    + ", ".join(f"{t} {speeds[t]:.2f} ({drafted[t]} drafted)" for t in NGRAM_TYPES)
                    + f", llama.cpp plain {speeds[CPP_PLAIN]:.2f}"
                    + f"; auto / best llama.cpp ({best}) {speeds['auto'] / speeds[best]:.2f}x",
                    flush=True,
                )
    memory = "in memory on huge pages, as specllm's" if args.cpp_huge_pages else "memory-mapped, its default"
    print(f"\nmedian over {len(rows)} runs (threads {threads}, {args.n} tokens, greedy; llama.cpp's weights {memory}):")
    for cat in [None, *dict.fromkeys(c for _, c, _, _ in rows)]:
        picked = [s for _, c, s, _ in rows if cat is None or c == cat]
        line = "  " + (cat or "all").ljust(14)
        for name in ("none", "auto", *NGRAM_TYPES, CPP_PLAIN):
            line += f" {name} {median(s[name] for s in picked):6.2f}"
        auto_x = median(s["auto"] / s["none"] for s in picked)
        vs_best = median(s["auto"] / max(s[t] for t in NGRAM_TYPES) for s in picked)
        print(line + f"  | auto/target-only {auto_x:.2f}x, auto/best llama.cpp n-gram {vs_best:.2f}x")
    per_prompt_summary(rows)


def per_prompt_summary(rows) -> None:
    """Each prompt's median speed over the rounds, per configuration, and auto against llama.cpp's
    fastest way through that prompt. A mode that drafted nothing did the same work as llama.cpp's
    plain decoding (CPP_PLAIN), so all such runs are pooled into one plain-decoding median: taking
    the fastest of several medians of the same work would pick the luckiest (on a noisy machine
    the maximum of three samples of one thing sits above its typical value). The yardstick is the
    fastest of the drafting modes' medians and that pooled median. The fastest of all modes'
    medians, unpooled, is printed beside it."""
    print("\nper prompt, median tok/s over rounds:")
    for i in sorted({i for i, _, _, _ in rows}):
        runs = [(s, d) for j, _, s, d in rows if j == i]
        med = {name: median(s[name] for s, _ in runs) for name in runs[0][0]}
        drafted = {t: median(d[t] for _, d in runs) for t in NGRAM_TYPES}
        drafting = [t for t in NGRAM_TYPES if drafted[t] > 0]
        plain_names = [CPP_PLAIN, *(t for t in NGRAM_TYPES if t not in drafting)]
        plain = median(s[name] for s, _ in runs for name in plain_names)
        best = max(drafting, key=med.get, default=None)
        if best is None or plain > med[best]:
            best_text, best_speed = f"plain decoding (pooled: {', '.join(plain_names)})", plain
        else:
            best_text, best_speed = f"{best} ({drafted[best]:.0f} drafted)", med[best]
        unpooled = max(NGRAM_TYPES, key=med.get)
        print(
            f"  prompt {i}: auto {med['auto']:6.2f}, target-only {med['none']:6.2f} "
            f"({med['auto'] / med['none']:.2f}x); "
            f"llama.cpp fastest: {best_text} {best_speed:6.2f}: auto {med['auto'] / best_speed:.2f}x; "
            f"plain decoding: llama.cpp {plain:6.2f}, specllm/llama.cpp {med['none'] / plain:.2f}x; "
            f"unpooled fastest mode {unpooled} {med[unpooled]:6.2f}: auto {med['auto'] / med[unpooled]:.2f}x"
        )


def main():
    ap = argparse.ArgumentParser()
    default_bin = Path.home() / ".cache/specllm-anchor" / llama_cpp.__version__ / "bin"
    ap.add_argument("--bin", type=Path, default=default_bin)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ngram", action="store_true", help="auto against llama.cpp's n-gram speculation")
    ap.add_argument(
        "--prompts",
        type=lambda v: [int(x) for x in v.split(",")],
        default=None,
        help="with --ngram: which grounded prompts, e.g. 4,5 (default: all)",
    )
    ap.add_argument(
        "--cpp-huge-pages",
        action="store_true",
        help="with --ngram: give llama.cpp's weights the memory specllm gives its own "
        "(read in, not mapped, on transparent huge pages)",
    )
    args = ap.parse_args()
    threads = physical_cores()
    if args.ngram:
        return ngram_comparison(args, args.bin / "llama-speculative-simple", threads)
    target, draft, _ = resolve_models()
    binary = args.bin / "llama-speculative-simple"
    engine = specllm.load(str(target), str(draft), n_ctx=2048, n_threads=threads)
    engine.generate("warm up", max_tokens=8, temperature=0)
    timer = DecodeTimer()
    kw = dict(max_tokens=args.n, temperature=0, gamma=args.gamma)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        shim = build_timer(Path(tmp))
        for r in range(args.rounds):
            for i, prompt in enumerate(PROMPTS, 1):
                if r % 2 == 0:  # alternate which runs first, so a drift in machine speed favours neither
                    cpp = cpp_speculative(binary, target, draft, prompt, args.gamma, args.n, threads, shim)
                    spec = timer.run(engine, prompt, drafter="model", **kw)
                else:
                    spec = timer.run(engine, prompt, drafter="model", **kw)
                    cpp = cpp_speculative(binary, target, draft, prompt, args.gamma, args.n, threads, shim)
                alone = tokens_per_second_as_llama_cpp(engine.generate(prompt, drafter="none", **kw))
                rows.append((cpp, spec, alone))
                steps = f"; ms per step {sum(cpp.per_step_ms()):.0f} vs {sum(spec.per_step_ms()):.0f}" if shim else ""
                print(
                    f"round {r + 1} prompt {i}: llama-speculative-simple {cpp.tokens_per_second:.2f} tok/s, "
                    f"specllm {spec.tokens_per_second:.2f} tok/s "
                    f"({spec.tokens_per_second / cpp.tokens_per_second:.2f}x), "
                    f"specllm target-only {alone:.2f} tok/s{steps}",
                    flush=True,
                )
    report(rows, threads, args, profiled=shim is not None)


def report(rows, threads, args, profiled: bool) -> None:
    cpp = median(c.tokens_per_second for c, _, _ in rows)
    spec = median(s.tokens_per_second for _, s, _ in rows)
    ratios = sorted(s.tokens_per_second / c.tokens_per_second for c, s, _ in rows)
    ratio = median(ratios)
    print(f"\nmedian over {len(rows)} runs (threads {threads}, gamma {args.gamma}, {args.n} tokens, greedy):")
    print(f"  llama-speculative-simple  {cpp:6.2f} tok/s")
    print(
        f"  specllm --drafter model   {spec:6.2f} tok/s   {ratio:.2f}x llama-speculative-simple "
        f"(median of ratios; range {ratios[0]:.2f}-{ratios[-1]:.2f}x)"
    )
    print(f"  specllm --drafter none    {median(a for _, _, a in rows):6.2f} tok/s   (target-only)")
    if not profiled:
        print("\n(no C compiler found: the per-step profile of llama-speculative-simple is left out)")
        return
    print("\nper step, median ms        drafting  draft re-process   verify  outside the model   total")
    for name, col in (("llama-speculative-simple", 0), ("specllm", 1)):
        parts = [median(row[col].per_step_ms()[j] for row in rows) for j in range(4)]
        print(f"  {name:<24} {parts[0]:9.1f} {parts[1]:17.1f} {parts[2]:8.1f} {parts[3]:18.1f} {sum(parts):7.1f}")
    step_ratio = median(sum(c.per_step_ms()) / sum(s.per_step_ms()) for c, s, _ in rows)
    print(f"  cost of a step, llama-speculative-simple / specllm: {step_ratio:.2f}x (median of ratios)")
    steps = median(c.steps / s.steps for c, s, _ in rows)
    print(f"  steps, llama-speculative-simple / specllm: {steps:.2f} (the C++ loop runs its last step past -n)")


if __name__ == "__main__":
    main()
