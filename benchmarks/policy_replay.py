"""How close does auto's n-gram drafting come to what is possible? A replay, free of timing noise.

    python benchmarks/policy_replay.py record OUT.json [--prompts FILE]   # greedy target-only outputs
    python benchmarks/policy_replay.py costs COSTS.json                   # time target calls of every width
    python benchmarks/policy_replay.py replay OUT.json [--costs COSTS.json] [--order-seed N] [--learn-costs]
    python benchmarks/policy_replay.py gpu OUT.json GPU_CHECK.json [--basis calibration|loop|one-token]
    python benchmarks/policy_replay.py pair-costs CHECK.json              # this machine's, in that shape

`record` decodes each prompt (the built-in suite by default) greedily with the default pair's
target, 128 tokens, and saves the prompt and output token ids. `replay` then steps through each
output as speculative decoding would: at each step a policy proposes a copy, the accepted part is
the longest prefix that equals the recorded output (greedy verification is exactly that), and the
step costs T(k + 1) from a cost table: by default the target's entry of specllm's calibration.json
(auto's own calibration: widths 1-5, 8, 12, 16, 32 and those it used since), or one written by `costs`,
which times every width from 1 to 20 and some up to 64, five times each (median). Target-only
costs T(1) per token; the ratio is the modeled speed-up. Policies, each over the same lookup (the
longest earlier repeat of the last 2-3 tokens):

- ngram g=2, g=4: the fixed n-gram drafter (`--drafter ngram --gamma N`);
- auto: specllm's AutoDrafter/AutoPolicy itself, learning as it goes (its costs fixed to the table);
- known curves: drafts the length that maximises E(k)/T(k+1) given the true acceptance curve of the
  prompt's category for the copy's repeat length, measured on these very outputs: the best any
  policy can do that, like auto, decides from the repeat length alone;
- n-gram oracle: drafts exactly the accepted part of the copy (cut where it pays most): the best any
  policy can do with this lookup.

`record` also keeps, for every output position, whether the default pair's draft model, given the
same context, picks the target's token: with greedy decoding that decides every draft exactly (a
draft's j-th token is accepted iff positions i..i+j-1 all match). `gpu` replays the draft model
at fixed draft lengths with a GPU's measured costs from `benchmarks/gpu_check.py`'s JSON: for each
curated pair there, c (draft step / target step) and V(n), with this machine's acceptance. So it
predicts what each pair would gain on that GPU with the default pair's acceptance, which stands in
for the larger pairs' (their weights are not here). `pair-costs` writes this machine's costs for
the default pair in the same shape, so the model can be checked against `specllm bench` here.

Timing noise is absent, so small differences between policies are real here (in the model).
With --learn-costs, auto starts from the widths its calibration times (calibration.TARGET_WIDTHS)
and learns each other width when it first uses it, as the engine does: widths it never tried are
priced by CostTable's rule for unmeasured widths, which decides whether long copies are tried.
"""

import argparse
import json
import random
import sys
from collections import defaultdict
from pathlib import Path

from specllm.engine.calibration import TARGET_WIDTHS, cache_path
from specllm.engine.drafters import AutoDrafter, Draft, NgramDrafter
from specllm.engine.policy import MATCH_EDGES, NGRAM_MAX, AutoPolicy, CostTable, bucket

MAX_TOKENS = 128


def record(out: Path, prompts_file: str | None) -> None:
    import specllm
    from specllm.bench.runner import builtin_prompts, load_prompts
    from specllm.models.hub import resolve_models

    prompts = load_prompts(prompts_file) if prompts_file else builtin_prompts()
    target, draft, _ = resolve_models(None, None, None, check=False)
    engine = specllm.load(str(target), str(draft) if draft else None)
    rows = []
    for p in prompts:
        tokens = engine.prompt_tokens(p.prompt, chat=True)
        result = engine.generate(tokens, max_tokens=MAX_TOKENS, temperature=0.0, drafter="none")
        row = {"category": p.category, "prompt": tokens, "output": list(result.tokens)}
        if engine.draft is not None and result.tokens:
            row["draft_matches"] = draft_matches(engine.draft, tokens, list(result.tokens))
        rows.append(row)
        print(f"{p.category}: {len(tokens)} prompt tokens, {len(result.tokens)} generated", file=sys.stderr)
    out.write_text(json.dumps(rows))


