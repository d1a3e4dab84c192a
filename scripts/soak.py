#!/usr/bin/env python3
"""Soak test of `dynrt serve` (standard library only): thousands of mixed requests against
one server, then checks that it lasted.

Starts the server (`dynrt serve --port 0`, the address it prints) with a small queue, then
CLIENTS threads send requests for the given time, each drawing its next one from a seeded
random stream:

* chats and completions of random length (a few words to a few hundred), answers of 1 to
  MAX_TOKENS tokens, greedy or sampled, streamed or not;
* streams the client abandons after a few chunks, and requests it abandons before any
  answer (the server must cancel them and free their pages);
* invalid requests: broken JSON, an unknown role, `max_tokens` 0, a stop list over the
  limit, a `text/plain` body, an unknown path, a wrong method;
* `/tokenize`, `/detokenize`, `/apply-template`, `/metrics`, `/v1/memory`;
* now and then a burst of BURST requests at once, more than the queue holds (429s are the
  expected answer to some of them).

Checks (exit 1 when one fails): no 5xx answer but the server's by design: a 504
`request_timeout` (the server's `--request-timeout`, 120 s here, when the load outruns the
adapter) is counted apart; every stream that was read to its end ends with a finish chunk or
an error event (`request_timeout`, `shutting_down`) and then `data: [DONE]`; the server's resident memory and device bytes at rest after
the warm-up and at rest at the end differ by at most 5 %; at the end no KV page is held
(`/v1/memory`); SIGTERM then drains the server and it exits 0.

    cargo build --release
    python3 scripts/soak.py --model PATH [--minutes M] [--clients N] [--seed S] [--json]
        [--report FILE.md] [--binary PATH] [-- SERVE_ARGS...]

--json prints one object with every count and figure; --report writes them as Markdown.
Arguments after `--` go to `dynrt serve` as they are (for instance --budget-mib 16).
"""

import argparse
import http.client
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

WORDS = ("the a cat sat on mat of sea sky blue red green one two three four why how what "
         "when tell me about write short story poem count list name colour number "
         "please explain simply").split()


def words(rng, lo, hi):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


class Stats:
    """Counts shared by the client threads."""

    def __init__(self):
        self.lock = threading.Lock()
        self.kinds = {}
        self.statuses = {}
        self.failures = []
        self.streams_ended = 0
        self.streams_abandoned = 0
        self.timed_out = 0
        self.tokens = 0

    def count(self, kind, status):
        with self.lock:
            self.kinds[kind] = self.kinds.get(kind, 0) + 1
            self.statuses[str(status)] = self.statuses.get(str(status), 0) + 1

    def fail(self, what):
        with self.lock:
            if len(self.failures) < 50:
                self.failures.append(what)
            else:
                self.failures[-1] = f"... and more ({what})"


class Client:
    """One HTTP/1.1 exchange per request (a fresh connection each time)."""

    def __init__(self, host, port, timeout):
        self.host, self.port, self.timeout = host, port, timeout

    def conn(self, timeout=None):
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout or self.timeout)

    def call(self, method, path, body=None, content_type="application/json"):
        c = self.conn()
        try:
            headers = {}
            data = None
            if body is not None:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                headers["Content-Type"] = content_type
            c.request(method, path, body=data, headers=headers)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()


def check_stream(lines, stats, what):
    """The payloads of a stream read to its end: a finish chunk or an error, then [DONE]."""
    if not lines or lines[-1] != "[DONE]":
        stats.fail(f"{what}: the stream did not end with [DONE]: {lines[-3:]}")
        return
    if len(lines) < 2:
        stats.fail(f"{what}: [DONE] without a final event")
        return
    last = json.loads(lines[-2])
    if "error" in last:
        code = last["error"].get("code")
        if code == "request_timeout":
            with stats.lock:
                stats.timed_out += 1
        elif code != "shutting_down":
            stats.fail(f"{what}: the stream ended with an error: {last['error']}")
        return
    choices = last.get("choices") or []
    if not choices and "usage" in last and len(lines) >= 3:
        choices = json.loads(lines[-3]).get("choices") or []
    if not choices or not choices[0].get("finish_reason"):
        stats.fail(f"{what}: the last event has no finish_reason: {lines[-2][:200]}")
    with stats.lock:
        stats.streams_ended += 1
        stats.tokens += sum(1 for l in lines[:-1] if '"content"' in l or '"text"' in l)


