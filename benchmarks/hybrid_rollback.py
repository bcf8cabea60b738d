"""What speculation costs on a hybrid target, with and without llama.cpp's recurrent-state snapshots.

    python benchmarks/hybrid_rollback.py [--rounds 3] [--tokens 48] [--threads N]

A rejected draft token has to be taken out of a hybrid target's recurrent state. With snapshots
(n_rs_seq, specllm's `snapshots`) llama.cpp keeps a copy of the state after each token of a verify
call and goes back to one; without them (snapshots=0) specllm saves the state before each verify
call (Model.checkpoint), restores it after a rejection and evaluates the kept tokens again: a
second target call. Snapshots cost memory and the kernels' time to write them; the restore costs a
copy and a call. Which costs more is what this measures.

A synthetic qwen35 target (gated delta net + attention, tests/tiny_models.py, ~65M parameters,
F32: large enough that llama.cpp's compute, not Python, takes the time on a small CPU) and a noisy
copy of it as the draft are written to a temporary folder. The target is loaded twice, with
SNAPSHOTS snapshots and with none, each with its own copy of the draft, and both generate greedily
the same prompts with drafter "model" at each gamma of GAMMAS and target-only ("none"). Each
generation runs in both modes back to back, which goes first alternating by round, so the shared
machine's noise hits both alike; ratios are taken within a round, and their spread over the
rounds is reported. Both modes must give the same tokens and the same drafted and accepted counts
(equal accepted tokens): any difference is reported and makes the exit status 1.
"""

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median

import gguf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import tiny_models as tm  # noqa: E402

import specllm  # noqa: E402
from specllm.llama.devices import physical_cores  # noqa: E402

# Target size: ~65M parameters (259 MB in F32). A one-token target call then takes ~10 ms of llama.cpp
# compute on one core, against 1-3 ms of Python per speculative step (benchmarks/overhead.py).
SHAPE = dict(arch="qwen35", n_embd=640, n_layer=12, n_ff=3 * 640, n_head=4, seed=0)
# At this size the tests' draft noise gives ~70-75% greedy agreement (it is ~80% on the 64-dim models).
DRAFT_NOISE = tm.DRAFT_NOISE
SNAPSHOTS = 8  # the longest gamma below must fit in them
GAMMAS = (2, 4, 8)
CONFIGS = [("none", None)] + [("model", g) for g in GAMMAS]
MODES = ("on", "off")  # snapshots = SNAPSHOTS, snapshots = 0
PROMPTS = ["Hello world", "def return self", "the value of data is"]
STATE_REPEATS = 20  # checkpoint saves and restores timed (the median is reported)


@dataclass
class Tally:
    """One mode and configuration over one round's prompts."""

    generated: int = 0
    seconds: float = 0.0  # decode time only: prefill differs by what the caches held before
    draft_seconds: float = 0.0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0  # steps that took back at least one draft token
    outputs: list = field(default_factory=list)  # (tokens, drafted, accepted) per prompt

    @property
    def tokens_per_second(self) -> float:
        return self.generated / self.seconds

    @property
    def target_ms_per_step(self) -> float:
        """Everything but drafting: the verify call, the rollback and the loop's own work."""
        return 1000 * (self.seconds - self.draft_seconds) / self.steps


def write_models(folder: Path) -> tuple[Path, Path]:
    target = tm.write_model(folder / "target.gguf", **SHAPE)
    draft = tm.write_model(folder / "draft.gguf", **SHAPE, noise=DRAFT_NOISE, noise_seed=1)
    return target, draft


def parameters(path: Path) -> int:
    return sum(int(t.n_elements) for t in gguf.GGUFReader(path).tensors)


def generate(engine, prompt: str, drafter: str, gamma, tokens: int, tally: Tally) -> None:
    """One greedy generation added to `tally`; streamed, to count the steps that rejected."""
    generation = engine.start(prompt, max_tokens=tokens, temperature=0.0, drafter=drafter, gamma=gamma)
    for step in generation:
        if step.accepted < len(step.drafted):
            tally.rejections += 1
    result = generation.result
    s = result.stats
    tally.generated += s.generated_tokens
    tally.seconds += s.decode_seconds
    tally.draft_seconds += s.draft_seconds
    tally.steps += s.target_calls
    tally.drafted += s.n_drafted
    tally.accepted += s.n_accepted
    tally.outputs.append((result.tokens, s.n_drafted, s.n_accepted))


def run_round(engines: dict, tokens: int, flip: bool) -> dict:
    """Every configuration and prompt once in each mode, the two back to back."""
    order = MODES[::-1] if flip else MODES
    tallies = {(mode, config): Tally() for mode in MODES for config in CONFIGS}
    for config in CONFIGS:
        for prompt in PROMPTS:
            for mode in order:
                generate(engines[mode], prompt, *config, tokens, tallies[mode, config])
    return tallies


def draft_agreement(engine, tokens: int) -> float:
    """How often the draft's greedy token is the target's, along the target's own greedy text:
    one batched draft call per prompt reads every position."""
    agree = total = 0
    for prompt in PROMPTS:
        context = engine.prompt_tokens(prompt)
        generated = engine.generate(context, max_tokens=tokens, temperature=0.0, drafter="none").tokens
        logits = engine.draft.sync(context + generated[:-1], n_logits=len(generated))
        agree += sum(int(a == b) for a, b in zip(logits.argmax(axis=1), generated))
        total += len(generated)
    return agree / total


