//! A conversation with a model: its requests, KV cache, token history and counters.

use super::graph::labels;
use super::sample::{Sampler, SamplingParams};
use super::{LlmError, Model, ModelConfig};
use crate::gpu::{Buffer, BufferDesc};
use crate::graph::ops::SampleRow;
use crate::memory::AllocKind;
use crate::runtime::report::{MemoryTrace, TraceSample};
use crate::runtime::{
    DeviceIo, HostTensor, HostTime, InferRequest, Pending, RunError, RunOptions, RunStats,
};
use crate::shape::Shape;
use crate::tokenizer::{ChatMessage, Special};
use web_time::Instant;

/// What a generation does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GenerateParams {
    /// Tokens to generate at most (the stop token included when it comes).
    pub max_tokens: usize,
    /// How each token is chosen (greedy by default).
    pub sampling: SamplingParams,
    /// Stop at the model's stop tokens ([`Model::stop_ids`]); off, always generate
    /// `max_tokens` (the reference comparisons do this).
    pub stop_at_eos: bool,
    /// Keep every step's logits in [`Generation::logits`] (vocabulary floats per token).
    pub keep_logits: bool,
}

impl Default for GenerateParams {
    /// Greedy, up to 256 tokens, stopping at EOS, logits not kept.
    fn default() -> Self {
        GenerateParams {
            max_tokens: 256,
            sampling: SamplingParams::default(),
            stop_at_eos: true,
            keep_logits: false,
        }
    }
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// A stop token was generated (it is the last of [`Generation::tokens`]).
    Eos,
    /// `max_tokens` were generated.
    MaxTokens,
    /// The KV cache reached the model's context length.
    ContextFull,
}

/// One generated token, reported while the generation runs
/// ([`Session::generate_ids_observed`], [`Session::chat_observed`]).
#[derive(Debug, Clone, Copy)]
pub struct TokenEvent<'a> {
    /// Position of the token in this generation (0 for the first).
    pub index: usize,
    /// The token id.
    pub token: u32,
    /// Its text: complete UTF-8 only, so empty while a character is incomplete and for
    /// control tokens; the last token's text also carries what the decoder still held.
    pub text: &'a str,
    /// Milliseconds of the forward pass whose logits chose this token: the prefill for the
    /// first token, then one decode step (readback and sampling included).
    pub forward_ms: f64,
    /// Memory after that forward pass (the session's [`Session::trace`] sample).
    pub memory: Option<&'a TraceSample>,
    /// The decode request's host time so far ([`Session::decode_host_time`]): between two
    /// events it grew by the host time of the decode steps submitted in between (one in a
    /// steady decode).
    pub decode_host: HostTime,
}

/// Adapts a text callback to the token events (pieces that are empty are not passed on).
fn text_only<'f>(on_text: &'f mut dyn FnMut(&str)) -> impl FnMut(&TokenEvent<'_>) + 'f {
    move |e| {
        if !e.text.is_empty() {
            on_text(e.text);
        }
    }
}

/// What one generation produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// Generated ids, in order (a stop token included).
    pub tokens: Vec<u32>,
    /// Their text, control tokens left out.
    pub text: String,
    /// Tokens this call fed as its prompt (the new turn only, on top of the cache).
    pub prompt_tokens: usize,
    /// Why it ended.
    pub stop: StopReason,
    /// Milliseconds of the prefill (the prompt's forward pass, its readback included).
    pub prefill_ms: f64,
    /// Milliseconds of each decode step, readback and sampling included.
    pub decode_ms: Vec<f64>,
    /// Logits of every generated token, when [`GenerateParams::keep_logits`].
    pub logits: Vec<Vec<f32>>,
}

impl Generation {
    /// Prompt tokens per second of the prefill.
    pub fn prefill_tokens_per_s(&self) -> f64 {
        if self.prefill_ms > 0.0 {
            self.prompt_tokens as f64 / (self.prefill_ms / 1e3)
        } else {
            0.0
        }
    }

    /// Mean milliseconds per decode step (0 without decode steps).
    pub fn decode_ms_per_token(&self) -> f64 {
        if self.decode_ms.is_empty() {
            0.0
        } else {
            self.decode_ms.iter().sum::<f64>() / self.decode_ms.len() as f64
        }
    }
}

/// Counters of a session since it was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SessionStats {
    /// The runtime's counters of every request the session ran (allocations,
    /// reallocations, dispatches, ...).
    pub run: RunStats,
    /// Forward passes: prefills and decode steps.
    pub steps: u64,
    /// Turns whose prompt could not continue the cache (a chat template that rewrote the
    /// past): the cache was dropped and the whole conversation prefilled again.
    pub full_prefills: u64,
    /// Largest KV-cache bytes reserved after a step.
    pub kv_reserved_peak_bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holder {
    None,
    Prefill,
    Decode,
}

