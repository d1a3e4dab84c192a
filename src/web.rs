//! Browser entry points (wasm32 + WebGPU), exported to JavaScript with `wasm-bindgen`.
//!
//! Built only for `cfg(all(target_arch = "wasm32", feature = "web"))`; `web/build.sh` turns
//! the `.wasm` into the ES module `web/pkg/dynrt.js` that `web/main.js` imports.
//! Everything here is `async` because WebGPU in the browser is: the page's event loop must
//! keep running while the GPU works, so nothing may block (docs/browser.md).

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

/// Elements per self-check buffer: 4096 f32 = 16 KiB, more than one 64-wide workgroup row.
const SELF_CHECK_ELEMENTS: u32 = 4096;

/// What [`adapter_info`] returns (serialised to JSON for the page).
#[derive(serde::Serialize)]
struct AdapterReport {
    name: String,
    backend: String,
    device_type: String,
    driver: String,
    driver_info: String,
    max_buffer_size: u64,
    max_storage_buffer_binding_size: u64,
    supports_usm_shared: bool,
    self_check: SelfCheck,
}

/// One real round trip per allocation kind through the [`crate::gpu::Engine`].
#[derive(serde::Serialize)]
struct SelfCheck {
    passed: bool,
    detail: String,
    kinds: Vec<KindCheck>,
}

#[derive(serde::Serialize)]
struct KindCheck {
    kind: &'static str,
    /// How the data got there: `fill_affine` kernel or a host mapping.
    path: &'static str,
    size_bytes: u64,
    /// Bytes of this kind in use while the buffer was alive, from the engine's accounting.
    bytes_in_use: u64,
    mismatches: u32,
}

/// Opens a WebGPU device through [`crate::gpu::Gpu::new`] and runs a self-check: for every
/// allocation kind the device supports, allocates a 16 KiB buffer through the engine, fills
/// it (with the `fill_affine` kernel where the kind is bindable, by mapping where it is
/// host-only), reads it back and compares; then checks that freeing returned every byte.
/// Resolves to a JSON string: adapter name, backend, device type, limits, and `self_check`
/// (`passed`, `detail`, per-kind results).
///
/// # Errors
/// Rejects with the message of [`crate::gpu::GpuError`] when no adapter or device can be had,
/// or of [`crate::gpu::AllocError`] when an allocation or readback fails.
#[wasm_bindgen]
pub async fn adapter_info() -> Result<String, JsError> {
    let gpu = crate::gpu::Gpu::new(crate::gpu::GpuOptions::default())
        .await
        .map_err(|e| JsError::new(&e.to_string()))?;
    let info = gpu.adapter_info().clone();
    let limits = gpu.limits().clone();
    let supports_usm_shared = gpu.supports_shared();
    let engine = crate::gpu::Engine::new(gpu);
    let self_check = self_check(&engine)
        .await
        .map_err(|e| JsError::new(&e.to_string()))?;
    let report = AdapterReport {
        name: info.name,
        backend: format!("{:?}", info.backend),
        device_type: format!("{:?}", info.device_type),
        driver: info.driver,
        driver_info: info.driver_info,
        max_buffer_size: limits.max_buffer_size,
        max_storage_buffer_binding_size: limits.max_storage_buffer_binding_size,
        supports_usm_shared,
        self_check,
    };
    serde_json::to_string(&report).map_err(|e| JsError::new(&e.to_string()))
}

