#!/usr/bin/env bash
# Builds llama.cpp's own llama-speculative-simple (and llama-bench) from the llama.cpp sources that
# the installed llama-cpp-python was built from, so vs_llama_cpp.py compares like with like.
# usage: bash benchmarks/build_llama_cpp_tools.sh     prints the folder holding the binaries
set -euo pipefail
version=$(python3 -c 'import llama_cpp; print(llama_cpp.__version__)')
dest="$HOME/.cache/specllm-anchor/$version"
if [ -x "$dest/bin/llama-speculative-simple" ]; then echo "$dest/bin"; exit 0; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$work" >&2
tar xzf "$work"/llama_cpp_python-*.tar.gz -C "$work"
cmake -S "$(echo "$work"/llama_cpp_python-*/vendor/llama.cpp)" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \
  -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON -DCMAKE_INSTALL_RPATH='$ORIGIN' >&2
cmake --build "$work/build" -j"$(nproc)" --target llama-speculative-simple llama-bench >&2
mkdir -p "$dest"
cp -a "$work/build/bin" "$dest/"  # shared libraries sit next to the binaries ($ORIGIN rpath)
echo "$dest/bin"
