//! `dynrt-bench plan`: static offsets for a MiniMalloc-format CSV (see `memory::planner`).

use anyhow::Context;
use dynrt::fileio;
use dynrt::memory::planner::{self, Plan, PlanError, PlanOptions, Strategy, SvgOptions};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use web_time::Instant;

/// Arguments of `dynrt-bench plan`.
#[derive(clap::Args)]
pub struct Args {
    /// Buffers: CSV with header `id,lower,upper,size[,alignment]`, lifetimes half-open (a
    /// regular file of at most 1 GiB).
    buffers: PathBuf,
    /// Arena size the plan must fit in (bytes); without it the height is minimised.
    #[arg(long)]
    capacity: Option<u64>,
    /// best | gmem-fit-first | gmem-op-size | greedy-size | search.
    #[arg(long, default_value = "best")]
    strategy: String,
    /// Time budget in milliseconds for improving on the greedy baseline (which always
    /// completes: the plan is never worse than it).
    #[arg(long, default_value_t = 10_000)]
    time_limit_ms: u64,
    /// Every offset a multiple of this many bytes (e.g. 256 for a wgpu arena).
    #[arg(long, default_value_t = 1)]
    min_align: u64,
    /// Write the solution (the input rows plus `offset`) here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Draw the solution as an SVG picture here.
    #[arg(long)]
    svg: Option<PathBuf>,
    /// Print one JSON object instead of the summary.
    #[arg(long)]
    json: bool,
    /// Run every strategy and print one markdown table row (`height/lower bound, ms` each).
    #[arg(long)]
    compare: bool,
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    // The error names the path: no context needed.
    let text = fileio::read_bounded_text(&args.buffers, fileio::MAX_TEXT_BYTES, "a buffer CSV")?;
    let buffers =
        planner::parse_csv(&text).with_context(|| format!("parsing {}", args.buffers.display()))?;
    let strategy: Strategy = args.strategy.parse().map_err(anyhow::Error::msg)?;
    let opts = PlanOptions {
        strategy,
        capacity: args.capacity,
        time_limit: Duration::from_millis(args.time_limit_ms),
        min_align_bytes: args.min_align,
    };
    let name = args
        .buffers
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    if args.compare {
        return compare(&name, &buffers, &opts);
    }
    let start = Instant::now();
    let result = planner::build(&buffers, &opts);
    let millis = start.elapsed().as_millis();
    let lb = planner::lower_bound(&buffers);
    let plan = match result {
        Ok(plan) => plan,
        Err(PlanError::DoesNotFit {
            capacity_bytes,
            lower_bound,
            best_height,
        }) => {
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({"buffers": buffers.len(), "lower_bound": lower_bound, "height": best_height,
                        "ratio": ratio(best_height, lower_bound), "fits": false, "capacity": capacity_bytes,
                        "strategy": strategy.name(), "millis": millis})
                );
            }
            anyhow::bail!(
                "{}: no plan fits in {capacity_bytes} bytes within {} ms (lower bound {lower_bound}, best height {best_height}); raise --capacity or --time-limit-ms",
                args.buffers.display(),
                args.time_limit_ms
            );
        }
        Err(e) => return Err(e).with_context(|| format!("planning {}", args.buffers.display())),
    };
    // Never hand out a plan that the independent checker rejects.
    planner::validate(&buffers, &plan.offsets, args.min_align)
        .context("internal error: the plan failed validation")?;
    if let Some(path) = &args.out {
        std::fs::write(path, planner::write_csv(&buffers, &plan.offsets))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.svg {
        let svg = planner::to_svg(
            &buffers,
            &plan.offsets,
            &SvgOptions {
                title: name.clone(),
                lower_bound: Some(lb),
                capacity: args.capacity,
                ..SvgOptions::default()
            },
        );
        std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))?;
    }
    if args.json {
        println!(
            "{}",
            serde_json::json!({"buffers": buffers.len(), "lower_bound": plan.lower_bound, "height": plan.height,
                "ratio": plan.ratio(), "fits": true, "capacity": args.capacity,
                "strategy": plan.strategy_used.name(), "millis": millis})
        );
    } else {
        print_summary(&name, buffers.len(), &plan, args.capacity, millis);
    }
    Ok(ExitCode::SUCCESS)
}

fn ratio(height: u64, lb: u64) -> f64 {
    if lb == 0 {
        1.0
    } else {
        height as f64 / lb as f64
    }
}

fn print_summary(name: &str, n: usize, plan: &Plan, capacity: Option<u64>, millis: u128) {
    println!("{name}: {n} buffers");
    println!("  lower bound  {}", plan.lower_bound);
    println!(
        "  height       {} (ratio {:.4}{})",
        plan.height,
        plan.ratio(),
        if plan.optimal { ", optimal" } else { "" }
    );
    if let Some(c) = capacity {
        println!("  capacity     {c} (fits, {} bytes spare)", c - plan.height);
    }
    println!("  strategy     {}", plan.strategy_used);
    println!("  time         {millis} ms");
}

/// One markdown row: instance, buffers, lower bound, then `height/lb ratio (ms)` per strategy.
fn compare(
    name: &str,
    buffers: &[planner::PlanBuffer],
    opts: &PlanOptions,
) -> anyhow::Result<ExitCode> {
    let lb = planner::lower_bound(buffers);
    let mut row = format!("| {name} | {} | {lb} |", buffers.len());
    let mut all_ok = true;
    for strategy in [
        Strategy::GmemFitFirst,
        Strategy::GmemOpSize,
        Strategy::GreedySize,
        Strategy::Search,
        Strategy::Best,
    ] {
        let start = Instant::now();
        let r = planner::build(buffers, &PlanOptions { strategy, ..*opts });
        let ms = start.elapsed().as_millis();
        match r {
            Ok(plan) => {
                planner::validate(buffers, &plan.offsets, opts.min_align_bytes)
                    .context("internal error: the plan failed validation")?;
                row.push_str(&format!(" {} ({:.4}) {ms} ms |", plan.height, plan.ratio()));
            }
            Err(PlanError::DoesNotFit { best_height, .. }) => {
                all_ok = false;
                row.push_str(&format!(
                    " no fit: {best_height} ({:.4}) {ms} ms |",
                    ratio(best_height, lb)
                ));
            }
            Err(e) => return Err(e.into()),
        }
    }
    println!("{row}");
    Ok(if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
