//! `dynrt inspect MODEL.onnx [--json]`: a model's inputs and outputs with their dims (fixed
//! or symbolic), opsets, op histogram, initializer bytes (inline and external) and every node
//! whose op the importer does not map. External data files are checked (present, long
//! enough), not read. A GGUF goes to [`super::inspect_gguf`].

use anyhow::Context;
use dynrt::onnx::{InspectReport, LoadOptions, OnnxFile};
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `dynrt inspect`.
#[derive(clap::Args)]
pub struct Args {
    /// The `.onnx` file (external data is looked up beside it) or a `.gguf` model.
    model: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if is_gguf(&args.model) {
        super::inspect_gguf::run(&args.model, args.json)?;
        return Ok(ExitCode::SUCCESS);
    }
    let options = LoadOptions {
        read_external: false,
        ..LoadOptions::default()
    };
    let model = OnnxFile::load(&args.model, &options)
        .with_context(|| format!("loading {}", args.model.display()))?;
    let report = InspectReport::new(&model);
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", report.to_text());
    }
    Ok(ExitCode::SUCCESS)
}

/// A `.gguf` name, or a regular file that starts with the GGUF magic.
fn is_gguf(path: &std::path::Path) -> bool {
    use std::io::Read;
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    {
        return true;
    }
    let mut magic = [0u8; 4];
    std::fs::metadata(path).is_ok_and(|m| m.is_file())
        && std::fs::File::open(path).is_ok_and(|mut f| f.read_exact(&mut magic).is_ok())
        && &magic == b"GGUF"
}
