//! `dynrt bench kernels [--json]`: elementwise add bandwidth against `copy_buffer_to_buffer`
//! for the same bytes moved, tiled-matmul GFLOP/s for 256, 512 and 1024 square sizes, and
//! the `linear` op on quantized weights at a real model's shapes ([`super::bench_linear`];
//! `--only-linear`, `--no-linear`).
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
use dynrt::graph::{ops, BinaryOp, Op};
use dynrt::memory::AllocKind;
use dynrt::rng::SplitMix64;
use dynrt::shape::{DType, Shape};
use dynrt::tensor::HostTensor;

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
    /// Also time hand-written add variants (workgroup size, vec4s per invocation, bounds
    /// checks) and print them; for tuning the kernels.
    #[arg(long)]
    probe: bool,
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
    linear: Option<super::bench_linear::LinearReport>,
}

/// Seconds for the fastest of `rounds` submits of what `record` encodes, after one warm-up.
pub(super) fn best_seconds(
    gpu: &Gpu,
    rounds: u32,
    record: impl FnMut(&mut wgpu::CommandEncoder) -> anyhow::Result<()>,
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
fn process_cpu_seconds() -> Option<f64> {
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
    mut record: impl FnMut(&mut wgpu::CommandEncoder) -> anyhow::Result<()>,
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
    mut record: impl FnMut(&mut wgpu::CommandEncoder) -> anyhow::Result<()>,
) -> anyhow::Result<(f64, Option<f64>)> {
    let mut enc = gpu
        .device()
        .create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("bench kernels"),
        });
    record(&mut enc)?;
    let c0 = process_cpu_seconds();
    let t0 = Instant::now();
    gpu.queue().submit([enc.finish()]);
    gpu.device()
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| anyhow::anyhow!("device poll failed: {e}"))?;
    let dt = t0.elapsed().as_secs_f64();
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
    Ok(time_typed(b, op, &inputs, out, reps)?.0)
}

