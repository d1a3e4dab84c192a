//! Hostile ONNX models, generated here ([`models`]): a node with a huge number of inputs
//! (imported in time linear in its size, refused past the importer's limit) and gathers with
//! indices out of range, which are a typed error naming the node whether the host sees the
//! indices (fed, or in a shape subgraph) or only the device does (computed by a kernel), the
//! session staying usable for the next run.

pub mod models;

use bytes::Bytes;
use dynrt::gpu::{testing, Engine};
use dynrt::graph::ops::InferError;
use dynrt::graph::{reference, GraphError, Op};
use dynrt::onnx::external::NoExternalData;
use dynrt::onnx::import::MAX_NODE_INPUTS;
use dynrt::onnx::{
    import, HostTensor, ImportError, LoadOptions, OnnxFile, OnnxSession, SessionError,
    SessionOptions, TensorData,
};
use dynrt::runtime::RunError;
use models::{Indices, COLS, ROWS};
use std::time::{Duration, Instant};

fn load(bytes: Vec<u8>) -> OnnxFile {
    OnnxFile::from_bytes(Bytes::from(bytes), &NoExternalData, &LoadOptions::default())
        .expect("the generated model loads")
}

fn session(engine: &Engine, bytes: Vec<u8>) -> OnnxSession {
    OnnxSession::from_bytes(
        engine,
        Bytes::from(bytes),
        &NoExternalData,
        &SessionOptions::default(),
    )
    .expect("the session compiles")
}

fn f32s(t: &HostTensor) -> Vec<f32> {
    match t.data() {
        TensorData::Bytes(b) => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        TensorData::Strings(_) => panic!("not f32"),
    }
}

/// The longest chain of nodes from an input to an output of the imported graph.
fn depth(graph: &dynrt::graph::Graph) -> usize {
    let mut d = vec![0usize; graph.len()];
    for &id in graph.order() {
        let node = graph.node(id);
        d[id.index()] = 1 + node.inputs.iter().map(|i| d[i.index()]).max().unwrap_or(0);
    }
    d.into_iter().max().unwrap_or(0)
}

#[test]
fn a_sum_of_100k_inputs_imports_as_a_shallow_tree_in_linear_time() {
    let n = 100_000;
    let bytes = models::sum_of_inputs(n);
    let start = Instant::now();
    let model = load(bytes);
    let imported = import(&model).expect("imports");
    let took = start.elapsed();
    let g = &imported.graph;
    let adds = g
        .nodes()
        .iter()
        .filter(|node| matches!(node.op, Op::Binary(_)))
        .count();
    assert_eq!(adds, n - 1, "one binary add per input but the first");
    assert_eq!(imported.inputs.len(), n);
    // A balanced tree: 17 levels of adds for 100k inputs, where a chain had 99 999.
    let levels = depth(g);
    assert!(levels <= 20, "the sum is {levels} nodes deep");
    // Linear, not a timing target (that is the report's): against a tenth of the inputs
    // loaded and imported on the same machine just after, so that its load cancels out. Ten
    // times the inputs take about ten times as long in linear time and a hundred times in
    // the quadratic import (which took 22 s); the best of three tenths is the least loaded.
    let tenth = (0..3)
        .map(|_| {
            let start = Instant::now();
            import(&load(models::sum_of_inputs(n / 10))).expect("imports");
            start.elapsed()
        })
        .min()
        .unwrap_or_default()
        .max(Duration::from_millis(5));
    assert!(
        took < tenth * 40,
        "loading and importing {n} inputs took {took:?}, a tenth of them {tenth:?}"
    );
}

