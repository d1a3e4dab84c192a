//! `dynrt-bench decode`: every preallocation policy side by side on the decode demo, and the
//! runtime's host overhead per dispatch against hand-written wgpu loops (the same work with the
//! same bind-group layout, and a minimal 2-binding kernel).

use super::shared::demo::run_demo;
use anyhow::Context;
use dynrt::demo::decoder::DecoderConfig;
use dynrt::demo::DemoConfig;
use dynrt::gpu::{Engine, Gpu, GpuOptions};
use dynrt::memory::predictor::Policy;
use dynrt::runtime::report::{human_bytes, DemoSummary};
use dynrt::runtime::RunOptions;
use std::process::ExitCode;

/// Arguments of `dynrt-bench decode`.
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
    let dynamic = dynamic::measure(&gpu, &args)?;
    if args.json {
        println!("{}", serde_json::to_string(&overhead)?);
        println!("{}", serde_json::to_string(&dynamic)?);
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
    println!();
    println!(
        "dynamic case, the demo's decode step ({} steps of {:.1} dispatches each, {:.0}% of them replayed from plans; attention re-recorded):",
        dynamic.steps, dynamic.dispatches_per_step, dynamic.replayed_percent
    );
    println!(
        "  runtime {:.1} us/step ({:.2} us/dispatch); hand-written wgpu loop issuing the same commands with pre-created pipelines and bind groups {:.1} us/step ({:.2} us/dispatch); ratio {:.2}x",
        dynamic.runtime_us_per_step,
        dynamic.runtime_us_per_dispatch,
        dynamic.handwritten_us_per_step,
        dynamic.handwritten_us_per_dispatch,
        dynamic.ratio
    );
    Ok(ExitCode::SUCCESS)
}

/// Host overhead on the dynamic case: the demo's decode step (attention shapes grow every
/// step, so those nodes run update_shape and re-record their dispatches) against a
/// hand-written wgpu loop that issues exactly the commands the runtime recorded for that
/// step (the request's command log) with the pipelines and bind groups created beforehand:
/// per step, the queue writes (inputs, uniform slots), one encoder, `set_pipeline` when it
/// changes, `set_bind_group` + `dispatch_workgroups` per dispatch, the copies, one submit.
mod dynamic {
    use super::Args;
    use dynrt::demo::decoder::{build_graph, labels, DecoderConfig, DecoderWeights};
    use dynrt::gpu::bench::replay_log;
    use dynrt::gpu::{CommandLog, Engine, Gpu};
    use dynrt::graph::{reference, Bindings};
    use dynrt::memory::predictor::{Policy, PredictorOptions};
    use dynrt::memory::AllocKind;
    use dynrt::runtime::{HostTensor, InferRequest, Network, NetworkOptions, RunOptions};
    use dynrt::shape::Shape;
    use web_time::Instant;

    const PROMPT: usize = 8;
    const WARMUP: usize = 10;
    const STEPS: usize = 200;

    /// The comparison, printed as one JSON object with `--json`.
    #[derive(serde::Serialize)]
    pub struct Dynamic {
        pub steps: usize,
        pub dispatches_per_step: f64,
        pub replayed_percent: f64,
        pub runtime_us_per_step: f64,
        pub handwritten_us_per_step: f64,
        pub runtime_us_per_dispatch: f64,
        pub handwritten_us_per_dispatch: f64,
        /// Runtime over the hand-written loop.
        pub ratio: f64,
    }

    /// One hand-written iteration issuing `log` ([`replay_log`]); returns the host seconds.
    fn handwritten(gpu: &Gpu, log: &CommandLog) -> f64 {
        let t = Instant::now();
        replay_log(gpu, log);
        t.elapsed().as_secs_f64()
    }

    fn step_inputs(token: i32, pos: usize) -> (HostTensor, HostTensor) {
        let one = Shape::new(vec![1]);
        (
            HostTensor::i32(one.clone(), &[token]),
            HostTensor::i32(one, &[pos as i32]),
        )
    }

