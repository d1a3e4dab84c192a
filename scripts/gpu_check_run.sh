#!/usr/bin/env bash
# The runner of the GPU check (scripts/gpu_check.sh packs it as run.sh beside the binaries and
# the speed twins). On a machine with a GPU and no network:
#
#   ./run.sh [--quick] [--out FILE.tgz] [--models a,b,c]
#
#   --quick   SmolLM2 only, the shortest workloads (prefill_16, decode_d0, batch_4 of 4
#             tokens), with 8 times the time limits: the end to end test on a software
#             adapter (there, GGML_VK_VISIBLE_DEVICES=0 lets llama.cpp use lavapipe)
#   --out     the tarball (default ./gpu_check_results.tgz)
#   --models  the models to run, of those in models/ (default: all; --quick: SmolLM2)
#
# The tarball holds results/results.jsonl, one JSON line per (model, workload, runtime):
# {"model","workload","runtime","adapter","tok_s"} with workloads prefill_16/128/512 (a
# prompt in one pass), decode_d0/d256/d1024 (greedy decode at that depth), batch_16/64
# (tokens/s of 16 or 64 sequences decoding together); runtimes dynrt (`dynrt-bench generate`,
# `dynrt-bench batch`) and llama.cpp-vulkan (`llama-bench -ngl 99 -o jsonl`,
# `llama-batched-bench -ngl 99` TG speed). Beside it the raw outputs, `dynrt info --json`,
# `dynrt-bench kernels --json` and the log. Each command has a time limit, so the whole run
# stays under 6 minutes on a GPU; a command that fails or times out leaves its rows out and
# says so in the log. Workloads as in scripts/bench_llamacpp.sh: dynrt's decode_dN is the
# median step at contexts N+17..N+32 of a run from a 16-token prompt, llama.cpp's the mean
# over 32 tokens at depth N.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
quick=0
out="$PWD/gpu_check_results.tgz"
models=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --out) out="${2:?--out needs a file}"; shift ;;
    --models) models="${2:?--models needs a list}"; shift ;;
    -h | --help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "error: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac
work="$(mktemp -d)"
res="$work/results"
mkdir -p "$res" "$work/bin" "$work/models"
logf="$res/log.txt"
log() { echo "[gpu_check] $(date -u +%H:%M:%S) $*" | tee -a "$logf" >&2; }
t_start="$(date +%s)"

