#!/usr/bin/env bash
# The README's test command: every test the project has.
#
# 0. scripts/lint.sh: cargo fmt --check, clippy -D warnings (native all targets, and wasm32
#    with --features web), rustdoc with warnings denied.
# 1. cargo test: unit tests, GPU integration tests on the adapters found (Vulkan/lavapipe and
#    GL/llvmpipe), CLI tests, doc tests.
# 2. The browser test: the wasm32 build and the decode demo page in headless Chromium.
#
# Like the GPU tests, the browser test is skipped with a message when its tools are missing
# (chromium, node, wasm-bindgen-cli, the wasm32 target, web/node_modules), and fails instead
# when DYNRT_REQUIRE_GPU=1, which .ci/run sets after installing all of them.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/lint.sh
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
