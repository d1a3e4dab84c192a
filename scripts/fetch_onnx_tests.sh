#!/usr/bin/env bash
# Fetches the ONNX backend node tests (onnx/backend/test/data/node/test_*/: model.onnx and
# test_data_set_N/{input,output}_K.pb, 1765 cases) from the onnx==1.22.0 wheel, the last
# release that ships them, and unpacks them into the cache folder:
#
#   DYNRT_ONNX_TESTS_DIR   cache folder (default: target/onnx-tests in this checkout);
#                          the cases land in $DYNRT_ONNX_TESTS_DIR/node/
#   PYTHON                 interpreter whose pip downloads the wheel (default: the venv of
#                          scripts/pyenv.sh, made only when the cases are not there yet)
#
# The wheel is fetched with `pip download --no-deps` (the platform wheel for this machine;
# the test data is the same in every one). A wheel already in the cache folder is reused, so
# a machine that has one can copy it there first. Prints the node folder on stdout.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="${DYNRT_ONNX_TESTS_DIR:-$root/target/onnx-tests}"
version=1.22.0
mkdir -p "$dir"
if [ -f "$dir/node/.complete-$version" ]; then
  echo "$dir/node"
  exit 0
fi
python="${PYTHON:-$("$root/scripts/pyenv.sh")}"
wheel="$(ls "$dir"/onnx-$version-*.whl 2>/dev/null | head -n1 || true)"
if [ -z "$wheel" ]; then
  echo "downloading onnx==$version (pip download --no-deps) into $dir" >&2
  "$python" -m pip download --disable-pip-version-check -q --no-deps --only-binary=:all: \
    -d "$dir" "onnx==$version" >&2
  wheel="$(ls "$dir"/onnx-$version-*.whl | head -n1)"
fi
echo "unpacking the node tests of $(basename "$wheel") into $dir/node" >&2
rm -rf "$dir/node"
"$python" - "$wheel" "$dir/node" <<'PY'
import sys, zipfile, os
wheel, out = sys.argv[1], sys.argv[2]
prefix = "onnx/backend/test/data/node/"
n = 0
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            rel = name[len(prefix):]
            dest = os.path.join(out, rel)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with z.open(name) as src, open(dest, "wb") as dst:
                dst.write(src.read())
            n += 1
cases = len([d for d in os.listdir(out) if os.path.isfile(os.path.join(out, d, "model.onnx"))])
print(f"{n} files, {cases} cases", file=sys.stderr)
if cases == 0:
    sys.exit("no node tests found in the wheel")
PY
touch "$dir/node/.complete-$version"
echo "$dir/node"
