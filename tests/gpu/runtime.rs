//! The runtime on a real adapter: identical outputs for every memory option, a long dynamic
//! loop that stays bounded, and out-of-memory handling.

use crate::common;

use dynrt::demo::decoder::{build_graph, labels, DecoderConfig, DecoderWeights};
use dynrt::gpu::{testing, Engine, Gpu};
use dynrt::graph::{reference, Bindings, Graph};
use dynrt::memory::predictor::{Policy, PredictorOptions};
use dynrt::runtime::{
    HostTensor, InferRequest, Network, NetworkOptions, RunError, RunOptions, StateBinding,
};
use dynrt::shape::Shape;

/// Tolerance against the CPU reference: f32 kernels vs f64-accumulating loops on O(1) values.
const TOL: f32 = 1e-3;

fn tiny() -> DecoderConfig {
    DecoderConfig {
        layers: 1,
        heads: 2,
        dim: 32,
        vocab: 64,
        max_positions: 512,
        seed: 3,
    }
}

fn states(s: &[(String, String)]) -> Vec<StateBinding> {
    s.iter()
        .map(|(p, q)| StateBinding {
            past: p.clone(),
            present: q.clone(),
        })
        .collect()
}

/// CPU reference, step by step with its own KV cache. Returns the logits of each step.
struct CpuDecoder {
    graph: Graph,
    labels: Vec<(String, String)>,
    cache: Vec<Vec<f32>>,
    dim: u64,
}

impl CpuDecoder {
    fn new(graph: Graph, labels: Vec<(String, String)>, dim: u64) -> Self {
        let n = labels.len();
        CpuDecoder {
            graph,
            labels,
            cache: vec![Vec::new(); n],
            dim,
        }
    }

    fn step(&mut self, tokens: &[i32], start: i32) -> Vec<f32> {
        let seq = tokens.len() as u64;
        let mut inputs = vec![
            (
                labels::TOKENS,
                Shape::new(vec![seq]),
                tokens.iter().map(|&t| t as f32).collect(),
            ),
            (
                labels::POSITIONS,
                Shape::new(vec![seq]),
                (0..seq as i32)
                    .map(|i| (start + i) as f32)
                    .collect::<Vec<f32>>(),
            ),
        ];
        for (i, (past, _)) in self.labels.iter().enumerate() {
            let rows = self.cache[i].len() as u64 / self.dim;
            inputs.push((
                past.as_str(),
                Shape::new(vec![rows, self.dim]),
                self.cache[i].clone(),
            ));
        }
        let outs = reference::evaluate(&self.graph, &inputs).expect("cpu reference");
        let mut it = outs.into_iter();
        let logits = it.next().expect("logits").1;
        for (i, t) in it.enumerate() {
            self.cache[i] = t.1;
        }
        logits
    }
}

fn gpu() -> Option<Gpu> {
    testing::gpu_or_skip("runtime")
}

/// Feeds `tokens` in chunks (`chunks[i]` tokens at step i) and returns the logits per step.
fn run(
    engine: &Engine,
    config: &DecoderConfig,
    fixed_seq: Option<u64>,
    planner: bool,
    run: RunOptions,
    tokens: &[i32],
    chunks: &[usize],
) -> Result<(Vec<Vec<f32>>, InferRequest), RunError> {
    let model = build_graph(config, &DecoderWeights::generate(config))?;
    let mut fixed = Bindings::new();
    if let Some(s) = fixed_seq {
        fixed.insert("seq".into(), s);
    }
    let net = Network::compile(
        engine,
        model.graph,
        NetworkOptions {
            planner,
            fixed,
            states: states(&model.states),
            ..NetworkOptions::default()
        },
    )?;
    let mut req = InferRequest::new(&net, run)?;
    let mut at = 0usize;
    let mut out = Vec::new();
    for &c in chunks {
        let t = &tokens[at..at + c];
        let pos: Vec<i32> = (at as i32..(at + c) as i32).collect();
        let shape = Shape::new(vec![c as u64]);
        let r = req.infer_blocking(
            &[
                (labels::TOKENS, &HostTensor::i32(shape.clone(), t)),
                (labels::POSITIONS, &HostTensor::i32(shape, &pos)),
            ],
            &[labels::LOGITS],
        )?;
        out.push(r[0].to_f32());
        at += c;
    }
    Ok((out, req))
}

