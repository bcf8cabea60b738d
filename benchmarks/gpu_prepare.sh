#!/usr/bin/env bash
# Fills .device/ (ignored by git) with what benchmarks/gpu_check.py needs on a CUDA machine that has
# no network: the CUDA 13 / sm_90 build of llama-cpp-python 0.3.36 (from ../shared/device/ by
# default, or the folder given), the pure-Python wheels that `import specllm` needs there beyond
# numpy, typer, rich, huggingface_hub and jinja2, llama.cpp's headers (for gpu_check.py's C loop,
# compiled there against the same libllama), and specllm's compiled sampler built for that
# machine's Python 3.12 (where a python3.12 is here; $PYTHON312 names another). The folder must
# then travel with the working tree (name .device among the ignored paths sent along);
# gpu_check.py's docstring has the command to run there.
# usage: bash benchmarks/gpu_prepare.sh [FOLDER_WITH_THE_ARCHIVE]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
src=${1:-$root/../shared/device}
dest=$root/.device
archive=llama_cpp_python-0.3.36-cuda13-sm90.tar.xz
sha256=765a36038fa2fd4c96cf4c9d2b677bfbb51297484ec202cca3a321f0a5a307ab
python=${PYTHON:-python3}

mkdir -p "$dest" "$dest/include"
if [ ! -f "$dest/$archive" ] || ! echo "$sha256  $dest/$archive" | sha256sum -c --status; then
  cp "$src/$archive" "$dest/$archive.partial"
  echo "$sha256  $dest/$archive.partial" | sha256sum -c --quiet
  mv "$dest/$archive.partial" "$dest/$archive"
fi

# Pure-Python wheels for Python 3.12: diskcache (llama_cpp imports it), filelock (specllm's
# calibration cache), typing_extensions (llama_cpp; usually there already). gpu_check.py unpacks
# only those whose module the machine lacks.
"$python" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
  -d "$dest" "diskcache==5.6.3" "filelock>=3.12" "typing_extensions>=4.6"

# llama.cpp's headers of the installed llama-cpp-python, which must be the archive's version.
"$python" - "$dest/include" <<'EOF'
import shutil, sys
from pathlib import Path
import llama_cpp
if llama_cpp.__version__ != "0.3.36":
    sys.exit(f"llama-cpp-python {llama_cpp.__version__} is installed here: its headers would not match 0.3.36")
pkg = Path(llama_cpp.__file__).parent
folder = next((d for d in (pkg / "include", pkg.parent / "include") if (d / "llama.h").exists()), None)
if folder is None:
    sys.exit("llama.h not found next to llama_cpp: gpu_check.py will time a ctypes loop instead of the C loop")
for header in folder.glob("*.h"):
    shutil.copy2(header, Path(sys.argv[1]) / header.name)
EOF

# specllm's sampler (specllm/engine/_sampler.c) for Python 3.12, built by setup.py as any install
# builds it (a wheel of this checkout for that Python), which gpu_check.py puts beside the sources
# there. Without it the loop samples with numpy there.
python312=${PYTHON312:-python3.12}
rm -f "$dest"/_sampler.*.so
wheels=$(mktemp -d)
if ! { "$python312" -m pip wheel -q --disable-pip-version-check --no-deps -w "$wheels" "$root" >&2 &&
  "$python312" - "$wheels" "$dest" <<'EOF'; }; then
import importlib.machinery, sys, zipfile
from pathlib import Path
wheel = next(Path(sys.argv[1]).glob("specllm-*.whl"))
names = [f"specllm/engine/_sampler{suffix}" for suffix in importlib.machinery.EXTENSION_SUFFIXES]
with zipfile.ZipFile(wheel) as z:
    built = [n for n in z.namelist() if n in names]
    if not built:
        sys.exit("the wheel has no compiled sampler (no C compiler?)")
    Path(sys.argv[2], Path(built[0]).name).write_bytes(z.read(built[0]))
EOF
  echo "note: no compiled sampler for $python312 (see above): on the CUDA machine the loop will sample with numpy" >&2
fi
rm -rf "$wheels"

size=$(du -sm "$dest" | cut -f1)
ls -la "$dest"
echo "$dest: ${size} MiB"
if [ "$size" -gt 60 ]; then
  echo "error: $dest is over 60 MiB (the working tree and what travels with it must stay under 64 MiB)" >&2
  exit 1
fi
