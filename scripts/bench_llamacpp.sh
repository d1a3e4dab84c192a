#!/usr/bin/env bash
# Side by side with llama.cpp (issue 20, item 7): the same GGUF file, `llama-bench` against
# `dynrt-bench generate`, interleaved in rounds on the same machine.
#
#   scripts/bench_llamacpp.sh [--json] [--quick] [--model NAME|PATH] [--rounds N]
#                             [--vulkan] [--vulkan-include DIR] [--dynrt PATH]
#                             [--dynrt-bench PATH]
#   scripts/bench_llamacpp.sh --server [--vulkan] [--vulkan-include DIR]
#
#   --json            one JSON object per workload and runtime on stdout:
#                     {"workload","runtime","adapter","tok_s","rounds","load"}; the Markdown
#                     table goes to stderr. Without it the table goes to stdout.
#   --quick           2 rounds (default 4) and one short Vulkan round: 10 minutes with SmolLM2
#                     and 15 with Gemma 3 270M on 2 cores at load 6-8 (most of it dynrt's
#                     decode to context 1056), plus the first build (about 10 minutes)
#   --model NAME|PATH a GGUF file, or a model name of `dynrt fetch --list` (default:
#                     smollm2-135m-instruct); a name is fetched by dynrt on first use
#   --rounds N        rounds (each runs every runtime once, the order alternating)
#   --vulkan          also build and run llama.cpp's Vulkan backend (on lavapipe here)
#   --vulkan-include  Vulkan headers to build it with (default: the system's); this llama.cpp
#                     uses VK_EXT_layer_settings, which Debian bookworm's libvulkan-dev 1.3.239
#                     lacks: newer headers (for instance those of Debian trixie's libvulkan-dev
#                     1.4.309, unpacked with `dpkg-deb -x`) build it against bookworm's loader
#   --dynrt PATH      the dynrt binary, which fetches the model (default:
#                     target/release/dynrt, built when missing)
#   --dynrt-bench PATH  the dynrt-bench binary, which measures it (default:
#                     target/release/dynrt-bench, built when missing)
#   --server          build llama-server (CPU; with --vulkan also the Vulkan one) from the
#                     same source and print the path of each on stdout, measuring nothing
#                     (scripts/serve_bench.py drives it)
#
# Workloads and what each runtime measures (tok/s; medians over the rounds):
#   prefill_16/128/512   a prompt of 16/128/512 tokens in one pass. llama.cpp: `llama-bench
#                        -p 16,128,512 -n 0`; dynrt: `dynrt-bench generate --prefill 16,128,512`
#   decode_d0/256/1024   greedy decode at depth N (N tokens already in the KV cache).
#                        llama.cpp: `llama-bench -p 0 -n 32 -d N`, the mean over the 32
#                        tokens at contexts N+1..N+32; dynrt: `dynrt-bench generate --contexts
#                        32,288,1056`, 1000 / the median ms of its 16 decode steps at
#                        contexts N+17..N+32 (its decode starts from a 16-token prompt, so
#                        d0 is its first 16..32 context window), inside llama.cpp's window
# Runtimes: dynrt (its default adapter; the `adapter` field names it), llama.cpp-cpu-t1 and
# -t2 (CPU backend, 1 and 2 threads), llama.cpp-vulkan (only with --vulkan; on a machine
# whose only Vulkan device is lavapipe, ggml's Vulkan backend skips CPU-type devices unless
# GGML_VK_VISIBLE_DEVICES names them, which this script does).
# "load" is the 1-minute load average (/proc/loadavg) at the start of the runtime's first
# measurement and at the end of its last; the Markdown output lists every round's.
#
# llama.cpp's source is the one PyPI's llama-cpp-python sdist carries (vendor/llama.cpp):
# `pip download llama-cpp-python==0.3.36 --no-deps --no-binary :all:` with the venv python
# of scripts/pyenv.sh, untarred and built with cmake into target/llama.cpp/ once (a second
# run reuses the build). Needs cmake and g++ (Debian: apt-get install cmake g++); --vulkan
# also glslc, libvulkan-dev and spirv-headers (and the newer headers said above). Writes only
# under target/ and a temporary directory.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
version=0.3.36
work="$root/target/llama.cpp"
src="$work/src/llama_cpp_python-$version/vendor/llama.cpp"

