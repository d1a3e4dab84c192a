//! dynrt: a WebGPU runtime for ML compute graphs whose shapes change while they run.
//!
//! dynrt runs compute graphs on `wgpu` natively (Vulkan, Metal, DX12, GL; Mesa lavapipe and
//! llvmpipe on machines without a GPU) and in the browser (wasm32 + WebGPU, feature `web`). Its
//! heart is memory management for dynamic shapes, such as a language model's KV cache that grows
//! by one row every decode step.
//!
//! # Key types
//!
//! * [`gpu::Gpu`] — adapter and device; [`gpu::Engine`] — every real allocation, by
//!   [`memory::AllocKind`] (`usm_device`, `usm_host`, `usm_shared`, `cl_mem`) and by device
//!   region, with bytes in use and peak, and a bounded `Allocate/Free` history
//!   (`DYNRT_VERBOSE=2`). A [`gpu::Buffer`] frees itself on drop. [`gpu::Frame`] records one
//!   submit's copies and dispatches: the runtime's one door to wgpu.
//! * [`memory::predictor::Sizer`] — the one sizing path (`realloc_if_needed`): the shape
//!   predictor (the openvino policy bit for bit, an adaptive one, or none) and the ledger of
//!   what it sized; `dynrt-bench predict` replays traces through the same code.
//! * [`memory::pool::MemoryPool`] — reuse of buffers between nodes that are never live together,
//!   from the memory dependencies of [`graph::deps`].
//! * [`memory::planner`] — static offsets for buffers of known lifetime in one arena;
//!   [`memory::regions`] — device regions and their allocators (the runtime places constants,
//!   placeholders and activations in them).
//! * [`graph::Graph`] / [`graph::GraphBuilder`] — the IR with symbolic dimensions; each op is a
//!   type implementing [`graph::OpDef`] (dtype rule, shape rule, CPU reference, host
//!   evaluation); [`graph::reference`] — the independent CPU reference; [`gpu::kernels`] — one
//!   WGSL kernel family per file.
//! * [`shape::DType`] (plain types and block-quantized formats) and [`tensor::ConstData`]
//!   (a constant's bytes, possibly a range of a memory-mapped file).
//! * [`runtime::Network`] (compiled once) and [`runtime::InferRequest`] (one per request): the
//!   per-iteration loop `update_shape → update_impl → realloc_if_needed → dispatch`, split into
//!   a device-free session and a thin GPU executor.
//! * [`gguf::Gguf`] — a validating GGUF parser over bytes (memory-mapped natively by
//!   [`gguf::MappedGguf`]), CPU [`gguf::dequantize`] and [`llm::ModelConfig`];
//!   [`tokenizer::Tokenizer`] — the model's byte-level BPE or SentencePiece, chat template
//!   and streaming decode; [`models`] — the models dynrt knows; `fetch` (native) — `dynrt
//!   fetch`, the model cache and `--model PATH`.
//! * [`llm::Model`] / [`llm::Session`] — a llama, qwen2 or gemma3 GGUF loaded once, sessions
//!   that each keep their own KV cache, greedy or sampled generation streamed as text.
//! * [`onnx::OnnxFile`] (a decoded, checked `.onnx` file) and [`onnx::import()`] (its graph, one
//!   converter per ONNX op type in [`onnx::import::CONVERTERS`]).
//! * [`sentence::SentenceModel`] — sentence embeddings: BERT from a sentence-transformers
//!   folder ([`safetensors::SafeTensors`] weights, [`tokenizer::WordPiece`]) or an ONNX
//!   encoder, batch and sequence both dynamic, sentences batched by length.
//! * `fileio` (native) — how every user-named file is read (regular files only, a stated
//!   bound per kind) and how outputs are written (a temporary file moved into place, never
//!   through a symbolic link).
//!
//! # Module map and adding an op
//!
//! docs/modules.md has the module map (what each module holds, which may touch wgpu: only
//! [`gpu`]), docs/adding.md the recipe for adding an op: the op's type in `src/graph/ops/`
//! (one line in the `registry!` list of [`graph::ops`]), its [`gpu::kernels::Kernel`] in its
//! family's file (one line in [`gpu::kernels::kernel_of`]), its WGSL and its test.
//! `UnaryOp::Sqrt`, a new variant of an existing family, touched three files.
//!
//! # Example
//!
//! Allocate a device buffer, upload through staging, read it back, and watch the accounting:
//!
//! ```
//! use dynrt::gpu::{BufferDesc, Engine, Gpu, GpuOptions};
//! use dynrt::memory::AllocKind;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let gpu = match Gpu::new_blocking(GpuOptions::from_env()?) {
//!     Ok(gpu) => gpu,
//!     // No adapter on this machine: `apt-get install mesa-vulkan-drivers` gives lavapipe.
//!     Err(e) => { eprintln!("{e}"); return Ok(()); }
//! };
//! let engine = Engine::new(gpu);
//! let data: Vec<f32> = (0..1024).map(|i| i as f32).collect();
//! let buffer = engine.allocate(&BufferDesc {
//!     label: "activations",
//!     size_bytes: 4096,
//!     kind: AllocKind::UsmDevice,
//! })?;
//! engine.write(&buffer, 0, bytemuck::cast_slice(&data))?;
//! let back = engine.read_blocking(&buffer, 0, 4096)?;
//! assert_eq!(bytemuck::cast_slice::<u8, f32>(&back), &data[..]);
//! assert_eq!(engine.stats().current_bytes(AllocKind::UsmDevice), 4096);
//! drop(buffer);
//! assert_eq!(engine.stats().current_bytes(AllocKind::UsmDevice), 0);
//! # Ok(())
//! # }
//! ```
//!
//! The decode loop through [`runtime`] is in `examples/decode_loop.rs`; the command-line tool
//! (`dynrt demo`, `info`, `predict`, `plan`, `bench`) is described in docs/cli.md.
#![warn(missing_docs)]
// On wasm32 wgpu's handles are neither Send nor Sync (one JS thread), so the Arcs that share
// them natively (Engine, Gpu, Network) trip this lint there; the single-threaded target is why.
#![cfg_attr(target_arch = "wasm32", allow(clippy::arc_with_non_send_sync))]

