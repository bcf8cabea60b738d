"""`specllm models` and `specllm pull`: the curated pairs, and getting them onto this machine.

The main Typer app registers these (app.command("models")(models_command), and "pull"). The
option aliases are shared with run/chat/bench. Problems are raised as SpecllmError; the app's
main() turns them into one line and exit code 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from .hub import Source, cache_dir, cached_path, hf_cache_dir, resolve_models
from .registry import ModelFile, load_pairs

PairArgument = Annotated[
    Optional[str],
    typer.Argument(help="Pair name (see `specllm models`); default: the default pair.", show_default=False),
]
SourceOption = Annotated[
    Source,
    typer.Option(
        "--source", help="Where to download files that are not cached: auto (the Hub, then the mirror), hub or mirror."
    ),
]
OfflineOption = Annotated[bool, typer.Option("--offline", help="Use only files already downloaded; never the network.")]
ModelsFileOption = Annotated[
    Optional[Path],
    typer.Option(
        "--models", help="An extra pairs file (TOML, like models.toml), added to the built-in pairs.", dir_okay=False
    ),
]


def models_command(models_file: ModelsFileOption = None) -> None:
    """List the curated target/draft pairs, and which are downloaded."""
    pairs = load_pairs(models_file)
    table = Table(title="Model pairs (* = default)", title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)
    table.add_column("pair", no_wrap=True)
    table.add_column("target / draft", overflow="fold")
    table.add_column("size", justify="right", no_wrap=True)
    table.add_column("γ", justify="right")
    table.add_column("downloaded")
    for pair in pairs.values():
        target, draft = cached_path(pair.target), cached_path(pair.draft)
        table.add_row(
            f"{pair.name} *" if pair.default else pair.name,
            f"{_short(pair.target)}\n{_short(pair.draft)}",
            f"{_size(pair.target.total_size)}\n{_size(pair.draft.total_size)}",
            str(pair.gamma),
            "\n".join(_where(p) for p in (target, draft)),
        )
    console = Console()
    console.print(table)
    console.print(f"HF cache: {hf_cache_dir()}\nspecllm cache: {cache_dir()}", highlight=False, soft_wrap=True)


def pull_command(
    pair: PairArgument = None,
    source: SourceOption = Source.auto,
    offline: OfflineOption = False,
    models_file: ModelsFileOption = None,
) -> None:
    """Download a pair's target and draft (if needed), check them, and say where they are."""
    target, draft, chosen = resolve_models(pair=pair, source=source, offline=offline, models_file=models_file)
    console = Console(highlight=False)
    for role, path in (("target", target), ("draft", draft)):
        console.print(f"{role:6}  {path}  ({_bytes(path)})", soft_wrap=True)  # never break a path
    console.print(f"[green]ready:[/] pair {chosen.name}, vocabularies match, recommended gamma {chosen.gamma}")


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
    size = _total_size(path)
    return f"{size:,} bytes, {_size(size)}"


def _total_size(path: Path) -> int:
    """A split model's size is the size of all its parts (*-0000N-of-0000M.gguf beside it)."""
    stem, marker, _ = path.name.rpartition("-00001-of-")
    if not marker:
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.parent.glob(f"{stem}-*-of-*.gguf"))


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    if n < 1000:
        return f"{n} B"
    for unit in ("KB", "MB"):
        n /= 1000
        if n < 1000:
            return f"{n:.1f} {unit}"
    return f"{n / 1000:.1f} GB"


__all__ = ["models_command", "pull_command", "PairArgument", "SourceOption", "OfflineOption", "ModelsFileOption"]