fn max_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "logit counts differ");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn every_memory_option_gives_identical_outputs_equal_to_the_cpu_reference() {
    let Some(gpu) = gpu() else { return };
    let config = tiny();
    let tokens: Vec<i32> = (0..14).map(|i| (i * 7 + 3) % 64).collect();
    // Decode-only network (seq fixed to 1): its seq-only nodes are static, so the planner
    // has an arena to pack; the attention nodes stay dynamic.
    let chunks = vec![1usize; tokens.len()];
    let model = build_graph(&config, &DecoderWeights::generate(&config)).unwrap();
    let mut cpu = CpuDecoder::new(model.graph.clone(), model.states.clone(), config.dim as u64);
    let expected: Vec<Vec<f32>> = tokens
        .iter()
        .enumerate()
        .map(|(i, &t)| cpu.step(&[t], i as i32))
        .collect();

    let mut first: Option<Vec<Vec<f32>>> = None;
    let mut combos = 0;
    for policy in Policy::ALL {
        for pool in [true, false] {
            for planner in [true, false] {
                for poison in [false, true] {
                    let engine = Engine::new(gpu.clone());
                    let mut opts = RunOptions::new(policy);
                    opts.pool = pool;
                    opts.poison = poison;
                    let (got, req) =
                        run(&engine, &config, Some(1), planner, opts, &tokens, &chunks).unwrap();
                    let what = format!("{policy} pool={pool} planner={planner} poison={poison}");
                    if planner {
                        assert!(
                            req.network().arena_bytes() > 0,
                            "{what}: nothing was planned"
                        );
                    }
                    if poison {
                        assert!(req.stats().poison_fills > 0, "{what}: poison did nothing");
                    }
                    for (step, (g, e)) in got.iter().zip(&expected).enumerate() {
                        let err = max_err(g, e);
                        assert!(
                            err <= TOL,
                            "{what}: step {step} differs from the CPU reference by {err}"
                        );
                    }
                    match &first {
                        None => first = Some(got),
                        Some(f) => {
                            assert_eq!(f, &got, "{what}: outputs differ from the first combination")
                        }
                    }
                    combos += 1;
                }
            }
        }
    }
    assert_eq!(combos, 24);
}

#[test]
fn prefill_then_decode_matches_the_reference_and_reuses_the_kv_cache_in_place() {
    let Some(gpu) = gpu() else { return };
    let engine = Engine::new(gpu);
    let config = tiny();
    let tokens: Vec<i32> = (0..40).map(|i| (i * 5 + 1) % 64).collect();
    let mut chunks = vec![9usize];
    chunks.extend(std::iter::repeat_n(1, 31));
    let (got, req) = run(
        &engine,
        &config,
        None,
        true,
        RunOptions::new(Policy::OpenVino),
        &tokens,
        &chunks,
    )
    .unwrap();
    let model = build_graph(&config, &DecoderWeights::generate(&config)).unwrap();
    let mut cpu = CpuDecoder::new(model.graph, model.states, config.dim as u64);
    let mut at = 0;
    for (step, &c) in chunks.iter().enumerate() {
        let e = cpu.step(&tokens[at..at + c], at as i32);
        let err = max_err(&got[step], &e);
        assert!(err <= TOL, "step {step}: error {err}");
        at += c;
    }
    let s = req.stats();
    // 40 rows per cache: the reference predictor grows 10 steps ahead, so far fewer growths
    // than steps.
    assert_eq!(req.state_shapes()[0].dims(), &[40, 32]);
    assert!(s.state_growths > 0 && s.state_growths < 10, "{s:?}");
    assert!(
        s.submits == chunks.len() as u64,
        "one submit per iteration: {s:?}"
    );
}