/// One conversation with a [`Model`]: its own requests (a prefill request per prompt and
/// one decode request), shape predictor and KV cache. Dropping it frees them; the model's
/// weights stay.
pub struct Session {
    model: Model,
    run: RunOptions,
    prefill: Option<InferRequest>,
    decode: Option<InferRequest>,
    holder: Holder,
    /// Ids in the KV cache, in order.
    cached: Vec<u32>,
    /// The last generated token, not yet fed to the model.
    pending: Option<u32>,
    /// The chat so far and its text as the model saw it (rendered turns and replies).
    messages: Vec<ChatMessage>,
    chat_text: String,
    /// Counters and host time of requests already dropped.
    dropped: RunStats,
    dropped_host: HostTime,
    stats: SessionStats,
    trace: MemoryTrace,
    last_allocations: u64,
    /// Called after each chunk of a prompt longer than one chunk (tokens done, total).
    prefill_progress: Option<Box<dyn FnMut(usize, usize) + Send>>,
    /// The token a step chose on the device, which the next step reads (4 bytes,
    /// `usm_device`): allocated by the first generation that samples on the device.
    token: Option<Buffer>,
}

/// Where a step's tokens come from.
enum Feed<'a> {
    /// Ids from the host (a prompt, or a token the CPU sampler chose).
    Host(&'a [u32]),
    /// The token the previous step chose, from the session's device buffer.
    Device,
}

/// KV-cache bytes of one kind of layer ([`Session::kv_by_layer_kind`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct KvUsage {
    /// Layers of this kind.
    pub layers: u32,
    /// Bytes their keys and values reserve (rows held plus room).
    pub reserved_bytes: u64,
    /// Bytes the tokens they must keep take.
    pub needed_bytes: u64,
}

/// Before a step: a sliding-window layer's cache that holds at least `window + window / 4`
/// rows drops its oldest rows down to the `window - 1` the step's first query still sees.
/// Rows are dropped in a batch, not one per step, so the copy that moves the kept rows runs
/// once per `window / 4 + 1` decode steps (Gemma 3: 129, about 2 MB per layer); a local
/// layer's cache never holds more than `window + window / 4 + PREFILL_CHUNK` rows, however
/// long the conversation.
fn drop_outside_window(request: &mut InferRequest, config: &ModelConfig) -> Result<(), LlmError> {
    let window = u64::from(config.sliding_window);
    if window == 0 {
        return Ok(());
    }
    let shapes = request.state_shapes();
    for l in config.local_layers() {
        for s in labels::states_of(l) {
            let held = shapes
                .get(s)
                .and_then(|sh| sh.dims().first().copied())
                .unwrap_or(0);
            if held >= window + (window / 4).max(1) {
                request.drop_state_front(s, held - (window - 1))?;
            }
        }
    }
    Ok(())
}

/// The `sample_params` input of a step: a row of the `sample` op per row of logits.
pub(super) fn sample_params(rows: &[SampleRow]) -> HostTensor {
    let bytes = rows
        .iter()
        .flat_map(SampleRow::to_words)
        .flat_map(u32::to_le_bytes)
        .collect();
    HostTensor {
        shape: Shape::new(vec![
            rows.len() as u64,
            crate::graph::ops::sample::PARAM_WORDS as u64,
        ]),
        dtype: crate::shape::DType::U32,
        bytes,
    }
}

/// The id in the first 4 bytes of a `next_token` output (0 when it is missing: the op
/// always writes one).
fn token_of(t: &HostTensor) -> u32 {
    t.bytes
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .map_or(0, |b| i32::from_le_bytes(b) as u32)
}

/// Tokens of a prompt fed to the model in one forward pass: a longer prompt is prefilled in
/// chunks of this many on top of the cache (the same result, activations bounded by the
/// chunk, progress reported between chunks).
pub const PREFILL_CHUNK: usize = 512;

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("cached_tokens", &self.cached.len())
            .field("stats", &self.stats)
            .finish()
    }
}

impl Session {
    pub(crate) fn new(model: Model, run: RunOptions) -> Session {
        Session {
            model,
            run,
            prefill: None,
            decode: None,
            holder: Holder::None,
            cached: Vec::new(),
            pending: None,
            messages: Vec::new(),
            chat_text: String::new(),
            dropped: RunStats::default(),
            dropped_host: HostTime::default(),
            stats: SessionStats::default(),
            trace: MemoryTrace::default(),
            last_allocations: 0,
            prefill_progress: None,
            token: None,
        }
    }

