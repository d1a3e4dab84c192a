#!/usr/bin/env bash
# The GPU check as one folder (issue 31, item 6): packs what a GPU machine without network
# needs to measure dynrt beside llama.cpp's Vulkan backend, into one folder under 64 MiB, with
# a runner that returns one tarball of JSON lines.
#
#   scripts/gpu_check.sh [--out DIR] [--models a,b,c] [--dynrt PATH] [--dynrt-bench PATH]
#
#   --out DIR      the folder to fill (default target/gpu_check); emptied first
#   --models LIST  models of `dynrt fetch --list` (default: smollm2-135m-instruct,
#                  qwen2.5-coder-0.5b-instruct, gemma3-270m); fetched on first use
#   --dynrt PATH   the dynrt binary (default target/release/dynrt, built when missing)
#   --dynrt-bench PATH   the dynrt-bench binary (default target/release/dynrt-bench, built
#                  when missing)
#
# The folder holds:
#   dynrt.xz, dynrt-bench.xz, llama.tar.xz   the binaries, stripped and xz'd: dynrt (info,
#       fetch) and dynrt-bench (the benchmarks) each under 6 MB, llama-bench
#       and llama-batched-bench in one archive (each alone is 6.2 MB; together, sharing their
#       embedded Vulkan shaders, 7 MB). llama.cpp is the source PyPI's llama-cpp-python 0.3.36 sdist carries
#       (as scripts/bench_llamacpp.sh takes it), built for Vulkan for any x86-64 with AVX2
#       (-DGGML_NATIVE=OFF -DGGML_AVX2=ON ...), static but for glibc and the Vulkan loader,
#       against Vulkan headers 1.4 (Debian trixie's libvulkan-dev, unpacked with dpkg-deb)
#       since bookworm's 1.3.239 lack VK_EXT_layer_settings. The build (tens of minutes on
#       two cores) goes to target/llama.cpp/build-vulkan-portable and is reused.
#   models/NAME.head.xz, models/NAME.size   speed twins: each GGUF's header and tensor table
#       (everything before the tensor data), and the file's size. The runner extends the
#       header with zeros to that size (`truncate`): the same kernels and bytes as the real
#       model, meaningless tokens.
#   *.deb   Debian's Vulkan loader (libvulkan1) and libglvnd (libglvnd0, libegl1, libgl1,
#       libglx0, libopengl0, libgles2: the NVIDIA driver's ICD needs its dispatch library), for
#       a machine whose `ldconfig -p` lacks libvulkan.so.1 (unpacked into a temporary folder,
#       never into /).
#   run.sh   the runner (scripts/gpu_check_run.sh): `DIR/run.sh [--quick] [--out FILE.tgz]`.
#
# Needs: cargo, xz, python3, apt-get (for the loader's .deb) and, for the llama.cpp build,
# cmake, g++, glslc, spirv-headers and pip (as scripts/bench_llamacpp.sh says). Writes only
# under target/ and a temporary directory.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$root/target/gpu_check"
models="smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct,gemma3-270m"
dynrt="$root/target/release/dynrt"
dynrt_bench="$root/target/release/dynrt-bench"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="${2:?--out needs a folder}"; shift ;;
    --models) models="${2:?--models needs a list}"; shift ;;
    --dynrt) dynrt="${2:?--dynrt needs a path}"; shift ;;
    --dynrt-bench) dynrt_bench="${2:?--dynrt-bench needs a path}"; shift ;;
    -h | --help) sed -n '2,37p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "error: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
say() { echo "[gpu_check] $*" >&2; }
for tool in xz python3 strip; do
  command -v "$tool" >/dev/null 2>&1 || { echo "error: $tool is missing" >&2; exit 1; }
done
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# ---- dynrt ----
if [ ! -x "$dynrt" ] || [ ! -x "$dynrt_bench" ]; then
  say "building dynrt and dynrt-bench (cargo build --release)"
  (cd "$root" && cargo build --release >&2)
fi

# ---- llama.cpp for Vulkan, portable ----
version=0.3.36
work="$root/target/llama.cpp"
src="$work/src/llama_cpp_python-$version/vendor/llama.cpp"
build="$work/build-vulkan-portable"
headers="$root/target/vulkan-1.4/usr/include"
if [ ! -x "$build/bin/llama-bench" ] || [ ! -x "$build/bin/llama-batched-bench" ]; then
  for tool in cmake g++ glslc; do
    command -v "$tool" >/dev/null 2>&1 || {
      echo "error: $tool is missing (Debian: apt-get install cmake g++ glslc spirv-headers)" >&2
      exit 1
    }
  done
  if [ ! -f "$src/CMakeLists.txt" ]; then
    mkdir -p "$work/src"
    say "downloading the llama-cpp-python $version sdist"
    python3 -m pip download --disable-pip-version-check -q "llama-cpp-python==$version" \
      --no-deps --no-binary :all: -d "$work/src" >&2
    tar xzf "$work/src/llama_cpp_python-$version.tar.gz" -C "$work/src"
  fi
  if [ ! -f "$headers/vulkan/vulkan.hpp" ]; then
    say "fetching Vulkan headers 1.4 (Debian trixie's libvulkan-dev)"
    mkdir -p "$tmp/apt/lists/partial" "$tmp/deb"
    echo 'deb http://deb.debian.org/debian trixie main' >"$tmp/apt/sources.list"
    apt_o=(-oDir::Etc::SourceList="$tmp/apt/sources.list" -oDir::Etc::SourceParts=/dev/null
      -oDir::State::Lists="$tmp/apt/lists" -oAPT::Architecture=amd64)
    apt-get "${apt_o[@]}" update -qq >&2
    (cd "$tmp/deb" && apt-get "${apt_o[@]}" download libvulkan-dev >&2)
    mkdir -p "$root/target/vulkan-1.4"
    dpkg-deb -x "$tmp"/deb/libvulkan-dev_*.deb "$root/target/vulkan-1.4"
  fi
  say "building llama-bench and llama-batched-bench for Vulkan in $build (tens of minutes)"
  cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_CCACHE=OFF -DGGML_VULKAN=ON -DGGML_NATIVE=OFF \
    -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_OPENMP=OFF \
    -DCMAKE_EXE_LINKER_FLAGS="-static-libgcc -static-libstdc++" \
    -DVulkan_INCLUDE_DIR="$headers" >"$build.configure.log" 2>&1
  nice cmake --build "$build" -j"$(nproc)" --target llama-bench llama-batched-bench \
    >"$build.build.log" 2>&1