#[test]
fn a_long_dynamic_loop_stays_bounded_and_stops_missing_the_pipeline_cache() {
    let Some(gpu) = gpu() else { return };
    let engine = Engine::new(gpu);
    let config = tiny();
    let model = build_graph(&config, &DecoderWeights::generate(&config)).unwrap();
    let net = Network::compile(
        &engine,
        model.graph,
        NetworkOptions {
            states: states(&model.states),
            ..NetworkOptions::default()
        },
    )
    .unwrap();
    let mut req = InferRequest::new(&net, RunOptions::new(Policy::Adaptive)).unwrap();
    let steps = 300u64;
    let mut misses_after_warmup = None;
    let mut live_buffers = Vec::new();
    let mut skipped_before = 0;
    for step in 0..steps {
        let tok = HostTensor::i32(Shape::new(vec![1]), &[(step % 64) as i32]);
        let pos = HostTensor::i32(Shape::new(vec![1]), &[step as i32]);
        req.infer_blocking(&[(labels::TOKENS, &tok), (labels::POSITIONS, &pos)], &[])
            .unwrap();
        let st = engine.stats();
        let live: u64 = dynrt::memory::AllocKind::ALL
            .iter()
            .map(|&k| st.kind(k).allocations - st.kind(k).frees)
            .sum();
        live_buffers.push(live);
        if step == 20 {
            misses_after_warmup = Some(net.pipeline_cache_counts().1);
        }
        let skipped = req.stats().shape_updates_skipped;
        if step >= 2 {
            assert!(
                skipped > skipped_before,
                "step {step}: no shape update was skipped"
            );
        }
        skipped_before = skipped;
    }
    let (hits, misses) = net.pipeline_cache_counts();
    assert_eq!(
        Some(misses),
        misses_after_warmup,
        "the pipeline cache still missed after warm-up"
    );
    assert!(hits > 0);
    // No leak: the number of live buffers does not grow with the steps.
    let warm = live_buffers[30];
    assert!(
        live_buffers[30..].iter().all(|&l| l <= warm + 2),
        "live buffers grow: {:?}",
        &live_buffers[30..]
    );
    // The KV cache holds 300 rows x 32 f32 per tensor; bytes in use stay within a small
    // multiple of what is needed (the adaptive predictor over-reserves little).
    let kv_needed = 2 * steps * 32 * 4;
    let device = engine
        .stats()
        .current_bytes(dynrt::memory::AllocKind::UsmDevice);
    assert!(
        device < 4 * kv_needed + 2_000_000,
        "usm_device in use {device} bytes"
    );
    assert_eq!(req.state_shapes()[0].dims(), &[steps, 32]);
}

#[test]
fn preallocation_over_budget_falls_back_to_the_exact_size_and_an_impossible_request_is_a_typed_error(
) {
    let Some(gpu) = gpu() else { return };
    let config = tiny();
    let tokens: Vec<i32> = (0..30).map(|i| (i * 3 + 2) % 64).collect();
    let mut chunks = vec![6usize];
    chunks.extend(std::iter::repeat_n(1, 24));
    // Weights ~50 KB; a budget of 400 KB leaves little room: predictions are refused.
    let engine = Engine::with_memory_budget(gpu.clone(), 400_000);
    let mut opts = RunOptions::new(Policy::OpenVino);
    // A look-ahead of 100000 steps: every prediction asks for megabytes, far over budget.
    opts.predictor = PredictorOptions::openvino_defaults().with_iterations(100_000);
    let (got, mut req) = run(&engine, &config, None, true, opts, &tokens, &chunks).unwrap();
    let s = req.stats();
    assert!(
        s.preallocations_refused + s.preallocation_fallbacks > 0,
        "no prediction hit the budget: {s:?}"
    );
    let model = build_graph(&config, &DecoderWeights::generate(&config)).unwrap();
    let mut cpu = CpuDecoder::new(model.graph, model.states, config.dim as u64);
    let mut at = 0;
    for (step, &c) in chunks.iter().enumerate() {
        let e = cpu.step(&tokens[at..at + c], at as i32);
        assert!(max_err(&got[step], &e) <= TOL, "step {step}");
        at += c;
    }

    // 400 tokens at once: the scores alone need 2 x 400 x 430 f32 = 1.4 MB, over budget.
    let big: Vec<i32> = vec![1; 400];
    let shape = Shape::new(vec![400]);
    let pos: Vec<i32> = (30..430).collect();
    let err = req
        .infer_blocking(
            &[
                (labels::TOKENS, &HostTensor::i32(shape.clone(), &big)),
                (labels::POSITIONS, &HostTensor::i32(shape, &pos)),
            ],
            &[labels::LOGITS],
        )
        .unwrap_err();
    assert!(matches!(err, RunError::OutOfMemory { .. }), "{err}");
    // The request is still usable and its cache untouched: the next token matches the CPU.
    assert_eq!(req.state_shapes()[0].dims(), &[30, 32]);
    let one = Shape::new(vec![1]);
    let r = req
        .infer_blocking(
            &[
                (labels::TOKENS, &HostTensor::i32(one.clone(), &[5])),
                (labels::POSITIONS, &HostTensor::i32(one, &[30])),
            ],
            &[labels::LOGITS],
        )
        .unwrap();
    let e = cpu.step(&[5], 30);
    assert!(max_err(&r[0].to_f32(), &e) <= TOL);
}

