//! `dynrt-bench onnx MODEL.onnx --feeds DIR [--steps N] [--out DIR] [--json] [--decode
//! --token-input NAME --logits NAME [--position-input NAME] --state OUT_PREFIX=IN_PREFIX ...]`:
//! the dynrt side of `scripts/bench_peer.sh` (its header comment is the specification).
//!
//! * Step 0 feeds every `DIR/<input>.npy` there is; each step is one run of the model.
//! * Without `--decode` the inputs are kept on the device ([`OnnxSession::keep_input`]:
//!   written once, by step 0, as the peer's inputs are device tensors bound once) and every
//!   step runs the model on them and ends when the device is idle.
//! * With `--decode` a step ends when the logits are on the host; the next token is the
//!   argmax of `logits[0, -1, :]` (first index on ties), fed as `TOKEN-INPUT [[t]]` (int64),
//!   with `POSITION-INPUT [[past + i]]` when given (past: the extent of the carried inputs'
//!   axis 2 at step 0, plus the tokens fed since); every output whose name starts with
//!   `OUT_PREFIX` becomes the input `IN_PREFIX` + the rest of its name without leaving the
//!   device (the runtime appends the caches in place).
//! * `--json` prints one line: `{"runtime":"dynrt","provider":"dynrt <version> <backend>
//!   <adapter>","load_ms":F,"steps":[{"ms":F,"cpu_ms":F,"counts":{...}}, ...],
//!   "peak_bytes":N,"tokens":[...]}`. `counts` are the deltas over the step of the Vulkan
//!   counting layer's counters when `PEER_COUNT_SHM` names its counter file (12 little-endian
//!   u64), `{}` otherwise; `peak_bytes` is the layer's `memory_peak_bytes` at the end when the
//!   file is there, else dynrt's own peak of device bytes in use. `cpu_ms` is the CPU time of
//!   every thread of the process over the step (Linux; on a software adapter the device's work
//!   runs on them), absent elsewhere. `stats` (an addition the peer script ignores) holds the
//!   session's counters over every step: allocations, reallocations, state growths, copies
//!   and their bytes, dispatches, submits.

use super::shared::{engine, npy_path, provider};
use anyhow::{bail, Context};
use dynrt::memory::predictor::Policy;
use dynrt::npy::{read_npy_file, write_npy_file};
use dynrt::onnx::{Carry, HostTensor, OnnxSession, SessionOptions, TensorDType, TensorData};
use dynrt::runtime::RunOptions;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `dynrt-bench onnx`.
#[derive(clap::Args)]
pub struct Args {
    /// The `.onnx` file (external data is looked up beside it).
    model: PathBuf,
    /// Folder of `<input>.npy` files fed at step 0.
    #[arg(long, value_name = "DIR")]
    feeds: PathBuf,
    /// Steps to run.
    #[arg(long, default_value_t = 16)]
    steps: usize,
    /// Write every output of the last step as `DIR/<output>.npy`.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Print one JSON line.
    #[arg(long)]
    json: bool,
    /// Greedy decoding: feed the argmax token back, carry the states.
    #[arg(long)]
    decode: bool,
    /// The token input (int64 `[1, 1]` after step 0).
    #[arg(long = "token-input", value_name = "NAME")]
    token_input: Option<String>,
    /// The logits output (`[batch, seq, vocab]`).
    #[arg(long, value_name = "NAME")]
    logits: Option<String>,
    /// The position input (int64 `[1, 1]` after step 0).
    #[arg(long = "position-input", value_name = "NAME")]
    position_input: Option<String>,
    /// Outputs named OUT_PREFIX... become the inputs IN_PREFIX... of the next step.
    #[arg(long = "state", value_name = "OUT_PREFIX=IN_PREFIX")]
    states: Vec<String>,
    /// Preallocation policy: none, openvino or adaptive.
    #[arg(long, default_value = "adaptive")]
    policy: String,
}

/// The counting layer's counters, in the order of its shared file.
const COUNTERS: [&str; 12] = [
    "create_buffer",
    "create_buffer_bytes",
    "destroy_buffer",
    "allocate_memory",
    "allocate_memory_bytes",
    "free_memory",
    "queue_submit",
    "cmd_dispatch",
    "compute_pipelines",
    "map_memory",
    "memory_live_bytes",
    "memory_peak_bytes",
];

