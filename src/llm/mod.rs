//! Language models from GGUF files: load once, open sessions, generate text.
//!
//! [`Model::load`] (natively, by memory map) or [`Model::from_backing`] (any bytes: the
//! browser's fetched file) reads a GGUF of an architecture of [`arch::ARCHITECTURES`] (llama,
//! qwen2, qwen3, gemma3), builds its forward pass as a graph ([`graph`]), and compiles
//! it twice from one upload of the weights: a **prefill** network (`seq` and `past` free: a
//! prompt of any length on top of any past) and a **decode** network (`seq = 1`: every
//! activation of a step has a static shape and lives in one planned arena; only attention's
//! inputs grow). They share the constants region and the pipeline cache
//! ([`crate::runtime::Network::specialize`]).
//!
//! A [`Session`] is one conversation: its own requests, shape predictor and KV cache (per
//! layer K and V, preallocated with room by the predictor, appended in place each step,
//! grown with one copy), so several sessions of one model run side by side and share only
//! the weights. [`Session::generate`] continues the session with a raw prompt,
//! [`Session::chat`] with a user message rendered by the model's chat template on top of the
//! conversation so far (the cache is kept across turns: only the new turn is prefilled).
//! Both stream text through the tokenizer's [`crate::tokenizer::StreamDecoder`] and stop at
//! the end-of-sequence token or after `max_tokens`.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use dynrt::gpu::{Engine, Gpu, GpuOptions};
//! use dynrt::llm::{GenerateParams, Model, ModelOptions};
//! use dynrt::memory::predictor::Policy;
//! use dynrt::runtime::RunOptions;
//! let engine = Engine::new(Gpu::new_blocking(GpuOptions::from_env()?)?);
//! let model = Model::load(&engine, "SmolLM2-135M-Instruct.Q4_1.gguf", ModelOptions::default())?;
//! let mut session = model.session(RunOptions::new(Policy::Adaptive));
//! let reply = session.chat_blocking(
//!     "What is the capital of France?",
//!     &GenerateParams::default(),
//!     &mut |text| print!("{text}"),
//! )?;
//! println!("\n{} tokens", reply.tokens.len());
//! # Ok(()) }
//! ```

pub mod arch;
mod batch;
mod error;
pub mod graph;
mod report;
pub mod sample;
mod scheduler;
#[cfg(not(target_arch = "wasm32"))]
mod scheduler_thread;
mod session;

pub use arch::{ModelConfig, RopeScaling};
pub use batch::{BatchEngine, BatchOptions, BatchStats, FailedSeq, SeqId, SeqMemory, SeqToken};
pub use error::LlmError;
pub use graph::{build_graph, build_paged_graph, weight_dtype, ModelGraph, WeightFormat};
pub use report::GenerationReport;
pub use sample::{
    LogitRules, Penalties, Recommended, Sampled, Sampler, SamplingParams, TokenLogprobs,
    MAX_TOP_LOGPROBS,
};
pub use scheduler::{
    chat_roles, encode_prompt, FinishReason, Prompt, Request, RequestId, RequestMemory,
    ScheduleError, Scheduler, SchedulerEvent, SchedulerOptions, SchedulerStats,
};
#[cfg(not(target_arch = "wasm32"))]
pub use scheduler_thread::{
    LiveStats, SchedulerHandle, Submitted, ThreadState, COMMAND_CAPACITY, RATE_WINDOW,
};
pub use session::{
    GenerateParams, Generation, KvUsage, Session, SessionStats, StopReason, TokenEvent,
    PREFILL_CHUNK,
};

use crate::gguf::Gguf;
use crate::gpu::kernels::quant::QuantLayout;
use crate::gpu::Engine;
use crate::graph::Bindings;
use crate::runtime::{Network, NetworkOptions};
use crate::shape::DType;
use crate::tensor::Backing;
use crate::tokenizer::Tokenizer;
use std::sync::Arc;

/// The longest context `config`'s model can hold on a device whose largest storage
/// binding (and buffer) is `max_binding_bytes`: the metadata's `context_length`, capped so
/// that one layer's keys (`context * kv_heads * head_dim` f32 values, the largest buffer
/// that grows with the context) fit in one binding, and so that positions fit the kernels'
/// i32. A file may claim any context (a million tokens, or 2^32 - 1): what is sized by the
/// context is allocated as a session needs it (the KV cache) or is small (the two-level
/// RoPE table, about `2 sqrt(context)` rows), so such a file loads and answers short
/// prompts; a prompt past this limit is a typed error ([`LlmError::ContextFull`]).
pub fn context_on_device(config: &ModelConfig, max_binding_bytes: u64) -> u32 {
    let per_token = u64::from(config.kv_len()).max(1) * 4;
    let fits = (max_binding_bytes / per_token).min(i32::MAX as u64) as u32;
    config.context_len.min(fits).max(1)
}

