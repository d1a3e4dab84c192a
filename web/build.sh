#!/usr/bin/env bash
# Builds the browser package: the dynrt library for wasm32 (WebGPU backend, feature `web`),
# post-processed by wasm-bindgen into the ES module web/pkg/dynrt.js (+ dynrt_bg.wasm).
#
#   web/build.sh            then   node web/serve.mjs   and open http://localhost:8080/
#
# Needs: `rustup target add wasm32-unknown-unknown` and wasm-bindgen-cli at exactly the
# version of the `wasm-bindgen` crate in Cargo.lock (the two share a private ABI: a mismatch
# produces a module that fails at load time, so it is checked here, before building).
set -euo pipefail
cd "$(dirname "$0")/.."

want=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/version = |"/, ""); print; exit }' Cargo.lock)
if [ -z "$want" ]; then
  echo "web/build.sh: no wasm-bindgen crate in Cargo.lock (is the wasm32 dependency block in Cargo.toml?)" >&2
  exit 1
fi
if ! command -v wasm-bindgen >/dev/null 2>&1; then
  echo "web/build.sh: wasm-bindgen not found; install it with: cargo install wasm-bindgen-cli --version $want" >&2
  exit 1
fi
have=$(wasm-bindgen --version | awk '{ print $2 }')
if [ "$have" != "$want" ]; then
  echo "web/build.sh: wasm-bindgen-cli is $have but Cargo.lock has wasm-bindgen $want;" \
    "install the matching one: cargo install wasm-bindgen-cli --version $want --force" >&2
  exit 1
fi
if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
  echo "web/build.sh: the wasm32 target is missing; add it with: rustup target add wasm32-unknown-unknown" >&2
  exit 1
fi

target_dir=${CARGO_TARGET_DIR:-target}
# `cargo rustc --crate-type cdylib` makes the .wasm without declaring the crate a cdylib in
# Cargo.toml, which would make every native build link a shared library it never uses.
cargo rustc --release --target wasm32-unknown-unknown --features web --lib --crate-type cdylib
rm -rf web/pkg
wasm-bindgen --target web --no-typescript --out-dir web/pkg --out-name dynrt \
  "$target_dir/wasm32-unknown-unknown/release/dynrt.wasm"
echo "web/build.sh: built web/pkg ($(du -h web/pkg/dynrt_bg.wasm | cut -f1) wasm, wasm-bindgen $have)"
