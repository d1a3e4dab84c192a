//! The decode demo's loop, shared by `dynrt demo` and `dynrt-bench decode`.

use dynrt::demo::{Demo, DemoConfig};
use dynrt::gpu::Engine;
use dynrt::runtime::report::human_bytes;
use std::io::{IsTerminal, Write};

/// Runs a demo to the end; draws a progress bar on stderr (when it is a terminal) for runs of
/// more than 64 steps.
pub fn run_demo(engine: &Engine, config: DemoConfig) -> anyhow::Result<Demo> {
    let mut demo = Demo::new(engine, config)?;
    let bar = config.steps > 64 && std::io::stderr().is_terminal();
    while !demo.done() {
        let r = demo.step_blocking()?;
        if bar && (r.step % 8 == 0 || demo.done()) {
            let done = demo.tokens().len() as u32;
            let width = 40u32;
            let filled = (done as u64 * width as u64 / config.steps.max(1) as u64) as usize;
            eprint!(
                "\r[{}{}] {done}/{} tokens, {} in use",
                "#".repeat(filled),
                " ".repeat(width as usize - filled),
                config.steps,
                human_bytes(r.bytes_in_use.iter().sum())
            );
            let _ = std::io::stderr().flush();
        }
    }
    if bar {
        eprintln!();
    }
    Ok(demo)
}