def generation(rng, chat, stream, max_tokens):
    body = {"max_tokens": rng.randint(1, max_tokens), "stream": stream}
    if rng.random() < 0.5:
        body["temperature"] = 0
    else:
        body["temperature"] = 0.8
        body["seed"] = rng.randint(0, 1 << 30)
    if stream and rng.random() < 0.3:
        body["stream_options"] = {"include_usage": True}
    if chat:
        messages = [{"role": "user", "content": words(rng, 1, rng.choice([5, 20, 80]))}]
        if rng.random() < 0.4:
            messages.insert(0, {"role": "system", "content": "You answer briefly."})
        body["messages"] = messages
        return "/v1/chat/completions", body
    body["prompt"] = words(rng, 1, rng.choice([5, 20, 80]))
    return "/v1/completions", body


def timed_out(stats, status, data):
    """Whether an answer is the server's request timeout (by design, counted apart)."""
    if status == 504 and b"request_timeout" in data:
        with stats.lock:
            stats.timed_out += 1
        return True
    return False


def one(client, rng, stats, max_tokens, stop):
    """Sends one request of a random kind and checks its answer."""
    r = rng.random()
    if r < 0.30:
        path, body = generation(rng, rng.random() < 0.7, False, max_tokens)
        status, data = client.call("POST", path, body)
        stats.count("whole", status)
        if status == 200:
            v = json.loads(data)
            if v["choices"][0].get("finish_reason") not in ("stop", "length"):
                stats.fail(f"whole: finish_reason {v['choices'][0]}")
        elif status != 429 and not timed_out(stats, status, data):
            stats.fail(f"whole: {status} {data[:200]!r}")
    elif r < 0.55:
        path, body = generation(rng, rng.random() < 0.7, True, max_tokens)
        abandon = rng.random() < 0.2
        c = client.conn()
        try:
            c.request("POST", path, body=json.dumps(body).encode(),
                      headers={"Content-Type": "application/json"})
            resp = c.getresponse()
            stats.count("stream-abandoned" if abandon else "stream", resp.status)
            if resp.status != 200:
                data = resp.read()
                if resp.status != 429:
                    stats.fail(f"stream: {resp.status} {data[:200]!r}")
                return
            lines = []
            keep = rng.randint(1, 4)
            while True:
                line = resp.readline()
                if not line:
                    break
                line = line.decode().rstrip("\r\n")
                if line.startswith("data: "):
                    lines.append(line[6:])
                    if abandon and len(lines) >= keep:
                        with stats.lock:
                            stats.streams_abandoned += 1
                        return
                    if lines[-1] == "[DONE]":
                        break
            check_stream(lines, stats, path)
        finally:
            c.close()
    elif r < 0.60:
        # Gone before any answer: sent, then the connection closed.
        path, body = generation(rng, True, rng.random() < 0.5, max_tokens)
        c = client.conn(timeout=rng.uniform(0.01, 0.3))
        try:
            c.request("POST", path, body=json.dumps(body).encode(),
                      headers={"Content-Type": "application/json"})
            c.getresponse().read()
            stats.count("gone", 200)
        except (TimeoutError, OSError):
            stats.count("gone", "closed")
        finally:
            c.close()
    elif r < 0.72:
        case = rng.randrange(7)
        if case == 0:
            status, data = client.call("POST", "/v1/chat/completions", b"{not json")
            want = {400}
        elif case == 1:
            status, data = client.call("POST", "/v1/chat/completions", {
                "messages": [{"role": "user<|im_end|>", "content": "hi"}]})
            want = {400}
        elif case == 2:
            status, data = client.call("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 0})
            want = {400}
        elif case == 3:
            status, data = client.call("POST", "/v1/completions",
                                       {"prompt": "hi", "stop": [stop] * 4})
            want = {400}
        elif case == 4:
            status, data = client.call("POST", "/v1/completions", b'{"prompt": "hi"}',
                                       content_type="text/plain")
            want = {415}
        elif case == 5:
            status, data = client.call("GET", "/v1/nothing")
            want = {404}
        else:
            status, data = client.call("DELETE", "/v1/completions")
            want = {405}
        stats.count("invalid", status)
        if status not in want:
            stats.fail(f"invalid case {case}: {status} {data[:200]!r}")
        elif "error" not in json.loads(data):
            stats.fail(f"invalid case {case}: no error object: {data[:200]!r}")
    elif r < 0.82:
        case = rng.randrange(3)
        if case == 0:
            status, data = client.call("POST", "/tokenize", {"content": words(rng, 1, 200)})
        elif case == 1:
            status, data = client.call("POST", "/detokenize",
                                       {"tokens": [rng.randrange(200) for _ in range(20)]})
        else:
            status, data = client.call("POST", "/apply-template", {
                "messages": [{"role": "user", "content": words(rng, 1, 30)}]})
        stats.count("tokenizer", status)
        if status != 200:
            stats.fail(f"tokenizer case {case}: {status} {data[:200]!r}")
    else:
        path = rng.choice(["/metrics", "/v1/memory", "/health", "/v1/models"])
        status, data = client.call("GET", path)
        stats.count("read", status)
        if status != 200:
            stats.fail(f"GET {path}: {status}")


def burst(client, rng, stats, n, max_tokens):
    """n requests at once: more than the queue holds, so some are answered 429."""
    def go():
        path, body = generation(random.Random(rng.random()), True, False, max_tokens)
        try:
            status, data = client.call("POST", path, body)
        except OSError as e:
            stats.fail(f"burst: {e}")
            return
        stats.count("burst", status)
        if status not in (200, 429) and not timed_out(stats, status, data):
            stats.fail(f"burst: {status} {data[:200]!r}")
    threads = [threading.Thread(target=go) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def metric(client, name):
    status, data = client.call("GET", "/metrics")
    for line in data.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise RuntimeError(f"no metric {name}")


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def at_rest(client, deadline=300):
    """Waits until no request is active or queued."""
    t = time.time()
    while time.time() - t < deadline:
        if metric(client, "dynrt_active_sessions") == 0 and metric(client, "dynrt_queue_length") == 0:
            return True
        time.sleep(0.2)
    return False


def run_phase(client, seconds, args, stats, seed):
    stop = "x" * 2000
    end = time.time() + seconds

    def worker(k):
        rng = random.Random(seed * 1000 + k)
        while time.time() < end:
            try:
                if k == 0 and rng.random() < 0.05:
                    burst(client, rng, stats, args.burst, args.max_tokens)
                else:
                    one(client, rng, stats, args.max_tokens, stop)
            except (ConnectionError, http.client.HTTPException, TimeoutError, OSError) as e:
                stats.fail(f"client {k}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the GGUF to serve (a path or a model name)")
    ap.add_argument("--binary", default=os.path.join(REPO, "target", "release", "dynrt"))
    ap.add_argument("--minutes", type=float, default=3.0, help="length of the run (default 3)")
    ap.add_argument("--warmup", type=float, default=None,
                    help="seconds of warm-up before the first measurement (default: a fifth)")
    ap.add_argument("--clients", type=int, default=12)
    ap.add_argument("--burst", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--max-queue", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--report", help="write the figures as Markdown to this file")
    ap.add_argument("serve_args", nargs="*", help="more arguments of dynrt serve (after --)")
    args = ap.parse_args()
    if not os.path.isfile(args.binary):
        sys.exit(f"{args.binary} is missing: run `cargo build --release` first")
    duration = args.minutes * 60
    warmup = args.warmup if args.warmup is not None else duration / 5
    cmd = [args.binary, "serve", "--port", "0", "--model", args.model,
           "--max-queue", str(args.max_queue), "--request-timeout", "120"] + args.serve_args
    log = open(os.devnull, "w") if args.json else sys.stderr
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "warn")))
    # The server's stderr is read on (and kept in part) so that it never blocks on it.
    tail = []

    def drain_stderr():
        for line in server.stderr:
            tail.append(line.rstrip())
            del tail[:-40]
    threading.Thread(target=drain_stderr, daemon=True).start()
    stats = Stats()
    result = {"model": os.path.basename(args.model), "minutes": args.minutes,
              "clients": args.clients, "seed": args.seed}
    failed = []
    try:
        line = server.stdout.readline()
        if "listening on http://" not in line:
            sys.exit(f"the server did not start: {line!r}\n" + "\n".join(tail))
        host, port = line.strip().rsplit("http://", 1)[1].split(":")
        client = Client(host, int(port), timeout=300)
        t0 = time.time()
        print(f"soak: warm-up {warmup:.0f} s", file=log)
        run_phase(client, warmup, args, stats, args.seed)
        if not at_rest(client):
            failed.append("requests still active after the warm-up")
        rss_warm = rss_bytes(server.pid)
        device_warm = metric(client, "dynrt_device_bytes")
        print(f"soak: at rest after warm-up: RSS {rss_warm >> 20} MiB, device "
              f"{int(device_warm) >> 20} MiB; {duration - warmup:.0f} s more", file=log)
        run_phase(client, duration - warmup, args, stats, args.seed + 1)
        if not at_rest(client):
            failed.append("requests still active at the end")
        rss_end = rss_bytes(server.pid)
        device_end = metric(client, "dynrt_device_bytes")
        status, data = client.call("GET", "/v1/memory")
        mem = json.loads(data)
        sched = mem["scheduler"]
        result.update({
            "seconds": round(time.time() - t0, 1),
            "requests": sum(stats.kinds.values()),
            "kinds": stats.kinds,
            "statuses": stats.statuses,
            "streams_ended": stats.streams_ended,
            "streams_abandoned": stats.streams_abandoned,
            "timed_out": stats.timed_out,
            "scheduler": {k: sched[k] for k in ("submitted", "finished", "cancelled", "failed",
                                                "refused", "tokens_generated_total",
                                                "prompt_tokens_total", "pages_used",
                                                "kv_reserved_bytes", "preemptions", "offloads")},
            "rss_warm_bytes": rss_warm, "rss_end_bytes": rss_end,
            "rss_growth": round(rss_end / rss_warm - 1, 4),
            "device_warm_bytes": int(device_warm), "device_end_bytes": int(device_end),
            "device_growth": round(device_end / device_warm - 1, 4) if device_warm else 0.0,
        })
        fives = {s: n for s, n in stats.statuses.items() if s.startswith("5") and s != "504"}
        if stats.statuses.get("504", 0) > stats.timed_out:
            fives["504"] = stats.statuses["504"]
        if fives:
            failed.append(f"5xx answers: {fives}")
        if stats.failures:
            failed.append(f"{len(stats.failures)} checks failed: " + "; ".join(stats.failures[:10]))
        if abs(result["rss_growth"]) > 0.05:
            failed.append(f"RSS changed by {result['rss_growth']:.1%} (at rest, warm-up to end)")
        if abs(result["device_growth"]) > 0.05:
            failed.append(f"device bytes changed by {result['device_growth']:.1%}")
        if sched["pages_used"] != 0 or sched["kv_reserved_bytes"] != 0 or mem["requests"]:
            failed.append(f"pages held at the end: {sched['pages_used']}, {mem['requests']}")
        if sched["failed"]:
            failed.append(f"{sched['failed']} requests failed in the scheduler")
        # The drain: SIGTERM at rest exits 0 at once.
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=120)
        result["exit_code"] = code
        if code != 0:
            failed.append(f"SIGTERM: exit code {code}")
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    result["failed"] = failed
    if args.json:
        print(json.dumps(result))
    else:
        print(json.dumps(result, indent=1))
    if args.report:
        write_report(args.report, result, cmd)
    if failed:
        print("soak FAILED:\n  " + "\n  ".join(failed), file=sys.stderr)
        print("server stderr (last lines):\n" + "\n".join(tail), file=sys.stderr)
        sys.exit(1)