    /// Calls `progress(done, total)` after each chunk of a prompt longer than
    /// [`PREFILL_CHUNK`] tokens (the CLI prints it, so a long prompt shows that it moves).
    pub fn set_prefill_progress(&mut self, progress: impl FnMut(usize, usize) + Send + 'static) {
        self.prefill_progress = Some(Box::new(progress));
    }

    /// The model.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Ids held in the KV cache, in order.
    pub fn cached_tokens(&self) -> &[u32] {
        &self.cached
    }

    /// The chat so far ([`Session::chat`]).
    pub fn messages(&self) -> &[ChatMessage] {
        &self.messages
    }

    /// Counters since creation.
    pub fn stats(&self) -> SessionStats {
        let live = self
            .prefill
            .iter()
            .chain(self.decode.iter())
            .fold(self.dropped, |acc, r| acc.merged(&r.stats()));
        SessionStats {
            run: live,
            ..self.stats
        }
    }

    /// Host time of the session's iterations (shape updates, sizing, encoding, submits):
    /// what a step costs before the GPU's work.
    pub fn host_time(&self) -> HostTime {
        (self.prefill.iter())
            .chain(self.decode.iter())
            .fold(self.dropped_host, |acc, r| acc.merged(&r.host_time()))
    }

    /// Host time of the decode request alone: its iterations are the one-token steps
    /// (prefills run on the prefill request).
    pub fn decode_host_time(&self) -> HostTime {
        self.decode
            .as_ref()
            .map_or_else(HostTime::default, InferRequest::host_time)
    }

    /// Bytes the KV cache reserves now (rows held plus room for growth).
    pub fn kv_reserved_bytes(&self) -> u64 {
        self.holder_request()
            .map_or(0, InferRequest::state_reserved_bytes)
    }

    /// Bytes the KV cache needs for the tokens it holds: every token's keys and values in
    /// a global layer, the last [`ModelConfig::sliding_window`] tokens' in a local one.
    pub fn kv_needed_bytes(&self) -> u64 {
        let [global, local] = self.kv_by_layer_kind();
        global.needed_bytes + local.needed_bytes
    }

    /// The KV cache of the global layers and of the sliding-window (local) layers: layers,
    /// bytes reserved, bytes needed.
    pub fn kv_by_layer_kind(&self) -> [KvUsage; 2] {
        let config = self.model.config();
        let row = 2 * u64::from(config.kv_len()) * self.model.kv_elem_bytes();
        let buffers = self
            .holder_request()
            .map(InferRequest::state_buffer_bytes)
            .unwrap_or_default();
        let cached = self.cached.len() as u64;
        let mut kinds = [KvUsage::default(); 2];
        for l in 0..config.num_layers {
            let local = config.is_local(l);
            let kind = &mut kinds[usize::from(local)];
            kind.layers += 1;
            kind.reserved_bytes += labels::states_of(l)
                .iter()
                .filter_map(|&s| buffers.get(s))
                .sum::<u64>();
            let rows = if local {
                cached.min(u64::from(config.sliding_window))
            } else {
                cached
            };
            kind.needed_bytes += rows * row;
        }
        kinds
    }

    /// Memory after every step (one sample per forward pass), for `--report` pictures.
    pub fn trace(&self) -> &MemoryTrace {
        &self.trace
    }

    /// Forgets the conversation: the cache is emptied (its buffers are kept for reuse).
    pub fn reset(&mut self) {
        for r in self.prefill.iter_mut().chain(self.decode.iter_mut()) {
            r.reset_states();
        }
        self.cached.clear();
        self.pending = None;
        self.messages.clear();
        self.chat_text.clear();
    }

    fn holder_request(&self) -> Option<&InferRequest> {
        match self.holder {
            Holder::None => None,
            Holder::Prefill => self.prefill.as_ref(),
            Holder::Decode => self.decode.as_ref(),
        }
    }