/// How a model is loaded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelOptions {
    /// How projection weights reach the device.
    pub format: WeightFormat,
    /// Plan the decode network's static activations into one arena (off: they come from
    /// the memory pool).
    pub planner: bool,
    /// The largest storage binding the model may use, when lower than the device's (`None`:
    /// the device's). A projection weight above it is used in row pieces, as on a device
    /// with that limit: `Some(128 << 20)` lays a model out as for a browser's default
    /// limits, and a small value runs the pieces on a tiny model.
    pub max_binding_bytes: Option<u64>,
    /// Fold each projection's RMSNorm, gated activation and residual into it
    /// ([`crate::graph::fuse`], `NetworkOptions::fuse`): fewer dispatches per decode step.
    pub fuse: bool,
    /// Reorder the q4_0 and q5_0 weights into their formats' grouped planes on the
    /// device once, when the model is loaded (`NetworkOptions::regroup_weights`): the same
    /// bytes, every field word-aligned for the kernels.
    pub regroup_weights: bool,
    /// Store the KV cache as f16 (`Some(true)`), as f32 (`Some(false)`), or by the adapter
    /// class (`None`): f16 on hardware GPUs, where attention reads half the bytes and the
    /// cache holds twice the tokens, f32 on software adapters, whose per-head attention
    /// kernel reads f32 keys with vec4 loads ([`Model::kv_dtype`]).
    pub kv_f16: Option<bool>,
    /// The class of kernels to run (`None`: the adapter's, [`QuantLayout::of`]); tests and
    /// benchmarks run the hardware-GPU kernels on a software adapter with
    /// `Some(QuantLayout::gpu_class(gpu))`.
    pub kernels: Option<QuantLayout>,
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions {
            format: WeightFormat::Native,
            planner: true,
            max_binding_bytes: None,
            fuse: true,
            regroup_weights: true,
            kv_f16: None,
            kernels: None,
        }
    }
}

pub(crate) struct ModelInner {
    pub engine: Engine,
    pub config: ModelConfig,
    /// The longest context this model has on this device ([`context_on_device`]).
    pub context: u32,
    pub tokenizer: Tokenizer,
    pub prefill: Network,
    pub decode: Network,
    /// Tokens that end a generation: EOS and the other end-of-text control tokens.
    pub stop_ids: Vec<u32>,
    pub weight_bytes: u64,
    pub file_tensor_bytes: u64,
    pub options: ModelOptions,
    /// The file's bytes (the constants reference them): other graphs over the same weights
    /// are built from them ([`BatchEngine`]).
    pub backing: Backing,
    /// The device's largest storage binding the graphs were laid out for.
    pub max_binding: u64,
    /// The KV cache's element type (f32 or f16).
    pub kv_dtype: DType,
}

/// A loaded model: configuration, tokenizer and the two compiled networks sharing the
/// weights on the device. Cheap to clone (an `Arc`); the weights are freed with the last
/// clone and the last session.
#[derive(Clone)]
pub struct Model {
    pub(crate) inner: Arc<ModelInner>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("config", &self.inner.config)
            .field("weight_bytes", &self.inner.weight_bytes)
            .finish()
    }
}

