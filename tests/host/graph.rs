//! Graph IR: structure errors, symbolic binding, shape inference of every op (and its errors),
//! shape-data dependencies, and the CPU evaluator on small graphs. No GPU needed.

use dynrt::graph::{
    ops::{self, MASK_VALUE},
    reference, Bindings, Dim, Graph, GraphBuilder, GraphError, Node, NodeId, Op, Position,
};
use dynrt::shape::{DType, Shape};

fn s(d: &[u64]) -> Shape {
    Shape::new(d.to_vec())
}

fn bind(pairs: &[(&str, u64)]) -> Bindings {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

fn node(label: &str, op: Op, inputs: &[u32]) -> Node {
    Node {
        label: label.into(),
        op,
        inputs: inputs.iter().map(|&i| NodeId(i)).collect(),
        dtype: DType::F32,
    }
}

#[test]
fn cycles_dangling_inputs_and_duplicates_are_named() {
    let x = Op::Input(ops::Input {
        dims: vec![Dim::Fixed(2)],
        dtype: DType::F32,
    });
    let e = Graph::from_nodes(
        vec![
            node("x", x.clone(), &[]),
            node("a", Op::Softmax(ops::Softmax::LAST), &[2]),
            node("b", Op::Softmax(ops::Softmax::LAST), &[1]),
        ],
        vec![],
    )
    .unwrap_err();
    assert_eq!(e, GraphError::Cycle { node: "a".into() });
    let e = Graph::from_nodes(
        vec![
            node("x", x.clone(), &[]),
            node("a", Op::Softmax(ops::Softmax::LAST), &[7]),
        ],
        vec![],
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "node `a` has input n7 which is not a node of the graph"
    );
    let e = Graph::from_nodes(
        vec![
            node("x", x.clone(), &[]),
            node("x", Op::Softmax(ops::Softmax::LAST), &[0]),
        ],
        vec![],
    )
    .unwrap_err();
    assert!(matches!(e, GraphError::DuplicateLabel { .. }));
    let e = Graph::from_nodes(
        vec![
            node("x", x, &[]),
            node("m", Op::MatMul(ops::MatMul { transpose_b: false }), &[0]),
        ],
        vec![],
    )
    .unwrap_err();
    assert!(matches!(e, GraphError::Arity { got: 1, min: 2, .. }), "{e}");
}

#[test]
fn processing_order_puts_inputs_first() {
    // Nodes listed out of order: 0 uses 2, 2 uses 1.
    let g = Graph::from_nodes(
        vec![
            node("relu", Op::Unary(dynrt::graph::UnaryOp::Relu), &[2]),
            node(
                "x",
                Op::Input(ops::Input {
                    dims: vec![Dim::Fixed(2)],
                    dtype: DType::F32,
                }),
                &[],
            ),
            node("sm", Op::Softmax(ops::Softmax::LAST), &[1]),
        ],
        vec![NodeId(0)],
    )
    .unwrap();
    assert_eq!(g.order(), &[NodeId(1), NodeId(2), NodeId(0)]);
    let (inputs, is_output) = g.dag_in_order();
    assert_eq!(inputs, vec![vec![], vec![Position(0)], vec![Position(1)]]);
    assert_eq!(is_output, vec![false, false, true]);
    let dg = g.dep_graph();
    assert_eq!(dg.inputs, inputs);
    assert_eq!(dg.is_output, is_output);
}

#[test]
fn symbols_bind_and_conflicts_are_reported() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[Dim::sym("seq"), Dim::Fixed(4)], DType::F32);
    let y = b.input("y", &[Dim::sym("seq"), Dim::Fixed(4)], DType::F32);
    let z = b.add("z", x, y);
    b.output(z);
    let g = b.build().unwrap();
    let (a, c) = (s(&[3, 4]), s(&[5, 4]));
    assert_eq!(
        g.bind(&[("x", &a), ("y", &a)]).unwrap(),
        bind(&[("seq", 3)])
    );
    let e = g.bind(&[("x", &a), ("y", &c)]).unwrap_err();
    assert!(
        e.to_string()
            .contains("symbol `seq` is 3 elsewhere, 5 here"),
        "{e}"
    );
    let e = g.bind(&[("x", &s(&[3, 5])), ("y", &a)]).unwrap_err();
    assert!(matches!(e, GraphError::InputShape { .. }));
    assert!(matches!(
        g.bind(&[("x", &a)]).unwrap_err(),
        GraphError::MissingInput { .. }
    ));
    assert!(matches!(
        g.bind(&[("q", &a)]).unwrap_err(),
        GraphError::UnknownInput { .. }
    ));
    let e = g.infer_shapes(&Bindings::new()).unwrap_err();
    assert!(matches!(e, GraphError::UnboundSymbol { .. }));
    let shapes = g.infer_shapes(&bind(&[("seq", 7)])).unwrap();
    assert_eq!(shapes.shapes[z.index()], s(&[7, 4]));
}

