#!/usr/bin/env python3
"""Drives a running `dynrt serve` with the `openai` Python package, as a real client would:
the models list, a streamed chat with its usage (cached prompt tokens included), the same chat
whole (greedy: the two texts must be equal), any model name accepted, a streamed completion,
log-probabilities on both endpoints, two answers at once (`n`), JSON-schema output validated
with the `jsonschema` package, an unsupported field refused with a 400 that names it, and with
`--tool-call` a tool call and its round trip (the model must offer tools: Qwen2.5).

    dynrt serve --port 8080 &
    python3 scripts/serve_check.py --base-url http://127.0.0.1:8080/v1 [--tool-call]

Exits 1 with the reason when a check fails. tests/cli/serve.rs runs it against a server it
starts (with the venv of scripts/pyenv.sh, which has both packages).
"""

import argparse
import json
import math
import sys
import time

import jsonschema
import openai

CITY_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 30},
        "country": {"type": "string", "maxLength": 30},
        "population_millions": {"type": "number"},
        "is_capital": {"type": "boolean"},
    },
    "required": ["city", "country", "is_capital"],
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city"}},
            "required": ["city"],
        },
    },
}


class Failed(Exception):
    pass


def check(ok, what):
    if not ok:
        raise Failed(what)


def chat_checks(client, model, args):
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
    total = time.perf_counter() - t0
    streamed = "".join(pieces)
    check(usage is not None, "the stream sent no usage chunk")
    check(
        usage.prompt_tokens_details is not None
        and isinstance(usage.prompt_tokens_details.cached_tokens, int),
        f"usage has no prompt_tokens_details.cached_tokens: {usage}",
    )
    print(
        f"streamed {streamed!r}: {usage.completion_tokens} tokens, first after "
        f"{first or 0:.2f} s, {usage.completion_tokens / total:.1f} tokens/s"
    )

    whole = client.chat.completions.create(
        model="any-name-at-all", messages=messages, max_tokens=args.max_tokens, temperature=0
    )
    text = whole.choices[0].message.content
    check(text == streamed, f"whole {text!r} != streamed {streamed!r}")
    check(whole.model == model, f"the response names {whole.model!r}, not {model!r}")
    cached = whole.usage.prompt_tokens_details.cached_tokens
    check(cached > 0, f"the same chat again read no cached prompt tokens: {whole.usage}")
    print(f"whole answer equals the streamed one; {cached} prompt tokens came from the cache")

    lp = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = lp.choices[0].logprobs.content
    check(len(content) >= 1, f"no log-probabilities: {lp}")
    for entry in content:
        check(len(entry.top_logprobs) == 3, f"top_logprobs has {len(entry.top_logprobs)}")
        best = entry.top_logprobs[0]
        # Greedy: the chosen token is the most likely one.
        check(
            best.token == entry.token and math.isclose(best.logprob, entry.logprob),
            f"greedy chose {entry.token!r} ({entry.logprob}) over {best.token!r} ({best.logprob})",
        )
        check(entry.logprob <= 0, f"a log-probability above 0: {entry.logprob}")
        check(bytes(entry.bytes).decode("utf-8", "replace") == entry.token, "bytes and token differ")
    print(f"chat log-probabilities: {[(e.token, round(e.logprob, 3)) for e in content]}")

    two = client.chat.completions.create(
        model=model, messages=messages, max_tokens=6, temperature=1.0, seed=7, n=2
    )
    check(len(two.choices) == 2, f"n=2 gave {len(two.choices)} answers")
    check([c.index for c in two.choices] == [0, 1], "answers not indexed 0 and 1")
    again = client.chat.completions.create(
        model=model, messages=messages, max_tokens=6, temperature=1.0, seed=7, n=2
    )
    check(
        [c.message.content for c in two.choices] == [c.message.content for c in again.choices],
        "the same seed gave other answers",
    )
    print(f"n=2 with a seed: {[c.message.content for c in two.choices]}, repeatable")

    structured = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Describe Paris as JSON."}],
        max_tokens=80,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "city", "schema": CITY_SCHEMA, "strict": True},
        },
    )
    answer = structured.choices[0].message.content
    check(structured.choices[0].finish_reason == "stop", f"the JSON did not end: {answer!r}")
    value = json.loads(answer)
    jsonschema.validate(value, CITY_SCHEMA)
    print(f"json_schema answer validates: {answer!r}")

    try:
        client.chat.completions.create(
            model=model, messages=messages, max_tokens=4, extra_body={"mirostat": 2}
        )
        raise Failed("an unsupported field was accepted")
    except openai.BadRequestError as e:
        check(e.body.get("param") == "mirostat", f"the 400 does not name the field: {e.body}")
        print(f"unsupported field refused: {e.status_code} {e.body['message']}")


def completion_checks(client, model):
    pieces = []
    for chunk in client.completions.create(
        model=model, prompt="The quick brown fox", max_tokens=8, temperature=0, stream=True
    ):
        pieces.extend(c.text for c in chunk.choices)
    print(f"completion: {''.join(pieces)!r}")
    lp = client.completions.create(
        model=model, prompt="The quick brown fox", max_tokens=4, temperature=0, logprobs=2
    )
    logprobs = lp.choices[0].logprobs
    check(len(logprobs.tokens) == lp.usage.completion_tokens, f"{logprobs}")
    check(all(len(t) == 2 for t in logprobs.top_logprobs), f"{logprobs.top_logprobs}")
    check("".join(logprobs.tokens) == lp.choices[0].text, "the tokens do not make the text")
    print(f"completion log-probabilities: {list(zip(logprobs.tokens, logprobs.token_logprobs))}")


def tool_checks(client, model):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    call = client.chat.completions.create(
        model=model,
        messages=messages,
        tools=[WEATHER_TOOL],
        tool_choice="required",
        max_tokens=40,
        temperature=0,
    )
    choice = call.choices[0]
    check(choice.finish_reason == "tool_calls", f"finish_reason {choice.finish_reason}")
    calls = choice.message.tool_calls
    check(calls and calls[0].function.name == "get_weather", f"no get_weather call: {choice}")
    arguments = json.loads(calls[0].function.arguments)
    jsonschema.validate(arguments, WEATHER_TOOL["function"]["parameters"])
    print(f"tool call: get_weather({arguments})")
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append(
        {
            "role": "tool",
            "tool_call_id": calls[0].id,
            "content": json.dumps({"city": arguments["city"], "sky": "sunny", "celsius": 21}),
        }
    )
    final = client.chat.completions.create(
        model=model,
        messages=messages,
        tools=[WEATHER_TOOL],
        tool_choice="none",
        max_tokens=30,
        temperature=0,
    )
    text = final.choices[0].message.content
    check(text, f"no answer after the tool's result: {final}")
    print(f"answer after the tool's result: {text!r}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--question", default="What is the capital of France?")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--tool-call", action="store_true", help="only the tool call checks")
    args = ap.parse_args()
    # The server checks no key here; the package insists on one.
    client = openai.OpenAI(base_url=args.base_url, api_key="none", timeout=600, max_retries=0)

    models = client.models.list().data
    if not models:
        print("FAIL: /v1/models is empty", file=sys.stderr)
        return 1
    model = models[0].id
    print(f"model: {model}")
    try:
        if args.tool_call:
            tool_checks(client, model)
        else:
            chat_checks(client, model, args)
            completion_checks(client, model)
    except (Failed, jsonschema.ValidationError, json.JSONDecodeError) as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
