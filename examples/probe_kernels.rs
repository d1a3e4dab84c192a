//! Tuning probes for dynrt's kernels: hand-written WGSL outside the kernel cache, to find what
//! shape of kernel an adapter runs fast before a kernel is changed. Once
//! `dynrt bench kernels --probe`; an example since, so that the shipped CLI measures only
//! dynrt's own kernels.
//!
//! * **compute and read-only kernels**: an FMA loop, reads through `read_write` and `read`
//!   bindings (vec4 and scalar, per invocation and uniform across the workgroup), workgroup
//!   memory, a uniform array, writes and copies: what limits a software adapter.
//! * **the add matrix**: one add kernel in several shapes (workgroup size, vec4s per
//!   invocation, wgpu's bounds checks on or off, `read` or `read_write` inputs, where the
//!   element count comes from, loop or unrolled), ONNX Runtime's and dynrt's among them, timed
//!   interleaved so the load of a shared machine falls on all of them alike.
//! * **host time per dispatch**: recording one small add through [`Kernels::encode`] (uniform
//!   slot, bind group, pipeline lookup) against a raw pipeline with a bind group made once.
//!
//! ```text
//! cargo run --release --example probe_kernels -- [--add-elements N] [--rounds N]
//! WGPU_BACKEND=vulkan cargo run --release --example probe_kernels   # lavapipe, no GPU
//! ```
//!
//! Timing as `dynrt-bench kernels` times: dispatches recorded into one command buffer, one
//! submit, wall-clock time until the device is idle (timestamp queries are rare on software
//! adapters), and beside it the process's CPU time on Linux (on a software adapter the
//! device's work is this process's threads, and CPU time is far less disturbed by other
//! processes than wall time).

use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use dynrt::gpu::kernels::{Kernels, Operand, TensorRef, UniformArena};
use dynrt::gpu::{wgpu, Buffer, BufferDesc, Engine, Gpu, GpuOptions};
use dynrt::graph::{BinaryOp, Op};
use dynrt::memory::AllocKind;
use dynrt::rng::SplitMix64;
use dynrt::shape::{DType, Shape};

/// Hand-written kernels against an adapter, for tuning dynrt's.
#[derive(Parser)]
struct Args {
    /// Elements per add operand (f32); an add moves 3x this many x 4 bytes.
    #[arg(long, default_value_t = 4 << 20)]
    add_elements: u64,
    /// Submits per measurement (at least 3 for the add matrix, whose median counts).
    #[arg(long, default_value_t = 3)]
    rounds: u32,
}

fn main() -> anyhow::Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args = Args::parse();
    let gpu = Gpu::new_blocking(GpuOptions::from_env()?).context("no adapter for the probes")?;
    let engine = Engine::new(gpu.clone());
    let info = gpu.adapter_info();
    println!("adapter: {} ({:?})", info.name, info.backend);
    compute_and_reads(&gpu, &engine, args.add_elements.max(1 << 16), args.rounds)?;
    add_matrix(&gpu, &engine, args.add_elements.max(1024), args.rounds)?;
    host_per_dispatch(&gpu, &engine)?;
    Ok(())
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

/// One submit of what `record` encodes: the wall-clock seconds from the submit until the
/// device is idle again, and the process's CPU seconds over the same span (recording is
/// outside both).
fn submit_seconds(
    gpu: &Gpu,
    record: impl FnOnce(&mut wgpu::CommandEncoder),
) -> anyhow::Result<(f64, Option<f64>)> {
    let mut enc = gpu
        .device()
        .create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("probe kernels"),
        });
    record(&mut enc);
    let c0 = process_cpu_seconds();
    let t0 = Instant::now();
    gpu.queue().submit([enc.finish()]);
    gpu.device()
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| anyhow::anyhow!("device poll failed: {e}"))?;
    let dt = t0.elapsed().as_secs_f64();
    Ok((dt, c0.zip(process_cpu_seconds()).map(|(a, b)| b - a)))
}

/// A usm_device buffer of `elements` f32 values uniform in [-1, 1).
fn filled(
    engine: &Engine,
    label: &str,
    elements: u64,
    rng: &mut SplitMix64,
) -> anyhow::Result<Buffer> {
    let values: Vec<f32> = (0..elements).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let buf = engine.allocate(&BufferDesc {
        label,
        size_bytes: elements * 4,
        kind: AllocKind::UsmDevice,
    })?;
    engine.write(&buf, 0, bytemuck::cast_slice(&values))?;
    Ok(buf)
}

