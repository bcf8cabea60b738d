"""The options that several commands share, declared once: each an `Annotated` alias that a
command's signature uses (`target: Target = None`), and the defaults read from the library's own
dataclasses rather than written again. `LoadOptions` carries the model/loading options from a
command to `load_engine`. `error_line` adds the flag that fixes a library error to its message:
the library's messages name no flags, since its callers are not all this CLI.

Nothing here may import llama_cpp: `--help` must stay quick."""

from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any

import typer

from specllm.engine.names import FIXED_GAMMA
from specllm.engine.sampling import MAX_SEED, SamplerSettings
from specllm.errors import (
    CannotTakeBack,
    ContextFull,
    ContextTooLarge,
    DraftNotLoaded,
    DraftTooLong,
    NeedsDraftModel,
    NoMirror,
    NoMtpLayers,
    NotDownloaded,
    SpecllmError,
)
from specllm.files import human_size
from specllm.llama.options import DEFAULT_SNAPSHOTS, ModelOptions
from specllm.models.hub import Source

# Defaults of the options below, from the dataclasses that check their values.
SAMPLER = SamplerSettings()
CTX_SIZE = ModelOptions.n_ctx
SNAPSHOTS = DEFAULT_SNAPSHOTS

# --- which models ------------------------------------------------------------------------------
PairOption = Annotated[
    str | None,
    typer.Option(
        "--pair", "-p", help="A curated pair (see `specllm models`); default: the default pair.", show_default=False
    ),
]
Target = Annotated[
    str | None,
    typer.Option(
        "--target",
        "-m",
        help="Target GGUF: a path, hf:REPO/FILE, or a model of another tool: ollama:NAME[:TAG], "
        "lmstudio:PUBLISHER/REPO/FILE, llamacpp:FILE.",
    ),
]
Draft = Annotated[
    str | None,
    typer.Option(
        "--draft",
        "-md",
        help="Draft GGUF: a path, hf:REPO/FILE or ollama:/lmstudio:/llamacpp: NAME; none: no draft model. "
        "Default with --target: a compatible GGUF on disk, if any.",
    ),
]
SourceOption = Annotated[
    Source,
    typer.Option(
        "--source", help="Where to download files that are not cached: auto (the Hub, then the mirror), hub or mirror."
    ),
]
OfflineOption = Annotated[bool, typer.Option("--offline", help="Use only files already downloaded; never the network.")]


def a_file(value: str) -> Path:
    """A file option's value, refused when empty: as a path "" is the current folder, which the
    user never named. Anything else is checked where it is read or written, which says what it
    is (a folder, a FIFO, a read-only file)."""
    if not value:
        raise typer.BadParameter("the value is empty: give a file")
    return Path(value)


def a_value(value: str) -> str:
    """A text option's value, refused when empty: `--rpc "$SERVERS"` with the variable unset would
    otherwise run as if the option were not there (an empty SPECLLM_* variable does count as unset)."""
    if not value:
        raise typer.BadParameter("the value is empty")
    return value


ModelsFileOption = Annotated[
    Path | None,
    typer.Option(
        "--models",
        help="An extra pairs file (TOML, like models.toml), added to the built-in pairs.",
        parser=a_file,
        metavar="<file>",
    ),
]

# --- drafting ----------------------------------------------------------------------------------
DrafterOption = Annotated[
    str | None,
    typer.Option(
        "--drafter",
        parser=a_value,
        help="auto | model | mtp | ngram | none (target only). Default: auto, which chooses an n-gram copy, "
        "the draft model, the target's own MTP layers or nothing each step, by measured costs; with "
        "--gamma alone: model when there is a draft, else ngram.",
    ),
]
Gamma = Annotated[
    int | None,
    typer.Option(
        "--gamma",
        "-g",
        show_default=False,
        help=f"Draft length of a fixed drafter (default: the pair's, else {FIXED_GAMMA}); "
        "with auto, the longest draft.",
    ),
]

