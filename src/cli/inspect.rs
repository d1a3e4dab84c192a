//! `dynrt inspect MODEL.onnx [--json]`: a model's inputs and outputs with their dims (fixed
//! or symbolic), opsets, op histogram, initializer bytes (inline and external) and every node
//! whose op the importer does not map. External data files are checked (present, long
//! enough), not read.

use anyhow::Context;
use dynrt::onnx::{InspectReport, LoadOptions, OnnxModel};
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `dynrt inspect`.
#[derive(clap::Args)]
pub struct Args {
    /// The `.onnx` file (external data is looked up beside it).
    model: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let options = LoadOptions {
        read_external: false,
        ..LoadOptions::default()
    };
    let model = OnnxModel::load(&args.model, &options)
        .with_context(|| format!("loading {}", args.model.display()))?;
    let report = InspectReport::new(&model);
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", report.to_text());
    }
    Ok(ExitCode::SUCCESS)
}