def draft_matches(draft, prompt: list[int], output: list[int]) -> list[bool]:
    """Whether the draft model's greedy token after prompt + output[:i] is output[i], for every i:
    one call over the whole output (teacher forcing), as a greedy draft would see each context."""
    draft.truncate(0)
    logits = draft.eval(prompt + output[:-1], len(output))
    return [int(row.argmax()) == token for row, token in zip(logits, output)]


COST_WIDTHS = (*range(1, 21), 24, 28, 32, 40, 48, 64)


def measure_costs(out: Path) -> None:
    import specllm
    from specllm.engine.calibration import time_calls
    from specllm.models.hub import resolve_models

    target, _, _ = resolve_models(None, None, None, check=False)
    engine = specllm.load(str(target))
    context = engine.prompt_tokens("Rename the variable x to y in this code and return it whole. " * 6, chat=True)
    times = time_calls([(engine.target, w) for w in COST_WIDTHS], context, reps=5)
    table = CostTable(times[0], {w: t / times[0] for w, t in zip(COST_WIDTHS[1:], times[1:])})
    out.write_text(json.dumps({"version": 1, "models": {str(target): table.to_dict()}}))


def measure_pair_costs(out: Path) -> None:
    """The default pair's c, the draft's two-token catch-up and the target's V(1..9) on this
    machine, written as gpu_check.json's "pairs" and "calibration" (what `gpu` reads)."""
    import specllm
    from specllm.engine.calibration import time_calls
    from specllm.models.hub import resolve_models

    target, draft, _ = resolve_models(None, None, None, check=False)
    engine = specllm.load(str(target), str(draft))
    context = engine.prompt_tokens("Write a Python function that parses an ISO 8601 date string.", chat=True)
    widths = range(1, 10)
    # one set of rounds for both models: a busy spell of the machine slows both, not one (timed
    # apart, a draft step once read 1.12 target steps on a busy machine)
    times = time_calls([(engine.target, w) for w in widths] + [(engine.draft, 1), (engine.draft, 2)], context, reps=7)
    t, d = times[: len(widths)], times[len(widths) :]
    pair = {"draft": draft.name, "target": target.name, "c": d[0] / t[0], "draft_V2": d[1] / d[0]}
    check = {
        "machine": {"devices": ["this machine"]},
        "calibration": {target.name: {"t1_ms": 1e3 * t[0], "V": {str(w): x / t[0] for w, x in zip(widths, t)}}},
        "pairs": {"default pair": pair},
    }
    out.write_text(json.dumps(check))


def target_markup() -> frozenset[int]:
    from specllm.llama.model import Model
    from specllm.models.hub import resolve_models

    target, _, _ = resolve_models(None, None, None, check=False)
    return Model(target, vocab_only=True).markup_tokens


def target_costs(path: Path) -> CostTable:
    """The target's cost table: the calibration entry with the largest one-token time."""
    models = json.loads(path.read_text())["models"]
    return CostTable.from_dict(max(models.values(), key=lambda d: d["step_seconds"]))


def accepted(draft: list[int], truth: list[int]) -> int:
    n = 0
    for d, t in zip(draft, truth):
        if d != t:
            break
        n += 1
    return n