/// Runs `op` `reps` times per submit on `inputs` (any types) into an f32 output of shape
/// `out`; returns the timing per dispatch (best wall-clock, mean CPU) and the output's
/// values, read back after the last submit.
pub(super) fn time_typed(
    b: &mut Bench,
    op: &Op,
    inputs: &[HostTensor],
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
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some(op.name()),
                timestamp_writes: None,
            });
            let operands: Vec<Operand<'_>> = bufs
                .iter()
                .zip(inputs)
                .map(|(b, t)| Operand {
                    tensor: TensorRef {
                        buffer: b,
                        offset_bytes: 0,
                        size_bytes: b.size_bytes(),
                    },
                    shape: &t.shape,
                    dtype: t.dtype,
                    strides: None,
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
    if args.probe {
        probe2(&gpu, &b.engine, args.add_elements.max(1 << 16), args.rounds)?;
        probe(&gpu, &b.engine, args.add_elements.max(1024), args.rounds)?;
    }
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
        let r = super::bench_linear::run(&mut b, &args.linear_m, args.linear_head_prefill)?;
        if !args.json {
            super::bench_linear::print(&r);
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
        host_per_dispatch(b)?;
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

/// Where a probe kernel gets its element count and offsets.
#[derive(Clone, Copy, PartialEq)]
enum Params {
    /// Count and three element offsets from a uniform (dynrt's `FlatParams`).
    Uniform,
    /// Count from a uniform, no offsets (every operand bound at its start).
    UniformCount,
    /// The count is `arrayLength` of the output, no offsets.
    Length,
    /// The count is a constant in the source, no offsets.
    Constant,
}

/// One hand-written add kernel of the `--probe` matrix.
struct AddVariant {
    /// Invocations per workgroup.
    wg: u32,
    /// vec4s per invocation, at `j * wg + lid` within the workgroup's block (coalesced).
    per: u32,
    /// wgpu's bounds checks (`Restrict`: every index clamped to the binding) on or off.
    checked: bool,
    /// Inputs declared `read` (ONNX Runtime's form) instead of `read_write` (dynrt's: arena
    /// sub-ranges of one buffer may be bound as inputs and output of one dispatch).
    read_only: bool,
    /// Where the element count and the operands' element offsets come from.
    params: Params,
    /// The per-invocation loop written out (`per` statements) instead of a `for` loop.
    unrolled: bool,
}

impl AddVariant {
    fn name(&self) -> String {
        format!(
            "wg={} vec4/inv={} checked={} inputs={} params={} {}",
            self.wg,
            self.per,
            self.checked,
            if self.read_only { "read" } else { "read_write" },
            match self.params {
                Params::Uniform => "uniform+offsets",
                Params::UniformCount => "uniform",
                Params::Length => "arrayLength",
                Params::Constant => "constant",
            },
            if self.unrolled { "unrolled" } else { "loop" }
        )
    }

    fn wgsl(&self, n4: u64) -> String {
        let access = if self.read_only { "read" } else { "read_write" };
        let (wg, per) = (self.wg, self.per);
        let params = match self.params {
            Params::Uniform | Params::UniformCount => {
                "struct P { n: u32, oa: u32, ob: u32, oc: u32 }\n\
                 @group(0) @binding(3) var<uniform> p: P;\n"
                    .to_string()
            }
            Params::Constant => format!("const n = {n4}u;\n"),
            Params::Length => String::new(),
        };
        let n = match self.params {
            Params::Uniform | Params::UniformCount => "p.n",
            Params::Constant => "n",
            Params::Length => "arrayLength(&c)",
        };
        let one = |j: &str| {
            let access = if self.params == Params::Uniform {
                "c[p.oc + i] = a[p.oa + i] + b[p.ob + i];"
            } else {
                "c[i] = a[i] + b[i];"
            };
            format!("{{ let i = base + {j} * {wg}u + lid; if i < {n} {{ {access} }} }}\n")
        };
        let body = if self.unrolled {
            (0..per).map(|j| one(&format!("{j}u"))).collect::<String>()
        } else {
            format!("for (var j = 0u; j < {per}u; j++) {}", one("j"))
        };
        format!(
            "@group(0) @binding(0) var<storage, {access}> a: array<vec4<f32>>;\n\
             @group(0) @binding(1) var<storage, {access}> b: array<vec4<f32>>;\n\
             @group(0) @binding(2) var<storage, read_write> c: array<vec4<f32>>;\n\
             {params}\
             @compute @workgroup_size({wg}) fn main(@builtin(workgroup_id) wid: vec3<u32>,\n\
             @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{\n\
               let base = (wid.x + wid.y * nwg.x) * {per}u * {wg}u;\n\
               {body}\
             }}\n"
        )
    }
}

/// `--probe`: a matrix of hand-written add kernels outside [`Kernels`] (workgroup size,
/// vec4s per invocation, bounds checks, `read` vs `read_write` inputs, uniform vs constant
/// parameters, loop vs unrolled), to find what shape of kernel an adapter streams fast.
fn probe(gpu: &Gpu, engine: &Engine, n: u64, rounds: u32) -> anyhow::Result<()> {
    let mut rng = SplitMix64::new(7);
    let n = n / 4 * 4;
    let bufs = (0..3)
        .map(|i| filled(engine, &format!("probe {i}"), n, &mut rng))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let n4 = n / 4;
    let params: [u32; 4] = [n4 as u32, 0, 0, 0];
    let ubuf = engine.allocate_init(
        &BufferDesc {
            label: "probe params",
            size_bytes: 16,
            kind: AllocKind::ClMem,
        },
        bytemuck::bytes_of(&params),
    )?;
    let moved = 3.0 * n as f64 * 4.0;
    let dev = gpu.device();
    let max_dim = dev.limits().max_compute_workgroups_per_dimension;
    let v = |wg, per, checked, read_only, params, unrolled| AddVariant {
        wg,
        per,
        checked,
        read_only,
        params,
        unrolled,
    };
    use Params::*;
    let variants = [
        // ONNX Runtime's add (its WebGPU EP's WGSL): one vec4 per invocation, 64 per
        // workgroup, `read` inputs, the count from a uniform, no offsets; natively ONNX
        // Runtime runs it without bounds checks (Dawn's robustness off).
        v(64, 1, true, true, UniformCount, true),
        v(64, 1, false, true, UniformCount, true),
        // dynrt's flat4 entry point: 256 per workgroup, read_write, count and offsets from
        // the uniform; checked (before the study) and unchecked (now).
        v(256, 1, true, false, Uniform, true),
        v(256, 1, false, false, Uniform, true),
        // dynrt's flat4_aligned entry point (every operand at its binding's start): no
        // offsets read; unchecked is what runs now.
        v(256, 1, true, false, UniformCount, true),
        v(256, 1, false, false, UniformCount, true),
        // More vec4s per invocation, written out or looped, and other sources of the count.
        v(256, 2, true, false, Uniform, true),
        v(256, 4, true, false, Uniform, true),
        v(256, 4, true, false, Uniform, false),
        v(256, 2, false, false, Uniform, true),
        v(256, 4, false, false, Uniform, true),
        v(256, 4, false, false, Uniform, false),
        v(64, 4, true, false, Uniform, true),
        v(256, 1, true, false, Length, true),
        v(256, 1, true, false, Constant, true),
    ];
    let mut compiled = Vec::new();
    for var in &variants {
        let desc = wgpu::ShaderModuleDescriptor {
            label: Some("probe"),
            source: wgpu::ShaderSource::Wgsl(var.wgsl(n4).into()),
        };
        let module = if var.checked {
            dev.create_shader_module(desc)
        } else {
            // SAFETY: every access is guarded by `i < n`, the element count of all three
            // bindings (offsets are 0).
            unsafe {
                dev.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked())
            }
        };
        let mut bound: Vec<&dynrt::gpu::Buffer> = bufs.iter().collect();
        if matches!(var.params, Params::Uniform | Params::UniformCount) {
            bound.push(&ubuf);
        }
        let (pipe, bg) = raw_pipeline(dev, &module, "probe", &bound);
        let groups = n4.div_ceil(u64::from(var.wg * var.per)) as u32;
        let grid = if groups <= max_dim {
            (groups, 1)
        } else {
            (max_dim, groups.div_ceil(max_dim))
        };
        compiled.push((pipe, bg, grid));
    }
    // Interleaved: every round times each variant once (one submit of `reps` dispatches, in
    // an order that rotates), so the load of a shared machine falls on all of them alike;
    // the median over the rounds counts. Beside the wall time, the process's CPU time over
    // all rounds: on a software adapter the device's work is this process's threads, and
    // CPU time is far less disturbed by other processes than wall time.
    let reps = 10;
    let rounds = rounds.max(3) as usize;
    let mut secs = vec![Vec::with_capacity(rounds); variants.len()];
    let mut cpu = vec![Some(0.0f64); variants.len()];
    for round in 0..=rounds {
        for k in 0..variants.len() {
            let idx = (k + round) % variants.len();
            let (pipe, bg, (gx, gy)) = &compiled[idx];
            let (s, c) = submit_seconds(gpu, |enc| {
                let mut pass = enc.begin_compute_pass(&Default::default());
                pass.set_pipeline(pipe);
                pass.set_bind_group(0, bg, &[]);
                for _ in 0..reps {
                    pass.dispatch_workgroups(*gx, *gy, 1);
                }
                Ok(())
            })?;
            // Round 0 warms every pipeline up.
            if round > 0 {
                secs[idx].push(s / f64::from(reps));
                cpu[idx] = cpu[idx].zip(c).map(|(sum, c)| sum + c);
            }
        }
    }
    let per_dispatch = (rounds as f64) * f64::from(reps);
    for ((var, s), c) in variants.iter().zip(&mut secs).zip(&cpu) {
        s.sort_by(f64::total_cmp);
        let (lo, med, hi) = (s[0], s[s.len() / 2], s[s.len() - 1]);
        let cpu = c.map_or("cpu –".to_string(), |c| {
            format!("cpu {:.3} ms", c / per_dispatch * 1e3)
        });
        println!(
            "probe add {}: {:.2} GB/s median ({:.2}-{:.2}), {:.3} ms, {cpu}",
            var.name(),
            moved / med / 1e9,
            moved / hi / 1e9,
            moved / lo / 1e9,
            med * 1e3
        );
    }
    Ok(())
}

/// `--probe`: compute-only and read-only kernels (what limits a software adapter).
fn probe2(gpu: &Gpu, engine: &Engine, n: u64, rounds: u32) -> anyhow::Result<()> {
    let mut rng = SplitMix64::new(7);
    let a = filled(engine, "probe2 a", n, &mut rng)?;
    let c = filled(engine, "probe2 c", n, &mut rng)?;
    let dev = gpu.device();
    let rw = "var<storage, read_write> a: array<vec4<f32>>;";
    let ro = "var<storage, read> a: array<vec4<f32>>;";
    let ro1 = "var<storage, read> a: array<f32>;";
    let kernels = [
        ("compute 1024 vec4 fma/inv", rw, "var x = vec4<f32>(f32(lid)); for (var j = 0u; j < 1024u; j++) { x = x * 1.0001 + vec4<f32>(0.5); } c[g * 64u + lid] = x;", 1024.0 * 8.0, 0.0),
        ("read rw 16 vec4/inv", rw, "var x = vec4<f32>(0.0); for (var j = 0u; j < 16u; j++) { x += a[(g * 16u + j) * 64u + lid]; } c[g * 64u + lid] = x;", 0.0, 16.0 * 16.0),
        ("read ro 16 vec4/inv", ro, "var x = vec4<f32>(0.0); for (var j = 0u; j < 16u; j++) { x += a[(g * 16u + j) * 64u + lid]; } c[g * 64u + lid] = x;", 0.0, 16.0 * 16.0),
        ("read ro wg-uniform 16 vec4/inv", ro, "var x = vec4<f32>(0.0); for (var j = 0u; j < 16u; j++) { x += a[(g * 16u + j) * 64u]; } c[g * 64u + lid] = x;", 0.0, 16.0 * 16.0),
        ("read ro scalar 64/inv", ro1, "var x = 0.0; for (var j = 0u; j < 64u; j++) { x += a[(g * 16u + j/4u) * 256u + lid * 4u + j % 4u]; } c[g * 64u + lid] = vec4<f32>(x);", 0.0, 64.0 * 4.0),
        ("shared write+read 16 vec4/inv", rw, "for (var j = 0u; j < 16u; j++) { sh[j * 64u + lid] = vec4<f32>(f32(j)); } workgroupBarrier(); var x = vec4<f32>(0.0); for (var j = 0u; j < 16u; j++) { x += sh[((j + 1u) % 16u) * 64u + lid]; } c[g * 64u + lid] = x;", 0.0, 16.0 * 16.0),
        ("uniform read 16 vec4/inv", rw, "var x = vec4<f32>(0.0); for (var j = 0u; j < 16u; j++) { x += u[(j * 64u + lid) % 1024u]; } c[g * 64u + lid] = x;", 0.0, 16.0 * 16.0),
        ("write 16 vec4/inv", rw, "for (var j = 0u; j < 16u; j++) { c[(g * 16u + j) * 64u + lid] = vec4<f32>(f32(j)); }", 0.0, 16.0 * 16.0),
        ("copy rw 16 vec4/inv", rw, "for (var j = 0u; j < 16u; j++) { let i = (g * 16u + j) * 64u + lid; c[i] = a[i]; }", 0.0, 32.0 * 16.0),
        ("copy ro 16 vec4/inv", ro, "for (var j = 0u; j < 16u; j++) { let i = (g * 16u + j) * 64u + lid; c[i] = a[i]; }", 0.0, 32.0 * 16.0),
    ];
    let groups = (n / 4 / 16 / 64) as u32;
    let ubuf = engine.allocate(&BufferDesc {
        label: "probe2 u",
        size_bytes: 16384,
        kind: AllocKind::ClMem,
    })?;
    for (name, decl, body, flops, bytes) in kernels {
        let src = format!(
            "@group(0) @binding(0) {decl}\n\
             @group(0) @binding(1) var<storage, read_write> c: array<vec4<f32>>;\n\
             var<workgroup> sh: array<vec4<f32>, 1024>;\n\
             @group(0) @binding(2) var<uniform> u: array<vec4<f32>, 1024>;\n\
             @compute @workgroup_size(64) fn main(@builtin(workgroup_id) wid: vec3<u32>,\n\
             @builtin(local_invocation_index) lid: u32) {{ let g = wid.x; if g == 0xffffffffu {{ c[0].x = f32(arrayLength(&a)) + u[0].x; }} {body} }}\n"
        );
        let module = dev.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("probe2"),
            source: wgpu::ShaderSource::Wgsl(src.into()),
        });
        let pipe = auto_layout_pipeline(dev, &module, "probe2");
        let bgl = pipe.get_bind_group_layout(0);
        let bg = dev.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("probe2"),
            layout: &bgl,
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: a.raw().as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: c.raw().as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 2,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: ubuf.raw(),
                        offset: 0,
                        size: None,
                    }),
                },
            ],
        });
        let s = best_seconds(gpu, rounds, |enc| {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&pipe);
            pass.set_bind_group(0, &bg, &[]);
            pass.dispatch_workgroups(groups, 1, 1);
            Ok(())
        })?;
        let inv = f64::from(groups) * 64.0;
        println!(
            "probe2 {name}: {:.3} ms, {:.2} GFLOP/s, {:.2} GB/s, {:.1} ns/invocation",
            s * 1e3,
            inv * flops / s / 1e9,
            inv * bytes / s / 1e9,
            s / inv * 1e9
        );
    }
    Ok(())
}

