//! Importer tests on models built from the wire structs (device-free): values to nodes,
//! symbolic and unknown dims, initializers shared with the model buffer, shape chains marked
//! shape-only and evaluated on the host, the one error listing every unsupported node, and
//! malformed graphs named by node.

use super::*;
use crate::graph::ops::Input;
use crate::graph::{Bindings, Dim};
use crate::onnx::proto::*;
use crate::onnx::tests::{attr, node, opset17, raw_f32, value};

fn model_of(nodes: Vec<NodeProto>, inputs: Vec<ValueInfoProto>, outputs: &[&str]) -> ModelProto {
    opset17(GraphProto {
        name: "g".to_string(),
        node: nodes,
        input: inputs,
        output: outputs.iter().map(|o| value(o, 1, &[])).collect(),
        ..Default::default()
    })
}

fn load(m: &ModelProto) -> OnnxFile {
    crate::onnx::tests::load(m).expect("the test model loads")
}

fn i64s(name: &str, dims: &[i64], v: &[i64]) -> TensorProto {
    TensorProto {
        name: name.to_string(),
        data_type: 7,
        dims: dims.to_vec(),
        int64_data: v.to_vec(),
        ..Default::default()
    }
}

fn bindings(pairs: &[(&str, u64)]) -> Bindings {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

#[test]
fn registry_is_sorted_and_refusals_say_why() {
    assert!(
        CONVERTERS.windows(2).all(|w| w[0].op_type < w[1].op_type),
        "keep CONVERTERS sorted, one line per op type"
    );
    assert!(converter("Add").is_some() && converter("NoSuchOp").is_none());
    assert_eq!(refusal("", "Add", 17), None);
    assert_eq!(
        refusal("", "NonMaxSuppression", 17).as_deref(),
        Some("not in the importer's op list")
    );
    assert_eq!(
        refusal("com.microsoft", "Add", 17).as_deref(),
        Some("not in the importer's com.microsoft op list")
    );
    assert_eq!(refusal("com.microsoft", "MatMulNBits", 17), None);
    assert_eq!(
        refusal("org.example", "MatMulNBits", 17).as_deref(),
        Some("domain `org.example` not supported")
    );
    assert!(CONTRIB_CONVERTERS
        .windows(2)
        .all(|w| w[0].op_type < w[1].op_type));
    assert_eq!(
        refusal("", "Gelu", 17).as_deref(),
        Some("not defined at opset 17")
    );
    // Clip-1 had other attributes than the Clip-6 the converter maps.
    assert!(refusal("", "Clip", 5)
        .unwrap()
        .contains("maps Clip-6 and later"));
}

#[test]
fn every_unsupported_node_is_listed_in_one_error() {
    let mut m = model_of(
        vec![
            node("Relu", "ok", &["x"], &["a"]),
            node("NonMaxSuppression", "nms", &["a"], &["b"]),
            node("Relu", "ok2", &["b"], &["c"]),
            node("TopK", "", &["c"], &["y"]),
        ],
        vec![value("x", 1, &["n"])],
        &["y"],
    );
    m.graph.as_mut().unwrap().node[3].domain = "com.example".into();
    m.opset_import.push(OperatorSetIdProto {
        domain: "com.example".into(),
        version: 1,
    });
    let err = import(&load(&m)).unwrap_err();
    let ImportError::Unsupported { nodes } = &err else {
        panic!("{err}");
    };
    let names: Vec<(&str, &str)> = nodes
        .iter()
        .map(|n| (n.node.as_str(), n.op_type.as_str()))
        .collect();
    assert_eq!(names, [("nms", "NonMaxSuppression"), ("TopK#3", "TopK")]);
    let msg = err.to_string();
    assert!(msg.starts_with("2 unsupported node(s): `nms`"), "{msg}");
    assert!(msg.contains("domain `com.example` not supported"), "{msg}");
}

#[test]
fn inputs_become_dims_and_initializers_share_the_model_bytes() {
    let mut m = model_of(
        vec![
            node("MatMul", "mm", &["x", "w"], &["xw"]),
            node("Add", "add", &["xw", "b"], &["y"]),
        ],
        vec![value("x", 1, &["batch", "4"])],
        &["y"],
    );
    // A dim with neither dim_value nor dim_param.
    let g = m.graph.as_mut().unwrap();
    if let Some(TypeValue::Tensor(t)) = g.input[0].r#type.as_mut().unwrap().value.as_mut() {
        t.shape.as_mut().unwrap().dim.insert(
            0,
            Dimension {
                value: None,
                denotation: String::new(),
            },
        );
    }
    g.node[0].input = vec!["x".into(), "w".into()];
    g.initializer = vec![
        raw_f32("w", &[4, 2], &[1.0; 8]),
        raw_f32("b", &[2], &[0.5, -0.5]),
    ];
    let model = load(&m);
    let imported = import(&model).unwrap();
    let graph = &imported.graph;
    assert_eq!(imported.inputs.len(), 1);
    let x = graph.node(imported.inputs[0].node);
    assert_eq!(x.label, "x");
    let Op::Input(Input { dims, .. }) = &x.op else {
        panic!("{:?}", x.op)
    };
    assert_eq!(dims, &[Dim::sym("x:0"), Dim::sym("batch"), Dim::Fixed(4)]);
    // The weight's constant is a view of the bytes the model was decoded from.
    let w = graph.find("w").unwrap();
    let Op::Constant(c) = &graph.node(w).op else {
        panic!("w is not a constant")
    };
    let init = model.graph.initializer("w").unwrap().tensor().unwrap();
    assert_eq!(c.data.bytes().as_ptr(), init.bytes().unwrap().as_ptr());
    assert_eq!(imported.outputs[0].name, "y");
    assert_eq!(graph.node(imported.outputs[0].node).label, "y");
    let shapes = graph
        .infer_shapes(&bindings(&[("x:0", 3), ("batch", 5)]))
        .unwrap();
    assert_eq!(
        shapes.shapes[imported.outputs[0].node.index()],
        Shape::new(vec![3, 5, 2])
    );
}