impl Model {
    /// Maps the GGUF file at `path` and loads it (see [`Model::from_backing`]). The map
    /// stays open while the model lives.
    ///
    /// # Errors
    /// [`LlmError::Io`] when the file cannot be opened or mapped; the errors of
    /// [`Model::from_backing`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn load(
        engine: &Engine,
        path: impl AsRef<std::path::Path>,
        options: ModelOptions,
    ) -> Result<Model, LlmError> {
        let path = path.as_ref();
        let io = |source| LlmError::Io {
            path: path.display().to_string(),
            cause: source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: a read-only map of a file nobody writes while it is open, as for
        // `gguf::MappedGguf` (whose safety argument applies word for word): the model cache
        // is only ever replaced by an atomic rename.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Model::from_backing(engine, Arc::new(map), options)
    }

    /// Loads the GGUF held in `backing` (a memory map, or the bytes a page fetched): parses
    /// and validates the file, reads the configuration and tokenizer from its metadata,
    /// builds the graph with constants that reference `backing` (nothing copied), and
    /// compiles the prefill and decode networks, uploading the weights once into the
    /// constants region in bounded chunks.
    ///
    /// # Errors
    /// [`LlmError::Gguf`] for a malformed file or a model that is not a supported llama
    /// (every check of [`Gguf::parse`] and [`ModelConfig::from_gguf`]);
    /// [`LlmError::Tokenizer`]; [`LlmError::UnsupportedWeight`]; [`LlmError::Run`] when
    /// compiling or uploading fails (over the memory budget, a buffer too large). Nothing
    /// stays allocated after an error.
    pub fn from_backing(
        engine: &Engine,
        backing: Backing,
        options: ModelOptions,
    ) -> Result<Model, LlmError> {
        let bytes: &[u8] = (*backing).as_ref();
        let gguf = Gguf::parse(bytes)?;
        let config = ModelConfig::from_gguf(&gguf)?;
        let tokenizer = Tokenizer::from_gguf(&gguf)?;
        let limits = engine.gpu().limits();
        let max_binding = limits
            .max_storage_buffer_binding_size
            .min(limits.max_buffer_size)
            .min(options.max_binding_bytes.unwrap_or(u64::MAX));
        let context = context_on_device(&config, max_binding);
        let class = options
            .kernels
            .unwrap_or_else(|| QuantLayout::of(engine.gpu()));
        let gpu_class = matches!(class, QuantLayout::Gpu { .. });
        let kv_dtype = if options.kv_f16.unwrap_or(gpu_class) {
            DType::F16
        } else {
            DType::F32
        };
        let lg = build_graph(
            &gguf,
            &backing,
            &config,
            options.format,
            context,
            max_binding,
            kv_dtype,
        )?;
        let file_tensor_bytes = gguf.tensors().iter().map(|t| t.size_bytes()).sum();
        let fixed = |pairs: &[(&str, u64)]| -> Bindings {
            pairs.iter().map(|&(k, v)| (k.to_string(), v)).collect()
        };
        let decode = Network::compile(
            engine,
            lg.graph,
            NetworkOptions {
                planner: options.planner,
                fixed: fixed(&[("seq", 1)]),
                states: lg.states.clone(),
                fuse: options.fuse,
                regroup_weights: options.regroup_weights,
                kernels: Some(class),
                ..NetworkOptions::default()
            },
        )?;
        let prefill = decode.specialize(NetworkOptions {
            planner: options.planner,
            fixed: Bindings::new(),
            states: lg.states,
            ..NetworkOptions::default()
        })?;
        let mut stop_ids: Vec<u32> = tokenizer.eos_id().into_iter().collect();
        for text in ["<|im_end|>", "<|endoftext|>", "<|eot_id|>"] {
            if let Some(id) = tokenizer
                .token_id(text)
                .filter(|&i| tokenizer.is_control(i))
            {
                if !stop_ids.contains(&id) {
                    stop_ids.push(id);
                }
            }
        }
        Ok(Model {
            inner: Arc::new(ModelInner {
                engine: engine.clone(),
                config,
                context,
                tokenizer,
                prefill,
                decode,
                stop_ids,
                weight_bytes: lg.weight_bytes,
                file_tensor_bytes,
                options,
                backing,
                max_binding,
                kv_dtype,
            }),
        })
    }

    /// The hyper-parameters read from the file.
    pub fn config(&self) -> &ModelConfig {
        &self.inner.config
    }

    /// The longest context (prompt, past turns and answer, in tokens) a session of this
    /// model can hold on its device: the model's own context length, or less where one
    /// layer's keys for that many tokens would not fit in one storage binding
    /// ([`context_on_device`]). Longer prompts are refused before anything runs
    /// ([`LlmError::ContextFull`]).
    pub fn context_len(&self) -> u32 {
        self.inner.context
    }

    /// The tokenizer read from the file.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.inner.tokenizer
    }

    /// The engine the weights live on.
    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// The options the model was loaded with.
    pub fn options(&self) -> ModelOptions {
        self.inner.options
    }

    /// Tokens that end a generation (EOS, `<|im_end|>`, `<|endoftext|>` where the
    /// vocabulary has them as control tokens).
    pub fn stop_ids(&self) -> &[u32] {
        &self.inner.stop_ids
    }

    /// The sampling settings the file recommends ([`Recommended::from_gguf`]; all `None`
    /// when the file cannot be read again, which a loaded model's can).
    pub fn recommended_sampling(&self) -> Recommended {
        Gguf::parse((*self.inner.backing).as_ref())
            .map(|g| Recommended::from_gguf(&g))
            .unwrap_or_default()
    }

    /// Bytes of the weights as the graph holds them (the constants region's payload: the
    /// rope table included).
    pub fn weight_bytes(&self) -> u64 {
        self.inner.weight_bytes
    }

    /// Bytes of the weights the device holds reordered into the grouped layout of their
    /// formats (q4_0 and q5_0 weights; counted in [`Model::weight_bytes`] too: they
    /// take the place of the file's blocks).
    pub fn grouped_weight_bytes(&self) -> u64 {
        self.networks().0.grouped_weight_bytes()
    }

    /// Bytes of every tensor in the GGUF file.
    pub fn file_tensor_bytes(&self) -> u64 {
        self.inner.file_tensor_bytes
    }

    /// Bytes one token takes in the KV cache: keys and values of every layer.
    pub fn kv_bytes_per_token(&self) -> u64 {
        let c = &self.inner.config;
        2 * u64::from(c.num_layers) * u64::from(c.kv_len()) * self.kv_elem_bytes()
    }

    /// The element type of the KV cache: f16 or f32 ([`ModelOptions::kv_f16`]).
    pub fn kv_dtype(&self) -> DType {
        self.inner.kv_dtype
    }

    /// Bytes of one element of the KV cache (2 for f16, 4 for f32).
    pub fn kv_elem_bytes(&self) -> u64 {
        if self.inner.kv_dtype == DType::F16 {
            2
        } else {
            4
        }
    }

    /// The two compiled networks `(prefill, decode)`.
    pub fn networks(&self) -> (&Network, &Network) {
        (&self.inner.prefill, &self.inner.decode)
    }

    /// A new session (its own predictor, pool and KV cache) with `run` options.
    pub fn session(&self, run: crate::runtime::RunOptions) -> Session {
        Session::new(self.clone(), run)
    }
}
