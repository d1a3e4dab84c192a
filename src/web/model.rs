//! The language model: download into wasm memory ([`ModelDownload`]), load ([`WebModel`]),
//! generate with live events.

use wasm_bindgen::prelude::*;

use super::{js_error, MemoryPoint};

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
    /// The file has a chat template (a base model such as Gemma 3 270M has none).
    chat_template: bool,
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
            chat_template: self.model.tokenizer().chat_template().is_some(),
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
            ..crate::llm::SamplingParams::default()
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
        // A fresh session: the prompt starts the sequence (BOS where the model wants it).
        let tokenizer = model.tokenizer();
        let ids =
            tokenizer.with_bos(tokenizer.encode(&opts.prompt, crate::tokenizer::Special::Allow));
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
