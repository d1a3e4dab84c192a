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
//! * Trace (`--trace CALLS`, a sentence-transformers folder): CALLS iterations with `batch`
//!   uniform in `1..=--max-batch` and `seq` in `2..=--max-seq` (seeded; random token ids),
//!   replayed per policy (none, openvino, adaptive) through a request's memory decisions on
//!   host memory ([`dynrt::runtime::replay_on_host`]: the same sizing, pool and placeholder
//!   code as on a device, no kernel run): the reallocations (buffers replaced after the first
//!   call because they were too small), the output shapes that changed (what an allocator
//!   that sizes every output exactly would reallocate) and the peak bytes the request held,
//!   against the largest call alone with exact sizes (`[max-batch, max-seq]`, policy none).

use super::embed::{open_model, ModelArgs};
use super::run::{engine, provider};
use anyhow::Context;
use dynrt::fetch;
use dynrt::gpu::Engine;
use dynrt::memory::accounting::region_index;
use dynrt::memory::predictor::Policy;
use dynrt::memory::regions::Region;
use dynrt::rng::SplitMix64;
use dynrt::runtime::{replay_on_host, NetworkOptions, RunOptions};
use dynrt::sentence::{bert_inputs, folder_graph, Envelope};
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

/// The `[batch, seq]` of each call of the trace (seeded).
pub(crate) fn trace_shapes(calls: usize, max_batch: usize, max_seq: usize) -> Vec<(usize, usize)> {
    let mut rng = SplitMix64::new(34);
    (0..calls)
        .map(|_| {
            let b = rng.range(1, max_batch as u64 + 1) as usize;
            let s = rng.range(2, max_seq as u64 + 1) as usize;
            (b, s)
        })
        .collect()
}

fn trace(args: &Args, calls: usize) -> anyhow::Result<ExitCode> {
    let (max_batch, max_seq) = (args.max_batch.max(1), args.max_seq.max(2));
    let folder = match fetch::find_embedding_model(&args.model) {
        Some(spec) => {
            anyhow::ensure!(
                matches!(spec.format, fetch::EmbeddingFormat::SentenceTransformers),
                "--trace replays a sentence-transformers folder, and {} is an ONNX export",
                spec.name
            );
            fetch::resolve_embedding(&args.model)?
        }
        None => std::path::PathBuf::from(&args.model),
    };
    let (graph, vocab, pad) =
        folder_graph(&folder).context("--trace needs a sentence-transformers folder")?;
    let shapes = trace_shapes(calls, max_batch, max_seq);
    let steps = |shapes: Vec<(usize, usize)>| {
        let mut rng = SplitMix64::new(7);
        shapes.into_iter().map(move |(b, s)| {
            let rows = random_rows(&mut rng, b, s, vocab as u64);
            let refs: Vec<&[u32]> = rows.iter().map(Vec::as_slice).collect();
            bert_inputs(&refs, pad)
        })
    };
    let network = NetworkOptions {
        inflight: 1,
        ..NetworkOptions::default()
    };
    let need = replay_on_host(
        graph.clone(),
        &network,
        RunOptions::new(Policy::None),
        steps(vec![(max_batch, max_seq)]),
    )?
    .peak_bytes;
    // As `SentenceModel` runs them: a fresh request at each envelope growth, its first call
    // padded to the envelope.
    let mut segments: Vec<Vec<(usize, usize)>> = Vec::new();
    let mut envelope = Envelope::new(max_batch, max_seq);
    for &(b, s) in &shapes {
        match envelope.fit(b, s) {
            Some(grown) => segments.push(vec![grown]),
            None => segments
                .last_mut()
                .context("the first call grows the envelope")?
                .push((b, s)),
        }
    }
    for policy in [Policy::None, Policy::OpenVino, Policy::Adaptive] {
        let name = format!("{policy:?}").to_lowercase();
        let t = web_time::Instant::now();
        let one = replay_on_host(
            graph.clone(),
            &network,
            RunOptions::new(policy),
            steps(shapes.clone()),
        )?;
        let (mut peak, mut reallocations, mut allocations) = (0u64, 0u64, 0u64);
        for (i, seg) in segments.iter().enumerate() {
            let r = replay_on_host(
                graph.clone(),
                &network,
                RunOptions::new(policy),
                steps(seg.clone()),
            )?;
            peak = peak.max(r.peak_bytes);
            allocations += r.stats.allocations;
            reallocations += r.stats.reallocations;
            if i > 0 {
                reallocations += r.stats.allocations.saturating_sub(r.stats.reallocations);
            }
        }
        let secs = t.elapsed().as_secs_f64();
        if args.json {
            let line = serde_json::json!({
                "model": args.model,
                "policy": name,
                "calls": calls,
                "max_batch": max_batch,
                "max_seq": max_seq,
                "largest_call_need_bytes": need,
                "exact_reallocations": one.stats.shape_updates,
                "one_request": {
                    "reallocations": one.stats.reallocations,
                    "allocations": one.stats.allocations,
                    "peak_bytes": one.peak_bytes,
                    "peak_over_need": one.peak_bytes as f64 / need.max(1) as f64,
                },
                "envelope": {
                    "growths": segments.len(),
                    "reallocations": reallocations,
                    "allocations": allocations,
                    "peak_bytes": peak,
                    "peak_over_need": peak as f64 / need.max(1) as f64,
                },
                "seconds": secs,
            });
            println!("{line}");
        } else {
            println!(
                "{name:>9}: by envelope ({} growths) {reallocations} reallocations, peak {:.1} MB = {:.2}x; one request growing buffer by buffer {} reallocations, peak {:.2}x; exact allocation {} (outputs whose shape changed); the largest call alone needs {:.1} MB",
                segments.len(),
                peak as f64 / 1e6,
                peak as f64 / need.max(1) as f64,
                one.stats.reallocations,
                one.peak_bytes as f64 / need.max(1) as f64,
                one.stats.shape_updates,
                need as f64 / 1e6
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
