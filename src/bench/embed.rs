//! `dynrt-bench embed --model DIR|FILE|NAME [--batches 1,8,64] [--sentences N] [--json]
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

use super::kernels::process_cpu_seconds;
use super::shared::sentence::{open_model, ModelArgs};
use super::shared::{engine, provider};
use anyhow::Context;
use dynrt::fetch;
use dynrt::gpu::Engine;
use dynrt::memory::accounting::region_index;
use dynrt::memory::predictor::Policy;
use dynrt::memory::regions::Region;
use dynrt::rng::SplitMix64;
use dynrt::sentence::{folder_graph, random_rows, trace_memory};
use std::process::ExitCode;

/// Arguments of `dynrt-bench embed`.
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
    /// Instead of timing: every node's kernel time at one `BATCHxSEQ` (`8x32`), slowest
    /// first.
    #[arg(long, value_name = "BATCHxSEQ")]
    profile: Option<String>,
    /// Dispatches per timed submit of `--profile`.
    #[arg(long, default_value_t = 4)]
    profile_reps: u32,
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
    if let Some(at) = &args.profile {
        return profile_at(&args, at);
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
        let c0 = process_cpu_seconds();
        for _ in 0..args.repeat.max(1) {
            model.embed_blocking(&refs)?;
        }
        let secs = t.elapsed().as_secs_f64() / args.repeat.max(1) as f64;
        let cpu_secs = c0
            .zip(process_cpu_seconds())
            .map(|(a, b)| (b - a) / args.repeat.max(1) as f64);
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
                "cpu_seconds": cpu_secs,
                "sentences_per_s": per_s,
                "tokens_per_s": tokens as f64 / secs,
                "reallocations": model.stats().reallocations,
                "activation_peak_bytes": activation_peak(&engine),
            });
            println!("{line}");
        } else {
            println!(
                "batch {batch:>3}: {per_s:>8.1} sentences/s ({:.0} tokens/s, {:.2} s CPU, {} sentences, {tokens} tokens + {} padding, {} batches)",
                tokens as f64 / secs,
                cpu_secs.unwrap_or(f64::NAN),
                texts.len(),
                warm.padding_tokens,
                warm.batches
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `--profile BATCHxSEQ`: the model's network at one shape, node by node.
fn profile_at(args: &Args, at: &str) -> anyhow::Result<ExitCode> {
    let (b, s) = at
        .split_once('x')
        .and_then(|(b, s)| Some((b.parse::<usize>().ok()?, s.parse::<usize>().ok()?)))
        .filter(|&(b, s)| b > 0 && s > 1)
        .with_context(|| format!("--profile {at}: expected BATCHxSEQ, such as 8x32"))?;
    let engine = engine()?;
    let model = open_model(&engine, &args.model, &args.run)?;
    let mut rng = SplitMix64::new(5);
    let vocab = model.tokenizer().vocab_size() as u64;
    let rows = random_rows(&mut rng, b, s, vocab);
    let refs: Vec<&[u32]> = rows.iter().map(Vec::as_slice).collect();
    let inputs = model.inputs(&refs, s)?;
    let rows = profile::nodes(
        &engine,
        model.network().graph(),
        &inputs,
        args.profile_reps,
        2,
    )?;
    let total: f64 = rows.iter().map(|r| r.ms).sum();
    let total_cpu: f64 = rows.iter().filter_map(|r| r.cpu_ms).sum();
    if args.json {
        for r in &rows {
            println!("{}", serde_json::to_string(r)?);
        }
    } else {
        println!(
            "{at}: {} dispatched nodes, {total:.1} ms ({total_cpu:.1} ms CPU) in all",
            rows.len()
        );
        for r in &rows {
            println!(
                "{:>9.3} ms {:>9.3} ms CPU {:>5.1}%  {:<14} {:<24} {}",
                r.ms,
                r.cpu_ms.unwrap_or(f64::NAN),
                100.0 * r.ms / total.max(1e-9),
                r.op,
                r.shape,
                r.node
            );
        }
    }
    Ok(ExitCode::SUCCESS)
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
    for policy in [Policy::None, Policy::OpenVino, Policy::Adaptive] {
        let name = format!("{policy:?}").to_lowercase();
        let t = web_time::Instant::now();
        let m = trace_memory(&graph, vocab, pad, &shapes, (max_batch, max_seq), policy)?;
        let secs = t.elapsed().as_secs_f64();
        let need = m.largest_call_need_bytes.max(1) as f64;
        if args.json {
            let line = serde_json::json!({
                "model": args.model,
                "policy": name,
                "calls": calls,
                "max_batch": max_batch,
                "max_seq": max_seq,
                "largest_call_need_bytes": m.largest_call_need_bytes,
                "exact_reallocations": m.exact_reallocations,
                "one_request": {
                    "reallocations": m.one_request.stats.reallocations,
                    "allocations": m.one_request.stats.allocations,
                    "peak_bytes": m.one_request.peak_bytes,
                    "peak_over_need": m.one_request.peak_bytes as f64 / need,
                },
                "envelope": {
                    "growths": m.growths,
                    "reallocations": m.reallocations,
                    "allocations": m.allocations,
                    "peak_bytes": m.peak_bytes,
                    "peak_over_need": m.peak_bytes as f64 / need,
                },
                "seconds": secs,
            });
            println!("{line}");
        } else {
            println!(
                "{name:>9}: by envelope ({} growths) {} reallocations, peak {:.1} MB = {:.2}x; one request growing buffer by buffer {} reallocations, peak {:.2}x; exact allocation {} (outputs whose shape changed); the largest call alone needs {:.1} MB",
                m.growths,
                m.reallocations,
                m.peak_bytes as f64 / 1e6,
                m.peak_bytes as f64 / need,
                m.one_request.stats.reallocations,
                m.one_request.peak_bytes as f64 / need,
                m.exact_reallocations,
                need / 1e6
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Per-node kernel time of one iteration (`--profile BATCHxSEQ`).
mod profile {
    use super::super::kernels::timed_rounds;
    use dynrt::gpu::kernels::{Kernels, Operand, TensorRef, UniformArena, WeightLayout};
    use dynrt::gpu::{Buffer, BufferDesc, Engine, Frame};
    use dynrt::graph::{Graph, NodeId, Op};
    use dynrt::memory::AllocKind;
    use dynrt::shape::Shape;
    use dynrt::tensor::HostTensor;

    /// One node's time.
    #[derive(serde::Serialize)]
    pub struct Row {
        pub node: String,
        pub op: &'static str,
        pub shape: String,
        pub ms: f64,
        /// CPU milliseconds of the process's threads per dispatch (the software adapter's
        /// included); less sensitive than wall time to other processes.
        pub cpu_ms: Option<f64>,
    }

    /// Every dispatched node of `graph` at the shapes of `inputs`, each in a buffer of its
    /// own: the whole graph runs once (so every node reads real values), then each node is
    /// encoded `reps` times into one submit, the best of `rounds` submits counting (wall
    /// clock from the submit until the device is idle). Rows slowest first.
    pub fn nodes(
        engine: &Engine,
        graph: &Graph,
        inputs: &[(String, HostTensor)],
        reps: u32,
        rounds: u32,
    ) -> anyhow::Result<Vec<Row>> {
        let given: Vec<(&str, &Shape)> =
            inputs.iter().map(|(l, t)| (l.as_str(), &t.shape)).collect();
        let bindings = graph.bind(&given)?;
        let inferred = graph.infer_shapes(&bindings)?;
        let mut bufs: Vec<Buffer> = Vec::with_capacity(graph.len());
        for id in graph.ids() {
            let node = graph.node(id);
            let shape = &inferred.shapes[id.index()];
            let size = shape.size_bytes(node.dtype)?;
            let buf = engine.allocate(&BufferDesc {
                label: &node.label,
                size_bytes: size.div_ceil(4).max(1) * 4,
                kind: AllocKind::UsmDevice,
            })?;
            let bytes = match &node.op {
                Op::Constant(c) => Some(c.data.bytes().to_vec()),
                Op::Input(_) => inputs
                    .iter()
                    .find(|(l, _)| *l == node.label)
                    .map(|(_, t)| t.bytes.clone()),
                _ => match &inferred.values[id.index()] {
                    Some(v) => Some(dynrt::tensor::encode_i64(node.dtype, v)?),
                    None => None,
                },
            };
            if let Some(mut b) = bytes {
                b.resize(buf.size_bytes() as usize, 0);
                engine.write(&buf, 0, &b)?;
            }
            bufs.push(buf);
        }
        let operand = |id: NodeId| Operand {
            tensor: TensorRef {
                buffer: &bufs[id.index()],
                offset_bytes: 0,
                size_bytes: bufs[id.index()].size_bytes(),
            },
            shape: &inferred.shapes[id.index()],
            dtype: graph.node(id).dtype,
            strides: None,
            layout: WeightLayout::File,
        };
        let dispatched = |id: NodeId| {
            !matches!(graph.node(id).op, Op::Input(_) | Op::Constant(_))
                && !graph.is_shape_only(id)
                && inferred.values[id.index()].is_none()
        };
        let gpu = engine.gpu();
        let mut kernels = Kernels::new(gpu);
        let mut frame = Frame::begin(engine, &mut kernels, UniformArena::new(engine), "profile");
        for &id in graph.order() {
            if !dispatched(id) {
                continue;
            }
            let node = graph.node(id);
            let ins: Vec<Operand<'_>> = node.inputs.iter().map(|&i| operand(i)).collect();
            if let Err(e) = frame.encode(&node.op, &ins, &operand(id)) {
                frame.abandon();
                anyhow::bail!("node `{}`: {e}", node.label);
            }
        }
        let (submitted, _, _) = frame.submit();
        pollster::block_on(submitted.check()).map_err(anyhow::Error::msg)?;
        let mut uniforms = UniformArena::new(engine);
        let mut rows = Vec::new();
        for &id in graph.order() {
            if !dispatched(id) {
                continue;
            }
            let node = graph.node(id);
            let ins: Vec<Operand<'_>> = node.inputs.iter().map(|&i| operand(i)).collect();
            let out = operand(id);
            let t = timed_rounds(gpu, rounds, |enc| {
                uniforms.reset();
                {
                    let mut pass = enc.compute_pass("profile");
                    for _ in 0..reps {
                        kernels.encode(&mut pass, &mut uniforms, &node.op, &ins, &out)?;
                    }
                }
                uniforms.flush();
                Ok(())
            })?;
            rows.push(Row {
                node: node.label.clone(),
                op: node.op.name(),
                shape: inferred.shapes[id.index()].to_string(),
                ms: t.best_s * 1e3 / f64::from(reps.max(1)),
                cpu_ms: t.cpu_s.map(|c| c * 1e3 / f64::from(reps.max(1))),
            });
        }
        rows.sort_by(|a, b| b.ms.total_cmp(&a.ms));
        Ok(rows)
    }
}
