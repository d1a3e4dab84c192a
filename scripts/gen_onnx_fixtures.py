#!/usr/bin/env python3
"""Writes the small ONNX models in fixtures/onnx/ that the loader tests and the fuzz target
start from (numpy + onnx; run with the python scripts/pyenv.sh prints):

    "$(scripts/pyenv.sh)" scripts/gen_onnx_fixtures.py

* `features.onnx`: symbolic and fixed dims, initializers as raw_data and as each typed field
  (float_data, int64_data, int32_data for f16/bool/i8, double_data, uint64_data,
  string_data), a sparse initializer, Constant nodes of every value form, an If whose
  branches read an outer value, a Loop, an optional input; opset 17.
* `external.onnx` + `external.bin`: two initializers in one external file (offsets 0 and
  64), one inline.
* `input.npy`: an f32 [2, 3] array; `empty.npy`: i64 [1, 3, 0, 4].
* `shape_chain.onnx`: x [batch, seq, 8] reshaped to [batch, 2 * seq, 4] through a shape
  chain (Shape, Gather, Mul, Concat, Equal/Where on shape values, Reshape), then Relu; opset
  17. The importer tests run it on the GPU with the chain on the host.
* `negative_dim.onnx`: x [n] reshaped to [n - 5, -1]: [5, 2] for n = 10, a negative
  dimension for n < 5.
* `int_div.onnx`: an i64 division the device would compute (refused when it compiles).
* `kv_attention.onnx`: attention over a KV cache as exported decoders write it: q, k, v
  [batch, 2, seq, 4], `past_key_values.0.key/value` [batch, 2, past, 4] concatenated with
  k, v on axis 2 into `present.0.key/value`, `attn = Softmax(q @ Transpose(present_k) / 2)
  @ present_v`; opset 17. The session tests carry its caches in place.
"""
import pathlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

out = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "onnx"
out.mkdir(parents=True, exist_ok=True)
T = TensorProto


def typed(name, dtype, dims, **fields):
    t = TensorProto(name=name, data_type=dtype, dims=dims)
    for k, v in fields.items():
        getattr(t, k).extend(v)
    return t


inits = [
    numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w_raw"),
    typed("w_float", T.FLOAT, [3], float_data=[1.0, 2.0, 3.0]),
    typed("w_i64", T.INT64, [2], int64_data=[-1, 1 << 40]),
    typed("w_f16", T.FLOAT16, [2], int32_data=[0x3C00, 0xC000]),
    typed("w_bool", T.BOOL, [3], int32_data=[1, 0, 1]),
    typed("w_i8", T.INT8, [2], int32_data=[-5, 7]),
    typed("w_f64", T.DOUBLE, [1], double_data=[0.5]),
    typed("w_u32", T.UINT32, [1], uint64_data=[7]),
    typed("w_str", T.STRING, [2], string_data=[b"a", b"bc"]),
    typed("w_empty", T.FLOAT, [0, 4]),
]
sparse = helper.make_sparse_tensor(
    numpy_helper.from_array(np.array([5.0, 6.0], dtype=np.float32), "w_sparse"),
    numpy_helper.from_array(np.array([1, 4], dtype=np.int64), "w_sparse_idx"),
    [2, 3],
)
then_g = helper.make_graph(
    [helper.make_node("Add", ["x", "w_float"], ["then_out"])], "then", [],
    [helper.make_tensor_value_info("then_out", T.FLOAT, ["batch", 3])])
else_g = helper.make_graph(
    [helper.make_node("Sub", ["x", "w_float"], ["else_out"])], "else", [],
    [helper.make_tensor_value_info("else_out", T.FLOAT, ["batch", 3])])
body = helper.make_graph(
    [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
     helper.make_node("Add", ["acc_in", "w_float"], ["acc_out"])], "body",
    [helper.make_tensor_value_info("i", T.INT64, []),
     helper.make_tensor_value_info("cond_in", T.BOOL, []),
     helper.make_tensor_value_info("acc_in", T.FLOAT, [3])],
    [helper.make_tensor_value_info("cond_out", T.BOOL, []),
     helper.make_tensor_value_info("acc_out", T.FLOAT, [3])])