def write_report(path, r, cmd):
    mib = lambda b: f"{b / (1 << 20):.1f} MiB"
    lines = [
        f"`{' '.join(os.path.basename(c) if i == 0 else c for i, c in enumerate(cmd))}`, "
        f"{r['clients']} clients, seed {r['seed']}, {r['seconds']} s:",
        "",
        "| requests | streams read to the end | streams abandoned | past the request timeout | statuses | RSS at rest after warm-up / end | device bytes after warm-up / end | pages held at the end |",
        "|---:|---:|---:|---:|---|---|---|---:|",
        f"| {r['requests']} | {r['streams_ended']} | {r['streams_abandoned']} | {r['timed_out']} | "
        + ", ".join(f"{k}: {v}" for k, v in sorted(r["statuses"].items()))
        + f" | {mib(r['rss_warm_bytes'])} / {mib(r['rss_end_bytes'])} ({r['rss_growth']:+.1%}) | "
        f"{mib(r['device_warm_bytes'])} / {mib(r['device_end_bytes'])} ({r['device_growth']:+.1%}) | "
        f"{r['scheduler']['pages_used']} |",
        "",
        "Requests by kind: " + ", ".join(f"{k} {v}" for k, v in sorted(r["kinds"].items()))
        + ". Scheduler: " + ", ".join(f"{k} {v}" for k, v in r["scheduler"].items()) + ".",
        "",
        "Failed checks: " + ("; ".join(r["failed"]) if r["failed"] else "none") + ".",
    ]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
