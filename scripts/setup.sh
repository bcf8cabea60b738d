#!/usr/bin/env bash
# One command sets specllm up: llama-cpp-python with llama.cpp's RPC backend (built from source,
# adding -DGGML_RPC=on to your own CMAKE_ARGS, e.g. -DGGML_CUDA=on), specllm with its test extra,
# and llama.cpp's ggml-rpc-server built from the same llama.cpp sources.
# usage: bash scripts/setup.sh          ($PYTHON, default python3, is the Python to install into)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
pip=("$python" -m pip install --disable-pip-version-check)
has_rpc() { "$python" -c 'import llama_cpp, sys; sys.exit(not llama_cpp.llama_supports_rpc())' 2>/dev/null; }
if ! has_rpc; then
  # --no-cache-dir: pip would silently reuse a cached wheel of the same version built without RPC,
  # whatever CMAKE_ARGS say. An installed llama-cpp-python is rebuilt at its own version.
  spec=$("$python" -c 'import llama_cpp; print("llama-cpp-python==" + llama_cpp.__version__)' 2>/dev/null || echo llama-cpp-python)
  echo "building $spec with -DGGML_RPC=on (about 5-15 minutes)" >&2
  CMAKE_ARGS="${CMAKE_ARGS:-} -DGGML_RPC=on" "${pip[@]}" --no-cache-dir --force-reinstall --no-deps "$spec"
  "${pip[@]}" "$spec"  # its own dependencies, if it was not installed before
  has_rpc || { echo "error: llama-cpp-python still has no RPC backend" >&2; exit 1; }
fi
"${pip[@]}" -e ".[test]"
echo "ggml-rpc-server: $(PYTHON="$python" bash benchmarks/build_llama_cpp_tools.sh --rpc)/ggml-rpc-server"
