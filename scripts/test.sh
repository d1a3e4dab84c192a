#!/usr/bin/env bash
# The README's test command: every test the project has.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --release
