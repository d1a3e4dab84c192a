//! `dynrt-bench generate [--json]`: SmolLM2 on the GPU.
//!
//! * **Prefill**: prompt tokens per second at 16, 128 and 512 tokens (one forward pass of
//!   the prefill network, its logits readback included), after a warm-up prefill that
//!   compiles the pipelines.
//! * **Decode**, once per preallocation policy, each on a fresh engine (so peaks are the
//!   policy's own): a 16-token prompt, then greedy decode steps until the largest context
//!   through the session's own loop (the token chosen on the device, the next step
//!   submitted before a token is read), every step timed from one token's delivery to the
//!   next's; host time is the mean over the iterations (a warm-up generation on another
//!   session compiles the pipelines first). KV bytes are the session's at the end
//!   (the pipelined loop reports no per-step KV: the curve's KV columns and the step-up
//!   check below see none). Reported: ms per token around
//!   each context (the median of the 16 steps ending there: medians, because other jobs on
//!   a shared machine add spikes of seconds), reallocations, KV growths, peak device bytes by
//!   kind and region against weights + the KV cache needed, and the **step-up check**: for
//!   every step at which the KV cache was reallocated, the median of the 8 following steps
//!   over the median of the 8 before it. A bucket cache whose buckets run out shows
//!   a staircase (a lasting jump at each boundary); a curve that only follows attention's
//!   linear growth keeps that ratio near 1.
//! * **Dispatches**: those of one decode step of the decode network, counted per node by the
//!   runtime ([`dynrt::runtime::InferRequest::node_dispatches`]): in all, and per layer (the
//!   nodes labelled `blk.N.`; the most any layer records), with the buffer copies.
//! * **Kernels per token** (`--profile`): every kernel of one decode step at the largest
//!   context, timed alone (16 dispatches per submit, best of 3 submits, wall clock: software
//!   adapters have no timestamp queries) and multiplied by how often a step runs it; the
//!   slowest is named with the bytes it reads per dispatch and the rate that gives.

use super::shared::model::{model_path, ModelArgs};
use anyhow::Context;
use dynrt::gpu::bench::Recording;
use dynrt::gpu::kernels::{Kernels, Operand, TensorRef, UniformArena};
use dynrt::gpu::{Buffer, BufferDesc, Engine, Gpu, GpuOptions};
use dynrt::graph::ops;
use dynrt::graph::{BinaryOp, Op};
use dynrt::llm::ModelConfig;
use dynrt::llm::{GenerateParams, Model, SamplingParams};
use dynrt::memory::predictor::Policy;
use dynrt::memory::AllocKind;
use dynrt::rng::SplitMix64;
use dynrt::runtime::report::{human_bytes, PeakBytes, RegionReport};
use dynrt::runtime::RunOptions;
use dynrt::shape::{DType, Shape};
use serde::Serialize;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// Arguments of `dynrt-bench generate`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt lengths of the prefill measurement (`--prefill` with no value: none).
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "16,128,512")]
    prefill: Vec<usize>,
    /// Contexts at which decode speed is reported (the decode runs to the largest).
    #[arg(long, value_delimiter = ',', default_value = "64,256,1024,2048")]
    contexts: Vec<usize>,
    /// Policies of the decode runs (`--policies` with no value: no decode run).
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "none,openvino,adaptive")]
    policies: Vec<String>,
    /// Also time every kernel of a decode step alone and name the slowest per token.
    #[arg(long)]
    profile: bool,
    /// Context of the attention in the kernel profile (default: the largest of --contexts).
    #[arg(long = "profile-context")]
    profile_context: Option<u64>,
    /// Write every decode step (policy, context, ms, KV reserved and needed, whether the
    /// step reallocated the KV cache) to this CSV.
    #[arg(long)]
    curve: Option<PathBuf>,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct PrefillRow {
    prompt_tokens: usize,
    ms: f64,
    tokens_per_s: f64,
}

#[derive(Serialize)]
struct ContextRow {
    context: usize,
    /// Median of the 16 steps ending at the context.
    ms_per_token: f64,
    /// Fastest of them: the closest to what the adapter does alone on a shared machine.
    min_ms: f64,
    /// Median host milliseconds of the same steps before the submit call (shape updates,
    /// sizing, encoding, wgpu's finish): the host's part of a step besides the submit call.
    host_ms: f64,
}