json=0
quick=0
rounds=""
model="smollm2-135m-instruct"
vulkan=0
vulkan_include=""
dynrt="$root/target/release/dynrt"
dynrt_bench="$root/target/release/dynrt-bench"
server=0
usage() { sed -n '5,30p' "$0" | sed 's/^# \{0,1\}//' >&2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --json) json=1 ;;
    --quick) quick=1 ;;
    --model) model="${2:?--model needs a name or a path}"; shift ;;
    --rounds) rounds="${2:?--rounds needs a number}"; shift ;;
    --vulkan) vulkan=1 ;;
    --vulkan-include) vulkan_include="${2:?--vulkan-include needs a directory}"; shift ;;
    --dynrt) dynrt="${2:?--dynrt needs a path}"; shift ;;
    --dynrt-bench) dynrt_bench="${2:?--dynrt-bench needs a path}"; shift ;;
    --server) server=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "error: unknown argument $1" >&2; usage; exit 2 ;;
  esac
  shift
done
if [ -z "$rounds" ]; then
  if [ "$quick" = 1 ]; then rounds=2; else rounds=4; fi
fi
case "$rounds" in
  '' | *[!0-9]* | 0) echo "error: --rounds needs a positive integer, not '$rounds'" >&2; exit 2 ;;
esac

