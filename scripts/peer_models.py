#!/usr/bin/env python3
"""Writes the model files, the inputs and the manifest of scripts/bench_peer.sh.

    "$(scripts/pyenv.sh)" scripts/peer_models.py OUT_DIR [--smollm2 DIR] [--smollm2-q4 DIR]
        [--quick]

Both runtimes of the side-by-side benchmark read exactly these files: for each workload a
folder OUT_DIR/<workload>/ with `feeds/<input>.npy` (the first step's inputs), the model
(`model.onnx`, or a path to a shared one), and one line in OUT_DIR/workloads.json. Needs numpy
and onnx (scripts/requirements.txt).

Workloads (names are what the report prints):

* `add_1m`, `add_4m`, `mul_1m`, `mul_4m`: `C = A op B` on f32 vectors of 2^20 / 2^22
  elements, both operands graph inputs (uniform in [-1, 1), seeded); a step is one run of
  the model; figure GB/s = 3 * 4 * n bytes / step time.
* `matmul_256`, `matmul_512`, `matmul_1024`: `C = A @ B`, square f32, both operands graph
  inputs (not initializers: neither runtime may pre-pack B); GFLOP/s = 2 n^3 / step time.
* `gpt2_tiny`: scripts/make_gpt2_tiny.py's decoder, a prompt of 8 token ids, then greedy
  decode; the step time is the median over steps 32 .. steps-1 (the issue's measure).
* `smollm2_ctx64`, `_ctx256`, `_ctx1024` (with --smollm2 DIR: the folder holding
  scripts/export_smollm2_onnx.py's model.onnx + model.onnx.data): one decode step at a
  context of 64 / 256 / 1024 tokens: the past keys and values (ctx - 1 positions, 30 layers)
  are seeded N(0, 1) arrays and `input_ids` is one token, so no runtime spends minutes on a
  prefill that software adapters make very slow; then greedy decode for a few steps (one
  ONNX Runtime step costs about 3 s of CPU time on lavapipe and 12-15 s on SwiftShader).
* `smollm2_q4_ctx64`, `_ctx256`, `_ctx1024` (with --smollm2-q4 DIR: the folder holding that
  export quantized by ONNX Runtime's own MatMulNBitsQuantizer, `scripts/nbits_ref.py
  quantize`: every projection a `com.microsoft` `MatMulNBits`, 4 bits, blocks of 32, uint8
  zero points; the tied LM head, a Gemm, stays f32): the same steps on that file, with the
  same seeded pasts as the f32 rows.

Decode protocol (both runtimes, every route): step 0 feeds `feeds/*.npy`; after every step
the token is the argmax of `logits[0, -1, :]` (the first index on ties); the next step feeds
that token as `input_ids` [[t]], `position_ids` [[past + i]] when the model has that input,
and every output whose name starts with a `state` prefix as the input with the paired prefix
(`present.0.key` -> `past_key_values.0.key`). The manifest spells the pairs out.
"""
import argparse
import json
import os
import shutil
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 20240614

# (name, op, n): elementwise vectors of n f32 and square matmuls of n x n.
ELEMENTWISE = [("add_1m", "Add", 1 << 20), ("add_4m", "Add", 1 << 22), ("mul_1m", "Mul", 1 << 20), ("mul_4m", "Mul", 1 << 22)]
MATMUL = [("matmul_256", 256), ("matmul_512", 512), ("matmul_1024", 1024)]
SMOLLM2_CONTEXTS = [64, 256, 1024]


def save(model, path):
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)


def write_feeds(folder, feeds):
    os.makedirs(os.path.join(folder, "feeds"), exist_ok=True)
    for name, arr in feeds.items():
        np.save(os.path.join(folder, "feeds", name + ".npy"), arr)


def binary_model(op, shape_a, shape_b, shape_c):
    g = helper.make_graph(
        [helper.make_node(op, ["A", "B"], ["C"])],
        f"peer_{op.lower()}",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, shape_a), helper.make_tensor_value_info("B", TensorProto.FLOAT, shape_b)],
        [helper.make_tensor_value_info("C", TensorProto.FLOAT, shape_c)],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="dynrt-peer-models")
    m.ir_version = 8
    return m


def op_workloads(out, rng, quick):
    rows = []
    for name, op, n in ELEMENTWISE:
        folder = os.path.join(out, name)
        os.makedirs(folder, exist_ok=True)
        save(binary_model(op, [n], [n], [n]), os.path.join(folder, "model.onnx"))
        write_feeds(folder, {"A": rng.uniform(-1, 1, n).astype(np.float32), "B": rng.uniform(-1, 1, n).astype(np.float32)})
        rows.append({"workload": name, "kind": "op", "op": op, "model": f"{name}/model.onnx", "feeds": f"{name}/feeds",
                     "inputs": ["A", "B"], "outputs": ["C"], "steps": 10 if quick else 40, "measure_from": 2,
                     "figure": "GB/s", "per_step": 3 * 4 * n})
    for name, n in MATMUL:
        folder = os.path.join(out, name)
        os.makedirs(folder, exist_ok=True)
        save(binary_model("MatMul", [n, n], [n, n], [n, n]), os.path.join(folder, "model.onnx"))
        write_feeds(folder, {"A": rng.uniform(-1, 1, (n, n)).astype(np.float32), "B": rng.uniform(-1, 1, (n, n)).astype(np.float32)})
        # Software adapters run a 1024 matmul for seconds: fewer steps for the big ones.
        steps = {256: 6, 512: 3, 1024: 2} if quick else {256: 20, 512: 8, 1024: 4}
        rows.append({"workload": name, "kind": "op", "op": "MatMul", "model": f"{name}/model.onnx", "feeds": f"{name}/feeds",
                     "inputs": ["A", "B"], "outputs": ["C"], "steps": steps[n], "measure_from": 1,
                     "figure": "GFLOP/s", "per_step": 2 * n ** 3})
    return rows