async fn self_check(engine: &crate::gpu::Engine) -> Result<SelfCheck, crate::gpu::AllocError> {
    use crate::memory::AllocKind;
    let fill = crate::gpu::FillPipeline::new(engine.gpu())
        .map_err(|e| crate::gpu::AllocError::Validation(e.to_string()))?;
    let n = SELF_CHECK_ELEMENTS;
    let size_bytes = u64::from(n) * 4;
    let mut kinds = Vec::new();
    for (i, kind) in AllocKind::ALL.into_iter().enumerate() {
        if !engine.gpu().supports_kind(kind) {
            continue;
        }
        // A different ramp per kind, so a buffer mix-up would show as mismatches.
        let (scale, bias) = (0.5 + i as f32, -3.0 * i as f32);
        let buf = engine
            .allocate_async(&crate::gpu::BufferDesc {
                label: "dynrt web self-check",
                size_bytes,
                kind,
            })
            .await?;
        let path = if kind.bindable() {
            fill.dispatch(engine, &buf, n, scale, bias)?;
            "fill_affine kernel"
        } else {
            let data: Vec<u8> = (0..n)
                .flat_map(|j| (scale * j as f32 + bias).to_le_bytes())
                .collect();
            engine.write_mapped(&buf, 0, &data).await?;
            "mapped write"
        };
        let bytes_in_use = engine.stats().current_bytes(kind);
        let bytes = engine.read(&buf, 0, size_bytes).await?;
        let mismatches = bytes
            .chunks_exact(4)
            .enumerate()
            .filter(|(j, c)| {
                let got = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                got != scale * *j as f32 + bias
            })
            .count() as u32;
        drop(buf);
        kinds.push(KindCheck {
            kind: kind.name(),
            path,
            size_bytes,
            bytes_in_use,
            mismatches,
        });
    }
    let leaked_bytes = engine.stats().total_current_bytes();
    let bad: Vec<String> = kinds
        .iter()
        .filter(|k| k.mismatches > 0 || k.bytes_in_use < k.size_bytes)
        .map(|k| format!("{}: {} wrong values", k.kind, k.mismatches))
        .collect();
    let passed = !kinds.is_empty() && bad.is_empty() && leaked_bytes == 0;
    let detail = if passed {
        format!(
            "wrote and read back {} KiB per kind: {}; all bytes freed",
            size_bytes / 1024,
            kinds
                .iter()
                .map(|k| format!("{} by {}", k.kind, k.path))
                .collect::<Vec<_>>()
                .join(", ")
        )
    } else if kinds.is_empty() {
        "no allocation kind is supported on this device".to_string()
    } else {
        format!(
            "{}; {} bytes still in use after freeing",
            if bad.is_empty() {
                "values correct".to_string()
            } else {
                bad.join(", ")
            },
            leaked_bytes
        )
    };
    log::info!("self-check: {detail}");
    Ok(SelfCheck {
        passed,
        detail,
        kinds,
    })
}

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

// ---------------------------------------------------------------------------------------
// The language model: download into wasm memory, load, generate with live events.

/// The bytes of a GGUF file as the page downloads it: each chunk of the streamed response
/// is copied straight into wasm memory, so the page never holds the whole file in
/// JavaScript as well. [`ModelDownload::load`] then parses and loads it.
#[wasm_bindgen]
pub struct ModelDownload {
    bytes: Vec<u8>,
    /// The `Content-Length` announced, when there was one.
    expected: Option<usize>,
}

#[wasm_bindgen]
impl ModelDownload {
    /// Starts a download of `total_bytes` (the response's `Content-Length`; 0 when the
    /// server sent none), reserving them at once so chunks are never moved again.
    ///
    /// # Errors
    /// Rejects when wasm memory cannot hold `total_bytes` (a 32-bit module addresses 4 GiB).
    #[wasm_bindgen(constructor)]
    pub fn new(total_bytes: f64) -> Result<ModelDownload, JsError> {
        let expected = (total_bytes.is_finite() && total_bytes >= 1.0)
            .then(|| usize::try_from(total_bytes as u64).ok())
            .flatten();
        let mut bytes = Vec::new();
        if let Some(n) = expected {
            bytes.try_reserve_exact(n).map_err(|_| {
                JsError::new(&format!(
                    "the model's {n} bytes do not fit in this page's WebAssembly memory"
                ))
            })?;
        }
        Ok(ModelDownload { bytes, expected })
    }

