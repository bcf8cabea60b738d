"""`specllm models`, `pull` and `rm`: the curated pairs and the models on disk, getting them onto
this machine and removing them.

The main Typer app registers these (app.command("models")(models_command), "pull" and "rm"); their
option aliases are cli/options.py's, shared with run/chat/bench. Problems are raised as SpecllmError; the app's
main() turns them into one line and exit code 1.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from specllm.cli.options import ModelsFileOption, OfflineOption, SourceOption
from specllm.cli.report import names_console
from specllm.engine.text import shown, shown_on_one_line
from specllm.errors import SpecllmError
from specllm.files import human_size
from specllm.models import local as local_models
from specllm.models import stores, winners
from specllm.models.hub import Source, cache_dir, cached_path, hf_cache_dir, parse_model_spec, resolve_models
from specllm.models.registry import ModelFile, Pair, load_pairs


def models_command(
    models_file: ModelsFileOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")] = False,
    drafts_for: Annotated[
        str | None,
        typer.Option(
            "--drafts-for",
            metavar="TARGET",
            help="List the GGUFs on disk that could draft for TARGET (a path, a downloaded hf:REPO/FILE, "
            "or ollama:/lmstudio:/llamacpp: NAME), compatible or not, and why.",
        ),
    ] = None,
) -> None:
    """List the curated pairs and every GGUF model on disk: specllm's cache, the Hugging Face
    cache, and the stores of Ollama, LM Studio and llama.cpp (used in place, never copied)."""
    pairs = load_pairs(models_file)
    if drafts_for is not None:
        _drafts_for(drafts_for, pairs, as_json)
        return
    problems: list[str] = []
    on_disk = local_models.scan(problems)
    architectures = {m.path: None if m.cut_short else local_models.architecture(m.path) for m in on_disk}
    total = local_models.total_size(on_disk)
    for problem in problems:  # (stderr: stdout stays one JSON object or the tables)
        print(f"warning: {shown(problem)}", file=sys.stderr)
    if as_json:
        listing = {
            "pairs": [_pair_dict(pair) for pair in pairs.values()],
            "models": [{**m.to_dict(), "architecture": architectures[m.path]} for m in on_disk],
            "total_size": total,
            "hf_cache": str(hf_cache_dir()),
            "specllm_cache": str(cache_dir()),
            "stores": {name: [str(f) for f in folders] for name, folders in stores.roots().items()},
            "problems": problems,
        }
        print(json.dumps(listing))
        return
    console = names_console()
    console.print(_pairs_table(pairs))
    console.print(_files_table(on_disk, total, architectures))
    where = [f"HF cache: {hf_cache_dir()}", f"specllm cache: {cache_dir()}"]
    where += [f"{name}: {', '.join(map(str, folders))}" for name, folders in stores.roots().items()]
    console.print("\n".join(map(_shown, where)), highlight=False, soft_wrap=True)


def _pairs_table(pairs: dict[str, Pair]) -> Table:
    table = Table(title="Model pairs (* = default)", title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)
    table.add_column("pair", no_wrap=True)
    table.add_column("target / draft", overflow="fold")
    table.add_column("size", justify="right", no_wrap=True)
    table.add_column("γ", justify="right")
    table.add_column("downloaded")
    for pair in pairs.values():
        names, sizes, where = zip(*(_model_cells(m) for m in (pair.target, pair.draft)))
        name = f"{pair.name} *" if pair.default else pair.name
        table.add_row(name, "\n".join(names), "\n".join(sizes), str(pair.gamma), "\n".join(where))
    return table


def _model_cells(model: ModelFile | None) -> tuple[str, str, str]:
    """A model's name, size and whether it is downloaded; "none" for the draft of a single-file entry."""
    if model is None:
        return "none", "-", "-"
    return _short(model), _size(model.total_size), _where(cached_path(model))