# --- sampling ----------------------------------------------------------------------------------
MaxTokens = Annotated[int, typer.Option("--max-tokens", "-n", help="Tokens to generate at most.")]
Temperature = Annotated[float, typer.Option("--temperature", "--temp", "-t", help="0 is greedy.")]
TopK = Annotated[int, typer.Option("--top-k", help="Keep the k most likely tokens (0: off).")]
TopP = Annotated[float, typer.Option("--top-p", help="Keep the smallest set holding this much mass.")]
MinP = Annotated[float, typer.Option("--min-p", help="Drop tokens below min-p x the top probability.")]
Seed = Annotated[
    int | None,
    typer.Option(
        "--seed", min=0, max=MAX_SEED, help="Random seed, 0..2^32-1 (default: a fresh one, reported in --json)."
    ),
]

# --- structured output -------------------------------------------------------------------------
GrammarOption = Annotated[
    Path | None,
    typer.Option(
        "--grammar",
        parser=a_file,
        metavar="<file>",
        help="A GBNF grammar file (llama.cpp's grammars): the output follows it.",
    ),
]
JsonSchemaOption = Annotated[
    str | None,
    typer.Option(
        "--json-schema",
        parser=a_value,
        metavar="<file|JSON>",
        help="A JSON schema, in a file or given as JSON: the output is JSON that follows it ('{}': any object).",
    ),
]

# --- loading -----------------------------------------------------------------------------------
CtxSize = Annotated[int, typer.Option("--ctx-size", "-c", help="Context size in tokens, for each model.")]
Threads = Annotated[int | None, typer.Option("--threads", help="CPU threads (default: one per physical core).")]
GpuLayers = Annotated[
    int | None, typer.Option("--gpu-layers", "-ngl", help="Target layers on the GPU (default: all if supported).")
]
DraftGpuLayers = Annotated[
    int | None,
    typer.Option("--draft-gpu-layers", "-ngld", help="Draft layers on the GPU (default: all if supported)."),
]
Rpc = Annotated[
    str | None,
    typer.Option(
        "--rpc",
        parser=a_value,
        help="Put the target's layers on these llama.cpp rpc-servers, HOST:PORT,... (trusted networks only).",
    ),
]
DraftRpc = Annotated[
    str | None,
    typer.Option("--draft-rpc", parser=a_value, help="The same for the draft (default: the draft stays local)."),
]
Snapshots = Annotated[
    int,
    typer.Option(
        "--snapshots",
        help="Hybrid and recurrent targets (Qwen3.5, Granite 4, LFM2, ...): recurrent-state snapshots kept "
        "to take back rejected draft tokens, so the longest draft (each costs one more copy of the state).",
    ),
]
Verbose = Annotated[
    bool, typer.Option("--verbose", "-v", help="Say which backend and devices are used, and show llama.cpp's own log.")
]
NoLive = Annotated[bool, typer.Option("--no-live", help="Plain text, no live display.")]
Think = Annotated[
    bool | None,
    typer.Option(
        "--think/--no-think",
        help="Set the chat template's enable_thinking: a thinking model (Qwen3.5, Qwen3, GLM, ...) reasons "
        "before it answers, or not. Templates that do not read it ignore it. Default: the template's own.",
        show_default=False,
    ),
]
ReasoningEffort = Annotated[
    str | None,
    typer.Option(
        "--reasoning-effort",
        help="Set the chat template's reasoning_effort (gpt-oss: low, medium or high); none is --no-think.",
        show_default=False,
    ),
]


