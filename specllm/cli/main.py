"""The `specllm` command: parse options, call the library, hand its events to a view."""

import codecs
import contextlib
import dataclasses
import io
import json
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Annotated

import typer

try:  # typer >= 0.26 carries its own copy of click
    from typer._click.exceptions import ClickException, NoArgsIsHelpError
except ImportError:  # older typer: click's own classes, of the same names and API (unused where typer is newer)
    from click.exceptions import ClickException, NoArgsIsHelpError  # type: ignore[assignment, unused-ignore]

from specllm import report
from specllm.cli.basics import build_command, doctor_command, main_options
from specllm.cli.models import models_command, pull_command, rm_command
from specllm.cli.options import (
    CTX_SIZE,
    SAMPLER,
    SNAPSHOTS,
    CtxSize,
    Draft,
    DrafterOption,
    DraftGpuLayers,
    DraftRpc,
    Gamma,
    GpuLayers,
    GrammarOption,
    JsonSchemaOption,
    LoadOptions,
    MaxTokens,
    MinP,
    ModelsFileOption,
    NoLive,
    OfflineOption,
    PairOption,
    ReasoningEffort,
    Rpc,
    Seed,
    Snapshots,
    SourceOption,
    Target,
    Temperature,
    Think,
    Threads,
    TopK,
    TopP,
    Verbose,
    a_file,
    a_value,
    error_line,
)
from specllm.cli.report import RichReporter, names_console
from specllm.engine.functionary import asks_recipient
from specllm.engine.names import FIXED_GAMMA, Drafter
from specllm.engine.reasoning import closing_marker, split_reasoning
from specllm.engine.sampling import default_seed
from specllm.engine.text import check_utf8, shown
from specllm.errors import ChatTemplateFailed, NeedsDraftModel, NoMtpLayers, SpecllmError, Terminated
from specllm.files import check_writable, memory_limit_hint, open_files_hint, read_text_file
from specllm.llama.memory import available_memory
from specllm.llama.options import ModelOptions
from specllm.models.hub import Source, check_endpoint_parses
from specllm.serve import CACHE_RAM, GRAMMAR_BUDGET, MAX_WAITING, default_cache_ram

BENCH_GAMMAS = "2,4"  # bench's draft lengths when --gamma is not given


def within_snapshots(gammas: list[int], max_draft: int | None) -> list[int]:
    """bench's default draft lengths cut to what a hybrid target's snapshots can take back: the
    user asked for none of them, so a longer one is no error (a --gamma given is checked as is)."""
    return list(dict.fromkeys(min(g, max_draft) for g in gammas)) if max_draft else gammas


app = typer.Typer(
    help="Fast local LLM inference on llama.cpp GGUF models through speculative decoding.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,  # --install-completion, --show-completion
)
app.callback()(main_options)  # --version


def load_engine(options: LoadOptions, drafter: str | None, *, gamma=None, keep_draft=False):
    """Find the models the options name (a pair, by default the default pair, or --target
    [--draft]), download what is missing, and load them; the draft only when the drafter needs it
    (or always with keep_draft, for a chat that can switch drafters)."""
    from specllm import load
    from specllm.models.hub import resolve_models

    o = options
    if o.draft == "none" and o.target is None:
        raise SpecllmError("--draft none goes with --target (for a pair without its draft use --drafter ngram or none)")
    if o.pair is not None and (o.target is not None or o.draft is not None):
        raise SpecllmError("give either --pair or --target/--draft, not both")
    if o.draft is not None and o.target is None:
        raise SpecllmError("--draft needs --target (or use --pair NAME)")
    if drafter == Drafter.MODEL and o.target is None:
        check_pair_has_draft(o.pair, o.models_file)
    target_path, draft_path, _ = resolve_models(
        o.pair,
        o.target,
        None if o.draft == "none" else o.draft,
        source=o.source,
        offline=o.offline,
        models_file=o.models_file,
        check=False,
    )
    # --gamma alone means model when there is a draft: one found on disk counts, as for auto
    wants_model = drafter in (None, Drafter.AUTO, Drafter.MODEL)
    if o.target is not None and o.draft is None and wants_model:  # a target alone: look for a draft on disk
        from specllm.cli.drafts import find_draft
        from specllm.models.stores import store_name

        draft_path = find_draft(
            target_path,
            drafter or Drafter.AUTO,
            models_file=o.models_file,
            source=o.source,
            offline=o.offline,
            verbose=o.verbose,
            label=o.target if store_name(o.target) else None,  # an Ollama blob's file name would say nothing
            rpc=o.target_options().rpc,
        )
    drafter = default_drafter(drafter, gamma, draft_path is not None) or Drafter.AUTO
    if drafter == Drafter.MODEL and draft_path is None:
        raise NeedsDraftModel(o.pair)
    if o.verbose:
        report_backend(o.threads, o.target_options())
    # auto loads the draft only when it may pay; a chat keeps it at hand for /drafter
    wanted = draft_path is not None and (drafter in (Drafter.MODEL, Drafter.AUTO) or keep_draft)
    engine = load(
        str(target_path),
        str(draft_path) if wanted else None,
        n_ctx=o.ctx_size,
        n_threads=o.threads,
        n_gpu_layers=o.gpu_layers,
        draft_gpu_layers=o.draft_gpu_layers,
        defer_draft=drafter != Drafter.MODEL,
        rpc=o.rpc or (),
        draft_rpc=o.draft_rpc or (),
        snapshots=o.snapshots,
    )
    if drafter == Drafter.MTP and engine.mtp is None:  # now, not at the first generation or request
        engine.close()
        raise NoMtpLayers(engine.target.path.name)
    engine.fixed_gamma = pair_gamma(o.pair, o.target, o.models_file)  # chat's /drafter, a request's drafter
    if o.verbose:
        for line in describe_models(engine):
            print(line, file=sys.stderr)
    return engine, drafter


