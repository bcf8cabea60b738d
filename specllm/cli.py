"""The `specllm` command: parse options, call the library, hand its events to a view."""

import json
import os
import sys
from typing import Annotated, Optional

import typer

try:  # typer >= 0.22 carries its own copy of click
    from typer._click.exceptions import ClickException, NoArgsIsHelpError
except ImportError:
    from click.exceptions import ClickException, NoArgsIsHelpError

from .errors import SpecllmError

app = typer.Typer(
    help="Fast local LLM inference on llama.cpp GGUF models through speculative decoding.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# --- options shared by run, chat and bench, declared once ----------------------------------------
Target = Annotated[Optional[str], typer.Option("--target", "-m", help="Target GGUF: a path or hf:REPO/FILE.")]
Draft = Annotated[Optional[str], typer.Option("--draft", "-md", help="Draft GGUF: a path or hf:REPO/FILE.")]
Drafter = Annotated[
    Optional[str],
    typer.Option(help="model | ngram | none (target only). Default: model when a draft is given, else ngram."),
]
Gamma = Annotated[int, typer.Option("--gamma", "-g", help="Draft length: tokens proposed per step.")]
MaxTokens = Annotated[int, typer.Option("--max-tokens", "-n", help="Tokens to generate at most.")]
Temperature = Annotated[float, typer.Option("--temperature", "--temp", "-t", help="0 is greedy.")]
TopK = Annotated[int, typer.Option("--top-k", help="Keep the k most likely tokens (0: off).")]
TopP = Annotated[float, typer.Option("--top-p", help="Keep the smallest set holding this much mass.")]
MinP = Annotated[float, typer.Option("--min-p", help="Drop tokens below min-p x the top probability.")]
Seed = Annotated[Optional[int], typer.Option(help="Random seed (default: a fresh one, reported in --json).")]
CtxSize = Annotated[int, typer.Option("--ctx-size", "-c", help="Context size in tokens, for each model.")]
Threads = Annotated[Optional[int], typer.Option(help="CPU threads (default: one per physical core).")]
GpuLayers = Annotated[
    Optional[int], typer.Option("--gpu-layers", "-ngl", help="Target layers on the GPU (default: all if supported).")
]
DraftGpuLayers = Annotated[
    Optional[int], typer.Option("--draft-gpu-layers", "-ngld", help="Draft layers on the GPU (default: all if supported).")
]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Say which backend and devices are used.")]


def load_engine(target, draft, drafter, ctx_size, threads, gpu_layers, draft_gpu_layers, verbose):
    """Load the models the options name; the draft model only when the drafter needs it."""
    from . import load

    if target is None:
        raise SpecllmError("no target model: give --target PATH")
    drafter = drafter or ("model" if draft else "ngram")
    if drafter == "model" and draft is None:
        raise SpecllmError("drafter 'model' needs --draft, or use --drafter ngram|none")
    if verbose:
        report_backend(threads, gpu_layers)
    engine = load(
        target,
        draft if drafter == "model" else None,
        n_ctx=ctx_size,
        n_threads=threads,
        n_gpu_layers=gpu_layers,
        draft_gpu_layers=draft_gpu_layers,
    )
    return engine, drafter


def report_backend(threads, gpu_layers) -> None:
    from .backend import default_gpu_layers, physical_cores, system_info

    info = system_info()
    layers = gpu_layers if gpu_layers is not None else ("all" if default_gpu_layers() else 0)
    print(
        f"llama-cpp-python {info['llama_cpp_python']} · GPU offload "
        f"{'available' if info['gpu_offload'] else 'not available (CPU build)'} · devices: "
        f"{', '.join(info['devices']) or 'CPU'} · threads {threads or physical_cores()} · GPU layers {layers}",
        file=sys.stderr,
    )


def read_prompt(prompt: str) -> str:
    if prompt == "-":
        return sys.stdin.read()
    return prompt


@app.command()
def run(
    prompt: Annotated[str, typer.Argument(help="The prompt, or - to read it from standard input.")],
    target: Target = None,
    draft: Draft = None,
    drafter: Drafter = None,
    gamma: Gamma = 4,
    max_tokens: MaxTokens = 256,
    temperature: Temperature = 0.8,
    top_k: TopK = 40,
    top_p: TopP = 0.95,
    min_p: MinP = 0.05,
    seed: Seed = None,
    ctx_size: CtxSize = 4096,
    threads: Threads = None,
    gpu_layers: GpuLayers = None,
    draft_gpu_layers: DraftGpuLayers = None,
    chat_template: Annotated[
        bool, typer.Option("--chat-template/--raw", help="Wrap the prompt in the model's chat template.")
    ] = True,
    system: Annotated[Optional[str], typer.Option(help="System message (with the chat template).")] = None,
    stop: Annotated[Optional[list[str]], typer.Option(help="Stop at this string (repeatable).")] = None,
    no_live: Annotated[bool, typer.Option("--no-live", help="Plain text, no live display.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object at the end.")] = False,
    verbose: Verbose = False,
):
    """Complete a prompt, showing live which draft tokens the target accepted and rejected."""
    from rich.console import Console

    from .engine import Finished, make_config
    from .view import LiveView, PlainView, use_live

    seed = seed if seed is not None else int.from_bytes(os.urandom(4), "little")
    config = make_config(
        max_tokens=max_tokens, drafter=drafter or ("model" if draft else "ngram"), gamma=gamma,
        stop=tuple(stop or ()), temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
    )  # fmt: skip
    text = read_prompt(prompt)
    engine, drafter = load_engine(target, draft, drafter, ctx_size, threads, gpu_layers, draft_gpu_layers, verbose)
    events = engine.stream(text, config, chat=chat_template, system=system)
    console = Console()
    if as_json:
        view = PlainView(drafter, show_summary=False)
    elif use_live(no_live, console):
        view = LiveView(console, drafter)
    else:
        view = PlainView(drafter)
    with view:
        for event in events:
            if isinstance(event, Finished):
                result = event.result
            elif not as_json:
                view.step(event)
        if not as_json:
            view.finish(result)
    if as_json:
        print(json.dumps(result_json(result, seed)))


def result_json(result, seed: int) -> dict:
    return {
        "text": result.text,
        "tokens": result.tokens,
        "stop_reason": result.stop_reason,
        "seed": seed,
        "stats": result.stats.to_dict(),
    }


@app.command()
def doctor():
    """Show the llama.cpp build, GPU offload support and devices."""
    from .backend import system_info

    info = system_info()
    for key, value in info.items():
        if isinstance(value, list):
            value = ", ".join(value) or "none"
        print(f"{key}: {value}")


def main() -> None:
    """Entry point: every user-facing error becomes one line on stderr and a non-zero exit code."""
    try:
        app(standalone_mode=False)
    except SpecllmError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except NoArgsIsHelpError as e:
        print(e.ctx.get_help())
        sys.exit(0)
    except ClickException as e:
        print(f"error: {e.format_message()}", file=sys.stderr)
        sys.exit(e.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:
        sys.stderr.close()  # the reader went away (e.g. `| head`): not an error worth a traceback
        sys.exit(0)


if __name__ == "__main__":
    main()
