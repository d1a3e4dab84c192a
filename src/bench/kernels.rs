//! `dynrt-bench kernels [--json]`: elementwise add bandwidth against `copy_buffer_to_buffer`
//! for the same bytes moved, tiled-matmul GFLOP/s for 256, 512 and 1024 square sizes, and
//! the `linear` op on quantized weights at a real model's shapes ([`super::linear`];
//! `--only-linear`, `--no-linear`).
//!
//! Timing: each measurement records `reps` identical dispatches (or copies) into one command
//! buffer, submits it, and waits for the device (`device.poll` wait); the best of `rounds`
//! such submits counts, after one warm-up submit that also compiles the pipeline. Wall-clock
//! time, not timestamp queries: software adapters rarely offer them, and the same method on
//! both sides keeps the add/copy ratio fair.

use std::process::ExitCode;

use anyhow::Context;
use dynrt::gpu::bench::Recording;
use dynrt::gpu::kernels::{Kernels, Operand, TensorRef, UniformArena, WeightLayout};
use dynrt::gpu::{BufferDesc, Engine, Gpu, GpuOptions};
use dynrt::graph::{ops, BinaryOp, Op};
use dynrt::memory::AllocKind;
use dynrt::rng::SplitMix64;
use dynrt::shape::{DType, Shape};
use dynrt::tensor::HostTensor;

/// Arguments of `dynrt-bench kernels`.
#[derive(clap::Args)]
pub struct Args {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Elements per add operand (f32); the add moves 3x this many x 4 bytes.
    #[arg(long, default_value_t = 4 << 20)]
    add_elements: u64,
    /// Submits per measurement; the fastest counts.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Only the `linear` section (quantized projections), not the add and matmul ones.
    #[arg(long)]
    only_linear: bool,
    /// Skip the `linear` section.
    #[arg(long, conflicts_with = "only_linear")]
    no_linear: bool,
    /// Rows of x (M) at which the `linear` section measures each shape, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,128,512")]
    linear_m: Vec<u64>,
    /// Also measure the 576->49152 head at M > 1 (tens of seconds per call on a software
    /// adapter; a prompt runs the head for its last position only).
    #[arg(long)]
    linear_head_prefill: bool,
    /// Also measure the hardware-GPU kernels on a software adapter (forced, as the tests run
    /// them; a hardware GPU measures them always).
    #[arg(long)]
    gpu_kernels: bool,
    /// M = N = K of the square q4_1 problem that compares the prefill kernels with the f32
    /// matmul (0: none).
    #[arg(long, default_value_t = 1024)]
    square: u64,
}

#[derive(serde::Serialize)]
struct MatMulGflops {
    #[serde(rename = "256")]
    m256: f64,
    #[serde(rename = "512")]
    m512: f64,
    #[serde(rename = "1024")]
    m1024: f64,
}

#[derive(serde::Serialize)]
struct BaseReport {
    add_bandwidth_gbps: f64,
    /// The process's CPU time per add dispatch (all threads), in ms; null off Linux.
    add_cpu_ms: Option<f64>,
    copy_bandwidth_gbps: f64,
    add_vs_copy: f64,
    matmul_gflops: MatMulGflops,
}

#[derive(serde::Serialize)]
struct Report {
    adapter: String,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    base: Option<BaseReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    linear: Option<super::linear::LinearReport>,
}

/// Seconds for the fastest of `rounds` submits of what `record` encodes, after one warm-up.
pub(super) fn best_seconds(
    gpu: &Gpu,
    rounds: u32,
    record: impl FnMut(&mut Recording) -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    Ok(timed_rounds(gpu, rounds, record)?.best_s)
}

/// What [`timed_rounds`] measured.
pub(super) struct Timing {
    /// Wall-clock seconds of the fastest submit (submit to idle).
    pub(super) best_s: f64,
    /// Mean CPU seconds of the process's threads (the software adapter's included) per
    /// submit, over the timed submits; `None` where the OS does not tell (not Linux). Less
    /// sensitive than wall-clock time to other processes on a loaded machine.
    pub(super) cpu_s: Option<f64>,
}

/// CPU time of every thread of this process so far, from `/proc/self/task/*/schedstat`
/// (nanoseconds on the CPU); `None` where that does not exist.
pub(super) fn process_cpu_seconds() -> Option<f64> {
    let mut ns = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        // A thread that exited between the listing and the read counts nothing.
        if let Ok(s) = std::fs::read_to_string(task.path().join("schedstat")) {
            ns += s.split_whitespace().next()?.parse::<u64>().ok()?;
        }
    }
    Some(ns as f64 * 1e-9)
}

