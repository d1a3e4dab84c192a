//! `dynrt bench kernels [--json]`: elementwise add bandwidth against `copy_buffer_to_buffer`
//! for the same bytes moved, and tiled-matmul GFLOP/s for 256, 512 and 1024 square sizes.
//!
//! Timing: each measurement records `reps` identical dispatches (or copies) into one command
//! buffer, submits it, and waits for the device (`device.poll` wait); the best of `rounds`
//! such submits counts, after one warm-up submit that also compiles the pipeline. Wall-clock
//! time, not timestamp queries: software adapters rarely offer them, and the same method on
//! both sides keeps the add/copy ratio fair.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use dynrt::gpu::kernels::{Kernels, Operand, TensorRef, UniformArena};
use dynrt::gpu::{wgpu, BufferDesc, Engine, Gpu, GpuOptions};
use dynrt::graph::{BinaryOp, Op};
use dynrt::memory::AllocKind;
use dynrt::rng::SplitMix64;
use dynrt::shape::{DType, Shape};

/// Arguments of `dynrt bench kernels`.
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
struct Report {
    adapter: String,
    add_bandwidth_gbps: f64,
    copy_bandwidth_gbps: f64,
    add_vs_copy: f64,
    matmul_gflops: MatMulGflops,
}

/// Seconds for the fastest of `rounds` submits of what `record` encodes, after one warm-up.
fn best_seconds(
    gpu: &Gpu,
    rounds: u32,
    mut record: impl FnMut(&mut wgpu::CommandEncoder) -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    let mut best = f64::INFINITY;
    for round in 0..=rounds {
        let mut enc = gpu
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("bench kernels"),
            });
        record(&mut enc)?;
        let t0 = Instant::now();
        gpu.queue().submit([enc.finish()]);
        gpu.device()
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| anyhow::anyhow!("device poll failed: {e}"))?;
        let dt = t0.elapsed().as_secs_f64();
        if round > 0 {
            best = best.min(dt);
        }
    }
    Ok(best)
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

/// Runs `op` `reps` times per submit on fresh operands; returns the best seconds per dispatch.
/// What every measurement needs.
struct Bench {
    gpu: Gpu,
    engine: Engine,
    kernels: Kernels,
    rounds: u32,
}

fn time_op(
    b: &mut Bench,
    op: &Op,
    shapes: &[Shape],
    out: &Shape,
    reps: u32,
) -> anyhow::Result<f64> {
    let (gpu, engine, kernels, rounds) = (&b.gpu, &b.engine, &mut b.kernels, b.rounds);
    let mut rng = SplitMix64::new(42);
    let inputs = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| {
            filled(
                engine,
                &format!("bench input {i}"),
                s.num_elements()?,
                &mut rng,
            )
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let out_buf = filled(engine, "bench output", out.num_elements()?, &mut rng)?;
    let mut uniforms = UniformArena::new(gpu.device());
    let secs = best_seconds(gpu, rounds, |enc| {
        uniforms.reset();
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some(op.name()),
                timestamp_writes: None,
            });
            let operands: Vec<Operand<'_>> = inputs
                .iter()
                .zip(shapes)
                .map(|(b, s)| Operand {
                    tensor: TensorRef {
                        buffer: b.raw(),
                        offset_bytes: 0,
                        size_bytes: b.size_bytes(),
                    },
                    shape: s,
                    dtype: DType::F32,
                })
                .collect();
            let output = Operand {
                tensor: TensorRef {
                    buffer: out_buf.raw(),
                    offset_bytes: 0,
                    size_bytes: out_buf.size_bytes(),
                },
                shape: out,
                dtype: DType::F32,
            };
            for _ in 0..reps {
                kernels.encode(&mut pass, &mut uniforms, op, &operands, &output)?;
            }
        }
        uniforms.flush(gpu.queue());
        Ok(())
    })?;
    Ok(secs / reps as f64)
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let gpu = Gpu::new_blocking(GpuOptions::from_env()?).context("no adapter for the benchmark")?;
    let mut b = Bench {
        engine: Engine::new(gpu.clone()),
        kernels: Kernels::new(gpu.device()),
        gpu: gpu.clone(),
        rounds: args.rounds,
    };
    let engine = b.engine.clone();
    let adapter = format!(
        "{} ({:?})",
        gpu.adapter_info().name,
        gpu.adapter_info().backend
    );

    // Elementwise add: reads 2 and writes 1 operand.
    let n = args.add_elements.max(1024);
    let shape = Shape::new(vec![n]);
    let reps = 10;
    let add_s = time_op(
        &mut b,
        &Op::Binary(BinaryOp::Add),
        &[shape.clone(), shape.clone()],
        &shape,
        reps,
    )?;
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
            enc.copy_buffer_to_buffer(src.raw(), 0, dst.raw(), 0, copy_bytes);
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
            &mut b,
            &Op::MatMul { transpose_b: false },
            &[s.clone(), s.clone()],
            &s,
            reps,
        )?;
        gflops[slot] = flops / secs / 1e9;
    }

    let report = Report {
        adapter,
        add_bandwidth_gbps: add_gbps,
        copy_bandwidth_gbps: copy_gbps,
        add_vs_copy: add_gbps / copy_gbps,
        matmul_gflops: MatMulGflops {
            m256: gflops[0],
            m512: gflops[1],
            m1024: gflops[2],
        },
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!("adapter: {}", report.adapter);
        println!(
            "add   {n} f32 elements: {:.2} GB/s (read+write), {:.3} ms per dispatch",
            report.add_bandwidth_gbps,
            add_s * 1e3
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
            &mut b,
            &Op::MatMul { transpose_b: false },
            &[a, w],
            &out,
            10,
        )?;
        println!(
            "matmul 1x768 @ 768x2304 (decode step, small-M kernel): {:.1} GFLOP/s, {:.3} ms",
            2.0 * 768.0 * 2304.0 / secs / 1e9,
            secs * 1e3
        );
        let st = b.kernels.stats();
        println!("pipelines: {} compiled, {} cache hits", st.misses, st.hits);
    }
    Ok(ExitCode::SUCCESS)
}
