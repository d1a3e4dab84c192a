//! `dynrt inspect MODEL.gguf [--json]`: what a GGUF holds and whether dynrt can run it,
//! before anything is loaded: the architecture, tensors per type with their bytes, the
//! configuration the metadata gives, the tokenizer, what is unsupported, and the limits that are choices
//! of this device (the longest context it holds; tables larger than one binding run in pieces).
//! The file is mapped, not read; nothing goes to the device.

use anyhow::Context;
use dynrt::gguf::MappedGguf;
use dynrt::gpu::{Gpu, GpuOptions};
use dynrt::graph::ops::rope_table_rows;
use dynrt::llm::ModelConfig;
use dynrt::llm::{context_on_device, weight_dtype};
use dynrt::runtime::report::human_bytes;
use dynrt::tokenizer::{Tokenizer, TokenizerModel};
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Default, serde::Serialize)]
struct TypeRow {
    tensors: u64,
    bytes: u64,
    supported: bool,
}

/// Prints the report of the GGUF at `path`.
pub fn run(path: &Path, json: bool) -> anyhow::Result<()> {
    let mapped = MappedGguf::open(path).with_context(|| format!("loading {}", path.display()))?;
    let gguf = mapped.gguf();
    let mut types: BTreeMap<&'static str, TypeRow> = BTreeMap::new();
    let mut largest = (String::new(), 0u64);
    for t in gguf.tensors() {
        let row = types.entry(t.ggml_type().name()).or_default();
        row.tensors += 1;
        row.bytes += t.size_bytes();
        row.supported = weight_dtype(t.ggml_type()).is_some();
        if t.size_bytes() > largest.1 {
            largest = (t.name().to_owned(), t.size_bytes());
        }
    }
    let tensor_bytes: u64 = gguf.tensors().iter().map(|t| t.size_bytes()).sum();
    let architecture = gguf.opt_str("general.architecture").ok().flatten();
    let config = ModelConfig::from_gguf(gguf);
    let mut problems: Vec<String> = Vec::new();
    if let Err(e) = &config {
        problems.push(e.to_string());
    }
    let tokenizer = Tokenizer::from_gguf(gguf);
    if let Err(e) = &tokenizer {
        problems.push(format!("tokenizer: {e}"));
    }
    let tok = tokenizer.as_ref().ok();
    let tok_kind = |t: &Tokenizer| match t.model() {
        TokenizerModel::SentencePiece => "SentencePiece (llama)",
        _ => "byte-level BPE (gpt2)",
    };
    let unsupported: Vec<&str> = types
        .iter()
        .filter(|(_, r)| !r.supported)
        .map(|(name, _)| *name)
        .collect();
    if !unsupported.is_empty() {
        problems.push(format!(
            "tensor types dynrt does not hold: {} (it holds {})",
            unsupported.join(", "),
            dynrt::formats::ggml_names()
        ));
    }
    // The device's limits, where there is an adapter (inspect works without one).
    let device = GpuOptions::from_env()
        .ok()
        .and_then(|o| Gpu::new_blocking(o).ok())
        .map(|gpu| {
            let l = gpu.limits();
            (
                gpu.adapter_info().name.clone(),
                l.max_storage_buffer_binding_size.min(l.max_buffer_size),
            )
        });
    let cfg = config.as_ref().ok();
    let context_here = match (cfg, &device) {
        (Some(c), Some((_, b))) => Some(context_on_device(c, *b)),
        _ => None,
    };
    let kv_bytes_per_token = cfg.map(|c| 2 * u64::from(c.num_layers) * u64::from(c.kv_len()) * 4);
    let rope_bytes = |context: u32, c: &ModelConfig| {
        u64::from(rope_table_rows(context)) * u64::from(c.rope_dim) * 4
    };
    if json {
        let doc = serde_json::json!({
            "file": path.display().to_string(),
            "gguf_version": gguf.version(),
            "file_bytes": gguf.file_bytes(),
            "architecture": architecture,
            "tensors": gguf.tensors().len(),
            "tensor_bytes": tensor_bytes,
            "types": types,
            "largest_tensor": { "name": largest.0, "bytes": largest.1 },
            "config": cfg.map(|c| serde_json::json!({
                "layers": c.num_layers,
                "embedding": c.embedding_len,
                "heads": c.num_heads,
                "kv_heads": c.num_kv_heads,
                "head_dim": c.head_dim,
                "ffn": c.ffn_len,
                "vocab": c.vocab_size,
                "context": c.context_len,
                "tied_output": c.tied_output,
                "sliding_window": c.sliding_window,
                "sliding_window_layers": c.local_layers().count(),
            })),
            "tokenizer": tok.map(|t| serde_json::json!({
                "kind": tok_kind(t),
                "tokens": t.vocab_size(),
                "bos": t.bos_id(),
                "eos": t.eos_id(),
                "add_bos": t.add_bos(),
                "chat_template": t.chat_template().is_some(),
            })),
            "kv_bytes_per_token": kv_bytes_per_token,
            "device": device.as_ref().map(|(name, b)| serde_json::json!({
                "adapter": name,
                "max_binding_bytes": b,
                "context": context_here,
                "rope_table_bytes": cfg.zip(context_here).map(|(c, n)| rope_bytes(n, c)),
            })),
            "loads": problems.is_empty(),
            "problems": problems,
        });
        println!("{doc}");
        return Ok(());
    }
    println!("{}", path.display());
    println!(
        "  GGUF v{}, {} bytes, {} tensors ({}), architecture {}",
        gguf.version(),
        gguf.file_bytes(),
        gguf.tensors().len(),
        human_bytes(tensor_bytes),
        architecture.unwrap_or("(none)")
    );
    for (name, r) in &types {
        println!(
            "  {name:>6}: {:>4} tensors, {:>10}{}",
            r.tensors,
            human_bytes(r.bytes),
            if r.supported { "" } else { "  (unsupported)" }
        );
    }
    println!(
        "  largest tensor: {} ({})",
        largest.0,
        human_bytes(largest.1)
    );
    if let Some(c) = cfg {
        println!(
            "  {} layers, width {}, {} heads / {} KV heads of {}, FFN {}, vocabulary {}, {} head",
            c.num_layers,
            c.embedding_len,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
            c.ffn_len,
            c.vocab_size,
            if c.tied_output { "tied" } else { "separate" }
        );
        println!(
            "  context {} tokens (metadata); KV cache {} per token",
            c.context_len,
            human_bytes(2 * u64::from(c.num_layers) * u64::from(c.kv_len()) * 4)
        );
        let local = c.local_layers().count();
        if local > 0 {
            println!(
                "  sliding window of {} tokens on {local} of {} layers (RoPE base {}; global \
                 layers {}): their caches stay within about twice the window",
                c.sliding_window, c.num_layers, c.rope_base_swa, c.rope_base
            );
        }
    }
    if let Some(t) = tok {
        let id = |i: Option<u32>| i.map_or("none".to_owned(), |i| i.to_string());
        println!(
            "  tokenizer: {}, {} tokens, BOS {}{}, EOS {}, {}",
            tok_kind(t),
            t.vocab_size(),
            id(t.bos_id()),
            if t.add_bos() { " (added)" } else { "" },
            id(t.eos_id()),
            if t.chat_template().is_some() {
                "chat template"
            } else {
                "no chat template"
            }
        );
    }
    match (&device, context_here, cfg) {
        (Some((name, b)), Some(n), Some(c)) => println!(
            "  on {name}: context up to {n} tokens (one layer's keys within the {} binding), \
             RoPE table {}",
            human_bytes(*b),
            human_bytes(rope_bytes(n, c))
        ),
        (Some((name, b)), _, _) => println!("  on {name}: largest binding {}", human_bytes(*b)),
        (None, _, _) => println!("  no adapter: the device's limits were not checked"),
    }
    if problems.is_empty() {
        println!("  loads: yes");
    } else {
        for p in &problems {
            println!("  cannot load: {p}");
        }
    }
    Ok(())
}
