#!/usr/bin/env python3
"""Writes an opset-17 ONNX decoder with a KV cache from a llama-architecture GGUF (SmolLM2).

    "$(scripts/pyenv.sh)" scripts/export_smollm2_onnx.py MODEL.gguf OUT_DIR [--layers N]

OUT_DIR gets `model.onnx` and `model.onnx.data` (every weight dequantized to f32, stored as
external data in one file). Needs numpy, onnx and gguf (scripts/requirements.txt).

The graph uses plain ops only, in the form optimum exports a decoder:

* inputs  `input_ids` int64 [batch_size, sequence_length],
          `position_ids` int64 [batch_size, sequence_length] (positions of the new tokens,
          past_sequence_length .. total_sequence_length - 1, as optimum's export takes them),
          `past_key_values.{l}.key` / `.value` f32 [batch_size, kv_heads, past_sequence_length,
          head_dim] (zero-length on the first step);
* outputs `logits` f32 [batch_size, sequence_length, vocab],
          `present.{l}.key` / `.value` f32 [batch_size, kv_heads, total_sequence_length,
          head_dim] = Concat(past, new) on the sequence axis.

Per layer: RMS norm as Pow/ReduceMean/Add/Sqrt/Div/Mul; Q, K, V, O projections as MatMul;
RoPE as x * cos + rotate(x) * sin, with cos/sin gathered by position from tables computed
here (base from the GGUF's `rope.freq_base`). GGUF stores llama's Q and K rows permuted so
that RoPE rotates *adjacent* pairs (x[2i], x[2i+1]) — llama.cpp's "normal" rope — so the
rotation is Reshape [.., head_dim/2, 2] / Split / Neg / Concat / Reshape. Grouped-query
attention without copying K/V per head: Q is reshaped to [batch, kv_heads, group, seq,
head_dim] and broadcast against K/V [batch, kv_heads, 1, total, head_dim] in MatMul. The
causal mask comes from a shape subgraph (Shape/Gather/Sub/Range/Greater/Where): query i sees
keys j <= past + i. Softmax on the last axis; the MLP is down(silu(gate(x)) * up(x)) with SiLU
as x * Sigmoid(x); the LM head is the token embedding (tied) through Gemm with transB=1, so
the 49152 x 576 table is stored once.
"""
import argparse
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import gguf

OPSET = 17