/// One op on f32 inputs of the given shapes: the inferred shape, or the error text.
fn infer_one(op: Op, shapes: &[&[u64]]) -> Result<Shape, String> {
    let mut b = GraphBuilder::new();
    let ins: Vec<NodeId> = shapes
        .iter()
        .enumerate()
        .map(|(i, d)| {
            b.input(
                format!("in{i}"),
                &d.iter().map(|&v| Dim::Fixed(v)).collect::<Vec<_>>(),
                DType::F32,
            )
        })
        .collect();
    let n = b.node("the_op", op, &ins);
    b.output(n);
    let g = b.build().map_err(|e| e.to_string())?;
    g.infer_shapes(&Bindings::new())
        .map(|r| r.shapes[n.index()].clone())
        .map_err(|e| e.to_string())
}

#[test]
fn every_op_infers_and_reports_both_shapes() {
    use dynrt::graph::{BinaryOp, UnaryOp};
    assert_eq!(
        infer_one(
            Op::MatMul(ops::MatMul { transpose_b: false }),
            &[&[2, 1, 3, 4], &[5, 4, 6]]
        ),
        Ok(s(&[2, 5, 3, 6]))
    );
    assert_eq!(
        infer_one(
            Op::MatMul(ops::MatMul { transpose_b: true }),
            &[&[3, 4], &[6, 4]]
        ),
        Ok(s(&[3, 6]))
    );
    let e = infer_one(
        Op::MatMul(ops::MatMul { transpose_b: false }),
        &[&[3, 4], &[5, 6]],
    )
    .unwrap_err();
    assert_eq!(
        e,
        "node `the_op` (matmul): matmul inner dimensions differ: 3x4 vs 5x6"
    );
    for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div] {
        assert_eq!(
            infer_one(Op::Binary(op), &[&[2, 1, 4], &[3, 1]]),
            Ok(s(&[2, 3, 4]))
        );
        let e = infer_one(Op::Binary(op), &[&[2, 3], &[4]]).unwrap_err();
        assert!(
            e.contains("the_op") && e.contains("cannot broadcast 2x3 with 4"),
            "{e}"
        );
    }
    for op in [UnaryOp::Relu, UnaryOp::Gelu, UnaryOp::Silu, UnaryOp::Exp] {
        assert_eq!(infer_one(Op::Unary(op), &[&[0, 3]]), Ok(s(&[0, 3])));
    }
    assert_eq!(
        infer_one(Op::Softmax(ops::Softmax::LAST), &[&[2, 5]]),
        Ok(s(&[2, 5]))
    );
    assert!(infer_one(Op::Softmax(ops::Softmax::LAST), &[&[]]).is_err());
    assert_eq!(
        infer_one(
            Op::LayerNorm(ops::LayerNorm {
                eps: 1e-5,
                axis: -1
            }),
            &[&[2, 8], &[8], &[8]]
        ),
        Ok(s(&[2, 8]))
    );
    assert!(infer_one(
        Op::LayerNorm(ops::LayerNorm {
            eps: 1e-5,
            axis: -1
        }),
        &[&[2, 8], &[8], &[7]]
    )
    .unwrap_err()
    .contains("2x8 vs 7"));
    assert_eq!(
        infer_one(
            Op::RmsNorm(ops::RmsNorm {
                eps: 1e-5,
                axis: -1
            }),
            &[&[2, 8], &[8]]
        ),
        Ok(s(&[2, 8]))
    );
    assert!(infer_one(
        Op::RmsNorm(ops::RmsNorm {
            eps: 1e-5,
            axis: -1
        }),
        &[&[2, 8], &[2, 8]]
    )
    .is_err());
    assert_eq!(
        infer_one(
            Op::Reshape(ops::Reshape {
                target: vec![0, -1]
            }),
            &[&[2, 3, 4]]
        ),
        Ok(s(&[2, 12]))
    );
    assert!(infer_one(
        Op::Reshape(ops::Reshape {
            target: vec![5, -1]
        }),
        &[&[2, 3, 4]]
    )
    .unwrap_err()
    .contains("cannot reshape 2x3x4"));
    assert_eq!(
        infer_one(
            Op::Transpose(ops::Transpose {
                perm: vec![1, 0, 2]
            }),
            &[&[2, 3, 4]]
        ),
        Ok(s(&[3, 2, 4]))
    );
    assert!(infer_one(
        Op::Transpose(ops::Transpose {
            perm: vec![1, 1, 2]
        }),
        &[&[2, 3, 4]]
    )
    .is_err());
    assert_eq!(
        infer_one(
            Op::Concat(ops::Concat { axis: 2 }),
            &[&[1, 2, 3], &[1, 2, 5], &[1, 2, 0]]
        ),
        Ok(s(&[1, 2, 8]))
    );
    assert!(infer_one(
        Op::Concat(ops::Concat { axis: 2 }),
        &[&[1, 2, 3], &[1, 3, 5]]
    )
    .unwrap_err()
    .contains("1x2x3 vs 1x3x5"));
    assert!(infer_one(Op::Concat(ops::Concat { axis: 3 }), &[&[1, 2, 3]]).is_err());
    let sl = Op::Slice(ops::Slice {
        axes: vec![1],
        starts: vec![-2],
        ends: vec![i64::MAX],
        steps: vec![1],
    });
    assert_eq!(infer_one(sl, &[&[4, 6]]), Ok(s(&[4, 2])));
    // A negative step walks backwards (ONNX): from 0 down to 4 is nothing, from 3 down to
    // the start is all 4 rows; a zero step is an error.
    let back = |start, end, step| {
        Op::Slice(ops::Slice {
            axes: vec![0],
            starts: vec![start],
            ends: vec![end],
            steps: vec![step],
        })
    };
    assert_eq!(infer_one(back(0, 4, -1), &[&[4, 6]]), Ok(s(&[0, 6])));
    assert_eq!(infer_one(back(3, i64::MIN, -1), &[&[4, 6]]), Ok(s(&[4, 6])));
    assert!(infer_one(back(0, 4, 0), &[&[4, 6]])
        .unwrap_err()
        .contains("steps must not be 0"));
    assert_eq!(
        infer_one(Op::CausalMask(ops::CausalMask), &[&[2, 1, 9]]),
        Ok(s(&[2, 1, 9]))
    );
    assert!(infer_one(Op::CausalMask(ops::CausalMask), &[&[2, 9, 1]])
        .unwrap_err()
        .contains("keys >= queries"));
    assert_eq!(
        infer_one(Op::ShapeOf(ops::ShapeOf::default()), &[&[2, 9, 1]]),
        Ok(s(&[3]))
    );
    assert_eq!(
        infer_one(Op::Where(ops::Where), &[&[1, 4], &[3, 1], &[4]]),
        Ok(s(&[3, 4]))
    );
    assert!(infer_one(Op::Where(ops::Where), &[&[2, 4], &[3, 1], &[4]]).is_err());
    // Gather wants integer ids: f32 ids are a dtype error naming the node.
    let e = infer_one(Op::Gather(ops::Gather::default()), &[&[10, 4], &[3]]).unwrap_err();
    assert!(e.contains("node `the_op` input 1 is f32"), "{e}");
}

