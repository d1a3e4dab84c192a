#!/usr/bin/env python3
"""Load test of `dynrt serve` over real HTTP on 127.0.0.1 (standard library only).

Starts the server (`dynrt serve --port 0`, the address it prints), then for each number of
concurrent clients N (default 1, 4, 16):

* every request is a greedy chat with a mixed prompt and answer length; half share one
  system prompt, and one in eight disconnects after its first two streamed chunks;
* first each distinct request that runs to the end is sent alone (non-streamed): its text is
  the answer every concurrent copy must give;
* then all N start at once, streamed; a sampler reads /metrics every 0.2 s.

Reported per N (a Markdown table, or one JSON object per N with --json): total tokens per
second over the wall time, time to first token and time per output token (p50 / p99, from
the client's side), peak device bytes, the KV pages held at their peak against the pools,
the KV room held but not written at that sample (`1 - needed / held`: the unwritten ends of
last pages and the spare pages the preallocation policy holds ahead) and the same without
the spare pages, the most pages shared, requests whose pages went to host memory (offloads)
and the most bytes there at once, preemptions (recomputed requests), the largest batch,
requests lost (must be 0) and answers that differ from the request run alone (must be 0).
Exits 1 when a request is lost, an answer differs or the budget is exceeded.

    cargo build --release
    python3 scripts/load_test.py [--model NAME|PATH] [--clients 1,4,16] [--budget-mib N]
        [--max-batch B] [--page-size P] [--policy none|openvino|adaptive] [--no-offload]
        [--json]
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

SYSTEM = "You are a concise assistant. Answer in one or two sentences."
QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colours.",
    "Why is the sky blue?",
    "Write a haiku about the sea.",
    "What is 12 times 12?",
    "Give me a word that rhymes with cat.",
    "What does a compiler do?",
    "Explain in short what a hash table is, how it handles collisions, and when it is slow.",
]
ANSWER_TOKENS = [8, 16, 32]


MODEL_ID = "dynrt"


def request_body(i):
    """The i-th request of a run: (body, disconnects)."""
    q = QUESTIONS[i % len(QUESTIONS)]
    messages = [{"role": "user", "content": q}]
    if i % 2 == 0:
        messages.insert(0, {"role": "system", "content": SYSTEM})
    body = {
        "model": MODEL_ID,
        "messages": messages,
        "max_tokens": ANSWER_TOKENS[i % len(ANSWER_TOKENS)],
        "temperature": 0,
    }
    return body, i % 8 == 7


def key(body):
    return json.dumps(body, sort_keys=True)


def post(base, path, body, timeout=900):
    req = urllib.request.Request(
        base + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    return urllib.request.urlopen(req, timeout=timeout)


def alone(base, body):
    """The text of `body` run alone, not streamed."""
    with post(base, "/v1/chat/completions", dict(body, stream=False)) as r:
        return json.loads(r.read())["choices"][0]["message"]["content"]


def streamed(base, body, disconnect, out):
    """Streams `body`; fills `out` with timings, text and whether it completed."""
    t0 = time.perf_counter()
    times, text = [], []
    try:
        with post(base, "/v1/chat/completions", dict(body, stream=True)) as r:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    out["done"] = True
                    break
                chunk = json.loads(data)
                delta = chunk["choices"][0]["delta"].get("content") if chunk["choices"] else None
                if delta:
                    times.append(time.perf_counter())
                    text.append(delta)
                if disconnect and len(times) >= 2:
                    out["disconnected"] = True
                    break  # closing the response drops the connection
    except (urllib.error.URLError, ConnectionError, OSError) as e:
        out["error"] = str(e)
    out["t0"], out["times"], out["text"] = t0, times, "".join(text)


def metrics(base):
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        text = r.read().decode()
    values = {}
    for line in text.splitlines():
        m = re.match(r"^(dynrt_[a-z_]+) ([0-9.e+-]+)$", line)
        if m:
            values[m.group(1)] = float(m.group(2))
    return values


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def run(base, n, references):
    results = [dict() for _ in range(n)]
    bodies = [request_body(i) for i in range(n)]
    samples = []
    stop = threading.Event()

    def sampler():
        while not stop.is_set():
            try:
                samples.append(metrics(base))
            except (urllib.error.URLError, OSError):
                pass
            stop.wait(0.2)

    s = threading.Thread(target=sampler)
    s.start()
    threads = [
        threading.Thread(target=streamed, args=(base, b, d, results[i]))
        for i, (b, d) in enumerate(bodies)
    ]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    # Disconnected requests are cancelled by the server; wait until it is idle.
    for _ in range(300):
        m = metrics(base)
        if m.get("dynrt_active_sessions", 0) == 0 and m.get("dynrt_queue_length", 0) == 0:
            break
        time.sleep(0.2)
    stop.set()
    s.join()
    samples.append(metrics(base))

    ttft, tpot, tokens, lost, differ = [], [], 0, 0, 0
    for (body, disconnect), r in zip(bodies, results):
        if r.get("times"):
            ttft.append(r["times"][0] - r["t0"])
            tpot.extend(b - a for a, b in zip(r["times"], r["times"][1:]))
        tokens += len(r.get("times", []))
        if disconnect:
            continue
        if not r.get("done"):
            lost += 1
        elif r["text"] != references[key(body)]:
            differ += 1
    budget = max(m.get("dynrt_kv_budget_bytes", 0) for m in samples)
    # The sample where the requests held the most pages: what they held against what the
    # tokens they hold need (the rest is the unwritten end of each one's last page).
    peak = max(samples, key=lambda m: m.get("dynrt_kv_reserved_bytes", 0))
    reserved = peak.get("dynrt_kv_reserved_bytes", 0)
    needed = peak.get("dynrt_kv_needed_bytes", 0)
    page_bytes = budget / max(1, peak.get("dynrt_kv_pages_total", 1))
    written_pages = reserved - peak.get("dynrt_kv_pages_spare", 0) * page_bytes
    shared = [m.get("dynrt_kv_pages_shared", 0) for m in samples]
    return {
        "clients": n,
        "wall_s": round(wall, 2),
        "tokens": tokens,
        "tok_s": round(tokens / wall, 2),
        "ttft_p50_s": round(pct(ttft, 50), 3),
        "ttft_p99_s": round(pct(ttft, 99), 3),
        "tpot_p50_ms": round(1e3 * pct(tpot, 50), 1),
        "tpot_p99_ms": round(1e3 * pct(tpot, 99), 1),
        "device_peak_bytes": int(max(m.get("dynrt_device_peak_bytes", 0) for m in samples)),
        "kv_allocated_peak_bytes": int(
            max(m.get("dynrt_kv_allocated_peak_bytes", 0) for m in samples)
        ),
        "kv_budget_bytes": int(budget),
        "kv_reserved_peak_bytes": int(reserved),
        "kv_unused_at_peak": round(1 - needed / reserved, 3) if reserved else 0.0,
        "kv_unwritten_at_peak": round(1 - needed / written_pages, 3) if written_pages else 0.0,
        "spare_pages_at_peak": int(peak.get("dynrt_kv_pages_spare", 0)),
        "offloads": int(samples[-1].get("dynrt_kv_offloads_total", 0)),
        "offloaded_peak_bytes": int(max(m.get("dynrt_kv_offloaded_bytes", 0) for m in samples)),
        "pages_shared_peak": int(max(shared)),
        "preemptions": int(samples[-1].get("dynrt_kv_preemptions_total", 0)),
        "batch_peak": int(max(m.get("dynrt_batch_size", 0) for m in samples)),
        "disconnected": sum(1 for r in results if r.get("disconnected")),
        "lost": lost,
        "differ": differ,
        "load": open("/proc/loadavg").read().split()[0],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--budget-mib", type=int, default=None)
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--page-size", type=int, default=None)
    ap.add_argument("--policy", default=None)
    ap.add_argument("--no-offload", action="store_true")
    ap.add_argument("--binary", default=os.path.join(REPO, "target", "release", "dynrt"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not os.path.isfile(args.binary):
        sys.exit(f"{args.binary} is missing: run `cargo build --release` first")
    cmd = [args.binary, "serve", "--port", "0", "--max-batch", str(args.max_batch)]
    if args.model:
        cmd += ["--model", args.model]
    if args.budget_mib is not None:
        cmd += ["--budget-mib", str(args.budget_mib)]
    if args.page_size is not None:
        cmd += ["--page-size", str(args.page_size)]
    if args.policy is not None:
        cmd += ["--policy", args.policy]
    if args.no_offload:
        cmd += ["--no-offload"]
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = server.stdout.readline()
        m = re.search(r"listening on (http://\S+)", line)
        if not m:
            sys.exit(f"the server did not start: {line!r}")
        base = m.group(1)
        global MODEL_ID
        with urllib.request.urlopen(base + "/v1/models", timeout=30) as r:
            MODEL_ID = json.loads(r.read())["data"][0]["id"]
        counts = [int(c) for c in args.clients.split(",")]
        references = {}
        for i in range(max(counts)):
            body, disconnect = request_body(i)
            if not disconnect and key(body) not in references:
                references[key(body)] = alone(base, body)
        rows = [run(base, n, references) for n in counts]
    finally:
        server.terminate()
        server.wait(timeout=30)
    failed = False
    for r in rows:
        if r["lost"] or r["differ"] or r["kv_reserved_peak_bytes"] > r["kv_budget_bytes"]:
            failed = True
    if args.json:
        for r in rows:
            print(json.dumps(r))
    else:
        print(
            "| clients | tokens/s | TTFT p50 / p99 (s) | TPOT p50 / p99 (ms) | peak device MiB "
            "| KV pages held at peak / pools MiB | KV unused at peak (without spares) "
            "| shared pages | offloads | offloaded peak MiB | preemptions | batch | disconnected "
            "| lost | differ | load |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        mib = 2**20
        for r in rows:
            print(
                f"| {r['clients']} | {r['tok_s']} | {r['ttft_p50_s']} / {r['ttft_p99_s']} "
                f"| {r['tpot_p50_ms']} / {r['tpot_p99_ms']} "
                f"| {r['device_peak_bytes'] / mib:.1f} "
                f"| {r['kv_reserved_peak_bytes'] / mib:.1f} / {r['kv_budget_bytes'] / mib:.1f} "
                f"| {r['kv_unused_at_peak']:.3f} ({r['kv_unwritten_at_peak']:.3f}) "
                f"| {r['pages_shared_peak']} | {r['offloads']} "
                f"| {r['offloaded_peak_bytes'] / mib:.2f} "
                f"| {r['preemptions']} | {r['batch_peak']} | {r['disconnected']} | {r['lost']} "
                f"| {r['differ']} | {r['load']} |"
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
