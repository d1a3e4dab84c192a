//! A lost device (`Gpu::destroy` on a device of the test's own, as a driver reset would lose
//! it) becomes a typed `DeviceLost` error at every layer: engine calls, a session's generation
//! in the middle of its tokens, a batched step of eight streams, the scheduler's requests, an
//! ONNX-free runtime request; and every later call fails at once instead of waiting on the
//! device or panicking. A new device and the model loaded again on it work as before.

use dynrt::gguf::TinyLlama;
use dynrt::gpu::{testing, AllocError, BufferDesc, Engine};
use dynrt::llm::{
    BatchEngine, BatchOptions, GenerateParams, LlmError, Model, ModelOptions, SamplingParams,
};
use dynrt::llm::{Prompt, Request, Scheduler, SchedulerEvent, SchedulerOptions};
use dynrt::memory::predictor::Policy;
use dynrt::memory::AllocKind;
use dynrt::runtime::RunOptions;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

fn greedy(max_tokens: usize) -> GenerateParams {
    GenerateParams {
        max_tokens,
        sampling: SamplingParams::default(),
        stop_at_eos: false,
        keep_logits: false,
    }
}

fn tiny(engine: &Engine) -> Model {
    let backing: dynrt::tensor::Backing = Arc::new(TinyLlama::default().build(5).unwrap());
    Model::from_backing(engine, backing, ModelOptions::default()).unwrap()
}

fn buffer_desc(label: &str) -> BufferDesc<'_> {
    BufferDesc {
        label,
        size_bytes: 256,
        kind: AllocKind::UsmDevice,
    }
}

#[test]
fn engine_calls_on_a_lost_device_fail_at_once_with_device_lost() {
    let test = "engine_calls_on_a_lost_device_fail_at_once_with_device_lost";
    let Some(gpu) = testing::fresh_gpu_or_skip(test) else {
        return;
    };
    let engine = Engine::new(gpu.clone());
    let kept = engine
        .allocate_init(&buffer_desc("kept"), &[5u8; 256])
        .unwrap();
    assert_eq!(engine.read_blocking(&kept, 0, 256).unwrap(), vec![5u8; 256]);
    assert!(!gpu.is_lost() && gpu.lost().is_none());
    gpu.destroy();
    assert!(gpu.is_lost());
    let lost = gpu.lost().expect("the loss is recorded");
    assert_eq!(lost.reason, "destroyed");
    assert_eq!(lost.adapter, gpu.adapter_info().name);
    let is_lost = |r: Result<(), AllocError>| match r {
        Err(AllocError::DeviceLost(l)) => assert_eq!(l, lost),
        other => panic!("expected DeviceLost, got {other:?}"),
    };
    is_lost(engine.allocate(&buffer_desc("after")).map(drop));
    is_lost(
        engine
            .allocate_init(&buffer_desc("after"), &[1; 8])
            .map(drop),
    );
    is_lost(engine.read_blocking(&kept, 0, 256).map(drop));
    is_lost(engine.write(&kept, 0, &[1u8; 16]));
    let other = engine.allocate(&buffer_desc("other"));
    assert!(other.as_ref().is_err_and(AllocError::is_device_lost));
    // Waits end at once; the error's words say what to do.
    gpu.poll_wait();
    pollster::block_on(gpu.idle());
    let text = lost.to_string();
    assert!(
        text.contains("lost") && text.contains("create a new device"),
        "{text}"
    );
    // Buffers made before the loss drop cleanly, and the accounting goes back to zero.
    drop(kept);
    assert_eq!(engine.device_bytes_in_use(), 0);
    assert!(
        gpu.uncaptured_errors().is_empty(),
        "{:?}",
        gpu.uncaptured_errors()
    );
}

#[test]
fn a_session_loses_its_device_mid_generation_and_fails_fast_afterwards() {
    let test = "a_session_loses_its_device_mid_generation_and_fails_fast_afterwards";
    let Some(gpu) = testing::fresh_gpu_or_skip(test) else {
        return;
    };
    let engine = Engine::new(gpu.clone());
    let model = tiny(&engine);
    let prompt = [11u32, 42, 7, 99];
    // The tokens before the loss are those of the same prompt on a device that stays.
    let healthy = Engine::new(testing::fresh_gpu_or_skip(test).expect("a second device"));
    let want = tiny(&healthy)
        .session(RunOptions::new(Policy::Adaptive))
        .generate_ids_blocking(&prompt, &greedy(12), &mut |_| {})
        .unwrap()
        .tokens;
    let mut session = model.session(RunOptions::new(Policy::Adaptive));
    let mut seen = Vec::new();
    let r = pollster::block_on(
        session.generate_ids_observed(&prompt, &greedy(12), &mut |t| {
            seen.push(t.token);
            if t.index == 3 {
                gpu.destroy();
            }
        }),
    );
    let e = r.expect_err("generation goes on after the loss");
    assert!(e.is_device_lost(), "{e}");
    assert_eq!(seen, want[..4], "the tokens before the loss");
    // Every later call fails at once with the loss.
    let again = session.generate_ids_blocking(&prompt, &greedy(4), &mut |_| {});
    assert!(again.is_err_and(|e| e.is_device_lost()));
    let fresh = model
        .session(RunOptions::new(Policy::Adaptive))
        .forward_blocking(&prompt);
    assert!(fresh.is_err_and(|e| e.is_device_lost()));
    let backing: dynrt::tensor::Backing = Arc::new(TinyLlama::default().build(5).unwrap());
    let reload = Model::from_backing(&engine, backing, ModelOptions::default());
    assert!(reload.is_err_and(|e| e.is_device_lost()));
    // Recovery: a new device and the model loaded again give the same tokens.
    let recovered = Engine::new(testing::fresh_gpu_or_skip(test).expect("a new device"));
    let got = tiny(&recovered)
        .session(RunOptions::new(Policy::Adaptive))
        .generate_ids_blocking(&prompt, &greedy(12), &mut |_| {})
        .unwrap()
        .tokens;
    assert_eq!(got, want);
}