@dataclass(frozen=True)
class LoadOptions:
    """Which models to load and how: the options of those names that run, chat, bench and serve share."""

    pair: str | None = None
    target: str | None = None
    draft: str | None = None
    source: Source = Source.auto
    offline: bool = False
    models_file: Path | None = None
    ctx_size: int = CTX_SIZE
    threads: int | None = None
    gpu_layers: int | None = None
    draft_gpu_layers: int | None = None
    rpc: str | None = None
    draft_rpc: str | None = None
    snapshots: int = SNAPSHOTS
    verbose: bool = False

    @classmethod
    def pick(cls, params: dict) -> "LoadOptions":
        """The options among a command's parameters (its `locals()`), by name."""
        return cls(**{f.name: params[f.name] for f in fields(cls) if f.name in params})

    def target_options(self) -> ModelOptions:
        """The target's loading options, checked (a bad value is refused before any download)."""
        return ModelOptions(
            n_ctx=self.ctx_size,
            n_threads=self.threads,
            n_gpu_layers=self.gpu_layers,
            rpc=self.rpc or (),
            snapshots=self.snapshots,
        )

    def draft_options(self) -> ModelOptions:
        """The draft's: its own layers and RPC servers, no snapshots (it never takes tokens back)."""
        return ModelOptions(
            n_ctx=self.ctx_size,
            n_threads=self.threads,
            n_gpu_layers=self.draft_gpu_layers,
            rpc=self.draft_rpc or (),
            snapshots=0,
        )

    def check(self) -> None:
        """Refuse a bad context size, thread, layer or snapshot count, RPC server address or pairs
        file (--models: read even where only a target is named, so that a mistyped one is seen)
        before any model is downloaded or loaded."""
        self.target_options()
        self.draft_options()
        if self.models_file is not None:
            from specllm.models.registry import load_pairs

            load_pairs(self.models_file)


# --- one value on its own ---------------------------------------------------------------------
# The options that are a field of ModelOptions, which checks them.
MODEL_FIELDS = {
    "ctx_size": "n_ctx",
    "threads": "n_threads",
    "gpu_layers": "n_gpu_layers",
    "draft_gpu_layers": "n_gpu_layers",
    "rpc": "rpc",
    "draft_rpc": "rpc",
    "snapshots": "snapshots",
}
SAMPLER_FIELDS = ("temperature", "top_k", "top_p", "min_p")


def check_alone(name: str, value, command: str = "", params: dict | None = None) -> None:
    """Refuse, with the message the command's own checks give, a value of the option `name` of
    `command` that is bad whatever the other options are; pass any other (one checked only with
    the others). `params`, the command's other values, say where to look up a name (a pair in
    --models, a category in --prompts); a problem with those is theirs, said when they are read."""
    if value is None:
        return
    params = params or {}
    if name in SAMPLER_FIELDS:
        SamplerSettings(**{name: value})
    elif name in MODEL_FIELDS:
        ModelOptions(**{MODEL_FIELDS[name]: value})
    elif name in ("max_tokens", "gamma") and isinstance(value, int):  # bench's --gamma is a list
        from specllm.engine.loop import make_config  # imports llama_cpp: only when a command runs

        make_config(**{name: value})
    elif name in TEXT_OPTIONS:
        from specllm.engine.text import check_utf8

        for text in value if isinstance(value, (list, tuple)) else [value]:
            check_utf8(text, TEXT_OPTIONS[name])
    elif command == "bench" and name in BENCH_CHECKS:
        BENCH_CHECKS[name](value, params)
    elif name in MODEL_CHECKS:
        MODEL_CHECKS[name](value, params)


Check = Callable[[Any, dict], None]  # (value, the command's other values): raises SpecllmError

# Options whose text goes to the model: the name the command's own check gives each.
TEXT_OPTIONS = {"system": "--system", "stop": "--stop", "suffix": "the suffix"}


def _check_drafter(value: str, params: dict) -> None:
    from specllm.engine.loop import make_config

    make_config(drafter=value)


def _check_pair(value: str, params: dict) -> None:
    from specllm.models.registry import get_pair

    pairs = _pairs_or_none(params)
    if pairs is not None:
        get_pair(value, pairs)


def _check_pairs_file(value: Path, params: dict) -> None:
    from specllm.models.registry import load_pairs

    load_pairs(value)


def _check_model(value: str, params: dict) -> None:
    """A local path or another tool's model must be there; an hf: reference well formed (it may
    still have to be downloaded)."""
    from specllm.models.hub import parse_model_spec

    pairs = _pairs_or_none(params)
    if value != "none" and pairs is not None:
        parse_model_spec(value, pairs)


