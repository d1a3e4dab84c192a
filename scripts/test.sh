#!/usr/bin/env bash
# The README's test command: every test the project has.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --release

# --- browser (issue 7): wasm32 build, then the demo page in headless Chromium --------------
web/build.sh
cargo build --release --bin dynrt   # the test compares against the native demo's --json
node web/test.mjs
