//! `dynrt embed --model DIR|FILE|NAME [TEXT ...] [--input FILE.jsonl]`: sentence embeddings
//! printed as JSON lines, one `{"index", "tokens", "embedding"}` object per text, in order.
//!
//! `--model` is a sentence-transformers folder (`model.safetensors`, `config.json`,
//! `tokenizer.json`, `modules.json`, `1_Pooling/config.json`), an ONNX encoder file (with
//! `--tokenizer`, `--pooling`, `--normalize`, `--max-length`; the tokenizer defaults to a
//! `tokenizer.json` beside the file), or a name of `dynrt fetch --list` (an embedding model in
//! the cache). `--input` reads JSON lines: each a string, or an object with a `"text"`.

use anyhow::{bail, Context};
use dynrt::fetch;
use dynrt::fileio;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::shared::sentence::{open_model, ModelArgs};

/// The largest `--input` file read.
const MAX_INPUT_BYTES: u64 = 256 << 20;

/// Arguments of `dynrt embed`.
#[derive(clap::Args)]
pub struct Args {
    /// A sentence-transformers folder, an ONNX encoder file, or an embedding model's name.
    #[arg(long, value_name = "DIR|FILE|NAME")]
    model: String,
    /// Texts read from a JSON-lines file (a string, or an object with "text", per line).
    #[arg(long, value_name = "FILE.jsonl")]
    input: Option<PathBuf>,
    #[command(flatten)]
    run: ModelArgs,
    /// The texts to embed.
    texts: Vec<String>,
}

/// The texts of a JSON-lines file.
fn read_jsonl(path: &Path) -> anyhow::Result<Vec<String>> {
    let text = fileio::read_bounded_text(path, MAX_INPUT_BYTES, "a JSON-lines file")?;
    let mut texts = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("{} line {}", path.display(), i + 1))?;
        match v {
            serde_json::Value::String(s) => texts.push(s),
            serde_json::Value::Object(ref o) => match o.get("text") {
                Some(serde_json::Value::String(s)) => texts.push(s.clone()),
                _ => bail!(
                    "{} line {}: an object needs a string \"text\"",
                    path.display(),
                    i + 1
                ),
            },
            _ => bail!(
                "{} line {}: a string or an object with \"text\" expected",
                path.display(),
                i + 1
            ),
        }
    }
    Ok(texts)
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut texts = args.texts.clone();
    if let Some(input) = &args.input {
        texts.extend(read_jsonl(input)?);
    }
    if texts.is_empty() {
        bail!("no text: give texts as arguments or --input FILE.jsonl");
    }
    let engine = super::shared::engine()?;
    let mut model = open_model(&engine, &args.model, &args.run)?;
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let out = model.embed_blocking(&refs)?;
    let stdout = std::io::stdout();
    let mut w = std::io::BufWriter::new(stdout.lock());
    for i in 0..out.len() {
        let line = serde_json::json!({
            "index": i,
            "tokens": out.tokens[i],
            "embedding": out.vector(i),
        });
        writeln!(w, "{line}")?;
    }
    w.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// `dynrt fetch NAME` for an embedding model: its folder in the cache `dir`.
pub(crate) fn fetch_model(
    spec: &fetch::EmbeddingSpec,
    dir: PathBuf,
    check: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let opts = fetch::FetchOptions::new(dir);
    let folder = if check {
        let folder = fetch::embedding_dir(spec, &opts.dir);
        fetch::verify_embedding(spec, &folder)?;
        folder
    } else {
        fetch::fetch_embedding(spec, &opts, &mut super::shared::model::print_event)?
    };
    if json {
        let out = serde_json::json!({
            "path": folder,
            "bytes": spec.size_bytes(),
            "name": spec.name,
            "license": spec.license,
            "requirements": [spec.requirement],
            "files": spec.files.iter().map(|f| serde_json::json!({
                "path": f.path, "bytes": f.size_bytes, "sha256": f.sha256,
            })).collect::<Vec<_>>(),
            "pooling": spec.pooling,
            "normalize": spec.normalize,
            "max_seq_length": spec.max_seq_length,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!("{}", folder.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// `dynrt fetch --list`: the embedding models after the language models.
pub(crate) fn list_models(dir: &Path, json: bool) -> anyhow::Result<ExitCode> {
    for m in fetch::EMBEDDING_MODELS {
        let folder = fetch::embedding_dir(m, dir);
        let cached = m.files.iter().all(|f| {
            folder
                .join(f.path)
                .metadata()
                .is_ok_and(|md| md.len() == f.size_bytes)
        });
        if json {
            let row = serde_json::json!({
                "name": m.name,
                "summary": m.summary,
                "architecture": "bert",
                "kind": "embedding",
                "license": m.license,
                "bytes": m.size_bytes(),
                "download_bytes": m.wheel_bytes,
                "cached": cached,
                "default": false,
            });
            println!("{row}");
        } else {
            println!(
                "{:<30} {:>7.1} MB  {:<6} {}\n    {}\n    license: {}",
                m.name,
                m.size_bytes() as f64 / 1e6,
                "bert",
                if cached { "cached" } else { "not fetched" },
                m.summary,
                m.license,
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
