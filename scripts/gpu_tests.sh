#!/usr/bin/env bash
# The test suite on a GPU machine that has no network, no Rust toolchain and no checkout
# (issue 36): packs the release test binaries that use the device (`gpu`, `hostile`, `cli`),
# the `dynrt` and `dynrt-bench` binaries they run, the repository's tracked files they read
# (fixtures, shaders, scripts) and Debian's Vulkan loader into one folder and one .tar.xz,
# with a runner (`run.sh`) that runs every test there, each in a process of its own under a
# deadline, and returns one tarball of results.
#
#   scripts/gpu_tests.sh [OUT]          # build and pack into OUT (default target/gpu-pack)
#                                       # and OUT.tar.xz
#   # on the GPU machine:
#   tar xJf gpu-pack.tar.xz && gpu-pack/run.sh [--jobs N] [--deadline SECS] [--filter TEXT]
#   # -> gpu-pack-results/ and gpu-pack-results.tar.gz (summary.txt, results.tsv, a log per
#   #    test, the adapters found)
#
# What a packed run has not got, the tests that need it skip and say so: the models (the
# cache holds hundreds of MB; `dynrt fetch` needs the network), the Python references (their
# venv is built with pip), cargo (tests/cli/desktop_chat.rs builds an example). See
# docs/benchmarks/README.md, "The suite on a GPU machine".
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/gpu-pack}
case "$out" in
  /*) ;;
  *) out="$PWD/$out" ;;
esac

echo "== building the release test binaries, dynrt and dynrt-bench ==" >&2
cargo build --release --bin dynrt --bin dynrt-bench
json=$(mktemp)
trap 'rm -f "$json"' EXIT
cargo test --release --no-run --test gpu --test hostile --test cli --message-format=json >"$json"

rm -rf "$out" "$out.tar.xz"
mkdir -p "$out/bin" "$out/repo" "$out/vulkan"
cp target/release/dynrt "$out/bin/dynrt"
cp target/release/dynrt-bench "$out/bin/dynrt-bench"
# The executable of each test target, from cargo's own report of what it built.
python3 - "$json" "$out/bin" <<'EOF'
import json, shutil, sys
found = {}
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    t = m.get("target", {})
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "test" in t.get("kind", []):
        found[t["name"]] = m["executable"]
for name in ("gpu", "hostile", "cli"):
    if name not in found:
        sys.exit(f"cargo built no test binary `{name}`")
    shutil.copy2(found[name], f"{sys.argv[2]}/{name}")
EOF

# The files the tests read, as the working tree has them (tracked files only: no build
# outputs, no venv).
git ls-files -z | tar --null -T - -cf - | tar -xf - -C "$out/repo"

# Debian's Vulkan loader, for a machine whose driver brings an ICD but no libvulkan.so.1:
# the .deb when apt can fetch it, else this machine's loader (the same package).
if (cd "$out/vulkan" && apt-get download libvulkan1 >/dev/null 2>&1); then
  :
else
  loader=$(ldconfig -p | awk '/libvulkan\.so\.1 .*x86-64/ { print $NF; exit }')
  [ -n "$loader" ] || { echo "error: no libvulkan.so.1 to pack (apt-get install libvulkan1)" >&2; exit 1; }
  cp -L "$loader" "$out/vulkan/libvulkan.so.1"
fi

cp scripts/gpu_tests_run.sh "$out/run.sh"
chmod +x "$out/run.sh"
git rev-parse --short HEAD >"$out/commit"
if ! git diff --quiet HEAD; then
  echo "(with uncommitted changes)" >>"$out/commit"
fi

echo "== compressing ==" >&2
tar -C "$(dirname "$out")" -cf - "$(basename "$out")" | xz -T0 -6 >"$out.tar.xz"
size=$(stat -c %s "$out.tar.xz")
echo "packed $(du -sh "$out" | cut -f1) into $out.tar.xz ($((size / 1024 / 1024)) MiB)" >&2
if [ "$size" -ge $((64 * 1024 * 1024)) ]; then
  echo "error: the pack is larger than 64 MiB" >&2
  exit 1
fi
