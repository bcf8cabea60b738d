"""GGUF models that other tools keep on this machine, found where those tools put them and used
in place: never copied, never written, never removed.

- Ollama: $OLLAMA_MODELS, else ~/.ollama/models. A model NAME:TAG is a manifest at
  manifests/<registry>/<namespace>/<model>/<tag> (JSON); its layer of media type
  application/vnd.ollama.image.model names the blob blobs/sha256-<hex>, a GGUF file (Ollama's
  own layout: manifest/paths.go, types/model/name.go, server/images.go). `ollama:NAME` means tag
  latest, namespace library; the registry is whichever registry folder on disk holds the name
  (none is assumed: the folders under manifests/ are the registries).
- LM Studio: its models folder, <publisher>/<repo>/<file>.gguf: `downloadsFolder` in its
  settings.json, else <home>/models, where home is what ~/.lmstudio-home-pointer names, else
  ~/.cache/lm-studio (older installs) if it exists, else ~/.lmstudio (as LM Studio finds it).
  SPECLLM_LMSTUDIO_HOME overrides the home (LM Studio reads no variable of its own).
- llama.cpp's download cache: $LLAMA_CACHE, else the platform's cache folder + llama.cpp (as
  common.cpp's fs_get_cache_directory): the files `-mu` and older `-hf` downloads left there, by
  their names; with LLAMA_CACHE set, newer llama.cpp keeps Hub downloads there in the HF layout
  (models--OWNER--REPO/snapshots/...), listed by their paths inside it.

Each is named SCHEME:NAME (ollama:qwen2.5-coder:7b, lmstudio:PUBLISHER/REPO/FILE.gguf,
llamacpp:FILE.gguf). A store that cannot be read, a manifest that is not JSON or names no model,
a blob that is missing: resolving such a name raises SpecllmError (one line); listing skips the
entry and reports the problem.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from specllm.errors import SpecllmError
from specllm.files import kind_of_file, read_text_file
from specllm.models.local import LocalModel, group_splits
from specllm.models.registry import split_parts

OLLAMA, LMSTUDIO, LLAMACPP = "Ollama", "LM Studio", "llama.cpp cache"
SCHEMES = {"ollama:": OLLAMA, "lmstudio:": LMSTUDIO, "llamacpp:": LLAMACPP}
LMSTUDIO_HOME_VARIABLE = "SPECLLM_LMSTUDIO_HOME"

_OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
_OLLAMA_NAMESPACE, _OLLAMA_TAG = "library", "latest"  # Ollama's defaults for a bare name
_DIGEST = re.compile(r"sha256[:-](?P<hex>[0-9a-fA-F]{64})")
# One part of an Ollama name (types/model/name.go isValidPart): it can never be "." or "..".
_OLLAMA_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}")
_OLLAMA_HOST = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,349}")
# A manifest, LM Studio's settings.json, its home pointer: a few KB each. A damaged one of gigabytes
# would take its size in memory, for every listing and every search for a draft.
_STORE_FILE_MAX_BYTES = 4 * 2**20


@dataclass(frozen=True)
class Scan:
    models: list[LocalModel]
    problems: list[str]  # one line per entry that was skipped, and why


# --- where the stores are ----------------------------------------------------------------------


def ollama_roots() -> list[Path]:
    explicit = os.environ.get("OLLAMA_MODELS")
    return [_expand(explicit)] if explicit else [Path.home() / ".ollama" / "models"]


def lmstudio_roots() -> list[Path]:
    """The configured models folder, and the default one beside it when settings moved it."""
    home = lmstudio_home()
    roots = [home / "models"]
    configured = _lmstudio_downloads_folder(home)
    if configured is not None and configured != roots[0]:
        roots.insert(0, configured)
    return roots


def lmstudio_home() -> Path:
    explicit = os.environ.get(LMSTUDIO_HOME_VARIABLE)
    if explicit:
        return _expand(explicit)
    try:
        pointed = _read_store_file(Path.home() / ".lmstudio-home-pointer").strip()
    except (OSError, UnicodeDecodeError):
        pointed = ""
    if pointed:
        return _expand(pointed)
    older = Path.home() / ".cache" / "lm-studio"
    return older if older.is_dir() else Path.home() / ".lmstudio"


def _lmstudio_downloads_folder(home: Path) -> Path | None:
    """settings.json's downloadsFolder (the folder the user moved the models to), if it names one."""
    try:
        settings = json.loads(_read_store_file(home / "settings.json"))
    except (OSError, ValueError, RecursionError):
        return None
    folder = settings.get("downloadsFolder") if isinstance(settings, dict) else None
    return _expand(folder) if isinstance(folder, str) and folder.strip() else None


