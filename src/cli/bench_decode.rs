//! `dynrt bench decode`: every preallocation policy side by side on the decode demo, and the
//! runtime's host overhead per dispatch against hand-written wgpu loops (the same work with the
//! same bind-group layout, and a minimal 2-binding kernel).

use super::demo::run_demo;
use anyhow::Context;
use dynrt::gpu::{Engine, Gpu, GpuOptions};
use dynrt::memory::predictor::Policy;
use dynrt::runtime::demo::DemoConfig;
use dynrt::runtime::model::DecoderConfig;
use dynrt::runtime::report::{human_bytes, DemoSummary};
use dynrt::runtime::RunOptions;
use std::process::ExitCode;

/// Arguments of `dynrt bench decode`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Step counts to run, comma separated.
    #[arg(long, default_value = "512,2048")]
    steps: String,
    /// Prompt length.
    #[arg(long = "prompt-len", default_value_t = 8)]
    prompt_len: u32,
    /// Transformer blocks.
    #[arg(long, default_value_t = 2)]
    layers: u32,
    /// Model width.
    #[arg(long, default_value_t = 64)]
    dim: u32,
    /// Attention heads.
    #[arg(long, default_value_t = 4)]
    heads: u32,
    /// Vocabulary size.
    #[arg(long, default_value_t = 256)]
    vocab: u32,
    /// Seed.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// One JSON object per policy and step count (the fields of `dynrt demo --json`), then
    /// one object with the host-overhead comparison.
    #[arg(long)]
    json: bool,
}

/// One JSON line of the bench: the demo's fields plus the step count asked for.
#[derive(serde::Serialize)]
struct Row<'a> {
    #[serde(flatten)]
    summary: &'a DemoSummary,
    runs_steps: u32,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let steps: Vec<u32> = args
        .steps
        .split(',')
        .map(|s| {
            s.trim()
                .parse::<u32>()
                .with_context(|| format!("--steps: `{s}` is not a number"))
        })
        .collect::<anyhow::Result<_>>()?;
    let gpu = Gpu::new_blocking(GpuOptions::from_env()?)?;
    let mut rows: Vec<(u32, DemoSummary)> = Vec::new();
    for &n in &steps {
        for policy in Policy::ALL {
            // A fresh engine per run: peaks and histories must not mix.
            let engine = Engine::new(gpu.clone());
            let config = DemoConfig {
                model: DecoderConfig {
                    layers: args.layers,
                    heads: args.heads,
                    dim: args.dim,
                    vocab: args.vocab,
                    max_positions: args.prompt_len + n,
                    seed: args.seed,
                },
                prompt_len: args.prompt_len,
                steps: n,
                run: RunOptions::from_env(policy)?,
                planner: true,
                check_every: (n / 8).max(1),
            };
            let demo = run_demo(&engine, config)?;
            let s = demo.summary();
            if args.json {
                println!(
                    "{}",
                    serde_json::to_string(&Row {
                        summary: &s,
                        runs_steps: n
                    })?
                );
            }
            rows.push((n, s));
        }
    }
    let overhead = overhead::measure(&gpu)?;
    if args.json {
        println!("{}", serde_json::to_string(&overhead)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:>6} {:>10} {:>8} {:>8} {:>12} {:>12} {:>10} {:>10}",
        "steps",
        "policy",
        "allocs",
        "reallocs",
        "peak device",
        "peak shared",
        "ms/step",
        "max|err|"
    );
    for (n, s) in &rows {
        println!(
            "{:>6} {:>10} {:>8} {:>8} {:>12} {:>12} {:>10.3} {:>10.2e}",
            n,
            s.policy,
            s.allocations,
            s.reallocations,
            human_bytes(s.peak_bytes.usm_device),
            human_bytes(s.peak_bytes.usm_shared),
            s.ms_per_step,
            s.max_abs_err
        );
    }
    println!();
    println!(
        "host overhead per dispatch over {} dispatches x {} iterations (target <= 1.15x):",
        overhead.dispatches_per_iteration, overhead.iterations
    );
    println!(
        "  runtime {:.2} us; hand-written wgpu loop, same kernel layout {:.2} us (ratio {:.2}x), minimal 2-binding kernel {:.2} us (ratio {:.2}x)",
        overhead.runtime_us_per_dispatch,
        overhead.handwritten_same_layout_us_per_dispatch,
        overhead.ratio_same_layout,
        overhead.handwritten_us_per_dispatch,
        overhead.ratio
    );
    Ok(ExitCode::SUCCESS)
}

