//! `dynrt-bench predict`: replay a shape trace through a preallocation policy, or compare every
//! policy on several traces (`--compare`). The replay itself is
//! [`dynrt::memory::predictor::replay()`]; this file only parses arguments and prints.

use anyhow::Context;
use dynrt::fileio;
use dynrt::memory::predictor::{
    replay, Policy, PredictorOptions, ReplayConfig, ReplayOutcome, ReplaySummary, Trace,
    OPTIONS_ENV_VAR,
};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `dynrt-bench predict`.
#[derive(clap::Args)]
pub struct Args {
    /// Shape trace CSV (`id,dtype,shape[,can_reuse]`); several with `--compare` (regular
    /// files of at most 1 GiB each).
    #[arg(required = true, value_name = "TRACE.csv")]
    traces: Vec<PathBuf>,
    /// Preallocation policy: none, openvino or adaptive.
    #[arg(long, default_value = "openvino")]
    policy: Policy,
    /// Predictor options "ITERATIONS MAX_PER_ITER_BYTES MAX_PER_DIM_DIFF RATIO"
    /// (default: $DYNRT_MEM_PREALLOCATION_OPTIONS, else "10 16384 2 1.1").
    #[arg(long, value_name = "I B D R")]
    options: Option<String>,
    /// Device memory budget in bytes for the can-preallocate check (default: unlimited).
    #[arg(long, value_name = "N")]
    budget_bytes: Option<u64>,
    /// Largest buffer in bytes for the can-preallocate check (default: unlimited).
    #[arg(long, value_name = "N")]
    max_buffer_bytes: Option<u64>,
    /// One JSON object per row, then a summary line.
    #[arg(long, conflicts_with = "compare")]
    json: bool,
    /// Replay every trace under every policy and print one Markdown table.
    #[arg(long)]
    compare: bool,
}

/// One row in `--json` output, fields in the documented order.
#[derive(serde::Serialize)]
struct JsonRow<'a> {
    row: usize,
    id: &'a str,
    shape: &'a [u64],
    predicted: bool,
    prediction: &'a [u64],
    reallocated: bool,
    reserved_bytes: u64,
}

#[derive(serde::Serialize)]
struct JsonSummary {
    rows: usize,
    reallocations: u64,
    bytes_allocated_total: u64,
    peak_reserved_bytes: u64,
    peak_needed_bytes: u64,
}

#[derive(serde::Serialize)]
struct JsonSummaryLine {
    summary: JsonSummary,
}

/// Runs `dynrt-bench predict`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let options = match &args.options {
        Some(text) => PredictorOptions::parse_from(text, "--options")?,
        None => PredictorOptions::from_env()?.unwrap_or_default(),
    };
    if !args.compare && args.traces.len() != 1 {
        anyhow::bail!(
            "give one trace (or use --compare for several), got {}",
            args.traces.len()
        );
    }
    let mut traces = Vec::with_capacity(args.traces.len());
    for path in &args.traces {
        // The error names the path: no context needed.
        let text = fileio::read_bounded_text(path, fileio::MAX_TEXT_BYTES, "a shape trace")?;
        let trace = Trace::parse(&text).with_context(|| format!("in {}", path.display()))?;
        traces.push((path, trace));
    }
    let config_for = |policy| ReplayConfig {
        policy,
        options,
        budget_bytes: args.budget_bytes,
        max_buffer_bytes: args.max_buffer_bytes,
    };
    // Everything is computed and formatted before anything is printed, so a bad row never
    // leaves half a report on stdout.
    let text = if args.compare {
        let mut results = Vec::new();
        for (path, trace) in &traces {
            for policy in Policy::ALL {
                let out = replay(trace, &config_for(policy))
                    .with_context(|| format!("in {}", path.display()))?;
                results.push((path.display().to_string(), policy, out.summary));
            }
        }
        compare_table(&results, &options)
    } else {
        let (path, trace) = &traces[0];
        let out = replay(trace, &config_for(args.policy))
            .with_context(|| format!("in {}", path.display()))?;
        if args.json {
            json_lines(&out)?
        } else {
            table(&out, args.policy, &options)
        }
    };
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.flush()?;
    Ok(ExitCode::SUCCESS)
}

