#!/usr/bin/env python3
"""Turns the per-round records of scripts/bench_peer.sh into its report.

    report.py MODELS_DIR RESULTS.jsonl [--json] [--reference REF.jsonl]

RESULTS.jsonl: one record per (route, adapter, workload, runtime, round), each the document a
runtime printed (scripts/peer/ort_native.py, `dynrt-bench onnx`, web/peer/peer.js) plus
`route`, `adapter`, `workload`, `round`, and `load` (the load average around the run), or
{"missing": why} / {"error": what} instead of the figures. REF.jsonl: the tokens of ONNX
Runtime's CPU EP per decode workload ({"workload", "tokens"}).

Per workload and runtime: each round's median over its steps from the manifest's
`measure_from` on, then the median of those over the rounds ("median of rounds"); the counts
per step the same way; the peak bytes the largest of the rounds; the tokens must be the same
in every round (and equal to the CPU EP's when given).

--json: one line per workload, adapter and figure, exactly the issue's form:
  {"workload":..,"adapter":..,"unit":"ms/step|GB/s|GFLOP/s|buffers/step","dynrt":X,"ort":Y,
   "dynrt_over_ort":R,"better":"lower|higher"}
(X, R null where dynrt has no figure). Without --json: a Markdown table with every figure.
"""
import argparse
import json
import statistics

# Count names: the Vulkan layer's (native) and webgpu-count.js's (browser).
BUFFERS = ("create_buffer", "createBuffer")
BYTES = ("create_buffer_bytes", "createBufferBytes")
SUBMITS = ("queue_submit", "submit")
DISPATCHES = ("cmd_dispatch", "dispatch")


def pick(counts, names):
    for n in names:
        if n in counts:
            return counts[n]
    return None


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarise(recs, row):
    """The figures of one runtime on one workload and route over its rounds."""
    ok = [r for r in recs if "steps" in r]
    out = {"rounds": len(ok), "missing": None, "errors": [r["error"] for r in recs if "error" in r]}
    missing = [r["missing"] for r in recs if "missing" in r]
    if not ok:
        out["missing"] = missing[0] if missing else ("; ".join(out["errors"]) or "not run")
        return out
    start = min(row["measure_from"], max(len(r["steps"]) for r in ok) - 1)
    per_round = lambda f: med([med([f(s) for s in r["steps"][start:]]) for r in ok])
    out["ms"] = per_round(lambda s: s["ms"])
    out["cpu_ms"] = per_round(lambda s: s.get("cpu_ms"))
    out["buffers"] = per_round(lambda s: pick(s["counts"], BUFFERS))
    out["bytes"] = per_round(lambda s: pick(s["counts"], BYTES))
    out["submits"] = per_round(lambda s: pick(s["counts"], SUBMITS))
    out["dispatches"] = per_round(lambda s: pick(s["counts"], DISPATCHES))
    peaks = [r.get("peak_bytes") for r in ok if r.get("peak_bytes") is not None]
    out["peak"] = max(peaks) if peaks else None
    out["load_ms"] = med([r.get("load_ms") for r in ok])
    toks = [tuple(r.get("tokens") or []) for r in ok]
    out["tokens"] = list(toks[0]) if toks else []
    out["tokens_stable"] = all(t == toks[0] for t in toks)
    out["check_errors"] = [r["check_error"] for r in ok if r.get("check_error")]
    out["provider"] = ok[0].get("provider")
    if row["figure"] and out["ms"]:
        out["figure"] = row["per_step"] / (out["ms"] / 1e3) / 1e9
    return out


