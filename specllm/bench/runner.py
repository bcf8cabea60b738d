"""`specllm bench`: speculative against target-only decoding on a prompt suite, and why.

The runner only measures and returns plain data (a JSON-ready dict); bench/view.py shows it.
Order of a run, all on the same loaded models:

1. warm-up: a few tokens of each drafter on the first prompt, not counted (weight repacking, page
   faults, caches);
2. calibration: short timed calls on the loaded models give c (draft step / target step) and
   V(n) (target call on n tokens / on 1 token) for n = 1 .. max gamma + 1 (a verify call with k
   draft tokens evaluates k + 1);
3. for each prompt, target-only and then each configuration (drafter, gamma), with the same
   sampler settings and seed; each generation starts from empty KV caches, so prefill is timed
   alike; speeds are decode tokens/s;
4. fidelity (greedy only): each output is compared with target-only token for token; at a
   divergence the speculative run's target calls are replayed, and the divergence is a near-tie
   only if the call that produced it, in the same batch shape, gives the speculative token.

The predicted speedup is E / (k*c + V(k+1)), E the expected tokens per target call, averaged over
the draft lengths k the run actually proposed (an n-gram drafter proposes nothing when it finds no
match; the last steps of a generation propose fewer tokens), with the per-token acceptance alpha
measured in the run.
"""

from __future__ import annotations

import json
import os
import platform
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from specllm.engine.calibration import time_calls
from specllm.engine.loop import Engine, GenerationConfig, Result, Stats, aggregate
from specllm.engine.names import Drafter
from specllm.engine.sampling import SamplerSettings
from specllm.errors import ContextFull, NeedsDraftModel, NoMtpLayers, SpecllmError
from specllm.files import read_text_file, write_text_atomic
from specllm.llama.devices import gpu_layers, physical_cores
from specllm.llama.model import Model, common_prefix
from specllm.llama.options import ALL_LAYERS
from specllm.llama.system import system_info

# How a greedy divergence from target-only output is judged. llama.cpp's logits depend on the
# batch shape: a verify call on several tokens can round differently from a one-token call (with
# the Q4_K_M Qwen2.5-Coder pair on an AVX-512 CPU, by up to ~0.66 logits; on the tiny F32 test
# models by < 7e-3), and where the target's top two tokens are that close a greedy choice can flip.
# A gap threshold cannot tell such a flip from a bug that emits the runner-up (most positions of
# a real model have a runner-up within a logit or two), so the verify call that produced the
# divergent token is replayed exactly: a "near-tie" is a flip the target itself makes in that
# call; a divergence it does not reproduce is a "bug", however close the logits.
NEAR_TIE, BUG = "near-tie", "bug"

# A speedup within this of 1.0 is a draw, not a win: timings on a busy machine move this much.
NOISE = 0.03

# Target-only decoding should take about the same time per token on every prompt (the context
# lengths here change it little). When the slowest prompt's step is this many times the fastest
# (calibration included), something else was using the machine: the speedups are not reliable.
UNSTABLE_SPREAD = 1.5

WARMUP_TOKENS = 16
CALIBRATION_REPS = 5
DEFAULT_CATEGORY = "uncategorized"
DRAFTER_CHOICES = tuple(d for d in Drafter if d is not Drafter.NONE)


# --- prompts ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchPrompt:
    prompt: str  # one user message, rendered with the target's chat template
    category: str = DEFAULT_CATEGORY
    max_tokens: int | None = None  # the prompt file's own limit, which wins over --max-tokens
    suffix: str | None = None  # fill in the middle: `prompt` is the code before the gap, this after it

    def tokens(self, engine: Engine, settings: BenchSettings) -> list[int]:
        """The prompt as the engine gets it: a gap's FIM prompt (with room for this prompt's
        reply), else the message (with the chat template unless the settings say raw)."""
        if self.suffix is not None:
            return engine.infill_prompt(self.prompt, self.suffix, max_tokens=self.reply_tokens(settings)).tokens
        return engine.prompt_tokens(self.prompt, chat=settings.chat)

    def reply_tokens(self, settings: BenchSettings) -> int:
        """The most tokens this prompt generates: its own max_tokens (its author sized the reply,
        a long reasoning or a gap's body), else the bench's --max-tokens."""
        return self.max_tokens or settings.max_tokens


def builtin_prompts() -> list[BenchPrompt]:
    """The suite shipped in the package: code generation, code editing, chat, extraction, math."""
    text = resources.files("specllm.bench").joinpath("prompts.jsonl").read_text(encoding="utf-8")
    return parse_prompts(text, "built-in prompt suite")


