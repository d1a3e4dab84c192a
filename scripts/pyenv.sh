#!/usr/bin/env bash
# Creates (once) and updates the Python venv that the tests and scripts use as independent
# references (numpy, gguf, tokenizers, sentencepiece, onnx, onnxruntime, onnx-ir, jinja2, openai,
# jsonschema: scripts/requirements.txt), then
# prints the path of its python on stdout. Everything else goes to stderr.
#
#   DYNRT_VENV   where the venv lives (default: target/venv in this checkout)
#   PYTHON       the interpreter that creates it (default: python3)
#
# Needs python3 with the venv module (Debian: apt-get install python3 python3-venv) and pip
# access to the package index. Reinstalls only when requirements.txt changed.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${DYNRT_VENV:-$root/target/venv}"
python="${PYTHON:-python3}"
req="$root/scripts/requirements.txt"
if ! command -v "$python" >/dev/null 2>&1; then
  echo "error: $python not found: install Python 3 with venv (apt-get install python3 python3-venv)" >&2
  exit 1
fi
if [ ! -x "$venv/bin/python" ]; then
  echo "creating the Python venv in $venv" >&2
  "$python" -m venv "$venv" >&2 || {
    echo "error: could not create a venv with $python (apt-get install python3-venv)" >&2
    exit 1
  }
fi
stamp="$venv/.requirements"
if ! cmp -s "$req" "$stamp" 2>/dev/null; then
  echo "installing scripts/requirements.txt into $venv" >&2
  # The venv's own interpreter runs pip: the `pip` script of a venv copied from another
  # checkout starts that checkout's python and would install there.
  "$venv/bin/python" -m pip install --disable-pip-version-check -q -r "$req" >&2
  cp "$req" "$stamp"
fi
echo "$venv/bin/python"