pub mod demo;
#[cfg(not(target_arch = "wasm32"))]
pub mod fetch;
#[cfg(not(target_arch = "wasm32"))]
pub mod fileio;
pub mod formats;
pub mod gguf;
pub mod gpu;
pub mod graph;
pub mod llm;
pub mod memory;
pub mod models;
pub mod npy;
pub mod onnx;
pub mod rng;
pub mod runtime;
pub mod safetensors;
pub mod sentence;
pub mod shape;
pub mod structured;
pub mod tensor;
pub mod tokenizer;
#[cfg(all(target_arch = "wasm32", feature = "web"))]
pub mod web;

/// The documentation's links hold: every relative link in README.md and docs/**/*.md names a
/// file that exists (and a heading of it, when the link has an anchor), and every `docs/...`
/// path a comment cites exists. Moving or renaming a document fails here, not in a reader.
#[cfg(all(test, not(target_arch = "wasm32")))]
mod doc_links {
    use std::path::{Path, PathBuf};

    fn root() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
    }

    /// Files under `dir` (recursively) whose name ends with one of `exts`, skipping build
    /// outputs and installed packages.
    fn walk(dir: &Path, exts: &[&str], out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                if !matches!(name.as_str(), "target" | "node_modules" | "pkg" | ".git") {
                    walk(&path, exts, out);
                }
            } else if exts.iter().any(|e| name.ends_with(e)) {
                out.push(path);
            }
        }
    }

    /// GitHub's anchor of a heading: lower case, spaces to `-`, punctuation dropped.
    fn slug(heading: &str) -> String {
        heading
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect()
    }

    fn anchors(markdown: &str) -> Vec<String> {
        prose_lines(markdown)
            .filter_map(|l| l.strip_prefix('#'))
            .map(|l| slug(l.trim_start_matches('#')))
            .collect()
    }

    /// The lines outside fenced code blocks.
    fn prose_lines(markdown: &str) -> impl Iterator<Item = &str> {
        let mut in_code = false;
        markdown.lines().filter(move |l| {
            if l.trim_start().starts_with("```") {
                in_code = !in_code;
                return false;
            }
            !in_code
        })
    }

    /// The targets of the `[text](target)` links of a Markdown text, inline code removed.
    fn link_targets(markdown: &str) -> Vec<String> {
        let mut targets = Vec::new();
        for line in prose_lines(markdown) {
            let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
            let mut rest = prose.as_str();
            while let Some(i) = rest.find("](") {
                rest = &rest[i + 2..];
                let end = rest.find(')').unwrap_or(rest.len());
                targets.push(rest[..end].trim().to_string());
                rest = &rest[end..];
            }
        }
        targets
    }

    /// The broken relative links of one Markdown file, as `file: target (why)`.
    fn broken_links(file: &Path) -> Vec<String> {
        let text = std::fs::read_to_string(file).unwrap();
        let mut broken = Vec::new();
        for target in link_targets(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let resolved = if path.is_empty() {
                file.to_path_buf()
            } else {
                file.parent().unwrap().join(path)
            };
            let why = if !resolved.exists() {
                Some("no such file")
            } else if let Some(anchor) = anchor {
                let body = std::fs::read_to_string(&resolved).unwrap_or_default();
                (!anchors(&body).iter().any(|a| a == anchor)).then_some("no such heading")
            } else {
                None
            };
            if let Some(why) = why {
                broken.push(format!("{}: {target} ({why})", file.display()));
            }
        }
        broken
    }

    /// The `docs/...` paths cited in a source file.
    fn cited_docs(text: &str) -> Vec<String> {
        let mut cited = Vec::new();
        let mut from = 0;
        while let Some(i) = text[from..].find("docs/") {
            let start = from + i;
            from = start + 5;
            let before = text[..start].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || matches!(c, '/' | '.' | '_' | '-')) {
                continue;
            }
            let path: String = text[start..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || matches!(c, '/' | '.' | '_' | '-'))
                .collect();
            cited.push(path.trim_end_matches('.').to_string());
        }
        cited
    }

    #[test]
    fn every_relative_link_in_the_docs_resolves() {
        let root = root();
        let mut files = vec![root.join("README.md")];
        walk(&root.join("docs"), &[".md"], &mut files);
        assert!(
            files.len() >= 10,
            "found only {} Markdown files",
            files.len()
        );
        let links: usize = files
            .iter()
            .map(|f| link_targets(&std::fs::read_to_string(f).unwrap()).len())
            .sum();
        assert!(
            links >= 50,
            "found only {links} links: is the parser still reading them?"
        );
        let broken: Vec<String> = files.iter().flat_map(|f| broken_links(f)).collect();
        assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    }

    #[test]
    fn every_docs_path_cited_in_the_code_exists() {
        let root = root();
        let mut files = Vec::new();
        for dir in [
            "src", "tests", "examples", "scripts", "shaders", "web", ".ci",
        ] {
            walk(
                &root.join(dir),
                &[".rs", ".wgsl", ".sh", ".py", ".js", ".mjs", ".html", "run"],
                &mut files,
            );
        }
        files.push(root.join("Cargo.toml"));
        let mut cited = 0;
        let mut missing = Vec::new();
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap_or_default();
            for path in cited_docs(&text) {
                cited += 1;
                if !root.join(&path).exists() {
                    missing.push(format!("{}: {path}", file.display()));
                }
            }
        }
        assert!(
            cited >= 30,
            "found only {cited} docs/ citations in {} files",
            files.len()
        );
        assert!(
            missing.is_empty(),
            "cited but missing:\n{}",
            missing.join("\n")
        );
    }

    #[test]
    fn the_link_parser_reads_links_anchors_and_citations() {
        let md = "# A `b` c\n[x](docs/cli.md#a-b-c) `[no](code)` [y](#z)\n```\n[no](block)\n```\n";
        assert_eq!(link_targets(md), ["docs/cli.md#a-b-c", "#z"]);
        assert_eq!(anchors(md), ["a-b-c"]);
        assert_eq!(
            cited_docs("see docs/cli.md. and https://docs.rs/x"),
            ["docs/cli.md"]
        );
    }
}