nodes = [
    helper.make_node("MatMul", ["x_pair", "w_raw"], ["mm"], name="matmul"),
    helper.make_node("Constant", [], ["c_tensor"], value=numpy_helper.from_array(np.array([1.0, 2.0], dtype=np.float32))),
    helper.make_node("Constant", [], ["c_float"], value_float=0.25),
    helper.make_node("Constant", [], ["c_floats"], value_floats=[1.0, 2.0]),
    helper.make_node("Constant", [], ["c_int"], value_int=3),
    helper.make_node("Constant", [], ["c_ints"], value_ints=[1, 2, 3]),
    helper.make_node("Constant", [], ["c_sparse"], sparse_value=sparse),
    helper.make_node("Softmax", ["mm"], ["sm"], name="softmax", axis=-1),
    helper.make_node("If", ["flag"], ["branch"], name="if", then_branch=then_g, else_branch=else_g),
    helper.make_node("Loop", ["c_int", "", "w_float"], ["looped"], name="loop", body=body),
    helper.make_node("Identity", ["maybe"], ["maybe_out"], name="identity"),
]
graph = helper.make_graph(
    nodes, "features",
    [helper.make_tensor_value_info("x", T.FLOAT, ["batch", 3]),
     helper.make_tensor_value_info("x_pair", T.FLOAT, ["batch", "seq", 2]),
     helper.make_tensor_value_info("flag", T.BOOL, []),
     helper.make_value_info("maybe", helper.make_optional_type_proto(helper.make_tensor_type_proto(T.FLOAT, [2])))],
    [helper.make_tensor_value_info("sm", T.FLOAT, ["batch", "seq", 3]),
     helper.make_tensor_value_info("branch", T.FLOAT, ["batch", 3]),
     helper.make_tensor_value_info("looped", T.FLOAT, [3]),
     helper.make_value_info("maybe_out", helper.make_optional_type_proto(helper.make_tensor_type_proto(T.FLOAT, [2])))],
    initializer=inits, sparse_initializer=[helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([1.0], dtype=np.float32), "w_sparse_init"),
        numpy_helper.from_array(np.array([0], dtype=np.int64), "w_sparse_init_idx"), [4])])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="dynrt-fixtures")
model.ir_version = 8
onnx.save_model(model, out / "features.onnx")

# External data: a [4, 4] f32 at offset 0, a [3] i64 at offset 64 (the file is 88 bytes).
big = np.arange(16, dtype=np.float32).reshape(4, 4)
ids = np.array([7, 8, 9], dtype=np.int64)
(out / "external.bin").write_bytes(big.tobytes() + ids.tobytes())


def external(name, array, offset):
    t = numpy_helper.from_array(array, name)
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", "external.bin"), ("offset", str(offset)), ("length", str(array.nbytes))):
        t.external_data.add(key=k, value=v)
    return t


graph = helper.make_graph(
    [helper.make_node("MatMul", ["x", "big"], ["y"], name="matmul"),
     helper.make_node("Gather", ["y", "ids"], ["z"], name="gather", axis=0),
     helper.make_node("Add", ["z", "bias"], ["out"], name="add")],
    "external",
    [helper.make_tensor_value_info("x", T.FLOAT, ["n", 4])],
    [helper.make_tensor_value_info("out", T.FLOAT, [3, 4])],
    initializer=[external("big", big, 0), external("ids", ids, 64),
                 numpy_helper.from_array(np.ones(4, dtype=np.float32), "bias")])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="dynrt-fixtures")
model.ir_version = 8
onnx.save_model(model, out / "external.onnx")
onnx.checker.check_model(str(out / "external.onnx"))

