//! `dynrt demo`: the built-in GPT-2 style decoder, prefill and greedy decode with a growing KV
//! cache on the GPU, checked against the CPU reference.

use anyhow::Context;
use dynrt::demo::decoder::DecoderConfig;
use dynrt::demo::DemoConfig;
use dynrt::gpu::{Engine, Gpu, GpuOptions};
use dynrt::memory::predictor::Policy;
use dynrt::runtime::report::{human_bytes, render_svg};
use dynrt::runtime::RunOptions;
use std::path::PathBuf;
use std::process::ExitCode;

use super::shared::demo::run_demo;

/// Arguments of `dynrt demo`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Tokens to generate (the prefill makes the first, each decode step one more).
    #[arg(long, default_value_t = 32)]
    pub steps: u32,
    /// Prompt length (tokens drawn from the seed).
    #[arg(long = "prompt-len", default_value_t = 8)]
    pub prompt_len: u32,
    /// Transformer blocks.
    #[arg(long, default_value_t = 2)]
    pub layers: u32,
    /// Attention heads (must divide --dim).
    #[arg(long, default_value_t = 4)]
    pub heads: u32,
    /// Model width.
    #[arg(long, default_value_t = 64)]
    pub dim: u32,
    /// Vocabulary size.
    #[arg(long, default_value_t = 256)]
    pub vocab: u32,
    /// Preallocation policy: none, openvino or adaptive.
    #[arg(long, default_value = "adaptive")]
    pub policy: String,
    /// Seed of the weights and the prompt.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Compare with the CPU reference every K steps (0: never). Default: every step up to
    /// 128 steps, then every steps/16.
    #[arg(long = "check-every")]
    pub check_every: Option<u32>,
    /// Turn the memory pool off (every node owns its buffer).
    #[arg(long = "no-pool")]
    pub no_pool: bool,
    /// Turn the static planner off.
    #[arg(long = "no-planner")]
    pub no_planner: bool,
    /// Print one JSON object instead of the readable report.
    #[arg(long)]
    pub json: bool,
    /// Write an SVG of bytes in use per kind over the steps, reallocations marked.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Write the runtime's shape trace (every sizing decision, `id,dtype,shape`) to this CSV;
    /// `dynrt-bench predict FILE.csv --policy P` replays it to the run's `sizing` numbers.
    #[arg(long = "trace-out", value_name = "FILE.csv")]
    pub trace_out: Option<PathBuf>,
}

impl Args {
    /// The demo configuration these arguments describe (environment applied: poison,
    /// preallocation options).
    pub fn config(&self) -> anyhow::Result<DemoConfig> {
        let policy: Policy = self.policy.parse().context("--policy")?;
        let mut run = RunOptions::from_env(policy)?;
        run.pool = !self.no_pool;
        run.trace = self.trace_out.is_some();
        Ok(DemoConfig {
            model: DecoderConfig {
                layers: self.layers,
                heads: self.heads,
                dim: self.dim,
                vocab: self.vocab,
                max_positions: self.prompt_len.saturating_add(self.steps),
                seed: self.seed,
            },
            prompt_len: self.prompt_len,
            steps: self.steps,
            run,
            planner: !self.no_planner,
            check_every: self.check_every.unwrap_or(if self.steps <= 128 {
                1
            } else {
                (self.steps / 16).max(1)
            }),
        })
    }
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let config = args.config()?;
    let gpu = Gpu::new_blocking(GpuOptions::from_env()?)?;
    let engine = Engine::new(gpu);
    let demo = run_demo(&engine, config)?;
    let summary = demo.summary();
    if let Some(path) = &args.report {
        let title = format!(
            "dynrt demo: {} policy, {} steps on {} ({} reallocations)",
            summary.policy, summary.steps, summary.adapter, summary.reallocations
        );
        std::fs::write(path, render_svg(demo.trace(), &title))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.trace_out {
        let trace = demo
            .sizing_trace()
            .context("the run recorded no shape trace")?;
        std::fs::write(path, trace).with_context(|| format!("writing {}", path.display()))?;
    }
    // Tolerance of the self-check: f32 kernels against an f64-accumulating reference.
    let ok = summary.max_abs_err.is_finite() && summary.max_abs_err <= 1e-2;
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        println!("adapter        {} ({})", summary.adapter, summary.backend);
        println!(
            "model          {} layers, {} heads, dim {}, vocab {}; prompt {} tokens",
            config.model.layers,
            config.model.heads,
            config.model.dim,
            config.model.vocab,
            config.prompt_len
        );
        println!("policy         {}", summary.policy);
        println!("tokens         {:?}", summary.tokens);
        println!(
            "max |err|      {:.3e} against the CPU reference ({})",
            summary.max_abs_err,
            if ok { "ok" } else { "FAILED" }
        );
        println!(
            "allocations    {} ({} reallocations by the request), {} allocated in total",
            summary.allocations,
            summary.reallocations,
            human_bytes(summary.bytes_allocated_total)
        );
        println!(
            "peak bytes     usm_device {}, usm_host {}, usm_shared {}, cl_mem {}",
            human_bytes(summary.peak_bytes.usm_device),
            human_bytes(summary.peak_bytes.usm_host),
            human_bytes(summary.peak_bytes.usm_shared),
            human_bytes(summary.peak_bytes.cl_mem)
        );
        let r = &summary.regions;
        println!(
            "regions        constants {} in {} (peak {}), placeholders {} in {} (peak {}), internal {} in {} (peak {})",
            human_bytes(r.constants.bytes),
            r.constants.buffers,
            human_bytes(r.constants.peak_bytes),
            human_bytes(r.placeholders.bytes),
            r.placeholders.buffers,
            human_bytes(r.placeholders.peak_bytes),
            human_bytes(r.internal.bytes),
            r.internal.buffers,
            human_bytes(r.internal.peak_bytes)
        );
        println!(
            "pipelines      {} hits, {} misses; {} shape updates skipped",
            summary.pipeline_cache.hits,
            summary.pipeline_cache.misses,
            summary.shape_updates_skipped
        );
        let stats = demo.stats();
        println!(
            "dispatches     {} ({} replayed from their nodes' dispatch plans), {} copies, {} submits",
            stats.dispatches, stats.dispatches_replayed, stats.copies, stats.submits
        );
        println!(
            "sizing         {} decisions, {} reallocations ({} reclaims), peak reserved {}",
            summary.sizing.rows,
            summary.sizing.reallocations,
            summary.sizing.reclaims,
            human_bytes(summary.sizing.peak_reserved_bytes)
        );
        println!(
            "time           {:.2} ms per decode step (CPU check excluded)",
            summary.ms_per_step
        );
        if let Some(path) = &args.trace_out {
            println!("shape trace    {}", path.display());
        }
        if let Some(path) = &args.report {
            println!("report         {}", path.display());
        }
    }
    if !ok {
        eprintln!(
            "error: GPU logits differ from the CPU reference by {} (tolerance 1e-2)",
            summary.max_abs_err
        );
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}