def _read_store_file(path: Path) -> str:
    """A small text file of another tool's; one that is not a regular file (a FIFO would be waited
    on for ever) or is too large is an OSError, as an unreadable one is."""
    return read_text_file(path, max_bytes=_STORE_FILE_MAX_BYTES)


def llamacpp_roots() -> list[Path]:
    """llama.cpp's cache folder, worked out as fs_get_cache_directory does."""
    explicit = os.environ.get("LLAMA_CACHE")
    if explicit:
        return [_expand(explicit)]
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return [base / "llama.cpp"]


def roots() -> dict[str, list[Path]]:
    """Every store's folders, by store."""
    return {OLLAMA: ollama_roots(), LMSTUDIO: lmstudio_roots(), LLAMACPP: llamacpp_roots()}


def _expand(path: str) -> Path:
    return Path(os.path.expandvars(os.path.expanduser(path)))


def store_of(path: Path) -> tuple[str, Path] | None:
    """The store (name, folder) that `path` is in, or None; symlinks are followed, and a path in a
    store is in it whether or not it is a model of it."""
    from specllm.files import cache_dir
    from specllm.models.hub import hf_cache_dir

    real = path.resolve()
    ours = {cache_dir().resolve(), hf_cache_dir().resolve()}  # (LLAMA_CACHE may be the HF cache)
    for name, folders in roots().items():
        for folder in folders:
            if folder.resolve() in ours:
                continue
            if real.is_relative_to(folder.resolve()) or path.absolute().is_relative_to(folder.absolute()):
                return name, folder
    return None


def store_name(spec: str) -> str | None:
    """The store a SCHEME:NAME reference names (None: not one)."""
    return next((store for scheme, store in SCHEMES.items() if spec.startswith(scheme)), None)


REMOVE_HINTS = {
    OLLAMA: "remove it with `ollama rm`",
    LMSTUDIO: "remove it in LM Studio (or `lms rm`)",
    LLAMACPP: "it is llama.cpp's download cache: remove the file yourself if you want it gone",
}


# --- resolving a name --------------------------------------------------------------------------


def resolve(spec: str) -> Path:
    """The GGUF file a SCHEME:NAME reference names (for a split model, its first part). Raises
    SpecllmError, one line, when it names nothing usable."""
    scheme, name = spec.split(":", 1)
    if not name:
        raise SpecllmError(f"bad model {spec!r}: nothing after '{scheme}:'")
    if scheme == "ollama":
        return _resolve_ollama(spec, name)
    return _resolve_file(
        spec, name, lmstudio_roots() if scheme == "lmstudio" else llamacpp_roots(), SCHEMES[scheme + ":"]
    )


def _resolve_file(spec: str, name: str, folders: list[Path], store: str) -> Path:
    """lmstudio: and llamacpp: name a file by its path inside the store's folder; any part of a
    split model names its first part, the one llama.cpp loads (it refuses any other)."""
    parts = name.split("/")
    if not name.endswith(".gguf") or any(p in ("", ".", "..") for p in parts) or "\\" in name:
        raise SpecllmError(f"bad model {spec!r}: expected a .gguf file's path inside {store}'s folder")
    names = split_parts(name) or [name]  # a split model's parts, the first first
    first = names[0]
    for folder in folders:
        _check_readable(folder, store)
        path = folder / first
        if _is_file(path):
            return path
    others = [*names[1:], name]  # (the name itself too: a part numbered past its count is none of `names`)
    other = next((folder / p for folder in folders for p in others if _is_file(folder / p)), None)
    if other is not None:  # (`models` lists such parts by the first one there is: "no such model" was wrong)
        raise SpecllmError(
            f"{spec}: the first part of this split model, {other.with_name(first.rsplit('/', 1)[-1])}, "
            "is missing (llama.cpp loads a split model from its first part)"
        )
    where = " or ".join(str(f) for f in folders)
    raise SpecllmError(f"no {spec} in {where} (`specllm models` lists the models there)")


