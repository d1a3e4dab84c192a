//! The in-place KV cache and the copy paths of the runtime on a real adapter: a state that
//! grows by a few rows per step must always read back as exactly the rows appended so far,
//! whatever the policy, the pool and poison.

use dynrt::gpu::{testing, Engine};
use dynrt::graph::{Dim, GraphBuilder};
use dynrt::memory::predictor::Policy;
use dynrt::rng::SplitMix64;
use dynrt::runtime::{
    HostTensor, InferRequest, Network, NetworkOptions, RunError, RunOptions, StateBinding,
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

#[test]
fn inputs_that_do_not_fit_the_graph_are_typed_errors_and_the_request_stays_usable() {
    let Some(gpu) = testing::gpu_or_skip("runtime_kv") else {
        return;
    };
    let engine = Engine::new(gpu);
    let net = network(&engine).unwrap();
    let mut req = InferRequest::new(&net, RunOptions::new(Policy::Reference)).unwrap();
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
    let past = HostTensor::f32(Shape::new(vec![1, WIDTH]), &[0.0; 6]);
    assert!(matches!(
        req.infer_blocking(&[("x", &past), ("past", &past)], &[]),
        Err(RunError::BadInput { .. })
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