/// The pipeline of a hand-written kernel's `main` (layout derived from the shader) and one
/// bind group over whole buffers, bound in order at bindings 0, 1, ...
fn raw_pipeline(
    dev: &wgpu::Device,
    module: &wgpu::ShaderModule,
    label: &str,
    bufs: &[&Buffer],
) -> (wgpu::ComputePipeline, wgpu::BindGroup) {
    let pipe = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(label),
        layout: None,
        module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
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

/// Where an add variant gets its element count and offsets.
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

/// One hand-written add kernel of the matrix.
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

/// The add matrix: hand-written add kernels outside [`Kernels`] (workgroup size, vec4s per
/// invocation, bounds checks, `read` vs `read_write` inputs, uniform vs constant parameters,
/// loop vs unrolled), to find what shape of kernel an adapter streams fast.
fn add_matrix(gpu: &Gpu, engine: &Engine, n: u64, rounds: u32) -> anyhow::Result<()> {
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
        // dynrt's flat4 entry point with ALIGNED (every operand at its binding's start): no
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
        let mut bound: Vec<&Buffer> = bufs.iter().collect();
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
    // the median over the rounds counts, and the CPU time over all rounds beside it.
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

/// Compute-only and read-only kernels (what limits a software adapter), each the fastest of
/// `rounds` submits after a warm-up.
fn compute_and_reads(gpu: &Gpu, engine: &Engine, n: u64, rounds: u32) -> anyhow::Result<()> {
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
        let (pipe, bg) = raw_pipeline(dev, &module, "probe2", &[&a, &c, &ubuf]);
        let mut best = f64::INFINITY;
        for round in 0..=rounds {
            let (s, _) = submit_seconds(gpu, |enc| {
                let mut pass = enc.begin_compute_pass(&Default::default());
                pass.set_pipeline(&pipe);
                pass.set_bind_group(0, &bg, &[]);
                pass.dispatch_workgroups(groups, 1, 1);
            })?;
            // Round 0 warms the pipeline up.
            if round > 0 {
                best = best.min(s);
            }
        }
        let inv = f64::from(groups) * 64.0;
        println!(
            "probe2 {name}: {:.3} ms, {:.2} GFLOP/s, {:.2} GB/s, {:.1} ns/invocation",
            best * 1e3,
            inv * flops / best / 1e9,
            inv * bytes / best / 1e9,
            best / inv * 1e9
        );
    }
    Ok(())
}

/// Host time to encode one small add through [`Kernels::encode`] (uniform slot, bind group,
/// pipeline lookup, uniform flush) against the floor: a raw add pipeline dispatched with one
/// bind group made beforehand. Recording and `finish` only; nothing is submitted.
fn host_per_dispatch(gpu: &Gpu, engine: &Engine) -> anyhow::Result<()> {
    let n = 1024u64;
    let shape = Shape::new(vec![n]);
    let mut rng = SplitMix64::new(3);
    let bufs = (0..3)
        .map(|i| filled(engine, &format!("host {i}"), n, &mut rng))
        .collect::<anyhow::Result<Vec<_>>>()?;
    fn operand<'a>(buf: &'a Buffer, shape: &'a Shape) -> Operand<'a> {
        Operand {
            tensor: TensorRef {
                buffer: buf,
                offset_bytes: 0,
                size_bytes: buf.size_bytes(),
            },
            shape,
            dtype: DType::F32,
            strides: None,
            layout: dynrt::gpu::kernels::WeightLayout::File,
        }
    }
    let ins = [operand(&bufs[0], &shape), operand(&bufs[1], &shape)];
    let out = operand(&bufs[2], &shape);
    let op = Op::Binary(BinaryOp::Add);
    let dev = gpu.device();
    let mut kernels = Kernels::new(gpu);
    let mut uniforms = UniformArena::new(engine);
    let count = 2000u32;
    let mut best = [f64::INFINITY; 2];
    for _ in 0..3 {
        let mut enc = dev.create_command_encoder(&Default::default());
        uniforms.reset();
        let t0 = Instant::now();
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            for _ in 0..count {
                kernels.encode(&mut pass, &mut uniforms, &op, &ins, &out)?;
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
    let bufs: Vec<&Buffer> = bufs.iter().collect();
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
