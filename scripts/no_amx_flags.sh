#!/usr/bin/env bash
# Prints the compiler flags that keep llama.cpp's AMX kernels out of a build (nothing where they do
# not apply). A native build (llama.cpp's default) on an Intel Xeon that has AMX (Sapphire Rapids
# and later) compiles them in, and on some of these machines their matrix products crash the
# process on the first call of more than one token. Without them llama.cpp keeps its other
# repacked weight layouts. x86-64 only, and only where the compiler knows the flags (GCC 11+,
# Clang 12+); $CC is the compiler CMake will use, cc by default.
# usage: CFLAGS="$CFLAGS $(bash scripts/no_amx_flags.sh)" CXXFLAGS="$CXXFLAGS $(...)" <build>
set -euo pipefail
flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
case "$(uname -m)" in
  x86_64 | amd64) ;;
  *) exit 0 ;;
esac
if echo "int x;" | "${CC:-cc}" $flags -x c -c - -o /dev/null 2>/dev/null; then
  echo "$flags"
fi