# ---- the Vulkan loader and driver ----
if ! ldconfig -p 2>/dev/null | grep -q 'libvulkan.so.1'; then
  # The loader and libglvnd (the NVIDIA driver's GLX/EGL libraries, which its Vulkan ICD is,
  # need libGLdispatch): unpacked into the work folder, never into /.
  found=0
  for deb in "$here"/*.deb; do
    [ -f "$deb" ] || continue
    dpkg-deb -x "$deb" "$work/vk" && found=1
  done
  if [ "$found" = 1 ]; then
    export LD_LIBRARY_PATH="$work/vk/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    log "no libvulkan.so.1 here: using $(cd "$here" && ls ./*.deb | tr '\n' ' ')"
  else
    log "no libvulkan.so.1 and no loader .deb: Vulkan will not start"
  fi
fi
for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
# A container with the NVIDIA driver mounted at /usr/local/nvidia registers no ICD where the
# loader looks: name it.
if [ -z "${VK_DRIVER_FILES:-}${VK_ICD_FILENAMES:-}" ] \
  && [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  log "using the NVIDIA ICD at $VK_DRIVER_FILES"
fi
export WGPU_BACKEND="${WGPU_BACKEND:-vulkan}"

# ---- binaries and speed twins ----
xz -dc "$here/dynrt.xz" >"$work/bin/dynrt" && chmod +x "$work/bin/dynrt"
xz -dc "$here/dynrt-bench.xz" >"$work/bin/dynrt-bench" && chmod +x "$work/bin/dynrt-bench"
xz -dc "$here/llama.tar.xz" | tar xf - -C "$work/bin"
all=()
for size in "$here"/models/*.size; do
  name="$(basename "$size" .size)"
  all+=("$name")
done
if [ -n "$models" ]; then
  IFS=',' read -r -a chosen <<<"$models"
elif [ "$quick" = 1 ]; then
  chosen=("${all[0]}")
  for name in "${all[@]}"; do
    case "$name" in smollm2*) chosen=("$name") ;; esac
  done
else
  chosen=("${all[@]}")
fi
for name in "${chosen[@]}"; do
  f="$work/models/$name.gguf"
  xz -dc "$here/models/$name.head.xz" >"$f"
  truncate -s "$(cat "$here/models/$name.size")" "$f"
done
dynrt="$work/bin/dynrt"
dynrt_bench="$work/bin/dynrt-bench"

# run LIMIT_S FILE CMD...: stdout to FILE, stderr to the log, killed after LIMIT_S seconds.
scale=1
[ "$quick" = 1 ] && scale=8
# A command that would start after the deadline (330 s; --quick: none) is skipped, so the
# tarball always comes back within the 6 minutes.
deadline=330
[ "$quick" = 1 ] && deadline=1000000
run() {
  local limit=$(($1 * scale)) file="$2" t0 rc=0
  shift 2
  t0="$(date +%s)"
  if [ $((t0 - t_start)) -gt "$deadline" ]; then
    log "$(basename "$file"): skipped, past the deadline"
    return
  fi
  timeout -k 5 "$limit" "$@" >"$file" 2>>"$res/stderr.txt" || rc=$?
  log "$(basename "$file"): exit $rc in $(($(date +%s) - t0)) s"
}

run 60 "$res/info.json" "$dynrt" info --json
if [ "$quick" = 1 ]; then
  log "bench kernels skipped (--quick)"
else
  run 60 "$res/kernels.json" "$dynrt_bench" kernels --json
fi
if [ "$quick" = 1 ]; then
  prefill="16"; contexts="32"; sessions="4"; ntg=4; npp=8
  llama_p="16"; llama_d="0"; llama_n=4; npl="4"
else
  prefill="16,128,512"; contexts="32,288,1056"; sessions="16,64"; ntg=32; npp=32
  llama_p="16,128,512"; llama_d="0,256,1024"; llama_n=32; npl="16,64"
fi
for name in "${chosen[@]}"; do
  f="$work/models/$name.gguf"
  run 100 "$res/$name.dynrt-generate.json" "$dynrt_bench" generate --json --model "$f" \
    --prefill "$prefill" --contexts "$contexts" --policies adaptive
  run 60 "$res/$name.dynrt-batch.jsonl" "$dynrt_bench" batch --json --model "$f" \
    --sessions "$sessions" --prompt-tokens "$npp" --tokens "$ntg"
  run 30 "$res/$name.llama-prefill.jsonl" "$work/bin/llama-bench" -m "$f" -ngl 99 -r 1 \
    -o jsonl -p "$llama_p" -n 0
  run 45 "$res/$name.llama-decode.jsonl" "$work/bin/llama-bench" -m "$f" -ngl 99 -r 1 \
    -o jsonl -p 0 -n "$llama_n" -d "$llama_d"
  run 45 "$res/$name.llama-batch.jsonl" "$work/bin/llama-batched-bench" -m "$f" -ngl 99 \
    -c 4608 -npp "$npp" -ntg "$ntg" -npl "$npl" --output-format jsonl
done

# ---- one JSON line per (model, workload, runtime) ----
python3 - "$res" "${chosen[@]}" >"$res/results.jsonl" 2>>"$logf" <<'EOF'
import json, os, sys

res, names = sys.argv[1], sys.argv[2:]

def lines(path):
    try:
        text = open(path).read()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out

def whole(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return None

for name in names:
    rows = []
    g = whole(os.path.join(res, f"{name}.dynrt-generate.json"))
    if g:
        adapter = f"{g['adapter']} ({g['backend']})"
        for p in g.get("prefill", []):
            rows.append(("prefill_%d" % p["prompt_tokens"], "dynrt", adapter, p["tokens_per_s"]))
        for d in g.get("decode", []):
            for c in d.get("contexts", []):
                if c["ms_per_token"] > 0:
                    rows.append(("decode_d%d" % (c["context"] - 32), "dynrt", adapter,
                                 1000.0 / c["ms_per_token"]))
    for r in lines(os.path.join(res, f"{name}.dynrt-batch.jsonl")):
        if r.get("runtime") == "batch":
            rows.append(("batch_%d" % r["sessions"], "dynrt", r.get("adapter", ""),
                         r["decode_tok_s"]))
    for kind in ("prefill", "decode"):
        for r in lines(os.path.join(res, f"{name}.llama-{kind}.jsonl")):
            adapter = r.get("gpu_info") or r.get("backends", "")
            if r.get("n_gen", 0) == 0:
                w = "prefill_%d" % r["n_prompt"]
            else:
                w = "decode_d%d" % r.get("n_depth", 0)
            # llama.cpp falls back to its CPU backend when Vulkan finds no device.
            rt = "llama.cpp-vulkan" if "Vulkan" in r.get("backends", "") else "llama.cpp-cpu"
            rows.append((w, rt, adapter, r["avg_ts"]))
    for r in lines(os.path.join(res, f"{name}.llama-batch.jsonl")):
        rows.append(("batch_%d" % r["pl"], "llama.cpp-vulkan", "", r["speed_tg"]))
    for w, rt, adapter, tok_s in rows:
        print(json.dumps({"model": name, "workload": w, "runtime": rt, "adapter": adapter,
                          "tok_s": round(float(tok_s), 3)}))
EOF
# The table, for the log and the terminal.
python3 - "$res/results.jsonl" <<'EOF' | tee -a "$logf"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
table = {}
for r in rows:
    table.setdefault((r["model"], r["workload"]), {})[r["runtime"]] = r["tok_s"]
print("| model | workload | dynrt tok/s | llama.cpp Vulkan tok/s | dynrt / llama.cpp |")
print("|---|---|---:|---:|---:|")
for (m, w), v in table.items():
    a, b = v.get("dynrt"), v.get("llama.cpp-vulkan")
    ratio = f"{a / b:.3g}x" if a and b else "-"
    print(f"| {m} | {w} | {a if a is not None else '-'} | {b if b is not None else '-'} | {ratio} |")
EOF
log "done in $(($(date +%s) - t_start)) s: $(wc -l <"$res/results.jsonl") lines"
tar czf "$out" -C "$work" results
rm -rf "$work"
echo "$out"