/// Host microseconds per decode step by part ([`dynrt::runtime::HostTime`]): the median over
/// the run's decode steps.
#[derive(Serialize)]
struct HostUs {
    /// Input checks, shape updates and sizing.
    prepare: f64,
    /// Input writes, encoding every node, packing the uniforms.
    encode: f64,
    /// wgpu's `CommandEncoder::finish`.
    finish: f64,
    /// The submit call (on a software adapter it runs the kernels too).
    submit: f64,
    /// prepare + encode + finish.
    before_submit: f64,
}

#[derive(Serialize)]
struct StepUp {
    /// KV reallocations seen (steps whose KV reserve changed).
    kv_growths: usize,
    /// Largest median(8 steps after) / median(8 steps before) over those steps.
    max_ratio: f64,
    /// Median of the same ratios.
    median_ratio: f64,
    /// Context at which the largest ratio was seen.
    max_at_context: usize,
}

#[derive(Serialize)]
struct DecodeRun {
    policy: String,
    contexts: Vec<ContextRow>,
    decode_steps: usize,
    reallocations: u64,
    allocations: u64,
    step_up: StepUp,
    peak_bytes: PeakBytes,
    regions: RegionReport,
    kv_needed_bytes: u64,
    kv_reserved_bytes: u64,
    kv_reserved_peak_bytes: u64,
    kv_peak_reserved_over_needed: f64,
    kv_max_reserved_over_needed_from_100: f64,
    weights_plus_kv_needed_bytes: u64,
    peak_device_over_weights_plus_kv: f64,
    /// Median host milliseconds per decode step before the submit call.
    host_ms_per_step: f64,
    /// That host time over the decode steps' time.
    host_share: f64,
    /// Host microseconds per decode step by part.
    host_us_per_step: HostUs,
}

#[derive(Serialize)]
struct KernelRow {
    kernel: String,
    per_token: usize,
    ms_per_dispatch: f64,
    ms_per_token: f64,
    bytes_read_per_dispatch: u64,
    gb_per_s: f64,
}

/// The dispatches of one decode step, as the runtime counted them.
#[derive(Serialize)]
struct Dispatches {
    /// Every dispatch of the step.
    per_step: u64,
    /// The most dispatches one layer's nodes recorded.
    per_layer: u64,
    /// Buffer copies of the step.
    copies_per_step: u64,
}

#[derive(Serialize)]
struct Report {
    adapter: String,
    backend: String,
    /// [`Dispatches::per_layer`] (the measure).
    dispatches_per_layer: u64,
    dispatches: Dispatches,
    weights_device_bytes: u64,
    weights_file_bytes: u64,
    weights_grouped_bytes: u64,
    kv_bytes_per_token: u64,
    prefill: Vec<PrefillRow>,
    decode: Vec<DecodeRun>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    kernels_per_token: Vec<KernelRow>,
}

/// A prompt of exactly `n` tokens: English text encoded, repeated as needed.
fn prompt_of(model: &Model, n: usize) -> Vec<u32> {
    const TEXT: &str = "The history of the city begins with a small settlement on the river, \
        where traders met to exchange grain, salt and cloth. Over the centuries the market \
        grew into a town with walls, a cathedral and a university, and its people learned \
        to build bridges, print books and sail to distant ports. ";
    let ids = model
        .tokenizer()
        .encode(TEXT, dynrt::tokenizer::Special::Plain);
    ids.iter().copied().cycle().take(n).collect()
}

fn load(engine: &Engine, args: &ModelArgs) -> anyhow::Result<Model> {
    let path = model_path(args.model.as_deref())?;
    Model::load(engine, &path, args.model_options(engine.gpu())?)
        .with_context(|| format!("loading {}", path.display()))
}

fn new_engine() -> anyhow::Result<Engine> {
    Ok(Engine::new(Gpu::new_blocking(GpuOptions::from_env()?)?))
}

fn run_options(policy: Policy, args: &ModelArgs) -> anyhow::Result<RunOptions> {
    let mut run = RunOptions::from_env(policy)?;
    run.pool = !args.no_pool;
    Ok(run)
}