#[test]
fn gather_with_integer_ids() {
    let mut b = GraphBuilder::new();
    let table = b.constant("wte", s(&[5, 2]), (0..10).map(|v| v as f32).collect());
    let ids = b.input("ids", &[Dim::sym("seq")], DType::I32);
    let e = b.gather("emb", table, ids);
    b.output(e);
    let g = b.build().unwrap();
    let out = reference::evaluate(&g, &[("ids", s(&[3]), vec![4.0, 0.0, -1.0])]).unwrap();
    assert_eq!(out[0].0, s(&[3, 2]));
    assert_eq!(out[0].1, vec![8., 9., 0., 1., 8., 9.]);
    // Out of range is an error naming the node (ONNX's rule), not zeros.
    let e = reference::evaluate(&g, &[("ids", s(&[3]), vec![4.0, 0.0, 7.0])]).unwrap_err();
    assert!(e.to_string().contains("`emb`"), "{e}");
    assert!(e.to_string().contains("index 7"), "{e}");
}

#[test]
fn shape_of_feeds_reshape_through_host_values() {
    // Split heads: x [seq, 8] -> [seq, 2, 4] using shape_of(x)[0] concatenated with constants.
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[Dim::sym("seq"), Dim::Fixed(8)], DType::F32);
    let shp = b.shape_of("shape", x);
    let seq = b.slice("seq_dim", shp, &[0], &[0], &[1], &[1]);
    let heads = b.constant_i32("heads", s(&[2]), &[2, 4]);
    let target = b.concat("target", &[seq, heads], 0);
    let y = b.reshape_to("split", x, target);
    b.output(y);
    let g = b.build().unwrap();
    assert_eq!(
        Op::ReshapeTo(ops::ReshapeTo::default()).shape_data_inputs(),
        &[1]
    );
    assert!(
        g.is_shape_only(shp)
            && g.is_shape_only(target)
            && !g.is_shape_only(y)
            && !g.is_shape_only(x)
    );
    assert!(g.is_shape_only(seq) && g.is_shape_only(heads));
    let r = g.infer_shapes(&bind(&[("seq", 5)])).unwrap();
    assert_eq!(r.shapes[y.index()], s(&[5, 2, 4]));
    assert_eq!(r.values[target.index()], Some(vec![5, 2, 4]));
    assert_eq!(r.values[y.index()], None);
    let r = g.infer_shapes(&bind(&[("seq", 9)])).unwrap();
    assert_eq!(r.shapes[y.index()], s(&[9, 2, 4]));
    // Without host values (a reshape fed by a network input) inference says which input.
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[Dim::Fixed(8)], DType::F32);
    let t = b.input("t", &[Dim::Fixed(2)], DType::I32);
    let y = b.reshape_to("r", x, t);
    b.output(y);
    let e = b
        .build()
        .unwrap()
        .infer_shapes(&Bindings::new())
        .unwrap_err();
    assert!(
        e.to_string().contains("values of input 1 are needed"),
        "{e}"
    );
}