def fmt(x, digits=2):
    if x is None:
        return "–"
    if isinstance(x, float) and not x.is_integer():
        return f"{x:.{digits}f}"
    return f"{int(x):,}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models_dir")
    ap.add_argument("results")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--reference", help="tokens of ONNX Runtime's CPU EP per decode workload")
    args = ap.parse_args()
    with open(f"{args.models_dir}/workloads.json") as f:
        rows = {r["workload"]: r for r in map(json.loads, filter(str.strip, f))}
    with open(args.results) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    ref = {}
    if args.reference:
        with open(args.reference) as f:
            ref = {r["workload"]: r["tokens"] for r in map(json.loads, filter(str.strip, f))}

    groups = {}
    for r in recs:
        key = (r["adapter"], r["workload"])
        groups.setdefault(key, {}).setdefault(r["runtime"], []).append(r)
        groups[key].setdefault("_load", []).append(r.get("load"))

    order = list(rows)
    keys = sorted(groups, key=lambda k: (k[0], order.index(k[1]) if k[1] in order else 99))
    lines, table = [], []
    for adapter, workload in keys:
        row = rows.get(workload)
        if row is None:
            continue
        g = groups[(adapter, workload)]
        o = summarise(g.get("ort", []), row)
        d = summarise(g.get("dynrt", []), row)
        loads = sorted({x for x in g["_load"] if x})
        units = [("ms/step", "ms", "lower")]
        if row["figure"]:
            units.append((row["figure"], "figure", "higher"))
        units.append(("buffers/step", "buffers", "lower"))
        for unit, k, better in units:
            ov, dv = o.get(k), d.get(k)
            ratio = dv / ov if (dv is not None and ov) else None
            lines.append({"workload": workload, "adapter": adapter, "unit": unit, "dynrt": dv, "ort": ov,
                          "dynrt_over_ort": ratio, "better": better})
        tok = "–"
        if o.get("tokens"):
            same_ref = workload not in ref or ref[workload] == o["tokens"]
            tok = f"ORT {len(o['tokens'])} tokens, {'stable' if o['tokens_stable'] else 'DIFFER between rounds'}"
            if workload in ref:
                tok += ", = CPU EP" if same_ref else ", **differ from the CPU EP**"
            if d.get("tokens"):
                tok += "; dynrt " + ("identical" if d["tokens"] == o["tokens"] else "**different**")
        checks = o.get("check_errors", []) + d.get("check_errors", []) + o["errors"] + d["errors"]
        table.append((adapter, workload, row, o, d, loads, tok, checks))

    if args.json:
        for line in lines:
            print(json.dumps(line, separators=(",", ":")))
        return
    print("| adapter (route) | workload | ORT ms/step | dynrt ms/step | dynrt / ORT | CPU ms/step ORT / dynrt | ORT figure | dynrt figure | "
          "buffers/step ORT / dynrt | bytes created/step ORT / dynrt | submits/step ORT / dynrt | "
          "dispatches/step ORT / dynrt | peak bytes ORT / dynrt | tokens | rounds | load avg |")
    print("|---|---|---:|---:|---:|---|---:|---:|---|---|---|---|---|---|---|---|")
    for adapter, workload, row, o, d, loads, tok, checks in table:
        unit = row["figure"] or ""
        ratio = f"{d['ms'] / o['ms']:.2f}x" if d.get("ms") and o.get("ms") else "–"
        dyn_ms = fmt(d.get("ms")) if not d["missing"] else "missing"
        both = lambda k, dig=1: f"{fmt(o.get(k), dig)} / {fmt(d.get(k), dig)}"
        load = f"{min(loads):.1f}-{max(loads):.1f}" if loads else "–"
        note = f" ({'; '.join(checks)})" if checks else ""
        print(f"| {adapter} | {workload} | {fmt(o.get('ms'))} | {dyn_ms} | {ratio} | {both('cpu_ms', 2)} | "
              f"{fmt(o.get('figure'))} {unit if o.get('figure') else ''} | {fmt(d.get('figure'))} {unit if d.get('figure') else ''} | "
              f"{both('buffers')} | {both('bytes', 0)} | {both('submits')} | {both('dispatches')} | {both('peak', 0)} | "
              f"{tok}{note} | {o.get('rounds', 0)} / {d.get('rounds', 0)} | {load} |")
    missing = {}
    for _, w, _, _, d, _, _, _ in table:
        if d["missing"] and w not in missing.setdefault(d["missing"], []):
            missing[d["missing"]].append(w)
    if missing:
        print()
        for why, ws in missing.items():
            print(f"- dynrt missing on {', '.join(ws)}: {why}")


if __name__ == "__main__":
    main()