fn prefill_rows(args: &Args) -> anyhow::Result<Vec<PrefillRow>> {
    let engine = new_engine()?;
    let model = load(&engine, &args.model)?;
    let run = run_options(Policy::Adaptive, &args.model)?;
    // Warm-up: compiles the prefill pipelines. 32 rows of x are past every adapter's
    // matrix-vector bound, so the prompts below find the prefill kernels compiled (a warm-up
    // of 8 rows would warm only the matrix-vector ones on a GPU, and its first prompt would
    // pay for compiling the tiled kernels: docs/benchmarks/2026-11-26-h200-llamacpp.md).
    model
        .session(run)
        .forward_blocking(&prompt_of(&model, 32))?;
    let mut rows = Vec::new();
    for &n in args.prefill.iter().filter(|&&n| n > 0) {
        let mut session = model.session(run);
        let prompt = prompt_of(&model, n);
        let t = Instant::now();
        session.forward_blocking(&prompt)?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        rows.push(PrefillRow {
            prompt_tokens: n,
            ms,
            tokens_per_s: n as f64 / (ms / 1e3),
        });
        if !args.json {
            eprintln!(
                "prefill {n:>5} tokens: {ms:>9.1} ms, {:.2} tokens/s",
                n as f64 / (ms / 1e3)
            );
        }
    }
    Ok(rows)
}

struct Step {
    context: usize,
    ms: f64,
    host_ms: f64,
    kv_reserved: u64,
    kv_needed: u64,
}