#[test]
fn integer_tensors_read_by_dispatched_nodes_are_not_shape_only() {
    // Constant ids feed a gather whose result only reaches a shape_of: the gather is f32, so it
    // is still dispatched, and the ids it reads must stay on the device.
    let mut b = GraphBuilder::new();
    let table = b.constant("table", s(&[4, 2]), vec![0.0; 8]);
    let ids = b.constant_i32("ids", s(&[3]), &[0, 1, 2]);
    let rows = b.gather("rows", table, ids);
    let shp = b.shape_of("shape", rows);
    let x = b.input("x", &[Dim::Fixed(6)], DType::F32);
    let y = b.reshape_to("y", x, shp);
    b.output(y);
    let g = b.build().unwrap();
    assert!(g.is_shape_only(shp));
    assert!(!g.is_shape_only(rows) && !g.is_shape_only(ids));
    let r = g.infer_shapes(&Bindings::new()).unwrap();
    assert_eq!(r.shapes[y.index()], s(&[3, 2]));
}

#[test]
fn causal_mask_decode_sees_the_whole_past() {
    // Scores [heads=1, S, P+S]: prefill (P=0,S=3) then decode (P=3,S=1).
    let mut b = GraphBuilder::new();
    let x = b.input(
        "scores",
        &[Dim::Fixed(1), Dim::sym("seq"), Dim::sym("keys")],
        DType::F32,
    );
    let m = b.causal_mask("mask", x);
    let p = b.softmax("probs", m);
    b.output(p);
    let g = b.build().unwrap();
    let out = reference::evaluate(&g, &[("scores", s(&[1, 3, 3]), vec![0.0; 9])]).unwrap();
    let third = 1.0f32 / 3.0;
    let want = [1.0, 0.0, 0.0, 0.5, 0.5, 0.0, third, third, third];
    assert!(
        out[0].1.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-6),
        "{:?}",
        out[0].1
    );
    let out = reference::evaluate(&g, &[("scores", s(&[1, 1, 4]), vec![0.0; 4])]).unwrap();
    assert!(out[0].1.iter().all(|&v| (v - 0.25).abs() < 1e-6));
    let all = reference::evaluate_all(&g, &[("scores", s(&[1, 2, 4]), vec![0.0; 8])]).unwrap();
    assert_eq!(
        all[m.index()].1,
        vec![0., 0., 0., MASK_VALUE, 0., 0., 0., 0.]
    );
}