def check_pair_has_draft(pair: str | None, models_file) -> None:
    """--drafter model with a pair that has no draft (a model that drafts for itself) is refused
    before its target is downloaded (gigabytes) only to be refused then."""
    from specllm.models.registry import get_pair, load_pairs

    if get_pair(pair, load_pairs(models_file)).draft is None:
        raise NeedsDraftModel(pair)


def check_draft_length(engine, drafter: str, gamma: int | None) -> None:
    """A --gamma for a fixed drafter must fit a hybrid target's snapshots: chat and serve refuse it
    at the start, not at every message or request (where a client never asked for it). Without
    --gamma, the pair's length is kept within them, as auto's drafts are."""
    from specllm.engine.loop import check_snapshots

    try:
        check_snapshots(drafter, gamma, engine.target)
    except SpecllmError:
        engine.close()
        raise


def check_not_an_input(output: Path, inputs: dict[str, str | Path | None]) -> None:
    """An output file must not be one the command reads: the results would replace the user's
    prompts, pairs or model, a slip of the shell's completion away."""
    for option, given in inputs.items():
        if given is not None and Path(given).is_file() and output.exists() and output.samefile(given):
            raise SpecllmError(f"--json {output} is the file given to {option}: the results would replace it")


def show_llama_log(verbose: bool) -> None:
    """-v: llama.cpp's own log on stderr too (loading, devices, buffers); without it, quiet, and
    an abort inside llama.cpp (an RPC server gone in the middle of a generation) is its own line
    without the gdb backtrace of every thread that ggml prints after it."""
    if verbose:
        from specllm.llama.log import set_verbose

        set_verbose(True)
    else:
        os.environ.setdefault("GGML_NO_BACKTRACE", "1")  # read by ggml when it aborts


def describe_models(engine) -> list[str]:
    """-v: what kind of target this is, what its recurrent state and snapshots cost, its MTP layers."""
    target, lines = engine.target, []
    if target.recurrent:
        from specllm.files import human_size

        state = target.state_bytes
        kind = "hybrid" if target.hybrid else "recurrent"
        line = f"target: {kind} ({target.path.name}): recurrent state {human_size(state)}"
        if target.snapshots:
            more = human_size(state * target.snapshots)
            line += f", {target.snapshots} snapshots for rejected draft tokens {more} more (--snapshots)"
        else:
            line += "; llama.cpp keeps no snapshots of it: a rejected draft is taken back from a checkpoint"
        lines.append(line)
        lines.append(
            "target: a new prompt that extends the last one goes on from its state; one that changes it resumes "
            "from a checkpoint of the state after the last prompt, or is evaluated again from its start"
        )
    if engine.mtp is not None:
        lines.append(
            f"target: {target.n_nextn} MTP layer(s): it drafts for itself (drafter mtp, and auto where it pays)"
        )
    return lines


def output_structure(grammar: Path | None, json_schema: str | None) -> dict:
    """--grammar's file and --json-schema's JSON (given, or in a file) as GenerationConfig's fields."""
    if grammar is not None and json_schema is not None:
        raise SpecllmError("give --grammar or --json-schema, not both")
    if grammar is not None:
        return {"grammar": read_option_file(grammar, "--grammar")}
    if json_schema is None:
        return {}
    if json_schema.lstrip().startswith("{"):  # the schema itself: a file's name never starts so
        return {"json_schema": json_schema}
    from specllm.errors import GrammarInvalid
    from specllm.llama.grammar import schema_text

    text = read_option_file(Path(json_schema), "--json-schema")
    try:
        return {"json_schema": schema_text(text)}
    except GrammarInvalid as e:
        raise SpecllmError(f"--json-schema {json_schema}: {e}") from None