#[test]
fn an_input_processed_late_never_shares_memory_with_an_earlier_node() {
    // n1 (processed before x) and x have disjoint lifetimes and equal sizes: the pool could
    // hand them one buffer, but x is written by the host before the submit and n1 during it.
    let Some(gpu) = gpu() else { return };
    use dynrt::graph::{Dim, GraphBuilder};
    use dynrt::shape::DType;
    let engine = Engine::new(gpu);
    let mut b = GraphBuilder::new();
    let c = b.constant(
        "c",
        Shape::new(vec![64]),
        (0..64).map(|i| i as f32 * 0.1).collect(),
    );
    let n1 = b.exp("n1", c);
    let n2 = b.relu("n2", n1);
    let x = b.input("x", &[Dim::sym("n")], DType::F32);
    let y = b.add("y", x, n2);
    b.output(y);
    let g = b.build().unwrap();
    let xs: Vec<f32> = (0..64).map(|i| 1.0 - i as f32 * 0.03).collect();
    let expected = reference::evaluate(&g, &[("x", Shape::new(vec![64]), xs.clone())]).unwrap();
    // Planner off and inputs in usm_device (as on GL and the web): n1 and n2 come from the
    // pool, where x could find n1's record.
    let opts = NetworkOptions {
        planner: false,
        io_kind: Some(dynrt::memory::AllocKind::UsmDevice),
        ..NetworkOptions::default()
    };
    let net = Network::compile(&engine, g, opts).unwrap();
    let mut req = InferRequest::new(&net, RunOptions::new(Policy::None)).unwrap();
    for _ in 0..3 {
        let out = req
            .infer_blocking(
                &[("x", &HostTensor::f32(Shape::new(vec![64]), &xs))],
                &["y"],
            )
            .unwrap();
        assert!(max_err(&out[0].to_f32(), &expected[0].1) <= 1e-4);
    }
}

