#!/usr/bin/env python3
"""Greedy decoding of an exported ONNX decoder with onnxruntime on the CPU: the reference
that dynrt's ONNX path is compared with.

    "$(scripts/pyenv.sh)" scripts/onnx_ref.py MODEL.onnx --tokens 1,9690,42 [--steps 32]
        [--out ref.json] [--logits ref_logits.npy] [--stop-at ID]

The model is any decoder with optimum's interface (what scripts/export_smollm2_onnx.py
writes): `input_ids` int64 [batch, seq], optionally `position_ids` int64 [batch, seq] and
`attention_mask` int64 [batch, total], `past_key_values.{l}.key/value` [batch, heads, past,
head_dim] in, `logits` and `present.{l}.key/value` out. Batch 1. The first run feeds the whole
prompt with empty (zero-length) past; each later run feeds the previous argmax token and the
presents as the next pasts. `--steps` tokens are generated (fewer with `--stop-at`).

`--out` gets JSON {"model", "prompt", "tokens", "steps", "provider"}; `--logits` gets the
last position's logits of every run as an f32 .npy of shape [runs, vocab] (the prompt run
first). Without `--out` the JSON goes to stdout.
"""
import argparse
import json
import sys

import numpy as np
import onnxruntime as ort

NP_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--tokens", required=True, help="prompt token ids, comma-separated")
    ap.add_argument("--steps", type=int, default=32, help="tokens to generate (default 32)")
    ap.add_argument("--out", help="JSON output file (default: stdout)")
    ap.add_argument("--logits", help=".npy file for the logits of every run")
    ap.add_argument("--stop-at", type=int, default=None, help="stop after generating this token id")
    args = ap.parse_args()

    prompt = [int(t) for t in args.tokens.split(",") if t.strip()]
    if not prompt:
        sys.exit("--tokens is empty")
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(args.model, opts, providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in sess.get_inputs()}
    if "input_ids" not in inputs:
        sys.exit("the model has no `input_ids` input")
    past_names = sorted(
        (n for n in inputs if n.startswith("past_key_values.")),
        key=lambda n: (int(n.split(".")[1]), n),
    )
    output_names = [o.name for o in sess.get_outputs()]
    if "logits" not in output_names:
        sys.exit("the model has no `logits` output")

    def present_name(past):
        return "present." + past[len("past_key_values."):]

    past = {}
    for name in past_names:
        meta = inputs[name]
        dims = []
        for i, d in enumerate(meta.shape):
            if i == 0:
                dims.append(1)  # batch
            elif i == 2:
                dims.append(0)  # past length: empty on the first run
            elif isinstance(d, int):
                dims.append(d)
            else:
                sys.exit(f"{name}: dimension {i} ({d}) must be fixed")
        past[name] = np.zeros(dims, dtype=NP_TYPES.get(meta.type, np.float32))

    tokens = []
    all_logits = []
    fed = prompt
    position = 0
    for step in range(args.steps):
        feed = {"input_ids": np.array([fed], dtype=np.int64)}
        if "position_ids" in inputs:
            feed["position_ids"] = np.arange(position, position + len(fed), dtype=np.int64)[None, :]
        if "attention_mask" in inputs:
            feed["attention_mask"] = np.ones((1, position + len(fed)), dtype=np.int64)
        feed.update(past)
        out = dict(zip(output_names, sess.run(output_names, feed)))
        last = out["logits"][0, -1].astype(np.float32)
        all_logits.append(last)
        token = int(np.argmax(last))
        tokens.append(token)
        position += len(fed)
        past = {name: out[present_name(name)] for name in past_names}
        fed = [token]
        if args.stop_at is not None and token == args.stop_at:
            break

    result = {
        "model": args.model,
        "prompt": prompt,
        "tokens": tokens,
        "steps": len(tokens),
        "provider": "onnxruntime " + ort.__version__ + " CPUExecutionProvider",
    }
    if args.logits:
        np.save(args.logits, np.stack(all_logits))
    text = json.dumps(result)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
