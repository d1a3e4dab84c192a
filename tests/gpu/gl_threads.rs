//! One GL device driven from several threads while one of them keeps it busy for longer than
//! wgpu's GL backend waits for its context (6 s, then it panics "Could not lock adapter
//! context"): dynrt serialises its GL device calls behind a lock that waits without a deadline
//! (docs/design.md, "Threads and the GL context"), so the other threads wait their turn and
//! then get their work done.
//!
//! The long work is one submit of many matrix products into ping-pong buffers: on llvmpipe a
//! submit computes before it returns, holding the GL context all along, which is what a busy
//! machine does to an ordinary forward pass. The submit is sized from a timed short one, and
//! made longer until it really held the device past the timeout. Meanwhile the other threads
//! create and fill buffers (`mapped_at_creation` and unmap: the call that panicked in CI), read
//! buffers back (map and poll) and compile and run kernels on fresh `Kernels`. The products
//! multiply by the identity, so the result must be the input exactly.

use dynrt::gpu::kernels::{Kernels, Operand, TensorRef, UniformArena};
use dynrt::gpu::{testing, wgpu, Buffer, BufferDesc, Engine, Frame, Gpu};
use dynrt::graph::ops::MatMul;
use dynrt::graph::{BinaryOp, Op};
use dynrt::memory::AllocKind;
use dynrt::rng::SplitMix64;
use dynrt::shape::{DType, Shape};
use dynrt::tensor::HostTensor;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// wgpu-hal's GL context lock timeout (`CONTEXT_LOCK_TIMEOUT_SECS` in its `gles/egl.rs`), with
/// a margin: the long submit must hold the device at least this long for the test to prove
/// anything.
const HOLD: Duration = Duration::from_millis(7_000);
/// Side of the square matrices.
const N: u64 = 384;

fn buffer(engine: &Engine, label: &str, data: &[f32]) -> Buffer {
    let b = engine
        .allocate(&BufferDesc {
            label,
            size_bytes: N * N * 4,
            kind: AllocKind::UsmDevice,
        })
        .unwrap();
    engine.write(&b, 0, bytemuck::cast_slice(data)).unwrap();
    b
}

fn operand<'a>(buffer: &'a Buffer, shape: &'a Shape) -> Operand<'a> {
    Operand {
        tensor: TensorRef {
            buffer,
            offset_bytes: 0,
            size_bytes: N * N * 4,
        },
        shape,
        dtype: DType::F32,
        strides: None,
        layout: dynrt::gpu::kernels::WeightLayout::File,
    }
}

/// `products` identity products of `x` in one submit (ping-pong between `a` and `b`), waited
/// for; returns the buffer holding the result and how long the submit and its wait took.
fn products<'a>(
    engine: &Engine,
    kernels: &mut Kernels,
    bufs: [&'a Buffer; 3],
    products: u32,
) -> (&'a Buffer, Duration) {
    let [a, b, identity] = bufs;
    let shape = Shape::new(vec![N, N]);
    let op = Op::MatMul(MatMul { transpose_b: false });
    let mut frame = Frame::begin(engine, kernels, UniformArena::new(engine), "long products");
    let mut from = a;
    for i in 0..products {
        let to = if i % 2 == 0 { b } else { a };
        frame
            .encode(
                &op,
                &[operand(from, &shape), operand(identity, &shape)],
                &operand(to, &shape),
            )
            .unwrap();
        from = to;
    }
    let started = Instant::now();
    let (submitted, _, _) = frame.submit();
    engine.gpu().poll_wait();
    let took = started.elapsed();
    pollster::block_on(submitted.check()).unwrap();
    (from, took)
}