#[test]
fn evaluator_checks_input_lengths_and_byte_sizes_overflow() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[Dim::sym("n")], DType::F32);
    let y = b.relu("y", x);
    b.output(y);
    let g = b.build().unwrap();
    let e = reference::evaluate(&g, &[("x", s(&[3]), vec![1.0])]).unwrap_err();
    assert!(
        matches!(
            e,
            GraphError::DataLength {
                expected: 3,
                got: 1,
                ..
            }
        ),
        "{e}"
    );
    let r = g.infer_shapes(&bind(&[("n", u64::MAX)])).unwrap();
    assert!(r.shapes[y.index()].size_bytes(DType::F32).is_err());
    let mut b = GraphBuilder::new();
    b.constant("w", s(&[2, 2]), vec![1.0; 3]);
    assert!(matches!(
        b.build().unwrap_err(),
        GraphError::ConstantLength { .. }
    ));
}

#[test]
fn dtype_rules_refuse_at_build_time_naming_the_node_and_constants_keep_their_bits() {
    use dynrt::tensor::ConstData;
    // Float maths on f16 or mixed types is refused when the graph is built.
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[Dim::Fixed(2), Dim::Fixed(2)], DType::F16);
    let w = b.constant("w", s(&[2, 2]), vec![1.0; 4]);
    b.matmul("mm", x, w, false);
    let e = b.build().unwrap_err();
    assert!(
        matches!(&e, GraphError::DType { node, input: 0, got: DType::F16, .. } if node == "mm"),
        "{e}"
    );
    let mut b = GraphBuilder::new();
    let i = b.input("i", &[Dim::Fixed(2)], DType::I32);
    let f = b.input("f", &[Dim::Fixed(2)], DType::F32);
    b.add("mixed", i, f);
    assert!(b.build().unwrap_err().to_string().contains("node `mixed`"));
    // A constant's byte length must match its type: 3 i64 values are 24 bytes.
    let mut b = GraphBuilder::new();
    b.constant_bytes("c", s(&[3]), DType::I64, ConstData::from_i32(&[1, 2, 3]));
    assert!(matches!(
        b.build().unwrap_err(),
        GraphError::ConstantLength {
            expected: 24,
            got: 12,
            ..
        }
    ));
    // i64 constants keep values beyond f32's exact range; the reference and the host
    // evaluator both see them exactly.
    let big = (1i64 << 40) + 1;
    let mut b = GraphBuilder::new();
    let c = b.constant_bytes("c", s(&[2]), DType::I64, ConstData::from_i64(&[big, 3]));
    let two = b.constant_bytes("two", s(&[1]), DType::I64, ConstData::from_i64(&[2]));
    let m = b.mul("m", c, two);
    b.output(m);
    let g = b.build().unwrap();
    let r = g.infer_shapes(&Bindings::new()).unwrap();
    assert_eq!(r.values[m.index()], Some(vec![2 * big, 6]));
    let all = reference::evaluate_tensors(&g, &[]).unwrap();
    assert_eq!(
        all[m.index()].values,
        reference::Values::Int(vec![2 * big, 6])
    );
    // f16 constants are 2 bytes per element, decoded exactly by the reference.
    let halves = dynrt::tensor::encode_f32(DType::F16, &[0.5, -2.0]).unwrap();
    assert_eq!(halves.len(), 4);
    let mut b = GraphBuilder::new();
    let h = b.constant_bytes("h", s(&[2]), DType::F16, ConstData::from_vec(halves));
    b.output(h);
    let g = b.build().unwrap();
    let out = reference::evaluate(&g, &[]).unwrap();
    assert_eq!(out[0].1, vec![0.5, -2.0]);
}

#[test]
fn host_values_and_the_reference_agree_on_shape_chains() {
    // shape_of -> slice -> reshape_to: the host evaluator feeds shape inference and the
    // reference recomputes the same integers independently; they agree on a correct graph.
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[Dim::sym("n"), Dim::Fixed(4)], DType::F32);
    let shp = b.shape_of("shape", x);
    let rev = b.slice("last", shp, &[0], &[1], &[2], &[1]);
    let n = b.slice("first", shp, &[0], &[0], &[1], &[1]);
    let t = b.concat("t", &[rev, n], 0);
    let y = b.reshape_to("y", x, t);
    b.output(y);
    let g = b.build().unwrap();
    let all = reference::evaluate_tensors(
        &g,
        &[(
            "x",
            reference::RefTensor::from_f32(s(&[3, 4]), DType::F32, vec![0.0; 12]),
        )],
    )
    .unwrap();
    assert_eq!(all[y.index()].shape, s(&[4, 3]));
    assert_eq!(all[t.index()].values, reference::Values::Int(vec![4, 3]));
}
