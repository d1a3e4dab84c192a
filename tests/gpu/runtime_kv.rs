//! The in-place KV cache and the copy paths of the runtime on a real adapter: a state that
//! grows by a few rows per step must always read back as exactly the rows appended so far,
//! whatever the policy, the pool and poison.

use dynrt::gpu::{testing, Engine};
use dynrt::graph::{Dim, GraphBuilder};
use dynrt::memory::predictor::Policy;
use dynrt::rng::SplitMix64;
use dynrt::runtime::{
    HostTensor, InferRequest, Network, NetworkOptions, RunError, RunOptions, StateBinding,
    StateRows,
};
use dynrt::shape::{DType, Shape};

const WIDTH: u64 = 6;

/// `present = concat(past, x)` (the state), `flat = reshape(present, [-1])`,
/// `both = concat(x, x)` along axis 0 (a copy-concat that is not a state).
fn network(engine: &Engine) -> Result<Network, RunError> {
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[Dim::sym("seq"), Dim::Fixed(WIDTH)], DType::F32);
    let past = b.input("past", &[Dim::sym("past"), Dim::Fixed(WIDTH)], DType::F32);
    let present = b.concat("present", &[past, x], 0);
    let flat = b.reshape("flat", present, &[-1]);
    let both = b.concat("both", &[x, x], 0);
    b.output(present).output(flat).output(both);
    Network::compile(
        engine,
        b.build()?,
        NetworkOptions {
            states: vec![StateBinding {
                past: "past".into(),
                present: "present".into(),
            }],
            ..NetworkOptions::default()
        },
    )
}

#[test]
fn the_state_reads_back_as_every_row_appended_for_every_memory_option() {
    let Some(gpu) = testing::gpu_or_skip("runtime_kv") else {
        return;
    };
    let mut growths = Vec::new();
    for policy in Policy::ALL {
        for pool in [true, false] {
            for poison in [false, true] {
                let engine = Engine::new(gpu.clone());
                let net = network(&engine).unwrap();
                let mut opts = RunOptions::new(policy);
                opts.pool = pool;
                opts.poison = poison;
                let mut req = InferRequest::new(&net, opts).unwrap();
                let mut rng = SplitMix64::new(11);
                let mut expected: Vec<f32> = Vec::new();
                for step in 0..60 {
                    let seq = if step == 0 { 5 } else { 1 + rng.range(0, 2) };
                    let rows: Vec<f32> = (0..seq * WIDTH).map(|_| rng.uniform(-1.0, 1.0)).collect();
                    let x = HostTensor::f32(Shape::new(vec![seq, WIDTH]), &rows);
                    let out = req
                        .infer_blocking(&[("x", &x)], &["present", "flat", "both"])
                        .unwrap();
                    expected.extend_from_slice(&rows);
                    let what = format!("{policy} pool={pool} poison={poison} step {step}");
                    let t = expected.len() as u64 / WIDTH;
                    assert_eq!(out[0].shape.dims(), &[t, WIDTH], "{what}");
                    assert_eq!(out[0].to_f32(), expected, "{what}: present");
                    assert_eq!(out[1].to_f32(), expected, "{what}: reshape");
                    let mut both = rows.clone();
                    both.extend_from_slice(&rows);
                    assert_eq!(out[2].to_f32(), both, "{what}: concat copy");
                }
                let s = req.stats();
                assert_eq!(s.submits, 60);
                if poison {
                    assert!(s.poison_fills > 0, "poison did nothing");
                }
                growths.push((policy, s.state_growths));
            }
        }
    }
    // Exact allocation grows the cache at every step; the predictors grow it far less often.
    for (policy, g) in growths {
        match policy {
            Policy::None => assert_eq!(g, 59, "none"),
            _ => assert!(g < 20, "{policy}: {g} growths in 60 steps"),
        }
    }
}

