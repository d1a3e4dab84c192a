//! `dynrt bench embed --model DIR|FILE|NAME [--batches 1,8,64] [--sentences N] [--json]
//! [--texts-out FILE.json]`:
//! sentences per second of a sentence model at each batch size, and with `--trace CALLS`
//! the memory of a trace of calls with random `[batch, seq]` under each preallocation
//! policy.
//!
//! * Throughput: `--sentences` seeded sentences of 4 to 40 words (mixed, like the queries and
//!   passages of a search), embedded once to warm up (pipelines, buffers), then timed over
//!   `--repeat` passes; batches of at most `batch` sentences, sorted by length
//!   (`sentence::plan_batches`). The time covers tokenizing, every iteration and reading the
//!   vectors back.
//! * Trace (`--trace CALLS`): CALLS iterations with `batch` uniform in `1..=--max-batch` and
//!   `seq` in `2..=--max-seq` (seeded; random token ids, no padding), on a fresh engine per
//!   policy (none, openvino, adaptive): the request's reallocations (buffers replaced after
//!   the first call because they were too small) and the peak of device bytes beside the
//!   weights, against the need of the largest call alone (a fresh request with exact
//!   allocation running only `[max-batch, max-seq]`).

use super::embed::{open_model, ModelArgs};
use super::run::{engine, provider};
use anyhow::Context;
use dynrt::gpu::Engine;
use dynrt::memory::accounting::region_index;
use dynrt::memory::regions::Region;
use dynrt::rng::SplitMix64;
use std::process::ExitCode;

/// Arguments of `dynrt bench embed`.
#[derive(clap::Args)]
pub struct Args {
    /// A sentence-transformers folder, an ONNX encoder file, or an embedding model's name.
    #[arg(long, value_name = "DIR|FILE|NAME")]
    model: String,
    /// Batch sizes to time, comma-separated.
    #[arg(long, default_value = "1,8,64", value_delimiter = ',')]
    batches: Vec<usize>,
    /// Sentences per pass.
    #[arg(long, default_value_t = 256)]
    sentences: usize,
    /// Timed passes per batch size.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Instead of timing: a trace of this many calls with random [batch, seq].
    #[arg(long, value_name = "CALLS")]
    trace: Option<usize>,
    /// The largest batch of the trace.
    #[arg(long, default_value_t = 32)]
    max_batch: usize,
    /// The longest sequence of the trace.
    #[arg(long, default_value_t = 128)]
    max_seq: usize,
    /// Print JSON lines.
    #[arg(long)]
    json: bool,
    /// Write the timed sentences as `{"texts": [...]}` (the input of
    /// scripts/bench_embed_ort.py, ONNX Runtime's side) and exit.
    #[arg(long, value_name = "FILE.json")]
    texts_out: Option<std::path::PathBuf>,
    #[command(flatten)]
    run: ModelArgs,
}