#[test]
fn a_node_with_more_inputs_than_the_limit_is_refused_before_conversion() {
    let n = MAX_NODE_INPUTS + 1;
    let model = load(models::sum_of_one_input(n));
    let err = import(&model).unwrap_err();
    assert!(
        matches!(
            &err,
            ImportError::TooManyInputs { node, op_type, inputs, max }
                if node == "sum" && op_type == "Sum" && *inputs == n && *max == MAX_NODE_INPUTS
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().contains(&MAX_NODE_INPUTS.to_string()),
        "{err}"
    );
    // At the limit it imports.
    let model = load(models::sum_of_one_input(MAX_NODE_INPUTS));
    let imported = import(&model).expect("at the limit");
    assert!(depth(&imported.graph) <= 25);
}

#[test]
fn a_sum_of_1000_inputs_is_computed_on_the_gpu() {
    let n = 1000;
    let Some(gpu) = testing::gpu_or_skip("hostile sum of 1000 inputs") else {
        return;
    };
    let engine = Engine::new(gpu);
    let mut s = session(&engine, models::sum_of_inputs(n));
    // Input i is (i, -2i, i mod 7, 0.5): every partial sum is exact in f32.
    let xs: Vec<HostTensor> = (0..n)
        .map(|i| {
            let i = i as f32;
            HostTensor::from_f32(vec![4], &[i, -2.0 * i, i % 7.0, 0.5]).unwrap()
        })
        .collect();
    let names: Vec<String> = (0..n).map(|i| format!("x{i}")).collect();
    let feeds: Vec<(&str, &HostTensor)> = names.iter().map(String::as_str).zip(&xs).collect();
    let mut want = [0f32; 4];
    for x in &xs {
        for (w, v) in want.iter_mut().zip(f32s(x)) {
            *w += v;
        }
    }
    s.run_blocking(&feeds).unwrap();
    assert_eq!(f32s(&s.read_blocking("y").unwrap()), want);
}

/// The error of a run whose gather met `index`: the node's label is its output's name.
fn assert_out_of_range(err: SessionError, index: i64) {
    let text = err.to_string();
    match err {
        SessionError::Run(RunError::IndexOutOfRange {
            node,
            op,
            index: got,
            bound,
            ..
        }) => {
            assert_eq!(
                (node.as_str(), op, got, bound),
                ("picked", "gather", index, ROWS)
            );
            assert!(
                text.contains("`picked`") && text.contains(&index.to_string()),
                "{text}"
            );
        }
        other => panic!("expected an index out of range, got {other:?}"),
    }
}

/// Rows `ids` of the table (negative from the end).
fn rows(ids: &[i64]) -> Vec<f32> {
    let t = models::table();
    ids.iter()
        .flat_map(|&i| {
            let r = if i < 0 { i + ROWS as i64 } else { i } as usize;
            t[r * COLS as usize..(r + 1) * COLS as usize].to_vec()
        })
        .collect()
}

const BAD: [i64; 5] = [ROWS as i64, -(ROWS as i64) - 1, i64::MAX, i64::MIN, 1 << 40];

#[test]
fn fed_gather_indices_out_of_range_are_an_error_naming_the_node() {
    let bytes = models::gather(Indices::Fed);
    // The CPU reference refuses them too.
    let imported = import(&load(bytes.clone())).unwrap();
    let err = reference::evaluate(
        &imported.graph,
        &[(
            "ids",
            dynrt::shape::Shape::new(vec![2]),
            vec![0.0, ROWS as f32],
        )],
    )
    .unwrap_err();
    assert!(
        matches!(
            &err,
            GraphError::Infer {
                node,
                cause: InferError::IndexOutOfRange { position: 1, index: 5, bound: ROWS, .. },
                ..
            } if node == "picked"
        ),
        "{err:?}"
    );
    let Some(gpu) = testing::gpu_or_skip("hostile fed gather") else {
        return;
    };
    let engine = Engine::new(gpu);
    let mut s = session(&engine, bytes);
    let good = HostTensor::from_i64(vec![2], &[4, -5]).unwrap();
    s.run_blocking(&[("ids", &good)]).unwrap();
    assert_eq!(f32s(&s.read_blocking("picked").unwrap()), rows(&[4, -5]));
    let in_use = engine.device_bytes_in_use();
    for bad in BAD {
        let ids = HostTensor::from_i64(vec![2], &[0, bad]).unwrap();
        assert_out_of_range(s.run_blocking(&[("ids", &ids)]).unwrap_err(), bad);
        assert_eq!(engine.device_bytes_in_use(), in_use, "after index {bad}");
        let ids = HostTensor::from_i64(vec![2], &[2, -1]).unwrap();
        s.run_blocking(&[("ids", &ids)]).unwrap();
        assert_eq!(f32s(&s.read_blocking("picked").unwrap()), rows(&[2, -1]));
    }
    drop(s);
    assert_eq!(
        engine.device_bytes_in_use(),
        0,
        "the session freed everything"
    );
}

#[test]
fn computed_gather_indices_out_of_range_are_an_error_naming_the_node() {
    let Some(gpu) = testing::gpu_or_skip("hostile computed gather") else {
        return;
    };
    let engine = Engine::new(gpu);
    // ids + 1, computed by a kernel.
    let mut s = session(&engine, models::gather(Indices::Added));
    let run = |s: &mut OnnxSession, ids: &[i64]| {
        let t = HostTensor::from_i64(vec![2], ids).unwrap();
        s.run_blocking(&[("ids", &t)])
    };
    run(&mut s, &[3, -6]).unwrap();
    assert_eq!(f32s(&s.read_blocking("picked").unwrap()), rows(&[4, -5]));
    let in_use = engine.device_bytes_in_use();
    for bad in BAD {
        let fed = bad.wrapping_sub(1);
        assert_out_of_range(run(&mut s, &[0, fed]).unwrap_err(), bad);
        assert_eq!(engine.device_bytes_in_use(), in_use, "after index {bad}");
        run(&mut s, &[1, -2]).unwrap();
        assert_eq!(f32s(&s.read_blocking("picked").unwrap()), rows(&[2, -1]));
    }
    drop(s);

    // Floats cast to indices by a kernel.
    let mut s = session(&engine, models::gather(Indices::Cast));
    for (at, bad) in [
        ([1.0, 6.0], Some(6)),
        ([4.0, -5.0], None),
        ([-6.0, 2.0], Some(-6)),
        ([2.0, 3.0], None),
    ] {
        let t = HostTensor::from_f32(vec![2], &at).unwrap();
        let r = s.run_blocking(&[("at", &t)]);
        match bad {
            Some(index) => assert_out_of_range(r.unwrap_err(), index),
            None => {
                r.unwrap();
                let want = rows(&[at[0] as i64, at[1] as i64]);
                assert_eq!(f32s(&s.read_blocking("picked").unwrap()), want);
            }
        }
    }
    drop(s);
    assert_eq!(
        engine.device_bytes_in_use(),
        0,
        "the sessions freed everything"
    );
}

#[test]
fn a_gather_in_a_shape_subgraph_refuses_an_index_out_of_range() {
    let Some(gpu) = testing::gpu_or_skip("hostile shape gather") else {
        return;
    };
    let engine = Engine::new(gpu);
    let mut s = session(&engine, models::gather_in_shape_chain());
    let x =
        HostTensor::from_f32(vec![3, 4], &(0..12).map(|v| v as f32).collect::<Vec<_>>()).unwrap();
    let run = |s: &mut OnnxSession, id: i64| {
        let ids = HostTensor::from_i64(vec![1], &[id]).unwrap();
        s.run_blocking(&[("x", &x), ("ids", &ids)])
    };
    for (id, dims) in [(0, vec![3, 4]), (-1, vec![4, 3]), (1, vec![4, 3])] {
        run(&mut s, id).unwrap();
        assert_eq!(s.read_blocking("y").unwrap().dims(), &dims[..]);
    }
    for bad in [2, -3, i64::MAX] {
        let err = run(&mut s, bad).unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(
                &err,
                SessionError::Run(RunError::Graph(GraphError::Infer {
                    node,
                    cause: InferError::IndexOutOfRange { index, bound: 2, .. },
                    ..
                })) if node == "dim" && *index == bad
            ),
            "{err:?}"
        );
        assert!(text.contains("`dim`"), "{text}");
        run(&mut s, 0).unwrap();
        assert_eq!(s.read_blocking("y").unwrap().dims(), &[3, 4]);
    }
}