fn decode_run(
    args: &Args,
    policy_name: &str,
    curve: &mut Option<std::fs::File>,
) -> anyhow::Result<DecodeRun> {
    let policy: Policy = policy_name.parse().context("--policies")?;
    let engine = new_engine()?;
    let model = load(&engine, &args.model)?;
    let mut session = model.session(run_options(policy, &args.model)?);
    let max_context = args.contexts.iter().copied().max().unwrap_or(64);
    let prompt = prompt_of(&model, 16.min(max_context));
    // The session's own loop (tokens chosen on the device, the next step submitted before
    // a token is read): each step is timed from one token's delivery to the next's.
    let params = GenerateParams {
        max_tokens: max_context.saturating_sub(prompt.len()).max(1),
        sampling: SamplingParams::default(),
        stop_at_eos: false,
        keep_logits: false,
    };
    // A short generation on another session first: the decode pipelines are compiled by the
    // first decode step, whose host time would otherwise swamp the mean below.
    model
        .session(run_options(policy, &args.model)?)
        .generate_ids_blocking(
            &prompt,
            &GenerateParams {
                max_tokens: 3,
                ..params
            },
            &mut |_| {},
        )?;
    let mut times: Vec<Instant> = Vec::new();
    let mut hosts: Vec<dynrt::runtime::HostTime> = Vec::new();
    let bar = std::io::stderr().is_terminal() && !args.json;
    pollster::block_on(session.generate_ids_observed(&prompt, &params, &mut |e| {
        times.push(Instant::now());
        hosts.push(e.decode_host);
        if bar && e.index % 16 == 15 {
            eprint!(
                "\r{policy_name}: context {}/{max_context}, {:.1} ms per token   ",
                prompt.len() + e.index + 1,
                e.forward_ms
            );
            let _ = std::io::stderr().flush();
        }
    }))?;
    // Host time of each decode step (no pipeline compiled: the warm-up did): what the
    // decode request's grew by between two tokens, one step each in the steady loop. The
    // median of each part, so that the time a busy machine takes the core away from a few
    // steps does not count; before the submit call, which on a software adapter runs the
    // kernels too.
    let per_step: Vec<dynrt::runtime::HostTime> =
        hosts.windows(2).map(|w| w[1].since(&w[0])).collect();
    let part = |f: fn(&dynrt::runtime::HostTime) -> u64| {
        let v: Vec<f64> = per_step
            .iter()
            .filter(|h| h.iterations == 1)
            .map(|h| f(h) as f64 / 1e3)
            .collect();
        median(&v)
    };
    let host_us = HostUs {
        prepare: part(|h| h.prepare_ns),
        encode: part(|h| h.encode_ns),
        finish: part(|h| h.finish_ns),
        submit: part(|h| h.submit_ns),
        before_submit: part(dynrt::runtime::HostTime::before_submit_ns),
    };
    let host_per_step = host_us.before_submit / 1e3;
    let kv_reserved = session.kv_reserved_bytes();
    let kv_needed_final = session.kv_needed_bytes();
    let steps: Vec<Step> = times
        .windows(2)
        .enumerate()
        .map(|(i, w)| Step {
            // The token delivered at w[1] was chosen by the step whose context ends there.
            context: prompt.len() + i + 1,
            ms: w[1].duration_since(w[0]).as_secs_f64() * 1e3,
            host_ms: per_step
                .get(i)
                .map_or(host_per_step, |h| h.before_submit_ns() as f64 / 1e6),
            kv_reserved,
            kv_needed: kv_needed_final,
        })
        .collect();
    if bar {
        eprintln!();
    }
    if let Some(f) = curve.as_mut() {
        let mut prev = 0;
        for s in &steps {
            writeln!(
                f,
                "{policy_name},{},{:.3},{},{},{}",
                s.context,
                s.ms,
                s.kv_reserved,
                s.kv_needed,
                u8::from(s.kv_reserved != prev && prev != 0)
            )?;
            prev = s.kv_reserved;
        }
    }
    let contexts = args
        .contexts
        .iter()
        .map(|&c| {
            let in_window = |s: &&Step| s.context <= c && s.context + 16 > c;
            let window: Vec<f64> = steps.iter().filter(in_window).map(|s| s.ms).collect();
            let host: Vec<f64> = steps.iter().filter(in_window).map(|s| s.host_ms).collect();
            ContextRow {
                context: c,
                ms_per_token: median(&window),
                min_ms: window.iter().copied().fold(f64::INFINITY, f64::min),
                host_ms: median(&host),
            }
        })
        .collect();
    let step_up = step_up(&steps);
    let stats = engine.stats();
    let mut peak = [0u64; 4];
    for k in AllocKind::ALL {
        peak[k.index()] = stats.peak_bytes(k);
    }
    let ss = session.stats();
    let kv_needed = session.kv_needed_bytes();
    let kv_needed_peak = steps.iter().map(|s| s.kv_needed).max().unwrap_or(0);
    let from_100 = steps
        .iter()
        .filter(|s| s.context >= 100 && s.kv_needed > 0)
        .map(|s| s.kv_reserved as f64 / s.kv_needed as f64)
        .fold(0.0, f64::max);
    let weights_plus_kv = model.weight_bytes() + kv_needed_peak;
    let host_ms: f64 = steps.iter().map(|s| s.host_ms).sum();
    let step_ms: f64 = steps.iter().map(|s| s.ms).sum();
    let device_peak = peak[AllocKind::UsmDevice.index()] + peak[AllocKind::UsmShared.index()];
    Ok(DecodeRun {
        policy: policy_name.to_owned(),
        contexts,
        decode_steps: steps.len(),
        reallocations: ss.run.reallocations,
        allocations: ss.run.allocations,
        step_up,
        peak_bytes: PeakBytes::from_array(peak),
        regions: RegionReport::from_stats(&stats),
        kv_needed_bytes: kv_needed,
        kv_reserved_bytes: session.kv_reserved_bytes(),
        kv_reserved_peak_bytes: ss.kv_reserved_peak_bytes,
        kv_peak_reserved_over_needed: ss.kv_reserved_peak_bytes as f64
            / kv_needed_peak.max(1) as f64,
        kv_max_reserved_over_needed_from_100: from_100,
        weights_plus_kv_needed_bytes: weights_plus_kv,
        peak_device_over_weights_plus_kv: device_peak as f64 / weights_plus_kv.max(1) as f64,
        host_ms_per_step: host_per_step,
        host_share: host_ms / step_ms.max(1e-9),
        host_us_per_step: host_us,
    })
}