/// `x [batch, seq, 8]` reshaped to `[batch, seq * 2, 4]` through a shape chain:
/// Shape → Gather([0, 1]) → Slice / Mul → Concat → Reshape.
fn shape_chain_model() -> ModelProto {
    let mut m = model_of(
        vec![
            node("Shape", "shape", &["x"], &["s"]),
            node("Gather", "bs", &["s", "i01"], &["b_s"]),
            node("Mul", "double", &["b_s", "k12"], &["b_2s"]),
            node("Concat", "target", &["b_2s", "four"], &["t"]),
            node("Reshape", "reshape", &["x", "t"], &["y"]),
        ],
        vec![value("x", 1, &["batch", "seq", "8"])],
        &["y"],
    );
    let mut cat = attr("axis", attribute_type::INT);
    cat.i = Some(0);
    let g = m.graph.as_mut().unwrap();
    g.node[3].attribute.push(cat);
    g.initializer = vec![
        i64s("i01", &[2], &[0, 1]),
        i64s("k12", &[2], &[1, 2]),
        i64s("four", &[1], &[4]),
    ];
    m
}

#[test]
fn shape_chains_are_shape_only_and_computed_on_the_host() {
    let imported = import(&load(&shape_chain_model())).unwrap();
    let g = &imported.graph;
    for label in ["s", "b_s", "b_2s", "t", "i01", "k12", "four"] {
        let id = g.find(label).unwrap_or_else(|| panic!("no node {label}"));
        assert!(g.is_shape_only(id), "{label} should stay on the host");
    }
    let y = imported.outputs[0].node;
    assert!(!g.is_shape_only(y));
    let shapes = g
        .infer_shapes(&bindings(&[("batch", 2), ("seq", 3)]))
        .unwrap();
    assert_eq!(shapes.shapes[y.index()], Shape::new(vec![2, 6, 4]));
    assert_eq!(
        shapes.values[g.find("t").unwrap().index()],
        Some(vec![2, 6, 4])
    );
    // The CPU reference recomputes the chain its own way and agrees with the host values.
    let x = crate::graph::reference::RefTensor::from_f32(
        Shape::new(vec![2, 3, 8]),
        DType::F32,
        (0..48).map(|v| v as f32).collect(),
    );
    let out = crate::graph::reference::evaluate_tensors(g, &[("x", x)]).unwrap();
    assert_eq!(out[y.index()].shape, Shape::new(vec![2, 6, 4]));
}

