#!/usr/bin/env python3
"""Drives `POST /v1/embeddings` of a running `dynrt serve --embedding-model ...` with the
`openai` Python package, as an application would, and writes what it got as JSON:

  embed_check.py --base-url http://127.0.0.1:PORT/v1 --model NAME --input IN.json --out OUT.json

IN.json is {"texts": [...]}. OUT.json holds {"float": [[...]], "base64": [[...]],
"prompt_tokens": N, "single": [...], "errors": {...}}: the vectors of the list requested as
floats and as base64 (decoded here), the usage it reported, one string alone (the client
asks for base64 by default and decodes it itself), and the error status of an unknown
model.
"""

import argparse
import base64
import json

import numpy as np
import openai


def floats(embedding):
    """A vector as the client gives it: floats, or base64 of little-endian f32 when asked."""
    if isinstance(embedding, str):
        return np.frombuffer(base64.b64decode(embedding), dtype="<f4").astype(float).tolist()
    return list(embedding)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with open(args.input, encoding="utf-8") as f:
        texts = json.load(f)["texts"]
    client = openai.OpenAI(base_url=args.base_url, api_key="none")
    as_float = client.embeddings.create(model=args.model, input=texts, encoding_format="float")
    as_b64 = client.embeddings.create(model=args.model, input=texts, encoding_format="base64")
    single = client.embeddings.create(model=args.model, input=texts[0])
    errors = {}
    try:
        client.embeddings.create(model="no-such-model", input="x")
    except openai.NotFoundError as e:
        errors["unknown_model"] = e.status_code
    out = {
        "float": [d.embedding for d in sorted(as_float.data, key=lambda d: d.index)],
        "base64": [floats(d.embedding) for d in sorted(as_b64.data, key=lambda d: d.index)],
        "prompt_tokens": as_float.usage.prompt_tokens,
        "total_tokens": as_float.usage.total_tokens,
        "model": as_float.model,
        "single": floats(single.data[0].embedding),
        "errors": errors,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
