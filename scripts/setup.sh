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
has_amx() { "$python" -c 'import llama_cpp, sys; sys.exit(b"AMX_INT8 = 1" not in llama_cpp.llama_print_system_info())' 2>/dev/null; }
# Built without llama.cpp's AMX kernels, which crash on some machines (scripts/no_amx_flags.sh).
no_amx=$(bash scripts/no_amx_flags.sh)
export CFLAGS="${CFLAGS:-} $no_amx" CXXFLAGS="${CXXFLAGS:-} $no_amx"
# Built when it has no RPC backend or has the AMX kernels (specllm leaves them unused, and with them
# llama.cpp's other repacked layouts), and whenever CMAKE_ARGS asks for a build of its own (a CUDA
# or Metal one): an installed CPU build with RPC would otherwise be kept as it is.
if ! has_rpc || { [ -n "$no_amx" ] && has_amx; } || [ -n "${CMAKE_ARGS:-}" ]; then
  # --no-cache-dir: pip would silently reuse a cached wheel of the same version built without RPC,
  # whatever CMAKE_ARGS say. An installed llama-cpp-python is rebuilt at its own version.
  spec=$("$python" -c 'import llama_cpp; print("llama-cpp-python==" + llama_cpp.__version__)' 2>/dev/null || echo llama-cpp-python)
  echo "building $spec with -DGGML_RPC=on (about 5-15 minutes)" >&2
  CMAKE_ARGS="${CMAKE_ARGS:-} -DGGML_RPC=on" "${pip[@]}" --no-cache-dir --force-reinstall --no-deps "$spec"
  "${pip[@]}" "$spec"  # its own dependencies, if it was not installed before
  has_rpc || { echo "error: llama-cpp-python still has no RPC backend" >&2; exit 1; }
fi
"${pip[@]}" -e ".[test]"
# An installed llama-cpp-python older than specllm needs (kept or rebuilt above, at its own version)
# is upgraded by that pip install, built without RPC. Run again, this script rebuilds it with RPC.
has_rpc || {
  echo "error: installing specllm upgraded llama-cpp-python to a build without RPC: run this script again" >&2
  exit 1
}

# The browser that tests/serve/test_web_page.py drives: Debian's Chromium, which Playwright launches as
# it is (Playwright's own browser download is not needed). Installed when missing, as root with apt.
has_chromium() { command -v chromium >/dev/null || command -v chromium-browser >/dev/null; }
apt_install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null 2>&1; }
if ! has_chromium; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing chromium with apt-get, for the chat page's browser test" >&2
    # a fresh machine may have no package lists yet: fetch them only when the first try fails
    apt_install chromium || { apt-get update -qq >/dev/null 2>&1 && apt_install chromium; } ||
      echo "warning: apt-get could not install chromium: tests/serve/test_web_page.py will fail" >&2
  else
    echo "note: no chromium and no apt-get as root to install it: install Chromium for" \
      "tests/serve/test_web_page.py (or set SPECLLM_CHROMIUM=PATH, or SPECLLM_SKIP_BROWSER=1 to skip it)" >&2
  fi
fi
# (not inside echo's arguments, where set -e lets a failed build pass unnoticed)
rpc_bin=$(PYTHON="$python" bash benchmarks/build_llama_cpp_tools.sh --rpc) ||
  { echo "error: could not build ggml-rpc-server (the output above says why)" >&2; exit 1; }
echo "ggml-rpc-server: $rpc_bin/ggml-rpc-server"