/// [`best_seconds`], also measuring the CPU time the submits cost ([`Timing::cpu_s`]).
pub(super) fn timed_rounds(
    gpu: &Gpu,
    rounds: u32,
    mut record: impl FnMut(&mut Recording) -> anyhow::Result<()>,
) -> anyhow::Result<Timing> {
    let mut best = f64::INFINITY;
    let mut cpu = Some(0.0);
    for round in 0..=rounds {
        let (dt, c) = submit_seconds(gpu, &mut record)?;
        if round > 0 {
            best = best.min(dt);
            cpu = cpu.zip(c).map(|(sum, c)| sum + c);
        }
    }
    Ok(Timing {
        best_s: best,
        cpu_s: cpu.map(|c| c / f64::from(rounds.max(1))),
    })
}

/// One submit of what `record` encodes: the wall-clock seconds from the submit until the
/// device is idle again, and the process's CPU seconds over the same span
/// ([`process_cpu_seconds`]; recording is outside both).
fn submit_seconds(
    gpu: &Gpu,
    mut record: impl FnMut(&mut Recording) -> anyhow::Result<()>,
) -> anyhow::Result<(f64, Option<f64>)> {
    let mut rec = Recording::new(gpu, "bench kernels");
    record(&mut rec)?;
    let c0 = process_cpu_seconds();
    let dt = rec.submit_and_wait()?;
    let cpu = c0.zip(process_cpu_seconds()).map(|(a, b)| b - a);
    Ok((dt, cpu))
}

fn filled(
    engine: &Engine,
    label: &str,
    elements: u64,
    rng: &mut SplitMix64,
) -> anyhow::Result<dynrt::gpu::Buffer> {
    let values: Vec<f32> = (0..elements).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let buf = engine.allocate(&BufferDesc {
        label,
        size_bytes: elements * 4,
        kind: AllocKind::UsmDevice,
    })?;
    engine.write(&buf, 0, bytemuck::cast_slice(&values))?;
    Ok(buf)
}

/// What every measurement needs.
pub(super) struct Bench {
    pub(super) gpu: Gpu,
    pub(super) engine: Engine,
    pub(super) kernels: Kernels,
    pub(super) rounds: u32,
}

