"""An A/A test of bench's lanes: target-only decoding on the engine's first context and on two
fresh lanes, side by side, step by step. Equal configurations should read 1.00x; what they read
instead is the bias (and noise) of the side-by-side measurement itself.

    python benchmarks/lanes_aa.py [--prompts N] [--rounds R] [--tokens T]
"""

import argparse

import specllm
from specllm.bench import runner as b
from specllm.bench.runner import builtin_prompts
from specllm.models.hub import resolve_models


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=5, help="every 4th built-in prompt, up to this many")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=48)
    args = ap.parse_args()
    target, draft, _ = resolve_models(None, None, None, check=False)
    engine = specllm.load(str(target), str(draft), n_ctx=4096, defer_draft=True)
    prompts = builtin_prompts()[::4][: args.prompts]
    settings = b.BenchSettings(configurations=(), max_tokens=args.tokens)
    engine.generate("warm up " * 200, max_tokens=8, temperature=0, drafter="none")
    b.calibrate(engine, 17, engine.prompt_tokens(prompts[0].prompt, chat=True), 2)  # as bench does
    lanes = {"first context": engine, "lane 1": engine.lane(), "lane 2": engine.lane()}
    seconds = dict.fromkeys(lanes, 0.0)
    for r in range(args.rounds):
        for i, prompt in enumerate(prompts):
            order = list(lanes) if (r + i) % 2 == 0 else list(lanes)[::-1]
            runs = b.run_interleaved([b._Running(lanes[name], i, prompt, b.BASELINE, settings) for name in order])
            for name, run in zip(order, runs):
                seconds[name] += run.result.stats.decode_seconds
    for name, s in seconds.items():
        print(f"{name:14s} {s:7.2f} s decoding, {seconds['first context'] / s:.3f}x the first context")


if __name__ == "__main__":
    main()