def _files_table(on_disk: list[local_models.LocalModel], total: int, architectures: dict) -> Table:
    title = f"GGUF models on disk: {len(on_disk)}, {_size(total)} in all"
    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)
    table.add_column("model", overflow="fold")
    table.add_column("where", no_wrap=True)
    table.add_column("architecture", no_wrap=True)
    table.add_column("size", justify="right", no_wrap=True)
    for m in on_disk:
        name = m.spec + (f" ({len(m.parts)} files)" if len(m.parts) > 1 else "")
        if m.cut_short:
            name = f"{m.spec} [download cut short: `specllm pull` goes on, `specllm rm` removes it]"
        elif not m.complete:
            name += " [parts missing]"
        table.add_row(_shown(name), _location(m), architectures[m.path] or "?", _size(m.size))
    return table


def _location(m: local_models.LocalModel) -> str:
    """The cache or store that holds a model; in the HF cache, with the refs (or commit) it is at."""
    if m.cache != local_models.HF or m.revision is None:  # every HF cache entry has its commit
        return m.cache
    return f"{m.cache} @{','.join(m.refs) or m.revision[:8]}"


def _pair_dict(pair: Pair) -> dict:
    def model(m: ModelFile | None) -> dict | None:
        if m is None:  # the draft of a single-file entry
            return None
        path = cached_path(m)
        return {"repo": m.repo, "file": m.file, "size": m.total_size, "path": str(path) if path else None}

    keys = ("name", "description", "default", "gamma")
    return {**{k: getattr(pair, k) for k in keys}, "target": model(pair.target), "draft": model(pair.draft)}


def _drafts_for(spec: str, pairs: dict[str, Pair], as_json: bool) -> None:
    from specllm.models.drafts import candidates

    target = _local_target(spec, pairs)
    found = candidates(target, pairs)
    fastest = winners.remembered(target)
    if as_json:
        measured = asdict(fastest) if fastest is not None else None
        print(
            json.dumps(
                {"target": str(target), "candidates": [c.to_dict() for c in found], "measured_fastest": measured}
            )
        )
        return
    what = spec if stores.store_name(spec) else target.name  # an Ollama blob's file name would say nothing
    title = f"Drafts on disk for {what} (tried in this order)"
    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)
    for column in ("model", "where", "size", "fits", "why"):
        table.add_column(column, overflow="fold", justify="right" if column == "size" else "left")
    for c in found:
        fits = {True: "[green]yes[/]", False: "[red]no[/]", None: "-"}[c.compatible]
        # (names and reasons quote file names and tokens: "[/]" in one was read as Rich markup, and failed)
        table.add_row(_shown(c.name), _shown(c.origin), _size(c.size), fits, _shown(c.reason))
    names_console().print(
        table
        if found
        else f"no other GGUF on disk (the caches and stores `specllm models` lists) to draft for {_shown(what)}"
    )
    if fastest is not None:  # what a run of this target alone uses before the order above
        speed = f"{fastest.speedup:.2f}x target-only, " if fastest.speedup is not None else ""
        names_console(highlight=False).print(
            f"Measured fastest here ({speed}`specllm bench --drafts-for`), used first: {_shown(fastest.name)}"
        )


def _local_target(spec: str, pairs: dict[str, Pair]) -> Path:
    """A local path, or the cached copy of an hf: spec (never downloaded here)."""
    model = parse_model_spec(spec, pairs)
    if isinstance(model, Path):
        return model
    path = cached_path(model)
    if path is None:
        raise SpecllmError(f"{spec} is not downloaded; `specllm run --target {spec} ...` downloads it")
    return path


def rm_command(
    what: Annotated[
        str,
        typer.Argument(
            help="A pair name, hf:REPO/FILE, or the path of a GGUF in one of the caches (never another tool's store).",
            show_default=False,
        ),
    ],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask before removing.")] = False,
    models_file: ModelsFileOption = None,
) -> None:
    """Remove downloaded models from specllm's cache and the Hugging Face cache (nothing else)."""
    found = local_models.find_for_removal(what, load_pairs(models_file))
    console = names_console(stderr=True, highlight=False)
    for m in found:
        files = f", {len(m.parts)} files" if len(m.parts) > 1 else ""
        console.print(_shown(f"{m.spec}  ({_size(m.size)}, {m.cache}{files})"), soft_wrap=True)
    total = _size(local_models.total_size(found))
    if not yes:
        if not sys.stdin.isatty():
            raise SpecllmError(
                "standard input is not a terminal: give --yes to remove without asking (nothing removed)"
            )
        if not _confirmed(f"Remove {'these' if len(found) > 1 else 'this'} ({total})? [y/N]: "):
            console.print("nothing removed")
            raise typer.Exit(1)
    freed = local_models.remove(found)
    console.print(f"removed {len(found)} model{'s' if len(found) > 1 else ''}, {_size(freed)} freed")


