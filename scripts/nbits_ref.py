#!/usr/bin/env python3
"""ONNX Runtime's 4-bit `MatMulNBits` (domain com.microsoft): quantized models made by its own
quantizer, and the references dynrt's importer is checked against.

    "$(scripts/pyenv.sh)" scripts/nbits_ref.py quantize IN.onnx OUT_DIR [--block-size 32]
        [--symmetric]
    "$(scripts/pyenv.sh)" scripts/nbits_ref.py cases OUT_DIR

`quantize` runs `onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer` (bits
4, block size 32 by default, asymmetric: uint8 zero points; `--symmetric`: none, the operator's
default 8) on every MatMul with a constant weight of IN.onnx and writes OUT_DIR/model.onnx with
every initializer in OUT_DIR/model.onnx.data (external data, as scripts/export_smollm2_onnx.py
writes the f32 model). The LM head of that export is a Gemm and stays f32.

`cases` writes small models for tests/gpu/onnx_nbits.rs: OUT_DIR/<case>/model.onnx, x.npy, and
two references of y: `ort.npy` (onnxruntime's CPU provider on the file) and `numpy.npy` (the
operator's definition computed here from the file's tensors with numpy, in float64:
`y = x @ (scale * (code - zero_point))ᵀ + bias`). OUT_DIR/cases.txt lists the cases. Cases:
the quantizer's output at block sizes 32 (asymmetric and symmetric), 64 and 128, K not a
multiple of the block (a partial last block), a 3-D x; and two hand-built nodes the quantizer
does not write: float zero points with a bias, and an odd number of blocks per row (packed zero
points padded per row). Needs numpy, onnx, onnxruntime and onnx-ir (scripts/requirements.txt).
"""
import argparse
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SEED = 20261126


def quantizer(model, block_size, symmetric):
    # Imported here: the quantizer logs at INFO on import.
    import logging

    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    q = MatMulNBitsQuantizer(model, bits=4, block_size=block_size, is_symmetric=symmetric)
    q.process()
    return q.model.model


