//! `dynrt run MODEL.onnx --input NAME=FILE.npy ... [--output-dir DIR [--overwrite]] [--json]`:
//! one run of an ONNX model on the GPU with inputs from `.npy` files, every graph output
//! written as `DIR/<output>.npy`.
//!
//! The output files are checked before the model runs: two outputs whose names sanitise to
//! one file, a symbolic link (or anything but a regular file) at an output's path, and an
//! existing file without `--overwrite` are errors, and nothing is written. Each output is
//! then written to a temporary file beside its destination and moved into place, so a link
//! that appears meanwhile is replaced, never written through.

use anyhow::Context;
use dynrt::fileio::{self, FileError, Replace};
use dynrt::memory::predictor::Policy;
use dynrt::npy::{read_npy_file, write_npy};
use dynrt::onnx::{
    parse_input_arg, Carry, HostTensor, LoadOptions, OnnxFile, OnnxSession, SessionOptions,
};
use dynrt::runtime::RunOptions;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::shared::{engine, npy_path, provider};

/// Arguments of `dynrt run`.
#[derive(clap::Args)]
pub struct Args {
    /// The `.onnx` file, at most 2 GiB (external data is looked up beside it).
    model: PathBuf,
    /// An input as a NumPy file, `NAME=FILE.npy` (repeat for each input; int64 and
    /// zero-length dimensions, such as an empty past, are fine).
    #[arg(long = "input", value_name = "NAME=FILE.npy")]
    inputs: Vec<String>,
    /// Write every graph output as DIR/<output>.npy (`/` and `\` in a name become `_`).
    /// Checked before the model runs: two outputs that would share a file, a symbolic link
    /// or anything but a regular file at an output's path, and an existing file (without
    /// --overwrite) are errors, and nothing is written.
    #[arg(long = "output-dir", value_name = "DIR")]
    output_dir: Option<PathBuf>,
    /// Replace existing output files in DIR (each by an atomic rename; a symbolic link at an
    /// output's path is still refused, never followed).
    #[arg(long, requires = "output_dir")]
    overwrite: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Preallocation policy: none, openvino or adaptive.
    #[arg(long, default_value = "adaptive")]
    policy: String,
}

#[derive(serde::Serialize)]
struct OutputLine {
    name: String,
    dtype: String,
    dims: Vec<u64>,
    file: Option<String>,
}

/// The file of every output in `dir`, checked before anything runs (see the module doc).
fn output_files(
    dir: &Path,
    names: &[String],
    replace: Replace,
) -> anyhow::Result<BTreeMap<String, PathBuf>> {
    let mut files = BTreeMap::new();
    let mut owners: HashMap<PathBuf, &str> = HashMap::new();
    for name in names {
        if files.contains_key(name) {
            // The same output listed twice is one file.
            continue;
        }
        let path = npy_path(dir, name);
        if let Some(first) = owners.get(&path) {
            anyhow::bail!(
                "outputs `{first}` and `{name}` would both be written to {}: \
                 nothing was written (run without --output-dir, or rename one in the model)",
                path.display()
            );
        }
        fileio::check_destination(&path, replace).map_err(|e| match e {
            FileError::Exists { .. } => {
                anyhow::anyhow!("output `{name}`: {e}: pass --overwrite to replace it")
            }
            FileError::NotAFile { .. } => {
                anyhow::anyhow!("output `{name}`: {e}: it is not followed or replaced")
            }
            other => anyhow::Error::new(other).context(format!("output `{name}`")),
        })?;
        owners.insert(path.clone(), name);
        files.insert(name.clone(), path);
    }
    Ok(files)
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let policy: Policy = args.policy.parse().context("--policy")?;
    let loading = || format!("loading {}", args.model.display());
    // Decoded without the GPU, so that the output files are checked before anything runs.
    let t0 = web_time::Instant::now();
    let model = OnnxFile::load(&args.model, &LoadOptions::default()).with_context(loading)?;
    let decode_ms = t0.elapsed().as_secs_f64() * 1e3;
    let replace = if args.overwrite {
        Replace::Allow
    } else {
        Replace::Never
    };
    let files = match &args.output_dir {
        Some(dir) => {
            let names: Vec<String> = model.graph.outputs.iter().map(|o| o.name.clone()).collect();
            let files = output_files(dir, &names, replace)?;
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            Some(files)
        }
        None => None,
    };
    let mut feeds: Vec<(String, HostTensor)> = Vec::new();
    for arg in &args.inputs {
        let (name, path) = parse_input_arg(arg)?;
        let t = read_npy_file(&path).with_context(|| format!("input `{name}`"))?;
        feeds.push((name, t));
    }
    let engine = engine()?;
    let t0 = web_time::Instant::now();
    let options = SessionOptions {
        run: RunOptions::from_env(policy)?,
        // One run with every input given: nothing is carried.
        carry: Carry::None,
    };
    let mut session = OnnxSession::from_model(&engine, &model, &options).with_context(loading)?;
    drop(model);
    let load_ms = decode_ms + t0.elapsed().as_secs_f64() * 1e3;
    let refs: Vec<(&str, &HostTensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let t1 = web_time::Instant::now();
    session.run_blocking(&refs)?;
    let mut outputs = Vec::new();
    let names: Vec<String> = session.outputs().iter().map(|o| o.name.clone()).collect();
    for name in &names {
        let t = session.read_blocking(name)?;
        let file = match &files {
            Some(files) => {
                let path = files.get(name).with_context(|| {
                    format!("output `{name}` is not among the model's declared outputs")
                })?;
                let bytes = write_npy(&t).with_context(|| format!("output `{name}`"))?;
                fileio::write_new_file(path, &bytes, replace)
                    .with_context(|| format!("output `{name}`"))?;
                Some(path.display().to_string())
            }
            None => None,
        };
        outputs.push(OutputLine {
            name: name.clone(),
            dtype: t.dtype().to_string(),
            dims: t.dims().to_vec(),
            file,
        });
    }
    let run_ms = t1.elapsed().as_secs_f64() * 1e3;
    if args.json {
        let doc = serde_json::json!({
            "model": args.model.display().to_string(),
            "provider": provider(&engine),
            "load_ms": load_ms,
            "run_ms": run_ms,
            "outputs": outputs,
            "stats": session.stats(),
            "peak_device_bytes": engine.stats().device_peak_bytes,
        });
        println!("{doc}");
    } else {
        for o in &outputs {
            let dims: Vec<String> = o.dims.iter().map(u64::to_string).collect();
            match &o.file {
                Some(f) => println!("{}: {}[{}] -> {f}", o.name, o.dtype, dims.join(", ")),
                None => println!("{}: {}[{}]", o.name, o.dtype, dims.join(", ")),
            }
        }
        eprintln!("load {load_ms:.1} ms, run and read {run_ms:.1} ms");
    }
    Ok(ExitCode::SUCCESS)
}