def _check_readable(folder: Path, store: str) -> None:
    """A store folder that exists but cannot be listed (a file in its place, no permission) is a
    problem to say; one that does not exist is only empty."""
    problem = _folder_problem(folder, store)
    if problem:
        raise SpecllmError(problem)


def _is_file(path: Path) -> bool:
    """Whether `path` is a file; a folder on the way that cannot be searched (no permission) is a
    problem to say, one line: Path.is_file() raises for it rather than answering. So is a link to
    no file (a model linked in from a disk not mounted, from an Ollama blob since removed): "no such
    model" would be wrong, and a listing would pass over it without a word."""
    try:
        if path.is_file():
            return True
        target = os.readlink(path) if path.is_symlink() else None
    except OSError as e:
        raise SpecllmError(f"cannot read {path}: {e.strerror or e}") from None
    if target is not None:
        raise SpecllmError(f"{path} is a link to {target}, which is not a file")
    return False


def _files(paths) -> tuple[list[Path], list[str]]:
    """The files among `paths`, sorted, and a line for each that could not be looked at."""
    files, problems = [], []
    for path in paths:
        try:
            if _is_file(path):
                files.append(path)
        except SpecllmError as e:
            problems.append(f"{e}; skipped")
    return sorted(files), problems


def _walk(folder: Path, problems: list[str], depth: int | None = None) -> Iterator[Path]:
    """Every entry but the folders under `folder` (only those `depth` levels down, if given), as
    glob finds them, except that a folder that cannot be listed is a problem to say, where glob
    passes over it in silence. Links to folders are followed (a publisher's folder moved to another
    disk and linked back); without a depth to stop at, each real folder is walked once, under the
    first name found for it in name order: a link back up the tree would go round for ever. A stack
    rather than os.walk, which recurses a level a call (up to Python 3.12): folders nested a
    thousand deep ended the whole listing with a RecursionError."""
    if not folder.is_dir():
        return
    walked, stack = set(), [folder]
    while stack:
        top = stack.pop()
        try:
            info = os.stat(top)  # (a folder's identity: realpath costs a call per folder above it)
            if (info.st_dev, info.st_ino) in walked and depth is None:
                continue
            walked.add((info.st_dev, info.st_ino))
            with os.scandir(top) as entries:
                found = sorted((entry.name, _is_folder(entry)) for entry in entries)
        except OSError as e:
            problems.append(f"cannot read {e.filename}: {e.strerror or e}; skipped")
            continue
        level = len(top.relative_to(folder).parts) + 1  # of the entries in `top`
        if depth is None or level == depth:
            yield from (top / name for name, is_folder in found if not is_folder)
        if depth is None or level < depth:
            stack += [top / name for name, is_folder in reversed(found) if is_folder]


def _is_folder(entry: os.DirEntry) -> bool:
    """Whether an entry is a folder, or a link to one (one that cannot be looked at is not)."""
    try:
        return entry.is_dir()
    except OSError:
        return False


def _folder_problem(folder: Path, store: str) -> str | None:
    try:
        if folder.exists() or folder.is_symlink():
            next(iter(os.scandir(folder)), None)
    except OSError as e:
        return f"cannot read {store}'s folder {folder}: {e.strerror or e}"
    return None


@dataclass(frozen=True)
class _OllamaName:
    host: str | None  # None: whichever registry on disk holds it
    namespace: str
    model: str
    tag: str


def parse_ollama_name(text: str) -> _OllamaName:
    """[[HOST/]NAMESPACE/]MODEL[:TAG], as Ollama's ParseNameBare splits it (a tag is what follows
    the last ':' after the last '/'). Raises SpecllmError for a name Ollama would not accept."""
    rest, tag = text, _OLLAMA_TAG
    if text.rfind(":") > text.rfind("/"):
        rest, tag = text.rsplit(":", 1)
    pieces = rest.split("/")
    if len(pieces) > 3:
        pieces = ["/".join(pieces[:-2]), *pieces[-2:]]  # (a host never has a '/': refused below)
    host = pieces[0] if len(pieces) == 3 else None
    namespace = pieces[-2] if len(pieces) >= 2 else _OLLAMA_NAMESPACE
    if not _is_ollama_name(host, namespace, pieces[-1], tag):
        raise SpecllmError(f"bad Ollama model name {text!r}: expected [[REGISTRY/]NAMESPACE/]MODEL[:TAG]")
    return _OllamaName(host, namespace, pieces[-1], tag)