def replay(drafter, prompt: list[int], output: list[int], costs: CostTable) -> float:
    """Modeled seconds to produce `output` with `drafter` (greedy: the output is the same)."""
    context, i, seconds = list(prompt), 0, 0.0
    while i < len(output):
        budget = min(NGRAM_MAX, len(output) - i - 1)
        draft = drafter.propose(context, budget) if budget > 0 else Draft()
        tokens = draft.tokens[:budget]
        kept = accepted(tokens, output[i:])
        step = costs.seconds(len(tokens) + 1)
        seconds += step
        context += output[i : i + kept + 1]
        i += kept + 1
        drafter.observe(Draft(tokens, None, 0, 0.0, draft.source if tokens else "none"), kept, step, context)
    drafter.finish(context)
    return seconds


class FixedNgram(NgramDrafter):
    def __init__(self, gamma: int, markup: frozenset[int]):
        super().__init__(markup=markup)
        self.gamma = gamma

    def propose(self, context, gamma):
        return super().propose(context, min(gamma, self.gamma))


class _Lookahead(NgramDrafter):
    """Base of the two bounds: the copy auto would see, cut to the length `length()` picks."""

    def __init__(self, costs: CostTable, row: dict, markup: frozenset[int]):
        super().__init__(min_match=0, markup=markup)
        self.costs, self.truth = costs, row["prompt"] + row["output"]  # indexed like the context

    def propose(self, context, gamma):
        repeat, copy = self.lookup(context, min(gamma, NGRAM_MAX))
        k = self.length(repeat, copy, self.truth[len(context) :]) if copy else 0
        return Draft(copy[:k], None, 0, 0.0, "ngram")

    def best(self, expected: list[float]) -> int:
        """The k maximising expected[k] / T(k + 1) (expected[0] = 1: a plain step)."""
        return max(range(len(expected)), key=lambda k: expected[k] / self.costs.seconds(k + 1))


class NgramOracle(_Lookahead):
    def length(self, repeat, copy, truth):
        return self.best([1.0 + k for k in range(accepted(copy, truth) + 1)])


class KnownCurves(_Lookahead):
    """Knows P(accepted >= j | category, repeat bucket) as measured on all the outputs."""

    def __init__(self, costs, row, markup, curves: dict[int, list[int]]):
        super().__init__(costs, row, markup)
        self.curves = curves

    def length(self, repeat, copy, truth):
        seen = self.curves.get(bucket(repeat, MATCH_EDGES), [])
        if not seen:
            return 0
        expected = [1.0]
        for j in range(1, len(copy) + 1):
            expected.append(expected[-1] + sum(a >= j for a in seen) / len(seen))
        return self.best(expected)


def acceptance_curves(rows: list[dict], markup: frozenset[int]) -> dict[str, dict[int, list[int]]]:
    """For each category and repeat bucket: the accepted length of the copy at every position."""
    curves: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        lookup, context, output = NgramDrafter(min_match=0, markup=markup), list(row["prompt"]), row["output"]
        for i, token in enumerate(output):
            repeat, copy = lookup.lookup(context, NGRAM_MAX)
            if copy:
                curves[row["category"]][bucket(repeat, MATCH_EDGES)].append(accepted(copy, output[i:]))
            context.append(token)
    return curves


