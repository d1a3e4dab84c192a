//! What the two command-line binaries share: `dynrt` (src/main.rs, src/cli/: the user's
//! commands) and `dynrt-bench` (src/bench/: the benchmarks and probes) both include this
//! module: the run of a command and its exit code, opening a GGUF model or a sentence model
//! as their `--model` options say, the decode demo's loop, the engine on the environment's
//! adapter.

use anyhow::Context;
use dynrt::gpu::{Engine, Gpu, GpuOptions};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

pub mod demo;
pub mod model;
pub mod sentence;

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

/// Runs a command-line binary: quiets the display probes, parses `C`, starts the logger
/// with the level `default_filter` gives for the command (unless `RUST_LOG` says otherwise),
/// runs the command with `run`, and turns an error into exit code 1 (3 when the GPU device
/// was lost) with its chain printed on stderr.
pub fn main<C: clap::Parser>(
    default_filter: impl FnOnce(&C) -> &'static str,
    run: impl FnOnce(C) -> anyhow::Result<ExitCode>,
) -> ExitCode {
    quiet_display_probes();
    let cli = C::parse();
    env_logger::Builder::from_env(
        env_logger::Env::default().default_filter_or(default_filter(&cli)),
    )
    .init();
    match run(cli) {
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

/// The file an output is written to: its name with path separators replaced.
pub fn npy_path(dir: &Path, name: &str) -> PathBuf {
    let safe: String = name
        .chars()
        .map(|c| {
            if matches!(c, '/' | '\\' | '\0') {
                '_'
            } else {
                c
            }
        })
        .collect();
    dir.join(format!("{safe}.npy"))
}

/// The engine on the adapter the environment selects.
pub fn engine() -> anyhow::Result<Engine> {
    let gpu = Gpu::new_blocking(GpuOptions::from_env()?).context("no adapter")?;
    Ok(Engine::new(gpu))
}

/// `dynrt <version> <backend> <adapter>`.
pub fn provider(engine: &Engine) -> String {
    let info = engine.gpu().adapter_info();
    format!(
        "dynrt {} {} {}",
        env!("CARGO_PKG_VERSION"),
        format!("{:?}", info.backend).to_lowercase(),
        info.name
    )
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
