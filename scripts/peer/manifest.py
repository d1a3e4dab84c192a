#!/usr/bin/env python3
"""Small helpers of scripts/bench_peer.sh over scripts/peer_models.py's manifest.

    manifest.py MODELS_DIR list [WORKLOAD,...]       workload names (in manifest order)
    manifest.py MODELS_DIR steps WORKLOAD             the workload's step count
    manifest.py MODELS_DIR kind WORKLOAD              op or decode
    manifest.py MODELS_DIR dynrt-args WORKLOAD OUT    `dynrt-bench onnx` arguments, one a line
    manifest.py tag ROUTE ADAPTER WORKLOAD ROUND RUNTIME < DOC
        one results line: the runtime's JSON document (the last line of stdin that parses) with
        route, adapter, workload, round, runtime and the load average added; a run that printed
        nothing usable becomes {"error": <its last line of output>}
"""
import json
import os
import sys


def rows(models_dir):
    with open(os.path.join(models_dir, "workloads.json")) as f:
        return [json.loads(line) for line in f if line.strip()]


def dynrt_args(models_dir, row, out_dir):
    """`dynrt-bench onnx` arguments for one workload (the interface is in scripts/bench_peer.sh)."""
    args = [os.path.join(models_dir, row["model"]), "--feeds", os.path.join(models_dir, row["feeds"]),
            "--steps", str(row["steps"]), "--out", out_dir, "--json"]
    if row["kind"] == "decode":
        args += ["--decode", "--token-input", row["token_input"], "--logits", row["logits"]]
        if row.get("position_input"):
            args += ["--position-input", row["position_input"]]
        prefixes = set()
        for out_name, in_name in row["states"]:
            # The longest common suffix that starts at a '.' or '_' is the pair's shared tail;
            # what precedes it, the two prefixes (present.0.key / past_key_values.0.key ->
            # present / past_key_values).
            k = 0
            while k < min(len(out_name), len(in_name)) and out_name[-1 - k] == in_name[-1 - k]:
                k += 1
            while k > 0 and out_name[len(out_name) - k] not in "._":
                k -= 1
            prefixes.add((out_name[: len(out_name) - k], in_name[: len(in_name) - k]))
        for o, i in sorted(prefixes):
            args += ["--state", f"{o}={i}"]
    return args


def tag(route, adapter, workload, rnd, runtime):
    doc = None
    text = sys.stdin.read().strip().splitlines()
    for line in reversed(text):
        try:
            doc = json.loads(line)
            break
        except ValueError:
            continue
    if not isinstance(doc, dict):
        doc = {"error": (text[-1] if text else "no output")[:300]}
    with open("/proc/loadavg") as f:
        load = float(f.read().split()[0])
    print(json.dumps({"route": route, "adapter": adapter, "workload": workload, "round": int(rnd),
                      "runtime": runtime, "load": load, **doc}))


def main():
    a = sys.argv[1:]
    if a and a[0] == "tag":
        tag(*a[1:6])
        return
    models_dir, cmd = a[0], a[1]
    rs = rows(models_dir)
    if cmd == "list":
        want = a[2].split(",") if len(a) > 2 and a[2] else None
        for r in rs:
            if want is None or r["workload"] in want:
                print(r["workload"])
    elif cmd == "kind":
        print(next(r for r in rs if r["workload"] == a[2])["kind"])
    elif cmd == "steps":
        print(next(r for r in rs if r["workload"] == a[2])["steps"])
    elif cmd == "dynrt-args":
        print("\n".join(dynrt_args(models_dir, next(r for r in rs if r["workload"] == a[2]), a[3])))
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