def quantize(args):
    model = onnx.load(args.input)
    out = quantizer(model, args.block_size, args.symmetric)
    os.makedirs(args.out_dir, exist_ok=True)
    data = os.path.join(args.out_dir, "model.onnx.data")
    if os.path.exists(data):
        os.remove(data)  # onnx.save appends to an existing data file
    onnx.save(out, os.path.join(args.out_dir, "model.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="model.onnx.data")
    n = sum(1 for node in out.graph.node if node.op_type == "MatMulNBits")
    print(f"wrote {args.out_dir}/model.onnx (+ model.onnx.data): {n} MatMulNBits nodes, "
          f"block size {args.block_size}, {'symmetric' if args.symmetric else 'asymmetric'}",
          file=sys.stderr)


def matmul_model(x_shape, w):
    k, n = w.shape
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "nbits_case",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, x_shape[:-1] + [n])],
        [numpy_helper.from_array(w, "w")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def nbits_model(x_shape, n, k, block, b, scales, zero_points=None, bias=None):
    """A MatMulNBits node built by hand (what the quantizer does not write)."""
    inits = [numpy_helper.from_array(b, "b"), numpy_helper.from_array(scales, "scales")]
    inputs = ["x", "b", "scales", ""]
    if zero_points is not None:
        inits.append(numpy_helper.from_array(zero_points, "zp"))
        inputs[3] = "zp"
    if bias is not None:
        inits.append(numpy_helper.from_array(bias, "bias"))
        inputs += ["", "bias"]  # g_idx absent
    node = helper.make_node("MatMulNBits", inputs, ["y"], name="mnb", domain="com.microsoft",
                            K=k, N=n, bits=4, block_size=block)
    g = helper.make_graph([node], "nbits_case", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, x_shape[:-1] + [n])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m


def reference(model, x):
    """The operator's definition on the file's tensors, in float64."""
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    node = next(n for n in model.graph.node if n.op_type == "MatMulNBits")
    a = {x.name: x for x in node.attribute}
    k, n, block = a["K"].i, a["N"].i, a["block_size"].i
    k_blocks = (k + block - 1) // block
    b = inits[node.input[1]].reshape(n, k_blocks, block // 2)
    codes = np.empty((n, k_blocks, block), dtype=np.float64)
    codes[:, :, 0::2] = b & 15
    codes[:, :, 1::2] = b >> 4
    scales = inits[node.input[2]].astype(np.float64).reshape(n, k_blocks)
    zp_name = node.input[3] if len(node.input) > 3 else ""
    if not zp_name:
        zp = np.full((n, k_blocks), 8.0)
    elif inits[zp_name].dtype == np.uint8:
        packed = inits[zp_name].reshape(n, -1)
        zp = np.empty((n, packed.shape[1] * 2))
        zp[:, 0::2] = packed & 15
        zp[:, 1::2] = packed >> 4
        zp = zp[:, :k_blocks]
    else:
        zp = inits[zp_name].astype(np.float64).reshape(n, k_blocks)
    w = (scales[:, :, None] * (codes - zp[:, :, None])).reshape(n, -1)[:, :k]
    y = x.astype(np.float64) @ w.T
    bias_name = node.input[5] if len(node.input) > 5 else ""
    if bias_name:
        y = y + inits[bias_name].astype(np.float64)
    return y.astype(np.float32)


def write_case(out, name, model, x):
    import onnxruntime as ort

    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    onnx.checker.check_model(model)
    path = os.path.join(d, "model.onnx")
    onnx.save(model, path)
    np.save(os.path.join(d, "x.npy"), x)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    y_ort = sess.run(["y"], {"x": x})[0]
    y_np = reference(model, x)
    np.save(os.path.join(d, "ort.npy"), y_ort)
    np.save(os.path.join(d, "numpy.npy"), y_np)
    diff = float(np.max(np.abs(y_ort - y_np)))
    print(f"{name}: y {list(y_np.shape)}, |ort - numpy| <= {diff:.3g}", file=sys.stderr)
    return name


def cases(args):
    rng = np.random.default_rng(SEED)
    out = args.out_dir
    names = []
    # (name, x shape, N, block size, symmetric) through the quantizer.
    for name, x_shape, n, block, sym in [
        ("b32_asym", [3, 96], 40, 32, False),
        ("b32_sym", [1, 64], 33, 32, True),
        ("b64", [2, 128], 17, 64, False),
        ("b128_3d", [2, 3, 256], 24, 128, False),
        ("partial_block", [1, 96], 9, 64, False),
    ]:
        k = x_shape[-1]
        w = rng.uniform(-1, 1, (k, n)).astype(np.float32)
        model = quantizer(matmul_model(x_shape, w), block, sym)
        x = rng.uniform(-1, 1, x_shape).astype(np.float32)
        names.append(write_case(out, name, model, x))
    # Float zero points and a bias; 3 blocks per row with packed zero points (padded rows).
    n, k, block = 5, 96, 32
    kb = k // block
    b = rng.integers(0, 256, (n, kb, block // 2), dtype=np.uint8)
    scales = rng.uniform(0.01, 0.1, n * kb).astype(np.float32)
    zp_f = rng.uniform(6, 9, n * kb).astype(np.float32)
    bias = rng.uniform(-1, 1, n).astype(np.float32)
    x = rng.uniform(-1, 1, [2, k]).astype(np.float32)
    names.append(write_case(out, "float_zp_bias", nbits_model([2, k], n, k, block, b, scales, zp_f, bias), x))
    zp_u8 = rng.integers(0, 256, n * ((kb + 1) // 2), dtype=np.uint8)
    names.append(write_case(out, "odd_blocks_zp", nbits_model([2, k], n, k, block, b, scales, zp_u8), x))
    with open(os.path.join(out, "cases.txt"), "w") as f:
        f.write("\n".join(names) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("quantize", help="MatMulNBitsQuantizer on a model")
    q.add_argument("input")
    q.add_argument("out_dir")
    q.add_argument("--block-size", type=int, default=32)
    q.add_argument("--symmetric", action="store_true")
    c = sub.add_parser("cases", help="small models and their references")
    c.add_argument("out_dir")
    args = ap.parse_args()
    {"quantize": quantize, "cases": cases}[args.cmd](args)


if __name__ == "__main__":
    main()