fn json_lines(out: &ReplayOutcome) -> anyhow::Result<String> {
    let mut text = String::new();
    for r in &out.rows {
        let row = JsonRow {
            row: r.row,
            id: &r.id,
            shape: r.shape.dims(),
            predicted: r.predicted,
            prediction: r.prediction.dims(),
            reallocated: r.reallocated,
            reserved_bytes: r.reserved_bytes,
        };
        text.push_str(&serde_json::to_string(&row)?);
        text.push('\n');
    }
    let s = out.summary;
    let line = JsonSummaryLine {
        summary: JsonSummary {
            rows: s.rows,
            reallocations: s.reallocations,
            bytes_allocated_total: s.bytes_allocated_total,
            peak_reserved_bytes: s.peak_reserved_bytes,
            peak_needed_bytes: s.peak_needed_bytes,
        },
    };
    text.push_str(&serde_json::to_string(&line)?);
    text.push('\n');
    Ok(text)
}

fn shape_text(dims: &[u64]) -> String {
    if dims.is_empty() {
        return "-".into();
    }
    dims.iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join("x")
}

fn table(out: &ReplayOutcome, policy: Policy, options: &PredictorOptions) -> String {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "{:>6}  {:<16} {:<20} {:>12}  {:<9} {:<20} {:<8} {:>14}",
        "row", "id", "shape", "needed", "predicted", "prediction", "realloc", "reserved_bytes"
    );
    for r in &out.rows {
        let realloc = match (r.reallocated, r.reclaimed) {
            (true, true) => "reclaim",
            (true, false) => "yes",
            _ => "",
        };
        let _ = writeln!(
            text,
            "{:>6}  {:<16} {:<20} {:>12}  {:<9} {:<20} {:<8} {:>14}",
            r.row,
            r.id,
            shape_text(r.shape.dims()),
            r.needed_bytes,
            if r.predicted { "yes" } else { "" },
            shape_text(r.prediction.dims()),
            realloc,
            r.reserved_bytes
        );
    }
    let s = out.summary;
    let _ = writeln!(
        text,
        "\npolicy {policy}, options \"{options}\": {} rows, {} reallocations ({} reclaims), \
         {} bytes allocated in total, peak reserved {} bytes, peak needed {} bytes ({})",
        s.rows,
        s.reallocations,
        s.reclaims,
        s.bytes_allocated_total,
        s.peak_reserved_bytes,
        s.peak_needed_bytes,
        ratio_text(s.peak_reserved_bytes as f64, s.peak_needed_bytes as f64)
    );
    text
}

fn ratio_text(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.3}x", a / b)
    } else {
        "-".into()
    }
}

fn compare_table(
    results: &[(String, Policy, ReplaySummary)],
    options: &PredictorOptions,
) -> String {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "| trace | rows | policy | reallocations | vs openvino | bytes allocated | peak reserved | peak needed | peak reserved / needed | mean reserved / needed |"
    );
    let _ = writeln!(text, "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    for (trace, policy, s) in results {
        let openvino = results
            .iter()
            .find(|(t, p, _)| t == trace && *p == Policy::OpenVino)
            .map(|(_, _, r)| r.reallocations);
        let vs = match openvino {
            Some(r) => ratio_text(s.reallocations as f64, r as f64),
            None => "-".into(),
        };
        let name = std::path::Path::new(trace)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| trace.clone());
        let _ = writeln!(
            text,
            "| {name} | {} | {policy} | {} | {vs} | {} | {} | {} | {} | {} |",
            s.rows,
            s.reallocations,
            s.bytes_allocated_total,
            s.peak_reserved_bytes,
            s.peak_needed_bytes,
            ratio_text(s.peak_reserved_bytes as f64, s.peak_needed_bytes as f64),
            ratio_text(s.mean_reserved_bytes, s.mean_needed_bytes),
        );
    }
    let _ = writeln!(
        text,
        "\noptions \"{options}\" (override with --options or {OPTIONS_ENV_VAR}); memory unlimited unless --budget-bytes"
    );
    text
}
