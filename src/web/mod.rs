//! Browser entry points (wasm32 + WebGPU), exported to JavaScript with `wasm-bindgen`.
//!
//! Built only for `cfg(all(target_arch = "wasm32", feature = "web"))`; `web/build.sh` turns
//! the `.wasm` into the ES module `web/pkg/dynrt.js` that `web/main.js` imports.
//! Everything here is `async` because WebGPU in the browser is: the page's event loop must
//! keep running while the GPU works, so nothing may block (docs/browser.md).
//!
//! Files: this one (logging, panics, the version, what the pages share), `adapter`
//! ([`adapter_info`] and its self-check), `demo` ([`WebDemo`]), `model` (the language model:
//! [`ModelDownload`], [`WebModel`]), `onnx` ([`WebOnnxSession`]), `sentence`
//! ([`WebEmbedder`]: sentence embeddings).

mod adapter;
mod demo;
mod model;
mod onnx;
mod sentence;

pub use adapter::adapter_info;
pub use demo::WebDemo;
pub use model::{ModelDownload, WebModel};
pub use onnx::WebOnnxSession;
pub use sentence::WebEmbedder;

use wasm_bindgen::prelude::*;

/// Sends `log` records to the browser console (`console.debug/info/warn/error`).
struct ConsoleLogger;

impl log::Log for ConsoleLogger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let line = JsValue::from_str(&format!("[{}] {}", record.target(), record.args()));
        match record.level() {
            log::Level::Error => web_sys::console::error_1(&line),
            log::Level::Warn => web_sys::console::warn_1(&line),
            log::Level::Info => web_sys::console::info_1(&line),
            log::Level::Debug | log::Level::Trace => web_sys::console::debug_1(&line),
        }
    }

    fn flush(&self) {}
}

static CONSOLE_LOGGER: ConsoleLogger = ConsoleLogger;

/// Runs once when the module is instantiated: routes `log` to the console and panics to
/// `console.error` (the default wasm panic message is only "unreachable executed").
#[wasm_bindgen(start)]
pub fn start() {
    // A second instantiation (page reload in the same worker) finds the logger set: harmless.
    if log::set_logger(&CONSOLE_LOGGER).is_ok() {
        log::set_max_level(log::LevelFilter::Info);
    }
    std::panic::set_hook(Box::new(|info| {
        web_sys::console::error_1(&JsValue::from_str(&format!("dynrt panicked: {info}")));
    }));
}

/// The crate version, so the page can show which build it runs.
#[wasm_bindgen]
pub fn version() -> String {
    env!("CARGO_PKG_VERSION").to_string()
}

/// The models dynrt knows ([`crate::models::MODELS`]) as a JSON array of `{name, file,
/// bytes, architecture, summary, license, default}`: the page offers them, downloading
/// `models/FILE` from the server that serves the `dynrt fetch` cache.
#[wasm_bindgen]
pub fn models() -> String {
    let rows: Vec<serde_json::Value> = crate::models::MODELS
        .iter()
        .map(|m| {
            serde_json::json!({
                "name": m.name,
                "file": m.file_name,
                "bytes": m.size_bytes,
                "architecture": m.architecture,
                "summary": m.summary,
                "license": m.license,
                "default": std::ptr::eq(*m, crate::models::DEFAULT_MODEL),
            })
        })
        .collect();
    serde_json::Value::Array(rows).to_string()
}

/// Bytes per kind and per region after one forward pass, and its real allocations.
#[derive(serde::Serialize)]
struct MemoryPoint {
    step: u32,
    bytes_in_use: std::collections::BTreeMap<&'static str, u64>,
    region_bytes: std::collections::BTreeMap<&'static str, u64>,
    reallocations: u32,
}

impl From<&crate::runtime::report::TraceSample> for MemoryPoint {
    fn from(s: &crate::runtime::report::TraceSample) -> Self {
        MemoryPoint {
            step: s.step,
            bytes_in_use: crate::memory::AllocKind::ALL
                .into_iter()
                .map(|k| (k.name(), s.bytes_in_use[k.index()]))
                .collect(),
            region_bytes: REGION_NAMES.into_iter().zip(s.region_bytes).collect(),
            reallocations: s.reallocations,
        }
    }
}

/// Names of [`crate::runtime::report::BytesPerRegion`]'s entries, in its order.
const REGION_NAMES: [&str; 3] = ["constants", "placeholders", "internal"];

/// A JavaScript `Error` with `message`, for a promise to reject with.
fn js_error(message: &str) -> JsValue {
    JsValue::from(JsError::new(message))
}