    /// Appends the next chunk of the response.
    ///
    /// # Errors
    /// Rejects when the server sends more than it announced, or memory runs out.
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), JsError> {
        let total = self.bytes.len().saturating_add(chunk.len());
        if let Some(n) = self.expected.filter(|&n| total > n) {
            return Err(JsError::new(&format!(
                "the server sent more than the {n} bytes it announced"
            )));
        }
        self.bytes
            .try_reserve(chunk.len())
            .map_err(|_| JsError::new("out of WebAssembly memory while downloading the model"))?;
        self.bytes.extend_from_slice(chunk);
        Ok(())
    }

    /// Bytes received so far.
    pub fn received_bytes(&self) -> f64 {
        self.bytes.len() as f64
    }

    /// Opens a WebGPU device and loads the downloaded file as a model
    /// ([`crate::llm::Model::from_backing`]): parses and validates the GGUF, reads the
    /// configuration and tokenizer from its metadata, and uploads the weights, still in
    /// their block formats, into the constants region. Consumes the download (the model
    /// keeps the bytes: its constants reference them).
    ///
    /// # Errors
    /// Rejects when the download is incomplete, with the adapter error when no device can
    /// be had, with "too small" when the adapter's limits cannot hold a weight in one
    /// buffer binding, and with [`crate::llm::LlmError`]'s message otherwise (a malformed
    /// file names the key, tensor or offset).
    pub async fn load(self) -> Result<WebModel, JsError> {
        if let Some(n) = self.expected.filter(|&n| self.bytes.len() != n) {
            return Err(JsError::new(&format!(
                "the download stopped after {} of {n} bytes",
                self.bytes.len()
            )));
        }
        let file_bytes = self.bytes.len() as u64;
        let gpu = crate::gpu::Gpu::new(crate::gpu::GpuOptions::default())
            .await
            .map_err(|e| JsError::new(&e.to_string()))?;
        let engine = crate::gpu::Engine::new(gpu);
        let t = web_time::Instant::now();
        let backing: crate::tensor::Backing = std::sync::Arc::new(self.bytes);
        let model =
            crate::llm::Model::from_backing(&engine, backing, crate::llm::ModelOptions::default())
                .map_err(|e| JsError::new(&load_error_message(&e)))?;
        let load_ms = t.elapsed().as_secs_f64() * 1e3;
        log::info!(
            "loaded a {file_bytes}-byte model in {load_ms:.0} ms: {} weight bytes on the device",
            model.weight_bytes()
        );
        Ok(WebModel {
            model,
            file_bytes,
            load_ms,
            busy: std::rc::Rc::new(std::cell::Cell::new(false)),
        })
    }
}

/// The message for a failed load; an adapter whose limits cannot hold a weight says so.
fn load_error_message(e: &crate::llm::LlmError) -> String {
    use crate::gpu::AllocError;
    use crate::llm::LlmError;
    use crate::runtime::RunError;
    match e {
        LlmError::Run(RunError::Alloc {
            cause: AllocError::TooLarge { .. } | AllocError::BindingTooLarge { .. },
            ..
        }) => format!("this WebGPU adapter is too small for the model: {e}"),
        _ => e.to_string(),
    }
}

/// A model loaded on the page's WebGPU device, from [`ModelDownload::load`].
#[wasm_bindgen]
pub struct WebModel {
    model: crate::llm::Model,
    file_bytes: u64,
    load_ms: f64,
    /// Set while a generation runs: one at a time (each opens its own session).
    busy: std::rc::Rc<std::cell::Cell<bool>>,
}

/// What [`WebModel::info`] returns.
#[derive(serde::Serialize)]
struct ModelInfo {
    architecture: String,
    layers: u32,
    width: u32,
    heads: u32,
    kv_heads: u32,
    context: u32,
    vocabulary: u32,
    file_bytes: u64,
    /// Bytes of the tensors in the file.
    weights_file_bytes: u64,
    /// Bytes of the weights on the device (the rope table included).
    weights_device_bytes: u64,
    /// Bytes placed in the constants region (the weights, aligned).
    constants_region_bytes: u64,
    /// Sizes of the data region's buffers (constants at the low end, the placeholders'
    /// share at the high end), each at most `max_buffer_size`.
    data_region_buffers: Vec<u64>,
    load_ms: f64,
    adapter: String,
    max_buffer_size: u64,
    max_storage_buffer_binding_size: u64,
}

/// What the page asks [`WebModel::generate`] for (JSON). Missing fields take the defaults
/// of `dynrt generate`, so the same request gives the same tokens there.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct WebGenerateOptions {
    prompt: String,
    /// Render `prompt` as a user message with the model's chat template (`--chat`), else
    /// continue it as raw text (`--prompt`).
    #[serde(default)]
    chat: bool,
    #[serde(default = "default_max_tokens")]
    max_tokens: usize,
    #[serde(default = "default_policy")]
    policy: String,
    #[serde(default)]
    temperature: f32,
    #[serde(default)]
    top_k: usize,
    #[serde(default = "default_top_p")]
    top_p: f32,
    #[serde(default)]
    seed: u64,
}