def _is_ollama_name(host: str | None, namespace: str, model: str, tag: str) -> bool:
    """Whether Ollama accepts these parts of a name (host None: not given)."""
    parts_ok = all(_OLLAMA_PART.fullmatch(part) for part in (namespace, model, tag)) and "." not in namespace
    return parts_ok and (host is None or _OLLAMA_HOST.fullmatch(host) is not None)


def _resolve_ollama(spec: str, text: str) -> Path:
    name = parse_ollama_name(text)
    manifest = _find_manifest(spec, name)
    return _model_blob(manifest, spec)


def _find_manifest(spec: str, name: _OllamaName) -> Path:
    """The manifest of `name`: under its registry, or under the one registry folder on disk that
    holds it."""
    found = []
    for root in ollama_roots():
        manifests = root / "manifests"
        _check_readable(root, OLLAMA)
        _check_readable(manifests, OLLAMA)
        hosts = [name.host] if name.host else _registries(manifests)
        for host in hosts:
            path = manifests
            for part in (host, name.namespace, name.model, name.tag):
                path = _entry_of_any_case(path, part)
            if _is_file(path):
                found.append(path)
        if found:
            break
    if not found:
        where = ", ".join(str(r) for r in ollama_roots())
        raise SpecllmError(
            f"no Ollama model {spec} in {where} (`specllm models` lists the ones there; `ollama pull` gets it)"
        )
    if len(found) > 1:
        names = ", ".join("ollama:{}/{}/{}:{}".format(*p.parts[-4:]) for p in found)
        raise SpecllmError(f"{spec} is in more than one registry: name one ({names})")
    return found[0]


def _entry_of_any_case(folder: Path, name: str) -> Path:
    """folder/name, or else the entry of `folder` that is `name` but for case: Ollama reads names
    so (`ollama run Qwen3` runs qwen3), part by part, where a file system tells case apart."""
    exact = folder / name
    if os.path.exists(exact):  # (a folder that cannot be searched: _is_file says so)
        return exact
    try:
        entries = sorted(os.listdir(folder))
    except OSError:
        return exact
    return next((folder / entry for entry in entries if entry.lower() == name.lower()), exact)


def _registries(manifests: Path) -> list[str]:
    try:
        return sorted(p.name for p in manifests.iterdir() if p.is_dir())
    except OSError:  # (no manifests folder: no models)
        return []


def _model_blob(manifest: Path, spec: str) -> Path:
    """The blob of the manifest's model layer (the last one, as Ollama's GetModel takes it).
    Raises SpecllmError for a manifest that is not JSON, names no model layer, or whose blob is
    not there."""
    try:
        data = json.loads(_read_store_file(manifest))
    except OSError as e:
        raise SpecllmError(f"cannot read the Ollama manifest {manifest}: {e.strerror or e}") from None
    except (ValueError, RecursionError):
        raise SpecllmError(f"bad Ollama manifest {manifest}: not JSON") from None
    layers = data.get("layers") if isinstance(data, dict) else None
    digests = [
        layer.get("digest")
        for layer in (layers if isinstance(layers, list) else [])
        if isinstance(layer, dict) and layer.get("mediaType") == _OLLAMA_MODEL_LAYER
    ]
    if not digests:
        raise SpecllmError(f"bad Ollama manifest {manifest}: no layer of type {_OLLAMA_MODEL_LAYER} (not a GGUF model)")
    match = _DIGEST.fullmatch(digests[-1]) if isinstance(digests[-1], str) else None
    if match is None:
        raise SpecllmError(f"bad Ollama manifest {manifest}: its model layer's digest is not sha256:<64 hex digits>")
    blob = manifest.parents[4] / "blobs" / f"sha256-{match['hex']}"
    try:
        present = _is_file(blob)
    except SpecllmError as e:
        raise SpecllmError(f"{spec}: {e}") from None
    if not present and blob.exists():  # (a folder, a FIFO: pulling again would not replace it)
        raise SpecllmError(f"{spec}: its model blob {blob} is {kind_of_file(blob.stat().st_mode)}, not a file")
    if not present:
        raise SpecllmError(f"{spec}: its model blob {blob} is missing (`ollama pull` fetches it again)")
    return blob


# --- listing -----------------------------------------------------------------------------------


