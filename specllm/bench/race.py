"""`specllm bench --drafts-for T`: every draft on disk that fits T, measured on this machine, and
the fastest remembered for T (winners.py).

The candidates are those `specllm models --drafts-for T` finds and passes (drafts.candidates).
The target is loaded once and each draft once; every (draft, gamma) and target-only decoding run
on lanes of their own (the same weights, KV caches of their own) over the same few prompts, side by
side, step by step, as `bench` runs its configurations (a slow spell of a shared machine falls on
all of them alike). Each draft is measured with the fixed `model` drafter: what it proposes and
what that costs here, not what the auto policy would make of it. A draft is ranked by its fastest
draft length; the fastest draft whose proposals were accepted at least once wins.
"""

from __future__ import annotations

from dataclasses import dataclass

from specllm.bench.runner import (
    BASELINE,
    BenchPrompt,
    BenchSettings,
    Configuration,
    Progress,
    PromptRun,
    check_prompts_fit,
    machine_info,
    max_tokens_json,
    run_one,
    run_side_by_side,
)
from specllm.engine.loop import Engine, aggregate
from specllm.engine.names import Drafter
from specllm.errors import SpecllmError
from specllm.llama.model import Model
from specllm.llama.options import ModelOptions
from specllm.models.drafts import Candidate

RACE_PROMPTS_PER_CATEGORY = 1  # the built-in suite's five categories: five short prompts
RACE_MAX_TOKENS = 64


@dataclass(frozen=True)
class DraftConfiguration(Configuration):
    """A fixed `model` drafter with one particular draft."""

    draft: str = ""  # the candidate's path (two names can name copies of one file)

    @property
    def name(self) -> str:
        return f"{self.draft} g={self.gamma}"


def race(
    engine: Engine,
    candidates: list[Candidate],
    prompts: list[BenchPrompt],
    settings: BenchSettings,
    draft_options: ModelOptions,
    progress: Progress | None = None,
) -> dict:
    """Measure each candidate at each of the settings' gammas against target-only decoding on
    `engine`'s target (loaded without a draft); a JSON-ready dict, the drafts fastest first."""
    check_prompts_fit(engine, prompts, settings)
    progress = progress or (lambda description, completed, total: None)
    gammas = list(dict.fromkeys(c.gamma for c in settings.configurations))
    drafts, skipped = load_drafts(candidates, draft_options)
    if not drafts:
        raise SpecllmError(f"no draft for {engine.target.path.name} could be loaded: {_reasons(skipped)}")
    candidates = [c for c in candidates if str(c.path) in drafts]
    lanes: dict[Configuration, Engine] = {}
    try:
        lanes[BASELINE] = engine.lane()
        for c in candidates:
            for gamma in gammas:
                config = DraftConfiguration(Drafter.MODEL, gamma, draft=str(c.path))
                lanes[config] = Engine(engine.target.sibling(), drafts[config.draft].sibling())
        runs = _measure(lanes, prompts, settings, progress)
    finally:
        for lane in lanes.values():
            lane.close()
        for draft in drafts.values():
            draft.close()
    return {**_results(engine, candidates, runs, prompts, settings), "skipped": skipped}


def load_drafts(candidates: list[Candidate], options: ModelOptions) -> tuple[dict[str, Model], list[dict]]:
    """Each candidate's model by its path, and the candidates that could not be loaded, each with
    its error: a draft whose context does not fit in the memory the target left, or whose file is
    damaged, is left out of the race, not the end of it."""
    drafts: dict[str, Model] = {}
    skipped = []
    try:
        for c in candidates:
            try:
                drafts[str(c.path)] = Model(c.path, options)
            except SpecllmError as e:
                skipped.append({**c.to_dict(), "error": str(e)})
    except BaseException:  # an interrupt: those loaded are freed
        for draft in drafts.values():
            draft.close()
        raise
    return drafts, skipped


def _reasons(skipped: list[dict]) -> str:
    return "; ".join(f"{s['name']}: {s['error']}" for s in skipped)