def time_state(model, filler: list[int]) -> tuple[float, float]:
    """Median seconds of one checkpoint save and of one restore (a rewind that goes back past
    what snapshots could undo, to the checkpoint: on a model without snapshots, any rewind)."""
    base = len(model.tokens)
    saves, restores = [], []
    for _ in range(STATE_REPEATS):
        start = time.perf_counter()
        model.checkpoint()
        saves.append(time.perf_counter() - start)
        model.eval(filler, 0)  # move the state on, as a verify call does
        start = time.perf_counter()
        model.truncate(base)  # the restore alone: no token after the checkpoint is kept
        restores.append(time.perf_counter() - start)
        assert len(model.tokens) == base
    return median(saves), median(restores)


def differences(tallies: dict) -> list[str]:
    """Where the two modes did not give the same tokens and counts."""
    out = []
    for config in CONFIGS:
        on, off = tallies["on", config].outputs, tallies["off", config].outputs
        for prompt, a, b in zip(PROMPTS, on, off):
            if a != b:
                out.append(
                    f"{config[0]} gamma {config[1]} on {prompt!r}: drafted/accepted {a[1:]} vs {b[1:]}, "
                    f"tokens {'equal' if a[0] == b[0] else 'differ'}"
                )
    return out


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    """Median, and the range over the rounds."""
    return f"{fmt.format(median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def report(rounds: list[dict]) -> None:
    print(
        "| drafter | gamma | accepted/drafted | steps | rejecting steps | tok/s on | tok/s off | off/on | "
        "on vs target-only | off vs target-only | target ms/step on | off |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for config in CONFIGS:
        first = rounds[0]["on", config]
        speed = {m: [r[m, config].tokens_per_second for r in rounds] for m in MODES}
        alone = {
            m: [r[m, config].tokens_per_second / r[m, CONFIGS[0]].tokens_per_second for r in rounds] for m in MODES
        }
        ms = {m: median(r[m, config].target_ms_per_step for r in rounds) for m in MODES}
        ratio = [off / on for on, off in zip(speed["on"], speed["off"])]
        print(
            f"| {config[0]} | {config[1] or '-'} | {first.accepted}/{first.drafted} | {first.steps} | "
            f"{first.rejections} | {median(speed['on']):.1f} | {median(speed['off']):.1f} | {spread(ratio)} | "
            f"{spread(alone['on'])} | {spread(alone['off'])} | {ms['on']:.1f} | {ms['off']:.1f} |"
        )


def measure(folder: Path, args) -> dict:
    target, draft = write_models(folder)
    # Separate drafts: each engine's draft cache then goes through the same states as the other's.
    engines = {
        mode: specllm.load(
            str(target), str(draft), n_ctx=1024, n_threads=args.threads, snapshots=SNAPSHOTS if mode == "on" else 0
        )
        for mode in MODES
    }
    try:
        agreement = draft_agreement(engines["on"], args.tokens)  # a warm-up of both models, too
        draft_agreement(engines["off"], args.tokens)
        rounds = []
        for i in range(args.rounds):
            start = time.perf_counter()
            rounds.append(run_round(engines, args.tokens, flip=i % 2 == 1))
            print(f"round {i + 1}/{args.rounds}: {time.perf_counter() - start:.0f} s", file=sys.stderr)
        off = engines["off"].target  # no snapshots: every rewind goes to the checkpoint
        save, restore = time_state(off, engines["off"].prompt_tokens(PROMPTS[0])[1:3])
        return dict(
            rounds=rounds,
            agreement=agreement,
            save=save,
            restore=restore,
            state=off.state_bytes,
            size=target.stat().st_size,
            params=parameters(target),
        )
    finally:
        for engine in engines.values():
            engine.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=48, help="tokens generated per prompt")
    # llama.cpp's threads meet at a barrier after every op: on a busy machine give it only the
    # cores that are free, or each call waits for a thread that is not running.
    ap.add_argument("--threads", type=int, default=physical_cores(), help="default: one per physical core")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        m = measure(Path(folder), args)
    rounds, state = m["rounds"], m["state"]
    print(
        f"target: synthetic qwen35, {m['params'] / 1e6:.1f}M parameters ({m['size'] / 2**20:.0f} MiB F32), "
        f"{SHAPE['n_layer']} layers of {SHAPE['n_embd']}; draft: the same plus noise {DRAFT_NOISE} "
        f"(greedy agreement with the target {100 * m['agreement']:.0f}%)"
    )
    print(
        f"{args.threads} threads, {args.rounds} rounds x {len(PROMPTS)} prompts x {args.tokens} tokens, greedy; "
        f"on: snapshots {SNAPSHOTS}, off: snapshots 0 (checkpoint + restore + second target call)"
    )
    print(
        f"recurrent state: {state / 2**20:.2f} MiB; {SNAPSHOTS} snapshots hold {SNAPSHOTS * state / 2**20:.1f} MiB "
        f"more; one checkpoint save {1000 * m['save']:.2f} ms, one restore {1000 * m['restore']:.2f} ms"
    )
    print()
    report(rounds)
    print()
    print(
        "tok/s: medians over the rounds; ratios: median (range over the rounds), each taken within a round. "
        "Counts are of the first round. target ms/step: decode time less drafting, per target call."
    )
    bad = [line for r in rounds for line in differences(r)]
    bad += [
        f"round {i + 1} differs from round 1"
        for i, r in enumerate(rounds[1:], 1)
        if any(r[k].outputs != rounds[0][k].outputs for k in r)
    ]
    for line in bad:
        print(f"MISMATCH: {line}")
    if bad:
        sys.exit(1)
    print("both modes: identical tokens and drafted/accepted counts in every generation")


if __name__ == "__main__":
    main()
