"""The GGUF models on this machine: every one in specllm's cache and in the Hugging Face cache
(through huggingface_hub's own cache scan), and those other tools keep (Ollama, LM Studio,
llama.cpp's cache: see stores.py), their real sizes on disk, and removing them (Hub files through
huggingface_hub's own cache-deletion API). Nothing outside specllm's cache and the HF cache is
ever removed: every path is resolved (symlinks followed) and checked to be inside one, and a model
of another tool's store is refused by name.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from specllm.errors import SpecllmError
from specllm.files import cache_dir, human_size, read_json
from specllm.llama.gguf_header import read_metadata
from specllm.models.hub import DOWNLOAD_LABEL, hf_cache_dir, parse_hf_spec
from specllm.models.registry import SPLIT_NAME, ModelFile, Pair, split_parts

SPECLLM, HF = "specllm cache", "HF cache"


@dataclass(frozen=True)
class LocalModel:
    """One model on disk: a GGUF file, or all the parts of a split GGUF (in one folder)."""

    path: Path  # the file llama.cpp loads (the first part of a split model)
    parts: tuple[Path, ...]
    size: int  # bytes on disk, all parts
    cache: str  # SPECLLM or HF
    repo: str | None  # the Hub repository (HF cache; the mirror's repo for specllm's cache)
    file: str  # the file's path inside the repository (the first part)
    revision: str | None = None  # HF cache: the commit
    refs: tuple[str, ...] = ()  # HF cache: the branches / tags pointing at that commit
    complete: bool = True  # False: a split model with parts missing
    hf_files: tuple = ()  # HF cache: huggingface_hub's CachedFileInfo of each part
    name: str | None = None  # another tool's store: its SCHEME:NAME (ollama:qwen2.5-coder:7b)
    cut_short: bool = False  # a mirror download cut short: `path` is its folder, `parts` the wheels so far

    @property
    def spec(self) -> str:
        """How to name it on the command line (a file assembled from the mirror is the Hub's file)."""
        return self.name or f"hf:{self.repo}/{self.file}"

    def to_dict(self) -> dict:
        return {
            "path": str(self.path),
            "spec": self.spec,
            "cache": self.cache,
            "repo": self.repo,
            "file": self.file,
            "revision": self.revision,
            "refs": list(self.refs),
            "parts": [str(p) for p in self.parts],
            "size": self.size,
            "complete": self.complete,
            "cut_short": self.cut_short,
        }


def scan(problems: list[str] | None = None) -> list[LocalModel]:
    """Every GGUF model in specllm's cache and the HF cache, by name (not a file that a symlink
    in one of them leads to from outside it), and in other tools' stores (read in place, wherever
    their symlinks lead). The entries that had to be skipped, and why, go to `problems` (an HF
    cache that cannot be read is one: the rest is still listed)."""
    from specllm.models import stores

    in_hf, hf_problems = _scan_hf()
    own_problems: list[str] = []
    own = _scan_specllm(own_problems) + _scan_downloads(own_problems)
    found = [m for m in in_hf + own if _all_inside(m)]
    in_stores = stores.scan()
    if problems is not None:
        problems += hf_problems + own_problems + in_stores.problems
    return sorted(found + in_stores.models, key=lambda m: (m.spec, m.cache))


def architecture(path: Path) -> str | None:
    """general.architecture from a GGUF header (cheap: it comes first); None when unreadable."""
    try:
        return read_metadata(path, {"general.architecture"}).get("general.architecture")
    except SpecllmError:
        return None


def _all_inside(model: LocalModel) -> bool:
    root = hf_cache_dir() if model.cache == HF else cache_dir()
    return all(_inside(part.resolve(), root) for part in model.parts)


def size_on_disk(path: Path) -> int:
    """A model file's bytes; for a part NAME-0000i-of-0000N.gguf of a split model, all the parts
    beside it."""
    split = SPLIT_NAME.fullmatch(path.name)
    if split is None:
        return path.stat().st_size
    parts = path.parent.glob(f"{split['stem']}-*-of-{split['count']}.gguf")
    return sum(p.stat().st_size for p in parts)


def total_size(models: list[LocalModel]) -> int:
    """Bytes on disk, a file shared by two entries (two revisions of one blob) counted once."""
    sizes = {part.resolve(): part.stat().st_size for m in models for part in m.parts if part.exists()}
    return sum(sizes.values())


def _scan_hf() -> tuple[list[LocalModel], list[str]]:
    """The GGUF models in the HF cache, and lines saying what could not be listed, and why."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        info = scan_cache_dir(hf_cache_dir())
    except CacheNotFound:
        return [], []
    except ValueError as e:  # a file where the cache folder should be
        return [], [_hf_cache_unreadable(e)]
    except OSError as e:  # one folder without permission ends the whole scan
        return _scan_hf_repo_by_repo(e)
    return _hf_models(info.repos), _broken_repos(info.warnings) + _unfinished_downloads(info)


def _hf_cache_unreadable(error: Exception) -> str:
    return f"cannot read the HF cache {hf_cache_dir()}: {error}; its models are not listed"


def _broken_repos(warnings: list) -> list[str]:
    """The scan's warnings about model repositories it left out (see _has_snapshots)."""
    broken = [str(w) for w in warnings if _has_snapshots(str(w))]
    return [f"HF cache: {warning}; that repository's models are not listed" for warning in broken]


def _unfinished_downloads(info) -> list[str]:
    """A line for each file a download left unfinished: huggingface_hub names it after its own
    process, so one that was killed leaves it for good, unlisted and uncounted (huggingface_hub
    2.x's scan finds them; older ones do not)."""
    return [
        f"HF cache: {f.file_path} holds {human_size(f.size_on_disk)} of an unfinished download "
        "(a pull that was killed, unless one is under way now): delete it to free the space"
        for f in sorted(getattr(info, "incomplete_files", ()), key=lambda f: str(f.file_path))
    ]


def _scan_hf_repo_by_repo(error: OSError) -> tuple[list[LocalModel], list[str]]:
    """The scan one model repository at a time, so that one the user cannot read hides only its
    own models. This needs huggingface_hub's scan of a single repository, which it does not
    export: without it, the whole cache goes unlisted, as the scan left it."""
    try:
        from huggingface_hub.utils._cache_manager import _scan_cached_repo
    except ImportError:
        return [], [_hf_cache_unreadable(error)]
    from huggingface_hub.errors import CorruptedCacheException

    cache = hf_cache_dir().resolve()  # (as the scan names paths)
    try:
        folders = sorted(f for f in cache.iterdir() if f.name.startswith("models--"))
    except OSError as e:
        return [], [_hf_cache_unreadable(e)]
    repos, problems = [], []
    for folder in folders:
        try:
            repos.append(_scan_cached_repo(folder))
        except OSError as e:
            problems.append(_unreadable(folder, e, "the HF cache"))
        except CorruptedCacheException as e:
            problems += _broken_repos([e])
    return _hf_models(repos), problems


def _hf_models(repos) -> list[LocalModel]:
    models = []
    for repo in repos:
        if repo.repo_type != "model":
            continue
        for revision in repo.revisions:
            files = {_relative(f.file_path, revision.snapshot_path): f for f in revision.files}
            ggufs = {name: f for name, f in files.items() if name.endswith(".gguf")}
            for group in group_splits(list(ggufs)):
                infos = tuple(ggufs[name] for name in group.names)
                models.append(
                    LocalModel(
                        path=infos[0].file_path,
                        parts=tuple(f.file_path for f in infos),
                        size=sum(f.size_on_disk for f in infos),
                        cache=HF,
                        repo=repo.repo_id,
                        file=group.names[0],
                        revision=revision.commit_hash,
                        refs=tuple(sorted(revision.refs)),
                        complete=group.complete,
                        hf_files=infos,
                    )
                )
    return models


def _has_snapshots(warning: str) -> bool:
    """Whether a scan warning is about a model repository with snapshots: the scan leaves such a
    repository out whole (for one blob missing), and its models would vanish without a word. Other
    warnings are not about models: a file other libraries keep there (version.txt), a repository
    whose first download never got as far as a snapshot."""
    cache = hf_cache_dir().resolve()  # (the scan names paths in the resolved folder)
    repo = re.search(re.escape(str(cache)) + r"[/\\](models--[^/\\]+)", warning)
    return repo is not None and (cache / repo[1] / "snapshots").is_dir()


def _folders(root: Path, problems: list[str]) -> list[Path]:
    """The folders in `root`, a folder of specllm's cache (none where it is not one). A folder
    that cannot be read is one line in `problems`: it stopped `models`, and every run that looks
    for a draft on disk, with "error: Permission denied"; its models are only left out."""
    if not root.is_dir():
        return []
    try:
        return sorted(p for p in root.iterdir() if p.is_dir())
    except OSError as e:
        problems.append(_unreadable(root, e))
        return []


def _unreadable(folder: Path, error: OSError, cache: str = "specllm's cache") -> str:
    return f"cannot read {folder} in {cache}: {error.strerror or error}; its models are not listed"


def _scan_specllm(problems: list[str]) -> list[LocalModel]:
    """Files assembled from the mirror: <cache>/models/<owner>--<name>/<file>."""
    models = []
    for repo_dir in _folders(cache_dir() / "models", problems):
        try:  # rglob passes over a folder it cannot read without a word
            next(repo_dir.iterdir(), None)
        except OSError as e:
            problems.append(_unreadable(repo_dir, e))
            continue
        names = [_relative(p, repo_dir) for p in repo_dir.rglob("*.gguf") if not p.name.startswith(".") and p.is_file()]
        for group in group_splits(names):
            parts = tuple(repo_dir / name for name in group.names)
            models.append(
                LocalModel(
                    path=parts[0],
                    parts=parts,
                    size=sum(p.stat().st_size for p in parts),
                    cache=SPECLLM,
                    repo=repo_dir.name.replace("--", "/", 1),
                    file=group.names[0],
                    complete=group.complete,
                )
            )
    return models


def _scan_downloads(problems: list[str]) -> list[LocalModel]:
    """Mirror downloads cut short (<cache>/downloads/<sha256>/: the wheels fetched so far, kept so
    that the next pull goes on from them), named by the label the pull left there."""
    models = []
    for folder in _folders(cache_dir() / "downloads", problems):
        try:
            # the whole wheels and the label; pip's files in .incoming come and go while it works
            parts = tuple(sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")))
            size = sum(p.stat().st_size for p in parts)
        except FileNotFoundError:  # the pull finished (its folder removed) while this looked
            continue
        except OSError as e:
            problems.append(_unreadable(folder, e))
            continue
        label = read_json(folder / DOWNLOAD_LABEL)
        known = isinstance(label, dict) and isinstance(label.get("repo"), str) and isinstance(label.get("file"), str)
        models.append(
            LocalModel(
                path=folder,
                parts=parts,
                size=size,
                cache=SPECLLM,
                repo=label["repo"] if known else None,
                file=label["file"] if known else folder.name,
                complete=False,
                name=None if known else str(folder),
                cut_short=True,
            )
        )
    return models


def _relative(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


@dataclass(frozen=True)
class _Group:
    names: tuple[str, ...]  # the first part first
    complete: bool


def group_splits(names: list[str]) -> list[_Group]:
    """Files of one folder as models: a plain file alone; the parts NAME-0000i-of-0000N.gguf of a
    split model together, the first part first (complete when all N are there)."""
    plain: list[_Group] = []
    splits: dict[tuple[str, str], list[str]] = {}  # (stem, count) -> the parts there are
    for name in sorted(names):
        match = SPLIT_NAME.fullmatch(name)
        if match:
            splits.setdefault((match["stem"], match["count"]), []).append(name)
        else:
            plain.append(_Group((name,), True))
    for (_, count), parts in splits.items():
        plain.append(_Group(tuple(parts), len(parts) == int(count) and parts[0].endswith(f"-00001-of-{count}.gguf")))
    return plain


# --- removing ----------------------------------------------------------------------------------


def find_for_removal(what: str, pairs: dict[str, Pair]) -> list[LocalModel]:
    """The models on disk that `what` names: a pair (its files: target and draft, or the one file of
    a single-file entry), hf:REPO/FILE (every cached copy: both caches, every revision unless one
    is given), or a path inside one of the caches. Raises SpecllmError when it names nothing on
    disk, or a path outside the caches."""
    if not what.strip():
        # Path("") is the current folder: the message would be about "." rather than the name given
        raise SpecllmError(f"no model named {what!r}: give a pair name, hf:REPO/FILE or the path of a GGUF in a cache")
    _refuse_store_reference(what)
    models = scan()
    if what in pairs:
        pair = pairs[what]
        found = [m for m in models if any(_is(m, wanted) for wanted in pair.models)]
        if not found:
            raise SpecllmError(f"pair {what!r} is not downloaded: nothing to remove")
        return found
    if what.startswith("hf:"):
        spec = parse_hf_spec(what, {})
        found = [m for m in models if _is(m, spec) and (spec.revision == "main" or _at_revision(m, spec.revision))]
        if not found:
            raise SpecllmError(f"{what} is not in specllm's cache or the HF cache: nothing to remove")
        return found
    return [_by_path(Path(what).expanduser(), models)]


def _refuse_store_reference(what: str) -> None:
    """ollama:, lmstudio: and llamacpp: name another tool's files: never removed here. A name the
    store does not have is said to be missing first: refusing to remove it would suggest it exists."""
    from specllm.models import stores

    store = stores.store_name(what)
    if store is not None:
        try:
            stores.resolve(what)
        except SpecllmError as e:
            raise SpecllmError(f"nothing to remove: {e}") from None
        folder = stores.roots()[store][0]
        raise SpecllmError(
            f"refusing to remove {what}: it is in {store}'s store ({folder}), not specllm's; "
            + stores.REMOVE_HINTS[store]
        )


def _refuse_store_path(path: Path) -> None:
    from specllm.models import stores

    found = stores.store_of(path)
    if found is not None:
        store, folder = found
        raise SpecllmError(
            f"refusing to remove {path}: it is in {store}'s store ({folder}), not specllm's; "
            + stores.REMOVE_HINTS[store]
        )


def _is(model: LocalModel, wanted: ModelFile) -> bool:
    parts = split_parts(wanted.file) or [wanted.file]
    if model.cut_short:  # a download is one part's
        return model.repo == wanted.repo and model.file in parts
    # A split model with its first part missing is listed by the first part it has: the same model.
    return model.repo == wanted.repo and (split_parts(model.file) or [model.file])[0] == parts[0]


def _at_revision(model: LocalModel, revision: str) -> bool:
    return revision in model.refs or (model.revision or "").startswith(revision)


def _by_path(path: Path, models: list[LocalModel]) -> LocalModel:
    if not path.exists():
        raise SpecllmError(f"{path} is not a pair name, hf:REPO/FILE or an existing file: nothing removed")
    _refuse_store_path(path)
    real = path.resolve()
    if not any(_inside(real, root) for root in (cache_dir(), hf_cache_dir())):
        raise SpecllmError(
            f"refusing to remove {path}: it is not in specllm's cache ({cache_dir()}) "
            f"or the HF cache ({hf_cache_dir()})"
        )
    for model in models:
        if any(part.resolve() == real for part in model.parts) or (model.cut_short and model.path.resolve() == real):
            return model
    raise SpecllmError(f"{path} is not a GGUF model in specllm's cache or the HF cache: nothing removed")


def _inside(path: Path, root: Path) -> bool:
    return path.is_relative_to(root.resolve())


def remove(models: list[LocalModel]) -> int:
    """Delete these models' files; returns the bytes freed. Hub files go through huggingface_hub's
    cache-deletion strategy (a blob another revision still uses is kept); specllm's own files are
    unlinked. Every path is checked to be inside its cache first: if one is not, nothing is removed.
    Another tool's model is never removed (nothing is)."""
    for m in models:
        if m.cache not in (HF, SPECLLM):
            raise SpecllmError(
                f"refusing to remove {m.spec}: it is in {m.cache}'s store, not specllm's; nothing removed"
            )
    hf_files = [f for m in models if m.cache == HF for f in m.hf_files]
    strategy = _hf_strategy(hf_files) if hf_files else None
    own = [part for m in models if m.cache == SPECLLM and not m.cut_short for part in m.parts]
    downloads = [m.path for m in models if m.cut_short]
    paths = [(p, cache_dir()) for p in own + downloads]
    if strategy is not None:
        paths += [(p, hf_cache_dir()) for p in (*strategy.files, *strategy.blobs)]
    for path, root in paths:
        if not _inside(path.resolve(), root):  # e.g. a symlink pointing out of the cache
            raise SpecllmError(f"refusing to remove {path}: it leads out of {root}; nothing removed")
    freed = total_size([m for m in models if m.cache == SPECLLM])
    if strategy is not None:
        strategy.execute()
        freed += strategy.expected_freed_size
    for part in own:
        part.unlink(missing_ok=True)
        _remove_empty_folders(part.parent, cache_dir() / "models")
    for folder in downloads:
        _remove_download(folder)
    return freed


def _remove_download(folder: Path) -> None:
    """A download's folder, unless a pull is filling it now (it holds the lock beside it)."""
    from filelock import FileLock, Timeout

    lock = FileLock(folder.with_name(f"{folder.name}.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise SpecllmError(f"{folder} is being downloaded by another specllm process: not removed") from None
    try:
        shutil.rmtree(folder)
    finally:
        lock.release()
        Path(lock.lock_file).unlink(missing_ok=True)


def _hf_strategy(files: list):
    """huggingface_hub's plan to delete these files, from a fresh scan (its file records must
    be the scan's own: a record whose access time has changed since would keep its blob)."""
    from huggingface_hub import scan_cache_dir

    try:
        info = scan_cache_dir(hf_cache_dir())
    except OSError as e:  # a blob may be shared with a repository the scan could not read
        raise SpecllmError(
            f"cannot read {e.filename or hf_cache_dir()} in the HF cache: {e.strerror or e}; nothing removed "
            "(which files another model still uses is decided over the whole HF cache)"
        ) from None
    if not hasattr(info, "delete_files"):
        raise SpecllmError(
            "removing single files from the HF cache needs a newer huggingface_hub (pip install -U huggingface_hub)"
        )
    wanted = {f.file_path for f in files}
    fresh = [f for repo in info.repos for rev in repo.revisions for f in rev.files if f.file_path in wanted]
    return info.delete_files(*fresh)


def _remove_empty_folders(folder: Path, stop: Path) -> None:
    while folder != stop and _inside(folder.resolve(), stop) and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
        folder = folder.parent