def scan() -> Scan:
    """Every GGUF model in the stores, and a line for each entry that had to be skipped."""
    models, problems = [], []
    for scanner in (_scan_ollama, _scan_lmstudio, _scan_llamacpp):
        found = scanner()
        models += found.models
        problems += found.problems
    return Scan(models, problems)


def _scan_ollama() -> Scan:
    models, problems = [], []
    for root in ollama_roots():
        manifests = root / "manifests"
        problem = _folder_problem(root, OLLAMA) or _folder_problem(manifests, OLLAMA)
        if problem:
            problems.append(problem)
            continue
        files, skipped = _files(_walk(manifests, problems, depth=4))  # Ollama's own glob, */*/*/*
        problems += skipped
        files, misnamed = _named_manifests(files)
        problems += misnamed
        registries = Counter(p.parts[-3:] for p in files)  # how many registries hold each name
        for manifest in files:
            name = _ollama_display_name(manifest, unique=registries[manifest.parts[-3:]] == 1)
            try:
                blob = _model_blob(manifest, name)
            except SpecllmError as e:
                problems.append(f"{e}; skipped")
                continue
            models.append(_store_model(name, OLLAMA, (blob,), file=manifest.relative_to(manifests).as_posix()))
    return Scan(models, problems)


def _named_manifests(files: list[Path]) -> tuple[list[Path], list[str]]:
    """The manifests whose path is a name Ollama accepts, and a line for each other one: Ollama
    skips those, and listed under their paths they would be names that no command takes. Hidden
    files (a Finder's .DS_Store) are no manifests at all."""
    named, problems = [], []
    for path in files:
        if path.name.startswith("."):
            continue
        if _is_ollama_name(*path.parts[-4:]):
            named.append(path)
        else:
            problems.append(f"{path}: not an Ollama model name (Ollama skips it too); skipped")
    return named, problems


def _ollama_display_name(manifest: Path, unique: bool) -> str:
    """The shortest name that finds this manifest again: without the registry when no other
    registry on disk has the same name, without the namespace when it is the default one."""
    host, namespace, model, tag = manifest.parts[-4:]
    name = f"{model}:{tag}"
    if namespace != _OLLAMA_NAMESPACE or not unique:
        name = f"{namespace}/{name}"
    if not unique:
        name = f"{host}/{name}"
    return f"ollama:{name}"


def _scan_lmstudio() -> Scan:
    return _scan_folders(lmstudio_roots(), LMSTUDIO, "lmstudio:")


def _scan_llamacpp() -> Scan:
    from specllm.models.hub import hf_cache_dir

    # With LLAMA_CACHE unset, newer llama.cpp downloads into the HF cache itself: listed as that.
    folders = [f for f in llamacpp_roots() if f.resolve() != hf_cache_dir().resolve()]
    return _scan_folders(folders, LLAMACPP, "llamacpp:")


def _scan_folders(folders: list[Path], store: str, scheme: str) -> Scan:
    """The GGUFs anywhere under these folders, named by their paths inside them. A name already
    taken in an earlier folder finds that folder's file (as `resolve` looks in the same order), so
    the later file with the same name goes by its own path."""
    models, problems, named = [], [], set()
    for folder in folders:
        problem = _folder_problem(folder, store)
        if problem:
            problems.append(problem)
            continue
        if not folder.is_dir():
            continue
        found = _walk(folder, problems)
        files, skipped = _files(p for p in found if p.name.endswith(".gguf") and not p.name.startswith("."))
        problems += skipped
        by_dir: dict[Path, list[str]] = {}
        for path in files:
            by_dir.setdefault(path.parent, []).append(path.name)
        for directory, names in sorted(by_dir.items()):
            for group in group_splits(names):
                parts = tuple(directory / n for n in group.names)
                file = parts[0].relative_to(folder).as_posix()
                name = scheme + file if scheme + file not in named else str(parts[0])
                named.add(name)
                models.append(_store_model(name, store, parts, file=file, complete=group.complete))
    return Scan(models, problems)


def _store_model(
    name: str, store: str, parts: tuple[Path, ...], *, file: str | None = None, complete: bool = True
) -> LocalModel:
    size = sum(p.stat().st_size for p in parts)
    return LocalModel(
        path=parts[0],
        parts=parts,
        size=size,
        cache=store,
        repo=None,
        file=file or name.split(":", 1)[1],
        complete=complete,
        name=name,
    )
