#!/usr/bin/env python3
"""Drives a running `dynrt serve` with the `openai` Python package (pip install openai),
as a real client would: the models list, a streamed chat, the same chat whole (greedy: the
two texts must be equal), a streamed completion, and an API error for an unknown model.

    dynrt serve --port 8080 &
    python3 scripts/serve_check.py --base-url http://127.0.0.1:8080/v1

Exits 1 with the reason when a check fails. Not run in CI (it needs the package and a
server); the Rust tests in tests/cli/serve.rs drive the same endpoints over HTTP.
"""

import argparse
import sys
import time

import openai


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--question", default="What is the capital of France?")
    ap.add_argument("--max-tokens", type=int, default=24)
    args = ap.parse_args()
    # The server checks no key; the package insists on one.
    client = openai.OpenAI(base_url=args.base_url, api_key="none")

    models = client.models.list().data
    if not models:
        print("FAIL: /v1/models is empty", file=sys.stderr)
        return 1
    model = models[0].id
    print(f"model: {model}")

    messages = [{"role": "user", "content": args.question}]
    t0 = time.perf_counter()
    first = None
    pieces = []
    usage = None
    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=args.max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                if first is None:
                    first = time.perf_counter() - t0
                pieces.append(choice.delta.content)
                print(choice.delta.content, end="", flush=True)
    total = time.perf_counter() - t0
    streamed = "".join(pieces)
    print()
    if usage is None:
        print("FAIL: the stream sent no usage chunk", file=sys.stderr)
        return 1
    print(
        f"streamed: {usage.completion_tokens} tokens, first after {first or 0:.2f} s, "
        f"{usage.completion_tokens / total:.1f} tokens/s"
    )

    whole = client.chat.completions.create(
        model=model, messages=messages, max_tokens=args.max_tokens, temperature=0
    )
    text = whole.choices[0].message.content
    if text != streamed:
        print(f"FAIL: whole {text!r} != streamed {streamed!r}", file=sys.stderr)
        return 1
    print(f"whole answer equals the streamed one ({whole.usage.total_tokens} tokens in all)")

    pieces = []
    for chunk in client.completions.create(
        model=model, prompt="The quick brown fox", max_tokens=8, temperature=0, stream=True
    ):
        pieces.extend(c.text for c in chunk.choices)
    print(f"completion: {''.join(pieces)!r}")

    try:
        client.chat.completions.create(model="no-such-model", messages=messages)
        print("FAIL: an unknown model was accepted", file=sys.stderr)
        return 1
    except openai.NotFoundError as e:
        print(f"unknown model refused: {e.status_code} {e.body['message']}")
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