    /// Runs the model on `tokens` after the cache (a prefill for several, a decode step for
    /// one) and returns the logits of the last of them. The tokens join the cache.
    ///
    /// # Errors
    /// [`LlmError::EmptyPrompt`], [`LlmError::UnknownToken`], [`LlmError::ContextFull`]
    /// (nothing runs then); [`LlmError::Run`] from the runtime (the cache is unchanged).
    pub async fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>, LlmError> {
        let config = self.model.config().clone();
        if tokens.is_empty() {
            return Err(LlmError::EmptyPrompt);
        }
        if let Some(&id) = tokens.iter().find(|&&t| t >= config.vocab_size) {
            return Err(LlmError::UnknownToken {
                id,
                vocab_size: config.vocab_size,
            });
        }
        let past = self.cached.len();
        self.check_context(tokens.len())?;
        let target = if tokens.len() == 1 {
            Holder::Decode
        } else {
            Holder::Prefill
        };
        self.move_cache_to(target)?;
        let request = match target {
            Holder::Decode => self.decode.as_mut(),
            _ => self.prefill.as_mut(),
        };
        let Some(request) = request else {
            return Err(LlmError::EmptyPrompt);
        };
        let n = tokens.len() as u64;
        drop_outside_window(request, &config)?;
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let pos: Vec<i32> = (past..past + tokens.len()).map(|p| p as i32).collect();
        let tok_t = HostTensor::i32(Shape::new(vec![n]), &ids);
        let pos_t = HostTensor::i32(Shape::new(vec![n]), &pos);
        let par_t = sample_params(&[SampleRow::greedy()]);
        let out = request
            .infer(
                &[
                    (labels::TOKENS, &tok_t),
                    (labels::POSITIONS, &pos_t),
                    (labels::SAMPLE_PARAMS, &par_t),
                ],
                &[labels::LOGITS],
            )
            .await?;
        self.cached.extend_from_slice(tokens);
        self.stats.steps += 1;
        self.sample_memory();
        Ok(out
            .into_iter()
            .next()
            .map(|t| t.to_f32())
            .unwrap_or_default())
    }

    /// Submits one step without waiting for it: `feed`'s tokens at positions `past..`, the
    /// token chosen by `row` copied into the session's device buffer for the next step, and
    /// the outputs `read` (the chosen token, the logits) on their way back
    /// ([`InferRequest::collect`] on the request [`Session::step_request`] gives). Host-fed
    /// tokens join the cache; a device-fed one is the caller's to record once it is known.
    ///
    /// # Errors
    /// [`LlmError::ContextFull`] (nothing runs); [`LlmError::Run`] (nothing of the step was
    /// submitted and the cache is unchanged).
    async fn submit_step(
        &mut self,
        feed: Feed<'_>,
        past: usize,
        row: SampleRow,
        read: &[&str],
    ) -> Result<Pending, LlmError> {
        let config = self.model.config().clone();
        let n = match feed {
            Feed::Host(t) => t.len(),
            Feed::Device => 1,
        };
        let context = self.model.context_len() as usize;
        if past + n > context {
            return Err(LlmError::ContextFull {
                past_tokens: past,
                new_tokens: n,
                context_len: self.model.context_len(),
            });
        }
        let target = if n == 1 {
            Holder::Decode
        } else {
            Holder::Prefill
        };
        self.move_cache_to(target)?;
        if self.token.is_none() {
            let buffer = self
                .model
                .engine()
                .allocate(&BufferDesc {
                    label: "dynrt next token",
                    size_bytes: 4,
                    kind: AllocKind::UsmDevice,
                })
                .map_err(|cause| RunError::Alloc {
                    what: "the session's token buffer".into(),
                    cause,
                })?;
            self.token = Some(buffer);
        }
        let Some(token) = self.token.as_ref() else {
            return Err(LlmError::EmptyPrompt);
        };
        let request = match target {
            Holder::Decode => self.decode.as_mut(),
            _ => self.prefill.as_mut(),
        };
        let Some(request) = request else {
            return Err(LlmError::EmptyPrompt);
        };
        drop_outside_window(request, &config)?;
        let pos: Vec<i32> = (past..past + n).map(|p| p as i32).collect();
        let pos_t = HostTensor::i32(Shape::new(vec![n as u64]), &pos);
        let par_t = sample_params(&[row]);
        let mut inputs = vec![(labels::POSITIONS, &pos_t), (labels::SAMPLE_PARAMS, &par_t)];
        let tok_t;
        let mut io = DeviceIo {
            inputs: Vec::new(),
            outputs: vec![(labels::NEXT_TOKEN, token, 0)],
        };
        match feed {
            Feed::Host(tokens) => {
                let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
                tok_t = HostTensor::i32(Shape::new(vec![n as u64]), &ids);
                inputs.push((labels::TOKENS, &tok_t));
            }
            Feed::Device => io
                .inputs
                .push((labels::TOKENS, Shape::new(vec![1]), token, 0)),
        }
        let pending = request.submit(&inputs, &io, read).await?;
        if let Feed::Host(tokens) = feed {
            self.cached.extend_from_slice(tokens);
        }
        self.stats.steps += 1;
        self.sample_memory();
        Ok(pending)
    }

    /// The request that holds the cache (the one the last step ran on).
    fn step_request(&mut self) -> Option<&mut InferRequest> {
        match self.holder {
            Holder::None => None,
            Holder::Prefill => self.prefill.as_mut(),
            Holder::Decode => self.decode.as_mut(),
        }
    }

