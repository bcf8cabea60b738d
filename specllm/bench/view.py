"""Showing a bench: the progress bar while it runs, then tables, a bar chart and the explanation.
The only module that renders bench results with Rich; bench.py only measures."""

from __future__ import annotations

import contextlib

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from specllm.bench.runner import NEAR_TIE, NOISE
from specllm.engine.text import shown, shown_on_one_line
from specllm.suspend import suspending_cleanly

BAR_WIDTH = 40


class BenchProgress:
    """A progress bar on stderr, as a bench.Progress callback; gone once the bench ends."""

    def __init__(self, console: Console | None = None):
        self.console = console or Console(stderr=True)
        self._progress = Progress(
            TextColumn("{task.description}", markup=False),  # it names a category of the prompts file
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
            disable=not self.console.is_terminal,  # off a terminal a bar is only noise (and a stray newline)
        )
        self._task: TaskID | None = None
        self._ending = contextlib.ExitStack()

    def __enter__(self):
        self._ending.enter_context(self._progress)
        # one row: redrawn after `fg`, it erases its own line only
        self._ending.enter_context(suspending_cleanly(self._progress.stop, self._progress.start))
        return self

    def __exit__(self, *exc):
        return self._ending.__exit__(*exc)

    def __call__(self, description: str, completed: int, total: int) -> None:
        if self._task is None:
            self._task = self._progress.add_task(description, total=total)
        self._progress.update(self._task, description=description, completed=completed, total=total)


# --- formatting --------------------------------------------------------------------------------


def _x(value) -> str:
    return "—" if value is None else f"{value:.2f}x"


def _ms(seconds: float) -> str:
    """Milliseconds with two significant digits at least: a small model's step takes a fraction of one."""
    ms = seconds * 1000
    return f"{ms:.1f}" if ms >= 1 else f"{ms:.2g}"


def _pct(value) -> str:
    return "—" if value is None else f"{value:.0%}"


def _speed_style(speedup) -> str:
    if speedup is None:
        return ""
    if speedup >= 1 + NOISE:
        return "green"
    return "red" if speedup <= 1 - NOISE else "yellow"


def _matched(fidelity) -> Text:
    if fidelity is None:
        return Text("—", style="dim")
    text = f"{fidelity['matched']}/{fidelity['compared']}"
    if fidelity["bugs"]:
        return Text(f"{text} bug", style="bold red")
    if fidelity["near_ties"]:
        return Text(f"{text} tie", style="yellow")
    return Text(text, style="green")


def _positions(summary) -> str:
    return " ".join(f"{p * 100:.0f}" for p in summary["per_position_acceptance"]) or "—"


# --- tables ------------------------------------------------------------------------------------


def header(results: dict) -> Text:
    m, s, models = results["machine"], results["settings"], results["models"]
    draft = models["draft"]["name"] if models["draft"] else "none"
    gpu = f"GPU offload {m['target_gpu_layers']} layers" if m["gpu_offload"] else "no GPU offload (CPU build)"
    if m.get("target_rpc"):
        gpu += f" · target's {m['target_gpu_layers']} layers over RPC on {', '.join(m['target_rpc'])}"
    sampling = "greedy"
    if not s["greedy"]:
        sampling = f"temperature {s['temperature']}, top-k {s['top_k']}, top-p {s['top_p']}, min-p {s['min_p']}"
    lines = [
        f"target {models['target']['name']} ({models['target']['description']}) · draft {draft}",
        f"{m['cpu']} · {m['threads']} thread{'s' * (m['threads'] != 1)} · {gpu}",
        f"{_count(s['prompts'], 'prompt')} in {_count(len(s['categories']), 'category', 'categories')}{_rounds(s)}"
        f" · {sampling} · seed {s['seed']} · {reply_limit(s)} · speeds are decode tokens/s",
    ]
    return Text("\n".join(lines), style="dim")


def reply_limit(s: dict) -> str:
    """ "up to 128 tokens"; where a prompt's own max_tokens differs, the range and that it won."""
    limits = s.get("max_tokens_per_prompt") or [s["max_tokens"]]
    if set(limits) == {s["max_tokens"]}:
        return f"up to {_count(s['max_tokens'], 'token')}"
    low, high = min(limits), max(limits)
    most = f"{low}-{high}" if low != high else str(low)
    return f"up to {most} tokens a prompt (-n {s['max_tokens']}; a prompt's own max_tokens wins)"


