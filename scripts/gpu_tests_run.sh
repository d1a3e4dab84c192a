#!/usr/bin/env bash
# The runner of a pack made by scripts/gpu_tests.sh (copied into it as run.sh): runs every
# test of the packed binaries on this machine's GPU, each test in a process of its own under
# a deadline, several at a time, and writes the results next to the pack:
#
#   run.sh [--jobs N] [--deadline SECS] [--filter TEXT] [--out DIR]
#
#   --jobs N         tests at once (default: the cores, at most 16)
#   --deadline SECS  a test still running after this is killed and counted as hung (300)
#   --filter TEXT    only the tests whose name contains TEXT
#   --out DIR        the results folder (default: <pack>-results beside the pack); a
#                    DIR.tar.gz of it is written too
#
# A test passes, fails, hangs (killed at the deadline), or is skipped: it passed and printed
# `SKIP ...` (the reason is recorded). The adapters are probed first; when GL does not give a
# device within 60 s (NVIDIA's EGL without a display may not), the run uses Vulkan only
# (WGPU_BACKEND=vulkan) and the GL tests skip, saying so. Exit status 0 when nothing failed or
# hung.
set -uo pipefail
pack=$(cd "$(dirname "$0")" && pwd)
jobs=$(nproc 2>/dev/null || echo 4)
[ "$jobs" -gt 16 ] && jobs=16
deadline=300
filter=""
out="${pack}-results"
while [ $# -gt 0 ]; do
  case "$1" in
    --jobs) jobs=$2; shift 2 ;;
    --deadline) deadline=$2; shift 2 ;;
    --filter) filter=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: run.sh [--jobs N] [--deadline SECS] [--filter TEXT] [--out DIR]" >&2; exit 2 ;;
  esac
done
rm -rf "$out"
mkdir -p "$out/logs" "$out/tmp" "$out/home"
started=$(date +%s)