/// Rows of a state copied to host memory come back into other rows of it before the next
/// step (what a paged KV cache's offload does); ranges the state does not hold, and host rows
/// of another size, are typed errors that change nothing.
#[test]
fn state_rows_go_to_host_memory_and_back_into_other_rows() {
    let Some(gpu) = testing::gpu_or_skip("runtime_kv") else {
        return;
    };
    let engine = Engine::new(gpu);
    let net = network(&engine).unwrap();
    let mut req = InferRequest::new(&net, RunOptions::new(Policy::None)).unwrap();
    let rows = |first: u64, rows: u64| StateRows {
        state: 0,
        first,
        rows,
    };
    // No rows yet: no buffer to copy from.
    assert!(matches!(
        req.rows_to_host(&[rows(0, 1)]),
        Err(RunError::BadState { .. })
    ));
    let values: Vec<f32> = (0..8 * WIDTH).map(|i| i as f32).collect();
    let x = HostTensor::f32(Shape::new(vec![8, WIDTH]), &values);
    req.infer_blocking(&[("x", &x)], &[]).unwrap();
    let host = req.rows_to_host(&[rows(1, 2), rows(6, 1)]).unwrap();
    assert_eq!(host.size_bytes(), 3 * WIDTH * 4);
    for bad in [
        vec![StateRows {
            state: 1,
            ..rows(0, 1)
        }],
        vec![rows(7, 2)],
        vec![rows(u64::MAX, 2)],
    ] {
        let e = req.rows_to_host(&bad).unwrap_err();
        assert!(matches!(e, RunError::BadState { .. }), "{bad:?}: {e}");
    }
    let e = pollster::block_on(req.rows_from_host(&host, &[rows(0, 2)])).unwrap_err();
    assert!(matches!(e, RunError::BadInput { .. }), "{e}");
    // Rows 1, 2 and 6 into rows 3, 4 and 0; the next step sees them there.
    pollster::block_on(req.rows_from_host(&host, &[rows(3, 2), rows(0, 1)])).unwrap();
    let one = HostTensor::f32(Shape::new(vec![1, WIDTH]), &[0.5; WIDTH as usize]);
    let out = req.infer_blocking(&[("x", &one)], &["present"]).unwrap();
    let row = |r: usize| values[r * WIDTH as usize..(r + 1) * WIDTH as usize].to_vec();
    let mut expected: Vec<f32> = [6, 1, 2, 1, 2, 5, 6, 7]
        .iter()
        .flat_map(|&r| row(r))
        .collect();
    expected.extend([0.5; WIDTH as usize]);
    assert_eq!(out[0].to_f32(), expected);
}

#[test]
fn inputs_that_do_not_fit_the_graph_are_typed_errors_and_the_request_stays_usable() {
    let Some(gpu) = testing::gpu_or_skip("runtime_kv") else {
        return;
    };
    let engine = Engine::new(gpu);
    let net = network(&engine).unwrap();
    let mut req = InferRequest::new(&net, RunOptions::new(Policy::OpenVino)).unwrap();
    let bad = HostTensor::f32(Shape::new(vec![2, WIDTH + 1]), &[0.0; 14]);
    assert!(matches!(
        req.infer_blocking(&[("x", &bad)], &[]),
        Err(RunError::Graph(_))
    ));
    let short = HostTensor::f32(Shape::new(vec![2, WIDTH]), &[0.0; 3]);
    assert!(matches!(
        req.infer_blocking(&[("x", &short)], &[]),
        Err(RunError::BadInput { .. })
    ));
    let wide = HostTensor::f32(Shape::new(vec![1, WIDTH + 1]), &[0.0; 7]);
    assert!(matches!(
        req.infer_blocking(&[("x", &wide), ("past", &wide)], &[]),
        Err(RunError::Graph(_))
    ));
    let ok = HostTensor::f32(Shape::new(vec![1, WIDTH]), &[1.0; 6]);
    let out = req.infer_blocking(&[("x", &ok)], &["present"]).unwrap();
    assert_eq!(out[0].to_f32(), vec![1.0; 6]);
    assert!(matches!(
        req.infer_blocking(&[("x", &ok)], &["nope"]),
        Err(RunError::UnknownOutput { .. })
    ));
}

#[test]
fn shape_data_dependencies_are_resolved_on_the_host_each_time_shapes_change() {
    // back = reshape_to(reshape(x, [-1]), shape_of(x)): the target shape is data computed from
    // x's shape (the reference's shape-infer dependency); it must follow x every iteration.
    let Some(gpu) = testing::gpu_or_skip("runtime_kv") else {
        return;
    };
    let engine = Engine::new(gpu);
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[Dim::sym("rows"), Dim::Fixed(3)], DType::F32);
    let flat = b.reshape("flat", x, &[-1]);
    let s = b.shape_of("shape", x);
    let back = b.reshape_to("back", flat, s);
    b.output(back);
    let net = Network::compile(&engine, b.build().unwrap(), NetworkOptions::default()).unwrap();
    let mut req = InferRequest::new(&net, RunOptions::new(Policy::Adaptive)).unwrap();
    let before = req.stats().shape_updates_skipped;
    for rows in [2u64, 5, 5, 1, 7] {
        let v: Vec<f32> = (0..rows * 3).map(|i| i as f32 - 4.5).collect();
        let t = HostTensor::f32(Shape::new(vec![rows, 3]), &v);
        let out = req.infer_blocking(&[("x", &t)], &["back"]).unwrap();
        assert_eq!(out[0].shape.dims(), &[rows, 3]);
        assert_eq!(out[0].to_f32(), v);
    }
    // The repeated shape (5 then 5) skipped every node.
    assert!(req.stats().shape_updates_skipped >= before + 4);
}