/// Host overhead per dispatch: the runtime against a hand-written wgpu loop.
mod overhead {
    use dynrt::gpu::{wgpu, BufferDesc, Engine, Gpu};
    use dynrt::graph::GraphBuilder;
    use dynrt::memory::predictor::Policy;
    use dynrt::memory::AllocKind;
    use dynrt::runtime::{InferRequest, Network, NetworkOptions, RunOptions};
    use dynrt::shape::Shape;
    use web_time::Instant;

    /// Dispatches per iteration and iterations timed.
    const CHAIN: usize = 64;
    const ITERATIONS: usize = 1000;
    const WARMUP: usize = 10;
    /// Elements per tensor: small, so the device time does not hide the host time.
    const ELEMENTS: u64 = 256;

    /// The comparison, printed as one JSON object with `--json`.
    #[derive(serde::Serialize)]
    pub struct Overhead {
        pub runtime_us_per_dispatch: f64,
        /// The minimal loop: `x + 1.0` with the constant in the shader (2 storage bindings).
        pub handwritten_us_per_dispatch: f64,
        /// Runtime over the minimal loop.
        pub ratio: f64,
        /// The same work as the runtime's: `x + one` with `one` a tensor, the bind-group
        /// layout of the runtime's kernel (a dynamic-offset uniform and 3 storage bindings).
        pub handwritten_same_layout_us_per_dispatch: f64,
        /// Runtime over the same-layout loop.
        pub ratio_same_layout: f64,
        pub dispatches_per_iteration: usize,
        pub iterations: usize,
        /// Runtime dispatches recorded again from their nodes' dispatch plans.
        pub dispatches_replayed: u64,
    }

    const ADD_ONE: &str = r#"
@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    if (g.x < arrayLength(&dst)) { dst[g.x] = src[g.x] + 1.0; }
}
"#;

    const ADD_TENSOR: &str = r#"
