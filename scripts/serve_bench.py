#!/usr/bin/env python3
"""Side by side with llama-server: the same streamed greedy chat requests against either
server, over plain HTTP (standard library only; no network beyond 127.0.0.1).

For each number of concurrent clients N (default 1, 4, 16), every client sends
`--requests` chats one after another (fixed prompts from a list, `temperature` 0,
`max_tokens` fixed), streamed; then one client holds a 10-turn chat (each turn's answer and
a new question appended to the history). Reported per N: requests per second and output
tokens per second over the wall time, time to first token and inter-token latency (p50 and
p99, from the client: the arrival of the first content chunk, and the gaps between content
chunks), tokens per request; and for the chat, each turn's time to first token.

With `--behind-long N`, one more measurement: a short chat (at most 1 token) sent while
the server reads a prompt of N words (a completion of 1 token sent just before): the
seconds until each answers. First come, first served, the short chat waits for the whole
long prompt; with the prompt rows of a step shared, it is answered within a few steps.

The server is started by the script (a free port, `--binary`, `--model`) and stopped at the
end, or an already running one is used (`--url`). A warm-up request runs first (dynrt
compiles its batched pipelines at the first request).

    # dynrt (on the adapter it picks)
    python3 scripts/serve_bench.py --server dynrt --binary target/release/dynrt \\
        --model SmolLM2-135M-Instruct.Q4_1.gguf --clients 1,4,16
    # llama-server (scripts/bench_llamacpp.sh --server builds it), CPU with 2 threads
    python3 scripts/serve_bench.py --server llama-server \\
        --binary target/llama.cpp/build-cpu/bin/llama-server --model ... --threads 2
    # both, one after the other, as one table
    python3 scripts/serve_bench.py --server dynrt,llama-server --binary target/release/dynrt \\
        --llama-binary target/llama.cpp/build-cpu/bin/llama-server --model ... [--json]

llama-server gets `-np` = the most clients (`--parallel`) and `-c` = that many times
`--ctx-per-slot` (default 2048), continuous batching on; `--llama-args` adds more (for
example `-ngl 99` on a GPU build). dynrt gets `--max-batch` = the most clients;
`--dynrt-args` adds more.
"""

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

PROMPTS = [
    "What is the capital of France?",
    "Name three primary colours and say one thing about each.",
    "Why is the sky blue? Answer in two sentences.",
    "Write a haiku about the sea.",
    "What does a compiler do?",
    "Explain what a hash table is and when it is slow.",
    "Give me three tips for learning a new language.",
    "What is the difference between weather and climate?",
]
TURNS = [
    "Hello! Can you help me plan a small garden?",
    "I have about four square metres of space. What should I grow?",
    "Which of those need the most sun?",
    "How often should I water the tomatoes?",
    "What about the herbs?",
    "Can I grow them in pots instead?",
    "What soil should I buy?",
    "How do I keep snails away?",
    "When should I harvest the lettuce?",
    "Thanks! Can you summarise the plan in three lines?",
]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def pct(values, p):
    if not values:
        return None
    v = sorted(values)
    k = max(0, min(len(v) - 1, round(p / 100 * (len(v) - 1))))
    return v[k]