def read_option_file(path: Path, option: str) -> str:
    try:
        return read_text_file(path, "utf-8-sig")  # a BOM, as some editors write, is no error
    except OSError as e:
        raise SpecllmError(f"cannot read {option} {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise SpecllmError(f"cannot read {option} {path}: it is not UTF-8 text ({e.reason})") from None


def check_options(max_tokens, drafter, gamma, sampler: dict, stop=(), ctx_size=None, system=None) -> None:
    """Refuse bad option values before any model is downloaded or loaded."""
    from specllm.engine.loop import check_gamma, make_config

    for value in stop:
        check_utf8(value, "--stop")
    check_utf8(system, "--system")
    make_config(max_tokens=max_tokens, stop=stop, drafter=drafter or Drafter.AUTO, gamma=gamma, **sampler)
    if ctx_size is not None and gamma is not None:
        check_gamma(gamma, min(ModelOptions(n_ctx=ctx_size).n_batch, ctx_size))  # llama.cpp caps the batch at n_ctx


def default_drafter(drafter, gamma, has_draft: bool) -> str | None:
    """--drafter if given; with --gamma alone, the fixed drafter of before auto (model with a
    draft, else ngram), so that `--gamma N` still means a fixed draft length; else auto."""
    if drafter or gamma is None:
        return drafter
    return Drafter.MODEL if has_draft else Drafter.NGRAM


def pair_gamma(pair, target, models_file) -> int:
    """The pair's recommended draft length (FIXED_GAMMA for models given as files)."""
    if target is not None:
        return FIXED_GAMMA
    from specllm.models.registry import get_pair, load_pairs

    return get_pair(pair, load_pairs(models_file)).gamma


def report_backend(threads, options: ModelOptions) -> None:
    from specllm.llama.devices import gpu_layers, physical_cores
    from specllm.llama.options import ALL_LAYERS
    from specllm.llama.system import system_info

    info = system_info()
    n = gpu_layers(options)
    layers = "all" if n == ALL_LAYERS else str(n)
    if options.rpc and n:
        layers += " (on the RPC servers)"
    print(
        f"llama-cpp-python {info['llama_cpp_python']} · GPU offload "
        f"{'available' if info['gpu_offload'] else 'not available (CPU build)'} · devices: "
        f"{', '.join(info['devices']) or 'CPU'} · threads {threads or physical_cores()} · GPU layers {layers}",
        file=sys.stderr,
    )


def read_prompt(prompt: str) -> str:
    if prompt != "-":
        check_utf8(prompt, "the prompt")
        return prompt
    if sys.stdin is None:  # started with it closed (`<&-`)
        raise SpecllmError("standard input is closed: give the prompt as an argument")
    try:
        text = sys.stdin.read()
    except UnicodeDecodeError as e:
        raise SpecllmError(f"standard input is not valid UTF-8 text ({e.reason})") from None
    check_utf8(text, "standard input")
    return text.removeprefix("\ufeff")  # a file saved with a BOM (Notepad's UTF-8): not part of the prompt


@app.command()
def run(
    prompt: Annotated[str, typer.Argument(help="The prompt, or - to read it from standard input.")],
    pair: PairOption = None,
    target: Target = None,
    draft: Draft = None,
    source: SourceOption = Source.auto,
    offline: OfflineOption = False,
    models_file: ModelsFileOption = None,
    drafter: DrafterOption = None,
    gamma: Gamma = None,
    max_tokens: MaxTokens = 256,
    temperature: Temperature = SAMPLER.temperature,
    top_k: TopK = SAMPLER.top_k,
    top_p: TopP = SAMPLER.top_p,
    min_p: MinP = SAMPLER.min_p,
    seed: Seed = None,
    ctx_size: CtxSize = CTX_SIZE,
    threads: Threads = None,
    gpu_layers: GpuLayers = None,
    draft_gpu_layers: DraftGpuLayers = None,
    rpc: Rpc = None,
    draft_rpc: DraftRpc = None,
    snapshots: Snapshots = SNAPSHOTS,
    chat_template: Annotated[
        bool, typer.Option("--chat-template/--raw", help="Wrap the prompt in the model's chat template.")
    ] = True,
    system: Annotated[str | None, typer.Option(help="System message (with the chat template).")] = None,
    think: Think = None,
    reasoning_effort: ReasoningEffort = None,
    stop: Annotated[list[str] | None, typer.Option(help="Stop at this string (repeatable).")] = None,
    grammar: GrammarOption = None,
    json_schema: JsonSchemaOption = None,
    suffix: Annotated[
        str | None,
        typer.Option(
            help="Fill in the middle: the prompt is the code before the gap and this the code after it "
            "(a code model's FIM tokens; no chat template)."
        ),
    ] = None,
    no_live: NoLive = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object at the end.")] = False,
    verbose: Verbose = False,
):
    """Complete a prompt, showing live which draft tokens the target accepted and rejected."""
    from rich.console import Console

    from specllm.chat.view import LiveView, PlainView, use_live
    from specllm.engine.loop import check_fits, make_config

    seed = default_seed(seed)
    sampler = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
    structure = output_structure(grammar, json_schema)
    check_options(
        max_tokens, drafter, gamma, sampler | structure, stop=tuple(stop or ()), ctx_size=ctx_size, system=system
    )
    options = LoadOptions.pick(locals())
    options.check()
    show_llama_log(verbose)
    if system is not None and not chat_template:
        raise SpecllmError("--system needs the chat template: drop --raw")
    variables = thinking(think, reasoning_effort)
    if variables is not None and not chat_template:
        raise SpecllmError(f"{thinking_option(think, reasoning_effort)} needs the chat template: drop --raw")
    if suffix is not None and (system is not None or variables is not None):
        raise SpecllmError(
            f"--suffix fills in the middle of code, without the chat template: drop "
            f"{'--system' if system is not None else thinking_option(think, reasoning_effort)}"
        )
    chat_template = chat_template and suffix is None
    text = read_prompt(prompt)
    if prompt == "-" and not text.strip() and suffix is None:  # `cat missing.txt | specllm run -`
        raise SpecllmError("standard input held no text: nothing to complete (pipe a prompt in, or give it as text)")
    engine, drafter = load_engine(options, drafter, gamma=gamma)
    opened: bool | str = False  # the think block's closing marker where the prompt opened one
    recipient = False  # the prompt ends where the reply's first recipient goes (functionary v3.2)
    if chat_template:  # rendered here, with the template's variables; then as any text prompt
        check_fits(engine.target, text)  # else a huge prompt fails in the template, which takes the blame
        text = in_chat_template(engine, text, system, variables)
        opened, recipient = closing_marker(text) or False, asks_recipient(text)
    # once the template has rendered (a damaged one says so with --raw's name)
    stops = tuple(stop or ()) + (engine.target.chat_stops if chat_template else ())  # a turn's end the model may spell
    # --gamma alone: a fixed drafter without it drafts the pair's length, within a hybrid's snapshots
    config = make_config(max_tokens=max_tokens, drafter=drafter, gamma=gamma, stop=stops, **sampler, **structure)
    gap = engine.infill_prompt(text, suffix, max_tokens=max_tokens) if suffix is not None else None
    if gap and gap.left_out:
        print(f"note: {gap.left_out} tokens of the code were cut to leave room for the reply", file=sys.stderr)
    generation = engine.start(gap.tokens if gap else text, config)
    console = Console()
    view: PlainView | LiveView
    if as_json:
        view = PlainView(drafter, show_summary=False)
    elif use_live(no_live, console):
        view = LiveView(console, drafter, opened=opened, recipient=recipient)
    else:
        view = PlainView(drafter, opened=opened, recipient=recipient)
    with view:
        for step in generation:
            if not as_json:
                view.step(step)
        result = generation.result
        if not as_json:
            view.finish(result)
    if verbose and result.stats.policy:
        print(describe_policy(result.stats.policy), file=sys.stderr)
    if as_json:
        print(json.dumps(result_json(result, seed, opened, recipient)))


def in_chat_template(engine, text: str, system: str | None, variables: dict | None) -> str:
    """run's prompt rendered with the target's chat template; one that fails names --raw."""
    try:
        if engine.target.chat_template() is None:  # the same notice as chat's
            print(f"note: {shown(engine.target.path.name)} has no chat template: using ChatML", file=sys.stderr)
        return engine.chat_prompt(text, system, variables)
    except ChatTemplateFailed as e:
        raise ChatTemplateFailed(f"{e} (--raw runs without it)") from None


def thinking(think: bool | None, effort: str | None = None) -> dict | None:
    """The chat template's variables for --think/--no-think and --reasoning-effort (none: the
    template's defaults). An effort of "none" is --no-think, as serve reads OpenAI's field."""
    if effort is not None and not effort.strip():
        raise SpecllmError("--reasoning-effort: give a level (low, medium, high) or none")
    if effort == "none":
        if think:
            raise SpecllmError("--think and --reasoning-effort none ask for opposite things: give one")
        think, effort = False, None
    variables = ({} if think is None else {"enable_thinking": think}) | (
        {} if effort is None else {"reasoning_effort": effort}
    )
    return variables or None


def thinking_option(think: bool | None, effort: str | None) -> str:
    """The option that set the template's thinking variables, to name it in a message."""
    return "--reasoning-effort" if effort is not None else f"--{'' if think else 'no-'}think"


@app.command()
def chat(
    pair: PairOption = None,
    target: Target = None,
    draft: Draft = None,
    source: SourceOption = Source.auto,
    offline: OfflineOption = False,
    models_file: ModelsFileOption = None,
    drafter: DrafterOption = None,
    gamma: Gamma = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", "-n", help="Tokens per reply at most.")] = 512,
    temperature: Temperature = SAMPLER.temperature,
    top_k: TopK = SAMPLER.top_k,
    top_p: TopP = SAMPLER.top_p,
    min_p: MinP = SAMPLER.min_p,
    seed: Seed = None,
    ctx_size: CtxSize = CTX_SIZE,
    threads: Threads = None,
    gpu_layers: GpuLayers = None,
    draft_gpu_layers: DraftGpuLayers = None,
    rpc: Rpc = None,
    draft_rpc: DraftRpc = None,
    snapshots: Snapshots = SNAPSHOTS,
    system: Annotated[str | None, typer.Option(help="System prompt (with --resume: replaces the saved one).")] = None,
    resume: Annotated[
        Path | None,
        typer.Option("--resume", help="Continue a conversation saved with /save.", parser=a_file, metavar="<file>"),
    ] = None,
    think: Think = None,
    reasoning_effort: ReasoningEffort = None,
    no_live: NoLive = False,
    verbose: Verbose = False,
):
    """Chat in the terminal; each turn prefills only its new tokens. /help lists the commands."""
    from rich.console import Console

    from specllm.chat.repl import repl
    from specllm.chat.session import ChatSession, read_transcript
    from specllm.chat.view import use_live
    from specllm.engine.loop import make_config

    if sys.stdin is None:  # started with it closed (`<&-`): no message can ever come
        raise SpecllmError("standard input is closed: chat reads its messages from it")
    sampler = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=default_seed(seed))
    check_options(max_tokens, drafter, gamma, sampler, ctx_size=ctx_size, system=system)
    variables = thinking(think, reasoning_effort)
    options = LoadOptions.pick(locals())
    options.check()
    show_llama_log(verbose)
    saved = read_transcript(resume) if resume else None  # a bad file is refused before loading models
    engine, drafter = load_engine(options, drafter, gamma=gamma, keep_draft=True)
    check_draft_length(engine, drafter, gamma)
    # --gamma alone: a fixed drafter without it drafts the pair's length, and /drafter auto its own
    config = make_config(max_tokens=max_tokens, drafter=drafter, gamma=gamma, **sampler)
    session = ChatSession(engine, config, system, variables)
    if saved:
        session.notices.append(session.restore(saved))
        session.system = system or session.system
    # A chat template that cannot render a first message is refused now, not at every message.
    session.render(session.messages() + [{"role": "user", "content": "Hello"}])
    console = Console()
    # Off a terminal there is no width to wrap to: Rich would break every line at 80 columns
    # (an error in two lines); lines are written whole, as the replies are.
    console.soft_wrap = not console.is_terminal
    repl(session, console, use_live(no_live, console))