/// The median of `v` (0 when empty).
fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The step-up check over the steps at which the KV reserve changed.
fn step_up(steps: &[Step]) -> StepUp {
    let middle = |s: &[Step]| median(&s.iter().map(|x| x.ms).collect::<Vec<_>>());
    let mut ratios: Vec<(f64, usize)> = Vec::new();
    let mut growths = 0;
    for i in 1..steps.len() {
        if steps[i].kv_reserved == steps[i - 1].kv_reserved {
            continue;
        }
        growths += 1;
        if i >= 8 && i + 9 <= steps.len() {
            let before = middle(&steps[i - 8..i]);
            let after = middle(&steps[i + 1..i + 9]);
            ratios.push((after / before, steps[i].context));
        }
    }
    let mut sorted: Vec<f64> = ratios.iter().map(|r| r.0).collect();
    sorted.sort_by(f64::total_cmp);
    let (max_ratio, max_at) = ratios
        .iter()
        .copied()
        .fold((0.0, 0), |a, b| if b.0 > a.0 { b } else { a });
    StepUp {
        kv_growths: growths,
        max_ratio,
        median_ratio: sorted.get(sorted.len() / 2).copied().unwrap_or(0.0),
        max_at_context: max_at,
    }
}

/// One kernel of a decode step: the op, its operand shapes and types, how often a step runs
/// it, and the bytes it reads.
struct KernelCase {
    name: String,
    op: Op,
    inputs: Vec<(Shape, DType)>,
    out: Shape,
    per_token: usize,
}

fn kernel_cases(c: &ModelConfig, context: u64, proj: DType, embd: DType) -> Vec<KernelCase> {
    let (w, q, kv, f, v) = (
        u64::from(c.embedding_len),
        u64::from(c.q_len()),
        u64::from(c.kv_len()),
        u64::from(c.ffn_len),
        u64::from(c.vocab_size),
    );
    let l = c.num_layers as usize;
    let s = |d: &[u64]| Shape::new(d.to_vec());
    let f32s = |d: &[u64]| (s(d), DType::F32);
    let linear = |name: &str, n: u64, k: u64, ty: DType, per: usize| KernelCase {
        name: format!("{name}: linear {ty} [{n}, {k}]"),
        op: Op::Linear(ops::Linear),
        inputs: vec![f32s(&[1, k]), (s(&[n, k]), ty)],
        out: s(&[1, n]),
        per_token: per,
    };
    vec![
        linear("q, o", q, w, proj, 2 * l),
        linear("k, v", kv, w, proj, 2 * l),
        linear("gate, up", f, w, proj, 2 * l),
        linear("down", w, f, proj, l),
        linear("head (tied embedding)", v, w, embd, 1),
        KernelCase {
            name: format!("attention over {context} keys"),
            op: Op::Attention(ops::Attention {
                num_heads: c.num_heads,
                num_kv_heads: c.num_kv_heads,
                window: 0,
            }),
            inputs: vec![f32s(&[1, q]), f32s(&[context, kv]), f32s(&[context, kv])],
            out: s(&[1, q]),
            per_token: l,
        },
        KernelCase {
            name: "rms_norm".into(),
            op: Op::RmsNorm(ops::RmsNorm {
                eps: c.rms_eps,
                axis: -1,
            }),
            inputs: vec![f32s(&[1, w]), f32s(&[w])],
            out: s(&[1, w]),
            per_token: 2 * l + 1,
        },
        KernelCase {
            name: "rope (q and k)".into(),
            op: Op::Rope(ops::Rope {
                head_dim: c.head_dim,
                block: ops::rope_block(c.context_len),
                interleaved: true,
            }),
            inputs: vec![
                f32s(&[1, q]),
                (s(&[1]), DType::I32),
                f32s(&[
                    u64::from(ops::rope_table_rows(c.context_len)),
                    u64::from(c.rope_dim),
                ]),
            ],
            out: s(&[1, q]),
            per_token: 2 * l,
        },
        KernelCase {
            name: "silu_mul".into(),
            op: Op::Binary(BinaryOp::SiluMul),
            inputs: vec![f32s(&[1, f]), f32s(&[1, f])],
            out: s(&[1, f]),
            per_token: l,
        },
        KernelCase {
            name: "residual add".into(),
            op: Op::Binary(BinaryOp::Add),
            inputs: vec![f32s(&[1, w]), f32s(&[1, w])],
            out: s(&[1, w]),
            per_token: 2 * l,
        },
    ]
}

/// Device bytes of a tensor of `shape` in `dtype` (block formats in whole blocks).
fn bytes_of(shape: &Shape, dtype: DType) -> anyhow::Result<u64> {
    Ok(shape.size_bytes(dtype)?.div_ceil(4) * 4)
}