say() { echo "[bench_llamacpp] $*" >&2; }
load1() { cut -d' ' -f1 /proc/loadavg; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# ---- tools ----
missing=""
for tool in cmake g++; do
  command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"
done
if [ -n "$missing" ]; then
  echo "error: missing:$missing (Debian: apt-get install cmake g++)" >&2
  exit 1
fi
py="$("$root/scripts/pyenv.sh")"
if ! "$py" -m pip --version >/dev/null 2>&1; then
  echo "error: pip is missing in the venv $py (apt-get install python3-venv python3-pip)" >&2
  exit 1
fi

# ---- the llama.cpp source and builds (once) ----
if [ ! -f "$src/CMakeLists.txt" ]; then
  mkdir -p "$work/src"
  sdist="$work/src/llama_cpp_python-$version.tar.gz"
  if [ ! -f "$sdist" ]; then
    say "downloading the llama-cpp-python $version sdist"
    "$py" -m pip download --disable-pip-version-check -q "llama-cpp-python==$version" \
      --no-deps --no-binary :all: -d "$tmp/sdist" >&2 || {
      echo "error: pip download llama-cpp-python==$version failed" >&2
      exit 1
    }
    mv "$tmp/sdist/llama_cpp_python-$version.tar.gz" "$sdist"
  fi
  say "unpacking $sdist"
  tar xzf "$sdist" -C "$work/src"
  [ -f "$src/CMakeLists.txt" ] || { echo "error: no vendor/llama.cpp in $sdist" >&2; exit 1; }
fi

# build DIR EXTRA_CMAKE_ARGS...: configures and builds llama-bench (with --server:
# llama-server) into target/llama.cpp/DIR
target=llama-bench
[ "$server" = 1 ] && target=llama-server
build() {
  local dir="$work/$1"
  shift
  if [ -x "$dir/bin/$target" ]; then
    return 0
  fi
  say "building $target in $dir (cmake, -j$(nproc); minutes)"
  cmake -S "$src" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_CCACHE=OFF "$@" >"$dir.configure.log" 2>&1 || {
    echo "error: cmake configure failed, see $dir.configure.log" >&2
    return 1
  }
  cmake --build "$dir" -j"$(nproc)" --target "$target" >"$dir.build.log" 2>&1 || {
    echo "error: the build failed, see $dir.build.log" >&2
    return 1
  }
}
mkdir -p "$work"
build build-cpu -DGGML_VULKAN=OFF
if [ "$server" = 1 ]; then
  echo "$work/build-cpu/bin/llama-server"
  if [ "$vulkan" = 1 ]; then
    build build-vulkan -DGGML_VULKAN=ON "-DVulkan_INCLUDE_DIR=${vulkan_include:-/usr/include}" \
      && echo "$work/build-vulkan/bin/llama-server"
  fi
  exit 0
fi
bench_cpu="$work/build-cpu/bin/llama-bench"
help="$("$bench_cpu" --help 2>&1 || true)"
if [[ "$help" != *"--n-depth"* ]]; then
  echo "error: this llama-bench has no -d (--n-depth): decode at depth cannot be measured" >&2
  exit 1
fi

skipped=""
bench_vk=""
if [ "$vulkan" = 1 ]; then
  inc="${vulkan_include:-/usr/include}"
  if ! command -v glslc >/dev/null 2>&1; then
    skipped="llama.cpp-vulkan skipped: no glslc (Debian: apt-get install glslc)"
  elif [ ! -f "$inc/vulkan/vulkan.hpp" ]; then
    skipped="llama.cpp-vulkan skipped: no $inc/vulkan/vulkan.hpp (Debian: apt-get install libvulkan-dev; bookworm's are too old for this llama.cpp: --vulkan-include DIR)"
  elif ! grep -rqs 'LayerSettingEXT' "$inc/vulkan/"; then
    skipped="llama.cpp-vulkan skipped: the Vulkan headers in $inc lack VK_EXT_layer_settings (newer ones needed: --vulkan-include DIR)"
  elif ! compgen -G '/usr/lib/*/libvulkan.so' >/dev/null && [ ! -e /usr/lib/libvulkan.so ]; then
    skipped="llama.cpp-vulkan skipped: no libvulkan.so (Debian: apt-get install libvulkan-dev)"
  elif ! compgen -G '/usr/share/cmake/SPIRV-Headers/*onfig.cmake' >/dev/null \
    && ! compgen -G '/usr/lib/*/cmake/SPIRV-Headers/*onfig.cmake' >/dev/null; then
    skipped="llama.cpp-vulkan skipped: no SPIRV-Headers cmake package (Debian: apt-get install spirv-headers)"
  elif build build-vulkan -DGGML_VULKAN=ON "-DVulkan_INCLUDE_DIR=$inc"; then
    bench_vk="$work/build-vulkan/bin/llama-bench"
  else
    skipped="llama.cpp-vulkan skipped: its build failed (target/llama.cpp/build-vulkan.*.log)"
  fi
else
  skipped="llama.cpp-vulkan not run (pass --vulkan)"
fi
[ -n "$skipped" ] && say "$skipped"

# ---- dynrt and the model ----
if [ ! -x "$dynrt" ] || [ ! -x "$dynrt_bench" ]; then
  say "building dynrt and dynrt-bench (cargo build --release)"
  (cd "$root" && cargo build --release >&2)
fi
if [ -f "$model" ]; then
  gguf="$model"
else
  gguf="$("$dynrt" fetch "$model")" || { echo "error: dynrt cannot fetch $model" >&2; exit 1; }
fi
say "model $gguf"

# ---- the rounds ----
# Each measurement writes its output to $tmp/RUNTIME.ROUND.{json,err} and a line
# "RUNTIME ROUND LOAD_START LOAD_END SECONDS" to $tmp/loads.
measure() {
  local name="$1" round="$2"
  shift 2
  local l0 t0 rc=0
  l0="$(load1)"
  t0="$(date +%s)"
  say "round $round/$rounds: $name"
  "$@" >"$tmp/$name.$round.json" 2>"$tmp/$name.$round.err" || rc=$?
  echo "$name $round $l0 $(load1) $(($(date +%s) - t0))" >>"$tmp/loads"
  if [ "$rc" != 0 ]; then
    echo "error: $name failed in round $round (exit $rc):" >&2
    tail -n 20 "$tmp/$name.$round.err" >&2
    exit 1
  fi
}
dynrt_run() {
  "$dynrt_bench" generate --json --model "$gguf" --prefill 16,128,512 \
    --contexts 32,288,1056 --policies adaptive
}
llama_run() {
  local bin="$1"
  shift
  "$bin" -m "$gguf" -r 1 -o jsonl -p 16,128,512 -n 0 "$@" || return
  "$bin" -m "$gguf" -r 1 -o jsonl -p 0 -n 32 -d 0,256,1024 "$@"
}
vulkan_run() (
  # Minutes per token batch on lavapipe: the short form measures prefill_16 and decode_d0.
  export GGML_VK_VISIBLE_DEVICES=0
  if [ "$quick" = 1 ]; then
    "$bench_vk" -m "$gguf" -r 1 -o jsonl -ngl 99 -p 16 -n 0 || return
    "$bench_vk" -m "$gguf" -r 1 -o jsonl -ngl 99 -p 0 -n 8 -d 0
  else
    llama_run "$bench_vk" -ngl 99
  fi
)
date_start="$(date -u '+%Y-%m-%d %H:%M UTC')"
: >"$tmp/loads"
for round in $(seq 1 "$rounds"); do
  if [ $((round % 2)) = 1 ]; then
    order="dynrt llama.cpp-cpu-t1 llama.cpp-cpu-t2"
  else
    order="llama.cpp-cpu-t2 llama.cpp-cpu-t1 dynrt"
  fi
  for name in $order; do
    case "$name" in
      dynrt) measure dynrt "$round" dynrt_run ;;
      llama.cpp-cpu-t1) measure "$name" "$round" llama_run "$bench_cpu" -t 1 ;;
      llama.cpp-cpu-t2) measure "$name" "$round" llama_run "$bench_cpu" -t 2 ;;
    esac
  done
  # One Vulkan round (--quick: its short form) is enough: it takes minutes per batch here.
  if [ -n "$bench_vk" ] && [ "$round" = 1 ]; then
    measure llama.cpp-vulkan 1 vulkan_run
  fi