#[test]
fn a_batched_step_of_eight_streams_loses_its_device_and_later_calls_fail_fast() {
    let test = "a_batched_step_of_eight_streams_loses_its_device_and_later_calls_fail_fast";
    let Some(gpu) = testing::fresh_gpu_or_skip(test) else {
        return;
    };
    let engine = Engine::new(gpu.clone());
    let model = tiny(&engine);
    let mut batch = BatchEngine::new(
        &model,
        BatchOptions {
            page_size: 8,
            pool_tokens: 512,
            step_tokens: 32,
            max_batch: 8,
            ..BatchOptions::default()
        },
    )
    .unwrap();
    for k in 0..8u32 {
        let prompt: Vec<u32> = (0..5).map(|i| (i * 13 + k * 31 + 2) % 250).collect();
        batch.add(&prompt, greedy(200)).unwrap();
    }
    // The steps read the prompts until every stream has its first token (the rows of a step
    // are shared fairly among the prompts, so a first step may read a part of each and give
    // no token), then one step decodes all eight streams; then another thread destroys the
    // device while this one keeps stepping: the loss lands in the middle of a step or
    // between two.
    let mut first = 0;
    while first < 8 {
        first += batch.step_blocking().unwrap().len();
        assert!(batch.stats().steps < 10, "the prompts are never read");
    }
    assert_eq!(batch.step_blocking().unwrap().len(), 8);
    assert_eq!(batch.stats().last_sequences, 8);
    let steps = Arc::new(AtomicUsize::new(0));
    let started = Arc::new(AtomicBool::new(false));
    let killer = std::thread::spawn({
        let (gpu, steps, started) = (gpu.clone(), steps.clone(), started.clone());
        move || {
            while !started.load(Ordering::Acquire) {
                std::thread::yield_now();
            }
            // Let one step begin, then take the device away.
            while steps.load(Ordering::Acquire) < 1 {
                std::thread::yield_now();
            }
            gpu.destroy();
        }
    });
    started.store(true, Ordering::Release);
    let error = loop {
        steps.fetch_add(1, Ordering::AcqRel);
        match batch.step_blocking() {
            Ok(tokens) => assert!(!tokens.is_empty(), "the streams stopped without an error"),
            Err(e) => break e,
        }
        assert!(
            steps.load(Ordering::Acquire) < 10_000,
            "the loss never reached the engine"
        );
    };
    killer.join().unwrap();
    assert!(error.is_device_lost(), "{error}");
    // Later calls fail at once with the loss.
    assert!(batch.step_blocking().is_err_and(|e| e.is_device_lost()));
    assert!(batch
        .add(&[1, 2, 3], greedy(4))
        .is_err_and(|e| e.is_device_lost()));
    assert!(BatchEngine::new(&model, BatchOptions::default()).is_err_and(|e| e.is_device_lost()));
}

#[test]
fn the_scheduler_fails_every_request_in_flight_with_the_loss() {
    let test = "the_scheduler_fails_every_request_in_flight_with_the_loss";
    let Some(gpu) = testing::fresh_gpu_or_skip(test) else {
        return;
    };
    let engine = Engine::new(gpu.clone());
    let model = tiny(&engine);
    let mut scheduler = Scheduler::new(
        model,
        SchedulerOptions::new(1 << 20, RunOptions::new(Policy::Adaptive)),
    )
    .unwrap();
    let mut ids = Vec::new();
    for k in 0..8u32 {
        let prompt = Prompt::Ids((0..6).map(|i| (i * 7 + k * 17 + 1) % 250).collect());
        ids.push(scheduler.submit(Request::new(prompt, greedy(50))).unwrap());
    }
    let first = scheduler.step_blocking();
    let started = first
        .iter()
        .filter(|e| matches!(e, SchedulerEvent::Started { .. }))
        .count();
    assert_eq!(started, 8, "{first:?}");
    gpu.destroy();
    let events = scheduler.step_blocking();
    let mut failed = Vec::new();
    for e in &events {
        if let SchedulerEvent::Failed { id, error } = e {
            assert!(
                matches!(error, LlmError::DeviceLost(_)),
                "request {id}: {error}"
            );
            failed.push(*id);
        }
    }
    failed.sort();
    assert_eq!(failed, ids, "{events:?}");
    // A request submitted after the loss fails at its first step with the loss.
    let late = scheduler
        .submit(Request::new(Prompt::Ids(vec![4, 5, 6]), greedy(4)))
        .unwrap();
    let events = scheduler.step_blocking();
    assert!(
        events.iter().any(|e| matches!(
            e,
            SchedulerEvent::Failed { id, error: LlmError::DeviceLost(_) } if *id == late
        )),
        "{events:?}"
    );
}
