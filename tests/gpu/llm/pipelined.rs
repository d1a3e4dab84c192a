//! The decode loop with tokens chosen on the device (`Session::generate` when the sampling
//! parameters allow it and no logits are kept): the same tokens, stops and cache as the loop
//! that samples on the CPU, a stop token seen one step late and its step rolled back, and
//! the runtime's promise (a failed submit submits nothing and leaves the cache as it was) for
//! steps in flight.

use super::*;
use dynrt::graph::ops::SampleRow;
use dynrt::llm::graph::labels;
use dynrt::runtime::{DeviceIo, HostTensor, InferRequest};
use dynrt::shape::{DType, Shape};

fn params(max_tokens: usize, stop_at_eos: bool, keep_logits: bool) -> GenerateParams {
    GenerateParams {
        max_tokens,
        sampling: SamplingParams::default(),
        stop_at_eos,
        keep_logits,
    }
}

fn load(engine: &Engine, t: &TinyLlama, seed: u64) -> Model {
    let bytes = t.build(seed).unwrap();
    Model::from_backing(engine, Arc::new(bytes), ModelOptions::default()).unwrap()
}

/// Greedy generations on the device equal the CPU loop's on every tiny architecture: the
/// tokens, the stop, the cache, and a second turn on top of the first.
#[test]
fn device_sampling_gives_the_cpu_loops_tokens_and_cache() {
    let test = "device_sampling_gives_the_cpu_loops_tokens_and_cache";
    let Some(engine) = engine(test) else { return };
    let mut compared = 0;
    for (name, t) in tiny_models() {
        let model = load(&engine, &t, 5);
        let prompt = model.tokenizer().encode("once upon a time", Special::Plain);
        let mut cpu = model.session(RunOptions::new(Policy::Adaptive));
        let mut gpu = model.session(RunOptions::new(Policy::Adaptive));
        for turn in 0..2 {
            let a = cpu
                .generate_ids_blocking(&prompt, &params(20, false, true), &mut |_| {})
                .unwrap();
            let b = gpu
                .generate_ids_blocking(&prompt, &params(20, false, false), &mut |_| {})
                .unwrap();
            assert_eq!(a.tokens, b.tokens, "{name}, turn {turn}");
            assert_eq!(a.stop, b.stop, "{name}");
            assert_eq!(b.tokens.len(), 20);
            assert!(
                b.logits.is_empty(),
                "{name}: the device loop keeps no logits"
            );
            assert_eq!(cpu.cached_tokens(), gpu.cached_tokens(), "{name}");
            assert_eq!(cpu.kv_needed_bytes(), gpu.kv_needed_bytes(), "{name}");
            compared += 1;
        }
    }
    assert!(compared >= 8, "{compared} generations compared");
}

/// A stop token is seen one step late: the step already submitted for it is rolled back, so
/// the session holds what the CPU loop's holds (the stop token pending, not in the cache),
/// and the next turn gives the same tokens.
#[test]
fn a_stop_token_rolls_back_the_step_in_flight() {
    let test = "a_stop_token_rolls_back_the_step_in_flight";
    let Some(engine) = engine(test) else { return };
    // Find a tiny model and prompt whose greedy answer reaches the stop token soon.
    let mut found = None;
    'search: for seed in 0..40u64 {
        let model = load(&engine, &TinyLlama::default(), seed);
        for p in 0..6u32 {
            let prompt: Vec<u32> = (0..5).map(|i| 40 + (p * 7 + i * 13) % 200).collect();
            let mut s = model.session(RunOptions::new(Policy::Adaptive));
            let g = s
                .generate_ids_blocking(&prompt, &params(48, false, true), &mut |_| {})
                .unwrap();
            if let Some(i) = g.tokens.iter().position(|t| model.stop_ids().contains(t)) {
                if i >= 1 {
                    found = Some((model, prompt, i));
                    break 'search;
                }
            }
        }
    }
    let (model, prompt, at) = found.expect("no tiny model reached its stop token in 48 tokens");
    let mut cpu = model.session(RunOptions::new(Policy::Adaptive));
    let mut gpu = model.session(RunOptions::new(Policy::Adaptive));
    let a = cpu
        .generate_ids_blocking(&prompt, &params(48, true, true), &mut |_| {})
        .unwrap();
    let b = gpu
        .generate_ids_blocking(&prompt, &params(48, true, false), &mut |_| {})
        .unwrap();
    assert_eq!(a.stop, StopReason::Eos);
    assert_eq!(b.stop, StopReason::Eos);
    assert_eq!(a.tokens, b.tokens);
    assert_eq!(b.tokens.len(), at + 1);
    assert_eq!(cpu.cached_tokens(), gpu.cached_tokens());
    assert_eq!(cpu.kv_needed_bytes(), gpu.kv_needed_bytes());
    // The pending stop token is fed by the next turn in both.
    let more = [50u32, 60, 70];
    let a = cpu
        .generate_ids_blocking(&more, &params(12, false, true), &mut |_| {})
        .unwrap();
    let b = gpu
        .generate_ids_blocking(&more, &params(12, false, false), &mut |_| {})
        .unwrap();
    assert_eq!(a.tokens, b.tokens);
    assert_eq!(cpu.cached_tokens(), gpu.cached_tokens());
}