I64 = lambda name, v: numpy_helper.from_array(np.array(v, dtype=np.int64), name)
graph = helper.make_graph(
    [helper.make_node("Shape", ["x"], ["shape"], name="shape"),
     helper.make_node("Gather", ["shape", "first_two"], ["batch_seq"], name="batch_seq", axis=0),
     helper.make_node("Mul", ["batch_seq", "one_two"], ["batch_2seq"], name="double_seq"),
     helper.make_node("Concat", ["batch_2seq", "four"], ["target"], name="target", axis=0),
     helper.make_node("Equal", ["target", "minus_one"], ["is_open"], name="is_open"),
     helper.make_node("Where", ["is_open", "one", "target"], ["closed"], name="closed"),
     helper.make_node("Reshape", ["x", "closed"], ["reshaped"], name="reshape"),
     helper.make_node("Relu", ["reshaped"], ["y"], name="relu")],
    "shape_chain",
    [helper.make_tensor_value_info("x", T.FLOAT, ["batch", "seq", 8])],
    [helper.make_tensor_value_info("y", T.FLOAT, ["batch", "seq2", 4])],
    initializer=[I64("first_two", [0, 1]), I64("one_two", [1, 2]), I64("four", [4]),
                 I64("minus_one", -1), I64("one", 1)])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="dynrt-fixtures")
model.ir_version = 8
onnx.checker.check_model(model)
onnx.save_model(model, out / "shape_chain.onnx")

graph = helper.make_graph(
    [helper.make_node("Shape", ["x"], ["shape"], name="shape"),
     helper.make_node("Sub", ["shape", "five"], ["short"], name="minus_five"),
     helper.make_node("Concat", ["short", "rest"], ["target"], name="target", axis=0),
     helper.make_node("Reshape", ["x", "target"], ["y"], name="reshape")],
    "negative_dim",
    [helper.make_tensor_value_info("x", T.FLOAT, ["n"])],
    [helper.make_tensor_value_info("y", T.FLOAT, ["m", "k"])],
    initializer=[I64("five", [5]), I64("rest", [-1])])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="dynrt-fixtures")
model.ir_version = 8
onnx.checker.check_model(model)
onnx.save_model(model, out / "negative_dim.onnx")

graph = helper.make_graph(
    [helper.make_node("Div", ["a", "b"], ["q"], name="int_div")],
    "int_div",
    [helper.make_tensor_value_info("a", T.INT64, [4])],
    [helper.make_tensor_value_info("q", T.INT64, [4])],
    initializer=[I64("b", [1, 2, 3, 4])])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="dynrt-fixtures")
model.ir_version = 8
onnx.checker.check_model(model)
onnx.save_model(model, out / "int_div.onnx")

kv = lambda name, t: helper.make_tensor_value_info(name, T.FLOAT, ["batch", 2, t, 4])
graph = helper.make_graph(
    [helper.make_node("Concat", ["past_key_values.0.key", "k"], ["present.0.key"], name="present_key", axis=2),
     helper.make_node("Concat", ["past_key_values.0.value", "v"], ["present.0.value"], name="present_value", axis=2),
     helper.make_node("Transpose", ["present.0.key"], ["k_t"], name="k_t", perm=[0, 1, 3, 2]),
     helper.make_node("MatMul", ["q", "k_t"], ["qk"], name="qk"),
     helper.make_node("Div", ["qk", "two"], ["scores"], name="scale"),
     helper.make_node("Softmax", ["scores"], ["probs"], name="probs", axis=-1),
     helper.make_node("MatMul", ["probs", "present.0.value"], ["attn"], name="pv")],
    "kv_attention",
    [kv("q", "seq"), kv("k", "seq"), kv("v", "seq"),
     kv("past_key_values.0.key", "past"), kv("past_key_values.0.value", "past")],
    [kv("attn", "seq"), kv("present.0.key", "total"), kv("present.0.value", "total")],
    initializer=[numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="dynrt-fixtures")
model.ir_version = 8
onnx.checker.check_model(model)
onnx.save_model(model, out / "kv_attention.onnx")

np.save(out / "input.npy", np.arange(6, dtype=np.float32).reshape(2, 3))
np.save(out / "empty.npy", np.zeros((1, 3, 0, 4), dtype=np.int64))
print(f"wrote {sorted(p.name for p in out.iterdir())}")