def field(reader, key):
    f = reader.fields.get(key)
    if f is None:
        sys.exit(f"the GGUF has no `{key}`")
    return f.contents()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf", help="a llama-architecture GGUF (e.g. SmolLM2-135M-Instruct.Q4_1.gguf)")
    ap.add_argument("out_dir", help="folder for model.onnx and model.onnx.data")
    ap.add_argument("--layers", type=int, default=None, help="export only the first N layers (tests)")
    args = ap.parse_args()

    r = gguf.GGUFReader(args.gguf)
    arch = field(r, "general.architecture")
    if arch != "llama":
        sys.exit(f"architecture {arch!r} is not llama")
    n_layers = int(field(r, "llama.block_count"))
    if args.layers is not None:
        n_layers = min(n_layers, args.layers)
    dim = int(field(r, "llama.embedding_length"))
    n_heads = int(field(r, "llama.attention.head_count"))
    n_kv = int(field(r, "llama.attention.head_count_kv"))
    eps = float(field(r, "llama.attention.layer_norm_rms_epsilon"))
    base = float(field(r, "llama.rope.freq_base"))
    ctx = int(field(r, "llama.context_length"))
    head_dim = dim // n_heads
    group = n_heads // n_kv
    tensors = {t.name: t for t in r.tensors}

    def weight(name):
        t = tensors[name]
        return np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32))

    inits = []
    nodes = []

    def init(name, array):
        inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def node(op, inputs, outputs=None, name=None, **attrs):
        name = name or f"{op}_{len(nodes)}"
        outputs = outputs or [f"{name}_out"]
        nodes.append(helper.make_node(op, inputs, outputs, name=name, **attrs))
        return outputs[0] if len(outputs) == 1 else outputs

    def const_i64(name, values):
        return init(name, np.array(values, dtype=np.int64))

    # Shared constants.
    c_eps = init("const.eps", np.array(eps, dtype=np.float32))
    c_two = init("const.two", np.array(2.0, dtype=np.float32))
    c_scale = init("const.scale", np.array(1.0 / np.sqrt(head_dim), dtype=np.float32))
    c_neg = init("const.mask_value", np.array(np.finfo(np.float32).min, dtype=np.float32))
    c_zero_f = init("const.zero_f", np.array(0.0, dtype=np.float32))
    c_one = const_i64("const.one", 1)
    c_zero = const_i64("const.zero", 0)
    c_axis2 = const_i64("const.index2", 2)
    c_axes0 = const_i64("const.axes0", [0])
    c_axes1 = const_i64("const.axes1", [1])
    c_axes2 = const_i64("const.axes2", [2])
    c_split = const_i64("const.split_1_1", [1, 1])
    shape_heads = const_i64("const.shape_heads", [0, 0, n_heads, head_dim])
    shape_kv = const_i64("const.shape_kv", [0, 0, n_kv, head_dim])
    shape_pairs = const_i64("const.shape_pairs", [0, 0, 0, head_dim // 2, 2])
    shape_head = const_i64("const.shape_head", [0, 0, 0, head_dim])
    shape_group = const_i64("const.shape_group", [0, n_kv, group, -1, head_dim])
    shape_merge_heads = const_i64("const.shape_merge_heads", [0, n_heads, -1, head_dim])
    shape_model = const_i64("const.shape_model", [0, 0, dim])
    shape_rows = const_i64("const.shape_rows", [-1, dim])

    # RoPE tables: angle(p, 2i) = angle(p, 2i+1) = p * base^(-2i/head_dim), adjacent pairs.
    inv_freq = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.arange(ctx, dtype=np.float64)[:, None] * np.repeat(inv_freq, 2)[None, :]
    cos_table = init("rope.cos", np.cos(angles).astype(np.float32))
    sin_table = init("rope.sin", np.sin(angles).astype(np.float32))

    embed = init("token_embd.weight", weight("token_embd.weight"))  # [vocab, dim]
    vocab = inits[-1].dims[0]

    # Embedding, RoPE factors [batch, 1, seq, head_dim].
    h = node("Gather", [embed, "input_ids"], name="embed", axis=0)
    cos = node("Unsqueeze", [node("Gather", [cos_table, "position_ids"], name="rope_cos_gather", axis=0), c_axes1], name="rope_cos")
    sin = node("Unsqueeze", [node("Gather", [sin_table, "position_ids"], name="rope_sin_gather", axis=0), c_axes1], name="rope_sin")

    # Causal mask [seq, total] from shapes: past = Shape(past_key_values.0.key)[2].
    seq = node("Gather", [node("Shape", ["input_ids"], name="mask_ids_shape"), c_one], name="mask_seq", axis=0)
    past = node("Gather", [node("Shape", ["past_key_values.0.key"], name="mask_past_shape"), c_axis2], name="mask_past", axis=0)
    total = node("Add", [past, seq], name="mask_total")
    rows = node("Unsqueeze", [node("Range", [past, total, c_one], name="mask_rows_range"), c_axes1], name="mask_rows")
    cols = node("Unsqueeze", [node("Range", [c_zero, total, c_one], name="mask_cols_range"), c_axes0], name="mask_cols")
    future = node("Greater", [cols, rows], name="mask_future")
    mask = node("Where", [future, c_neg, c_zero_f], name="mask")

    def rms_norm(x, w, prefix):
        sq = node("Pow", [x, c_two], name=f"{prefix}_pow")
        mean = node("ReduceMean", [sq], name=f"{prefix}_mean", axes=[-1], keepdims=1)
        rms = node("Sqrt", [node("Add", [mean, c_eps], name=f"{prefix}_add_eps")], name=f"{prefix}_sqrt")
        return node("Mul", [node("Div", [x, rms], name=f"{prefix}_div"), w], name=f"{prefix}_scale")

    def rope(x, prefix):
        pairs = node("Reshape", [x, shape_pairs], name=f"{prefix}_pairs")
        x0, x1 = node("Split", [pairs, c_split], [f"{prefix}_x0", f"{prefix}_x1"], name=f"{prefix}_split", axis=-1)
        rot = node("Concat", [node("Neg", [x1], name=f"{prefix}_neg"), x0], name=f"{prefix}_rot_pairs", axis=-1)
        rot = node("Reshape", [rot, shape_head], name=f"{prefix}_rot")
        return node("Add", [node("Mul", [x, cos], name=f"{prefix}_cos"), node("Mul", [rot, sin], name=f"{prefix}_sin")], name=f"{prefix}_rope")

    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
    ]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch_size", "sequence_length", vocab])]
    for l in range(n_layers):
        p = f"blk.{l}"
        past_k, past_v = f"past_key_values.{l}.key", f"past_key_values.{l}.value"
        present_k, present_v = f"present.{l}.key", f"present.{l}.value"
        for name in (past_k, past_v):
            inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch_size", n_kv, "past_sequence_length", head_dim]))
        for name in (present_k, present_v):
            outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch_size", n_kv, "total_sequence_length", head_dim]))

        x = rms_norm(h, init(f"{p}.attn_norm.weight", weight(f"{p}.attn_norm.weight")), f"l{l}_attn_norm")
        wq = init(f"{p}.attn_q.weight", weight(f"{p}.attn_q.weight").T)
        wk = init(f"{p}.attn_k.weight", weight(f"{p}.attn_k.weight").T)
        wv = init(f"{p}.attn_v.weight", weight(f"{p}.attn_v.weight").T)
        wo = init(f"{p}.attn_output.weight", weight(f"{p}.attn_output.weight").T)
        perm = [0, 2, 1, 3]
        q = node("Transpose", [node("Reshape", [node("MatMul", [x, wq], name=f"l{l}_q_proj"), shape_heads], name=f"l{l}_q_heads")], name=f"l{l}_q", perm=perm)
        k = node("Transpose", [node("Reshape", [node("MatMul", [x, wk], name=f"l{l}_k_proj"), shape_kv], name=f"l{l}_k_heads")], name=f"l{l}_k", perm=perm)
        v = node("Transpose", [node("Reshape", [node("MatMul", [x, wv], name=f"l{l}_v_proj"), shape_kv], name=f"l{l}_v_heads")], name=f"l{l}_v", perm=perm)
        q = rope(q, f"l{l}_q")
        k = rope(k, f"l{l}_k")
        node("Concat", [past_k, k], [present_k], name=f"l{l}_present_key", axis=2)
        node("Concat", [past_v, v], [present_v], name=f"l{l}_present_value", axis=2)
        # Grouped-query attention: [b, kv, group, seq, d] x [b, kv, 1, d, total].
        qg = node("Reshape", [q, shape_group], name=f"l{l}_q_groups")
        kt = node("Unsqueeze", [node("Transpose", [present_k], name=f"l{l}_k_t", perm=[0, 1, 3, 2]), c_axes2], name=f"l{l}_k_groups")
        vg = node("Unsqueeze", [present_v, c_axes2], name=f"l{l}_v_groups")
        scores = node("Mul", [node("MatMul", [qg, kt], name=f"l{l}_qk"), c_scale], name=f"l{l}_scaled")
        probs = node("Softmax", [node("Add", [scores, mask], name=f"l{l}_masked")], name=f"l{l}_probs", axis=-1)
        attn = node("Reshape", [node("MatMul", [probs, vg], name=f"l{l}_pv"), shape_merge_heads], name=f"l{l}_attn_heads")
        attn = node("Reshape", [node("Transpose", [attn], name=f"l{l}_attn_t", perm=perm), shape_model], name=f"l{l}_attn")
        h = node("Add", [h, node("MatMul", [attn, wo], name=f"l{l}_o_proj")], name=f"l{l}_attn_residual")

        x = rms_norm(h, init(f"{p}.ffn_norm.weight", weight(f"{p}.ffn_norm.weight")), f"l{l}_ffn_norm")
        gate = node("MatMul", [x, init(f"{p}.ffn_gate.weight", weight(f"{p}.ffn_gate.weight").T)], name=f"l{l}_gate")
        up = node("MatMul", [x, init(f"{p}.ffn_up.weight", weight(f"{p}.ffn_up.weight").T)], name=f"l{l}_up")
        silu = node("Mul", [gate, node("Sigmoid", [gate], name=f"l{l}_sigmoid")], name=f"l{l}_silu")
        down = node("MatMul", [node("Mul", [silu, up], name=f"l{l}_gated"), init(f"{p}.ffn_down.weight", weight(f"{p}.ffn_down.weight").T)], name=f"l{l}_down")
        h = node("Add", [h, down], name=f"l{l}_ffn_residual")

    x = rms_norm(h, init("output_norm.weight", weight("output_norm.weight")), "final_norm")
    rows2d = node("Reshape", [x, shape_rows], name="head_rows")
    logits2d = node("Gemm", [rows2d, embed], name="lm_head", transB=1)
    out_shape = node("Concat", [node("Slice", [node("Shape", ["input_ids"], name="head_ids_shape"), c_axes0, const_i64("const.end2", [2])], name="head_batch_seq"), const_i64("const.vocab", [vocab])], name="head_shape", axis=0)
    node("Reshape", [logits2d, out_shape], ["logits"], name="logits")

    graph = helper.make_graph(nodes, "smollm2_decoder", inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="dynrt-export-smollm2")
    model.ir_version = 8
    os.makedirs(args.out_dir, exist_ok=True)
    path = os.path.join(args.out_dir, "model.onnx")
    data = "model.onnx.data"
    if os.path.exists(os.path.join(args.out_dir, data)):
        os.remove(os.path.join(args.out_dir, data))  # onnx appends to an existing data file
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location=data, size_threshold=1024)
    onnx.checker.check_model(path)
    n_params = sum(int(np.prod(t.dims)) for t in inits)
    print(f"wrote {path} (+ {data}): {n_layers} layers, {len(nodes)} nodes, {n_params} weights, opset {OPSET}", file=sys.stderr)


if __name__ == "__main__":
    main()