def _confirmed(question: str) -> bool:
    """Yes or no from the terminal; end of input (Ctrl-D) is no. Ctrl-C stays an interrupt."""
    print(question, end="", file=sys.stderr, flush=True)
    try:
        answer = input()
    except EOFError:
        print(file=sys.stderr)
        return False
    return answer.strip().lower() in ("y", "yes")


def pull_command(
    pair: Annotated[
        str | None,
        typer.Argument(
            help="Pair name (see `specllm models`), or one Hub file, hf:REPO[@REV]/FILE; default: the default pair.",
            show_default=False,
        ),
    ] = None,
    source: SourceOption = Source.auto,
    offline: OfflineOption = False,
    models_file: ModelsFileOption = None,
) -> None:
    """Download a pair's target and draft (if needed; a single-file entry has no draft), or one Hub
    file, check them, and say where they are."""
    if pair is not None and pair.startswith("hf:"):
        _pull_file(pair, source, offline, models_file)
        return
    target, draft, chosen = resolve_models(pair=pair, source=source, offline=offline, models_file=models_file)
    assert chosen is not None  # a pair was asked for, not --target
    console = names_console(highlight=False)
    for role, path in (("target", target), ("draft", draft)):
        if path is not None:
            console.print(_shown(f"{role:6}  {path}  ({_bytes(path)})"), soft_wrap=True)  # never break a path
    checked = "vocabularies match" if draft else _SINGLE_FILE
    console.print(f"[green]ready:[/] pair {chosen.name}, {checked}, recommended gamma {chosen.gamma}")


def _pull_file(spec: str, source: Source, offline: bool, models_file: Path | None) -> None:
    """One Hub file, checked as a pair's are (its size and SHA-256 as the Hub gives them, its GGUF
    header); the draft is chosen when it runs."""
    path, _, _ = resolve_models(target=spec, source=source, offline=offline, models_file=models_file)
    console = names_console(highlight=False)
    console.print(_shown(f"target  {path}  ({_bytes(path)})"), soft_wrap=True)
    console.print("[green]ready:[/] " + _shown(f"{spec}; `specllm run --target {spec}` runs it"), soft_wrap=True)


_SINGLE_FILE = "one file that drafts for itself (its MTP layers, if it has them, or n-gram copies)"


def _short(model: ModelFile) -> str:
    """A model's file name without .gguf and the split suffix ("(3 files)" instead)."""
    name = model.file.rsplit("/", 1)[-1].removesuffix(".gguf")
    if model.shards:
        return f"{name.rpartition('-00001-of-')[0] or name} ({len(model.parts)} files)"
    return name


def _where(path: Path | None) -> str:
    """Whether a model is downloaded, and into which cache."""
    if path is None:
        return "no"
    return "yes, specllm cache" if path.is_relative_to(cache_dir()) else "yes, HF cache"


def _bytes(path: Path) -> str:
    size = local_models.size_on_disk(path)
    return f"{size:,} bytes, {_size(size)}"


def _shown(text: str) -> str:
    """A name or a line that quotes one (a file name, a token), for Rich: its control characters
    made visible (an escape sequence in a file name was obeyed by the terminal) and its brackets
    never read as markup."""
    return escape(shown_on_one_line(text))


def _size(n: int | None) -> str:
    return "?" if n is None else human_size(n)


__all__ = [
    "models_command",
    "pull_command",
    "rm_command",
    "SourceOption",
    "OfflineOption",
    "ModelsFileOption",
]