def _measure(
    lanes: dict[Configuration, Engine], prompts: list[BenchPrompt], settings: BenchSettings, progress: Progress
) -> dict[Configuration, list[PromptRun]]:
    """A short warm-up on every lane (not counted), then every prompt on every lane side by side,
    the lanes stepping in reverse order every other round."""
    configs = list(lanes)
    total = 1 + len(prompts) * settings.rounds
    progress("warm-up", 0, total)
    for config, lane in lanes.items():
        run_one(lane, 0, prompts[0], config, settings, max_tokens=settings.warmup_tokens)
    runs: dict[Configuration, list[PromptRun]] = {config: [] for config in configs}
    done = 1
    for round_ in range(1, settings.rounds + 1):
        order = configs if round_ % 2 else configs[::-1]
        for i, prompt in enumerate(prompts):
            progress(
                f"prompt {i + 1}/{len(prompts)}"
                + (f" · round {round_}/{settings.rounds}" if settings.rounds > 1 else ""),
                done,
                total,
            )
            for config, run in run_side_by_side(lanes, i, prompt, order, settings).items():
                run.round = round_
                runs[config].append(run)
            done += 1
    progress("done", total, total)
    return runs


def _results(
    engine: Engine, candidates: list[Candidate], runs: dict, prompts: list[BenchPrompt], settings: BenchSettings
) -> dict:
    baseline = runs[BASELINE]
    greedy = settings.sampler.greedy
    measured = {config: _summary(config, config_runs, baseline, greedy) for config, config_runs in runs.items()}
    drafts = []
    for c in candidates:
        mine = sorted(
            (m for config, m in measured.items() if getattr(config, "draft", None) == str(c.path)),
            key=lambda m: -m["tokens_per_second"],
        )
        drafts.append({**c.to_dict(), "best": mine[0], "by_gamma": mine})
    ranked = rank(drafts)
    return {
        "target": {"path": str(engine.target.path), "name": engine.target.path.name},
        "machine": machine_info(engine),
        "settings": {
            "prompts": len(prompts),
            "rounds": settings.rounds,
            **max_tokens_json(settings, prompts),
            "gammas": list(dict.fromkeys(c.gamma for c in settings.configurations)),
            "greedy": greedy,
            "temperature": settings.sampler.temperature,
            "seed": settings.sampler.seed,
        },
        "target_only": measured[BASELINE],
        "drafts": ranked,
        "winner": winner(ranked),
    }


def _summary(config: Configuration, runs: list[PromptRun], baseline: list[PromptRun], greedy: bool) -> dict:
    """One configuration over all its runs: decode speed, speedup over target-only, acceptance,
    and (greedy) how many outputs were target-only's token for token."""
    stats, base = aggregate(r.result.stats for r in runs), aggregate(r.result.stats for r in baseline)
    return {
        "gamma": config.gamma or None,
        "tokens_per_second": stats.tokens_per_second,
        "speedup": stats.tokens_per_second / base.tokens_per_second if base.tokens_per_second else None,
        "acceptance_rate": stats.acceptance_rate,
        "tokens_per_call": stats.mean_accepted_length,
        "n_drafted": stats.n_drafted,
        "n_accepted": stats.n_accepted,
        "generated_tokens": stats.generated_tokens,
        "same_output": sum(r.emitted == b.emitted for r, b in zip(runs, baseline)) if greedy else None,
        "runs": len(runs),
    }


def rank(drafts: list[dict]) -> list[dict]:
    """Fastest first (by each draft's fastest draft length); a draft never accepted goes last,
    however fast its runs were (it can only have sped up by drafting nothing)."""
    return sorted(drafts, key=lambda d: (d["best"]["n_accepted"] == 0, -d["best"]["tokens_per_second"]))


def winner(ranked: list[dict]) -> dict | None:
    """The first ranked draft, if any of its drafts was ever accepted."""
    if not ranked or ranked[0]["best"]["n_accepted"] == 0:
        return None
    top = ranked[0]
    best = top["best"]
    return {
        "path": top["path"],
        "name": top["name"],
        "tokens_per_second": best["tokens_per_second"],
        "speedup": best["speedup"],
        "acceptance": best["acceptance_rate"],
        "gamma": best["gamma"],
        "measured": len(ranked),
    }