def describe_policy(policy: dict) -> str:
    """-v: where auto's costs came from and what they say."""
    cal, target, draft = policy["calibration"], policy["target"], policy["draft"]
    measured = ", ".join(cal["measured"])
    how = f"measured ({measured}) in {cal['seconds']:.1f}s" if measured else "from the calibration cache"
    if cal.get("reused"):
        how = "as the generations before this one left them"
    V = ", ".join(f"V({n}) {v:.2f}" for n, v in target["V"].items())
    line = f"auto: costs {how} ({cal['cache']}): target step {target['step_seconds'] * 1000:.1f} ms, {V}"
    if draft:
        verdict = "can pay here" if policy["model_could_pay"] else "cannot pay here: not used"
        line += f"; draft step {draft['step_seconds'] * 1000:.1f} ms (c = {policy['c']:.2f}): the draft model {verdict}"
    if policy.get("mtp"):
        verdict = "can pay here" if policy["mtp_could_pay"] else "cannot pay here: not used"
        line += (
            f"; MTP step {policy['mtp']['step_seconds'] * 1000:.1f} ms (c = {policy['c_mtp']:.2f}): "
            f"the MTP layers {verdict}"
        )
    if policy.get("draft_limit"):
        line += f"\nauto: {policy['draft_limit']}"
    return line


