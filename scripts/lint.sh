#!/usr/bin/env bash
# The lint promises, checked: formatting, clippy with warnings denied on every
# native target and on the browser build (wasm32, --features web), and rustdoc with warnings
# denied. scripts/test.sh (the README's test command, which .ci/run runs) calls this first;
# run it alone before a commit.
#
# Everything runs in the release profile: the build scripts and proc macros that
# `cargo test --release` compiled are reused, so the extra time is the check-mode pass over
# the dependencies (once per target directory) plus dynrt itself.
#
# Like the browser test, the wasm32 lint is skipped with a message when the target is not
# installed, and fails instead when DYNRT_REQUIRE_GPU=1 (set by .ci/run, which installs it).
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo fmt --check =="
cargo fmt --all -- --check

echo "== cargo clippy (native, all targets) =="
cargo clippy --release --all-targets --quiet -- -D warnings

echo "== cargo clippy (wasm32, --features web) =="
if rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
  cargo clippy --release --target wasm32-unknown-unknown --features web --lib --quiet -- -D warnings
elif [ "${DYNRT_REQUIRE_GPU:-}" = "1" ]; then
  echo "error: the wasm32 lint needs the wasm32 target (rustup target add wasm32-unknown-unknown)" >&2
  exit 1
else
  echo "SKIPPED the wasm32 lint: the wasm32 target is missing (rustup target add wasm32-unknown-unknown)" >&2
fi

echo "== cargo doc (warnings denied) =="
RUSTDOCFLAGS="${RUSTDOCFLAGS:-} -D warnings" cargo doc --release --no-deps --quiet
