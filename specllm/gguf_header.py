"""A cheap sanity check of a GGUF file's header, before llama.cpp is asked to load it."""

import struct
from pathlib import Path

from .errors import SpecllmError

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