def gpt2_workload(out, quick):
    sys.path.insert(0, HERE)
    import make_gpt2_tiny  # noqa: E402 (scripts/ is not a package)

    folder = os.path.join(out, "gpt2_tiny")
    os.makedirs(folder, exist_ok=True)
    make_gpt2_tiny.build(os.path.join(folder, "model.onnx"))
    L, H, HD = make_gpt2_tiny.L, make_gpt2_tiny.H, make_gpt2_tiny.HD
    feeds = {"input_ids": np.array([[128, 154, 106, 212, 48, 113, 107, 158]], dtype=np.int64)}
    for layer in range(L):
        for kv in ("key", "value"):
            feeds[f"past_{kv}.{layer}"] = np.zeros((1, H, 0, HD), dtype=np.float32)
    write_feeds(folder, feeds)
    states = [[f"present_{kv}.{layer}", f"past_{kv}.{layer}"] for layer in range(L) for kv in ("key", "value")]
    return [{"workload": "gpt2_tiny", "kind": "decode", "model": "gpt2_tiny/model.onnx", "feeds": "gpt2_tiny/feeds",
             "inputs": list(feeds), "outputs": ["logits"] + [s[0] for s in states],
             "token_input": "input_ids", "logits": "logits", "position_input": None, "states": states,
             "steps": 48 if quick else 256, "measure_from": 32, "figure": None, "per_step": None}]


def smollm2_workloads(out, smollm2_dir, rng, quick, tag="smollm2"):
    model = os.path.join(smollm2_dir, "model.onnx")
    m = onnx.load(model, load_external_data=False)
    inputs = {i.name: i for i in m.graph.input}
    pasts = [n for n in inputs if n.startswith("past_key_values.")]
    if "input_ids" not in inputs or not pasts:
        sys.exit(f"{model}: not a decoder with input_ids and past_key_values.* inputs")
    rel = os.path.relpath(smollm2_dir, out)
    rows = []
    for ctx in SMOLLM2_CONTEXTS:
        name = f"{tag}_ctx{ctx}"
        folder = os.path.join(out, name)
        if os.path.isdir(folder):
            shutil.rmtree(folder)
        feeds = {"input_ids": np.array([[1]], dtype=np.int64)}
        if "position_ids" in inputs:
            feeds["position_ids"] = np.array([[ctx - 1]], dtype=np.int64)
        for p in pasts:
            dims = [d.dim_value for d in inputs[p].type.tensor_type.shape.dim]
            dims[0], dims[2] = 1, ctx - 1
            feeds[p] = rng.standard_normal(dims, dtype=np.float32)
        write_feeds(folder, feeds)
        states = [["present." + p[len("past_key_values."):], p] for p in pasts]
        rows.append({"workload": name, "kind": "decode", "model": f"{rel}/model.onnx", "external_data": ["model.onnx.data"],
                     "feeds": f"{name}/feeds", "inputs": list(feeds), "outputs": ["logits"] + [s[0] for s in states],
                     "token_input": "input_ids", "logits": "logits",
                     "position_input": "position_ids" if "position_ids" in inputs else None, "states": states,
                     "steps": 2 if quick else 3, "measure_from": 1, "figure": None, "per_step": None})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--smollm2", help="folder of the exported SmolLM2 decoder (model.onnx + model.onnx.data)")
    ap.add_argument("--smollm2-q4", help="folder of that decoder quantized to MatMulNBits (scripts/nbits_ref.py quantize)")
    ap.add_argument("--quick", action="store_true", help="fewer steps per workload")
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    rng = np.random.default_rng(SEED)
    rows = op_workloads(args.out_dir, rng, args.quick) + gpt2_workload(args.out_dir, args.quick)
    # The quantized rows draw from a copy of the generator as the f32 rows found it: the
    # same pasts, and the f32 rows the same whether or not the quantized ones are written.
    state = rng.bit_generator.state
    if args.smollm2:
        rows += smollm2_workloads(args.out_dir, args.smollm2, rng, args.quick)
    if args.smollm2_q4:
        q4_rng = np.random.default_rng()
        q4_rng.bit_generator.state = state
        rows += smollm2_workloads(args.out_dir, args.smollm2_q4, q4_rng, args.quick, "smollm2_q4")
    with open(os.path.join(args.out_dir, "workloads.json"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"wrote {len(rows)} workloads to {args.out_dir}/workloads.json", file=sys.stderr)


if __name__ == "__main__":
    main()
