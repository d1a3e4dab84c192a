//! A sentence model as the `--model` options of `embed`, `serve --embedding-model` and
//! `dynrt-bench embed` choose it: a sentence-transformers folder, an ONNX encoder file or an
//! embedding model's name.

use anyhow::{bail, Context};
use dynrt::fetch;
use dynrt::fileio;
use dynrt::gpu::Engine;
use dynrt::memory::predictor::Policy;
use dynrt::sentence::{EmbedOptions, OnnxParts, Pipeline, Pooling, SentenceModel};
use std::path::{Path, PathBuf};

/// How a sentence model is chosen and run: shared by `embed`, `serve --embedding-model` and
/// `dynrt-bench embed`.
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// tokenizer.json of an ONNX encoder given as a file (default: tokenizer.json beside it).
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    /// Pooling of an ONNX encoder given as a file: mean, cls or max.
    #[arg(long, default_value = "mean")]
    pub pooling: String,
    /// Whether an ONNX encoder given as a file L2-normalizes its vectors.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub normalize: bool,
    /// The most tokens per sentence of an ONNX encoder given as a file.
    #[arg(long, default_value_t = 512)]
    pub max_length: usize,
    /// The most sentences per batch.
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Preallocation policy: none, openvino or adaptive.
    #[arg(long, default_value = "adaptive")]
    pub policy: String,
}

/// The sentence model `model` names (see the module doc).
pub fn open_model(engine: &Engine, model: &str, args: &ModelArgs) -> anyhow::Result<SentenceModel> {
    let policy: Policy = args.policy.parse().context("--policy")?;
    if args.batch == 0 {
        bail!("--batch must be at least 1");
    }
    let options = EmbedOptions {
        max_batch: args.batch,
        run: dynrt::runtime::RunOptions::from_env(policy)?,
        ..EmbedOptions::default()
    };
    let path = Path::new(model);
    let loading = || format!("loading {model}");
    if path.is_dir() {
        return SentenceModel::open_folder(engine, path, options).with_context(loading);
    }
    if fileio::check_regular(path).is_ok() {
        let tokenizer = match &args.tokenizer {
            Some(t) => t.clone(),
            None => path.with_file_name("tokenizer.json"),
        };
        let pooling = Pooling::parse(&args.pooling)
            .with_context(|| format!("--pooling {}: mean, cls or max", args.pooling))?;
        let parts = OnnxParts {
            tokenizer,
            pipeline: Pipeline {
                pooling,
                normalize: args.normalize,
                max_seq_length: args.max_length,
            },
        };
        return SentenceModel::open_onnx(engine, path, &parts, options).with_context(loading);
    }
    let Some(spec) = fetch::find_embedding_model(model) else {
        bail!(
            "--model {model}: no such folder or file, nor an embedding model name (known: {})",
            fetch::embedding_names()
        );
    };
    let folder = fetch::resolve_embedding(model)?;
    if let Some(from) = spec.tokenizer_from {
        fetch::resolve_embedding(from)
            .with_context(|| format!("{model} takes its tokenizer from {from}"))?;
    }
    let cache = fetch::models_dir()?;
    SentenceModel::open_spec(engine, spec, &folder, &cache, options).with_context(loading)
}