def stream_chat(host, port, messages, max_tokens, model):
    """One streamed chat: (ttft_s, [gap_s], tokens, text, total_s)."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    c = http.client.HTTPConnection(host, port, timeout=3600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"{r.status}: {r.read()[:300]!r}")
    ttft, last, gaps, chunks, usage, text = None, None, [], 0, None, []
    while True:
        line = r.readline()
        if not line:
            break
        line = line.decode().strip()
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            break
        v = json.loads(data)
        if v.get("usage"):
            usage = v["usage"]
        for ch in v.get("choices") or []:
            piece = (ch.get("delta") or {}).get("content")
            if piece:
                now = time.perf_counter()
                if ttft is None:
                    ttft = now - t0
                else:
                    gaps.append(now - last)
                last = now
                chunks += 1
                text.append(piece)
    total = time.perf_counter() - t0
    c.close()
    tokens = usage["completion_tokens"] if usage else chunks
    return ttft if ttft is not None else total, gaps, tokens, "".join(text), total


def run_clients(host, port, n, requests, max_tokens, model):
    results, errors = [], []
    lock = threading.Lock()

    def client(k):
        for i in range(requests):
            prompt = PROMPTS[(k * requests + i) % len(PROMPTS)]
            try:
                r = stream_chat(host, port, [{"role": "user", "content": prompt}], max_tokens, model)
            except Exception as e:  # a failed request is reported, not retried
                with lock:
                    errors.append(str(e))
                continue
            with lock:
                results.append(r)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ttfts = [r[0] for r in results]
    gaps = [g for r in results for g in r[1]]
    tokens = sum(r[2] for r in results)
    return {
        "clients": n,
        "requests": len(results),
        "errors": len(errors),
        "wall_s": round(wall, 2),
        "requests_per_s": round(len(results) / wall, 3),
        "output_tok_per_s": round(tokens / wall, 2),
        "tokens_per_request": round(tokens / max(1, len(results)), 1),
        "ttft_p50_ms": round(1e3 * pct(ttfts, 50), 1) if ttfts else None,
        "ttft_p99_ms": round(1e3 * pct(ttfts, 99), 1) if ttfts else None,
        "itl_p50_ms": round(1e3 * pct(gaps, 50), 1) if gaps else None,
        "itl_p99_ms": round(1e3 * pct(gaps, 99), 1) if gaps else None,
        "first_error": errors[0] if errors else None,
    }


def run_chat(host, port, max_tokens, model):
    messages, turns = [], []
    for q in TURNS:
        messages.append({"role": "user", "content": q})
        ttft, _, tokens, text, total = stream_chat(host, port, messages, max_tokens, model)
        messages.append({"role": "assistant", "content": text})
        turns.append({"ttft_ms": round(ttft * 1e3, 1), "tokens": tokens,
                      "seconds": round(total, 2)})
    return turns


def behind_long(host, port, words, model):
    """A 1-token chat sent 0.5 s after a completion whose prompt has `words` words: the
    seconds each took from its own start."""
    out = {}

    def long():
        t0 = time.perf_counter()
        c = http.client.HTTPConnection(host, port, timeout=3600)
        body = {"model": model, "prompt": "word " * words, "max_tokens": 1, "temperature": 0}
        c.request("POST", "/v1/completions", body=json.dumps(body).encode(),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        r.read()
        out["long_status"] = r.status
        out["long_s"] = round(time.perf_counter() - t0, 2)

    t = threading.Thread(target=long)
    t.start()
    time.sleep(0.5)
    ttft, _, _, _, total = stream_chat(host, port, [{"role": "user", "content": "Hi!"}], 1, model)
    out["short_s"] = round(total, 2)
    t.join()
    return out


def start(kind, binary, model, port, most, args):
    if kind == "dynrt":
        cmd = [binary, "serve", "--port", str(port), "--model", model, "--max-batch", str(most)]
        cmd += args.dynrt_args.split()
    else:
        cmd = [binary, "-m", model, "--host", "127.0.0.1", "--port", str(port),
               "-t", str(args.threads), "-np", str(most), "-c", str(most * args.ctx_per_slot),
               "--cont-batching", "--no-webui"]
        cmd += args.llama_args.split()
    log = open(os.path.join(args.log_dir, f"{kind}.log"), "w") if args.log_dir else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, stdout=log, stderr=log)
    deadline = time.time() + args.start_timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{kind} exited with {proc.returncode} before it was ready: {' '.join(cmd)}")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return proc, cmd
        except OSError:
            pass
        time.sleep(0.2)
    proc.kill()
    sys.exit(f"{kind} was not ready within {args.start_timeout} s")


def served_model(host, port):
    c = http.client.HTTPConnection(host, port, timeout=30)
    c.request("GET", "/v1/models")
    data = json.loads(c.getresponse().read())
    return data["data"][0]["id"]


def load1():
    try:
        return float(open("/proc/loadavg").read().split()[0])
    except OSError:
        return None


def bench(kind, binary, args, counts):
    proc = None
    if args.url:
        host, port = args.url.replace("http://", "").rstrip("/").split(":")
        port = int(port)
        cmd = None
    else:
        host, port = "127.0.0.1", free_port()
        # The long prompt and the short chat must be able to run together.
        most = max(counts + ([2] if args.behind_long else []))
        proc, cmd = start(kind, binary, args.model, port, most, args)
    try:
        model = served_model(host, port)
        stream_chat(host, port, [{"role": "user", "content": "Hi"}], 4, model)  # warm-up
        rows = []
        for n in counts:
            l0 = load1()
            row = run_clients(host, port, n, args.requests, args.max_tokens, model)
            row.update({"server": kind, "load": [l0, load1()]})
            rows.append(row)
            print(f"[serve_bench] {kind} {n} clients: {row}", file=sys.stderr)
        chat = run_chat(host, port, args.chat_tokens, model) if args.chat_turns else []
        if args.behind_long:
            hol = behind_long(host, port, args.behind_long, model)
            hol["server"] = kind
            print(f"[serve_bench] {kind} behind a long prompt: {hol}", file=sys.stderr)
            chat = {"turns": chat, "behind_long": hol}
    finally:
        if proc:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    return rows, chat, cmd


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", default="dynrt", help="dynrt, llama-server, or both comma-separated")
    ap.add_argument("--binary", help="the server binary (dynrt's with --server dynrt,llama-server)")
    ap.add_argument("--llama-binary", help="llama-server's binary when both run")
    ap.add_argument("--model", help="the GGUF both serve")
    ap.add_argument("--url", help="an already running server (one --server only)")
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--requests", type=int, default=4, help="requests per client (default 4)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--chat-turns", type=int, default=1, help="0: no 10-turn chat")
    ap.add_argument("--chat-tokens", type=int, default=32)
    ap.add_argument("--behind-long", type=int, default=0,
                    help="also time a short chat behind a prompt of this many words")
    ap.add_argument("--threads", type=int, default=2, help="llama-server's -t")
    ap.add_argument("--ctx-per-slot", type=int, default=2048)
    ap.add_argument("--llama-args", default="")
    ap.add_argument("--dynrt-args", default="")
    ap.add_argument("--start-timeout", type=float, default=600)
    ap.add_argument("--log-dir", help="keep each server's output here")
    ap.add_argument("--json", action="store_true", help="one JSON object per row on stdout")
    args = ap.parse_args()
    kinds = args.server.split(",")
    counts = [int(c) for c in args.clients.split(",")]
    if args.url and len(kinds) != 1:
        sys.exit("--url drives one server")
    all_rows, chats, cmds = [], {}, {}
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for kind in kinds:
        binary = args.binary if kind == "dynrt" or len(kinds) == 1 else args.llama_binary
        if not args.url and (not binary or not os.path.isfile(binary) or not args.model):
            sys.exit(f"{kind}: give --model and the binary (--binary / --llama-binary)")
        rows, chat, cmd = bench(kind, binary, args, counts)
        all_rows += rows
        chats[kind] = chat
        cmds[kind] = cmd
    if args.json:
        for r in all_rows:
            print(json.dumps(r))
        for kind, chat in chats.items():
            print(json.dumps({"server": kind, "chat": chat}))
        return
    print(f"{date}; {args.requests} streamed greedy chats of at most {args.max_tokens} tokens "
          f"per client; times from the client.\n")
    print("| server | clients | requests/s | output tok/s | tokens/request | TTFT p50 / p99 ms "
          "| inter-token p50 / p99 ms | errors | load 1 min (start / end) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in all_rows:
        print(f"| {r['server']} | {r['clients']} | {r['requests_per_s']} | {r['output_tok_per_s']} "
              f"| {r['tokens_per_request']} | {r['ttft_p50_ms']} / {r['ttft_p99_ms']} "
              f"| {r['itl_p50_ms']} / {r['itl_p99_ms']} | {r['errors']} "
              f"| {r['load'][0]} / {r['load'][1]} |")
    turns = {k: (c["turns"] if isinstance(c, dict) else c) for k, c in chats.items()}
    if any(turns.values()):
        print("\nTime to first token of each turn of a 10-turn chat (ms; at most "
              f"{args.chat_tokens} tokens per answer):\n")
        print("| server | " + " | ".join(f"turn {i + 1}" for i in range(len(TURNS))) + " |")
        print("|---|" + "---:|" * len(TURNS))
        for kind, chat in turns.items():
            if chat:
                print(f"| {kind} | " + " | ".join(str(t["ttft_ms"]) for t in chat) + " |")
    hols = [c["behind_long"] for c in chats.values() if isinstance(c, dict)]
    if hols:
        print(f"\nA 1-token chat sent 0.5 s after a completion of a {args.behind_long}-word "
              "prompt (seconds from each one's start to its answer):\n")
        print("| server | short chat s | long prompt s |")
        print("|---|---:|---:|")
        for h in hols:
            print(f"| {h['server']} | {h['short_s']} | {h['long_s']} |")
    for kind, cmd in cmds.items():
        if cmd:
            print(f"\n{kind}: `{' '.join(os.path.basename(c) if i == 0 else c for i, c in enumerate(cmd))}`")


if __name__ == "__main__":
    main()
