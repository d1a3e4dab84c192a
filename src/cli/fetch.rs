//! `dynrt fetch [NAME] [--list] [--dir DIR] [--check] [--json]`: puts a model's GGUF (the
//! default, SmolLM2-135M-Instruct, when no NAME is given) in the model cache (once; later
//! runs only check its sha256) and prints its path on stdout; `--list` shows the models.

use super::shared::model::print_event;
use anyhow::Context;
use dynrt::fetch::{self, FetchError, FetchOptions, DEFAULT_MODEL, MODELS};
use dynrt::gguf::MappedGguf;
use dynrt::llm::ModelConfig;
use serde_json::json;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `dynrt fetch`.
#[derive(clap::Args)]
pub struct Args {
    /// The model (`dynrt fetch --list` shows the names; default: the SmolLM2 model).
    name: Option<String>,
    /// List the models (name, download size, architecture, license, whether it is cached)
    /// instead of fetching.
    #[arg(long)]
    list: bool,
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
    let dir = match args.dir {
        Some(d) => d,
        None => fetch::models_dir()?,
    };
    if args.list {
        list(&dir, args.json)?;
        return super::embed::list_models(&dir, args.json);
    }
    if let Some(spec) = args.name.as_deref().and_then(fetch::find_embedding_model) {
        return super::embed::fetch_model(spec, dir, args.check, args.json);
    }
    let spec = match args.name.as_deref() {
        None => DEFAULT_MODEL,
        Some(name) => fetch::find_model(name).ok_or_else(|| FetchError::UnknownModel {
            name: name.to_owned(),
            known: format!("{}, {}", fetch::model_names(), fetch::embedding_names()),
        })?,
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
            "name": spec.name,
            "license": spec.license,
            "requirements": spec.parts.iter().map(|p| p.requirement).collect::<Vec<_>>(),
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

/// `--list`: one line (or JSON object) per model of [`MODELS`].
fn list(dir: &std::path::Path, json: bool) -> anyhow::Result<ExitCode> {
    for m in MODELS {
        let cached = fetch::model_path(m, dir)
            .metadata()
            .is_ok_and(|md| md.len() == m.size_bytes);
        if json {
            let row = json!({
                "name": m.name,
                "summary": m.summary,
                "architecture": m.architecture,
                "license": m.license,
                "bytes": m.size_bytes,
                "download_bytes": m.wheel_bytes(),
                "cached": cached,
                "default": std::ptr::eq(*m, DEFAULT_MODEL),
            });
            println!("{row}");
        } else {
            println!(
                "{:<30} {:>7.1} MB  {:<6} {}{}\n    {}\n    license: {}",
                m.name,
                m.size_bytes as f64 / 1e6,
                m.architecture,
                if cached { "cached" } else { "not fetched" },
                if std::ptr::eq(*m, DEFAULT_MODEL) {
                    " (default)"
                } else {
                    ""
                },
                m.summary,
                m.license,
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
