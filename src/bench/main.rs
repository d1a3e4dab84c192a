//! The `dynrt-bench` command: the benchmarks and probes, apart from the user's `dynrt`
//! (docs/cli.md, "dynrt-bench"). One file per subcommand; what it shares with `dynrt`
//! (the run of a command and its exit code, opening models) is src/cli/shared/, included
//! here as [`shared`].

use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod batch;
mod decode;
mod embed;
mod generate;
mod kernels;
mod linear;
mod onnx;
mod plan;
mod predict;
#[path = "../cli/shared/mod.rs"]
mod shared;

/// dynrt-bench: dynrt's benchmarks (kernels, the decode loop, models, batches, ONNX,
/// embeddings) and the replay tools of its memory planning (shape traces, static plans).
#[derive(Parser)]
#[command(name = "dynrt-bench", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Elementwise bandwidth against a buffer copy, and matmul GFLOP/s.
    Kernels(kernels::Args),
    /// All preallocation policies side by side on the decode demo.
    Decode(decode::Args),
    /// An ONNX model step by step (ops, or greedy decoding with carried caches): the dynrt
    /// side of scripts/bench_peer.sh.
    Onnx(onnx::Args),
    /// SmolLM2: prefill tokens/s, decode ms/token by context and policy, memory, kernels.
    Generate(generate::Args),
    /// Decode tokens/s of many sequences in one batched pass over a paged KV cache, against
    /// one session alone.
    Batch(batch::Args),
    /// Sentences/s of a sentence model at batch sizes 1, 8 and 64, or (`--trace`) its
    /// reallocations and peak memory over calls of random [batch, seq] per policy.
    Embed(embed::Args),
    /// Replay a shape trace through a preallocation policy.
    Predict(predict::Args),
    /// Plan static buffer offsets for a MiniMalloc-format CSV.
    Plan(plan::Args),
}

fn main() -> ExitCode {
    shared::main(
        |_: &Cli| "warn",
        |cli| match cli.command {
            Command::Kernels(a) => kernels::run(a),
            Command::Decode(a) => decode::run(a),
            Command::Onnx(a) => onnx::run(a),
            Command::Generate(a) => generate::run(a),
            Command::Batch(a) => batch::run(a),
            Command::Embed(a) => embed::run(a),
            Command::Predict(a) => predict::run(a),
            Command::Plan(a) => plan::run(a),
        },
    )
}