/// Host time to encode one small add through [`Kernels::encode`] (uniform slot, bind group,
/// pipeline lookup, uniform flush) against the floor: a raw add pipeline dispatched with one
/// bind group made beforehand. Recording and `finish` only; nothing is submitted.
fn host_per_dispatch(b: &mut Bench) -> anyhow::Result<()> {
    let n = 1024u64;
    let shape = Shape::new(vec![n]);
    let mut rng = SplitMix64::new(3);
    let bufs = (0..3)
        .map(|i| filled(&b.engine, &format!("host {i}"), n, &mut rng))
        .collect::<anyhow::Result<Vec<_>>>()?;
    fn operand<'a>(buf: &'a dynrt::gpu::Buffer, shape: &'a Shape) -> Operand<'a> {
        Operand {
            tensor: TensorRef {
                buffer: buf,
                offset_bytes: 0,
                size_bytes: buf.size_bytes(),
            },
            shape,
            dtype: DType::F32,
            strides: None,
        }
    }
    let ins = [operand(&bufs[0], &shape), operand(&bufs[1], &shape)];
    let out = operand(&bufs[2], &shape);
    let op = Op::Binary(BinaryOp::Add);
    let dev = b.gpu.device();
    let mut uniforms = UniformArena::new(&b.engine);
    let count = 2000u32;
    let mut best = [f64::INFINITY; 2];
    for _ in 0..3 {
        let mut enc = dev.create_command_encoder(&Default::default());
        uniforms.reset();
        let t0 = Instant::now();
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            for _ in 0..count {
                b.kernels
                    .encode(&mut pass, &mut uniforms, &op, &ins, &out)?;
            }
        }
        uniforms.flush();
        drop(enc.finish());
        best[0] = best[0].min(t0.elapsed().as_secs_f64());
    }
    // The floor: a raw add pipeline, its bind group made once.
    let module = dev.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("host floor"),
        source: wgpu::ShaderSource::Wgsl(
            "@group(0) @binding(0) var<storage, read_write> a: array<f32>;\n\
             @group(0) @binding(1) var<storage, read_write> b: array<f32>;\n\
             @group(0) @binding(2) var<storage, read_write> c: array<f32>;\n\
             @compute @workgroup_size(256) fn main(@builtin(global_invocation_id) i: vec3<u32>) {\n\
               if i.x < arrayLength(&c) { c[i.x] = a[i.x] + b[i.x]; }\n\
             }\n"
            .into(),
        ),
    });
    let bufs: Vec<&dynrt::gpu::Buffer> = bufs.iter().collect();
    let (pipe, bg) = raw_pipeline(dev, &module, "host floor", &bufs);
    for _ in 0..3 {
        let mut enc = dev.create_command_encoder(&Default::default());
        let t0 = Instant::now();
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            for _ in 0..count {
                pass.set_pipeline(&pipe);
                pass.set_bind_group(0, &bg, &[]);
                pass.dispatch_workgroups(4, 1, 1);
            }
        }
        drop(enc.finish());
        best[1] = best[1].min(t0.elapsed().as_secs_f64());
    }
    let per = |s: f64| s / f64::from(count) * 1e6;
    println!(
        "host encode per dispatch: Kernels {:.2} us, pre-made bind group {:.2} us ({:.1}x)",
        per(best[0]),
        per(best[1]),
        best[0] / best[1]
    );
    Ok(())
}