def result_json(result, seed: int, opened: bool | str = False, recipient: bool = False) -> dict:
    """run --json's object. A thinking model's reasoning (`opened`: the prompt opened its think
    block) is `reasoning`, apart from the answer's `text`, read after the prompt's first
    recipient mark where it ends with one (`recipient`: functionary v3.2's)."""
    split = split_reasoning(result.text, opened, recipient=recipient)
    return {
        "text": split.answer,
        **({"reasoning": split.reasoning} if split.reasoning else {}),
        "tokens": result.tokens,
        "stop_reason": result.stop_reason,
        "seed": seed,
        "stats": result.stats.to_dict(),
    }


app.command("models")(models_command)
app.command("pull")(pull_command)
app.command("rm")(rm_command)


app.command("doctor")(doctor_command)


@app.command()
def bench(
    pair: PairOption = None,
    target: Target = None,
    draft: Draft = None,
    source: SourceOption = Source.auto,
    offline: OfflineOption = False,
    models_file: ModelsFileOption = None,
    drafter: Annotated[
        str | None,
        typer.Option(
            parser=a_value,
            help="Drafters to compare, comma-separated: auto,model,mtp,ngram. Default: auto, model with a draft, "
            "mtp for a target with MTP layers, and ngram.",
        ),
    ] = None,
    gamma: Annotated[
        str | None,
        typer.Option(
            "--gamma",
            "-g",
            parser=a_value,
            help="Draft lengths to compare, comma-separated (default 2,4; on a hybrid target, within its snapshots).",
        ),
    ] = None,
    prompts: Annotated[
        Path | None,
        typer.Option(
            help='JSONL prompt file: {"prompt": ..., "category": ..., "max_tokens": ...} per line '
            '("suffix": ... makes the prompt the code before a gap to fill). Default: the built-in suite.',
            parser=a_file,
            metavar="<file>",
        ),
    ] = None,
    categories: Annotated[
        str | None, typer.Option(parser=a_value, help="Only these categories, comma-separated.")
    ] = None,
    per_category: Annotated[int | None, typer.Option(help="At most this many prompts of each category.")] = None,
    rounds: Annotated[
        int,
        typer.Option(
            min=1, help="Run the whole suite this many times and add the rounds up (a noisy machine averages out)."
        ),
    ] = 1,
    max_tokens: Annotated[
        int | None,
        typer.Option(
            "--max-tokens",
            "-n",
            min=1,
            show_default=False,
            help="Tokens to generate at most per prompt (default 128; 64 with --drafts-for); "
            "a prompt file's own max_tokens wins.",
        ),
    ] = None,
    drafts_for: Annotated[
        str | None,
        typer.Option(
            "--drafts-for",
            parser=a_value,
            metavar="TARGET",
            help="Measure every draft on disk that fits TARGET (a path or any model reference; those "
            "`models --drafts-for` finds) against target-only decoding, and remember the fastest for TARGET: "
            "`run --target TARGET` then uses it. Default: one prompt per category, 64 tokens each.",
        ),
    ] = None,
    temperature: Temperature = 0.0,
    top_k: TopK = SAMPLER.top_k,
    top_p: TopP = SAMPLER.top_p,
    min_p: MinP = SAMPLER.min_p,
    seed: Seed = None,
    ctx_size: CtxSize = CTX_SIZE,
    threads: Threads = None,
    gpu_layers: GpuLayers = None,
    draft_gpu_layers: DraftGpuLayers = None,
    rpc: Rpc = None,
    draft_rpc: DraftRpc = None,
    snapshots: Snapshots = SNAPSHOTS,
    json_file: Annotated[
        Path | None,
        typer.Option("--json", help="Write every result to this JSON file.", parser=a_file, metavar="<file>"),
    ] = None,
    verbose: Verbose = False,
):
    """Measure speculative against target-only decoding on a prompt suite, and explain the result;
    with --drafts-for, find the fastest draft on disk for a target."""

    from specllm.bench import runner as b
    from specllm.bench.view import BenchProgress, render
    from specllm.engine.sampling import SamplerSettings

    if drafts_for is not None:
        from specllm.bench.race import RACE_MAX_TOKENS, RACE_PROMPTS_PER_CATEGORY

        if pair or target or draft or drafter:
            raise SpecllmError(
                "--drafts-for measures every draft on disk for one target: "
                "give it without --pair, --target, --draft and --drafter"
            )
        max_tokens = max_tokens or RACE_MAX_TOKENS
        if per_category is None and prompts is None:
            per_category = RACE_PROMPTS_PER_CATEGORY
    max_tokens = max_tokens or 128
    gammas = b.parse_gammas(gamma or BENCH_GAMMAS)
    wanted = b.parse_list(drafter, "drafter") if drafter else None
    if wanted:
        b.configurations(wanted, gammas)  # refuse bad options before loading any model
    for g in gammas:
        check_options(max_tokens, None, g, {}, ctx_size=ctx_size)
    if json_file is not None:
        check_writable(json_file, "--json")  # not only once the bench has run
        check_not_an_input(
            json_file, {"--prompts": prompts, "--models": models_file, "--target": target, "--draft": draft}
        )
    options = LoadOptions.pick(locals())
    options.check()
    show_llama_log(verbose)
    seed = default_seed(seed)
    sampler = SamplerSettings(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
    suite = b.load_prompts(prompts) if prompts else b.builtin_prompts()
    cats = b.parse_list(categories, "category") if categories else None
    suite = b.select_prompts(suite, cats, per_category)
    if drafts_for is not None:
        settings = b.BenchSettings(
            tuple(b.configurations(["model"], gammas)), max_tokens=max_tokens, sampler=sampler, rounds=rounds
        )
        race_drafts(drafts_for, suite, settings, options, json_file=json_file, default_gammas=gamma is None)
        return
    need = None if wanted is None else (Drafter.MODEL if Drafter.MODEL in wanted else wanted[0])
    engine, _ = load_engine(options, need)
    # Default: auto and both fixed drafters when there is a draft model, auto and n-gram otherwise.
    drafters = wanted or [
        Drafter.AUTO,
        *([Drafter.MODEL] if engine.has_draft else []),
        *([Drafter.MTP] if engine.mtp else []),
        Drafter.NGRAM,
    ]
    if gamma is None:
        gammas = within_snapshots(gammas, engine.target.max_draft)
    settings = b.BenchSettings(
        tuple(b.configurations(drafters, gammas)), max_tokens=max_tokens, sampler=sampler, rounds=rounds
    )
    with BenchProgress() as progress:
        results = b.run_bench(engine, suite, settings, progress)
    render(results, names_console())  # first: if the file cannot be written after all, the results are still seen
    if json_file is not None:
        b.write_json(results, json_file)


def race_drafts(spec, suite, settings, options: LoadOptions, *, json_file, default_gammas: bool = False) -> None:
    """bench --drafts-for: the drafts on disk that fit the target, measured side by side against
    target-only decoding; the fastest is remembered for the target (winners.py)."""

    from specllm import load
    from specllm.bench.race import race
    from specllm.bench.runner import configurations, write_json
    from specllm.bench.view import BenchProgress, render_draft_race
    from specllm.models import winners
    from specllm.models.drafts import candidates
    from specllm.models.hub import resolve_models
    from specllm.models.registry import load_pairs

    o = options
    target_path, _, _ = resolve_models(
        None, spec, None, source=o.source, offline=o.offline, models_file=o.models_file, check=False
    )
    fits = [c for c in candidates(target_path, load_pairs(o.models_file)) if c.compatible]
    if not fits:
        raise SpecllmError(f"no draft on disk fits {spec} (`specllm models --drafts-for {spec}` lists why)")
    if o.verbose:
        report_backend(o.threads, o.target_options())
    engine = load(
        str(target_path),
        n_ctx=o.ctx_size,
        n_threads=o.threads,
        n_gpu_layers=o.gpu_layers,
        rpc=o.rpc or (),
        snapshots=o.snapshots,
    )
    if default_gammas:  # as bench does: the default lengths kept within a hybrid target's snapshots
        gammas = [c.gamma for c in settings.configurations]
        models = configurations([Drafter.MODEL], within_snapshots(gammas, engine.target.max_draft))
        settings = dataclasses.replace(settings, configurations=tuple(models))
    try:
        with BenchProgress() as progress:
            results = race(engine, fits, suite, settings, o.draft_options(), progress)
    finally:
        engine.close()
    rpc = o.target_options().rpc  # the winner is the target's on these servers
    if results["winner"] is not None:
        winners.remember(target_path, winners.Winner(**results["winner"]), rpc=rpc)
    remembered = winners.remembered(target_path, rpc=rpc)
    results["remembered"] = results["winner"] is not None and remembered is not None
    results["target"]["spec"] = spec
    render_draft_race(results, names_console())
    if json_file is not None:
        write_json(results, json_file)


@app.command()
def serve(
    pair: PairOption = None,
    target: Target = None,
    draft: Draft = None,
    source: SourceOption = Source.auto,
    offline: OfflineOption = False,
    models_file: ModelsFileOption = None,
    drafter: DrafterOption = None,
    gamma: Gamma = None,
    ctx_size: CtxSize = CTX_SIZE,
    threads: Threads = None,
    gpu_layers: GpuLayers = None,
    draft_gpu_layers: DraftGpuLayers = None,
    rpc: Rpc = None,
    draft_rpc: DraftRpc = None,
    snapshots: Snapshots = SNAPSHOTS,
    think: Think = None,
    reasoning_effort: ReasoningEffort = None,
    verbose: Annotated[
        bool,
        typer.Option("--verbose", "-v", help="Also show llama.cpp's own log: loading, devices, buffers."),
    ] = False,
    host: Annotated[
        str, typer.Option(parser=a_value, help="Address to listen on (0.0.0.0: every interface).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on (0: a free one).")] = 8080,
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar="SPECLLM_API_KEY",
            show_envvar=False,
            help="Require `Authorization: Bearer KEY` or `x-api-key: KEY` (or SPECLLM_API_KEY).",
        ),
    ] = None,
    max_waiting: Annotated[
        int,
        typer.Option(min=1, help="Requests that may wait while the model answers another; more get a 503 (try later)."),
    ] = MAX_WAITING,
    grammar_budget: Annotated[
        float,
        typer.Option(
            min=0,
            help="Seconds a request's grammar or JSON schema may take to mask the vocabulary once; "
            "a costlier one gets a 400, as its masks would hold every other request (0: no limit).",
        ),
    ] = GRAMMAR_BUDGET,
    cache_ram: Annotated[
        int | None,
        typer.Option(
            min=0,
            metavar="MIB",
            help="MiB of memory for other conversations' KV caches, so that a client's side request "
            f"does not make the conversation's next turn prefill again (0: none; default {CACHE_RAM // 2**20}, "
            "or a quarter of the memory left once the models are loaded where that is less).",
            show_default=False,
        ),
    ] = None,
    cors: Annotated[
        list[str] | None,
        typer.Option(
            "--cors",
            parser=a_value,
            metavar="ORIGIN",
            help="Let web pages from ORIGIN (http://localhost:3000; * for any) call the API from a browser "
            "(repeatable).",
        ),
    ] = None,
    embedding_model: Annotated[
        str | None,
        typer.Option(
            "--embedding-model",
            parser=a_value,
            help="Also serve /v1/embeddings with this embedding model (nomic-embed-text, bge, Qwen3-Embedding, ...), "
            "or /rerank with a reranker (bge-reranker, Qwen3-Reranker): a path, hf:REPO/FILE or "
            "ollama:/lmstudio:/llamacpp: NAME.",
        ),
    ] = None,
):
    """Serve the models over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions),
    with a chat page at / that colours each reply by where its tokens came from."""
    from specllm.serve.server import (
        ServeSettings,
        check_api_key,
        check_grammar_budget,
        cors_origins,
        describe_server,
        exposure_warning,
        listen,
    )
    from specllm.serve.server import serve as serve_forever

    check_options(1, drafter, gamma, {}, ctx_size=ctx_size)
    variables = thinking(think, reasoning_effort)  # every chat request's, which a request may override
    if api_key is not None:
        check_api_key(api_key)
    if grammar_budget:  # 0: none
        check_grammar_budget(grammar_budget)
    origins = cors_origins(cors or ())
    options = LoadOptions.pick({**locals(), "verbose": True})  # serve always says what it loaded
    options.check()
    sock = listen(host, port)  # before loading the models: a port in use fails at once
    show_llama_log(verbose)
    # first: a model that cannot embed is refused before the pair loads
    embedder = load_embedding_model(embedding_model, options) if embedding_model else None
    with contextlib.ExitStack() as loaded:
        if embedder is not None:
            loaded.callback(embedder.close)
        engine, drafter = load_engine(options, drafter, gamma=gamma, keep_draft=True)
        loaded.callback(engine.close)
        check_draft_length(engine, drafter, gamma)
        # --gamma alone: a request's fixed drafter without one drafts the pair's length, auto its own
        settings = ServeSettings(
            model=model_name(target, engine.target.path),
            drafter=drafter,
            gamma=gamma,
            api_key=api_key,
            template_variables=variables,
            max_waiting=max_waiting,
            grammar_budget=grammar_budget or None,
            embedding_model=model_name(embedding_model, embedder.path) if embedder else None,
            cors_origins=origins,
            cache_ram=cache_ram * 2**20 if cache_ram is not None else default_cache_ram(available_memory()),
        )
        if warning := exposure_warning(sock, settings):
            print(warning, file=sys.stderr, flush=True)
        print(describe_server(sock, engine, settings, embedder), file=sys.stderr, flush=True)
        serve_forever(engine, settings, sock, embedder)