def _count(n: int, noun: str, plural: str | None = None) -> str:
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def _rounds(settings: dict) -> str:
    rounds = settings["rounds"]
    return f", {rounds} rounds" if rounds > 1 else ""


def calibration_table(results: dict) -> Table:
    cal = results["calibration"]
    table = Table(
        title=f"Cost on this machine (median of {cal['reps']} calls)", title_justify="left", box=box.SIMPLE_HEAD
    )
    table.add_column("n tokens", justify="right")
    table.add_column("target call, ms", justify="right")
    table.add_column("V(n) = call on n / call on 1", justify="right")
    for n, v in cal["V"].items():
        table.add_row(n, _ms(cal["target_call_seconds"][n]), f"{v:.2f}")
    if cal["c"] is not None:
        table.caption = (
            f"draft step {_ms(cal['draft_step_seconds'])} ms / target step "
            f"{_ms(cal['target_step_seconds'])} ms: c = {cal['c']:.2f}"
        )
    return table


def results_table(results: dict, category: str | None) -> Table:
    """One row per configuration, for one category (None: overall)."""
    pick = (lambda r: r["overall"]) if category is None else (lambda r: r["categories"][category])
    first = pick(results["results"][0])
    title = "Overall" if category is None else category
    table = Table(
        # Text, not markup: a category of the user's prompts file may hold brackets
        title=Text(f"{title} ({first['prompts']} prompt{'s' * (first['prompts'] != 1)})"),
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    table.add_column("config", no_wrap=True)
    for name in ("tok/s", "speedup", "pred.", "accept", "tok/call", "matched"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("per position %", overflow="fold")
    for r in results["results"]:
        s = pick(r)
        st = s["stats"]
        baseline = r["drafter"] == "none"
        table.add_row(
            Text(r["configuration"], style="bold" if baseline else ""),
            f"{st['tokens_per_second']:.1f}",
            Text("1.00x" if baseline else _x(s["speedup"]), style="" if baseline else _speed_style(s["speedup"])),
            "" if baseline else _x(s["predicted_speedup"]),
            "" if baseline else _pct(st["acceptance_rate"] if st["n_drafted"] else None),  # none drafted: none judged
            f"{st['mean_accepted_length']:.2f}",
            "" if baseline else _matched(s["fidelity"]),
            "" if baseline else _positions(s),
        )
    prefill = first["stats"]
    if prefill["prefill_seconds"]:
        table.caption = f"prefill (not in tok/s): {prefill['prefill_tokens'] / prefill['prefill_seconds']:.0f} tok/s"
    auto = next((pick(r) for r in results["results"] if r["drafter"] == "auto"), None)
    if auto is not None:  # what auto chose here
        table.caption = (table.caption + "\n" if table.caption else "") + f"auto drafted with {_mix(auto['chose'])}"
    if category is None:
        table.caption = (table.caption or "") + (
            "\npred.: E / (k·c + V(k+1)) · accept: accepted / drafted · tok/call: tokens per target"
            " call · matched: outputs equal to target-only (tie: near-tie flip) · per position: % accepted at"
            " draft position 1, 2, ..."
        )
    return table


def divergence_table(results: dict) -> Table | None:
    rows = []
    for r in results["results"]:
        fid = r["overall"]["fidelity"]
        for d in fid["divergences"] if fid else []:
            rows.append((r["configuration"], d))
    if not rows:
        return None
    table = Table(
        title="Divergences from target-only output (first differing token)", title_justify="left", box=box.SIMPLE_HEAD
    )
    numbers = ("position", "top-2 gap", "gap", "call row")
    for name in ("configuration", "prompt", "position", "target-only", "speculative", *numbers[1:], "kind"):
        table.add_column(name, justify="right" if name in numbers else "left")
    for config, d in rows:
        kind, call = d["kind"], d["call"]
        table.add_row(
            config,
            Text(f"{d['category']} #{d['prompt_index'] + 1}"),  # Text, not markup: "[/INST]" is a token
            str(d["position"]),
            Text(repr(d["target_piece"]) if d["target_piece"] is not None else "end"),
            Text(repr(d["speculative_piece"]) if d["speculative_piece"] is not None else "end"),
            f"{d['top2_gap']:.3f}",
            "—" if d["gap"] is None else f"{d['gap']:.3f}",
            "—" if call is None else f"{call['row'] + 1} of {call['width']}",
            Text(kind, style="yellow" if kind == NEAR_TIE else "bold red"),
        )
    table.caption = (
        "gaps: in the target's one-token evaluation · call row: where the token was in the verify call"
        " that emitted it · near-tie: that call, replayed in the same batch shape, picks the speculative"
        " token itself (llama.cpp's rounding flipped a close choice); bug: it picks another token"
    )
    return table


def bar_chart(results: dict) -> Table:
    """Overall decode tokens/s of each configuration as horizontal bars, target-only first."""
    rows = [
        (
            r["configuration"],
            r["overall"]["stats"]["tokens_per_second"],
            r["overall"]["speedup"],
            r["drafter"] == "none",
        )
        for r in results["results"]
    ]
    top = max(tps for _, tps, _, _ in rows) or 1.0
    table = Table.grid(padding=(0, 1))
    table.title = "Decode speed, all prompts"
    table.title_justify = "left"
    for _ in range(3):
        table.add_column()
    for name, tps, speedup, baseline in rows:
        cells = tps / top * BAR_WIDTH
        bar = "█" * int(cells) + " ▏▎▍▌▋▊▉"[int((cells % 1) * 8)].strip()
        style = "bold" if baseline else _speed_style(speedup)
        label = f"{tps:.1f} tok/s" + ("" if baseline else f"  {_x(speedup)}")
        table.add_row(Text(name, style="bold" if baseline else ""), Text(bar.ljust(BAR_WIDTH), style=style), label)
    return table


# --- explanation -------------------------------------------------------------------------------


def explanation(results: dict) -> list[str]:
    """The verdict in sentences: the best configuration and why (c, V, acceptance, predicted
    against measured speedup); when speculation loses, that it does and what would win."""
    best, cal = results["best"], results["calibration"]
    base_tps = best["target_only_tokens_per_second"]
    s = best["speedup"] or 0.0
    if not any(r["overall"]["stats"]["n_accepted"] for r in results["results"][1:]):
        # every configuration did target-only decoding's work, or more: none is the best of them
        lines = [
            "The target accepted no draft token in any configuration: speculation gained nothing here over "
            f"target-only decoding at {base_tps:.1f} tok/s, and a speedup above 1.00x in the table is timing noise."
        ]
    elif best["wins"]:
        lines = [
            f"Best on this machine: {best['configuration']}, {s:.2f}x target-only decoding "
            f"({best['tokens_per_second']:.1f} against {base_tps:.1f} tok/s)."
        ]
    elif s > 1 - NOISE:
        slowest = min((x for x in best["round_speedups"] if x is not None), default=s)
        rounds = f", but {slowest:.2f}x in its slowest round" if slowest < 1 else ""
        lines = [
            f"No clear winner: the best speculative configuration, {best['configuration']}, runs at {s:.2f}x "
            f"target-only ({best['tokens_per_second']:.1f} against {base_tps:.1f} tok/s){rounds}, within the noise "
            "of this measurement."
        ]
    else:
        lines = [
            f"Speculation loses on this machine: target-only decoding at {base_tps:.1f} tok/s is the fastest. "
            f"The best speculative configuration, {best['configuration']}, runs at {s:.2f}x."
        ]
    if best.get("unaccepted_faster"):
        lines.append(_unaccepted_sentence(results, best["unaccepted_faster"]))
    check = results.get("timing_check")
    if check and not check["stable"]:
        every = check["target_only_step_seconds"] + [check["calibration_step_seconds"]]
        lines.insert(
            0,
            (
                f"WARNING: the timings are unstable: a target-only step took {_ms(min(every))} to "
                f"{_ms(max(every))} ms across prompts and calibration ({check['spread']:.1f}x). Something else "
                "was probably using the machine; the speeds and speedups below are not reliable: rerun on a quiet one."
            ),
        )
    costs = "Measured costs: "
    if cal["c"] is not None:
        costs += f"a draft-model step is c = {cal['c']:.2f} of a target step; "
    V = list(cal["V"].values())
    costs += (
        f"a target call on n = 2..{len(V)} tokens costs V(n) = {', '.join(f'{v:.1f}' for v in V[1:])} "
        "single-token calls."
    )
    lines.append(costs)
    lines.append(_loop_sentence(results))
    for drafter, d in best["by_drafter"].items():
        lines.append(_why(drafter, d))
    if best.get("auto"):
        lines.append(_auto_sentence(best["auto"]))
    lines += _what_would_win(results)
    lines += _round_noise(results)
    lines += _fidelity_sentences(results)
    return lines


def _unaccepted_sentence(results: dict, name: str) -> str:
    """Why the fastest speculative configuration in the table is not the best: it gained nothing."""
    speedup = next(r["overall"]["speedup"] for r in results["results"] if r["configuration"] == name) or 0.0
    text = (
        f"{name} measured faster, but the target accepted none of its drafts: it did the work of target-only decoding"
    )
    if speedup >= 1 + NOISE:
        return text + ", and its lead is timing noise."
    # no faster than target-only: its lead over the best is the drafting it did not pay for, not noise
    return text + f", at {speedup:.2f}x its speed."


def _loop_sentence(results: dict) -> str:
    """specllm's own work per target step beside llama.cpp's: what a fast GPU step leaves it."""
    parts = ", ".join(
        f"{r['configuration']} {r['overall']['stats']['loop_seconds_per_step'] * 1000:.2f}" for r in results["results"]
    )
    step = _ms(results["calibration"]["target_step_seconds"])
    return (
        f"The loop's own work (outside llama.cpp's calls), in ms per target step: {parts}; "
        f"a target step takes {step} ms."
    )


def _round_noise(results: dict) -> list[str]:
    """With several rounds: how far one round's overall speedups strayed, the noise of a round."""
    spreads = []
    for r in results["results"][1:]:
        speedups = [x for x in r["overall"]["round_speedups"] if x]
        if len(speedups) > 1:
            spreads.append((max(speedups) - min(speedups), r["configuration"], min(speedups), max(speedups)))
    if not spreads:
        return []
    spread, name, low, high = max(spreads)
    rounds = results["settings"]["rounds"]
    return [
        f"Noise: from round to round a configuration's overall speedup moved by up to {spread:.2f} ({name}: "
        f"{low:.2f}-{high:.2f}x); the figures above add up all {rounds} rounds."
    ]


def _why(drafter: str, d: dict) -> str:
    k = d["k"]
    text = f"{d['configuration']}: {_x(d['speedup'])} measured, {_x(d['predicted_speedup'])} predicted. "
    if drafter in ("model", "mtp") and d["alpha"] is None:
        text += "It drafted nothing here (every reply ended before a draft was made): there is no acceptance to judge"
    elif drafter in ("model", "mtp"):
        text += (
            f"The target accepts {_judged(d)}, so a call should yield "
            f"E = {d['expected_tokens_per_call']:.2f} tokens for a step cost of k·c + V(k+1) = "
            f"{k}×{d['c']:.2f} + {d['V_verify']:.2f} = {d['step_cost']:.2f} target steps"
        )
    elif not d["drafting_steps"]:
        text += "Drafting costs nothing but only happens where the output repeats earlier text: it never did here"
    else:
        text += (
            f"Drafting costs nothing but only happens where the output repeats earlier text (on "
            f"{d['drafting_steps']:.0%} of steps here); the target accepts {_judged(d)}, and a drafted step pays "
            f"the verify cost V(k+1), up to V({k + 1}) = {d['V_verify']:.2f}"
        )
    if d["measured_step_cost"] is not None:
        text += (
            f"; measured: {d['measured_tokens_per_call']:.2f} tokens per call, a step taking "
            f"{d['measured_step_cost']:.2f} target-only steps."
        )
    return text + ("" if text.endswith(".") else ".")


def _judged(d: dict) -> str:
    """alpha, told apart from the accept column (accepted / drafted), which is never above it."""
    text = f"alpha = {d['alpha']:.0%} of the draft tokens it judges"
    if f"{d['alpha']:.0%}" == f"{d['acceptance_rate']:.0%}":  # at gamma 1 every drafted token is judged
        return text
    return text + f" (the accept column's {d['acceptance_rate']:.0%} also counts those after a rejection, never judged)"


def _auto_sentence(auto: dict) -> str:
    """What auto chose and how it did against the best fixed configuration, per category."""
    o = auto["overall"]
    text = f"auto: {_x(o['speedup'])} measured, drafting with {_mix(o['chose'])}"
    if o["best_fixed"] is None:
        return text + "."
    verdict = "beats" if o["beats_every_fixed"] else ("matches" if o["matches_best_fixed"] else "trails")
    text += f"; it {verdict} the best fixed configuration overall ({o['best_fixed']}, {_x(o['best_fixed_speedup'])})"
    cats = {cat: v for cat, v in auto["by_category"].items() if v["best_fixed"] is not None}
    short = [
        f"{cat} ({_x(v['speedup'])} against {v['best_fixed']} {_x(v['best_fixed_speedup'])})"
        for cat, v in cats.items()
        if not v["matches_best_fixed"]
    ]
    matched = len(cats) - len(short)
    text += f" and matches the best of each category within {NOISE:.0%} in {matched} of {len(cats)}"
    return text + (f"; it falls short in {', '.join(short)}." if short else ".")


def _mix(shares: dict) -> str:
    names = {"ngram": "n-gram copies", "model": "the draft model", "mtp": "the MTP layers", "none": "nothing"}
    percents = whole_percents([shares.get(key, 0.0) for key in names])
    return ", ".join(f"{label} on {p}%" for label, p in zip(names.values(), percents)) + " of steps"


def whole_percents(shares: list[float]) -> list[int]:
    """Shares of a whole as whole percentages that add up to 100 (the largest remainders round
    up), a share above nothing at 1% at least: rounded each on its own, thirds read 33, 33, 33 and
    a source used on 0.4% of steps read as never used."""
    exact = [x * 100 for x in shares]
    percents = [int(x) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: percents[i] - exact[i])
    for i in by_remainder[: max(0, round(sum(exact)) - sum(percents))]:
        percents[i] += 1
    for i, x in enumerate(exact):
        if x > 0 and percents[i] == 0:
            percents[i] = 1
            percents[percents.index(max(percents))] -= 1
    return percents


def _what_would_win(results: dict) -> list[str]:
    best = results["best"]
    lines = []
    model = best["by_drafter"].get("model")
    if model and model["alpha"] is not None and (model["speedup"] or 0.0) < 1 + NOISE:
        k = model["k"]
        if model["break_even_c"] > model["c"] and model["measured_step_cost"] is not None:
            need = (
                f"By the formula the draft model should win at gamma={k} (c = {model['c']:.2f} is under the "
                f"break-even {model['break_even_c']:.2f}), but a step took {model['measured_step_cost']:.2f} "
                f"target-only steps, not {model['step_cost']:.2f}: overhead outside the two models' calls "
                "(or a busy machine) ate the gain"
            )
        elif model["break_even_c"] > 0:
            need = (
                f"A draft model breaks even here at gamma={k} only if its step costs under "
                f"{model['break_even_c']:.2f} of a target step at this acceptance (this one costs {model['c']:.2f})"
            )
        else:
            need = (
                f"At gamma={k} even a free draft model could not win here: verifying {k + 1} tokens costs "
                f"{model['V_verify']:.2f} target steps, more than the {model['expected_tokens_per_call']:.2f} "
                "tokens a call yields"
            )
        lines.append(
            need + "; where a target call on a few tokens costs about as much as on one (V near 1: a GPU, Apple "
            f"Silicon), this pair would give about {model['speedup_if_V_is_1']:.2f}x."
        )
    winners = {cat: b for cat, b in best["by_category"].items() if b["wins"]}
    if winners:
        line = "Speculation pays in " + ", ".join(
            f"{cat} ({b['speedup']:.2f}x with {b['configuration']})" for cat, b in winners.items()
        )
        copying = [cat for cat, b in winners.items() if b["configuration"].startswith("ngram")]
        if copying:
            line += f"; n-gram drafting wins where the answer repeats text it has seen ({', '.join(copying)})"
        lines.append(line + ".")
    auto = (best.get("auto") or {}).get("overall")
    if auto and auto["best_fixed"] is None and auto["speedup"] > 1 - NOISE:  # nothing fixed to compare with
        lines.append(
            f"Keep auto, the default drafter: it drafts only where that pays ({auto['speedup']:.2f}x target-only "
            "here), with nothing to choose in advance."
        )
    elif auto and auto["matches_best_fixed"] and auto["speedup"] > 1 - NOISE:
        lines.append(
            "Keep auto, the default drafter: it drafts only where that pays and did as well as the best fixed "
            "configuration here, with nothing to choose in advance."
        )
    elif best["wins"]:
        lines.append(f"Use --drafter {best['drafter']} --gamma {best['gamma']} on this machine.")
    elif winners:
        lines.append("Use target-only decoding (--drafter none) here, except for prompts like those above.")
    else:
        lines.append("No configuration beat target-only decoding in any category: use --drafter none here.")
    return lines


def _fidelity_sentences(results: dict) -> list[str]:
    if not results["settings"]["greedy"]:
        return ["Fidelity not checked: sampled output is not expected to match target-only token for token."]
    compared = matched = near = bugs = 0
    for r in results["results"][1:]:
        f = r["overall"]["fidelity"]
        compared += f["compared"]
        matched += f["matched"]
        near += f["near_ties"]
        bugs += f["bugs"]
    if matched == compared:
        return [f"Fidelity: all {compared} greedy speculative outputs matched target-only token for token."]
    line = f"Fidelity: {matched} of {compared} greedy speculative outputs matched target-only token for token"
    if near:
        line += f"; {near} diverged at a near-tie (the target's own verify call flips a close choice, expected)"
    if bugs:
        line += f"; {bugs} diverged where the replayed verify call chose another token: a BUG (see divergences)"
    return [line + "."]


# --- all of it ---------------------------------------------------------------------------------


def render(results: dict, console: Console) -> None:
    console.print(header(results))
    console.print()
    console.print(calibration_table(results))
    for category in results["results"][0]["categories"]:
        console.print(results_table(results, category))
    console.print(results_table(results, None))
    table = divergence_table(results)
    if table is not None:
        console.print(table)
    console.print()
    console.print(bar_chart(results))
    console.print()
    for line in explanation(results):
        console.print(line, markup=False, highlight=False, style="bold yellow" if line.startswith("WARNING") else "")


# --- bench --drafts-for ------------------------------------------------------------------------


def render_draft_race(results: dict, console: Console) -> None:
    """The drafts measured for one target, fastest first, against target-only decoding, and which
    one is remembered."""
    m, s = results["machine"], results["settings"]
    console.print(
        Text(
            f"target {results['target'].get('spec') or results['target']['name']} · {m['cpu']} · "
            f"{m['threads']} thread{'s' * (m['threads'] != 1)} · "
            f"{_count(s['prompts'], 'prompt')}{_rounds(s)} · {reply_limit(s)} · "
            f"{'greedy' if s['greedy'] else 'temperature ' + str(s['temperature'])} · speeds are decode tokens/s",
            style="dim",
        )
    )
    console.print(draft_race_table(results))
    for skipped in results.get("skipped", []):  # it names files
        line = f"Not raced: {skipped['name']} could not be loaded: {skipped['error']}"
        console.print(shown(line), style="yellow", markup=False, highlight=False, soft_wrap=True)
    console.print(shown(_race_verdict(results)), markup=False, highlight=False, soft_wrap=True)  # it names files


def draft_race_table(results: dict) -> Table:
    table = Table(
        title="Drafts for this target, fastest first (drafter model)",
        title_justify="left",
        header_style="bold",
        box=box.SIMPLE_HEAD,
    )
    table.add_column("#", justify="right")
    table.add_column("draft (where, size)", overflow="fold")
    for column in ("γ", "tok/s", "speedup", "accepted", "tok/call", "same"):
        table.add_column(column, justify="right", no_wrap=True)
    base = results["target_only"]
    table.add_row("", "target-only", "", f"{base['tokens_per_second']:.1f}", "1.00x", "", "1.00", "")
    for rank, draft in enumerate(results["drafts"], 1):
        for i, g in enumerate(draft["by_gamma"]):
            first = i == 0  # a draft's fastest draft length first, the others dim below it
            name = (
                Text(shown_on_one_line(draft["name"])).append(
                    f"\n{draft['origin']}, {_size(draft['size'])}", style="dim"
                )
                if first
                else ""
            )
            table.add_row(
                str(rank) if first else "",
                name,
                str(g["gamma"]),
                f"{g['tokens_per_second']:.1f}",
                Text(_x(g["speedup"]), style=_speed_style(g["speedup"])),
                _pct(g["acceptance_rate"]),
                f"{g['tokens_per_call']:.2f}",
                "—" if g["same_output"] is None else f"{g['same_output']}/{g['runs']}",
                style="" if first else "dim",
            )
    return table


def _race_verdict(results: dict) -> str:
    win, spec = results["winner"], results["target"].get("spec") or results["target"]["path"]
    if win is None:
        return "No draft had a single token accepted: nothing remembered; a run finds its draft as before."
    line = (
        f"Fastest: {win['name']} at gamma {win['gamma']}, {_x(win['speedup'])} target-only decoding "
        "with the fixed model drafter"
    )
    pays = win["speedup"] is not None and win["speedup"] >= 1 + NOISE
    line += "." if pays else ": no draft paid for itself on this machine with these settings."
    if results.get("remembered"):
        line += (
            f" Remembered for this target: `specllm run --target {spec}` (and chat, bench, serve) uses it "
            "while both files stay as they are; --draft overrides. With auto, the default drafter, it is "
            "drafted with only where it pays."
        )
    return line


def _size(n: int | None) -> str:
    from specllm.files import human_size

    return "?" if n is None else human_size(n)
