#!/usr/bin/env bash
# Builds llama.cpp's own llama-speculative-simple (and llama-bench) from the llama.cpp sources that
# the installed llama-cpp-python was built from, so vs_llama_cpp.py compares like with like.
# With --rpc it builds llama.cpp's RPC server (ggml-rpc-server, -DGGML_RPC=ON) from the same
# sources instead: the server must speak the installed llama.cpp's RPC protocol version.
# With --avx2 it builds llama.cpp's libraries from the same sources with AVX2 kernels only (no
# AVX-512, whatever this CPU has), for LLAMA_CPP_LIB_PATH: their logits differ from a native
# build's in the last bits, as another CPU's do, so a test resting on a near-tie shows up here.
# usage: bash benchmarks/build_llama_cpp_tools.sh [--rpc | --avx2]   prints the folder holding the binaries
# ($PYTHON, default python3, is the Python whose llama-cpp-python version is matched.)
set -euo pipefail
python=${PYTHON:-python3}
version=$("$python" -c 'import llama_cpp; print(llama_cpp.__version__)')
if [ "${1:-}" = "--rpc" ]; then
  dest="$HOME/.cache/specllm-anchor/$version-rpc" targets=(ggml-rpc-server) flags=(-DGGML_RPC=ON)
  built=ggml-rpc-server
elif [ "${1:-}" = "--avx2" ]; then
  dest="$HOME/.cache/specllm-anchor/$version-avx2" targets=(llama ggml-rpc) built=libllama.so
  flags=(-DGGML_RPC=ON -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF)
else
  dest="$HOME/.cache/specllm-anchor/$version" targets=(llama-speculative-simple llama-bench) flags=()
  built=llama-speculative-simple
fi
if [ -e "$dest/bin/$built" ]; then echo "$dest/bin"; exit 0; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$work" >&2
tar xzf "$work"/llama_cpp_python-*.tar.gz -C "$work"
if ! command -v cmake >/dev/null; then  # no system CMake: the one from the package index (as pip's build uses)
  "$python" -m pip install -q --disable-pip-version-check cmake >&2
  cmake_dir=$("$python" -c 'import cmake; print(cmake.CMAKE_BIN_DIR)')
  PATH="$cmake_dir:$PATH"
fi
# without llama.cpp's AMX kernels, as scripts/setup.sh builds llama-cpp-python
no_amx=$(bash "$(dirname "$0")/../scripts/no_amx_flags.sh")
CFLAGS="${CFLAGS:-} $no_amx" CXXFLAGS="${CXXFLAGS:-} $no_amx" \
  cmake -S "$(echo "$work"/llama_cpp_python-*/vendor/llama.cpp)" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF "${flags[@]}" \
  -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON -DCMAKE_INSTALL_RPATH='$ORIGIN' >&2
cmake --build "$work/build" -j"$(nproc)" --target "${targets[@]}" >&2
mkdir -p "$dest"
rm -rf "$dest/bin.partial"  # copied aside, then renamed: an interrupted copy never looks built
cp -a "$work/build/bin" "$dest/bin.partial"  # shared libraries sit next to the binaries ($ORIGIN rpath)
rm -rf "$dest/bin" && mv "$dest/bin.partial" "$dest/bin"
echo "$dest/bin"