def replay_all(
    rows: list[dict], costs: CostTable, markup: frozenset[int], learn_costs: bool = False
) -> dict[str, dict[str, float]]:
    """Modeled speed-up over target-only, per policy and category (and "overall"). `markup`: the
    target's control tokens, where every copy stops (as in the engine). With `learn_costs`, auto
    starts from the widths its calibration times and learns every other width when it first uses
    it, as in the engine (the step still costs what the table says); otherwise it knows them all."""
    curves = acceptance_curves(rows, markup)
    if learn_costs:
        policy = AutoPolicy(CostTable(costs.step_seconds, {w: costs.V[w] for w in TARGET_WIDTHS if w in costs.V}))
    else:
        policy = AutoPolicy(CostTable(costs.step_seconds, dict(costs.V)))
        policy.observe_verify = lambda width, seconds: None  # keep the table fixed: it is the model
    makers = {
        "ngram g=2": lambda row: FixedNgram(2, markup),
        "ngram g=4": lambda row: FixedNgram(4, markup),
        "auto": lambda row: AutoDrafter(policy, None, markup),
        "known curves": lambda row: KnownCurves(costs, row, markup, curves[row["category"]]),
        "n-gram oracle": lambda row: NgramOracle(costs, row, markup),
    }
    base: dict[str, float] = defaultdict(float)
    spent: dict[str, dict[str, float]] = {name: defaultdict(float) for name in makers}
    for row in rows:
        base[row["category"]] += len(row["output"]) * costs.seconds(1)
        for name, make in makers.items():
            spent[name][row["category"]] += replay(make(row), row["prompt"], row["output"], costs)
    table = {}
    for name in makers:
        table[name] = {c: base[c] / spent[name][c] for c in base}
        table[name]["overall"] = sum(base.values()) / sum(spent[name].values())
    return table


def model_replay(matches: list[bool], gamma: int, c: float, V: dict[int, float], draft_V2: float = 1.0) -> float:
    """Modeled speed-up over target-only of the draft model at a fixed draft length, greedy, in
    target steps: a step drafts k tokens (k draft steps of c, the first a catch-up call of two
    tokens, costing draft_V2, after a fully accepted draft) and verifies k + 1 (V(k + 1))."""
    i, cost, caught_up = 0, 0.0, True
    while i < len(matches):
        k = min(gamma, len(matches) - i - 1)
        kept = 0
        while kept < k and matches[i + kept]:
            kept += 1
        cost += k * c + (c * (draft_V2 - 1) if k and not caught_up else 0.0) + V[k + 1]
        caught_up = kept < k  # all accepted: the draft has yet to see its last token and the bonus
        i += kept + 1
    return len(matches) / cost


BASES = {
    "calibration": "c and V(n) as the check's calibration timed them",
    "loop": "steady target calls; the draft's one-token calls as they cost after its catch-up call of 2",
    "one-token": "steady target calls; every draft call one token wide (a catch-up of 2 as two calls)",
}


def pair_costs(check: dict, pair: dict, basis: str) -> tuple[float, dict[int, float], float] | None:
    """(c, V(n), draft_V2) of a pair on a basis (BASES). The calibration times each width after
    other widths; on a CUDA GPU that is a call without its captured graph. The check's call
    sequences time steady calls ("1 1 1 1") and a draft's proposal ("2 1 1 1"): a steady verify
    call of n is taken as the calibration's less the graph's saving on a one-token call."""
    cal = check.get("calibration", {})
    costs = cal.get(pair["target"])
    if not costs or pair.get("c") is None:
        return None
    V = {int(n): v for n, v in costs["V"].items()}
    if basis == "calibration":
        return pair["c"], V, pair.get("draft_V2") or 1.0
    sequences = check.get("patterns", {})
    draft, target = sequences.get(pair["draft"]), sequences.get(pair["target"])
    if draft is None or target is None:
        return None
    steady = target["1 1 1 1"]["1"]
    saving = costs["t1_ms"] - steady
    V = {n: max(1.0, (v * costs["t1_ms"] - saving) / steady) for n, v in V.items()}
    if basis == "loop":
        proposal = draft["2 1 1 1"]
        return proposal["1"] / steady, V, proposal["2"] / proposal["1"]
    return draft["1 1 1 1"]["1"] / steady, V, 2.0