/// The pipeline of a hand-written kernel's `main`, its layout derived from the shader.
pub(super) fn auto_layout_pipeline(
    dev: &wgpu::Device,
    module: &wgpu::ShaderModule,
    label: &str,
) -> wgpu::ComputePipeline {
    dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(label),
        layout: None,
        module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    })
}

/// A hand-written kernel's pipeline (layout from the shader) and one bind group over whole
/// buffers, bound in order at bindings 0, 1, ...: the probes and the host-cost floor measure
/// kernels outside [`dynrt::gpu::kernels::Kernels`], so they build these themselves, once.
fn raw_pipeline(
    dev: &wgpu::Device,
    module: &wgpu::ShaderModule,
    label: &str,
    bufs: &[&dynrt::gpu::Buffer],
) -> (wgpu::ComputePipeline, wgpu::BindGroup) {
    let pipe = auto_layout_pipeline(dev, module, label);
    let entries: Vec<wgpu::BindGroupEntry<'_>> = bufs
        .iter()
        .enumerate()
        .map(|(i, b)| wgpu::BindGroupEntry {
            binding: i as u32,
            resource: b.raw().as_entire_binding(),
        })
        .collect();
    let bg = dev.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some(label),
        layout: &pipe.get_bind_group_layout(0),
        entries: &entries,
    });
    (pipe, bg)
}