#[test]
fn malformed_graphs_are_errors_naming_the_node() {
    // Fixed shapes that do not broadcast.
    let mut m = model_of(
        vec![node("Add", "bad_add", &["x", "z"], &["y"])],
        vec![value("x", 1, &["2", "3"]), value("z", 1, &["4"])],
        &["y"],
    );
    let err = import(&load(&m)).unwrap_err();
    assert!(
        matches!(&err, ImportError::Infer { node, .. } if node == "bad_add"),
        "{err}"
    );
    assert!(
        err.to_string().contains("cannot broadcast 2x3 with 4"),
        "{err}"
    );
    // With a symbol the same graph may be valid for some binding: the error waits for a run.
    m.graph.as_mut().unwrap().input[0] = value("x", 1, &["2", "n"]);
    assert!(import(&load(&m)).is_ok());
    // A type the op does not take, named.
    let m = model_of(
        vec![node("Sqrt", "root", &["x"], &["y"])],
        vec![value("x", 6, &["2"])],
        &["y"],
    );
    let err = import(&load(&m)).unwrap_err();
    assert!(
        matches!(&err, ImportError::NodeDType { node, got: DType::I32, .. } if node == "root"),
        "{err}"
    );
    // A type dynrt does not hold, named.
    let m = model_of(
        vec![node("Relu", "r", &["x"], &["y"])],
        vec![value("x", 11, &["2"])],
        &["y"],
    );
    assert!(matches!(
        import(&load(&m)).unwrap_err(),
        ImportError::UnsupportedDType { value, dtype: TensorDType::F64 } if value == "x"
    ));
    // A required attribute missing.
    let m = model_of(
        vec![node("Cast", "c", &["x"], &["y"])],
        vec![value("x", 1, &["2"])],
        &["y"],
    );
    let err = import(&load(&m)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "node `c` (Cast): attribute `to` is required"
    );
}

#[test]
fn outputs_that_alias_get_their_own_node() {
    let mut m = model_of(
        vec![
            node("Identity", "id", &["x"], &["y"]),
            node("Constant", "c", &[], &["k"]),
        ],
        vec![value("x", 9, &["3"])],
        &["y", "k"],
    );
    let mut v = attr("value_ints", attribute_type::INTS);
    v.ints = vec![1, 2];
    m.graph.as_mut().unwrap().node[1].attribute.push(v);
    let imported = import(&load(&m)).unwrap();
    let g = &imported.graph;
    for (o, dtype) in imported.outputs.iter().zip([DType::Bool, DType::I64]) {
        let n = g.node(o.node);
        assert_eq!(n.label, o.name);
        assert!(matches!(n.op, Op::Identity(_)), "{:?}", n.op);
        assert_eq!(o.dtype, dtype);
    }
}

/// An int8 weight of `dims` as the exports store it (`data_type` 3, raw bytes).
fn raw_i8(name: &str, dims: &[i64], values: &[i8]) -> TensorProto {
    TensorProto {
        name: name.to_string(),
        data_type: 3,
        dims: dims.to_vec(),
        raw_data: Some(bytes::Bytes::from(
            values.iter().map(|&v| v as u8).collect::<Vec<u8>>(),
        )),
        ..Default::default()
    }
}

