//! `dynrt bench kernels|decode|onnx|generate|batch|embed`.

use std::process::ExitCode;

/// Arguments of `dynrt bench`.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
enum What {
    /// Elementwise bandwidth against a buffer copy, and matmul GFLOP/s.
    Kernels(super::bench_kernels::Args),
    /// All preallocation policies side by side on the decode demo.
    Decode(super::bench_decode::Args),
    /// An ONNX model step by step (ops, or greedy decoding with carried caches): the dynrt
    /// side of scripts/bench_peer.sh.
    Onnx(super::bench_onnx::Args),
    /// SmolLM2: prefill tokens/s, decode ms/token by context and policy, memory, kernels.
    Generate(super::bench_generate::Args),
    /// Decode tokens/s of many sequences in one batched pass over a paged KV cache, against
    /// one session alone.
    Batch(super::bench_batch::Args),
    /// Sentences/s of a sentence model at batch sizes 1, 8 and 64, or (`--trace`) its
    /// reallocations and peak memory over calls of random [batch, seq] per policy.
    Embed(super::bench_embed::Args),
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    match args.what {
        What::Kernels(a) => super::bench_kernels::run(a),
        What::Decode(a) => super::bench_decode::run(a),
        What::Onnx(a) => super::bench_onnx::run(a),
        What::Generate(a) => super::bench_generate::run(a),
        What::Batch(a) => super::bench_batch::run(a),
        What::Embed(a) => super::bench_embed::run(a),
    }
}