def gpu_predictions(rows: list[dict], check: dict, gammas=range(1, 9), basis: str = "calibration") -> dict[str, dict]:
    """For each pair measured by gpu_check: c, and the modeled speed-up at each draft length
    with the recorded acceptance (overall and per category), and the best length, on a basis of
    costs (BASES; pairs without the costs it needs are left out)."""
    traced = [r for r in rows if r.get("draft_matches")]
    if not traced:
        raise SystemExit("the recording has no draft traces: record it again (the default pair has a draft)")
    out = {}
    for name, pair in check.get("pairs", {}).items():
        costs = pair_costs(check, pair, basis)
        if costs is None:
            continue
        c, V, draft_V2 = costs
        speedups = {}
        for g in gammas:
            if g + 1 not in V:
                continue
            by = defaultdict(lambda: [0.0, 0])  # category -> [modeled cost, tokens]
            for r in traced:
                n = len(r["draft_matches"])
                cost = n / model_replay(r["draft_matches"], g, c, V, draft_V2)
                for key in (r["category"], "overall"):
                    by[key][0] += cost
                    by[key][1] += n
            speedups[g] = {key: tokens / cost for key, (cost, tokens) in by.items()}
        best = max(speedups, key=lambda g: speedups[g]["overall"]) if speedups else None
        out[name] = {"c": c, "speedups": speedups, "best_gamma": best}
    return out


def acceptance(rows: list[dict]) -> float:
    matches = [m for r in rows for m in r.get("draft_matches", [])]
    return sum(matches) / len(matches) if matches else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("out", type=Path)
    rec.add_argument("--prompts", help="a prompts .jsonl (default: the built-in suite)")
    costs = sub.add_parser("costs")
    costs.add_argument("out", type=Path)
    rep = sub.add_parser("replay")
    rep.add_argument("recorded", type=Path)
    rep.add_argument("--costs", type=Path, default=None, help="a calibration.json (default: specllm's)")
    rep.add_argument(
        "--order-seed",
        type=int,
        default=None,
        help="replay the prompts shuffled with this seed (auto learns as it goes: the order matters to it)",
    )
    rep.add_argument(
        "--learn-costs",
        action="store_true",
        help="auto knows only the widths its calibration "
        "times and learns the others when it first uses them, as in the engine",
    )
    pair_costs = sub.add_parser("pair-costs")
    pair_costs.add_argument("out", type=Path)
    gpu = sub.add_parser("gpu")
    gpu.add_argument("recorded", type=Path)
    gpu.add_argument("check", type=Path, help="gpu_check.json, as benchmarks/gpu_check.py writes it")
    gpu.add_argument("--basis", choices=list(BASES), default="calibration", help="which call costs (see BASES)")
    args = parser.parse_args()
    if args.command == "gpu":
        rows = json.loads(args.recorded.read_text())
        check = json.loads(args.check.read_text())
        table = gpu_predictions(rows, check, basis=args.basis)
        print(f"{check.get('machine', {}).get('devices')}: the draft model at fixed draft lengths, modeled with the")
        print(
            f"recorded default pair's acceptance ({acceptance(rows):.0%} of positions match); "
            f"costs: {BASES[args.basis]}"
        )
        for name, p in table.items():
            cells = "  ".join(f"g={g} {s['overall']:.2f}x" for g, s in p["speedups"].items())
            print(f"{name:12s} c {p['c']:.2f}  {cells}  best g={p['best_gamma']}")
        return
    if args.command == "record":
        record(args.out, args.prompts)
        return
    if args.command == "pair-costs":
        measure_pair_costs(args.out)
        return
    if args.command == "costs":
        measure_costs(args.out)
        return
    costs = target_costs(args.costs or cache_path())
    print("V(n): " + ", ".join(f"{n}: {v:.2f}" for n, v in sorted(costs.V.items())))
    rows = json.loads(args.recorded.read_text())
    if args.order_seed is not None:
        random.Random(args.order_seed).shuffle(rows)
    table = replay_all(rows, costs, target_markup(), args.learn_costs)
    columns = list(next(iter(table.values())))
    print(f"{'policy':14s}" + "".join(f"{c[:15]:>16s}" for c in columns))
    for name, row in table.items():
        print(f"{name:14s}" + "".join(f"{row[c]:15.3f}x" for c in columns))


if __name__ == "__main__":
    main()
