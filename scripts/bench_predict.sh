#!/usr/bin/env bash
# Side-by-side comparison of the preallocation policies (none, openvino, adaptive) on every
# shipped shape trace: reallocations, bytes allocated, peak reserved / peak needed.
# Extra arguments go to `dynrt-bench predict` (e.g. --options "10 16384 2 1.1", --budget-bytes N).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run --release --quiet --bin dynrt-bench -- predict --compare fixtures/traces/*.csv "$@"