/// The threads that use the device while the long submit holds it: each counts the calls it
/// completed.
fn spawn_workers(gpu: &Gpu, stop: &Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<u64>> {
    let allocate = {
        let (engine, stop) = (Engine::new(gpu.clone()), stop.clone());
        move || {
            let b = engine
                .allocate_init(
                    &BufferDesc {
                        label: "worker init",
                        size_bytes: 64,
                        kind: AllocKind::UsmDevice,
                    },
                    &[7u8; 64],
                )
                .unwrap();
            drop(b);
            !stop.load(Ordering::Acquire)
        }
    };
    let read = {
        let (engine, stop) = (Engine::new(gpu.clone()), stop.clone());
        let b = engine
            .allocate_init(
                &BufferDesc {
                    label: "worker read",
                    size_bytes: 256,
                    kind: AllocKind::UsmDevice,
                },
                &[3u8; 256],
            )
            .unwrap();
        move || {
            assert_eq!(engine.read_blocking(&b, 0, 256).unwrap(), vec![3u8; 256]);
            !stop.load(Ordering::Acquire)
        }
    };
    let kernels = {
        let (engine, stop) = (Engine::new(gpu.clone()), stop.clone());
        let x = HostTensor::f32(Shape::new(vec![64]), &[1.5; 64]);
        move || {
            let mut k = Kernels::new(engine.gpu());
            let add = Op::Binary(BinaryOp::Add);
            let out = dynrt::gpu::kernels::run::run_op(
                &engine,
                &mut k,
                &add,
                &[x.clone(), x.clone()],
                &Shape::new(vec![64]),
                DType::F32,
                0,
            )
            .unwrap();
            assert_eq!(out.to_f32(), vec![3.0; 64]);
            !stop.load(Ordering::Acquire)
        }
    };
    let work: Vec<Box<dyn FnMut() -> bool + Send>> =
        vec![Box::new(allocate), Box::new(read), Box::new(kernels)];
    work.into_iter()
        .map(|mut step| {
            std::thread::spawn(move || {
                let mut done = 0u64;
                loop {
                    let more = step();
                    done += 1;
                    if !more {
                        return done;
                    }
                }
            })
        })
        .collect()
}

#[test]
fn one_gl_device_serves_several_threads_while_a_submit_holds_it_for_seconds() {
    let name = "one_gl_device_serves_several_threads_while_a_submit_holds_it_for_seconds";
    let Some(gpu) = testing::gpus_or_skip(name)
        .into_iter()
        .find(|g| g.backend() == wgpu::Backend::Gl)
    else {
        eprintln!("SKIP {name}: no GL device in this run (WGPU_BACKEND leaves GL out)");
        return;
    };
    let engine = Engine::new(gpu.clone());
    let mut kernels = Kernels::new(&gpu);
    let mut rng = SplitMix64::new(36);
    let x: Vec<f32> = (0..N * N).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let eye: Vec<f32> = (0..N * N)
        .map(|i| if i / N == i % N { 1.0 } else { 0.0 })
        .collect();
    let (a, b, identity) = (
        buffer(&engine, "a", &x),
        buffer(&engine, "b", &x),
        buffer(&engine, "identity", &eye),
    );
    // Time a short submit (its pipeline compiled first) to size the long one.
    products(&engine, &mut kernels, [&a, &b, &identity], 2);
    let (_, short) = products(&engine, &mut kernels, [&a, &b, &identity], 4);
    let per_product = short.as_secs_f64().max(1e-4) / 4.0;
    let mut count = ((HOLD.as_secs_f64() * 1.3) / per_product)
        .ceil()
        .clamp(8.0, 20_000.0) as u32;
    let stop = Arc::new(AtomicBool::new(false));
    let mut held = Duration::ZERO;
    let mut completed = Vec::new();
    // The machine may get faster after the timing: lengthen the work until it held the device
    // long enough.
    for _ in 0..4 {
        stop.store(false, Ordering::Release);
        let workers = spawn_workers(&gpu, &stop);
        let (result, took) = products(&engine, &mut kernels, [&a, &b, &identity], count);
        let got = engine.read_blocking(result, 0, N * N * 4).unwrap();
        assert_eq!(
            got,
            bytemuck::cast_slice::<f32, u8>(&x),
            "the identity products changed the values"
        );
        stop.store(true, Ordering::Release);
        completed = workers
            .into_iter()
            .map(|w| w.join().expect("a thread using the GL device panicked"))
            .collect();
        held = took;
        if held >= HOLD {
            break;
        }
        count = count.saturating_mul(2);
    }
    assert!(
        held >= HOLD,
        "the long submit never held the device for {HOLD:?} (last: {held:?} for {count} products)"
    );
    assert!(
        completed.iter().all(|&n| n >= 1),
        "a thread completed no call: {completed:?}"
    );
    eprintln!(
        "{name}: {count} products held the GL device {:.1} s; the other threads completed {completed:?} calls",
        held.as_secs_f64()
    );
    assert!(
        gpu.uncaptured_errors().is_empty(),
        "{:?}",
        gpu.uncaptured_errors()
    );
}