#[test]
fn unchanged_nodes_replay_their_dispatch_plans_and_changed_ones_record_afresh() {
    // Static shapes between iterations: every kernel node replays the dispatches it recorded
    // (new data each time, so a replay that read stale operands would be caught). A shape
    // change makes the nodes that depend on it record afresh, while `k` (static, in the arena)
    // keeps replaying although the others' buffers are reallocated; dropping the request frees
    // everything the plans held.
    let Some(gpu) = gpu() else { return };
    use dynrt::graph::{Dim, GraphBuilder};
    use dynrt::shape::DType;
    let engine = Engine::new(gpu);
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[Dim::sym("n")], DType::F32);
    let c = b.constant("c", Shape::new(vec![1]), vec![0.5]);
    let m = b.mul("m", x, c);
    let e = b.exp("e", m);
    let y = b.add("y", e, x);
    let c8 = b.constant(
        "c8",
        Shape::new(vec![8]),
        (0..8).map(|i| i as f32 * 0.1).collect(),
    );
    let k = b.exp("k", c8);
    b.output(y);
    b.output(k);
    let g = b.build().unwrap();
    let net = Network::compile(&engine, g.clone(), NetworkOptions::default()).unwrap();
    let mut req = InferRequest::new(&net, RunOptions::new(Policy::None)).unwrap();
    let mut replayed_before = 0;
    for (it, n) in [64u64, 64, 64, 128, 128, 32].into_iter().enumerate() {
        let xs: Vec<f32> = (0..n).map(|i| (i as f32 - it as f32) * 0.05).collect();
        let expected = reference::evaluate(&g, &[("x", Shape::new(vec![n]), xs.clone())]).unwrap();
        let x_in = HostTensor::f32(Shape::new(vec![n]), &xs);
        let out = req.infer_blocking(&[("x", &x_in)], &["y", "k"]).unwrap();
        for (o, (label, (_, want))) in out.iter().zip(["y", "k"].iter().zip(&expected)) {
            assert!(
                max_err(&o.to_f32(), want) <= 1e-5,
                "iteration {it} (n = {n}): {label}"
            );
        }
        let replayed = req.stats().dispatches_replayed;
        let expect = match it {
            0 => 0,
            // Only k: m, e and y changed shape (and at n = 128 were reallocated).
            3 | 5 => 1,
            _ => 4,
        };
        assert_eq!(
            replayed - replayed_before,
            expect,
            "iteration {it} (n = {n})"
        );
        replayed_before = replayed;
    }
    assert_eq!(req.stats().dispatches, 24);
    assert!(req.stats().reallocations > 0, "n = 128 reallocated nothing");
    drop(req);
    let st = engine.stats();
    use dynrt::memory::accounting::{region_index, COUNTED_REGIONS};
    use dynrt::memory::regions::Region;
    let region = |r| st.regions[region_index(r).unwrap()];
    // Everything the request allocated for itself is freed; its placeholder slots went back
    // to the network's pool (kept for the network's next requests), and the constants stay
    // with the network.
    assert_eq!(region(Region::Internal).current_bytes, 0);
    assert!(region(Region::Constants).current_bytes > 0);
    let io = net.io_kind();
    for kind in dynrt::memory::AllocKind::ALL {
        if kind != dynrt::memory::AllocKind::UsmDevice && kind != io {
            assert_eq!(st.current_bytes(kind), 0, "{kind:?} still allocated");
        }
    }
    if io != dynrt::memory::AllocKind::UsmDevice {
        assert_eq!(
            st.current_bytes(io),
            region(Region::Placeholders).current_bytes,
            "only the pooled placeholder slots stay"
        );
    }
    drop(net);
    let st = engine.stats();
    for kind in dynrt::memory::AllocKind::ALL {
        assert_eq!(st.current_bytes(kind), 0, "{kind:?} still allocated");
    }
    for (i, r) in COUNTED_REGIONS.iter().enumerate() {
        assert_eq!(st.regions[i].current_bytes, 0, "{r} still holds bytes");
    }
}