/// `x [n, 64] @ (f32(wq) * ws)` then `@ w2` (f32), and rows of `f32(tq) * ts` gathered by
/// `ids`: the dequantized int8 weight becomes a `q8_nb` weight of a `linear`, the table one
/// f32 constant, the f32 weight a transposed `linear` weight when asked, and every value
/// stays what the graph computed.
#[test]
fn int8_weights_dequantized_in_the_graph_become_linear_weights_once() {
    let (k, n, rows, width) = (64usize, 8usize, 10usize, 32usize);
    let wq: Vec<i8> = (0..k * n)
        .map(|i| ((i * 37 % 255) as i32 - 127) as i8)
        .collect();
    let ws: Vec<f32> = (0..n).map(|j| 0.01 + 0.003 * j as f32).collect();
    let tq: Vec<i8> = (0..rows * width)
        .map(|i| ((i * 11 % 200) as i32 - 100) as i8)
        .collect();
    let ts: Vec<f32> = (0..rows).map(|r| 0.02 - 0.001 * r as f32).collect();
    let w2: Vec<f32> = (0..n * 4).map(|i| (i as f32 - 15.0) / 8.0).collect();
    let cast = |name: &str, from: &str, to: &str| {
        let mut c = node("Cast", name, &[from], &[to]);
        let mut a = attr("to", attribute_type::INT);
        a.i = Some(1);
        c.attribute.push(a);
        c
    };
    let mut m = model_of(
        vec![
            cast("cw", "wq", "wf"),
            node("Mul", "mw", &["wf", "ws"], &["w"]),
            node("MatMul", "mm", &["x", "w"], &["xw"]),
            node("MatMul", "mm2", &["xw", "w2"], &["y"]),
            cast("ct", "tq", "tf"),
            node("Mul", "mt", &["ts", "tf"], &["table"]),
            node("Gather", "g", &["table", "ids"], &["e"]),
        ],
        vec![value("x", 1, &["b", "64"]), value("ids", 7, &["s"])],
        &["y", "e"],
    );
    m.graph.as_mut().unwrap().initializer = vec![
        raw_i8("wq", &[k as i64, n as i64], &wq),
        raw_f32("ws", &[1, n as i64], &ws),
        raw_i8("tq", &[rows as i64, width as i64], &tq),
        raw_f32("ts", &[rows as i64, 1], &ts),
        raw_f32("w2", &[n as i64, 4], &w2),
    ];
    let model = load(&m);
    let ops = |g: &Graph| -> Vec<(String, &'static str, DType)> {
        g.nodes()
            .iter()
            .map(|n| (n.label.clone(), n.op.name(), n.dtype))
            .collect()
    };
    let imported = import(&model).unwrap();
    let plain = ops(&imported.graph);
    // The int8 weight is a q8_nb [N, K] constant read by a linear; the table one f32
    // constant; no cast, no int8 constant, no scale is left; the f32 MatMul stays.
    assert!(
        plain.contains(&("w".into(), "constant", DType::Q8_NB)),
        "{plain:?}"
    );
    assert!(
        plain.contains(&("xw".into(), "linear", DType::F32)),
        "{plain:?}"
    );
    assert!(
        plain.contains(&("table".into(), "constant", DType::F32)),
        "{plain:?}"
    );
    assert!(
        plain.contains(&("y".into(), "matmul", DType::F32)),
        "{plain:?}"
    );
    assert!(
        plain
            .iter()
            .all(|(l, op, d)| *op != "cast" && *d != DType::I8 && l != "ws"),
        "{plain:?}"
    );
    let (linear, report) = linear_weights(imported.clone(), true).unwrap();
    assert_eq!(
        (report.f32_weights, report.linears, report.q8_weights),
        (1, 1, 0)
    );
    let all = ops(&linear.graph);
    assert!(all.contains(&("y".into(), "linear", DType::F32)), "{all:?}");
    let w2_node = linear.graph.node(linear.graph.find("w2").unwrap());
    assert_eq!(w2_node.op.name(), "constant");

    // Values: what the ONNX graph computes, in f64 from the same f32 products.
    let b = 3usize;
    let x: Vec<f32> = (0..b * k)
        .map(|i| ((i * 13 % 29) as f32 - 14.0) / 7.0)
        .collect();
    let ids = [3f32, 0.0, 9.0, 3.0];
    let w: Vec<f32> = (0..k * n).map(|i| f32::from(wq[i]) * ws[i % n]).collect();
    let mut want_y = vec![0f64; b * 4];
    for r in 0..b {
        let xw: Vec<f64> = (0..n)
            .map(|j| {
                (0..k)
                    .map(|i| f64::from(x[r * k + i]) * f64::from(w[i * n + j]))
                    .sum()
            })
            .collect();
        for c in 0..4 {
            want_y[r * 4 + c] = (0..n).map(|j| xw[j] * f64::from(w2[j * 4 + c])).sum();
        }
    }
    let (tq, ts) = (&tq, &ts);
    let want_e: Vec<f32> = ids
        .iter()
        .flat_map(|&r| {
            let r = r as usize;
            (0..width).map(move |c| f32::from(tq[r * width + c]) * ts[r])
        })
        .collect();
    for g in [&imported.graph, &linear.graph] {
        let out = crate::graph::reference::evaluate(
            g,
            &[
                ("x", Shape::new(vec![b as u64, k as u64]), x.clone()),
                ("ids", Shape::new(vec![ids.len() as u64]), ids.to_vec()),
            ],
        )
        .unwrap();
        assert_eq!(out[0].0, Shape::new(vec![b as u64, 4]));
        for (got, want) in out[0].1.iter().zip(&want_y) {
            assert!(
                (f64::from(*got) - want).abs() <= 1e-4 * want.abs().max(1.0),
                "{got} {want}"
            );
        }
        assert_eq!(
            out[1].1, want_e,
            "the gathered rows are the graph's products"
        );
    }
}
