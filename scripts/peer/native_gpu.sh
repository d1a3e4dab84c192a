#!/usr/bin/env bash
# The native route of scripts/bench_peer.sh on this machine's own Vulkan GPU, with nothing to
# build or download: for a machine with a real GPU and no network (or no toolchain), given a
# dynrt binary built elsewhere (with dynrt-bench beside it) and a Python that has numpy, onnx,
# onnxruntime 1.32.0 and onnxruntime-ep-webgpu 0.4.0.
#
#   scripts/peer/native_gpu.sh DYNRT PYTHON OUT_DIR [ROUNDS] [WORKLOADS]
#
# WORKLOADS is a comma list of scripts/peer_models.py's (default: every one but SmolLM2,
# whose 542 MB export needs the GGUF). Models, feeds and the CPU EP's reference tokens are
# made in OUT_DIR; both runtimes then run every workload ROUNDS times (default 3), the order
# alternating, on the system's Vulkan driver (no VK_ICD_FILENAMES; ONNX Runtime through
# scripts/peer/ort-native.sh with PEER_ICD=system), under the counting layer when
# PEER_LAYER_DIR holds it built (scripts/peer/vulkan-count-layer). Prints the report of
# scripts/peer/report.py (the table of docs/benchmarks/2026-11-23-nvidia-h100.md) and
# leaves OUT_DIR/results.jsonl.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 3 ] || { sed -n '2,16p' "$0" >&2; exit 2; }
dynrt=$1 py=$2 out=$3 rounds=${4:-3} chosen_arg=${5:-}
dynrt_bench=$(dirname "$dynrt")/dynrt-bench
[ -x "$dynrt_bench" ] || { echo "native_gpu: no dynrt-bench beside $dynrt" >&2; exit 2; }
models=$out/models results=$out/results.jsonl reference=$out/reference.jsonl
mkdir -p "$out"
: > "$results"
: > "$reference"
say() { echo "native_gpu: $*" >&2; }
say "model files (scripts/peer_models.py)"
"$py" scripts/peer_models.py "$models" >&2
if [ -n "$chosen_arg" ]; then IFS=, read -r -a chosen <<< "$chosen_arg"
else mapfile -t chosen < <("$py" scripts/peer/manifest.py "$models" list); fi
adapter="$(WGPU_BACKEND=vulkan "$dynrt" info 2>/dev/null | sed -n 's/^chosen: \(.*\) on Vulkan.*/\1/p' | head -1)"
adapter="${adapter:-system Vulkan} (native Vulkan)"
layer_dir=${PEER_LAYER_DIR:-target/peer/layer}
count=()
[ -e "$layer_dir/libpeer_count_layer.so" ] && count=(VK_LAYER_PATH="$layer_dir" VK_INSTANCE_LAYERS=VK_LAYER_PEER_count)
for w in "${chosen[@]}"; do
  if [ "$("$py" scripts/peer/manifest.py "$models" kind "$w")" = decode ]; then
    say "reference tokens of $w (ONNX Runtime, CPU EP)"
    "$py" scripts/peer/ort_native.py "$models" "$w" --provider cpu | "$py" -c "import json,sys; d=json.load(sys.stdin); print(json.dumps({'workload': sys.argv[1], 'tokens': d['tokens']}))" "$w" >> "$reference"
  fi
  for ((r = 0; r < rounds; r++)); do
    order=(ort dynrt); [ $((r % 2)) = 1 ] && order=(dynrt ort)
    for rt in "${order[@]}"; do
      say "$w round $r: $rt"
      shm=$out/counters.$rt
      if [ $rt = ort ]; then
        env PEER_ICD=system ${count[@]+"${count[@]}"} ${count[@]+PEER_COUNT_SHM="$shm"} \
          scripts/peer/ort-native.sh "$py" scripts/peer/ort_native.py "$models" "$w" 2>&1 \
          | "$py" scripts/peer/manifest.py tag native-gpu "$adapter" "$w" $r ort >> "$results" || true
      else
        mapfile -t dargs < <("$py" scripts/peer/manifest.py "$models" dynrt-args "$w" "$out/dynrt-out/$w")
        env WGPU_BACKEND=vulkan ${count[@]+"${count[@]}"} ${count[@]+PEER_COUNT_SHM="$shm"} \
          "$dynrt_bench" onnx "${dargs[@]}" 2>&1 \
          | "$py" scripts/peer/manifest.py tag native-gpu "$adapter" "$w" $r dynrt >> "$results" || true
      fi
    done
  done
done
echo "Measured $(date -u +%Y-%m-%d) with \`scripts/peer/native_gpu.sh DYNRT PYTHON OUT $rounds${chosen_arg:+ $chosen_arg}\` on $(nproc) CPU cores; load average $(cut -d' ' -f1-3 /proc/loadavg) at the end."
echo
"$py" scripts/peer/report.py "$models" "$results" --reference "$reference"
