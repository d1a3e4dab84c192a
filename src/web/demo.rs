//! The decode demo of `dynrt demo` ([`WebDemo`]), driven one step at a time from JavaScript.

use wasm_bindgen::prelude::*;

use super::{js_error, MemoryPoint};

/// What the page asks for (JSON): `{"steps":N,"policy":"none|openvino|adaptive","seed":S}`;
/// everything else as `dynrt demo`'s defaults, so the same arguments give the same tokens.
#[derive(serde::Deserialize)]
struct DemoOptions {
    steps: u32,
    policy: String,
    seed: u64,
}

/// One chart point per step, sent to the page as JSON: the step's memory sample (step,
/// bytes per kind and per region, real allocations) with its token, error and time.
#[derive(serde::Serialize)]
struct StepPoint {
    token: u32,
    max_abs_err: Option<f32>,
    #[serde(flatten)]
    memory: MemoryPoint,
    millis: f64,
}

/// The decode demo of `dynrt demo`, driven one step at a time from JavaScript so the page
/// can redraw between steps ([`crate::demo::Demo`] underneath, the same loop as
/// the command line).
#[wasm_bindgen]
pub struct WebDemo {
    // Rc<RefCell>: each step's promise holds the demo across awaits, and wasm-bindgen's
    // async exports must own what they touch ('static futures).
    demo: std::rc::Rc<std::cell::RefCell<crate::demo::Demo>>,
}

#[wasm_bindgen]
impl WebDemo {
    /// Opens the WebGPU device and builds the demo from `options_json` (see [`DemoOptions`]).
    ///
    /// # Errors
    /// Rejects on malformed options, an unknown policy, no adapter, or a runtime error while
    /// compiling the network.
    pub async fn create(options_json: String) -> Result<WebDemo, JsError> {
        let opts: DemoOptions = serde_json::from_str(&options_json)
            .map_err(|e| JsError::new(&format!("demo options: {e}")))?;
        let policy: crate::memory::predictor::Policy = opts
            .policy
            .parse()
            .map_err(|e| JsError::new(&format!("policy: {e}")))?;
        let defaults = crate::demo::DemoConfig::default();
        let config = crate::demo::DemoConfig {
            model: crate::demo::decoder::DecoderConfig {
                // As `dynrt demo`: the position table is exactly as long as the run.
                max_positions: defaults.prompt_len.saturating_add(opts.steps),
                seed: opts.seed,
                ..defaults.model
            },
            steps: opts.steps,
            run: crate::runtime::RunOptions::new(policy),
            // As `dynrt demo`: check every step up to 128 steps, then every steps/16.
            check_every: if opts.steps <= 128 {
                1
            } else {
                (opts.steps / 16).max(1)
            },
            ..defaults
        };
        let gpu = crate::gpu::Gpu::new(crate::gpu::GpuOptions::default())
            .await
            .map_err(|e| JsError::new(&e.to_string()))?;
        let engine = crate::gpu::Engine::new(gpu);
        let demo =
            crate::demo::Demo::new(&engine, config).map_err(|e| JsError::new(&e.to_string()))?;
        Ok(WebDemo {
            demo: std::rc::Rc::new(std::cell::RefCell::new(demo)),
        })
    }

    /// Runs the next step; resolves to its [`StepPoint`] as JSON, or `undefined` when all
    /// steps have run.
    ///
    /// # Errors
    /// Rejects with the runtime's error, or when called again before the previous step
    /// resolved.
    // The borrow is held across the step's await on purpose: it is the lock that makes a
    // second `step()` before the first resolves an error (try_borrow_mut), never a panic.
    #[allow(clippy::await_holding_refcell_ref)]
    pub fn step(&self) -> js_sys::Promise {
        let demo = self.demo.clone();
        wasm_bindgen_futures::future_to_promise(async move {
            let mut demo = demo.try_borrow_mut().map_err(|_| {
                JsValue::from(JsError::new("a step is already running: await it first"))
            })?;
            if demo.done() {
                return Ok(JsValue::UNDEFINED);
            }
            let r = demo
                .step()
                .await
                .map_err(|e| JsValue::from(JsError::new(&e.to_string())))?;
            let memory = demo
                .trace()
                .samples
                .last()
                .map(MemoryPoint::from)
                .ok_or_else(|| js_error("the demo step left no memory sample"))?;
            let point = StepPoint {
                token: r.token,
                max_abs_err: r.max_abs_err,
                memory,
                millis: r.millis,
            };
            serde_json::to_string(&point)
                .map(|s| JsValue::from_str(&s))
                .map_err(|e| JsValue::from(JsError::new(&e.to_string())))
        })
    }

    /// The summary, as JSON with the fields of `dynrt demo --json`.
    ///
    /// # Errors
    /// Rejects while a step is running.
    pub fn finish(&self) -> Result<String, JsError> {
        let demo = self
            .demo
            .try_borrow()
            .map_err(|_| JsError::new("a step is still running: await it first"))?;
        serde_json::to_string(&demo.summary()).map_err(|e| JsError::new(&e.to_string()))
    }

    /// The largest |GPU - CPU reference| difference the page accepts, as the runtime's tests do.
    pub fn tolerance() -> f64 {
        DEMO_MAX_ABS_ERR
    }
}

/// Tolerance for the logits against the CPU reference (f32 on both sides; SwiftShader, lavapipe
/// and llvmpipe differ in summation order only).
const DEMO_MAX_ABS_ERR: f64 = 1e-3;