/// A buffer holding valid values of `dtype` (quantized blocks made by the format's quantizer,
/// positions 0).
fn operand_buffer(
    engine: &Engine,
    shape: &Shape,
    dtype: DType,
    rng: &mut SplitMix64,
) -> anyhow::Result<Buffer> {
    let n = shape.num_elements()?;
    let values: Vec<f32> = (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let bytes: Vec<u8> = match dtype {
        DType::F32 => bytemuck::cast_slice(&values).to_vec(),
        DType::I32 => vec![0u8; n as usize * 4],
        other => match dynrt::formats::of_dtype(other) {
            Some(f) => f.quantize_all(&values).ok_or_else(|| {
                anyhow::anyhow!("{shape} is not a whole number of {other} blocks")
            })?,
            None => anyhow::bail!("no bench operand of type {other}"),
        },
    };
    let mut padded = bytes;
    padded.resize(padded.len().div_ceil(4) * 4, 0);
    let buf = engine.allocate(&BufferDesc {
        label: "bench operand",
        size_bytes: padded.len() as u64,
        kind: AllocKind::UsmDevice,
    })?;
    engine.write(&buf, 0, &padded)?;
    Ok(buf)
}

fn profile(model: &Model, context: u64) -> anyhow::Result<Vec<KernelRow>> {
    let engine = model.engine();
    let gpu = engine.gpu();
    let c = model.config();
    let proj = DType::Q4_1;
    let embd = dynrt::llm::weight_dtype(c.embedding_type).unwrap_or(DType::F32);
    let mut kernels = Kernels::new(gpu);
    let mut rng = SplitMix64::new(3);
    let mut rows = Vec::new();
    let reps = 16;
    for case in kernel_cases(c, context, proj, embd) {
        let mut buffers = Vec::new();
        let mut read = 0;
        for (i, (shape, dtype)) in case.inputs.iter().enumerate() {
            buffers.push(operand_buffer(engine, shape, *dtype, &mut rng)?);
            // RoPE reads one row of its table (the positions are 0).
            read += match (&case.op, i) {
                (Op::Rope(_), 2) => u64::from(c.rope_dim) * 4,
                _ => bytes_of(shape, *dtype)?,
            };
        }
        let out = operand_buffer(engine, &case.out, DType::F32, &mut rng)?;
        let mut uniforms = UniformArena::new(engine);
        let mut best = f64::INFINITY;
        for round in 0..4 {
            uniforms.reset();
            let mut rec = Recording::new(gpu, "bench generate kernel");
            {
                let mut pass = rec.compute_pass("bench generate kernel");
                let operands: Vec<Operand<'_>> = buffers
                    .iter()
                    .zip(&case.inputs)
                    .map(|(b, (shape, dtype))| Operand {
                        tensor: TensorRef {
                            buffer: b,
                            offset_bytes: 0,
                            size_bytes: b.size_bytes(),
                        },
                        shape,
                        dtype: *dtype,
                        strides: None,
                        layout: dynrt::gpu::kernels::WeightLayout::File,
                    })
                    .collect();
                let output = Operand {
                    tensor: TensorRef {
                        buffer: &out,
                        offset_bytes: 0,
                        size_bytes: out.size_bytes(),
                    },
                    shape: &case.out,
                    dtype: DType::F32,
                    strides: None,
                    layout: dynrt::gpu::kernels::WeightLayout::File,
                };
                for _ in 0..reps {
                    kernels.encode(&mut pass, &mut uniforms, &case.op, &operands, &output)?;
                }
            }
            uniforms.flush();
            let secs = rec.submit_and_wait()?;
            if round > 0 {
                best = best.min(secs);
            }
        }
        let ms = best * 1e3 / f64::from(reps);
        rows.push(KernelRow {
            kernel: case.name,
            per_token: case.per_token,
            ms_per_dispatch: ms,
            ms_per_token: ms * case.per_token as f64,
            bytes_read_per_dispatch: read,
            gb_per_s: read as f64 / (ms / 1e3) / 1e9,
        });
    }
    rows.sort_by(|a, b| b.ms_per_token.total_cmp(&a.ms_per_token));
    Ok(rows)
}

/// The dispatches of the second decode step of a fresh request on `model`'s decode
/// network (the first compiles and allocates), counted per node by the runtime.
fn decode_dispatches(model: &Model, args: &Args) -> anyhow::Result<Dispatches> {
    use dynrt::llm::graph::labels;
    let (_, decode) = model.networks();
    let mut request =
        dynrt::runtime::InferRequest::new(decode, run_options(Policy::Adaptive, &args.model)?)?;
    request.log_commands(true);
    let token = prompt_of(model, 1).first().copied().unwrap_or(0) as i32;
    let one = Shape::new(vec![1]);
    // The step chooses its token on the device (the `sample` op), greedily, as the
    // session's loop does.
    let words = dynrt::graph::ops::SampleRow::greedy().to_words();
    let params = dynrt::runtime::HostTensor {
        shape: Shape::new(vec![1, words.len() as u64]),
        dtype: dynrt::shape::DType::U32,
        bytes: words.iter().flat_map(|w| w.to_le_bytes()).collect(),
    };
    let mut copies = 0;
    for position in 0..2 {
        let tokens = dynrt::runtime::HostTensor::i32(one.clone(), &[token]);
        let positions = dynrt::runtime::HostTensor::i32(one.clone(), &[position]);
        let before = request.stats().copies;
        request.infer_blocking(
            &[
                (labels::TOKENS, &tokens),
                (labels::POSITIONS, &positions),
                (labels::SAMPLE_PARAMS, &params),
            ],
            &[labels::NEXT_TOKEN],
        )?;
        copies = request.stats().copies - before;
    }
    let nodes = request.node_dispatches();
    let mut layers = vec![0u64; model.config().num_layers as usize];
    for &(label, n) in &nodes {
        let layer = label
            .strip_prefix("blk.")
            .and_then(|rest| rest.split('.').next())
            .and_then(|l| l.parse::<usize>().ok());
        if let Some(slot) = layer.and_then(|l| layers.get_mut(l)) {
            *slot += n;
        }
    }
    Ok(Dispatches {
        per_step: nodes.iter().map(|&(_, n)| n).sum(),
        per_layer: layers.iter().copied().max().unwrap_or(0),
        copies_per_step: copies,
    })
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut curve = match &args.curve {
        Some(p) => {
            let mut f = std::fs::File::create(p).with_context(|| p.display().to_string())?;
            writeln!(
                f,
                "policy,context,ms,kv_reserved_bytes,kv_needed_bytes,kv_grew"
            )?;
            Some(f)
        }
        None => None,
    };
    let prefill = if args.prefill.iter().any(|&n| n > 0) {
        prefill_rows(&args)?
    } else {
        Vec::new()
    };
    let mut decode = Vec::new();
    for p in args.policies.iter().filter(|p| !p.is_empty()) {
        let run = decode_run(&args, p, &mut curve)?;
        if !args.json {
            eprintln!(
                "{p}: {} decode steps, {} reallocations, step-up max {:.2} (median {:.2}) over {} KV growths",
                run.decode_steps,
                run.reallocations,
                run.step_up.max_ratio,
                run.step_up.median_ratio,
                run.step_up.kv_growths
            );
        }
        decode.push(run);
    }
    let engine = new_engine()?;
    let model = load(&engine, &args.model)?;
    let kernels_per_token = if args.profile {
        let context = args
            .profile_context
            .unwrap_or(args.contexts.iter().copied().max().unwrap_or(64) as u64);
        profile(&model, context)?
    } else {
        Vec::new()
    };
    let dispatches = decode_dispatches(&model, &args)?;
    let info = engine.gpu().adapter_info();
    let report = Report {
        adapter: info.name.clone(),
        backend: format!("{:?}", info.backend).to_lowercase(),
        dispatches_per_layer: dispatches.per_layer,
        dispatches,
        weights_device_bytes: model.weight_bytes(),
        weights_file_bytes: model.file_tensor_bytes(),
        weights_grouped_bytes: model.grouped_weight_bytes(),
        kv_bytes_per_token: model.kv_bytes_per_token(),
        prefill,
        decode,
        kernels_per_token,
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("adapter: {} ({})", report.adapter, report.backend);
    println!(
        "weights: {} on the device for {} of tensors in the file ({} of them reordered into grouped planes); KV cache {} per token",
        human_bytes(report.weights_device_bytes),
        human_bytes(report.weights_file_bytes),
        human_bytes(report.weights_grouped_bytes),
        human_bytes(report.kv_bytes_per_token)
    );
    println!(
        "a decode step: {} dispatches, at most {} per layer; {} buffer copies",
        report.dispatches.per_step, report.dispatches_per_layer, report.dispatches.copies_per_step
    );
    println!("\n| prompt tokens | prefill ms | tokens/s |\n|---:|---:|---:|");
    for r in &report.prefill {
        println!(
            "| {} | {:.0} | {:.2} |",
            r.prompt_tokens, r.ms, r.tokens_per_s
        );
    }
    let ctx_head: Vec<String> = args
        .contexts
        .iter()
        .map(|c| format!("ms/token @{c} (fastest)"))
        .collect();
    println!(
        "\n| policy | {} | host ms/step (share) | reallocations | KV growths | step-up max (median) | peak device | weights + KV needed | KV peak reserved / needed |",
        ctx_head.join(" | ")
    );
    println!(
        "|---|{}---:|---:|---:|---:|---:|---:|---:|",
        "---:|".repeat(ctx_head.len())
    );
    for r in &report.decode {
        let cells: Vec<String> = r
            .contexts
            .iter()
            .map(|c| format!("{:.0} ({:.0})", c.ms_per_token, c.min_ms))
            .collect();
        println!(
            "| {} | {} | {:.2} ({:.1}%) | {} | {} | {:.2} ({:.2}) | {} | {} | {:.3} |",
            r.policy,
            cells.join(" | "),
            r.host_ms_per_step,
            100.0 * r.host_share,
            r.reallocations,
            r.step_up.kv_growths,
            r.step_up.max_ratio,
            r.step_up.median_ratio,
            human_bytes(r.peak_bytes.usm_device + r.peak_bytes.usm_shared),
            human_bytes(r.weights_plus_kv_needed_bytes),
            r.kv_peak_reserved_over_needed
        );
    }
    println!(
        "\n| policy | host µs per decode step: prepare | encode | wgpu finish | before submit | submit call |\n|---|---:|---:|---:|---:|---:|"
    );
    for r in &report.decode {
        let h = &r.host_us_per_step;
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
            r.policy, h.prepare, h.encode, h.finish, h.before_submit, h.submit
        );
    }
    if !report.kernels_per_token.is_empty() {
        println!("\n| kernel (one decode step) | per token | ms per dispatch | ms per token | bytes read | GB/s |\n|---|---:|---:|---:|---:|---:|");
        for k in &report.kernels_per_token {
            println!(
                "| {} | {} | {:.3} | {:.1} | {} | {:.2} |",
                k.kernel,
                k.per_token,
                k.ms_per_dispatch,
                k.ms_per_token,
                human_bytes(k.bytes_read_per_dispatch),
                k.gb_per_s
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps(ms: &[f64], grow_at: &[usize]) -> Vec<Step> {
        let mut reserved = 100;
        ms.iter()
            .enumerate()
            .map(|(i, &ms)| {
                if grow_at.contains(&i) {
                    reserved += 10;
                }
                Step {
                    context: i + 16,
                    ms,
                    host_ms: 0.0,
                    kv_reserved: reserved,
                    kv_needed: 1,
                }
            })
            .collect()
    }

    #[test]
    fn step_up_sees_a_staircase_and_not_a_spike() {
        // Flat at 10 ms, a lasting jump to 20 ms at the growth at step 20: ratio 2.
        let mut ms = vec![10.0; 40];
        ms[21..].iter_mut().for_each(|m| *m = 20.0);
        let s = step_up(&steps(&ms, &[20]));
        assert_eq!(s.kv_growths, 1);
        assert_eq!(s.max_ratio, 2.0);
        assert_eq!(s.max_at_context, 36);
        // One spike of 5 s after a growth (another job on the machine): medians ignore it.
        let mut ms = vec![10.0; 40];
        ms[22] = 5000.0;
        assert_eq!(step_up(&steps(&ms, &[20])).max_ratio, 1.0);
        assert_eq!(median(&[3.0, 1.0, 2.0, 10.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }
}