    /// Reads the outputs of a step submitted by [`Session::submit_step`].
    async fn collect_step(&mut self, pending: Pending) -> Result<Vec<HostTensor>, LlmError> {
        match self.step_request() {
            Some(r) => Ok(r.collect(pending).await?),
            None => Err(LlmError::EmptyPrompt),
        }
    }

    /// [`LlmError::ContextFull`] unless `new_tokens` more fit in the context
    /// ([`Model::context_len`]).
    fn check_context(&self, new_tokens: usize) -> Result<(), LlmError> {
        let context_len = self.model.context_len();
        let past = self.cached.len();
        if past.saturating_add(new_tokens) > context_len as usize {
            return Err(LlmError::ContextFull {
                past_tokens: past,
                new_tokens,
                context_len,
            });
        }
        Ok(())
    }

    /// Makes `target`'s request exist and hold the KV cache (moving it without a copy from
    /// the other request; a prefill request whose cache moved out is dropped with its
    /// activations).
    fn move_cache_to(&mut self, target: Holder) -> Result<(), LlmError> {
        let inner = &self.model.inner;
        let slot = match target {
            Holder::Decode => &mut self.decode,
            _ => &mut self.prefill,
        };
        if slot.is_none() {
            let net = match target {
                Holder::Decode => &inner.decode,
                _ => &inner.prefill,
            };
            *slot = Some(InferRequest::new(net, self.run)?);
        }
        if self.holder == target || self.holder == Holder::None {
            self.holder = target;
            return Ok(());
        }
        let states = match self.holder {
            Holder::Prefill => self.prefill.as_mut().map(InferRequest::take_states),
            Holder::Decode => self.decode.as_mut().map(InferRequest::take_states),
            Holder::None => None,
        };
        if self.holder == Holder::Prefill {
            // Its activations are not needed until the next prompt.
            if let Some(r) = self.prefill.take() {
                self.dropped = self.dropped.merged(&r.stats());
                self.dropped_host = self.dropped_host.merged(&r.host_time());
            }
        }
        let dest = match target {
            Holder::Decode => self.decode.as_mut(),
            _ => self.prefill.as_mut(),
        };
        if let (Some(states), Some(dest)) = (states, dest) {
            if let Err(e) = dest.put_states(states) {
                // Sibling networks always agree on the states; should they not, the cache
                // is lost rather than half-moved.
                self.cached.clear();
                self.pending = None;
                self.holder = target;
                return Err(e.into());
            }
        }
        self.holder = target;
        Ok(())
    }

    fn sample_memory(&mut self) {
        let stats = self.model.engine().stats();
        let mut bytes_in_use = [0u64; 4];
        for k in AllocKind::ALL {
            bytes_in_use[k.index()] = stats.current_bytes(k);
        }
        let mut region_bytes = [0u64; 3];
        for (r, s) in region_bytes.iter_mut().zip(&stats.regions) {
            *r = s.current_bytes;
        }
        let allocations = self.stats().run.allocations;
        let reallocations = allocations.saturating_sub(self.last_allocations) as u32;
        self.last_allocations = allocations;
        self.stats.kv_reserved_peak_bytes = self
            .stats
            .kv_reserved_peak_bytes
            .max(self.kv_reserved_bytes());
        self.trace.samples.push(TraceSample {
            step: self.trace.samples.len() as u32,
            bytes_in_use,
            region_bytes,
            reallocations,
        });
    }

    /// Drops memory sample `index` and those after it, taken for a step that was given up
    /// (it chose no token): the trace keeps one sample per token, and the allocations the
    /// dropped samples counted are counted again by the next one.
    fn forget_sample(&mut self, index: usize) {
        let dropped: u64 = self
            .trace
            .samples
            .get(index..)
            .map_or(0, |s| s.iter().map(|x| u64::from(x.reallocations)).sum());
        self.trace.samples.truncate(index);
        self.last_allocations = self.last_allocations.saturating_sub(dropped);
    }

