"""A cheap sanity check of a GGUF file's header, before llama.cpp is asked to load it."""

import mmap
import os
import struct
from pathlib import Path

from specllm.errors import SpecllmError

GGUF_MAGIC = b"GGUF"
# magic, version (u32), tensor count (u64), metadata key/value count (u64)
_HEADER = struct.Struct("<4sIQQ")


def check_gguf_header(path: str | Path) -> None:
    """Raise SpecllmError unless `path` is a readable file that starts with a GGUF header."""
    path = Path(path)
    if not path.exists():
        raise SpecllmError(f"model file not found: {path}")
    if not path.is_file():
        raise SpecllmError(f"not a file: {path}")
    try:
        with path.open("rb") as f:
            head = f.read(_HEADER.size)
    except OSError as e:
        raise SpecllmError(f"cannot read {path}: {e.strerror}") from None
    if len(head) < _HEADER.size or head[:4] != GGUF_MAGIC:
        raise SpecllmError(f"not a GGUF model file: {path}")
    _, version, _, _ = _HEADER.unpack(head)
    if version not in (2, 3):
        raise SpecllmError(f"unsupported GGUF version {version}: {path}")


def tensor_count(path: str | Path) -> int:
    """How many tensors a GGUF file (one whose header passed check_gguf_header) holds: none in a
    vocabulary-only file (llama.cpp's ggml-vocab-*.gguf) or in a split model's first part written
    with gguf-split --no-tensor-first-split."""
    with Path(path).open("rb") as f:
        return _HEADER.unpack(f.read(_HEADER.size))[2]


def check_vocabulary(path: str | Path) -> None:
    """Raise SpecllmError when the token list of a GGUF file (one whose header passed
    check_gguf_header) has the same token twice. llama.cpp's vocabulary loader asserts that every
    token is unique and otherwise aborts the whole process (GGML_ASSERT), even to read only the
    vocabulary; some published conversions and damaged files are so. Anything else that is wrong
    with the file is llama.cpp's to say, in one line, when it loads it."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            _, _, _, n_kv = _HEADER.unpack(f.read(_HEADER.size))
            for _ in range(n_kv):
                key, value_type = _read_string(f), _unpack(f, "I")
                if key == _TOKENS and value_type == _ARRAY:
                    _check_unique_tokens(f, path)
                    return
                _skip_value(f, value_type)
    except (struct.error, UnicodeDecodeError, ValueError, OSError, RecursionError):
        return  # (cut short, unreadable or arrays nested without end: llama.cpp says so)


_TOKENS = "tokenizer.ggml.tokens"


def _check_unique_tokens(f, path: Path) -> None:
    """Walked over a memory map: 150k tokens read one by one from the file took 0.2 s a load."""
    if _unpack(f, "I") != _STRING:
        return
    count, start = _unpack(f, "Q"), f.tell()
    seen: dict[bytes, int] = {}
    with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
        pos, end = start, len(view)
        for i in range(count):
            if pos + 8 > end:
                return
            (n,) = _LENGTH.unpack_from(view, pos)
            pos += 8
            if n > end - pos:  # a damaged length
                return
            token = view[pos : pos + n] or f"[EMPTY_{i}]".encode()  # as llama.cpp names an empty token
            pos += n
            if seen.setdefault(token, i) != i:
                text = token.decode("utf-8", "replace")[:40]
                raise SpecllmError(
                    f"cannot load {path}: its vocabulary has the token {text!r} twice (ids {seen[token]} and {i}), "
                    "which llama.cpp cannot load: a damaged or badly converted file"
                )


_LENGTH = struct.Struct("<Q")


# GGUF metadata value types (gguf.GGUFValueType): fixed-size scalars by their struct format.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


def read_metadata(path: str | Path, wanted: set[str]) -> dict:
    """The values of the `wanted` metadata keys found in a GGUF header (an array's value is its
    length: the token list is read as a count, never as 150k strings kept in memory). Reading
    stops once every wanted key is found. Raises SpecllmError for a file that is not GGUF or is
    cut short."""
    path = Path(path)
    check_gguf_header(path)
    found: dict = {}
    try:
        with path.open("rb") as f:
            _, _, _, n_kv = _HEADER.unpack(f.read(_HEADER.size))
            for _ in range(n_kv):
                key = _read_string(f)
                value_type = _unpack(f, "I")
                if key not in wanted:
                    _skip_value(f, value_type)
                elif value_type == _ARRAY:
                    item_type, found[key] = _unpack(f, "I"), _unpack(f, "Q")
                    if len(found) < len(wanted):  # (the last key wanted: no need to walk its items)
                        _skip_items(f, item_type, found[key])
                else:
                    found[key] = _read_value(f, value_type)
                if len(found) == len(wanted):
                    break
    # RecursionError: arrays nested in arrays thousands deep, which a damaged file can declare
    except (struct.error, UnicodeDecodeError, ValueError, OSError, RecursionError):
        raise SpecllmError(f"cannot read the GGUF metadata of {path}") from None
    return found


def _unpack(f, fmt: str):
    size = struct.calcsize("<" + fmt)
    data = f.read(size)
    if len(data) < size:
        raise ValueError("cut short")
    return struct.unpack("<" + fmt, data)[0]


def _read_string(f) -> str:
    n = _unpack(f, "Q")
    if n > os.fstat(f.fileno()).st_size - f.tell():  # a damaged length: never ask for that much memory
        raise ValueError("cut short")
    data = f.read(n)
    if len(data) < n:
        raise ValueError("cut short")
    return data.decode("utf-8")


def _read_value(f, value_type: int):
    if value_type == _STRING:
        return _read_string(f)
    if value_type not in _SCALARS:
        raise ValueError(f"unknown value type {value_type}")
    return _unpack(f, _SCALARS[value_type])


def _skip_value(f, value_type: int) -> None:
    if value_type == _STRING:
        f.seek(_unpack(f, "Q"), 1)
    elif value_type == _ARRAY:
        _skip_items(f, _unpack(f, "I"), _unpack(f, "Q"))
    elif value_type in _SCALARS:
        f.seek(struct.calcsize("<" + _SCALARS[value_type]), 1)
    else:
        raise ValueError(f"unknown value type {value_type}")


def _skip_items(f, item_type: int, count: int) -> None:
    if item_type in _SCALARS:
        f.seek(count * struct.calcsize("<" + _SCALARS[item_type]), 1)
    else:
        for _ in range(count):
            _skip_value(f, item_type)