const HEADS: u64 = 3;
const HEAD_DIM: u64 = 4;

/// The caches exported decoders write: `present = concat(past, new, axis 2)` on
/// `[1, heads, t, head_dim]`, read by attention as `q @ transpose(present_k)` and
/// `scores @ present_v` (the transpose a strided view, both matmuls reading strides). With
/// `extras`, also readers that copy: `reshape(present_k)` (a strided copy kernel) and
/// `softmax(present_v)` (a kernel that reads contiguously: the runtime puts a copy in front).
fn axis2_graph(extras: bool) -> dynrt::graph::Graph {
    let mut b = GraphBuilder::new();
    let dims = |t: &str| {
        [
            Dim::Fixed(1),
            Dim::Fixed(HEADS),
            Dim::sym(t),
            Dim::Fixed(HEAD_DIM),
        ]
    };
    let q = b.input("q", &dims("seq"), DType::F32);
    let k = b.input("k", &dims("seq"), DType::F32);
    let v = b.input("v", &dims("seq"), DType::F32);
    let past_k = b.input("past_key_values.0.key", &dims("past"), DType::F32);
    let past_v = b.input("past_key_values.0.value", &dims("past"), DType::F32);
    let present_k = b.concat("present.0.key", &[past_k, k], 2);
    let present_v = b.concat("present.0.value", &[past_v, v], 2);
    let kt = b.transpose("k_t", present_k, &[0, 1, 3, 2]);
    let scores = b.matmul("scores", q, kt, false);
    let attn = b.matmul("attn", scores, present_v, false);
    b.output(present_k).output(present_v).output(attn);
    if extras {
        let flat = b.reshape("k_flat", present_k, &[-1]);
        let sm = b.softmax("v_softmax", present_v);
        b.output(flat).output(sm);
    }
    b.build().unwrap()
}