def _check_transcript(value: Path, params: dict) -> None:
    from specllm.chat.session import read_transcript

    read_transcript(value)


def _check_api_key(value: str, params: dict) -> None:
    from specllm.serve.server import check_api_key

    check_api_key(value)


def _check_host(value: str, params: dict) -> None:
    """A name that does not resolve: said now, not once the models have loaded."""
    import socket

    try:
        socket.getaddrinfo(value, None)
    except (socket.gaierror, UnicodeError) as e:
        raise SpecllmError(f"cannot listen on {value}: {getattr(e, 'strerror', None) or e}") from None


def _pairs_or_none(params: dict):
    """The pairs of the command's pairs files; None when they cannot be read (their own error)."""
    from specllm.models.registry import load_pairs

    try:
        return load_pairs(params.get("models_file"))
    except SpecllmError:
        return None


MODEL_CHECKS: dict[str, Check] = {
    "drafter": _check_drafter,
    "pair": _check_pair,
    "models_file": _check_pairs_file,
    "target": _check_model,
    "draft": _check_model,
    "drafts_for": _check_model,
    "resume": _check_transcript,
    "api_key": _check_api_key,
    "host": _check_host,
}


def _check_bench_drafters(value: str, params: dict) -> None:
    from specllm.bench import runner as b

    b.configurations(b.parse_list(value, "drafter"), [1])


def _check_bench_gammas(value: str, params: dict) -> None:
    from specllm.bench import runner as b
    from specllm.engine.loop import make_config

    for gamma in b.parse_gammas(value):
        make_config(gamma=gamma)


def _check_prompt_file(value: Path, params: dict) -> None:
    from specllm.bench import runner as b

    b.load_prompts(value)


def _check_categories(value: str, params: dict) -> None:
    from specllm.bench import runner as b

    wanted = b.parse_list(value, "category")
    try:
        suite = b.load_prompts(params["prompts"]) if params.get("prompts") else b.builtin_prompts()
    except SpecllmError:
        return
    b.select_prompts(suite, wanted)


def _check_per_category(value: int, params: dict) -> None:
    from specllm.bench import runner as b

    b.select_prompts([], per_category=value)


# bench's own options (its --drafter and --gamma are lists), and those the other commands share.
BENCH_CHECKS: dict[str, Check] = {
    "drafter": _check_bench_drafters,
    "gamma": _check_bench_gammas,
    "prompts": _check_prompt_file,
    "categories": _check_categories,
    "per_category": _check_per_category,
}


# --- what to change on the command line ---------------------------------------------------------
def error_line(error: SpecllmError) -> str:
    """The one line the CLI prints for a library error: its message, and for the errors that a
    flag can fix, which flag."""
    return f"{error}{flag_hint(error)}"


def flag_hint(error: SpecllmError) -> str:
    if isinstance(error, DraftNotLoaded):  # a deferred draft's load: its error's hint
        return flag_hint(error.cause)
    if isinstance(error, ContextFull):
        return ": raise --ctx-size or shorten the prompt"
    if isinstance(error, ContextTooLarge):
        return f": use --ctx-size {error.fits} or less" if error.fits else ": free some memory, or use a smaller model"
    if isinstance(error, NeedsDraftModel):
        if error.pair:
            return ": use --drafter auto|mtp|ngram|none"
        if error.none_fits:  # a target given alone: --pair would not go with it
            return ": give --draft, or use --drafter auto|ngram|none"
        return ": give --draft or --pair, or use --drafter auto|mtp|ngram|none"
    if isinstance(error, NoMtpLayers):
        return ": use --drafter auto, ngram or model"
    if isinstance(error, DraftTooLong):
        return (
            f": use --gamma {error.snapshots} or less, or --snapshots {error.gamma} "
            f"(each snapshot costs {human_size(error.snapshot_bytes)} of memory)"
        )
    if isinstance(error, CannotTakeBack):
        return ", or use --drafter none"
    if isinstance(error, NotDownloaded):
        return " (--offline or HF_HUB_OFFLINE)"
    if isinstance(error, NoMirror):
        return "; use --source hub or auto"
    return ""