/// Sampled generations on the device repeat with the same seed and differ with another.
#[test]
fn device_sampling_is_seeded() {
    let test = "device_sampling_is_seeded";
    let Some(engine) = engine(test) else { return };
    let model = load(&engine, &TinyLlama::default(), 5);
    let prompt = model.tokenizer().encode("once upon a time", Special::Plain);
    let run = |seed: u64, top_k: usize| {
        let p = GenerateParams {
            sampling: SamplingParams {
                temperature: 1.5,
                top_k,
                top_p: if top_k > 0 { 0.95 } else { 1.0 },
                seed,
                ..SamplingParams::default()
            },
            ..params(24, false, false)
        };
        assert!(!p.sampling.needs_logits());
        let mut s = model.session(RunOptions::new(Policy::Adaptive));
        s.generate_ids_blocking(&prompt, &p, &mut |_| {})
            .unwrap()
            .tokens
    };
    for top_k in [0, 40] {
        let a = run(3, top_k);
        assert_eq!(a, run(3, top_k), "top_k {top_k}");
        assert_ne!(a, run(4, top_k), "top_k {top_k}");
        let vocab = model.config().vocab_size;
        assert!(a.iter().all(|&t| t < vocab));
    }
}

/// The promise of `infer` for steps in flight: a submit that fails submits nothing and
/// leaves the cache as the steps before it left it; the step in flight is still collected,
/// with the outputs a request without the failure gives.
#[test]
fn a_failed_submit_leaves_the_steps_in_flight_and_the_cache() {
    let test = "a_failed_submit_leaves_the_steps_in_flight_and_the_cache";
    let Some(engine) = engine(test) else { return };
    let model = load(&engine, &TinyLlama::default(), 5);
    let decode = model.networks().1;
    let i32s = |v: &[i32]| HostTensor::i32(Shape::new(vec![v.len() as u64]), v);
    let words = |row: &SampleRow| HostTensor {
        shape: Shape::new(vec![1, 8]),
        dtype: DType::U32,
        bytes: row
            .to_words()
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect(),
    };
    let greedy = words(&SampleRow::greedy());
    let buffer = || {
        engine
            .allocate(&dynrt::gpu::BufferDesc {
                label: "test token",
                size_bytes: 4,
                kind: dynrt::memory::AllocKind::UsmDevice,
            })
            .unwrap()
    };
    let (token_clean, token_r) = (buffer(), buffer());
    let step = |r: &mut InferRequest, token: &dynrt::gpu::Buffer, tok: Option<i32>, pos: i32| {
        let (t, p) = (i32s(&[tok.unwrap_or(0)]), i32s(&[pos]));
        let mut inputs = vec![(labels::POSITIONS, &p), (labels::SAMPLE_PARAMS, &greedy)];
        let mut io = DeviceIo {
            outputs: vec![(labels::NEXT_TOKEN, token, 0)],
            ..DeviceIo::default()
        };
        match tok {
            Some(_) => inputs.push((labels::TOKENS, &t)),
            None => io
                .inputs
                .push((labels::TOKENS, Shape::new(vec![1]), token, 0)),
        }
        pollster::block_on(r.submit(&inputs, &io, &[labels::NEXT_TOKEN, labels::LOGITS]))
    };
    // Uninterrupted: three steps, the last two fed on the device.
    let mut clean = InferRequest::new(decode, RunOptions::new(Policy::Adaptive)).unwrap();
    let mut want = Vec::new();
    for (tok, pos) in [(Some(65), 0), (None, 1), (None, 2)] {
        let p = step(&mut clean, &token_clean, tok, pos).unwrap();
        want.push(pollster::block_on(clean.collect(p)).unwrap());
    }
    // The same with a bad submit while step 2 is in flight.
    let mut r = InferRequest::new(decode, RunOptions::new(Policy::Adaptive)).unwrap();
    let p1 = step(&mut r, &token_r, Some(65), 0).unwrap();
    let got1 = pollster::block_on(r.collect(p1)).unwrap();
    let p2 = step(&mut r, &token_r, None, 1).unwrap();
    let rows = r.state_shapes();
    let bad = i32s(&[1, 2]);
    let err = pollster::block_on(r.submit(
        &[(labels::POSITIONS, &bad), (labels::SAMPLE_PARAMS, &greedy)],
        &DeviceIo {
            inputs: vec![(labels::TOKENS, Shape::new(vec![1]), &token_r, 0)],
            ..DeviceIo::default()
        },
        &[labels::NEXT_TOKEN],
    ));
    assert!(err.is_err(), "a [2] position on a [1] token is refused");
    assert_eq!(
        r.state_shapes(),
        rows,
        "the failed submit changed the cache"
    );
    let got2 = pollster::block_on(r.collect(p2)).unwrap();
    let p3 = step(&mut r, &token_r, None, 2).unwrap();
    let got3 = pollster::block_on(r.collect(p3)).unwrap();
    for (i, (w, g)) in want.iter().zip([got1, got2, got3]).enumerate() {
        assert_eq!(w[0].bytes, g[0].bytes, "step {i}: token");
        assert_eq!(w[1].bytes, g[1].bytes, "step {i}: logits");
    }
    // A rolled-back step computed again (its token fed from the host, as a session feeds
    // the pending token) gives the same outputs.
    let y3 = i32::from_le_bytes(want[2][0].bytes[..4].try_into().unwrap());
    let p4 = step(&mut r, &token_r, None, 3).unwrap();
    r.release(p4);
    r.drop_rows_back(1).unwrap();
    assert_eq!(r.state_shapes(), clean.state_shapes());
    let p4 = step(&mut r, &token_r, Some(y3), 3).unwrap();
    let again = pollster::block_on(r.collect(p4)).unwrap();
    let p4 = step(&mut clean, &token_clean, None, 3).unwrap();
    let once = pollster::block_on(clean.collect(p4)).unwrap();
    assert_eq!(again[0].bytes, once[0].bytes);
    assert_eq!(again[1].bytes, once[1].bytes);
}