fi

# ---- the folder ----
rm -rf "$out"
mkdir -p "$out/models"
pack() { # pack SRC NAME: stripped and xz'd, at most 6 MB
  strip -o "$tmp/$2" "$1"
  xz -9e -T1 -c "$tmp/$2" >"$out/$2.xz"
  local bytes
  bytes="$(stat -c %s "$out/$2.xz")"
  say "$2.xz: $bytes bytes"
  [ "$bytes" -le 6000000 ] || { echo "error: $2.xz is $bytes bytes, above 6 MB" >&2; exit 1; }
}
pack "$dynrt" dynrt
pack "$dynrt_bench" dynrt-bench
# Both llama.cpp tools in one archive (kept beside the build: xz -9e takes minutes).
llama_xz="$work/llama-vulkan.tar.xz"
if [ ! -f "$llama_xz" ] || [ "$build/bin/llama-bench" -nt "$llama_xz" ] \
  || [ "$build/bin/llama-batched-bench" -nt "$llama_xz" ]; then
  mkdir -p "$tmp/llama"
  strip -o "$tmp/llama/llama-bench" "$build/bin/llama-bench"
  strip -o "$tmp/llama/llama-batched-bench" "$build/bin/llama-batched-bench"
  tar cf - -C "$tmp/llama" llama-bench llama-batched-bench | xz -9e -T1 >"$llama_xz"
fi
cp "$llama_xz" "$out/llama.tar.xz"
say "llama.tar.xz: $(stat -c %s "$out/llama.tar.xz") bytes"

IFS=',' read -r -a names <<<"$models"
for name in "${names[@]}"; do
  gguf="$("$dynrt" fetch "$name" | tail -n 1)"
  [ -f "$gguf" ] || { echo "error: dynrt fetch $name gave no file" >&2; exit 1; }
  # The offset of the tensor data: the header, the metadata and the tensor table before it.
  head_bytes="$(python3 - "$gguf" <<'EOF'
import struct, sys
f = open(sys.argv[1], "rb")
def rd(fmt):
    return struct.unpack("<" + fmt, f.read(struct.calcsize("<" + fmt)))[0]
def rd_str():
    return f.read(rd("Q"))
sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
def skip(t):
    if t in sizes:
        f.read(sizes[t])
    elif t == 8:
        rd_str()
    elif t == 9:
        inner, n = rd("I"), rd("Q")
        if inner in sizes:
            f.read(sizes[inner] * n)
        else:
            for _ in range(n):
                skip(inner)
    else:
        raise SystemExit(f"unknown GGUF value type {t}")
assert f.read(4) == b"GGUF", "not a GGUF file"
version, tensors, kvs = rd("I"), rd("Q"), rd("Q")
align = 32
for _ in range(kvs):
    key, t = rd_str(), rd("I")
    if key == b"general.alignment" and t == 4:
        align = rd("I")
    else:
        skip(t)
for _ in range(tensors):
    rd_str()
    f.read(8 * rd("I") + 4 + 8)
pos = f.tell()
print((pos + align - 1) // align * align)
EOF
)"
  size="$(stat -c %s "$gguf")"
  head -c "$head_bytes" "$gguf" | xz -9 -T1 >"$out/models/$name.head.xz"
  echo "$size" >"$out/models/$name.size"
  say "$name: header and tensor table $head_bytes of $size bytes"
done

# The Vulkan loader, and libglvnd's libraries that the NVIDIA driver's ICD loads beside it.
if (cd "$out" && apt-get download libvulkan1 libglvnd0 libegl1 libgl1 libglx0 libopengl0 \
  libgles2 >/dev/null 2>&1); then
  say "$(cd "$out" && ls ./*.deb | tr '\n' ' ')"
else
  say "warning: apt-get download of the loader failed: the folder has no Vulkan loader"
fi
cp "$root/scripts/gpu_check_run.sh" "$out/run.sh"
chmod +x "$out/run.sh"
total="$(du -sb "$out" | cut -f1)"
say "$out: $total bytes"
[ "$total" -lt $((64 << 20)) ] || { echo "error: $out is $total bytes, above 64 MiB" >&2; exit 1; }
echo "$out"