done
date_end="$(date -u '+%Y-%m-%d %H:%M UTC')"

# ---- the report ----
DATE_START="$date_start" DATE_END="$date_end" SKIPPED="$skipped" MODEL="$gguf" \
  JSON="$json" "$py" - "$tmp" <<'EOF'
import glob, json, os, statistics, sys

tmp = sys.argv[1]
tok_s = {}      # (workload, runtime) -> [tok/s per round]
adapter = {}
for path in sorted(glob.glob(os.path.join(tmp, "*.json"))):
    runtime = os.path.basename(path).rsplit(".", 2)[0]
    text = open(path).read()
    if runtime == "dynrt":
        r = json.loads(text)
        adapter[runtime] = r["adapter"] + " (" + r["backend"] + ")"
        for p in r["prefill"]:
            tok_s.setdefault((f"prefill_{p['prompt_tokens']}", runtime), []).append(p["tokens_per_s"])
        for d in r["decode"]:
            for c in d["contexts"]:
                if c["ms_per_token"] > 0:
                    w = f"decode_d{c['context'] - 32}"
                    tok_s.setdefault((w, runtime), []).append(1000.0 / c["ms_per_token"])
        continue
    for line in text.splitlines():
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        if runtime.endswith("vulkan"):
            adapter[runtime] = r.get("gpu_info") or r.get("backends", "")
        else:
            t = r["n_threads"]
            adapter[runtime] = f"{r['cpu_info']} CPU, {t} thread" + ("s" if t != 1 else "")
        if r["n_gen"] == 0:
            w = f"prefill_{r['n_prompt']}"
        else:
            w = f"decode_d{r['n_depth']}"
        tok_s.setdefault((w, runtime), []).append(r["avg_ts"])

loads = {}
for line in open(os.path.join(tmp, "loads")):
    name, rnd, l0, l1, secs = line.split()
    loads.setdefault(name, []).append((int(rnd), float(l0), float(l1), int(secs)))
order = ["dynrt", "llama.cpp-cpu-t1", "llama.cpp-cpu-t2", "llama.cpp-vulkan"]
runtimes = [r for r in order if r in loads]
workloads = ["prefill_16", "prefill_128", "prefill_512", "decode_d0", "decode_d256", "decode_d1024"]

def load_of(rt):
    ls = sorted(loads[rt])
    return [ls[0][1], ls[-1][2]]

rows = []
for w in workloads:
    for rt in runtimes:
        v = tok_s.get((w, rt))
        if v:
            rows.append({"workload": w, "runtime": rt, "adapter": adapter.get(rt, ""),
                         "tok_s": round(statistics.median(v), 3), "rounds": len(v),
                         "load": load_of(rt)})
med = {(r["workload"], r["runtime"]): r["tok_s"] for r in rows}

md = []
md.append(f"Model `{os.path.basename(os.environ['MODEL'])}`, {os.environ['DATE_START']} to "
          f"{os.environ['DATE_END']}: tokens per second, the median over the rounds (the "
          "slowest and fastest round in brackets); dynrt / X is dynrt's tok/s over X's "
          "(above 1: dynrt is faster).")
md.append("")
md.append("| workload | " + " | ".join(runtimes) + " | "
          + " | ".join(f"dynrt / {rt[len('llama.cpp-'):]}" for rt in runtimes if rt != "dynrt") + " |")
md.append("|---|" + "---:|" * (2 * len(runtimes) - 1))
for w in workloads:
    cells = []
    for rt in runtimes:
        v = tok_s.get((w, rt))
        cells.append(f"{statistics.median(v):.3g} [{min(v):.3g}, {max(v):.3g}]" if v else "-")
    for rt in runtimes:
        if rt == "dynrt":
            continue
        a, b = med.get((w, "dynrt")), med.get((w, rt))
        cells.append(f"{a / b:.3g}x" if a and b else "-")
    md.append(f"| {w} | " + " | ".join(cells) + " |")
md.append("")
md.append("| runtime | adapter | 1-min load average at start / end of each round | seconds per round |")
md.append("|---|---|---|---|")
for rt in runtimes:
    ls = sorted(loads[rt])
    md.append(f"| {rt} | {adapter.get(rt, '')} | "
              + ", ".join(f"{a:.2f} / {b:.2f}" for _, a, b, _ in ls) + " | "
              + ", ".join(str(s) for *_, s in ls) + " |")
if os.environ["SKIPPED"]:
    md.append("")
    md.append(os.environ["SKIPPED"] + ".")
text = "\n".join(md)
if os.environ["JSON"] == "1":
    for r in rows:
        print(json.dumps(r))
    print(text, file=sys.stderr)
else:
    print(text)
EOF