fn default_max_tokens() -> usize {
    crate::llm::GenerateParams::default().max_tokens
}

fn default_policy() -> String {
    "adaptive".to_owned()
}

fn default_top_p() -> f32 {
    1.0
}

/// One generated token as the page receives it (JSON).
#[derive(serde::Serialize)]
struct TokenPoint<'a> {
    index: usize,
    token: u32,
    text: &'a str,
    forward_ms: f64,
    /// The memory sample of the forward pass that chose the token.
    memory: Option<MemoryPoint>,
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

#[wasm_bindgen]
impl WebModel {
    /// The model and how it was loaded, as JSON: configuration, file and device bytes of
    /// the weights, the constants region, load milliseconds (parse, graph, compile and
    /// upload), the adapter and its two buffer limits.
    ///
    /// # Errors
    /// Never in practice (serialisation of plain numbers and strings).
    pub fn info(&self) -> Result<String, JsError> {
        let c = self.model.config();
        let engine = self.model.engine();
        let stats = engine.stats();
        let limits = engine.gpu().limits();
        let info = ModelInfo {
            architecture: c.arch.name.to_owned(),
            layers: c.num_layers,
            width: c.embedding_len,
            heads: c.num_heads,
            kv_heads: c.num_kv_heads,
            context: c.context_len,
            vocabulary: c.vocab_size,
            file_bytes: self.file_bytes,
            weights_file_bytes: self.model.file_tensor_bytes(),
            weights_device_bytes: self.model.weight_bytes(),
            constants_region_bytes: stats.regions[0].current_bytes,
            data_region_buffers: self.model.networks().0.data_region_buffers(),
            load_ms: self.load_ms,
            adapter: engine.gpu().adapter_info().name.clone(),
            max_buffer_size: limits.max_buffer_size,
            max_storage_buffer_binding_size: limits.max_storage_buffer_binding_size,
        };
        serde_json::to_string(&info).map_err(|e| JsError::new(&e.to_string()))
    }

    /// Generates on a new session of the model (its own KV cache and predictor, freed when
    /// it ends) from `options_json` (`{"prompt", "chat", "max_tokens", "policy",
    /// "temperature", "top_k", "top_p", "seed"}`; greedy by default). Calls `on_token` with
    /// each token as JSON (`index`, `token`, `text`, `forward_ms`, `memory`: bytes per kind
    /// and per region after the forward pass that chose it and its real allocations) while
    /// generating; resolves to the report JSON with the fields of `dynrt generate --json`
    /// ([`crate::llm::GenerationReport`]) plus `trace`, every step's memory.
    ///
    /// # Errors
    /// Rejects on malformed options, an unknown policy, bad sampling parameters, a prompt
    /// that does not fit the context, a runtime error, or while another generation runs.
    pub fn generate(&self, options_json: String, on_token: js_sys::Function) -> js_sys::Promise {
        let model = self.model.clone();
        let busy = self.busy.clone();
        wasm_bindgen_futures::future_to_promise(async move {
            if busy.replace(true) {
                return Err(js_error("a generation is already running: await it first"));
            }
            let result = generate_on(&model, &options_json, &on_token).await;
            busy.set(false);
            result
                .map(|s| JsValue::from_str(&s))
                .map_err(|e| js_error(&e))
        })
    }
}

fn js_error(message: &str) -> JsValue {
    JsValue::from(JsError::new(message))
}

