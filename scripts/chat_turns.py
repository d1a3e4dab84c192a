#!/usr/bin/env python3
"""A 10-turn chat against `dynrt serve`, with the prompt cache and without it: time to first
token per turn (standard library only).

Starts the server (`dynrt serve --port 0`) unless --base-url names a running one. Each turn
sends the whole conversation so far plus a new user message (streamed, greedy, answers of
--answer-tokens), as a chat client does. The conversation is run twice with the same
messages: first with the cache (the default), then with `cache_prompt: false` (every turn
prefills its whole history). Per turn: prompt tokens, prompt tokens read from the cache
(`usage.prompt_tokens_details.cached_tokens`), and the time from sending to the first text
chunk. Prints a Markdown table (or JSON with --json) and the ratio of turn 10's time to first
token to turn 1's for both runs.

    cargo build --release
    python3 scripts/chat_turns.py [--model NAME|PATH] [--base-url URL] [--turns 10]
        [--answer-tokens 48] [--json]
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

SYSTEM = (
    "You are a patient tutor. Explain things step by step, with one short example each time, "
    "and end every answer with a question that checks the student understood."
)
TOPICS = [
    "what a variable is in programming",
    "how a loop works",
    "what a function is and why we use them",
    "what recursion means",
    "how a list differs from a dictionary",
    "what a hash table does",
    "what a compiler does",
    "how memory is allocated on the stack and the heap",
    "what a pointer is",
    "what a thread is and why two threads can race",
    "how a cache speeds things up",
    "what an operating system schedules",
]


def stream_turn(base, messages, answer_tokens, cache):
    body = {
        "messages": messages,
        "max_tokens": answer_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if not cache:
        body["cache_prompt"] = False
    req = urllib.request.Request(
        base + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    t0 = time.perf_counter()
    first = None
    text = []
    usage = None
    with urllib.request.urlopen(req, timeout=1800) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            v = json.loads(data)
            if v.get("usage"):
                usage = v["usage"]
            for c in v.get("choices", []):
                piece = c.get("delta", {}).get("content")
                if piece:
                    if first is None:
                        first = time.perf_counter() - t0
                    text.append(piece)
    return "".join(text), first, usage


def run(base, turns, answer_tokens, cache, answers=None):
    messages = [{"role": "system", "content": SYSTEM}]
    rows = []
    for t in range(turns):
        messages.append({"role": "user", "content": f"Please explain {TOPICS[t % len(TOPICS)]}."})
        text, ttft, usage = stream_turn(base, messages, answer_tokens, cache)
        if answers is not None:
            # The same conversation as the first run: its answers, not this run's.
            text = answers[t]
        messages.append({"role": "assistant", "content": text})
        rows.append(
            {
                "turn": t + 1,
                "prompt_tokens": usage["prompt_tokens"],
                "cached_tokens": usage.get("prompt_tokens_details", {}).get("cached_tokens", 0),
                "ttft_s": ttft,
                "answer": text,
            }
        )
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--base-url", default=None, help="a running server (http://HOST:PORT)")
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--answer-tokens", type=int, default=48)
    ap.add_argument("--binary", default=os.path.join(REPO, "target", "release", "dynrt"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    server = None
    base = args.base_url
    if base is None:
        if not os.path.isfile(args.binary):
            sys.exit(f"{args.binary} is missing: run `cargo build --release` first")
        cmd = [args.binary, "serve", "--port", "0"]
        if args.model:
            cmd += ["--model", args.model]
        server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        if server is not None:
            line = server.stdout.readline()
            m = re.search(r"listening on (http://\S+)", line)
            if not m:
                sys.exit(f"the server did not start: {line!r}")
            base = m.group(1)
        # One request first: the pools are allocated and the kernels compiled before timing.
        stream_turn(base, [{"role": "user", "content": "Hello"}], 4, False)
        cached = run(base, args.turns, args.answer_tokens, True)
        uncached = run(
            base, args.turns, args.answer_tokens, False, [r["answer"] for r in cached]
        )
    finally:
        if server is not None:
            server.terminate()
            server.wait()
    ratio = lambda rows: rows[-1]["ttft_s"] / rows[0]["ttft_s"]
    if args.json:
        print(json.dumps({"cache": cached, "no_cache": uncached,
                          "ratio_cache": ratio(cached), "ratio_no_cache": ratio(uncached)}))
        return
    print("| turn | prompt tokens | cached | TTFT with cache (s) | TTFT without (s) |")
    print("|---:|---:|---:|---:|---:|")
    for a, b in zip(cached, uncached):
        print(
            f"| {a['turn']} | {a['prompt_tokens']} | {a['cached_tokens']} | "
            f"{a['ttft_s']:.3f} | {b['ttft_s']:.3f} |"
        )
    print(
        f"\nturn {args.turns} / turn 1 time to first token: {ratio(cached):.2f}x with the cache, "
        f"{ratio(uncached):.2f}x without"
    )


if __name__ == "__main__":
    main()