fn random(rng: &mut SplitMix64, shape: &[u64]) -> (Shape, Vec<f32>) {
    let n: u64 = shape.iter().product();
    (
        Shape::new(shape.to_vec()),
        (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect(),
    )
}

/// Concatenates `a` and `b` (`[1, heads, ta, d]`, `[1, heads, tb, d]`) along axis 2.
fn concat2(a: &[f32], ta: u64, b: &[f32], tb: u64) -> Vec<f32> {
    let (ta, tb, d) = (ta as usize, tb as usize, HEAD_DIM as usize);
    let mut out = Vec::new();
    for h in 0..HEADS as usize {
        out.extend_from_slice(&a[h * ta * d..(h + 1) * ta * d]);
        out.extend_from_slice(&b[h * tb * d..(h + 1) * tb * d]);
    }
    out
}

#[test]
fn an_axis_2_cache_is_appended_in_place_and_read_through_strides() {
    let Some(gpu) = testing::gpu_or_skip("runtime_kv") else {
        return;
    };
    let graph = axis2_graph(true);
    // The pattern is recognised without naming it.
    let states = dynrt::runtime::find_states(&graph);
    assert_eq!(
        states,
        vec![
            StateBinding {
                past: "past_key_values.0.key".into(),
                present: "present.0.key".into()
            },
            StateBinding {
                past: "past_key_values.0.value".into(),
                present: "present.0.value".into()
            },
        ]
    );
    let reference = graph.clone();
    for policy in Policy::ALL {
        for poison in [false, true] {
            let engine = Engine::new(gpu.clone());
            let options = NetworkOptions {
                states: states.clone(),
                ..NetworkOptions::default()
            };
            let net = Network::compile(&engine, graph.clone(), options).unwrap();
            // The softmax got its contiguous copy; nothing else did.
            let copies: Vec<&str> = net
                .graph()
                .nodes()
                .iter()
                .filter(|n| n.label.contains("#contiguous"))
                .map(|n| n.label.as_str())
                .collect();
            assert_eq!(copies, ["present.0.value#contiguous"]);
            let mut opts = RunOptions::new(policy);
            opts.poison = poison;
            let mut req = InferRequest::new(&net, opts).unwrap();
            let mut rng = SplitMix64::new(5);
            let (mut keys, mut values, mut t) = (Vec::new(), Vec::new(), 0u64);
            for step in 0..24 {
                let seq = if step == 0 { 5 } else { 1 + rng.range(0, 2) };
                let shape = [1, HEADS, seq, HEAD_DIM];
                let (s, q) = random(&mut rng, &shape);
                let (_, k) = random(&mut rng, &shape);
                let (_, v) = random(&mut rng, &shape);
                let (qt, kt, vt) = (
                    HostTensor::f32(s.clone(), &q),
                    HostTensor::f32(s.clone(), &k),
                    HostTensor::f32(s.clone(), &v),
                );
                let labels = [
                    "present.0.key",
                    "present.0.value",
                    "attn",
                    "k_flat",
                    "v_softmax",
                ];
                let out = req
                    .infer_blocking(&[("q", &qt), ("k", &kt), ("v", &vt)], &labels)
                    .unwrap();
                let past = Shape::new(vec![1, HEADS, t, HEAD_DIM]);
                let expect = dynrt::graph::reference::evaluate(
                    &reference,
                    &[
                        ("q", s.clone(), q),
                        ("k", s.clone(), k.clone()),
                        ("v", s.clone(), v.clone()),
                        ("past_key_values.0.key", past.clone(), keys.clone()),
                        ("past_key_values.0.value", past, values.clone()),
                    ],
                )
                .unwrap();
                keys = concat2(&keys, t, &k, seq);
                values = concat2(&values, t, &v, seq);
                t += seq;
                let what = format!("{policy} poison={poison} step {step}");
                assert_eq!(out[0].shape.dims(), &[1, HEADS, t, HEAD_DIM], "{what}");
                assert_eq!(out[0].to_f32(), keys, "{what}: present key");
                assert_eq!(out[1].to_f32(), values, "{what}: present value");
                for (i, label) in labels.iter().enumerate().skip(2) {
                    let got = out[i].to_f32();
                    assert_eq!(got.len(), expect[i].1.len(), "{what}: {label}");
                    for (g, e) in got.iter().zip(&expect[i].1) {
                        assert!((g - e).abs() <= 1e-5 + 1e-5 * e.abs(), "{what}: {label}");
                    }
                }
            }
        }
    }
}

#[test]
fn a_decode_loop_allocates_nothing_and_copies_only_the_new_rows_between_growths() {
    let Some(gpu) = testing::gpu_or_skip("runtime_kv") else {
        return;
    };
    let graph = axis2_graph(false);
    let engine = Engine::new(gpu);
    let options = NetworkOptions {
        states: dynrt::runtime::find_states(&graph),
        ..NetworkOptions::default()
    };
    let net = Network::compile(&engine, graph, options).unwrap();
    let mut req = InferRequest::new(&net, RunOptions::new(Policy::Adaptive)).unwrap();
    let mut rng = SplitMix64::new(9);
    let row_bytes = HEADS * HEAD_DIM * 4;
    let mut quiet_steps = 0;
    for step in 0..200 {
        let seq = if step == 0 { 16 } else { 1 };
        let shape = [1, HEADS, seq, HEAD_DIM];
        let (s, q) = random(&mut rng, &shape);
        let (_, k) = random(&mut rng, &shape);
        let (_, v) = random(&mut rng, &shape);
        let (qt, kt, vt) = (
            HostTensor::f32(s.clone(), &q),
            HostTensor::f32(s.clone(), &k),
            HostTensor::f32(s, &v),
        );
        let before = req.stats();
        let device_before = engine.stats().kind(dynrt::memory::AllocKind::UsmDevice);
        req.infer_blocking(&[("q", &qt), ("k", &kt), ("v", &vt)], &["attn"])
            .unwrap();
        let after = req.stats();
        let device_after = engine.stats().kind(dynrt::memory::AllocKind::UsmDevice);
        if step == 0 {
            continue;
        }
        let grew = after.state_growths - before.state_growths;
        let copy_bytes = after.copy_bytes - before.copy_bytes;
        // The two matmuls are the only dispatches: the transpose is a view of the cache.
        assert_eq!(after.dispatches - before.dispatches, 2, "step {step}");
        if grew == 0 {
            // Each state appends one row per head: 3 copies of 16 bytes, nothing else moves.
            assert_eq!(after.copies - before.copies, 2 * HEADS, "step {step}");
            assert_eq!(copy_bytes, 2 * row_bytes, "step {step}");
            if after.reallocations == before.reallocations {
                assert_eq!(
                    device_after.allocations, device_before.allocations,
                    "step {step}: no device allocation"
                );
                quiet_steps += 1;
            }
        } else {
            // A growth copies the past once, block by block.
            let past = 16 + step as u64 - 1;
            assert_eq!(copy_bytes, 2 * row_bytes * (past + 1), "step {step}");
        }
    }
    let s = req.stats();
    // Exact allocation would grow both states at each of the 199 steps.
    assert!(
        s.state_growths <= 2 * 20,
        "{} growths in 200 steps",
        s.state_growths
    );
    assert!(
        quiet_steps >= 150,
        "only {quiet_steps} steps without an allocation"
    );
}

#[test]
fn a_past_given_by_the_caller_replaces_the_rows_held_and_a_failed_step_keeps_them() {
    let Some(gpu) = testing::gpu_or_skip("runtime_kv") else {
        return;
    };
    let graph = axis2_graph(false);
    let engine = Engine::new(gpu);
    let options = NetworkOptions {
        states: dynrt::runtime::find_states(&graph),
        ..NetworkOptions::default()
    };
    let net = Network::compile(&engine, graph, options).unwrap();
    for poison in [false, true] {
        let mut opts = RunOptions::new(Policy::OpenVino);
        opts.poison = poison;
        let mut req = InferRequest::new(&net, opts).unwrap();
        let mut rng = SplitMix64::new(3);
        let mut step = |req: &mut InferRequest, past: Option<(u64, &[f32])>| {
            let shape = [1, HEADS, 1, HEAD_DIM];
            let (s, q) = random(&mut rng, &shape);
            let (_, k) = random(&mut rng, &shape);
            let (qt, kt) = (HostTensor::f32(s.clone(), &q), HostTensor::f32(s, &k));
            let given =
                past.map(|(t, p)| HostTensor::f32(Shape::new(vec![1, HEADS, t, HEAD_DIM]), p));
            let mut inputs = vec![("q", &qt), ("k", &kt), ("v", &kt)];
            if let Some(g) = &given {
                inputs.push(("past_key_values.0.key", g));
                inputs.push(("past_key_values.0.value", g));
            }
            let out = req
                .infer_blocking(&inputs, &["present.0.key", "present.0.value"])
                .unwrap();
            (k, out[0].to_f32(), out[1].shape.clone())
        };
        let mut keys = Vec::new();
        for t in 0..12 {
            let (k, present, _) = step(&mut req, None);
            keys = concat2(&keys, t, &k, 1);
            assert_eq!(present, keys);
        }
        // Both caches restart from 2 given rows (one symbol `past` binds both).
        let given: Vec<f32> = (0..HEADS * 2 * HEAD_DIM).map(|i| i as f32).collect();
        let (k, present, value_shape) = step(&mut req, Some((2, &given)));
        let mut keys = concat2(&given, 2, &k, 1);
        assert_eq!(present, keys, "poison={poison}");
        assert_eq!(value_shape.dims(), &[1, HEADS, 3, HEAD_DIM]);
        // A failed step (a past of the wrong type) changes nothing.
        let wrong = HostTensor::i32(Shape::new(vec![1, HEADS, 1, HEAD_DIM]), &[0; 12]);
        let q = HostTensor::f32(Shape::new(vec![1, HEADS, 1, HEAD_DIM]), &[0.0; 12]);
        let err = req
            .infer_blocking(
                &[
                    ("q", &q),
                    ("k", &q),
                    ("v", &q),
                    ("past_key_values.0.key", &wrong),
                ],
                &[],
            )
            .unwrap_err();
        assert!(
            matches!(&err, RunError::BadInput { input, .. } if input == "past_key_values.0.key"),
            "{err}"
        );
        for t in 3..40 {
            let (k, present, _) = step(&mut req, None);
            keys = concat2(&keys, t, &k, 1);
            assert_eq!(present, keys, "poison={poison} t={t}");
        }
    }
}