/// The counting layer's counters, when `PEER_COUNT_SHM` names a complete counter file.
fn read_counters() -> Option<[u64; 12]> {
    let path = std::env::var_os("PEER_COUNT_SHM")?;
    let raw = std::fs::read(path).ok()?;
    let mut c = [0u64; 12];
    for (i, v) in c.iter_mut().enumerate() {
        *v = u64::from_le_bytes(raw.get(i * 8..i * 8 + 8)?.try_into().ok()?);
    }
    Some(c)
}

/// The counts of a step as JSON: the first ten counters' deltas (the last two are levels,
/// not counts); `{}` without the counter file.
fn counts_json(delta: Option<[u64; 12]>) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    if let Some(d) = delta {
        for (name, v) in COUNTERS.iter().zip(d).take(10) {
            m.insert((*name).into(), v.into());
        }
    }
    serde_json::Value::Object(m)
}

/// CPU time of every thread of this process so far, nanoseconds (Linux: the threads'
/// `schedstat`; a thread that has exited no longer counts).
fn cpu_ns() -> Option<u64> {
    let mut total = 0u64;
    for entry in std::fs::read_dir("/proc/self/task").ok()? {
        let path = entry.ok()?.path().join("schedstat");
        let text = std::fs::read_to_string(path).unwrap_or_default();
        total += text
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Some(total)
}

/// The argmax of the last row of `logits[0]` (first index on ties).
fn argmax_last(logits: &HostTensor) -> anyhow::Result<i64> {
    let (TensorDType::F32, TensorData::Bytes(b)) = (logits.dtype(), logits.data()) else {
        bail!("the logits are {}, not f32", logits.dtype());
    };
    let vocab = *logits
        .dims()
        .last()
        .context("the logits have no dimensions")? as usize;
    if vocab == 0 || b.len() < vocab * 4 {
        bail!("the logits are empty");
    }
    let rows = b.len() / 4 / vocab;
    let per_batch = logits
        .dims()
        .get(1..logits.dims().len().saturating_sub(1))
        .map_or(1, |d| d.iter().product::<u64>() as usize);
    let row = per_batch.min(rows).max(1) - 1;
    let mut best = (0usize, f32::NEG_INFINITY);
    for i in 0..vocab {
        let at = (row * vocab + i) * 4;
        let v = f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        if v > best.1 {
            best = (i, v);
        }
    }
    Ok(best.0 as i64)
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let policy: Policy = args.policy.parse().context("--policy")?;
    if args.decode && (args.token_input.is_none() || args.logits.is_none()) {
        bail!("--decode needs --token-input and --logits");
    }
    let engine = engine()?;
    let t0 = web_time::Instant::now();
    // The carried pairs come from the model's outputs and inputs, so the model is loaded
    // first without carrying anything to learn its names.
    let model = dynrt::onnx::OnnxFile::load(&args.model, &dynrt::onnx::LoadOptions::default())
        .with_context(|| format!("loading {}", args.model.display()))?;
    let input_names: Vec<String> = model
        .graph
        .runtime_inputs()
        .map(|i| i.name.clone())
        .collect();
    let mut pairs = Vec::new();
    if args.decode {
        for s in &args.states {
            let (out_prefix, in_prefix) = s
                .split_once('=')
                .with_context(|| format!("--state {s}: expected OUT_PREFIX=IN_PREFIX"))?;
            for o in &model.graph.outputs {
                if let Some(rest) = o.name.strip_prefix(out_prefix) {
                    let input = format!("{in_prefix}{rest}");
                    if input_names.contains(&input) {
                        pairs.push((o.name.clone(), input));
                    }
                }
            }
        }
        if pairs.is_empty() && !args.states.is_empty() {
            bail!("no output matches the --state prefixes");
        }
    }
    let options = SessionOptions {
        run: RunOptions::from_env(policy)?,
        carry: Carry::Pairs(pairs.clone()),
    };
    let mut session = OnnxSession::from_model(&engine, &model, &options)?;
    drop(model);
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;

    let mut feeds: Vec<(String, HostTensor)> = Vec::new();
    for name in &input_names {
        let path = npy_path(&args.feeds, name);
        if path.exists() {
            let t = read_npy_file(&path).with_context(|| format!("feed `{name}`"))?;
            feeds.push((name.clone(), t));
        }
    }
    if !args.decode {
        for (name, t) in feeds.drain(..) {
            session.keep_input(&name, &t)?;
        }
    }
    let mut steps = Vec::with_capacity(args.steps);
    let mut tokens = Vec::new();
    let carried: Vec<&str> = pairs.iter().map(|(_, i)| i.as_str()).collect();
    let mut past = feeds
        .iter()
        .find(|(n, _)| carried.contains(&n.as_str()))
        .and_then(|(_, t)| t.dims().get(2).copied())
        .unwrap_or(0);
    for _ in 0..args.steps {
        let before = read_counters();
        let cpu0 = cpu_ns();
        let t = web_time::Instant::now();
        let refs: Vec<(&str, &HostTensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
        session.run_blocking(&refs)?;
        if let (true, Some(logits_name), Some(token_input)) =
            (args.decode, &args.logits, &args.token_input)
        {
            let logits = session.read_blocking(logits_name)?;
            let token = argmax_last(&logits)?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            let fed = feeds
                .iter()
                .find(|(n, _)| n == token_input)
                .and_then(|(_, t)| t.dims().get(1).copied())
                .unwrap_or(1);
            past += fed;
            tokens.push(token);
            feeds = vec![(
                token_input.clone(),
                HostTensor::from_i64(vec![1, 1], &[token])?,
            )];
            if let Some(p) = &args.position_input {
                feeds.push((p.clone(), HostTensor::from_i64(vec![1, 1], &[past as i64])?));
            }
            steps.push((ms, cpu0, before));
        } else {
            engine.gpu().poll_wait();
            steps.push((t.elapsed().as_secs_f64() * 1e3, cpu0, before));
        }
        let last = steps.len() - 1;
        let cpu = cpu_ns()
            .zip(steps[last].1)
            .map(|(a, b)| a.saturating_sub(b));
        steps[last].1 = cpu;
        let after = read_counters();
        steps[last].2 = before.zip(after).map(|(b, a)| {
            let mut d = [0u64; 12];
            for i in 0..12 {
                d[i] = a[i].wrapping_sub(b[i]);
            }
            d
        });
    }
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let names: Vec<String> = session.outputs().iter().map(|o| o.name.clone()).collect();
        for name in names {
            let t = session.read_blocking(&name)?;
            write_npy_file(npy_path(dir, &name), &t).with_context(|| format!("output `{name}`"))?;
        }
    }
    let end = read_counters();
    let peak_bytes = match end {
        Some(c) => c[11],
        None => engine.stats().device_peak_bytes,
    };
    let step_docs: Vec<serde_json::Value> = steps
        .iter()
        .map(|(ms, cpu, d)| {
            let mut o = serde_json::json!({ "ms": ms, "counts": counts_json(*d) });
            if let Some(ns) = cpu {
                o["cpu_ms"] = (*ns as f64 / 1e6).into();
            }
            o
        })
        .collect();
    if args.json {
        let doc = serde_json::json!({
            "runtime": "dynrt",
            "provider": provider(&engine),
            "load_ms": load_ms,
            "steps": step_docs,
            "peak_bytes": peak_bytes,
            "tokens": tokens,
            "stats": session.stats(),
        });
        println!("{doc}");
    } else {
        let mut ms: Vec<f64> = steps.iter().map(|s| s.0).collect();
        ms.sort_by(f64::total_cmp);
        let median = ms.get(ms.len() / 2).copied().unwrap_or(0.0);
        let stats = session.stats();
        println!("{}", provider(&engine));
        println!(
            "load {load_ms:.1} ms; {} steps, median {median:.3} ms/step; peak device bytes {peak_bytes}",
            steps.len()
        );
        println!(
            "allocations {} (reallocations {}), state growths {}, copies {} ({} bytes), dispatches {}, submits {}, input bytes written {}",
            stats.allocations,
            stats.reallocations,
            stats.state_growths,
            stats.copies,
            stats.copy_bytes,
            stats.dispatches,
            stats.submits,
            stats.input_bytes_written
        );
        if !tokens.is_empty() {
            println!("tokens {tokens:?}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