    /// Feeds `prompt` (after the cache and the last generated token, if it was not fed
    /// yet) and generates up to `params.max_tokens` tokens, calling `on_text` with each
    /// piece of text as soon as it is complete UTF-8.
    ///
    /// # Errors
    /// [`LlmError::BadParameter`] for bad sampling parameters or `max_tokens` 0,
    /// [`LlmError::ContextFull`]
    /// when the prompt does not fit, [`LlmError::UnknownToken`], runtime errors.
    pub async fn generate_ids(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Generation, LlmError> {
        self.generate_ids_observed(prompt, params, &mut text_only(on_text))
            .await
    }

    /// [`Session::generate_ids`], calling `on_token` once per generated token, in order,
    /// with its text and the memory after the forward pass that chose it (what a live
    /// chart draws: the page in `web/` does).
    ///
    /// # Errors
    /// As [`Session::generate_ids`].
    pub async fn generate_ids_observed(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
        on_token: &mut dyn FnMut(&TokenEvent<'_>),
    ) -> Result<Generation, LlmError> {
        if params.max_tokens == 0 {
            return Err(LlmError::BadParameter {
                name: "max_tokens",
                value: "0".into(),
                reason: "must be at least 1 (Session::forward runs a prompt alone)",
            });
        }
        let mut sampler = Sampler::new(params.sampling)?;
        let mut feed: Vec<u32> = self.pending.into_iter().collect();
        feed.extend_from_slice(prompt);
        if feed.is_empty() {
            return Err(LlmError::EmptyPrompt);
        }
        let prompt_tokens = feed.len();
        // Refused before any chunk runs: a prompt that cannot fit never half-fills the cache.
        self.check_context(prompt_tokens)?;
        if !params.keep_logits && !params.sampling.needs_logits() {
            return self.generate_on_device(feed, params, on_token).await;
        }
        let t0 = Instant::now();
        let mut logits = Vec::new();
        let mut done = 0;
        for chunk in feed.chunks(PREFILL_CHUNK) {
            logits = self.forward(chunk).await?;
            self.pending = None;
            done += chunk.len();
            if prompt_tokens > PREFILL_CHUNK {
                if let Some(progress) = self.prefill_progress.as_mut() {
                    progress(done, prompt_tokens);
                }
            }
        }
        let prefill_ms = t0.elapsed().as_secs_f64() * 1e3;
        let model = self.model.clone();
        let context = model.context_len() as usize;
        let mut decoder = model.tokenizer().stream_decoder(true);
        let mut tokens = Vec::new();
        let mut text = String::new();
        let mut decode_ms: Vec<f64> = Vec::new();
        let mut kept = Vec::new();
        let stop = loop {
            let t = Instant::now();
            let token = sampler.sample(&logits);
            if params.keep_logits {
                kept.push(std::mem::take(&mut logits));
            }
            tokens.push(token);
            let mut piece = decoder.push(token)?;
            let stop = if params.stop_at_eos && model.stop_ids().contains(&token) {
                Some(StopReason::Eos)
            } else if tokens.len() >= params.max_tokens {
                Some(StopReason::MaxTokens)
            } else if self.cached.len() >= context {
                Some(StopReason::ContextFull)
            } else {
                None
            };
            if stop.is_some() {
                // The last token: whatever the decoder still holds is flushed with it.
                piece.push_str(&decoder.finish());
            }
            on_token(&TokenEvent {
                index: tokens.len() - 1,
                token,
                text: &piece,
                forward_ms: decode_ms.last().copied().unwrap_or(prefill_ms),
                memory: self.trace.samples.last(),
                decode_host: self.decode_host_time(),
            });
            text.push_str(&piece);
            if let Some(stop) = stop {
                self.pending = Some(token);
                break stop;
            }
            logits = self.forward(&[token]).await?;
            decode_ms.push(t.elapsed().as_secs_f64() * 1e3);
        };
        Ok(Generation {
            tokens,
            text,
            prompt_tokens,
            stop,
            prefill_ms,
            decode_ms,
            logits: kept,
        })
    }

    /// The generation loop with the tokens chosen on the device
    /// ([`SamplingParams::device_row`]): step N + 1 is submitted before step N's token is
    /// read, and reads that token from the device itself, so the host waits for the GPU
    /// only to deliver a token. A stop (a stop token, `max_tokens`, the context) is seen one
    /// step late: the step already submitted after it is given up and its KV row rolled
    /// back ([`InferRequest::drop_rows_back`]), which leaves the session as the one-step
    /// loop would. No step is submitted that `max_tokens` or the context would refuse.
    ///
    /// On an error the cache holds the tokens of [`Session::cached_tokens`] exactly (a step
    /// in flight for a token not yet known is given up and rolled back).
    async fn generate_on_device(
        &mut self,
        feed: Vec<u32>,
        params: &GenerateParams,
        on_token: &mut dyn FnMut(&TokenEvent<'_>),
    ) -> Result<Generation, LlmError> {
        let prompt_tokens = feed.len();
        let row = |step: usize| {
            params
                .sampling
                .device_row(u32::try_from(step).unwrap_or(u32::MAX))
                .unwrap_or_else(SampleRow::greedy)
        };
        let t0 = Instant::now();
        let chunks: Vec<&[u32]> = feed.chunks(PREFILL_CHUNK).collect();
        let (last, before) = match chunks.split_last() {
            Some(x) => x,
            None => return Err(LlmError::EmptyPrompt),
        };
        let mut done = 0;
        for chunk in before {
            self.forward(chunk).await?;
            self.pending = None;
            done += chunk.len();
            if let Some(progress) = self.prefill_progress.as_mut() {
                progress(done, prompt_tokens);
            }
        }
        let past = self.cached.len();
        let first = self
            .submit_step(
                Feed::Host(last),
                past,
                row(past + last.len()),
                &[labels::NEXT_TOKEN],
            )
            .await?;
        self.pending = None;
        let out = self.collect_step(first).await?;
        if prompt_tokens > PREFILL_CHUNK {
            if let Some(progress) = self.prefill_progress.as_mut() {
                progress(prompt_tokens, prompt_tokens);
            }
        }
        let mut y = out.first().map_or(0, token_of);
        // The memory sample of the step that chose `y` (steps are sampled as they are
        // submitted, and one is submitted ahead of the token being shown).
        let mut y_sample = self.trace.samples.len().checked_sub(1);
        let prefill_ms = t0.elapsed().as_secs_f64() * 1e3;
        let model = self.model.clone();
        let context = model.context_len() as usize;
        let mut decoder = model.tokenizer().stream_decoder(true);
        let mut tokens = Vec::new();
        let mut text = String::new();
        let mut decode_ms: Vec<f64> = Vec::new();
        // The step submitted that feeds `y` (its KV row appended, `y` not yet in `cached`),
        // with the index of its memory sample.
        let mut inflight: Option<(Pending, usize)> = None;
        let mut t = Instant::now();
        let stop = loop {
            tokens.push(y);
            let mut piece = decoder.push(y)?;
            let stop = if params.stop_at_eos && model.stop_ids().contains(&y) {
                Some(StopReason::Eos)
            } else if tokens.len() >= params.max_tokens {
                Some(StopReason::MaxTokens)
            } else if self.cached.len() >= context {
                Some(StopReason::ContextFull)
            } else {
                None
            };
            if stop.is_some() {
                piece.push_str(&decoder.finish());
            }
            on_token(&TokenEvent {
                index: tokens.len() - 1,
                token: y,
                text: &piece,
                forward_ms: decode_ms.last().copied().unwrap_or(prefill_ms),
                memory: y_sample.and_then(|i| self.trace.samples.get(i)),
                decode_host: self.decode_host_time(),
            });
            text.push_str(&piece);
            if let Some(stop) = stop {
                if let Some((p, sample)) = inflight.take() {
                    self.give_up(p, 1)?;
                    self.forget_sample(sample);
                }
                self.pending = Some(y);
                break stop;
            }
            // The step that feeds y: submitted ahead already, except after the prefill.
            let (feeding, feeding_sample) = match inflight.take() {
                Some(p) => p,
                None => {
                    let at = self.cached.len();
                    let p = self
                        .submit_step(Feed::Device, at, row(at + 1), &[labels::NEXT_TOKEN])
                        .await?;
                    (p, self.trace.samples.len() - 1)
                }
            };
            self.cached.push(y);
            // One step ahead: it feeds the token `feeding` chooses, unless no step could
            // feed that one (it is the last `max_tokens` allows, or the context is full).
            let at = self.cached.len();
            let ahead = if tokens.len() + 1 < params.max_tokens && at < context {
                match self
                    .submit_step(Feed::Device, at, row(at + 1), &[labels::NEXT_TOKEN])
                    .await
                {
                    Ok(p) => Some((p, self.trace.samples.len() - 1)),
                    Err(e) => {
                        self.abandon(feeding);
                        return Err(e);
                    }
                }
            } else {
                None
            };
            let out = match self.collect_step(feeding).await {
                Ok(out) => out,
                Err(e) => {
                    if let Some((p, sample)) = ahead {
                        self.give_up(p, 1)?;
                        self.forget_sample(sample);
                    }
                    self.pending = None;
                    return Err(e);
                }
            };
            y = out.first().map_or(0, token_of);
            y_sample = Some(feeding_sample);
            inflight = ahead;
            decode_ms.push(t.elapsed().as_secs_f64() * 1e3);
            t = Instant::now();
        };
        Ok(Generation {
            tokens,
            text,
            prompt_tokens,
            stop,
            prefill_ms,
            decode_ms,
            logits: Vec::new(),
        })
    }

    /// Gives up a submitted step whose outputs will not be read, rolling back the `rows` KV
    /// rows it appended for a token the cache does not take.
    fn give_up(&mut self, pending: Pending, rows: u64) -> Result<(), LlmError> {
        if let Some(r) = self.step_request() {
            r.release(pending);
            r.drop_rows_back(rows)?;
        }
        Ok(())
    }

    /// After an error: the step in flight fed the last token of the cache (its row is
    /// kept); the token it chose is dropped with it.
    fn abandon(&mut self, pending: Pending) {
        if let Some(r) = self.step_request() {
            r.release(pending);
        }
        self.pending = None;
    }

    /// Encodes `prompt` (control tokens written in it are matched, as a rendered template
    /// would be) and generates after it ([`Session::generate_ids`]). At the start of a
    /// sequence (nothing cached) the prompt gets the model's BOS when it expects one
    /// ([`Tokenizer::with_bos`](crate::tokenizer::Tokenizer::with_bos): Gemma, Llama 2).
    ///
    /// # Errors
    /// As [`Session::generate_ids`].
    pub async fn generate(
        &mut self,
        prompt: &str,
        params: &GenerateParams,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Generation, LlmError> {
        let tokenizer = self.model.tokenizer();
        let mut ids = tokenizer.encode(prompt, Special::Allow);
        if self.cached.is_empty() && self.pending.is_none() {
            ids = tokenizer.with_bos(ids);
        }
        self.generate_ids(&ids, params, on_text).await
    }

    /// One chat turn: `user` is added to the conversation, which is rendered with the
    /// model's chat template; only what the cache does not hold yet is prefilled (the new
    /// turn, on top of the past ones), then the reply is generated and kept in the
    /// conversation. A chat that starts over gets the model's BOS when it expects one and
    /// the template did not write it.
    ///
    /// # Errors
    /// [`LlmError::Tokenizer`] when the model has no chat template or it fails; as
    /// [`Session::generate_ids`].
    pub async fn chat(
        &mut self,
        user: &str,
        params: &GenerateParams,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Generation, LlmError> {
        self.chat_observed(user, params, &mut text_only(on_text))
            .await
    }

    /// [`Session::chat`], reporting each token as [`Session::generate_ids_observed`] does.
    ///
    /// # Errors
    /// As [`Session::chat`].
    pub async fn chat_observed(
        &mut self,
        user: &str,
        params: &GenerateParams,
        on_token: &mut dyn FnMut(&TokenEvent<'_>),
    ) -> Result<Generation, LlmError> {
        let model = self.model.clone();
        let tokenizer = model.tokenizer();
        let mut messages = self.messages.clone();
        messages.push(ChatMessage::user(user));
        // Message text is plain text: control tokens come only from the template.
        let rendered = tokenizer.render_chat(&messages, true)?;
        // The template re-renders the whole chat; when it extends what the cache holds
        // (the usual case) only the new text is encoded and prefilled.
        let ids = match rendered.text.strip_prefix(self.chat_text.as_str()) {
            Some(_) if !self.chat_text.is_empty() => {
                // A stop token the reply ended with is in the rendered text again.
                if self
                    .pending
                    .is_some_and(|t| self.model.stop_ids().contains(&t))
                {
                    self.pending = None;
                }
                tokenizer.encode_chat(&rendered, self.chat_text.len())
            }
            _ => {
                if !self.cached.is_empty() {
                    self.stats.full_prefills += 1;
                }
                self.reset();
                tokenizer.with_bos(tokenizer.encode_chat(&rendered, 0))
            }
        };
        let reply = self.generate_ids_observed(&ids, params, on_token).await?;
        messages.push(ChatMessage::new("assistant", reply.text.clone()));
        self.chat_text = rendered.text;
        self.chat_text.push_str(&reply.text);
        self.messages = messages;
        Ok(reply)
    }

    /// [`Session::generate`], blocking (native only).
    ///
    /// # Errors
    /// As [`Session::generate`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn generate_blocking(
        &mut self,
        prompt: &str,
        params: &GenerateParams,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Generation, LlmError> {
        pollster::block_on(self.generate(prompt, params, on_text))
    }

    /// [`Session::generate_ids`], blocking (native only).
    ///
    /// # Errors
    /// As [`Session::generate_ids`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn generate_ids_blocking(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Generation, LlmError> {
        pollster::block_on(self.generate_ids(prompt, params, on_text))
    }

    /// [`Session::chat`], blocking (native only).
    ///
    /// # Errors
    /// As [`Session::chat`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn chat_blocking(
        &mut self,
        user: &str,
        params: &GenerateParams,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Generation, LlmError> {
        pollster::block_on(self.chat(user, params, on_text))
    }

    /// [`Session::forward`], blocking (native only).
    ///
    /// # Errors
    /// As [`Session::forward`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn forward_blocking(&mut self, tokens: &[u32]) -> Result<Vec<f32>, LlmError> {
        pollster::block_on(self.forward(tokens))
    }
}
