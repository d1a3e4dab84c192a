//! `dynrt bench decode`: every preallocation policy side by side on the decode demo, and the
//! runtime's host overhead per dispatch against a hand-written wgpu loop.

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
        "host overhead per dispatch: runtime {:.2} us, hand-written wgpu loop {:.2} us, ratio {:.2}x (target <= 1.15x) over {} dispatches x {} iterations",
        overhead.runtime_us_per_dispatch,
        overhead.handwritten_us_per_dispatch,
        overhead.ratio,
        overhead.dispatches_per_iteration,
        overhead.iterations
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
        pub handwritten_us_per_dispatch: f64,
        pub ratio: f64,
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

    /// The limit: pipeline, buffers and bind groups created once; an iteration only records
    /// the dispatches and submits.
    struct Handwritten {
        gpu: Gpu,
        pipeline: wgpu::ComputePipeline,
        groups: Vec<wgpu::BindGroup>,
        /// Keeps the bound buffers (and their accounting) alive.
        _buffers: Vec<dynrt::gpu::Buffer>,
    }

    impl Handwritten {
        fn new(gpu: &Gpu, engine: &Engine) -> anyhow::Result<Self> {
            let device = gpu.device();
            let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some("bench add_one"),
                source: wgpu::ShaderSource::Wgsl(ADD_ONE.into()),
            });
            let pipeline =
                super::super::bench_kernels::auto_layout_pipeline(device, &module, "bench add_one");
            let buffers = (0..=CHAIN)
                .map(|_| {
                    engine.allocate(&BufferDesc {
                        label: "bench chain",
                        size_bytes: ELEMENTS * 4,
                        kind: AllocKind::UsmDevice,
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let layout = pipeline.get_bind_group_layout(0);
            let groups: Vec<wgpu::BindGroup> = (0..CHAIN)
                .map(|i| {
                    device.create_bind_group(&wgpu::BindGroupDescriptor {
                        label: Some("bench chain"),
                        layout: &layout,
                        entries: &[
                            wgpu::BindGroupEntry {
                                binding: 0,
                                resource: buffers[i].raw().as_entire_binding(),
                            },
                            wgpu::BindGroupEntry {
                                binding: 1,
                                resource: buffers[i + 1].raw().as_entire_binding(),
                            },
                        ],
                    })
                })
                .collect();
            Ok(Handwritten {
                gpu: gpu.clone(),
                pipeline,
                groups,
                _buffers: buffers,
            })
        }

        /// One iteration; returns the host seconds (the wait for the device is not counted).
        fn iteration(&self) -> f64 {
            let groups_x = ELEMENTS.div_ceil(64) as u32;
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
                for g in &self.groups {
                    pass.set_bind_group(0, g, &[]);
                    pass.dispatch_workgroups(groups_x, 1, 1);
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

    /// Measures both, interleaved: each round times one hand-written iteration and one
    /// runtime iteration (in alternating order), so both see the same machine load; the first
    /// 10 rounds are warm-up.
    pub fn measure(gpu: &Gpu) -> anyhow::Result<Overhead> {
        let engine = Engine::new(gpu.clone());
        let hand = Handwritten::new(gpu, &engine)?;
        let mut req = runtime_request(&engine)?;
        let (mut h, mut r) = (0.0, 0.0);
        for it in 0..ITERATIONS + WARMUP {
            let (hi, ri) = if it % 2 == 0 {
                let hi = hand.iteration();
                (hi, runtime_iteration(gpu, &mut req)?)
            } else {
                let ri = runtime_iteration(gpu, &mut req)?;
                (hand.iteration(), ri)
            };
            if it >= WARMUP {
                h += hi;
                r += ri;
            }
        }
        let stats = req.stats();
        let rounds = (ITERATIONS + WARMUP) as u64;
        anyhow::ensure!(
            stats.dispatches == CHAIN as u64 * rounds,
            "the runtime dispatched {} kernels in {rounds} iterations, expected {CHAIN} each",
            stats.dispatches
        );
        let per_dispatch = |secs: f64| secs * 1e6 / (ITERATIONS * CHAIN) as f64;
        Ok(Overhead {
            runtime_us_per_dispatch: per_dispatch(r),
            handwritten_us_per_dispatch: per_dispatch(h),
            ratio: r / h,
            dispatches_per_iteration: CHAIN,
            iterations: ITERATIONS,
            dispatches_replayed: stats.dispatches_replayed,
        })
    }
}
