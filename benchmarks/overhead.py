"""The speculative loop's own time per target step (outside llama.cpp), split by part, and
resident memory, for one generation.

    python benchmarks/overhead.py TARGET.gguf [DRAFT.gguf] [--drafter model] [--gamma 4] [-n 128]
        [--temperature 0.8] [--prompt TEXT] [--rounds 3] [--against OTHER_CHECKOUT]

Every llama.cpp function the loop calls is timed (wall time, or with --clock cpu the Python
thread's own CPU time, for a machine busy with other work); what is left of the decode time is the loop's
own Python/numpy work. Its parts are timed exclusively (a part's time excludes the parts it
calls), so they add up to the whole. The timers add about a microsecond per call they wrap when
the caches are warm, and several on the cold caches right after a CPU model's call: so the same
generation runs first without them, and untimed_loop_ms_per_step is the loop's time there, by
specllm's own accounting (the decode time less its models' llama.cpp calls).

With --against, rounds alternate between this checkout and another one (a git worktree of an
earlier commit, say) in fresh processes, so the two versions are compared side by side on the
same noisy machine.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

PROMPT = "Write a Python function that parses an ISO 8601 date string and returns a datetime."
HERE = Path(__file__).resolve()


class Parts:
    """Exclusive wall time per named part: a wrapped call's time minus its wrapped callees'."""

    def __init__(self, clock=time.perf_counter):
        self.clock = clock
        self.seconds: Counter[str] = Counter()
        self._inner: list[float] = []

    def wrap(self, owner, name: str, part: str) -> None:
        original = getattr(owner, name, None)
        if original is None or not callable(original):
            return

        clock = self.clock

        def timed(*args, **kwargs):
            start = clock()
            self._inner.append(0.0)
            try:
                return original(*args, **kwargs)
            finally:
                elapsed = clock() - start
                self.seconds[part] += elapsed - self._inner.pop()
                if self._inner:
                    self._inner[-1] += elapsed

        setattr(owner, name, timed)


def instrument(parts: Parts) -> None:
    import ctypes

    import llama_cpp

    from specllm.engine import drafters, policy, speculative, text
    from specllm.engine import loop as engine
    from specllm.llama import model as backend

    for module in (llama_cpp, backend):  # specllm binds a few functions again
        for name in dir(module):
            if name.startswith("llama_") and isinstance(getattr(module, name), ctypes._CFuncPtr):
                parts.wrap(module, name, "llama.cpp")
    table = {
        "batch filling": [(backend.Model, "_decode"), (backend.Model, "_keep_rows")],
        "logits views": [(backend.Model, "eval")],
        "KV bookkeeping": [(backend.Model, n) for n in ("truncate", "sync", "cached_prefix", "checkpoint", "_rewind")],
        "target rows (argmax, sampling)": [(engine, "sparse_distribution"), (engine._LazyRows, "__getitem__")],
        "p/q rule": [(engine, "verify_greedy"), (engine, "verify_sampled"), (speculative, "residual")],
        "verify call": [(engine._Run, "_verify")],
        "draft rows (argmax, sampling)": [
            (drafters, "candidates"),
            (drafters, "sample"),
            (drafters, "top_probability"),
            (drafters.Sparse, "of"),
        ],
        "drafter": [
            (cls, m)
            for cls in (drafters.ModelDrafter, drafters.NgramDrafter, drafters.AutoDrafter, drafters.NoDrafter)
            for m in ("propose", "observe", "lookup")
        ],
        "policy": [
            (policy.AutoPolicy, m)
            for m in ("choose", "observe_verify", "record_model", "record_step", "model_keep_going")
        ]
        + [(policy.NgramScorer, m) for m in ("propose", "resolve")],
        "events, text": [(engine._Run, "_emit"), (engine._Run, "_draft_text"), (text.TextStream, "push")],
        "stats": [(engine.Stats, "record")],
    }
    for part, targets in table.items():
        for owner, name in targets:
            parts.wrap(owner, name, part)


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(args) -> dict:
    """One generation after a warm-up, in this process."""
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    import specllm

    drafter = args.drafter or ("model" if args.draft else "ngram")
    engine = specllm.load(args.target, args.draft, n_ctx=2048)
    after_load = rss_mib()
    prompt = engine.prompt_tokens(args.prompt, chat=True)
    options = dict(temperature=args.temperature, drafter=drafter, gamma=args.gamma)
    engine.generate(prompt, max_tokens=8, **options)  # warm-up
    # First without the timers: on the cold caches after a llama.cpp call, their own few lines
    # per wrapped call cost microseconds each, which the timed run counts as the loop's.
    untimed = engine.generate(prompt, max_tokens=args.n, seed=0, **options).stats
    if args.untimed_only:
        return {"untimed_loop_ms_per_step": 1000 * untimed.loop_seconds_per_step}
    parts = Parts(clock)
    instrument(parts)
    start = clock()
    result = engine.generate(prompt, max_tokens=args.n, seed=0, **options)
    total = clock() - start
    s, llama = result.stats, parts.seconds.pop("llama.cpp", 0.0)
    loop = total - llama
    steps = s.target_calls
    parts.seconds["loop (the rest)"] = loop - sum(parts.seconds.values())
    return {
        "version": str(Path(specllm.__file__).parent.parent),
        "clock": args.clock,
        "drafter": drafter,
        "gamma": args.gamma,
        "temperature": args.temperature,
        "tokens": s.generated_tokens,
        "target_calls": steps,
        "draft_calls": s.draft_calls,
        "tokens_per_second": s.tokens_per_second,
        "total_ms_per_step": 1000 * total / steps,
        "llama_ms_per_step": 1000 * llama / steps,
        "loop_ms_per_step": 1000 * loop / steps,
        "untimed_loop_ms_per_step": 1000 * untimed.loop_seconds_per_step,
        "parts_ms_per_step": {k: 1000 * v / steps for k, v in parts.seconds.most_common()},
        "text": result.text,
        "rss_mib": {"after_load": after_load, "after_generate": rss_mib()},
    }


def run_in(checkout: Path, argv: list[str]) -> dict:
    # each checkout's own copy of this script: it knows where that checkout keeps the parts it wraps
    result = run_script(checkout / "benchmarks" / "overhead.py", checkout, argv)
    if "untimed_loop_ms_per_step" not in result:  # an older copy: the untimed run needs only specllm's API
        result.update(run_script(HERE, checkout, [*argv, "--untimed-only"]))
    return result


def run_script(script: Path, checkout: Path, argv: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=str(checkout))
    out = subprocess.run([sys.executable, str(script), *argv, "--json"], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"overhead.py in {checkout} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout)


def report(runs: list[dict]) -> None:
    first = runs[0]
    print(
        f"{first['version']} ({first['clock']} clock): drafter {first['drafter']} gamma {first['gamma']} temperature "
        f"{first['temperature']}: {first['tokens']} tokens, {first['target_calls']} target calls, "
        f"{first['draft_calls']} draft calls ({len(runs)} rounds; median, min-max)"
    )
    for key in (
        "untimed_loop_ms_per_step",
        "loop_ms_per_step",
        "total_ms_per_step",
        "llama_ms_per_step",
        "tokens_per_second",
    ):
        values = [r[key] for r in runs if key in r]  # an older checkout's copy may lack a figure
        if values:
            print(f"  {key:24s} {statistics.median(values):8.3f}  ({min(values):.3f}-{max(values):.3f})")
    print("  loop parts, ms per step (median):")
    for part in first["parts_ms_per_step"]:
        print(f"    {part:32s} {statistics.median(r['parts_ms_per_step'].get(part, 0.0) for r in runs):.3f}")
    print(
        f"  resident memory: {first['rss_mib']['after_load']:.0f} MiB after loading, "
        f"{first['rss_mib']['after_generate']:.0f} MiB after generating"
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("target")
    ap.add_argument("draft", nargs="?")
    ap.add_argument("--drafter", default=None)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--prompt", default=PROMPT, help="the chat prompt to generate from")
    ap.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="cpu: the loop thread's own CPU time, which a busy machine's preemptions do not inflate",
    )
    ap.add_argument("--against", type=Path, help="another checkout to compare with, round by round")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--untimed-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.json:
        print(json.dumps(measure(args)))
        return
    argv = [a for a in sys.argv[1:] if a not in ("--against", str(args.against))]
    checkouts = [HERE.parent.parent] + ([args.against.resolve()] if args.against else [])
    runs: dict[Path, list[dict]] = {c: [] for c in checkouts}
    for _ in range(args.rounds):
        for checkout in checkouts:
            runs[checkout].append(run_in(checkout, argv))
    for checkout in checkouts:
        report(runs[checkout])
    if args.against:
        same = len({r["text"] for rs in runs.values() for r in rs}) == 1
        print(f"outputs identical across versions and rounds: {same}")


if __name__ == "__main__":
    main()