#[test]
fn nodes_without_a_kernel_for_their_types_are_refused_when_the_network_compiles() {
    // An i64 division the device would have to compute: the typed kernel does i64 add, sub,
    // mul exactly but no division, so compiling refuses it naming the node, before anything
    // is allocated. Integer arithmetic on shape data only runs on the host and compiles.
    let Some(gpu) = gpu() else { return };
    use dynrt::graph::{Dim, GraphBuilder};
    use dynrt::shape::DType;
    let engine = Engine::new(gpu);
    let mut b = GraphBuilder::new();
    let a = b.input("a", &[Dim::Fixed(4)], DType::I64);
    let c = b.constant_bytes(
        "c",
        Shape::new(vec![4]),
        DType::I64,
        dynrt::tensor::ConstData::from_i64(&[1, 2, 3, 4]),
    );
    let quotient = b.div("int_div", a, c);
    b.output(quotient);
    let before = engine.stats().total_current_bytes();
    let err = Network::compile(&engine, b.build().unwrap(), NetworkOptions::default()).unwrap_err();
    assert!(
        matches!(&err, RunError::UnsupportedDType { node, op: "div", .. } if node == "int_div"),
        "{err}"
    );
    assert_eq!(engine.stats().total_current_bytes(), before);

    let mut b = GraphBuilder::new();
    let x = b.input("x", &[Dim::sym("n"), Dim::Fixed(4)], DType::F32);
    let shp = b.shape_of("shape", x);
    let n = b.slice("n", shp, &[0], &[0], &[1], &[1]);
    let two = b.constant_i32("two", Shape::new(vec![1]), &[2]);
    let doubled = b.mul("doubled", n, two);
    let target = b.concat("target", &[doubled, two], 0);
    let y = b.reshape_to("y", x, target);
    let z = b.relu("z", y);
    b.output(z);
    let g = b.build().unwrap();
    let net = Network::compile(&engine, g, NetworkOptions::default()).unwrap();
    let mut req = InferRequest::new(&net, RunOptions::new(Policy::Adaptive)).unwrap();
    let xs: Vec<f32> = (0..12).map(|v| v as f32 - 6.0).collect();
    let out = req
        .infer_blocking(
            &[("x", &HostTensor::f32(Shape::new(vec![3, 4]), &xs))],
            &["z"],
        )
        .unwrap();
    assert_eq!(out[0].shape, Shape::new(vec![6, 2]));
    let want: Vec<f32> = xs.iter().map(|v| v.max(0.0)).collect();
    assert_eq!(out[0].to_f32(), want);
}

#[test]
fn placeholders_share_the_data_region_where_inputs_and_outputs_are_device_memory() {
    // With device-memory inputs and outputs (GL and the web have no mappable storage
    // buffers; forced here), static inputs and outputs come from the high end of the buffer
    // whose low end holds the constants: `inflight` copies fit, one more collides and gets a
    // buffer of its own. Results are the CPU reference's either way.
    let Some(gpu) = gpu() else { return };
    use dynrt::memory::accounting::region_index;
    use dynrt::memory::regions::Region;
    use dynrt::memory::AllocKind;
    let engine = Engine::new(gpu);
    let config = tiny();
    let model = build_graph(&config, &DecoderWeights::generate(&config)).unwrap();
    let net = Network::compile(
        &engine,
        model.graph.clone(),
        NetworkOptions {
            fixed: Bindings::from([("seq".to_string(), 1)]),
            states: states(&model.states),
            io_kind: Some(AllocKind::UsmDevice),
            inflight: 2,
            ..NetworkOptions::default()
        },
    )
    .unwrap();
    let mut cpu = CpuDecoder::new(model.graph, model.states, config.dim as u64);
    let mut reqs: Vec<InferRequest> = (0..3)
        .map(|_| InferRequest::new(&net, RunOptions::new(Policy::Adaptive)).unwrap())
        .collect();
    let one = Shape::new(vec![1]);
    for (step, token) in [3i32, 9, 14].into_iter().enumerate() {
        let want = cpu.step(&[token], step as i32);
        for (i, req) in reqs.iter_mut().enumerate() {
            let r = req
                .infer_blocking(
                    &[
                        (labels::TOKENS, &HostTensor::i32(one.clone(), &[token])),
                        (
                            labels::POSITIONS,
                            &HostTensor::i32(one.clone(), &[step as i32]),
                        ),
                    ],
                    &[labels::LOGITS],
                )
                .unwrap();
            assert!(
                max_err(&r[0].to_f32(), &want) <= TOL,
                "request {i} step {step}"
            );
        }
    }
    // Three inputs/outputs per request (tokens, positions, logits). The region reserves
    // room for the static ones only (tokens and positions: logits depend on the dynamic
    // attention in the compile-time analysis) for two requests: 4 slots fit, the third
    // request's inputs and every logits slot collide and get buffers of their own.
    let (created, _, collisions) = net.placeholder_counts();
    assert_eq!((created, collisions), (9, 5));
    let st = engine.stats();
    let placeholders = st.regions[region_index(Region::Placeholders).unwrap()];
    assert!(placeholders.buffers >= 9, "{placeholders:?}");
    // Dropping a request gives its slots back; the next request reuses them.
    drop(reqs.remove(0));
    let mut again = InferRequest::new(&net, RunOptions::new(Policy::Adaptive)).unwrap();
    again
        .infer_blocking(
            &[
                (labels::TOKENS, &HostTensor::i32(one.clone(), &[1])),
                (labels::POSITIONS, &HostTensor::i32(one, &[0])),
            ],
            &[labels::LOGITS],
        )
        .unwrap();
    let (created_after, reused, _) = net.placeholder_counts();
    assert_eq!(created_after, created, "the freed slots were reused");
    assert!(reused >= 3);
}