    fn argmax(row: &[f32]) -> i32 {
        (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b }) as i32
    }

    pub fn measure(gpu: &Gpu, args: &Args) -> anyhow::Result<Dynamic> {
        let engine = Engine::new(gpu.clone());
        let total = PROMPT + WARMUP + STEPS + 1;
        let config = DecoderConfig {
            layers: args.layers,
            heads: args.heads,
            dim: args.dim,
            vocab: args.vocab,
            max_positions: total as u32,
            seed: args.seed,
        };
        config.validate()?;
        let model = build_graph(&config, &DecoderWeights::generate(&config))?;
        let states = model.state_bindings();
        let fixed = |pairs: &[(&str, u64)]| -> Bindings {
            pairs.iter().map(|&(k, v)| (k.to_string(), v)).collect()
        };
        // Device-memory inputs and outputs: written through the queue, as the hand-written
        // loop does (a mapped write would wait for the device inside the timed region).
        let decode_net = Network::compile(
            &engine,
            model.graph.clone(),
            NetworkOptions {
                fixed: fixed(&[("seq", 1)]),
                states: states.clone(),
                io_kind: Some(AllocKind::UsmDevice),
                ..NetworkOptions::default()
            },
        )?;
        let prefill_net = decode_net.specialize(NetworkOptions {
            fixed: fixed(&[("seq", PROMPT as u64), ("past", 0)]),
            states,
            io_kind: Some(AllocKind::UsmDevice),
            ..NetworkOptions::default()
        })?;
        // Room for the whole window from the third step on: no buffer grows while timing,
        // so every step issues the same kind of work (attention re-recorded, the rest
        // replayed) and the command logs stay valid.
        let mut run = RunOptions::new(Policy::OpenVino);
        run.predictor = PredictorOptions::openvino_defaults().with_iterations(total as u32);
        let mut tokens: Vec<i32> = (0..PROMPT as i32).map(|i| (i * 37 + 11) % 256).collect();
        let mut prefill = InferRequest::new(&prefill_net, run)?;
        let shape = Shape::new(vec![PROMPT as u64]);
        let pos: Vec<i32> = (0..PROMPT as i32).collect();
        let out = prefill.infer_blocking(
            &[
                (labels::TOKENS, &HostTensor::i32(shape.clone(), &tokens)),
                (labels::POSITIONS, &HostTensor::i32(shape, &pos)),
            ],
            &[labels::LOGITS],
        )?;
        let logits = out[0].to_f32();
        tokens.push(argmax(&logits[logits.len() - config.vocab as usize..]));
        let mut decode = InferRequest::new(&decode_net, run)?;
        decode.put_states(prefill.take_states())?;
        drop(prefill);
        let step = |decode: &mut InferRequest, tokens: &mut Vec<i32>, read: bool| {
            let pos = tokens.len() - 1;
            let (t, p) = step_inputs(tokens[pos], pos);
            let start = Instant::now();
            let r = decode.infer_blocking(
                &[(labels::TOKENS, &t), (labels::POSITIONS, &p)],
                if read { &[labels::LOGITS][..] } else { &[][..] },
            );
            let host = start.elapsed().as_secs_f64();
            gpu.poll_wait();
            r.map(|out| (host, out))
        };
        for _ in 0..WARMUP {
            let (_, out) = step(&mut decode, &mut tokens, true)?;
            let l = out[0].to_f32();
            tokens.push(argmax(&l));
        }
        decode.log_commands(true);
        let before = decode.stats();
        let (mut rt, mut hw) = (0.0f64, 0.0f64);
        let mut dispatches = 0usize;
        let mut previous: Option<CommandLog> = None;
        for i in 0..STEPS {
            // Alternate which side goes first, so machine load affects both alike: on odd
            // steps the hand-written loop issues the previous step's commands (the same
            // buffers: nothing grew) before the runtime's step.
            if let (true, Some(log)) = (i % 2 == 1, &previous) {
                hw += handwritten(gpu, log);
                gpu.poll_wait();
            }
            let (host, _) = step(&mut decode, &mut tokens, false)?;
            rt += host;
            let log = decode
                .take_command_log()
                .ok_or_else(|| anyhow::anyhow!("no command log"))?;
            dispatches += log.dispatches();
            if i % 2 == 0 {
                hw += handwritten(gpu, &log);
                gpu.poll_wait();
            }
            previous = Some(log);
            // The next token is not read while timing: the sequence goes on with a fixed one
            // (the shapes, the work and the cache are the same as with the argmax).
            tokens.push(((i * 13 + 5) % config.vocab as usize) as i32);
        }
        drop(previous);
        let after = decode.stats();
        anyhow::ensure!(
            after.allocations == before.allocations && after.state_growths == before.state_growths,
            "a buffer grew while timing ({} allocations, {} growths): the logs would be stale",
            after.allocations - before.allocations,
            after.state_growths - before.state_growths
        );
        // What was timed computed the right thing: the next step's logits against the CPU
        // reference over the whole sequence at once.
        decode.log_commands(false);
        let (_, out) = step(&mut decode, &mut tokens, true)?;
        let got = out[0].to_f32();
        let n = tokens.len() as u64;
        let inputs = vec![
            (
                labels::TOKENS,
                Shape::new(vec![n]),
                tokens.iter().map(|&t| t as f32).collect::<Vec<f32>>(),
            ),
            (
                labels::POSITIONS,
                Shape::new(vec![n]),
                (0..n).map(|p| p as f32).collect(),
            ),
        ];
        let mut inputs = inputs;
        for (past, _) in &model.states {
            inputs.push((
                past.as_str(),
                Shape::new(vec![0, config.dim as u64]),
                vec![],
            ));
        }
        let want = reference::evaluate(&model.graph, &inputs)?;
        let last = &want[0].1[want[0].1.len() - config.vocab as usize..];
        let err = got
            .iter()
            .zip(last)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        anyhow::ensure!(err <= 1e-3, "decode logits differ from the CPU by {err}");
        let replayed = after.dispatches_replayed - before.dispatches_replayed;
        let per_step = dispatches as f64 / STEPS as f64;
        let us = |s: f64| s * 1e6 / STEPS as f64;
        Ok(Dynamic {
            steps: STEPS,
            dispatches_per_step: per_step,
            replayed_percent: 100.0 * replayed as f64 / dispatches.max(1) as f64,
            runtime_us_per_step: us(rt),
            handwritten_us_per_step: us(hw),
            runtime_us_per_dispatch: us(rt) / per_step.max(1.0),
            handwritten_us_per_dispatch: us(hw) / per_step.max(1.0),
            ratio: rt / hw,
        })
    }
}

/// Host overhead per dispatch: the runtime against a hand-written wgpu loop.
mod overhead {
    use dynrt::gpu::bench::{ChainLayout, HandwrittenChain};
    use dynrt::gpu::{Engine, Gpu};
    use dynrt::graph::GraphBuilder;
    use dynrt::memory::predictor::Policy;
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
            x = b.add(format!("add{i}"), x, one);
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
        let minimal = HandwrittenChain::new(&engine, ChainLayout::Minimal, CHAIN, ELEMENTS)?;
        let same = HandwrittenChain::new(&engine, ChainLayout::SameAsRuntime, CHAIN, ELEMENTS)?;
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