# The Vulkan loader, when the system has none (ldconfig may be outside a user's PATH).
ldconfig=$(command -v ldconfig || echo /sbin/ldconfig)
if ! "$ldconfig" -p 2>/dev/null | grep -q 'libvulkan\.so\.1 '; then
  lib="$pack/vulkan/lib"
  mkdir -p "$lib"
  if [ -f "$pack/vulkan/libvulkan.so.1" ]; then
    cp "$pack/vulkan/libvulkan.so.1" "$lib/"
  else
    deb=$(ls "$pack"/vulkan/libvulkan1_*.deb | head -1)
    if command -v dpkg >/dev/null; then
      dpkg -x "$deb" "$pack/vulkan/root"
    else
      mkdir -p "$pack/vulkan/root"
      (cd "$pack/vulkan/root" && ar x "$deb" && tar -xf data.tar.*)
    fi
    cp -L "$pack"/vulkan/root/usr/lib/*/libvulkan.so.1 "$lib/"
  fi
  export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "libvulkan.so.1: the packed loader ($lib)" | tee -a "$out/summary.txt"
fi

# Where the packed tests find their files; what they must not look for.
export DYNRT_PACK="$pack"
export DYNRT_REPO="$pack/repo"
export DYNRT_BIN="$pack/bin/dynrt"
export DYNRT_BENCH_BIN="$pack/bin/dynrt-bench"
export DYNRT_TEST_TMPDIR="$out/tmp"
export DYNRT_TEST_DEADLINE_SECS="$deadline"
export HOME="$out/home"
export DYNRT_MODELS="$out/home/models"
export DYNRT_REQUIRE_GPU=1
export RUST_BACKTRACE=1
if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
  export XDG_RUNTIME_DIR="$out/xdg"
  mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
fi

{
  echo "pack: $(cat "$pack/commit" 2>/dev/null)"
  echo "machine: $(uname -srm), $(nproc) cores"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
} | tee -a "$out/summary.txt"
timeout 120 "$DYNRT_BIN" info >"$out/adapters.txt" 2>&1
echo "dynrt info: exit $? (adapters.txt)" | tee -a "$out/summary.txt"
if [ -z "${WGPU_BACKEND:-}" ]; then
  if timeout 60 env WGPU_BACKEND=gl "$DYNRT_BIN" info >"$out/adapters-gl.txt" 2>&1; then
    echo "GL: a device (adapters-gl.txt); the tests cover Vulkan and GL" | tee -a "$out/summary.txt"
  else
    export WGPU_BACKEND=vulkan
    echo "GL: no device within 60 s (adapters-gl.txt): the run is Vulkan only (WGPU_BACKEND=vulkan)" \
      | tee -a "$out/summary.txt"
  fi
fi

# One line per test: binary, name. Ignored tests are left out, as `cargo test` leaves them
# (children of other tests, runs on models too large for CI).
list="$out/tests.txt"
: >"$list"
ignored=0
for bin in gpu hostile cli; do
  "$pack/bin/$bin" --list --format terse --ignored 2>/dev/null | sed -n 's/: test$//p' \
    >"$out/ignored-$bin.txt"
  ignored=$((ignored + $(wc -l <"$out/ignored-$bin.txt")))
  "$pack/bin/$bin" --list --format terse 2>/dev/null \
    | sed -n 's/: test$//p' \
    | grep -vxF -f "$out/ignored-$bin.txt" \
    | grep -F -- "$filter" \
    | sed "s|^|$bin\t|" >>"$list"
done
echo "tests: $(wc -l <"$list") ($ignored ignored ones left out), $jobs at a time, deadline $deadline s each" \
  | tee -a "$out/summary.txt"

# Runs one test; appends `status bin test seconds reason` to results.tsv.
run_one() {
  local bin=$1 name=$2
  local log="$out/logs/$bin/${name//::/__}.log"
  mkdir -p "$out/logs/$bin"
  local t0 rc status reason
  t0=$(date +%s)
  # --show-output: a passing test's output too (its SKIP line), after its `ok` line.
  timeout -k 10 "$deadline" "$pack/bin/$bin" --exact "$name" --test-threads 1 --show-output \
    >"$log" 2>&1
  rc=$?
  reason=""
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    status=hung
    reason="killed after ${deadline} s"
  elif [ "$rc" -ne 0 ]; then
    status=failed
    reason=$(grep -m1 -E "panicked at|WATCHDOG|error:" "$log" | cut -c1-200)
  elif ! grep -q "^test result: ok\. 1 passed" "$log"; then
    status=failed
    reason="the binary did not run the test"
  elif grep -q "^SKIP" "$log"; then
    status=skipped
    reason=$(grep -m1 "^SKIP" "$log" | cut -c1-300)
  else
    status=passed
  fi
  printf '%s\t%s\t%s\t%s\t%s\n' "$status" "$bin" "$name" "$(($(date +%s) - t0))" "$reason" \
    >>"$out/results.tsv"
}
export -f run_one
export out pack deadline
: >"$out/results.tsv"
tr '\t' '\n' <"$list" | xargs -d '\n' -n 2 -P "$jobs" bash -c 'run_one "$0" "$1"'

took=$(($(date +%s) - started))
{
  echo
  for s in passed skipped failed hung; do
    printf '%-8s %s\n' "$s" "$(cut -f1 "$out/results.tsv" | grep -cx "$s")"
  done
  echo "in $took s"
  echo
  echo "skipped (reason):"
  awk -F'\t' '$1 == "skipped" { printf "  %s %s: %s\n", $2, $3, $5 }' "$out/results.tsv" | sort
  echo "failed or hung:"
  awk -F'\t' '$1 == "failed" || $1 == "hung" { printf "  %s %s %s: %s\n", $1, $2, $3, $5 }' \
    "$out/results.tsv" | sort
  echo "slowest:"
  sort -t$'\t' -k4,4nr "$out/results.tsv" | head -10 | awk -F'\t' '{ printf "  %4d s  %s %s\n", $4, $2, $3 }'
} | tee -a "$out/summary.txt"
tar -C "$(dirname "$out")" -czf "$out.tar.gz" "$(basename "$out")"
echo "results: $out.tar.gz" >&2
! cut -f1 "$out/results.tsv" | grep -qE '^(failed|hung)$'
