//! `dynrt-bench batch`: decode throughput of the batched engine (`llm::BatchEngine`) with
//! 1, 4, 16, ... sequences decoding together, against one `Session` decoding alone, on the
//! same model and adapter.

use super::shared::model::{open, ModelArgs};
use dynrt::llm::{BatchEngine, BatchOptions, GenerateParams, SamplingParams};
use serde::Serialize;
use std::process::ExitCode;
use std::time::Instant;

/// Arguments of `dynrt-bench batch`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Sequences decoding together, one measurement each.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    sessions: Vec<usize>,
    /// Prompt tokens of each sequence (distinct prompts: nothing is shared).
    #[arg(long = "prompt-tokens", default_value_t = 32)]
    prompt_tokens: usize,
    /// Decode steps timed per measurement.
    #[arg(long, default_value_t = 32)]
    tokens: usize,
    /// Positions per page.
    #[arg(long = "page-size", default_value_t = 16)]
    page_size: u32,
    /// Print one JSON object per line instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Row {
    runtime: &'static str,
    sessions: usize,
    decode_steps: usize,
    ms_per_step: f64,
    decode_tok_s: f64,
    vs_session: f64,
    kv_pool_bytes: u64,
    adapter: String,
    load: [f64; 2],
}

fn load() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// A prompt of `n` ids for sequence `k`, inside the vocabulary, different for every `k`.
fn prompt(k: usize, n: usize, vocab: u32) -> Vec<u32> {
    (0..n)
        .map(|i| ((k * 7919 + i * 104_729 + 1000) % (vocab as usize - 1000)) as u32 + 500)
        .collect()
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let (engine, model, run) = open(&args.model)?;
    let adapter = engine.gpu().adapter_info().name.clone();
    let vocab = model.config().vocab_size;
    let params = GenerateParams {
        max_tokens: args.tokens + 1,
        sampling: SamplingParams::default(),
        stop_at_eos: false,
        keep_logits: false,
    };
    // One session alone: its decode steps after the prompt.
    let l0 = load();
    let mut session = model.session(run);
    let p = prompt(0, args.prompt_tokens, vocab);
    let mut logits = session.forward_blocking(&p)?;
    let t = Instant::now();
    for _ in 0..args.tokens {
        let next = dynrt::llm::sample::argmax(&logits);
        logits = session.forward_blocking(&[next])?;
    }
    let session_ms = t.elapsed().as_secs_f64() * 1e3 / args.tokens.max(1) as f64;
    drop(session);
    let mut rows = vec![Row {
        runtime: "session",
        sessions: 1,
        decode_steps: args.tokens,
        ms_per_step: session_ms,
        decode_tok_s: 1e3 / session_ms,
        vs_session: 1.0,
        kv_pool_bytes: 0,
        adapter: adapter.clone(),
        load: [l0, load()],
    }];
    for &n in &args.sessions {
        let n = n.max(1);
        let l0 = load();
        // A sequence whose prompt ends early decodes while the others read theirs: it may
        // generate that many tokens more, and must not finish inside the timed steps.
        let step_tokens = (n as u32).max(128);
        let early = (n * args.prompt_tokens).div_ceil(step_tokens as usize) + 1;
        let params = GenerateParams {
            max_tokens: args.tokens + early + 1,
            ..params
        };
        let per_seq = (args.prompt_tokens + params.max_tokens + 1) as u32;
        let mut batch = BatchEngine::new(
            &model,
            BatchOptions {
                page_size: args.page_size,
                pool_tokens: per_seq.div_ceil(args.page_size) * args.page_size * n as u32,
                step_tokens,
                max_batch: n,
                run,
                ..BatchOptions::default()
            },
        )?;
        for k in 0..n {
            batch.add(&prompt(k, args.prompt_tokens, vocab), params)?;
        }
        // Every prompt first (not timed: until then a step mixes prompt chunks into the
        // decode rows), then decode steps of all n sequences.
        let prompts = (n * args.prompt_tokens) as u64;
        while batch.stats().prompt_rows < prompts && !batch.is_idle() {
            batch.step_blocking()?;
        }
        let t = Instant::now();
        let before = batch.stats().decode_rows;
        let mut steps = 0;
        while steps < args.tokens && !batch.is_idle() {
            batch.step_blocking()?;
            steps += 1;
        }
        let secs = t.elapsed().as_secs_f64();
        let rows_done = batch.stats().decode_rows - before;
        let tok_s = rows_done as f64 / secs;
        rows.push(Row {
            runtime: "batch",
            sessions: n,
            decode_steps: steps,
            ms_per_step: secs * 1e3 / steps.max(1) as f64,
            decode_tok_s: tok_s,
            vs_session: tok_s * session_ms / 1e3,
            kv_pool_bytes: batch.pool_bytes(),
            adapter: adapter.clone(),
            load: [l0, load()],
        });
    }
    if args.json {
        for r in &rows {
            println!("{}", serde_json::to_string(r)?);
        }
    } else {
        println!(
            "{adapter}: decode throughput, {} prompt tokens, {} steps timed",
            args.prompt_tokens, args.tokens
        );
        println!("| runtime | sequences | ms per step | decode tokens/s | vs one session | KV pools MiB | load |");
        println!("|---|---:|---:|---:|---:|---:|---|");
        for r in &rows {
            println!(
                "| {} | {} | {:.1} | {:.2} | {:.2}x | {:.1} | {:.1}-{:.1} |",
                r.runtime,
                r.sessions,
                r.ms_per_step,
                r.decode_tok_s,
                r.vs_session,
                r.kv_pool_bytes as f64 / (1 << 20) as f64,
                r.load[0],
                r.load[1]
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