#[test]
fn a_constant_larger_than_one_storage_binding_is_refused_before_anything_is_allocated() {
    // Kernels bind a constant whole, so one above `max_storage_buffer_binding_size` (128 MiB
    // on lavapipe and by default in browsers, while a buffer may be larger) could be placed
    // in the constants region but never read: compiling refuses it, naming it, with nothing
    // allocated or uploaded.
    let Some(gpu) = gpu() else { return };
    use dynrt::gpu::AllocError;
    use dynrt::graph::{Dim, GraphBuilder};
    use dynrt::shape::DType;
    use dynrt::tensor::{Backing, ConstData};
    let limits = gpu.limits().clone();
    let bytes = limits.max_storage_buffer_binding_size + 4;
    if bytes > limits.max_buffer_size {
        eprintln!("runtime: skipped, one binding may be as large as one buffer on this adapter");
        return;
    }
    let engine = Engine::new(gpu);
    let n = usize::try_from(bytes).unwrap();
    // Zeroed pages are not touched until read: the test costs no real memory.
    let backing: Backing = std::sync::Arc::new(vec![0u8; n]);
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[Dim::Fixed(bytes / 4)], DType::F32);
    let w = b.constant_bytes(
        "huge",
        Shape::new(vec![bytes / 4]),
        DType::F32,
        ConstData::slice(backing, 0..n).unwrap(),
    );
    let y = b.add("y", x, w);
    b.output(y);
    let before = engine.stats().total_current_bytes();
    let err = Network::compile(&engine, b.build().unwrap(), NetworkOptions::default()).unwrap_err();
    assert!(
        matches!(
            &err,
            RunError::Alloc { what, cause: AllocError::BindingTooLarge { size_bytes, max_bytes } }
                if what.contains("huge") && *size_bytes == bytes
                    && *max_bytes == limits.max_storage_buffer_binding_size
        ),
        "{err}"
    );
    assert_eq!(engine.stats().total_current_bytes(), before);
}

/// The memory-managed runtime on ops given one tensor twice and logic ops with unused slots
/// (ONNX `Mul(x, x)`, a GPT-2's `Where`): every dispatch binds distinct storage ranges (the
/// encoder refuses overlapping ones, as Dawn does in the browser) and the values are right,
/// across shape changes and repeated runs (dispatch plans replayed).
#[test]
fn operands_given_twice_and_unused_slots_run_without_aliased_bindings() {
    let Some(gpu) = gpu() else { return };
    let engine = Engine::new(gpu);
    let net = Network::compile(
        &engine,
        common::aliased_operands_graph(),
        NetworkOptions::default(),
    )
    .unwrap();
    let mut req = InferRequest::new(&net, RunOptions::new(Policy::Adaptive)).unwrap();
    let names = ["sq", "dbl", "isq", "gt", "sel", "fsel", "ng"];
    for n in [5, 600, 600, 33] {
        let (x, i) = common::aliased_operands_inputs(n);
        let iv: Vec<i32> = i.iter().map(|&v| v as i32).collect();
        let shape = Shape::new(vec![n as u64]);
        let out = req
            .infer_blocking(
                &[
                    ("x", &HostTensor::f32(shape.clone(), &x)),
                    ("i", &HostTensor::i32(shape, &iv)),
                ],
                &names,
            )
            .unwrap_or_else(|e| panic!("n={n}: {e}"));
        let values: Vec<Vec<f32>> = out.iter().map(HostTensor::to_f32).collect();
        common::check_aliased_outputs(&x, &i, &values, &format!("runtime n={n}"));
    }
}