/// The body of [`WebModel::generate`]: the report JSON, or the error's message.
async fn generate_on(
    model: &crate::llm::Model,
    options_json: &str,
    on_token: &js_sys::Function,
) -> Result<String, String> {
    let opts: WebGenerateOptions =
        serde_json::from_str(options_json).map_err(|e| format!("generate options: {e}"))?;
    let policy: crate::memory::predictor::Policy =
        opts.policy.parse().map_err(|e| format!("policy: {e}"))?;
    let params = crate::llm::GenerateParams {
        max_tokens: opts.max_tokens,
        sampling: crate::llm::SamplingParams {
            temperature: opts.temperature,
            top_k: opts.top_k,
            top_p: opts.top_p,
            seed: opts.seed,
        },
        ..crate::llm::GenerateParams::default()
    };
    let mut session = model.session(crate::runtime::RunOptions::new(policy));
    let mut send = |e: &crate::llm::TokenEvent<'_>| {
        let point = TokenPoint {
            index: e.index,
            token: e.token,
            text: e.text,
            forward_ms: e.forward_ms,
            memory: e.memory.map(MemoryPoint::from),
        };
        match serde_json::to_string(&point) {
            Ok(json) => {
                if let Err(err) = on_token.call1(&JsValue::NULL, &JsValue::from_str(&json)) {
                    log::warn!("the page's token callback threw: {err:?}");
                }
            }
            Err(err) => log::warn!("token {}: {err}", e.token),
        }
    };
    let g = if opts.chat {
        session
            .chat_observed(&opts.prompt, &params, &mut send)
            .await
    } else {
        let ids = model
            .tokenizer()
            .encode(&opts.prompt, crate::tokenizer::Special::Allow);
        session
            .generate_ids_observed(&ids, &params, &mut send)
            .await
    }
    .map_err(|e| e.to_string())?;
    #[derive(serde::Serialize)]
    struct Report {
        #[serde(flatten)]
        report: crate::llm::GenerationReport,
        trace: Vec<MemoryPoint>,
    }
    let report = Report {
        report: crate::llm::GenerationReport::new(&session, &g, &opts.policy),
        trace: session
            .trace()
            .samples
            .iter()
            .map(MemoryPoint::from)
            .collect(),
    };
    serde_json::to_string(&report).map_err(|e| e.to_string())
}

/// An ONNX model on the page's WebGPU device ([`crate::onnx::OnnxSession`]): the protocol
/// `web/peer/peer.js` drives (see `scripts/bench_peer.sh`). Tensors cross as `.npy` bytes.
#[wasm_bindgen(js_name = OnnxSession)]
pub struct WebOnnxSession {
    // Rc<RefCell>: each run's promise holds the session across awaits ('static futures).
    session: std::rc::Rc<std::cell::RefCell<crate::onnx::OnnxSession>>,
    /// The pasts the previous run said to carry (they may be left out of the next run).
    carried: std::rc::Rc<std::cell::RefCell<Vec<String>>>,
}

#[wasm_bindgen(js_class = OnnxSession)]
impl WebOnnxSession {
    /// Opens the WebGPU device, decodes `model` (its external data files given as
    /// `external_names[i]` → `external_bytes[i]`, the names as the model writes them),
    /// imports and compiles it. Every `past → Concat → present` cache can be carried.
    ///
    /// # Errors
    /// Rejects with the loader's, the importer's or the runtime's error (the unsupported
    /// nodes all listed), or when the two arrays differ in length.
    pub async fn create(
        model: Vec<u8>,
        external_names: Vec<String>,
        external_bytes: Vec<js_sys::Uint8Array>,
    ) -> Result<WebOnnxSession, JsError> {
        if external_names.len() != external_bytes.len() {
            return Err(JsError::new(&format!(
                "{} external names but {} byte arrays",
                external_names.len(),
                external_bytes.len()
            )));
        }
        let mut resolver = crate::onnx::external::BytesResolver::new();
        for (name, bytes) in external_names.into_iter().zip(external_bytes) {
            resolver.insert(name, bytes::Bytes::from(bytes.to_vec()));
        }
        let gpu = crate::gpu::Gpu::new(crate::gpu::GpuOptions::default())
            .await
            .map_err(|e| JsError::new(&e.to_string()))?;
        let engine = crate::gpu::Engine::new(gpu);
        let session = crate::onnx::OnnxSession::from_bytes(
            &engine,
            bytes::Bytes::from(model),
            &resolver,
            &crate::onnx::SessionOptions::default(),
        )
        .map_err(|e| JsError::new(&e.to_string()))?;
        Ok(WebOnnxSession {
            session: std::rc::Rc::new(std::cell::RefCell::new(session)),
            carried: std::rc::Rc::default(),
        })
    }