struct Params { n: u32, pad0: u32, pad1: u32, pad2: u32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> a: array<f32>;
@group(0) @binding(2) var<storage, read_write> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    if (g.x < p.n) { out[g.x] = a[g.x] + b[0]; }
}
"#;

    /// Uniform slot stride of the same-layout loop (`min_uniform_buffer_offset_alignment` is
    /// at most 256).
    const SLOT: u64 = 256;

    /// Which hand-written loop.
    #[derive(Clone, Copy, PartialEq)]
    enum Layout {
        /// `x + 1.0`, 2 storage bindings, pipeline layout from the shader.
        Minimal,
        /// `x + one` with the runtime kernel's layout: binding 0 a uniform with a dynamic
        /// offset (one slot per dispatch, written once), bindings 1-3 storage.
        SameAsRuntime,
    }

    /// The limit: pipeline, buffers and bind groups created once; an iteration only records
    /// the dispatches and submits.
    struct Handwritten {
        gpu: Gpu,
        layout: Layout,
        pipeline: wgpu::ComputePipeline,
        groups: Vec<wgpu::BindGroup>,
        /// Keeps the bound buffers (and their accounting) alive.
        _buffers: Vec<dynrt::gpu::Buffer>,
        _uniforms: Option<dynrt::gpu::Buffer>,
    }

    impl Handwritten {
        fn new(gpu: &Gpu, engine: &Engine, layout: Layout) -> anyhow::Result<Self> {
            let device = gpu.device();
            let source = match layout {
                Layout::Minimal => ADD_ONE,
                Layout::SameAsRuntime => ADD_TENSOR,
            };
            let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some("bench chain"),
                source: wgpu::ShaderSource::Wgsl(source.into()),
            });
            // Chain tensors, then (same layout) the one-element addend.
            let buffers = (0..=CHAIN + 1)
                .map(|_| {
                    engine.allocate(&BufferDesc {
                        label: "bench chain",
                        size_bytes: ELEMENTS * 4,
                        kind: AllocKind::UsmDevice,
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let whole = |i: usize| buffers[i].raw().as_entire_binding();
            let (pipeline, bgl, uniforms) = match layout {
                Layout::Minimal => {
                    let pipeline = super::super::bench_kernels::auto_layout_pipeline(
                        device,
                        &module,
                        "bench add_one",
                    );
                    let bgl = pipeline.get_bind_group_layout(0);
                    (pipeline, bgl, None)
                }
                Layout::SameAsRuntime => {
                    let buffer_entry = |binding, ty, dynamic| wgpu::BindGroupLayoutEntry {
                        binding,
                        visibility: wgpu::ShaderStages::COMPUTE,
                        ty: wgpu::BindingType::Buffer {
                            ty,
                            has_dynamic_offset: dynamic,
                            min_binding_size: None,
                        },
                        count: None,
                    };
                    let storage = wgpu::BufferBindingType::Storage { read_only: false };
                    let bgl = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                        label: Some("bench same layout"),
                        entries: &[
                            buffer_entry(0, wgpu::BufferBindingType::Uniform, true),
                            buffer_entry(1, storage, false),
                            buffer_entry(2, storage, false),
                            buffer_entry(3, storage, false),
                        ],
                    });
                    let pl = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                        label: Some("bench same layout"),
                        bind_group_layouts: &[Some(&bgl)],
                        immediate_size: 0,
                    });
                    let pipeline =
                        device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                            label: Some("bench add_tensor"),
                            layout: Some(&pl),
                            module: &module,
                            entry_point: Some("main"),
                            compilation_options: Default::default(),
                            cache: None,
                        });
                    // Through the engine like every buffer (cl_mem is the kind with UNIFORM).
                    let uniforms = engine.allocate(&BufferDesc {
                        label: "bench same layout uniforms",
                        size_bytes: SLOT * CHAIN as u64,
                        kind: AllocKind::ClMem,
                    })?;
                    let mut slots = vec![0u8; (SLOT * CHAIN as u64) as usize];
                    for slot in slots.chunks_mut(SLOT as usize) {
                        slot[..4].copy_from_slice(&(ELEMENTS as u32).to_le_bytes());
                    }
                    engine.queue_write(&uniforms, 0, &slots);
                    (pipeline, bgl, Some(uniforms))
                }
            };
            // Node i reads tensor i (and the addend, last) and writes tensor i + 1.
            let groups = (0..CHAIN)
                .map(|i| {
                    let entry = |binding, resource| wgpu::BindGroupEntry { binding, resource };
                    let entries = match &uniforms {
                        None => vec![entry(0, whole(i)), entry(1, whole(i + 1))],
                        Some(u) => vec![
                            entry(
                                0,
                                wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                                    buffer: u.raw(),
                                    offset: 0,
                                    size: std::num::NonZeroU64::new(16),
                                }),
                            ),
                            entry(1, whole(i)),
                            entry(2, whole(CHAIN + 1)),
                            entry(3, whole(i + 1)),
                        ],
                    };
                    device.create_bind_group(&wgpu::BindGroupDescriptor {
                        label: Some("bench chain"),
                        layout: &bgl,
                        entries: &entries,
                    })
                })
                .collect();
            Ok(Handwritten {
                gpu: gpu.clone(),
                layout,
                pipeline,
                groups,
                _buffers: buffers,
                _uniforms: uniforms,
            })
        }

        /// One iteration; returns the host seconds (the wait for the device is not counted).
        fn iteration(&self) -> f64 {
            let device = self.gpu.device();
            let t = Instant::now();
            let mut enc = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("bench"),
            });
            {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: None,
                    timestamp_writes: None,
                });
                pass.set_pipeline(&self.pipeline);
                for (i, g) in self.groups.iter().enumerate() {
                    match self.layout {
                        Layout::Minimal => {
                            pass.set_bind_group(0, g, &[]);
                            pass.dispatch_workgroups(ELEMENTS.div_ceil(64) as u32, 1, 1);
                        }
                        Layout::SameAsRuntime => {
                            pass.set_bind_group(0, g, &[(i as u64 * SLOT) as u32]);
                            pass.dispatch_workgroups(ELEMENTS.div_ceil(256) as u32, 1, 1);
                        }
                    }
                }
            }
            self.gpu.queue().submit([enc.finish()]);
            let host = t.elapsed().as_secs_f64();
            // Keep the queue short, outside the timed region.
            self.gpu.poll_wait();
            host
        }
    }

    /// The runtime on a chain of the same length (`x + 1` nodes on a constant): static shapes,
    /// so after the first iteration every node skips update_shape, keeps its buffer and
    /// replays its dispatch plan.
    fn runtime_request(engine: &Engine) -> anyhow::Result<InferRequest> {
        let mut b = GraphBuilder::new();
        let x0 = b.constant(
            "x0",
            Shape::new(vec![ELEMENTS]),
            vec![0.0; ELEMENTS as usize],
        );
        let one = b.constant("one", Shape::new(vec![1]), vec![1.0]);
        let mut x = x0;
        for i in 0..CHAIN {
            x = b.add_(format!("add{i}"), x, one);
        }
        b.output(x);
        let net = Network::compile(engine, b.build()?, NetworkOptions::default())?;
        Ok(InferRequest::new(&net, RunOptions::new(Policy::Adaptive))?)
    }

    /// One runtime iteration; returns the host seconds (the wait for the device is not
    /// counted).
    fn runtime_iteration(gpu: &Gpu, req: &mut InferRequest) -> anyhow::Result<f64> {
        let t = Instant::now();
        req.infer_blocking(&[], &[])?;
        let host = t.elapsed().as_secs_f64();
        gpu.poll_wait();
        Ok(host)
    }

    /// Measures the three loops, interleaved: each round times one iteration of each (the
    /// order rotating from round to round), so all see the same machine load; the first 10
    /// rounds are warm-up.
    pub fn measure(gpu: &Gpu) -> anyhow::Result<Overhead> {
        let engine = Engine::new(gpu.clone());
        let minimal = Handwritten::new(gpu, &engine, Layout::Minimal)?;
        let same = Handwritten::new(gpu, &engine, Layout::SameAsRuntime)?;
        let mut req = runtime_request(&engine)?;
        // Seconds of the minimal loop, the same-layout loop and the runtime.
        let mut secs = [0.0f64; 3];
        for it in 0..ITERATIONS + WARMUP {
            let mut round = [0.0f64; 3];
            for j in 0..3 {
                let side = (it + j) % 3;
                round[side] = match side {
                    0 => minimal.iteration(),
                    1 => same.iteration(),
                    _ => runtime_iteration(gpu, &mut req)?,
                };
            }
            if it >= WARMUP {
                for (total, r) in secs.iter_mut().zip(round) {
                    *total += r;
                }
            }
        }
        // What was timed computed the right thing: x0 = 0, plus 1 per node.
        let out = req.infer_blocking(&[], &[&format!("add{}", CHAIN - 1)])?;
        let values = out[0].to_f32();
        anyhow::ensure!(
            values.iter().all(|&v| v == CHAIN as f32),
            "the runtime's chain computed {:?}, expected {CHAIN} everywhere",
            &values[..4.min(values.len())]
        );
        let stats = req.stats();
        let rounds = (ITERATIONS + WARMUP + 1) as u64;
        anyhow::ensure!(
            stats.dispatches == CHAIN as u64 * rounds,
            "the runtime dispatched {} kernels in {rounds} iterations, expected {CHAIN} each",
            stats.dispatches
        );
        let per_dispatch = |secs: f64| secs * 1e6 / (ITERATIONS * CHAIN) as f64;
        let [h, hs, r] = secs;
        Ok(Overhead {
            runtime_us_per_dispatch: per_dispatch(r),
            handwritten_us_per_dispatch: per_dispatch(h),
            ratio: r / h,
            handwritten_same_layout_us_per_dispatch: per_dispatch(hs),
            ratio_same_layout: r / hs,
            dispatches_per_iteration: CHAIN,
            iterations: ITERATIONS,
            dispatches_replayed: stats.dispatches_replayed,
        })
    }
}
