#!/usr/bin/env bash
# llama.cpp for the tests that run it for real (tests/cli/test_llamacpp_node.sh):
# the llama-cpp-python sdist from PyPI, its vendored llama.cpp built once with
# CMake into $KVASIR_BUILD_DIR/llamacpp/build (the shared libraries and the
# llama-perplexity and llama-quantize tools), and the llama-cpp-python package installed into the
# venv $KVASIR_BUILD_DIR/llamacpp/venv against those libraries
# (LLAMA_CPP_LIB_PATH), and libkvasir_log_flush.so beside them (scripts/llamacpp_log_flush.cpp:
# LD_PRELOAD it into llama-perplexity, whose log tail is otherwise lost at exit). One build serves both the Python node
# (scripts/llamacpp_node.py), llama-perplexity and llama-quantize; a user on a phone or a GPU
# box just runs `pip install llama-cpp-python`, which builds the same sources.
# Reused between runs: a stamp names the version and build it was made from.
#
#   scripts/setup_llamacpp.sh            (sourced by scripts/test; also runnable alone)
set -euo pipefail

KVASIR_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KVASIR_BUILD_DIR="${KVASIR_BUILD_DIR:-$KVASIR_ROOT/build}"
KVASIR_LLAMACPP_PYTHON_VERSION=0.3.36
KVASIR_LLAMACPP_BUILD=3  # bump when the build changes (targets, options): the stamp names both

kvasir_setup_llamacpp() {
  local dir="$KVASIR_BUILD_DIR/llamacpp"
  local stamp="$dir/ready-$KVASIR_LLAMACPP_PYTHON_VERSION-$KVASIR_LLAMACPP_BUILD"
  [ -f "$stamp" ] || kvasir_build_llamacpp "$dir" "$stamp"
  kvasir_build_llamacpp_log_flush "$dir"
}

# The LD_PRELOAD library that flushes llama.cpp's log at exit: rebuilt when its source is newer.
kvasir_build_llamacpp_log_flush() {
  local dir="$1" src="$KVASIR_ROOT/scripts/llamacpp_log_flush.cpp"
  local so="$dir/build/bin/libkvasir_log_flush.so"
  [ -f "$so" ] && [ "$so" -nt "$src" ] && return 0
  g++ -std=c++17 -O2 -shared -fPIC -o "$so.tmp" "$src" -L"$dir/build/bin" -lllama-common \
    -Wl,-rpath,"$dir/build/bin" && mv "$so.tmp" "$so" || {
    echo "kvasir: building $so failed" >&2
    exit 3
  }
}

kvasir_build_llamacpp() {
  local dir="$1" stamp="$2"
  local log="$dir/setup.log"
  mkdir -p "$dir"
  echo "kvasir: building llama.cpp (llama-cpp-python $KVASIR_LLAMACPP_PYTHON_VERSION from PyPI) into $dir, once" >&2
  local t0=$SECONDS
  {
    rm -rf "$dir/venv" "$dir/sdist" "$dir/src" "$dir/build"
    python3 -m venv "$dir/venv"
    "$dir/venv/bin/pip" install -q --upgrade pip
    "$dir/venv/bin/pip" download -q --no-deps --no-binary :all: \
      "llama-cpp-python==$KVASIR_LLAMACPP_PYTHON_VERSION" -d "$dir/sdist"
    mkdir -p "$dir/src"
    tar -xzf "$dir/sdist/llama_cpp_python-$KVASIR_LLAMACPP_PYTHON_VERSION.tar.gz" -C "$dir/src" --strip-components=1
    # Native, but never AMX: a VM's CPUID may list amx_tile/amx_int8 (Sapphire Rapids) while the
    # hypervisor does not give the process the tile state, and ggml's AMX matmul for Q4/Q8 batches
    # then dies of SIGILL (seen on this project's machines); the tests compare llama.cpp's
    # AVX-512/AVX2 arithmetic anyway. Explicit -mno-* flags win over -march=native in GCC.
    cmake -S "$dir/src/vendor/llama.cpp" -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=ON \
      -DCMAKE_C_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" \
      -DCMAKE_CXX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    cmake --build "$dir/build" --target llama llama-perplexity llama-quantize --parallel "$(nproc)"
    # The package's Python side only: its libraries are the ones just built.
    CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" "$dir/venv/bin/pip" install -q \
      "$dir/sdist/llama_cpp_python-$KVASIR_LLAMACPP_PYTHON_VERSION.tar.gz" numpy gguf==0.19.0
    LLAMA_CPP_LIB_PATH="$dir/build/bin" "$dir/venv/bin/python" -c "import llama_cpp; print(llama_cpp.__version__)"
  } >"$log" 2>&1 || {
    tail -40 "$log" >&2
    echo "kvasir: llama.cpp setup failed (log: $log)" >&2
    exit 3
  }
  touch "$stamp"
  echo "kvasir: llama.cpp ready in $((SECONDS - t0)) s" >&2
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  kvasir_setup_llamacpp
fi