/// Runs `op` `reps` times per submit on fresh f32 operands of `shapes`; returns the timing
/// per dispatch (best wall-clock, mean CPU).
fn time_op(
    b: &mut Bench,
    op: &Op,
    shapes: &[Shape],
    out: &Shape,
    reps: u32,
) -> anyhow::Result<Timing> {
    let mut rng = SplitMix64::new(42);
    let inputs: Vec<HostTensor> = shapes
        .iter()
        .map(|s| {
            let v: Vec<f32> = (0..s.num_elements()?)
                .map(|_| rng.uniform(-1.0, 1.0))
                .collect();
            Ok(HostTensor::f32(s.clone(), &v))
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(time_typed(b, op, &inputs, &[], out, reps)?.0)
}

/// Runs `op` `reps` times per submit on `inputs` (any types) into an f32 output of shape
/// `out`; returns the timing per dispatch (best wall-clock, mean CPU) and the output's
/// values, read back after the last submit.
pub(super) fn time_typed(
    b: &mut Bench,
    op: &Op,
    inputs: &[HostTensor],
    layouts: &[WeightLayout],
    out: &Shape,
    reps: u32,
) -> anyhow::Result<(Timing, Vec<f32>)> {
    let (gpu, engine, kernels, rounds) = (&b.gpu, &b.engine, &mut b.kernels, b.rounds);
    let mut rng = SplitMix64::new(43);
    let bufs = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let buf = engine.allocate(&BufferDesc {
                label: &format!("bench input {i}"),
                size_bytes: (t.bytes.len() as u64).div_ceil(4).max(1) * 4,
                kind: AllocKind::UsmDevice,
            })?;
            let mut bytes = t.bytes.clone();
            bytes.resize(buf.size_bytes() as usize, 0);
            engine.write(&buf, 0, &bytes)?;
            Ok(buf)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let out_buf = filled(engine, "bench output", out.num_elements()?, &mut rng)?;
    let mut uniforms = UniformArena::new(engine);
    let t = timed_rounds(gpu, rounds, |enc| {
        uniforms.reset();
        {
            let mut pass = enc.compute_pass(op.name());
            let operands: Vec<Operand<'_>> = bufs
                .iter()
                .zip(inputs)
                .zip(layouts.iter().chain(std::iter::repeat(&WeightLayout::File)))
                .map(|((b, t), &layout)| Operand {
                    tensor: TensorRef {
                        buffer: b,
                        offset_bytes: 0,
                        size_bytes: b.size_bytes(),
                    },
                    shape: &t.shape,
                    dtype: t.dtype,
                    strides: None,
                    layout,
                })
                .collect();
            let output = Operand {
                tensor: TensorRef {
                    buffer: &out_buf,
                    offset_bytes: 0,
                    size_bytes: out_buf.size_bytes(),
                },
                shape: out,
                dtype: DType::F32,
                strides: None,
                layout: WeightLayout::File,
            };
            for _ in 0..reps {
                kernels.encode(&mut pass, &mut uniforms, op, &operands, &output)?;
            }
        }
        uniforms.flush();
        Ok(())
    })?;
    let bytes = engine.read_blocking(&out_buf, 0, out.num_elements()? * 4)?;
    let values = bytemuck::pod_collect_to_vec::<u8, f32>(&bytes);
    let per = f64::from(reps.max(1));
    Ok((
        Timing {
            best_s: t.best_s / per,
            cpu_s: t.cpu_s.map(|c| c / per),
        },
        values,
    ))
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let gpu = Gpu::new_blocking(GpuOptions::from_env()?).context("no adapter for the benchmark")?;
    let mut b = Bench {
        engine: Engine::new(gpu.clone()),
        kernels: Kernels::new(&gpu),
        gpu: gpu.clone(),
        rounds: args.rounds,
    };
    let adapter = format!(
        "{} ({:?})",
        gpu.adapter_info().name,
        gpu.adapter_info().backend
    );
    if !args.json {
        println!("adapter: {adapter}");
    }
    let base = if args.only_linear {
        None
    } else {
        Some(base_section(&mut b, &args)?)
    };
    let linear = if args.no_linear {
        None
    } else {
        let r = super::linear::run(
            &mut b,
            &args.linear_m,
            args.linear_head_prefill,
            args.gpu_kernels,
            args.square,
        )?;
        if !args.json {
            super::linear::print(&r);
        }
        Some(r)
    };
    if args.json {
        let report = Report {
            adapter,
            base,
            linear,
        };
        println!("{}", serde_json::to_string(&report)?);
    }
    Ok(ExitCode::SUCCESS)
}

/// The add against copy bandwidth and the f32 matmul GFLOP/s (printed unless `--json`).
fn base_section(b: &mut Bench, args: &Args) -> anyhow::Result<BaseReport> {
    let (gpu, engine) = (b.gpu.clone(), b.engine.clone());
    // Elementwise add: reads 2 and writes 1 operand.
    let n = args.add_elements.max(1024);
    let shape = Shape::new(vec![n]);
    let reps = 10;
    let add = time_op(
        b,
        &Op::Binary(BinaryOp::Add),
        &[shape.clone(), shape.clone()],
        &shape,
        reps,
    )?;
    let (add_s, add_cpu_s) = (add.best_s, add.cpu_s);
    let moved = 3.0 * n as f64 * 4.0;
    let add_gbps = moved / add_s / 1e9;

    // The physical limit: a buffer copy moving the same bytes (reads 1.5 n words, writes 1.5 n).
    let copy_bytes = (3 * n * 4 / 2).div_ceil(4) * 4;
    let src = engine.allocate(&BufferDesc {
        label: "bench copy src",
        size_bytes: copy_bytes,
        kind: AllocKind::UsmDevice,
    })?;
    let dst = engine.allocate(&BufferDesc {
        label: "bench copy dst",
        size_bytes: copy_bytes,
        kind: AllocKind::UsmDevice,
    })?;
    let copy_s = best_seconds(&gpu, args.rounds, |enc| {
        for _ in 0..reps {
            enc.copy(&src, &dst, copy_bytes);
        }
        Ok(())
    })? / reps as f64;
    let copy_gbps = 2.0 * copy_bytes as f64 / copy_s / 1e9;
    drop((src, dst));

    let mut gflops = [0.0f64; 3];
    for (slot, size) in [256u64, 512, 1024].into_iter().enumerate() {
        let s = Shape::new(vec![size, size]);
        // About 0.5 GFLOP per submit so small sizes are not dominated by submit overhead.
        let flops = 2.0 * (size as f64).powi(3);
        let reps = ((0.5e9 / flops).round() as u32).clamp(1, 64);
        let secs = time_op(
            b,
            &Op::MatMul(ops::MatMul { transpose_b: false }),
            &[s.clone(), s.clone()],
            &s,
            reps,
        )?
        .best_s;
        gflops[slot] = flops / secs / 1e9;
    }

    let report = BaseReport {
        add_bandwidth_gbps: add_gbps,
        add_cpu_ms: add_cpu_s.map(|c| c * 1e3),
        copy_bandwidth_gbps: copy_gbps,
        add_vs_copy: add_gbps / copy_gbps,
        matmul_gflops: MatMulGflops {
            m256: gflops[0],
            m512: gflops[1],
            m1024: gflops[2],
        },
    };
    if !args.json {
        println!(
            "add   {n} f32 elements: {:.2} GB/s (read+write), {:.3} ms per dispatch, {} CPU ms per dispatch (all threads)",
            report.add_bandwidth_gbps,
            add_s * 1e3,
            report
                .add_cpu_ms
                .map_or("–".to_string(), |c| format!("{c:.3}"))
        );
        println!(
            "copy  {copy_bytes} bytes: {:.2} GB/s (read+write), {:.3} ms per copy",
            report.copy_bandwidth_gbps,
            copy_s * 1e3
        );
        println!("add / copy: {:.2} (target >= 0.7)", report.add_vs_copy);
        for (size, g) in [256, 512, 1024].iter().zip(gflops) {
            println!("matmul {size}x{size}x{size}: {g:.1} GFLOP/s");
        }
        // A decode step's projection (one token, GPT-2 small): the small-M kernel.
        let (a, w) = (Shape::new(vec![1, 768]), Shape::new(vec![768, 2304]));
        let out = Shape::new(vec![1, 2304]);
        let secs = time_op(
            b,
            &Op::MatMul(ops::MatMul { transpose_b: false }),
            &[a, w],
            &out,
            10,
        )?
        .best_s;
        println!(
            "matmul 1x768 @ 768x2304 (decode step, small-M kernel): {:.1} GFLOP/s, {:.3} ms",
            2.0 * 768.0 * 2304.0 / secs / 1e9,
            secs * 1e3
        );
        // A convolution, implicit GEMM on the matmul tiles: 3x3, 64 -> 64 channels on 56x56
        // with pad 1 (a ResNet stage), against a matmul of the same GEMM, [64, 576] x [576,
        // 3136]: what gathering B from the image while staging it costs.
        let conv = Op::Conv(ops::Conv {
            window: ops::conv::Window {
                pads: vec![1; 4],
                ..ops::conv::Window::default()
            },
            group: 1,
        });
        let image = Shape::new(vec![1, 64, 56, 56]);
        let conv_shapes = [
            image.clone(),
            Shape::new(vec![64, 64, 3, 3]),
            Shape::new(vec![64]),
        ];
        let conv_s = time_op(b, &conv, &conv_shapes, &image, 2)?.best_s;
        let gemm = [Shape::new(vec![64, 576]), Shape::new(vec![576, 3136])];
        let gemm_out = Shape::new(vec![64, 3136]);
        let mm = Op::MatMul(ops::MatMul { transpose_b: false });
        let gemm_s = time_op(b, &mm, &gemm, &gemm_out, 2)?.best_s;
        let flops = 2.0 * 64.0 * 576.0 * 3136.0;
        println!(
            "conv 3x3 64->64 on 56x56 (implicit GEMM): {:.1} GFLOP/s, {:.3} ms; the same GEMM as a matmul: {:.1} GFLOP/s, {:.3} ms",
            flops / conv_s / 1e9,
            conv_s * 1e3,
            flops / gemm_s / 1e9,
            gemm_s * 1e3
        );
        // What a tiny dispatch costs end to end (recorded 200 times in one submit): the
        // adapter's per-dispatch floor, which dominates a small model's decode step.
        let tiny = Shape::new(vec![1024]);
        let secs = time_op(
            b,
            &Op::Binary(BinaryOp::Add),
            &[tiny.clone(), tiny.clone()],
            &tiny,
            200,
        )?
        .best_s;
        println!(
            "add of 1024 elements, 200 per submit: {:.1} us per dispatch (host + device)",
            secs * 1e6
        );
        let st = b.kernels.stats();
        println!("pipelines: {} compiled, {} cache hits", st.misses, st.hits);
    }
    Ok(report)
}