def model_name(spec: str | None, path: Path) -> str:
    """A served model's id: the name another tool's store knows it by, else its file name (not an
    Ollama blob's hash)."""
    from specllm.models.stores import store_name

    return spec if spec and store_name(spec) else path.name


def load_embedding_model(spec: str, options: LoadOptions):
    """The embedding model or reranker --embedding-model names (any reference --target takes), found or
    downloaded as a target is, and loaded to pool texts with the target's threads, GPU layers and
    context (at most its own)."""
    from specllm.llama.embeddings import open_embedding_model
    from specllm.models.hub import resolve_models

    o = options
    path, _, _ = resolve_models(target=spec, source=o.source, offline=o.offline, models_file=o.models_file, check=False)
    return open_embedding_model(path, ModelOptions(n_ctx=o.ctx_size, n_threads=o.threads, n_gpu_layers=o.gpu_layers))


def _terminate(signum, _frame):
    raise Terminated(signum)


def _end_on_termination() -> None:
    """SIGTERM and SIGHUP raise Terminated. SIGHUP only where it ends the process (not under
    `nohup`, which ignores it): a closed terminal would otherwise kill a chat on the spot, its
    conversation with it, and leave the cursor hidden."""
    signal.signal(signal.SIGTERM, _terminate)
    if hasattr(signal, "SIGHUP") and signal.getsignal(signal.SIGHUP) == signal.SIG_DFL:
        signal.signal(signal.SIGHUP, _terminate)