def load_prompts(path: str | Path) -> list[BenchPrompt]:
    path = Path(path)
    try:
        text = read_text_file(path, "utf-8-sig")  # a BOM, as some editors write, is no error
    except OSError as e:
        raise SpecllmError(f"cannot read prompts from {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise SpecllmError(f"cannot read prompts from {path}: {e}") from None
    return parse_prompts(text, str(path))


def parse_prompts(text: str, source: str) -> list[BenchPrompt]:
    """JSONL: one object per line with "prompt" and optional "category" and "max_tokens". Blank
    lines are skipped, other keys ignored; every malformed line is reported with its number."""
    prompts, errors = [], []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            prompts.append(_parse_line(line))
        except ValueError as e:
            errors.append(f"line {lineno}: {e}")
    if errors:
        raise SpecllmError(f"{source}: {_malformed(errors)}")
    if not prompts:
        raise SpecllmError(f"{source}: no prompts")
    return prompts


def _malformed(errors: list[str], shown: int = 10) -> str:
    """The malformed lines in one line (an error is one line): the first ten, and how many more."""
    if len(errors) == 1:
        return errors[0]
    more = f"; and {len(errors) - shown} more" if len(errors) > shown else ""
    return f"{len(errors)} malformed lines: " + "; ".join(errors[:shown]) + more


def _parse_line(line: str) -> BenchPrompt:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(obj, dict):
        raise ValueError(f'expected a JSON object with a "prompt", got {type(obj).__name__}')
    prompt = obj.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError('"prompt" must be a non-empty string')
    category = obj.get("category", DEFAULT_CATEGORY)
    if not isinstance(category, str) or not category.strip():
        raise ValueError('"category" must be a non-empty string')
    max_tokens = obj.get("max_tokens")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise ValueError(f'"max_tokens" must be a positive integer, got {max_tokens!r}')
    suffix = obj.get("suffix")
    if suffix is not None and not isinstance(suffix, str):
        raise ValueError(f'"suffix" must be a string, got {type(suffix).__name__}')
    return BenchPrompt(prompt, category.strip(), max_tokens, suffix)


def select_prompts(
    prompts: list[BenchPrompt], categories: Iterable[str] | None = None, per_category: int | None = None
) -> list[BenchPrompt]:
    """Keep the named categories (all when None) and at most per_category prompts of each."""
    if categories:
        wanted = list(dict.fromkeys(categories))
        known = categories_of(prompts)
        unknown = [c for c in wanted if c not in known]
        if unknown:
            raise SpecllmError(
                f"no prompts in categor{'y' if len(unknown) == 1 else 'ies'} "
                f"{', '.join(unknown)}: the suite has {', '.join(known)}"
            )
        prompts = [p for p in prompts if p.category in wanted]
    if per_category is not None:
        if per_category < 1:
            raise SpecllmError(f"prompts per category must be >= 1, got {per_category}")
        seen: Counter[str] = Counter()
        kept = []
        for p in prompts:
            seen[p.category] += 1
            if seen[p.category] <= per_category:
                kept.append(p)
        prompts = kept
    return prompts


def categories_of(prompts: Iterable) -> list[str]:
    return list(dict.fromkeys(p.category for p in prompts))


# --- configurations --------------------------------------------------------------------------


@dataclass(frozen=True)
class Configuration:
    drafter: str  # "none" (target-only), "auto", "model", "mtp" or "ngram"
    gamma: int | None = 0  # auto: None, it chooses each draft's length

    @property
    def name(self) -> str:
        if self.drafter in (Drafter.NONE, Drafter.AUTO):
            return "target-only" if self.drafter == Drafter.NONE else "auto"
        return f"{self.drafter} g={self.gamma}"


BASELINE = Configuration(Drafter.NONE, 0)


def configurations(drafters: Iterable[str], gammas: Iterable[int]) -> list[Configuration]:
    """Every fixed drafter with every gamma, and auto once (it chooses its own draft lengths), in
    the order given ("none" is the baseline, always run)."""
    gammas = list(dict.fromkeys(gammas))
    for g in gammas:
        if isinstance(g, bool) or not isinstance(g, int) or g < 1:
            raise SpecllmError(f"gamma (draft length) must be a positive integer, got {g!r}")
    drafters = [d for d in dict.fromkeys(drafters) if d != Drafter.NONE]
    for d in drafters:
        if d not in DRAFTER_CHOICES:
            raise SpecllmError(f"unknown drafter {d!r}: use {', '.join(DRAFTER_CHOICES)} (target-only always runs)")
    if not drafters or not gammas:
        raise SpecllmError("nothing to compare: give at least one drafter and one gamma")
    return [
        Configuration(d, None) if d == Drafter.AUTO else Configuration(d, g)
        for d in drafters
        for g in (gammas if d != Drafter.AUTO else [None])
    ]


def parse_list(text: str, what: str) -> list[str]:
    items = [s.strip() for s in text.split(",") if s.strip()]
    if not items:
        raise SpecllmError(f"empty {what} list")
    return items


def parse_gammas(text: str) -> list[int]:
    try:
        return [int(s) for s in parse_list(text, "gamma")]
    except ValueError:
        raise SpecllmError(f"--gamma takes comma-separated integers, e.g. 1,2,4,8; got {text!r}") from None


@dataclass(frozen=True)
class BenchSettings:
    configurations: tuple[Configuration, ...]
    max_tokens: int = 128
    sampler: SamplerSettings = SamplerSettings(temperature=0.0, seed=0)
    chat: bool = True
    warmup_tokens: int = WARMUP_TOKENS
    calibration_reps: int = CALIBRATION_REPS
    rounds: int = 1  # times the whole suite is run; every round's runs are added up

    @property
    def max_gamma(self) -> int:
        """The longest fixed draft (4 when only auto runs: calibration still shows V(2..5))."""
        return max((c.gamma for c in self.configurations if c.gamma), default=4)


Progress = Callable[[str, int, int], None]  # (description, completed, total)


# --- one generation --------------------------------------------------------------------------


@dataclass
class PromptRun:
    index: int
    prompt: BenchPrompt
    prompt_tokens: list[int]
    result: Result
    emitted: list[int]  # result.tokens plus the end-of-generation token when it stopped on one
    # (drafted tokens, accepted) per target call: enough to replay the run's target calls
    calls: list[tuple[list[int], int]] = field(default_factory=list)
    round: int = 1
    max_tokens: int = 0  # the most tokens it could generate

    @property
    def steps(self) -> list[tuple[int, int]]:
        """(drafted, accepted) per target call."""
        return [(len(drafted), accepted) for drafted, accepted in self.calls]


def run_one(
    engine: Engine,
    index: int,
    prompt: BenchPrompt,
    config: Configuration,
    settings: BenchSettings,
    max_tokens: int | None = None,
) -> PromptRun:
    """One generation from empty KV caches, collecting each step's draft and acceptance."""
    return run_interleaved([_Running(engine, index, prompt, config, settings, max_tokens)])[0]


def run_side_by_side(
    lanes: dict[Configuration, Engine],
    index: int,
    prompt: BenchPrompt,
    order: list[Configuration],
    settings: BenchSettings,
) -> dict[Configuration, PromptRun]:
    """One generation per configuration, each on its own lane (same weights, own KV caches),
    interleaved step by step: a step of each in `order`, then again. Each generation times only
    its own steps, so a slow spell of a shared machine (tens of milliseconds to seconds) falls on
    every configuration alike, rather than on whichever ran the prompt at that moment."""
    runs = run_interleaved([_Running(lanes[c], index, prompt, c, settings) for c in order])
    return dict(zip(order, runs))


def run_interleaved(running: list[_Running]) -> list[PromptRun]:
    """Take a step of each generation in turn until all have finished (each on its own engine)."""
    active = list(running)
    while active:
        active = [run for run in active if run.advance()]
    return [run.done() for run in running]


class _Running:
    """A generation under way, taken one engine step at a time."""

    def __init__(
        self,
        engine: Engine,
        index: int,
        prompt: BenchPrompt,
        config: Configuration,
        settings: BenchSettings,
        max_tokens: int | None = None,
    ):
        self.index, self.prompt, self.config = index, prompt, config
        self.max_tokens = max_tokens or prompt.reply_tokens(settings)
        gen = GenerationConfig(
            max_tokens=self.max_tokens,
            sampler=settings.sampler,
            drafter=config.drafter,
            gamma=None if config.drafter == Drafter.AUTO else max(config.gamma or 1, 1),
        )
        self.tokens = prompt.tokens(engine, settings)  # a warm-up's shorter reply reads the same prompt
        for model in (engine.target, engine.draft):
            if model is not None:
                model.truncate(0)
        self.generation = engine.start(self.tokens, gen)
        self.calls: list[tuple[list[int], int]] = []
        self.emitted: list[int] = []
        self.result: Result | None = None

    def advance(self) -> bool:
        """Take the next step; False once the generation has finished."""
        step = next(self.generation, None)
        if step is None:
            self.result = self.generation.result
            self.generation.close()  # releases the engine for its next generation at once
            return False
        if step.drafted or step.token != -1:
            self.calls.append((list(step.drafted), step.accepted))
            self.emitted += step.drafted[: step.accepted] + ([step.token] if step.token != -1 else [])
        return True

    def done(self) -> PromptRun:
        result = self.result
        assert result is not None, "done() before the generation finished"
        # The engine stops at the first end-of-generation token and never lists it in result.tokens;
        # keep it here, so an output that stops early is told apart from one that goes on.
        n = len(result.tokens)
        emitted = self.emitted[: n + 1] if result.stop_reason == "eos" else result.tokens
        return PromptRun(
            self.index, self.prompt, self.tokens, result, list(emitted), self.calls, max_tokens=self.max_tokens
        )


# --- calibration -----------------------------------------------------------------------------


def calibrate(engine: Engine, max_n: int, context: list[int], reps: int = CALIBRATION_REPS) -> dict:
    """Time target calls on n = 1..max_n tokens (logits at every position, as a verify call asks)
    and one-token draft calls, on top of `context` in the KV caches; medians over `reps` rounds.
    Every round times every call, so a slow spell of a busy machine spreads over all of them."""
    target, draft = engine.target, engine.draft
    context = context[: max(1, target.n_ctx - max_n - 1)]
    jobs = [(target, n) for n in range(1, max_n + 1)] + ([(draft, 1)] if draft is not None else [])
    times = time_calls(jobs, context, reps)
    t1 = times[0]
    target_times = dict(zip(range(1, max_n + 1), times))
    out = {
        "reps": reps,
        "context_tokens": len(context),
        "target_step_seconds": t1,
        "target_call_seconds": {str(n): t for n, t in target_times.items()},
        "V": {str(n): t / t1 for n, t in target_times.items()},
        "draft_step_seconds": None,
        "c": None,
    }
    if draft is not None:
        out.update(draft_step_seconds=times[-1], c=times[-1] / t1)
    return out


# --- fidelity --------------------------------------------------------------------------------


def reference_logits(target: Model, prompt_tokens: list[int], generated: list[int]) -> np.ndarray:
    """The target's logits for the token after prompt + generated, computed as target-only decoding
    computes them: from an empty KV cache, the prompt but its last token in one batch, then one
    token per call."""
    target.truncate(0)
    target.sync(prompt_tokens[:-1])
    row = None
    for token in [prompt_tokens[-1], *generated]:
        row = target.eval([token], 1)[0]
    return np.array(row, dtype=np.float64)


def replay_logits(
    target: Model, prompt_tokens: list[int], output: list[int], calls: list[tuple[list[int], int]], pos: int
) -> tuple[np.ndarray, dict] | None:
    """The target's logits for output[pos] as the speculative run computed them: its target calls
    replayed from an empty KV cache (the same prefill, then each call on [last token, draft] with
    every row's logits asked for, cut back to what it accepted), up to the call that produced
    position pos; that call's row for it, and where it was (call index, width, row). The KV cache
    then holds what it held in the run, computed in the same batch shapes. None when no call
    produced position pos."""
    target.truncate(0)
    target.sync(prompt_tokens[:-1])
    done = 0  # output tokens before this call
    for index, (drafted, accepted) in enumerate(calls):
        # A draft id the target does not have is rejected without being shown to the target.
        drafted = next((drafted[:i] for i, t in enumerate(drafted) if t >= target.n_vocab), drafted)
        context = prompt_tokens + output[:done]
        logits = target.eval([context[-1], *drafted], len(drafted) + 1)
        if pos <= done + accepted:  # this call emitted output[done .. done + accepted]
            row = pos - done
            return np.array(logits[row], dtype=np.float64), {"index": index, "width": len(drafted) + 1, "row": row}
        target.truncate(len(context) + accepted)
        done += accepted + 1  # the accepted draft tokens and the target's own token
    return None


def check_fidelity(
    target: Model,
    prompt_tokens: list[int],
    reference: list[int],
    candidate: list[int],
    calls: list[tuple[list[int], int]],
) -> dict | None:
    """None when the candidate output equals the reference (target-only) output token for token;
    otherwise the first divergence: its position, both tokens, the target's top-2 gap there and the
    gap between the two competing tokens (both in one-token evaluation), and the verdict. `calls`
    are the candidate run's (drafted tokens, accepted) per target call: the call that produced the
    divergent token is replayed in its batch shape (replay_logits). NEAR_TIE when the target's
    argmax there is the speculative token (llama.cpp's rounding in that shape flipped a close
    call); BUG otherwise: the speculative loop emitted a token its own target call did not pick."""
    if candidate == reference:
        return None
    pos = common_prefix(reference, candidate)
    ref_tok = reference[pos] if pos < len(reference) else None
    cand_tok = candidate[pos] if pos < len(candidate) else None
    logits = reference_logits(target, prompt_tokens, reference[:pos])
    order = np.argsort(logits)[::-1]
    top1, top2 = int(order[0]), int(order[1])
    gap = None
    if ref_tok is not None and cand_tok is not None:
        gap = abs(float(logits[ref_tok] - logits[cand_tok]))
    replayed = replay_logits(target, prompt_tokens, candidate, calls, pos) if gap is not None else None
    batch_argmax = None if replayed is None else int(np.argmax(replayed[0]))

    def piece(tok):
        return None if tok is None else target.piece(tok).decode("utf-8", errors="replace")

    return {
        "position": pos,
        "target_token": ref_tok,
        "speculative_token": cand_tok,
        "target_piece": piece(ref_tok),
        "speculative_piece": piece(cand_tok),
        "top2_gap": float(logits[top1] - logits[top2]),
        "gap": gap,  # |target logit of its own token - that of the speculative token|
        "speculative_rank": None if cand_tok is None else int(np.sum(logits > logits[cand_tok])),
        "reference_argmax": top1,  # != target_token: target-only was not reproduced here either
        "call": None if replayed is None else replayed[1],  # the replayed verify call: index, width, row
        "batch_argmax": batch_argmax,  # the target's choice in that call
        # speculative minus target-only token's logit in that call: > 0 where the call flips them
        "batch_gap": None if replayed is None else float(replayed[0][cand_tok] - replayed[0][ref_tok]),
        "kind": NEAR_TIE if batch_argmax is not None and batch_argmax == cand_tok else BUG,
    }


# --- the bench -------------------------------------------------------------------------------


def run_bench(
    engine: Engine, prompts: list[BenchPrompt], settings: BenchSettings, progress: Progress | None = None
) -> dict:
    """Warm up, calibrate, run target-only and every configuration over `prompts`, check fidelity;
    return everything as a JSON-ready dict: machine, models, settings, calibration (c, V), and per
    configuration its overall, per-category and per-prompt results, then the best configuration."""
    if not prompts:
        raise SpecllmError("no prompts to run")
    if any(c.drafter == Drafter.MODEL for c in settings.configurations) and not engine.has_draft:
        raise NeedsDraftModel()
    if any(c.drafter == Drafter.MTP for c in settings.configurations) and engine.mtp is None:
        raise NoMtpLayers(engine.target.path.name)
    check_prompts_fit(engine, prompts, settings)
    progress = progress or (lambda description, completed, total: None)
    configs = [BASELINE, *settings.configurations]
    total = 2 + len(configs) * len(prompts) * settings.rounds
    done = 0

    progress("warm-up", done, total)
    for drafter in dict.fromkeys(c.drafter for c in configs):
        warm = Configuration(drafter, settings.max_gamma if drafter != Drafter.NONE else 0)
        run_one(engine, 0, prompts[0], warm, settings, max_tokens=settings.warmup_tokens)
    done += 1

    progress("calibration", done, total)
    context = prompts[0].tokens(engine, settings)
    calibration = calibrate(engine, settings.max_gamma + 1, context, settings.calibration_reps)
    done += 1

    runs: dict[Configuration, list[PromptRun]] = {config: [] for config in configs}
    labels = _positions(prompts)
    # Every configuration on a fresh lane, target-only too: no context carries the warm-up's or
    # the calibration's history into the comparison.
    lanes = {config: engine.lane() for config in configs}
    try:
        for round_ in range(1, settings.rounds + 1):
            # auto starts every round knowing only its costs, as a new engine would: each round
            # measures the same thing, and the warm-up teaches it nothing about the first prompt.
            for policy in {id(e.policy): e.policy for e in lanes.values() if e.policy is not None}.values():
                policy.forget_acceptance()
            # Prompt by prompt, every configuration side by side, step by step. Odd rounds go
            # backwards, so no configuration always steps first.
            order = configs if round_ % 2 else configs[::-1]
            where = f" · round {round_}/{settings.rounds}" if settings.rounds > 1 else ""
            for i, prompt in enumerate(prompts):
                progress(f"{labels[i]}{where}", done, total)
                for config, run in run_side_by_side(lanes, i, prompt, order, settings).items():
                    run.round = round_
                    runs[config].append(run)
                done += len(configs)
    finally:
        for lane in lanes.values():
            lane.close()
    progress("fidelity", done, total)

    baseline = runs[BASELINE]
    greedy = settings.sampler.greedy
    divergences: dict[Configuration, list[dict | None]] = {}
    for config in settings.configurations:
        if greedy:
            divergences[config] = [
                check_fidelity(engine.target, run.prompt_tokens, ref.emitted, run.emitted, run.calls)
                for ref, run in zip(baseline, runs[config])
            ]
    progress("done", total, total)

    results = []
    for config in configs:
        results.append(_config_results(config, runs[config], baseline, calibration, divergences.get(config), greedy))
    best = _best(results, calibration)
    return {
        "machine": machine_info(engine),
        "models": {"target": model_info(engine.target), "draft": model_info(engine.draft) if engine.draft else None},
        "settings": _settings_json(settings, prompts),
        "calibration": calibration,
        "c": calibration["c"],
        "V": calibration["V"],
        "timing_check": timing_check(baseline, calibration),
        "results": results,
        "best": best,
    }


def check_prompts_fit(engine: Engine, prompts: list[BenchPrompt], settings: BenchSettings) -> None:
    """Refuse a prompt longer than the context (or a gap the model cannot fill) before anything
    runs, and say which one: found when its turn came, it would throw away every result
    measured before it."""
    n_ctx = engine.target.n_ctx
    for i, prompt in enumerate(prompts):
        n = len(_tokens_of(engine, i, prompt, settings))
        if n >= n_ctx:
            start = prompt.prompt[:40] + ("…" if len(prompt.prompt) > 40 else "")
            raise ContextFull(n, n_ctx, what=f"prompt {i + 1} ({prompt.category}: {start!r})")


def _tokens_of(engine: Engine, i: int, prompt: BenchPrompt, settings: BenchSettings) -> list[int]:
    """A prompt's tokens, or the error that says which prompt has none (a gap for a model
    without fill-in-the-middle tokens)."""
    try:
        return prompt.tokens(engine, settings)
    except SpecllmError as e:
        raise SpecllmError(f"prompt {i + 1} ({prompt.category}): {e}") from None


def _positions(prompts: list[BenchPrompt]) -> list[str]:
    """'chat 2/4' for each prompt: its category and its place among that category's prompts."""
    per_category = Counter(p.category for p in prompts)
    seen: Counter[str] = Counter()
    labels = []
    for p in prompts:
        seen[p.category] += 1
        labels.append(f"{p.category} {seen[p.category]}/{per_category[p.category]}")
    return labels


def timing_check(baseline: list[PromptRun], calibration: dict) -> dict:
    """Was the machine quiet? Compare the target-only step time across prompts and calibration."""
    steps = [
        r.result.stats.decode_seconds / r.result.stats.target_calls for r in baseline if r.result.stats.target_calls
    ]
    every = steps + [calibration["target_step_seconds"]]
    spread = max(every) / min(every) if min(every) > 0 else float("inf")
    return {
        "target_only_step_seconds": steps,
        "calibration_step_seconds": calibration["target_step_seconds"],
        "spread": spread,
        "stable": spread <= UNSTABLE_SPREAD,
    }


def _config_results(config, runs, baseline, calibration, divergences, greedy) -> dict:
    out = {
        "configuration": config.name,
        "drafter": config.drafter,
        "gamma": config.gamma,
        "overall": _summary(config, runs, baseline, calibration, divergences, greedy),
        "categories": {},
        "prompts": [],
    }
    for cat in categories_of(r.prompt for r in runs):
        idx = [i for i, r in enumerate(runs) if r.prompt.category == cat]
        out["categories"][cat] = _summary(
            config,
            [runs[i] for i in idx],
            [baseline[i] for i in idx],
            calibration,
            None if divergences is None else [divergences[i] for i in idx],
            greedy,
        )
    for i, (run, ref) in enumerate(zip(runs, baseline)):
        s = run.result.stats
        out["prompts"].append(
            {
                "index": run.index,
                "round": run.round,
                "category": run.prompt.category,
                "prompt": run.prompt.prompt,
                "max_tokens": run.max_tokens,  # what it ran with: its own, else --max-tokens
                "text": run.result.text,
                "tokens": run.result.tokens,
                "stop_reason": run.result.stop_reason,
                "stats": s.to_dict(),
                "speedup": _ratio(s.tokens_per_second, ref.result.stats.tokens_per_second),
                "matches": None if config == BASELINE or not greedy else divergences[i] is None,
                "divergence": None if divergences is None else divergences[i],
            }
        )
    return out


def per_token_acceptance(steps: Iterable[tuple[int, int]]) -> float | None:
    """alpha of the paper's i.i.d. model (maximum likelihood): accepted draft tokens over accepted
    tokens plus rejections. Differs from acceptance_rate (accepted / drafted), which also counts
    the tokens after a rejection that were never judged. None where no token was judged (nothing
    was drafted): 0 would read as a draft the target always refuses."""
    accepted = rejections = 0
    for k, a in steps:
        accepted += a
        rejections += a < k
    return accepted / (accepted + rejections) if accepted + rejections else None


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens per target call for draft length k: (1 - alpha^(k+1)) / (1 - alpha)."""
    return float(k + 1) if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def predicted_speedup(steps: list[tuple[int, int]], alpha: float, c: float, V: dict[str, float]) -> float | None:
    """E / (k*c + V(k+1)), averaged over the draft lengths k of the steps actually taken."""
    lengths = Counter(k for k, _ in steps)
    if not lengths:
        return None
    gained = sum(n * expected_tokens(alpha, k) for k, n in lengths.items())
    cost = sum(n * (k * c + V[str(k + 1)]) for k, n in lengths.items())
    return gained / cost


def _draft_cost_ratio(config: Configuration, stats: Stats, calibration: dict) -> float:
    """c for the prediction: the calibrated draft-model step, what an MTP call took in the run, or
    what the n-gram lookup took per drafted token (microseconds: about 0)."""
    if config.drafter == Drafter.MODEL:
        return calibration["c"]
    if config.drafter == Drafter.MTP and stats.draft_calls:
        return stats.draft_seconds / stats.draft_calls / calibration["target_step_seconds"]
    if config.drafter == Drafter.NGRAM and stats.n_drafted:
        return stats.draft_seconds / stats.n_drafted / calibration["target_step_seconds"]
    return 0.0


def _summary(config, runs, baseline, calibration, divergences, greedy) -> dict:
    stats = aggregate(r.result.stats for r in runs)
    base = aggregate(r.result.stats for r in baseline)
    steps = [s for r in runs for s in r.steps]
    out = {
        "prompts": len({r.index for r in runs}),
        "runs": len(runs),
        "stats": stats.to_dict(),
        "speedup": _ratio(stats.tokens_per_second, base.tokens_per_second),
        "round_speedups": _round_speedups(runs, baseline),
        "per_position_acceptance": [
            a / d if d else 0.0 for a, d in zip(stats.accepted_per_position, stats.drafted_per_position)
        ],
        "alpha": None,
        "c": None,
        "predicted_speedup": None,
        "fidelity": None,
    }
    if config.drafter == Drafter.AUTO:  # mixed sources and lengths: no one-formula prediction
        out.update(alpha=per_token_acceptance(steps), chose=stats.source_shares())
    elif config != BASELINE:
        alpha = per_token_acceptance(steps)
        c = _draft_cost_ratio(config, stats, calibration)
        predicted = predicted_speedup(steps, alpha or 0.0, c, calibration["V"])  # (no alpha: no step drafted)
        out.update(alpha=alpha, c=c, predicted_speedup=predicted)
    if config != BASELINE and greedy and divergences is not None:
        out["fidelity"] = _fidelity_summary(runs, divergences)
    return out


def _round_speedups(runs: list[PromptRun], baseline: list[PromptRun]) -> list[float | None]:
    """The speedup of each round on its own: how far they differ is the noise of one round."""
    out = []
    for round_ in sorted({r.round for r in runs}):
        mine = aggregate(r.result.stats for r in runs if r.round == round_)
        base = aggregate(r.result.stats for r in baseline if r.round == round_)
        out.append(_ratio(mine.tokens_per_second, base.tokens_per_second))
    return out


def _fidelity_summary(runs: list[PromptRun], divergences: list[dict | None]) -> dict:
    found = [dict(d, prompt_index=r.index, category=r.prompt.category) for r, d in zip(runs, divergences) if d]
    matched = len(runs) - len(found)
    return {
        "compared": len(runs),
        "matched": matched,
        "fraction": matched / len(runs) if runs else 1.0,
        "near_ties": sum(d["kind"] == NEAR_TIE for d in found),
        "bugs": sum(d["kind"] == BUG for d in found),
        "divergences": found,
    }


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def _best(results: list[dict], calibration: dict) -> dict:
    """The fastest configuration overall, with the numbers that explain it, the fastest per
    category and per drafter, and what is recommended on this machine. A configuration whose
    drafts were never accepted cannot have gained anything: it is not named as a winner."""
    baseline, speculative = results[0], [r for r in results if r["drafter"] != Drafter.NONE]

    top = fastest(speculative, lambda r: r["overall"])
    o = top["overall"]
    quickest = max(speculative, key=lambda r: r["overall"]["speedup"] or 0.0)
    wins = gains(o)
    best = {
        "configuration": top["configuration"],
        "drafter": top["drafter"],
        "gamma": top["gamma"],
        "speedup": o["speedup"],
        "round_speedups": o["round_speedups"],
        "predicted_speedup": o["predicted_speedup"],
        "wins": wins,
        "recommended": top["configuration"] if wins else BASELINE.name,
        "target_only_tokens_per_second": baseline["overall"]["stats"]["tokens_per_second"],
        "tokens_per_second": o["stats"]["tokens_per_second"],
        **(_cost_terms(top, baseline, calibration) if top["drafter"] != Drafter.AUTO else {}),
        # measured faster than the best, with no draft token accepted: its lead is timing noise
        "unaccepted_faster": quickest["configuration"] if quickest is not top else None,
        "by_category": {},
        "by_drafter": {},
        "auto": _auto_against_fixed(speculative),
    }
    for cat in baseline["categories"]:
        r = fastest(speculative, lambda r, cat=cat: r["categories"][cat])
        s = r["categories"][cat]
        best["by_category"][cat] = {
            "configuration": r["configuration"],
            "speedup": s["speedup"],
            "wins": gains(s),
        }
    for drafter in dict.fromkeys(r["drafter"] for r in speculative if r["drafter"] != Drafter.AUTO):
        r = fastest([r for r in speculative if r["drafter"] == drafter], lambda r: r["overall"])
        best["by_drafter"][drafter] = {
            "configuration": r["configuration"],
            "speedup": r["overall"]["speedup"],
            "predicted_speedup": r["overall"]["predicted_speedup"],
            **_cost_terms(r, baseline, calibration),
        }
    return best


def gains(summary: dict) -> bool:
    """A gain beyond the noise: a draft token accepted, a speedup of at least 1 + NOISE overall,
    and no round on its own slower than target-only. How far the rounds' speedups spread is the
    noise the bench measured: a lead that a round reverses is within it. (Asking every round for
    1 + NOISE would make a real gain harder to show the more rounds were run.)"""
    rounds = summary["round_speedups"]
    return (
        summary["stats"]["n_accepted"] > 0
        and (summary["speedup"] or 0.0) >= 1 + NOISE
        and all((x or 0.0) >= 1 for x in rounds)
    )


def fastest(candidates: list[dict], pick: Callable[..., dict]) -> dict:
    """The configuration whose pick (overall, a category) has the highest speedup, among those that
    had a draft token accepted there (any, if none had): one that never had cannot have gained."""
    useful = [r for r in candidates if pick(r)["stats"]["n_accepted"] > 0] or candidates
    return max(useful, key=lambda r: pick(r)["speedup"] or 0.0)


def _auto_against_fixed(speculative: list[dict]) -> dict | None:
    """How auto did against the best fixed configuration, overall and per category, and what it
    chose (the share of steps each source drafted). Only a fixed configuration that had a draft
    token accepted there counts: one that had none did target-only decoding's work, and its speed
    against auto's is timing noise (best_fixed None when there is none)."""
    auto = next((r for r in speculative if r["drafter"] == Drafter.AUTO), None)
    fixed = [r for r in speculative if r["drafter"] != Drafter.AUTO]
    if auto is None:
        return None

    def versus(pick) -> dict:
        mine = pick(auto)["speedup"] or 0.0
        gained = [r for r in fixed if pick(r)["stats"]["n_accepted"] > 0]
        top = fastest(gained, pick) if gained else None
        theirs = (pick(top)["speedup"] or 0.0) if top else None
        return {
            "speedup": mine,
            "chose": pick(auto)["chose"],
            "best_fixed": top["configuration"] if top else None,
            "best_fixed_speedup": theirs,
            "matches_best_fixed": theirs is None or mine >= theirs - NOISE,
            "beats_every_fixed": theirs is None or mine >= theirs + NOISE,  # a lead within the noise is a draw
        }

    return {
        "overall": versus(lambda r: r["overall"]),
        "by_category": {cat: versus(lambda r, cat=cat: r["categories"][cat]) for cat in auto["categories"]},
    }


def _cost_terms(result: dict, baseline: dict, calibration: dict) -> dict:
    """For a configuration at its full draft length k: tokens per target call E(alpha, k), the cost
    of a step k*c + V(k+1) in target steps, the draft cost c that would break even here, and the
    speedup predicted where a verify call costs as much as one token (V = 1, as on a GPU). Next to
    them what the run measured: tokens per target call, and the time of a step in target-only
    steps (so measured speedup = measured_tokens_per_call / measured_step_cost)."""
    k, o = result["gamma"], result["overall"]
    alpha, c = o["alpha"], o["c"] or 0.0
    E = expected_tokens(alpha, k) if alpha is not None else None  # None: nothing was drafted
    V = calibration["V"][str(k + 1)]
    st, bst = o["stats"], baseline["overall"]["stats"]
    base_step = bst["decode_seconds"] / bst["target_calls"] if bst["target_calls"] else 0.0
    step = st["decode_seconds"] / st["target_calls"] if st["target_calls"] else 0.0
    return {
        "alpha": alpha,
        "acceptance_rate": st["acceptance_rate"],  # accepted / drafted: below alpha wherever a draft was cut
        "c": c,
        "k": k,
        "V_verify": V,
        "expected_tokens_per_call": E,
        "step_cost": k * c + V,
        "break_even_c": (E - V) / k if E is not None else None,  # <= 0: even a free draft loses at this k here
        "speedup_if_V_is_1": E / (k * c + 1) if E is not None else None,
        "measured_tokens_per_call": st["mean_accepted_length"],
        "measured_step_cost": step / base_step if base_step else None,
        # steps that drafted anything (an n-gram lookup often finds nothing to propose)
        "drafting_steps": st["drafted_per_position"][0] / st["target_calls"] if st["drafted_per_position"] else 0.0,
    }


# --- machine and models ----------------------------------------------------------------------


def machine_info(engine: Engine) -> dict:
    info = system_info()
    opts = engine.target.options

    def layers(options):
        if not (info["gpu_offload"] or options.rpc):
            return 0
        n = gpu_layers(options)
        return "all" if n == ALL_LAYERS else n

    return {
        "cpu": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "physical_cores": info["physical_cores"],
        "threads": opts.n_threads or physical_cores(),
        "gpu_offload": info["gpu_offload"],
        "target_gpu_layers": layers(opts),
        "draft_gpu_layers": layers(engine.draft.options) if engine.draft else None,
        "target_rpc": list(opts.rpc),
        "draft_rpc": list(engine.draft.options.rpc) if engine.draft else None,
        "devices": info["devices"],
        "platform": platform.platform(),
        "python": platform.python_version(),
        "llama_cpp_python": info["llama_cpp_python"],
        "system_info": info["system_info"],
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def model_info(model: Model) -> dict:
    try:
        size = model.path.stat().st_size
    except OSError:
        size = None
    return {
        "path": str(model.path),
        "name": model.path.name,
        "description": model.describe(),
        "size_bytes": size,
        "n_vocab": model.n_vocab,
        "n_ctx": model.n_ctx,
    }


def _settings_json(settings: BenchSettings, prompts: list[BenchPrompt]) -> dict:
    s = settings.sampler
    return {
        **max_tokens_json(settings, prompts),
        "temperature": s.temperature,
        "top_k": s.top_k,
        "top_p": s.top_p,
        "min_p": s.min_p,
        "seed": s.seed,
        "greedy": s.greedy,
        "chat_template": settings.chat,
        "configurations": [c.name for c in settings.configurations],
        "drafters": list(dict.fromkeys(c.drafter for c in settings.configurations)),
        "gammas": list(dict.fromkeys(c.gamma for c in settings.configurations)),
        "warmup_tokens": settings.warmup_tokens,
        "calibration_reps": settings.calibration_reps,
        "prompts": len(prompts),
        "rounds": settings.rounds,
        "categories": {cat: sum(p.category == cat for p in prompts) for cat in categories_of(prompts)},
    }


def max_tokens_json(settings: BenchSettings, prompts: list[BenchPrompt]) -> dict:
    """--max-tokens, and the most tokens each prompt generates (a prompt's own max_tokens wins)."""
    return {
        "max_tokens": settings.max_tokens,
        "max_tokens_per_prompt": [p.reply_tokens(settings) for p in prompts],
    }


def write_json(results: dict, path: str | Path) -> None:
    """Write the results in one rename: never a half-written file."""
    text = json.dumps(results, indent=1, ensure_ascii=False) + "\n"
    try:
        write_text_atomic(Path(path), text)
    except OSError as e:
        raise SpecllmError(f"cannot write {path}: {e.strerror or e}") from None
