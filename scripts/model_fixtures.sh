#!/usr/bin/env bash
# Regenerates fixtures/models/NAME/*.json: the independent reference's greedy answer
# (scripts/smollm2_ref.py generate in float64: prompt ids, STEPS generated ids, the top 5
# logits of every step) for three prompts, on a model too large to run the reference in CI.
# Instruction models get chat prompts; a base model (gemma3-270m) gets raw text instead, its
# third prompt a passage of about 700 tokens (fixtures/models/prompts/harbour.txt), longer than
# Gemma 3's 512-token sliding window.
# The model tests compare dynrt with these files, and one test runs the reference again on a
# few steps to check that it still reproduces them.
#
#   scripts/model_fixtures.sh qwen2.5-coder-0.5b-instruct [STEPS]   (STEPS default 32)
#   scripts/model_fixtures.sh gemma3-270m
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?usage: scripts/model_fixtures.sh MODEL_NAME [STEPS]}
steps=${2:-32}
model=$(cargo run --release --quiet -- fetch "$name")
py=$(scripts/pyenv.sh)
out=fixtures/models/$name
mkdir -p "$out"
run() {
  local key=$1
  shift
  echo "== $name $key ($steps steps)" >&2
  "$py" scripts/smollm2_ref.py generate --model "$model" "$@" --max-tokens "$steps" \
    --ignore-eos --dtype float64 --fixture --out "$out/$key.json" >/dev/null
}
case $name in
  gemma3-270m)
    run france --prompt "The capital of France is"
    run fox --prompt "The quick brown fox jumps over the lazy dog. The dog"
    run harbour --prompt "$(cat fixtures/models/prompts/harbour.txt)"
    ;;
  *)
    # The prompts of the SmolLM2 comparison (tests/gpu/llm.rs): a short chat, a raw
    # continuation, a longer chat.
    run france --chat "What is the capital of France?"
    run fox --prompt "The quick brown fox jumps over the lazy dog. The dog"
    run prime --chat "Write a Python function that checks whether a number is prime, then explain step by step how it works and how fast it is for very large numbers."
    ;;
esac