/// `n` seeded sentences of 4 to 40 words.
pub(crate) fn bench_sentences(n: usize, seed: u64) -> Vec<String> {
    let words = [
        "the",
        "a",
        "of",
        "and",
        "to",
        "in",
        "is",
        "search",
        "memory",
        "model",
        "browser",
        "query",
        "answer",
        "river",
        "bank",
        "money",
        "music",
        "weather",
        "city",
        "train",
        "system",
        "runtime",
        "shape",
        "dynamic",
        "fast",
        "simple",
        "people",
        "world",
        "data",
        "language",
        "image",
        "sentence",
        "vector",
        "similar",
        "different",
        "today",
        "because",
        "without",
        "between",
        "during",
    ];
    let mut rng = SplitMix64::new(seed);
    (0..n)
        .map(|_| {
            let len = rng.range(4, 41);
            (0..len)
                .map(|_| words[rng.range(0, words.len() as u64) as usize])
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

/// Device bytes in use beside the constants (weights) at the engine's peak.
fn activation_peak(engine: &Engine) -> u64 {
    let s = engine.stats();
    let constants = region_index(Region::Constants).map_or(0, |i| s.regions[i].current_bytes);
    s.device_peak_bytes.saturating_sub(constants)
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if let Some(calls) = args.trace {
        return trace(&args, calls);
    }
    let texts = bench_sentences(args.sentences, 2026);
    if let Some(out) = &args.texts_out {
        let json = serde_json::json!({ "texts": texts }).to_string();
        dynrt::fileio::write_new_file(out, json.as_bytes(), dynrt::fileio::Replace::Allow)?;
        return Ok(ExitCode::SUCCESS);
    }
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    for &batch in &args.batches {
        let engine = engine()?;
        let mut margs = args.run.clone();
        margs.batch = batch;
        let load = web_time::Instant::now();
        let mut model = open_model(&engine, &args.model, &margs)?;
        let load_ms = load.elapsed().as_secs_f64() * 1e3;
        let warm = model.embed_blocking(&refs).context("warm-up pass")?;
        let t = web_time::Instant::now();
        for _ in 0..args.repeat.max(1) {
            model.embed_blocking(&refs)?;
        }
        let secs = t.elapsed().as_secs_f64() / args.repeat.max(1) as f64;
        let tokens: usize = warm.tokens.iter().sum();
        let per_s = texts.len() as f64 / secs;
        if args.json {
            let line = serde_json::json!({
                "runtime": "dynrt",
                "provider": provider(&engine),
                "model": args.model,
                "batch": batch,
                "sentences": texts.len(),
                "tokens": tokens,
                "padding_tokens": warm.padding_tokens,
                "batches": warm.batches,
                "load_ms": load_ms,
                "seconds": secs,
                "sentences_per_s": per_s,
                "tokens_per_s": tokens as f64 / secs,
                "reallocations": model.stats().reallocations,
                "activation_peak_bytes": activation_peak(&engine),
            });
            println!("{line}");
        } else {
            println!(
                "batch {batch:>3}: {per_s:>8.1} sentences/s ({:.0} tokens/s, {} sentences, {tokens} tokens + {} padding, {} batches)",
                tokens as f64 / secs,
                texts.len(),
                warm.padding_tokens,
                warm.batches
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Token ids of `[batch, seq]` rows: `[CLS]`, random ids, `[SEP]`.
fn random_rows(rng: &mut SplitMix64, batch: usize, seq: usize, vocab: u64) -> Vec<Vec<u32>> {
    (0..batch)
        .map(|_| {
            (0..seq)
                .map(|j| {
                    if j == 0 {
                        101
                    } else if j + 1 == seq {
                        102
                    } else {
                        rng.range(1000, vocab.max(1001)) as u32
                    }
                })
                .collect()
        })
        .collect()
}

fn trace(args: &Args, calls: usize) -> anyhow::Result<ExitCode> {
    let (max_batch, max_seq) = (args.max_batch.max(1), args.max_seq.max(2));
    // The need of the largest call alone, allocated exactly.
    let need = {
        let engine = engine()?;
        let mut margs = args.run.clone();
        margs.policy = "none".into();
        let mut model = open_model(&engine, &args.model, &margs)?;
        let vocab = model.tokenizer().vocab_size() as u64;
        let rows = random_rows(&mut SplitMix64::new(1), max_batch, max_seq, vocab);
        let refs: Vec<&[u32]> = rows.iter().map(Vec::as_slice).collect();
        pollster::block_on(model.run_batch(&refs))?;
        activation_peak(&engine)
    };
    for policy in ["none", "openvino", "adaptive"] {
        let engine = engine()?;
        let mut margs = args.run.clone();
        margs.policy = policy.into();
        let mut model = open_model(&engine, &args.model, &margs)?;
        let vocab = model.tokenizer().vocab_size() as u64;
        let mut rng = SplitMix64::new(34);
        let t = web_time::Instant::now();
        for _ in 0..calls {
            let batch = rng.range(1, max_batch as u64 + 1) as usize;
            let seq = rng.range(2, max_seq as u64 + 1) as usize;
            let rows = random_rows(&mut rng, batch, seq, vocab);
            let refs: Vec<&[u32]> = rows.iter().map(Vec::as_slice).collect();
            pollster::block_on(model.run_batch(&refs))?;
        }
        let secs = t.elapsed().as_secs_f64();
        let stats = model.stats();
        let sizing = model.sizing();
        let peak = activation_peak(&engine);
        if args.json {
            let line = serde_json::json!({
                "provider": provider(&engine),
                "model": args.model,
                "policy": policy,
                "calls": calls,
                "max_batch": max_batch,
                "max_seq": max_seq,
                "reallocations": stats.reallocations,
                "allocations": stats.allocations,
                "reuses": stats.reuses,
                "bytes_allocated_total": stats.bytes_allocated_total,
                "activation_peak_bytes": peak,
                "largest_call_need_bytes": need,
                "peak_over_need": peak as f64 / need.max(1) as f64,
                "sizer_peak_reserved_bytes": sizing.peak_reserved_bytes,
                "sizer_peak_needed_bytes": sizing.peak_needed_bytes,
                "seconds": secs,
            });
            println!("{line}");
        } else {
            println!(
                "{policy:>9}: {} reallocations over {calls} calls, peak {:.1} MB beside the weights = {:.2}x the largest call's {:.1} MB ({secs:.1} s)",
                stats.reallocations,
                peak as f64 / 1e6,
                peak as f64 / need.max(1) as f64,
                need as f64 / 1e6
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