    /// Runs the model once with the inputs `feed_names[i]` = `feeds[i]` (`.npy` bytes; a past
    /// carried by the previous run may be left out, or given to replace it) and resolves, when
    /// the run is complete on the device, to the outputs named in `fetch` as `.npy` bytes.
    /// `carry` holds `[output, input]` pairs: after this run each output becomes that input of
    /// the next run without leaving the device (each must be a cache the session appends in
    /// place: an output that concatenates the input with new rows).
    ///
    /// # Errors
    /// Rejects on malformed `.npy` bytes, inputs that do not fit the model (named), a carry
    /// pair that is not such a cache, a runtime error, or a run started before the previous
    /// one resolved.
    // The borrow is held across the run's awaits on purpose: it is the lock that makes a
    // second run before the first resolves an error (try_borrow_mut), never a panic.
    #[allow(clippy::await_holding_refcell_ref)]
    pub fn run(
        &self,
        feed_names: Vec<String>,
        feeds: Vec<js_sys::Uint8Array>,
        fetch: Vec<String>,
        carry: js_sys::Array,
    ) -> js_sys::Promise {
        let session = self.session.clone();
        let carried = self.carried.clone();
        wasm_bindgen_futures::future_to_promise(async move {
            let err = |e: String| JsValue::from(JsError::new(&e));
            let mut s = session
                .try_borrow_mut()
                .map_err(|_| err("a run is already going: await it first".into()))?;
            if feed_names.len() != feeds.len() {
                return Err(err(format!(
                    "{} feed names but {} feeds",
                    feed_names.len(),
                    feeds.len()
                )));
            }
            let mut tensors = Vec::with_capacity(feeds.len());
            for (name, bytes) in feed_names.iter().zip(&feeds) {
                let t = crate::npy::read_npy(&bytes.to_vec())
                    .map_err(|e| err(format!("feed `{name}`: {e}")))?;
                tensors.push(t);
            }
            let mut next: Vec<String> = Vec::new();
            for pair in carry.iter() {
                let pair = js_sys::Array::from(&pair);
                let (out, inp) = (pair.get(0).as_string(), pair.get(1).as_string());
                let (Some(out), Some(inp)) = (out, inp) else {
                    return Err(err("carry: each entry is [output, input]".into()));
                };
                if !s
                    .states()
                    .iter()
                    .any(|st| st.present == out && st.past == inp)
                {
                    return Err(err(format!(
                        "carry `{out}` -> `{inp}`: not a cache this session appends in place"
                    )));
                }
                next.push(inp);
            }
            let refs: Vec<(&str, &crate::onnx::HostTensor)> = feed_names
                .iter()
                .map(String::as_str)
                .zip(&tensors)
                .collect();
            let allowed = carried.borrow().clone();
            let allowed: Vec<&str> = allowed.iter().map(String::as_str).collect();
            s.run_carried(&refs, &allowed)
                .await
                .map_err(|e| err(e.to_string()))?;
            *carried.borrow_mut() = next;
            let out = js_sys::Array::new();
            for name in &fetch {
                let t = s.read(name).await.map_err(|e| err(e.to_string()))?;
                let npy = crate::npy::write_npy(&t).map_err(|e| err(format!("{name}: {e}")))?;
                out.push(&js_sys::Uint8Array::from(npy.as_slice()));
            }
            if fetch.is_empty() {
                s.engine().gpu().idle().await;
            }
            Ok(out.into())
        })
    }

    /// Keeps the inputs `names[i]` = `feeds[i]` (`.npy` bytes) on the device
    /// ([`crate::onnx::OnnxSession::keep_input`]): later runs may leave them out, and their
    /// bytes are written once, by the next run, instead of at every run — what a page gets
    /// from ONNX Runtime Web by feeding GPU tensors.
    ///
    /// # Errors
    /// Malformed `.npy` bytes, an input the model does not have or that does not fit (named),
    /// a carried past, a run still going, or arrays of different lengths. The inputs before
    /// the failing one stay kept.
    pub fn keep(&self, names: Vec<String>, feeds: Vec<js_sys::Uint8Array>) -> Result<(), JsError> {
        if names.len() != feeds.len() {
            return Err(JsError::new(&format!(
                "{} names but {} feeds",
                names.len(),
                feeds.len()
            )));
        }
        let mut s = self
            .session
            .try_borrow_mut()
            .map_err(|_| JsError::new("a run is going: await it first"))?;
        for (name, bytes) in names.iter().zip(&feeds) {
            let t = crate::npy::read_npy(&bytes.to_vec())
                .map_err(|e| JsError::new(&format!("feed `{name}`: {e}")))?;
            s.keep_input(name, &t)
                .map_err(|e| JsError::new(&e.to_string()))?;
        }
        Ok(())
    }
}