INTERRUPTED = 130  # 128 + SIGINT, as shells report it
ENDED_BY = {signal.SIGTERM: "terminated", getattr(signal, "SIGHUP", None): "hangup"}


def _list_commands_on_one_line(app: typer.Typer) -> None:
    """`specllm --help` lists each command by its docstring's first paragraph, and Rich keeps that
    paragraph's line breaks: given as one line, it wraps at the terminal's width instead."""
    for command in app.registered_commands:
        doc = (command.callback.__doc__ or "") if command.callback else ""
        command.short_help = command.short_help or " ".join(doc.split("\n\n")[0].split())


_list_commands_on_one_line(app)


def main() -> None:
    """Entry point: every user-facing error becomes one line on stderr and a non-zero exit code;
    Ctrl-C is one line "interrupted" and exit code 130, SIGTERM "terminated" and 143, SIGHUP
    "hangup" and 129; a closed stdout (`specllm run ... | head`) ends the command quietly with
    exit code 0."""
    _end_on_termination()
    _open_closed_streams()
    _replace_what_stdout_cannot_encode()
    report.use(RichReporter())
    try:
        check_endpoint_parses()
        # Typer returns 130 for Ctrl-C instead of raising; every option reads its SPECLLM_ variable
        code = build_command(app)(standalone_mode=False, prog_name="specllm")
        sys.stdout.flush()  # a closed pipe shows here, not as a message at interpreter exit
    except SpecllmError as e:
        # shown: a message may quote a file name or a chat template's own error text, whose
        # escape sequences the terminal would obey (write the clipboard, clear the screen)
        print(f"error: {shown(error_line(e))}", file=sys.stderr)
        sys.exit(1)
    except NoArgsIsHelpError as e:
        print(e.ctx.get_help())
        sys.exit(0)
    except ClickException as e:
        print(f"error: {shown(e.format_message())}", file=sys.stderr)
        sys.exit(e.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        code = INTERRUPTED
    except Terminated as e:
        with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone
            print(ENDED_BY[e.signum], file=sys.stderr, flush=True)
        _quiet_exit(128 + e.signum)
    except SystemExit as e:
        if isinstance(e.__context__, BrokenPipeError):  # Typer and Rich exit 1 on a closed stdout
            _quiet_exit()
        raise
    except BrokenPipeError:  # from the flush above
        _quiet_exit()
    except (ImportError, RuntimeError) as e:
        if not _from_llama_cpps_import(e):
            raise
        print(f"error: {shown(_llama_cpp_unloadable(e))}", file=sys.stderr)
        sys.exit(1)
    except OSError as e:  # the system's, not the user's: the output's disk is full, an I/O error
        where = f": {e.filename}" if e.filename else ""
        print(shown(f"error: {e.strerror or e}{where}{open_files_hint(e)}"), file=sys.stderr)
        _quiet_exit(1)
    except MemoryError:  # Python's own allocation (llama.cpp's are its errors, or it aborts)
        print(f"error: out of memory{memory_limit_hint()}", file=sys.stderr)
        sys.exit(1)
    if code == INTERRUPTED:
        print("interrupted", file=sys.stderr)
    if isinstance(code, int) and code:
        sys.exit(code)


def _open_closed_streams() -> None:
    """A command started with stdout or stderr closed (`>&-`, a supervisor that gives it none)
    writes there to /dev/null, as if sent there: Python leaves such a stream None, which print()
    passes over but Rich, uvicorn's logging and run's views fail on with a traceback."""
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w", encoding="utf-8"))  # noqa: SIM115 (for the process)


def _replace_what_stdout_cannot_encode() -> None:
    """stdout in an encoding other than UTF-8 (a Latin-1 locale, PYTHONIOENCODING=ascii) cannot
    hold every character a model writes: such a character is written as "?", where it stopped
    the command with a traceback (UnicodeEncodeError) halfway through the text."""
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    if isinstance(sys.stdout, io.TextIOWrapper) and codecs.lookup(encoding).name != "utf-8":
        sys.stdout.reconfigure(errors="replace")


def _from_llama_cpps_import(error: BaseException) -> bool:
    """Whether importing llama_cpp failed: it is missing (pip install --no-deps), or its library
    will not load (a CUDA build on a machine without CUDA's libraries)."""
    if isinstance(error, ImportError) and error.name == "llama_cpp":
        return True
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and f"{os.sep}llama_cpp{os.sep}" in frames[-1].filename and "llama_cpp" not in sys.modules


def _llama_cpp_unloadable(error: BaseException) -> str:
    if isinstance(error, ImportError):
        problem = f"llama-cpp-python is not installed for {sys.executable}"
    else:
        problem = f"llama-cpp-python is installed but cannot load llama.cpp: {error}"
    return f"{problem} (install it as docs/install.md says: scripts/setup.sh, or pip for your GPU)"


def _quiet_exit(code: int = 0) -> None:
    """The reader of stdout went away (exit 0), or stdout cannot be written: exit, having pointed
    stdout and stderr at /dev/null so that flushing their buffers at interpreter exit cannot fail
    again ("Exception ignored ... BrokenPipeError", exit code 120)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:  # out of file descriptors: flushed as far as they go, then exit without another try
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            os.dup2(devnull, stream.fileno())
    sys.exit(code)


if __name__ == "__main__":
    main()
