#!/usr/bin/env bash
# Runs a command beside N busy processes and prints how long it took: the suite must pass on
# a shared, busy machine, not only on a quiet one (issue 36).
#
#   scripts/under_load.sh N COMMAND [ARGS...]
#   scripts/under_load.sh 2 cargo test --release --test gpu
#   scripts/test.sh --under-load 2        # the whole suite, through this script
#
# Each busy process is `yes > /dev/null`: one core kept busy. They are stopped (by their own
# process ids) when the command ends, whatever its status, and the command's status is this
# script's.
set -uo pipefail

if [ $# -lt 2 ] || ! [[ "$1" =~ ^[0-9]+$ ]]; then
  echo "usage: scripts/under_load.sh N COMMAND [ARGS...]   (N busy processes beside COMMAND)" >&2
  exit 2
fi
n=$1
shift

busy=()
stop_busy() {
  for pid in "${busy[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
}
trap stop_busy EXIT
trap 'exit 130' INT TERM
for ((i = 0; i < n; i++)); do
  yes > /dev/null &
  busy+=("$!")
done

start=$(date +%s)
"$@"
status=$?
took=$(( $(date +%s) - start ))
load=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?")
if [ "$status" -eq 0 ]; then
  verdict="passed"
else
  verdict="FAILED (exit $status)"
fi
echo "under_load: \`$*\` $verdict in ${took} s beside $n busy processes (load average $load)" >&2
exit "$status"