/// Load times of growing sums, printed (not asserted: timings belong to benchmarks). Run with
/// `cargo test --release --test hostile -- --ignored --nocapture sum_load_times`;
/// `DYNRT_SUM_INPUTS=10000,100000` picks the sizes.
#[test]
#[ignore]
fn sum_load_times() {
    let sizes: Vec<usize> = std::env::var("DYNRT_SUM_INPUTS")
        .unwrap_or_else(|_| "10000,100000,1000000".into())
        .split(',')
        .map(|s| s.trim().parse().expect("a count"))
        .collect();
    let engine = testing::gpu_or_skip("sum load times").map(Engine::new);
    for n in sizes {
        for (kind, bytes) in [
            ("distinct inputs", models::sum_of_inputs(n)),
            ("one input repeated", models::sum_of_one_input(n)),
        ] {
            let size = bytes.len();
            let t = Instant::now();
            let model = load(bytes.clone());
            let loaded = t.elapsed();
            let t = Instant::now();
            let imported = import(&model);
            let imported_in = t.elapsed();
            let nodes = imported.as_ref().map_or(0, |i| i.graph.len());
            let session = engine.as_ref().map(|e| {
                let t = Instant::now();
                let ok = OnnxSession::from_bytes(
                    e,
                    Bytes::from(bytes),
                    &NoExternalData,
                    &SessionOptions::default(),
                )
                .is_ok();
                (t.elapsed(), ok)
            });
            println!(
                "Sum of {n} ({kind}, {size} bytes): load {loaded:?}, import {imported_in:?} \
                 ({nodes} nodes, {}), session (load + import + compile) {session:?}",
                if imported.is_ok() { "ok" } else { "refused" }
            );
        }
    }
}
