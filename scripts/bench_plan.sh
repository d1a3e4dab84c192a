#!/usr/bin/env bash
# Planner benchmark: one markdown table over every instance in fixtures/planner/.
# Each cell is `height (height / lower bound) milliseconds` for one strategy. MiniMalloc's
# challenging instances are planned at their capacity (the number in the file name); a
# strategy that does not fit shows `no fit: best height`. Real models have no capacity.
#
# Usage: scripts/bench_plan.sh [TIME_LIMIT_MS]   (default 10000; builds the release binary)
set -euo pipefail
cd "$(dirname "$0")/.."
limit_ms="${1:-10000}"
# The instances shipped in fixtures/planner/ (DYNRT_PLANNER_BENCH names another folder of the
# same layout).
bench_dir="${DYNRT_PLANNER_BENCH:-fixtures/planner}"
if [[ ! -d "$bench_dir/real-models" ]]; then echo "no planner instances in $bench_dir" >&2; exit 1; fi
# DYNRT_BENCH_BIN names a prebuilt dynrt-bench binary (skips the build).
if [[ -z "${DYNRT_BENCH_BIN:-}" ]]; then cargo build --release --quiet --bin dynrt-bench; fi
bin="${DYNRT_BENCH_BIN:-${CARGO_TARGET_DIR:-target}/release/dynrt-bench}"
echo "| instance | buffers | lower bound | gmem-fit-first | gmem-op-size | greedy-size | search | best |"
echo "|---|---|---|---|---|---|---|---|"
for f in "$bench_dir"/minimalloc-challenging/*.csv "$bench_dir"/real-models/*.csv; do
    name="$(basename "$f" .csv)"
    cap_args=()
    if [[ "$name" =~ ^[A-Za-z0-9_]+\.([0-9]+)$ ]]; then
        cap_args=(--capacity "${BASH_REMATCH[1]}")
    fi
    # --compare exits non-zero when some strategy does not fit: that is a table entry here.
    "$bin" plan "$f" --compare --time-limit-ms "$limit_ms" "${cap_args[@]}" || true
done
