//! Many conversations of one model under one memory budget: a queue, admission by pages of
//! a paged KV cache, and one batched forward pass per step over every active request.
//!
//! A [`Scheduler`] holds a [`Model`], a [`BatchEngine`] whose pools hold the budget's worth of
//! KV positions ([`SchedulerOptions::budget_bytes`], in pages of
//! [`SchedulerOptions::page_size`]; allocated at the first step and kept), and the requests
//! given to it ([`Scheduler::submit`]). A request waits in a FIFO queue until fewer than
//! [`SchedulerOptions::max_active`] are active and the pools have room for its prompt beside
//! what the active requests hold ([`BatchEngine::uncommitted_positions`]); then it gets a
//! sequence in the engine. [`Scheduler::step`] runs one forward pass: a decode row for every
//! request that is answering and up to [`SchedulerOptions::prefill_chunk`] prompt tokens of
//! the others (so a long prompt holds the others back for one chunk at most), and reports
//! what came out as [`SchedulerEvent`]s. A request whose pages run out while it answers waits
//! or gives its pages back and is computed again later (the engine's preemption), so a full
//! server makes requests wait rather than fail. [`Scheduler::cancel`] drops a request at any
//! time: its pages are free at once (the pools themselves stay allocated).

use super::batch::{BatchEngine, BatchOptions, SeqId, SeqToken};
use super::sample::{LogitRules, TokenLogprobs};
use super::session::{GenerateParams, StopReason};
use super::{LlmError, Model};
use crate::runtime::RunOptions;
use crate::structured::Json;
use crate::tokenizer::{ChatMessage, Special, StreamDecoder, Tokenizer, TokenizerError};
use std::collections::VecDeque;
use web_time::Instant;

/// What a request continues.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Raw text (control tokens written in it are matched, as [`super::Session::generate`] does).
    Text(String),
    /// A chat, rendered with the model's template; message text stays plain text
    /// ([`crate::tokenizer::Tokenizer::encode_chat`]), as in [`super::Session::chat`].
    Chat(Vec<ChatMessage>),
    /// Token ids as they are.
    Ids(Vec<u32>),
    /// A chat with the definitions of the tools the model may call (OpenAI's `tools`, each a
    /// `{"type": "function", "function": {...}}` object), rendered by the model's template
    /// with them ([`crate::tokenizer::Tokenizer::render_chat_with_tools`]).
    ChatWithTools {
        /// The messages (assistant messages may carry tool calls, tool messages answer them).
        messages: Vec<ChatMessage>,
        /// The tools, as the client gave them.
        tools: Vec<Json>,
    },
}

/// One generation asked of a [`Scheduler`].
#[derive(Debug, Clone)]
pub struct Request {
    /// What to continue.
    pub prompt: Prompt,
    /// Tokens at most, sampling, stopping at the model's stop tokens. A `max_tokens` of
    /// `usize::MAX` generates until the context, or the KV pool, is full (llama-server's
    /// `-1`).
    pub params: GenerateParams,
    /// Texts that end the generation when they appear in it; they are not part of the
    /// answer (OpenAI's `stop`).
    pub stop: Vec<String>,
    /// A bias per token and a structured-output constraint on the logits.
    pub rules: LogitRules,
    /// The prompt cache's partition: a request reuses the KV pages of earlier or concurrent
    /// requests of the same partition only (a server gives each API key its own, so that
    /// timings and reuse never tell one client what another's prompt was).
    pub cache_salt: u64,
}

impl Request {
    /// A request for `prompt` with `params` and no stop texts.
    pub fn new(prompt: Prompt, params: GenerateParams) -> Request {
        Request {
            prompt,
            params,
            stop: Vec::new(),
            rules: LogitRules::default(),
            cache_salt: 0,
        }
    }
}

/// A request's number, given by [`Scheduler::submit`] (1, 2, ... in order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct RequestId(pub u64);

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// How a [`Scheduler`] shares the device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SchedulerOptions {
    /// Bytes of KV cache: the pools of the paged cache hold this much, in whole pages (at most
    /// one storage binding per layer), allocated at the first step.
    pub budget_bytes: u64,
    /// Requests active at once at most (the others wait in the queue).
    pub max_active: usize,
    /// Prompt tokens fed in one step beside the decode rows: the longest another request
    /// waits for a prompt.
    pub prefill_chunk: usize,
    /// Positions per page of the KV pools.
    pub page_size: u32,
    /// Whether a request that must give its pages back to let others run has them copied
    /// to host memory ([`BatchOptions::offload`]) rather than computed again.
    pub offload: bool,
    /// Requests waiting in the queue at most: [`Scheduler::submit`] refuses more
    /// ([`ScheduleError::QueueFull`]), so that a burst costs bounded memory.
    pub max_queue: usize,
    /// The run options of the engine's request.
    pub run: RunOptions,
}

impl SchedulerOptions {
    /// `budget_bytes` of KV cache, 8 requests at once, prompts in chunks of 128 tokens,
    /// pages of 16 positions, offload on, 256 requests in the queue at most.
    pub fn new(budget_bytes: u64, run: RunOptions) -> SchedulerOptions {
        SchedulerOptions {
            budget_bytes,
            max_active: 8,
            prefill_chunk: 128,
            page_size: 16,
            offload: true,
            max_queue: 256,
            run,
        }
    }
}

/// Why a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A stop token of the model, or one of the request's stop texts.
    Stop,
    /// `max_tokens` were generated.
    Length,
    /// The session's cache reached the model's context.
    ContextFull,
}

/// What a [`Scheduler::step`] reports.
#[derive(Debug)]
pub enum SchedulerEvent {
    /// The request left the queue: it has a session now.
    Started {
        /// The request.
        id: RequestId,
        /// Its prompt's tokens.
        prompt_tokens: usize,
        /// Milliseconds it waited in the queue.
        queued_ms: f64,
    },
    /// A token was generated.
    Token {
        /// The request.
        id: RequestId,
        /// Its position in the answer (0 for the first).
        index: usize,
        /// The token id.
        token: u32,
        /// Text that is now final: whole characters, control tokens left out, and nothing
        /// that could still turn out to start a stop text (held until it is known), so
        /// often empty.
        text: String,
        /// The token's log-probabilities, when the request's sampling asks for them.
        logprobs: Option<TokenLogprobs>,
    },
    /// The request ended normally (its last token came just before).
    Finished {
        /// The request.
        id: RequestId,
        /// Why.
        reason: FinishReason,
        /// Its prompt's tokens.
        prompt_tokens: usize,
        /// Tokens generated (a stop token included).
        completion_tokens: usize,
        /// Of the prompt's tokens, those read from the prompt cache or from a concurrent
        /// request's pages instead of computed.
        cached_tokens: usize,
        /// Milliseconds from the submission to the first token.
        first_token_ms: f64,
    },
    /// A forward pass of the request failed; it was dropped (the others go on).
    Failed {
        /// The request.
        id: RequestId,
        /// The error.
        error: LlmError,
    },
}

/// Why a request was refused by [`Scheduler::submit`] (nothing was queued).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// The request is invalid for the model: empty prompt, `max_tokens` 0, a prompt longer
    /// than the context, sampling parameters out of range, a model without a chat template.
    #[error(transparent)]
    Invalid(Box<LlmError>),
    /// Even alone the request could need more KV cache than the whole budget.
    #[error(
        "the request may need {need_bytes} bytes of KV cache ({tokens} tokens), more than the \
         whole budget of {budget_bytes} bytes: ask for fewer tokens or give a larger budget"
    )]
    OverBudget {
        /// Prompt plus `max_tokens`, capped at the context.
        tokens: usize,
        /// Their KV bytes.
        need_bytes: u64,
        /// The budget.
        budget_bytes: u64,
    },
    /// The queue holds [`SchedulerOptions::max_queue`] requests already: try again later.
    #[error("{queued} requests are waiting already, the most this server queues: try again later")]
    QueueFull {
        /// Requests in the queue.
        queued: usize,
    },
    /// The scheduler's thread has ended (native runner only).
    #[error("the scheduler has stopped")]
    Stopped,
}

impl From<LlmError> for ScheduleError {
    fn from(e: LlmError) -> Self {
        ScheduleError::Invalid(Box::new(e))
    }
}

/// Counters and gauges of a [`Scheduler`].
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct SchedulerStats {
    /// Requests with a sequence in the engine.
    pub active: usize,
    /// Requests waiting in the queue.
    pub queued: usize,
    /// KV bytes of the pools: the budget in whole pages (at most one storage binding per
    /// layer).
    pub budget_bytes: u64,
    /// KV bytes of the pages the active requests hold (a shared page once).
    pub kv_reserved_bytes: u64,
    /// KV bytes allocated: the pools, once the first step ran (0 before).
    pub kv_allocated_bytes: u64,
    /// Largest `kv_reserved_bytes` seen when requests were admitted.
    pub kv_reserved_peak_bytes: u64,
    /// KV bytes the tokens the active requests hold fill; `kv_reserved_bytes` minus this is
    /// the unwritten end of their last pages.
    pub kv_needed_bytes: u64,
    /// Largest `kv_allocated_bytes` after a step.
    pub kv_allocated_peak_bytes: u64,
    /// Device bytes in use on the model's engine (weights, caches, activations).
    pub device_bytes: u64,
    /// Largest device bytes of each on-device kind, summed (an upper bound of the peak of
    /// the total).
    pub device_peak_bytes: u64,
    /// Requests accepted by [`Scheduler::submit`].
    pub submitted: u64,
    /// Requests [`Scheduler::submit`] refused (invalid, over the budget, the queue full).
    pub refused: u64,
    /// Requests that ended normally.
    pub finished: u64,
    /// Requests cancelled.
    pub cancelled: u64,
    /// Requests whose forward pass failed.
    pub failed: u64,
    /// Prompt tokens fed.
    pub prompt_tokens_total: u64,
    /// Tokens generated.
    pub tokens_generated_total: u64,
    /// Forward passes: prompt chunks.
    pub prefill_steps: u64,
    /// Forward passes: decode steps.
    pub decode_steps: u64,
    /// Pages of each pool of the layers without a window (all layers of most models).
    pub pages_total: u32,
    /// Bytes of one page in the pools of the layers without a window.
    pub page_bytes: u64,
    /// Pages the active requests hold.
    pub pages_used: u32,
    /// Pages held by more than one request (a shared prompt start).
    pub pages_shared: u32,
    /// Pages the requests hold ahead of their next tokens by the preallocation policy
    /// (given back whenever another request needs them); part of `pages_used`.
    pub pages_spare: u32,
    /// Requests that gave their pages back to let others run and computed them again.
    pub preemptions: u64,
    /// Requests whose pages went to host memory to let others run (restored later).
    pub offloads: u64,
    /// Bytes of KV rows in host memory now.
    pub kv_offloaded_bytes: u64,
    /// Largest `kv_offloaded_bytes` seen.
    pub kv_offloaded_peak_bytes: u64,
    /// Prompt tokens not computed because their pages were shared with a running request.
    pub tokens_shared: u64,
    /// Prompt tokens not computed because their pages were in the prompt cache (left by
    /// requests that ended).
    pub tokens_cached: u64,
    /// KV pages in the prompt cache, held by no request (given back when needed).
    pub pages_cached: u32,
    /// Host bytes of the prefix index (its entries hold each indexed page's tokens once).
    pub prefix_index_bytes: u64,
    /// Requests the last forward pass computed rows for.
    pub batch_sequences: usize,
}

/// What one active request holds of the KV cache ([`Scheduler::request_memory`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct RequestMemory {
    /// The request.
    pub id: RequestId,
    /// Its prompt's tokens.
    pub prompt_tokens: usize,
    /// Tokens generated so far.
    pub generated: usize,
    /// Pages it holds in the pools of the layers without a window.
    pub pages: usize,
    /// Of those, pages other requests hold too.
    pub shared_pages: usize,
    /// Pages it holds in the sliding-window layers' pools.
    pub swa_pages: usize,
    /// Bytes of its KV rows in host memory (0 unless offloaded).
    pub offloaded_bytes: u64,
}

/// A request in the queue.
struct Queued {
    id: RequestId,
    ids: Vec<u32>,
    params: GenerateParams,
    stop: Vec<String>,
    rules: LogitRules,
    salt: u64,
    submitted: Instant,
}

/// A request with a sequence in the engine.
struct Active {
    id: RequestId,
    seq: SeqId,
    prompt_tokens: usize,
    stop: Vec<String>,
    /// Bytes of an incomplete character, between two tokens.
    held: Vec<u8>,
    /// The answer's text so far, and how much of it was reported.
    text: String,
    reported: usize,
    generated: usize,
    /// Prompt tokens read from shared or cached pages.
    cached_tokens: usize,
    submitted: Instant,
    first_token_ms: f64,
}

/// Many requests of one model under a KV budget: a FIFO queue, admission by pages, one
/// batched forward pass of every active request per [`Scheduler::step`].
pub struct Scheduler {
    model: Model,
    options: SchedulerOptions,
    engine: BatchEngine,
    queue: VecDeque<Queued>,
    active: Vec<Active>,
    next_id: RequestId,
    stats: SchedulerStats,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("options", &self.options)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Scheduler {
    /// A scheduler of `model` with `options` (a `max_active` or `prefill_chunk` of 0 counts
    /// as 1): its engine's pools hold the budget's worth of positions, in whole pages, at
    /// most what one storage binding holds per layer.
    ///
    /// # Errors
    /// [`LlmError::BadParameter`] when the budget holds less than one page; the errors of
    /// [`BatchEngine::new`].
    pub fn new(model: Model, options: SchedulerOptions) -> Result<Scheduler, LlmError> {
        let options = SchedulerOptions {
            max_active: options.max_active.max(1),
            prefill_chunk: options.prefill_chunk.max(1),
            page_size: options.page_size.max(1),
            ..options
        };
        let per_token = model.kv_bytes_per_token().max(1);
        let kv_row = u64::from(model.config().kv_len()) * model.kv_elem_bytes();
        let binding = model.inner.max_binding / kv_row.max(1);
        let ps = u64::from(options.page_size);
        let positions = (options.budget_bytes / per_token).min(binding) / ps * ps;
        if positions == 0 {
            return Err(LlmError::BadParameter {
                name: "budget_bytes",
                value: options.budget_bytes.to_string(),
                reason: "must hold at least one page of KV cache for every layer",
            });
        }
        let engine = BatchEngine::new(
            &model,
            BatchOptions {
                page_size: options.page_size,
                pool_tokens: u32::try_from(positions).unwrap_or(u32::MAX) / options.page_size
                    * options.page_size,
                step_tokens: u32::try_from(options.prefill_chunk + options.max_active)
                    .unwrap_or(u32::MAX),
                max_batch: options.max_active,
                offload: options.offload,
                run: options.run,
            },
        )?;
        Ok(Scheduler {
            stats: SchedulerStats {
                budget_bytes: engine.pool_bytes(),
                pages_total: engine.stats().pages_total,
                page_bytes: engine.page_bytes()[0],
                ..SchedulerStats::default()
            },
            model,
            options,
            engine,
            queue: VecDeque::new(),
            active: Vec::new(),
            next_id: RequestId(1),
        })
    }

    /// The model.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The options.
    pub fn options(&self) -> &SchedulerOptions {
        &self.options
    }

    /// The engine that runs the forward passes.
    pub fn engine(&self) -> &BatchEngine {
        &self.engine
    }

    /// The prompt of `prompt` as the model's token ids ([`encode_prompt`] with this model's
    /// tokenizer).
    ///
    /// # Errors
    /// As [`encode_prompt`].
    pub fn encode(&self, prompt: &Prompt) -> Result<Vec<u32>, LlmError> {
        encode_prompt(self.model.tokenizer(), prompt)
    }

    /// KV bytes a request with `prompt_tokens` and `max_tokens` may need: both together,
    /// capped at the context.
    pub fn need_bytes(&self, prompt_tokens: usize, max_tokens: usize) -> (usize, u64) {
        let tokens = prompt_tokens
            .saturating_add(max_tokens)
            .min(self.model.context_len() as usize);
        (tokens, tokens as u64 * self.model.kv_bytes_per_token())
    }

    /// Queues `request` and returns its number; it starts when the pages allow
    /// ([`Scheduler::step`] reports it).
    ///
    /// # Errors
    /// [`ScheduleError::Invalid`] for an empty prompt, a token outside the vocabulary, a
    /// prompt longer than the context, `max_tokens` 0 or bad sampling parameters;
    /// [`ScheduleError::OverBudget`] when the request could need more than the whole pool;
    /// [`ScheduleError::QueueFull`] when [`SchedulerOptions::max_queue`] requests wait
    /// already.
    pub fn submit(&mut self, request: Request) -> Result<RequestId, ScheduleError> {
        let id = self.queue_request(request);
        if id.is_err() {
            self.stats.refused += 1;
        }
        id
    }

    /// [`Scheduler::submit`] but for the count of refusals.
    fn queue_request(&mut self, request: Request) -> Result<RequestId, ScheduleError> {
        let Request {
            prompt,
            params,
            stop,
            rules,
            cache_salt,
        } = request;
        if self.queue.len() >= self.options.max_queue {
            return Err(ScheduleError::QueueFull {
                queued: self.queue.len(),
            });
        }
        let ids = self.encode(&prompt)?;
        let mut params = params;
        if params.max_tokens == usize::MAX {
            // Until the context, or the pool, is full.
            let limit = (self.model.context_len() as usize)
                .min(usize::try_from(self.engine.pool_positions()).unwrap_or(usize::MAX));
            params.max_tokens = limit.saturating_sub(ids.len()).max(1);
        }
        self.check(&ids, &params)?;
        let vocab_size = self.model.config().vocab_size;
        if let Some(&(id, _)) = rules.bias.iter().find(|(t, _)| *t >= vocab_size) {
            return Err(LlmError::UnknownToken { id, vocab_size }.into());
        }
        let (tokens, need_bytes) = self.need_bytes(ids.len(), params.max_tokens);
        let budget_bytes = self.engine.pool_bytes();
        // What limits a request is the positions its layers without a window hold.
        if tokens as u64 > self.engine.pool_positions() {
            return Err(ScheduleError::OverBudget {
                tokens,
                need_bytes,
                budget_bytes,
            });
        }
        let id = self.next_id;
        self.next_id = RequestId(id.0 + 1);
        self.stats.submitted += 1;
        self.queue.push_back(Queued {
            id,
            ids,
            params,
            stop: stop.into_iter().filter(|s| !s.is_empty()).collect(),
            rules,
            salt: cache_salt,
            submitted: Instant::now(),
        });
        Ok(id)
    }

    /// The checks of [`Scheduler::submit`] on the encoded prompt.
    fn check(&self, ids: &[u32], params: &GenerateParams) -> Result<(), LlmError> {
        if params.max_tokens == 0 {
            return Err(LlmError::BadParameter {
                name: "max_tokens",
                value: "0".into(),
                reason: "must be at least 1",
            });
        }
        params.sampling.validate()?;
        if ids.is_empty() {
            return Err(LlmError::EmptyPrompt);
        }
        let vocab_size = self.model.config().vocab_size;
        if let Some(&id) = ids.iter().find(|&&t| t >= vocab_size) {
            return Err(LlmError::UnknownToken { id, vocab_size });
        }
        let context_len = self.model.context_len();
        if ids.len() > context_len as usize {
            return Err(LlmError::ContextFull {
                past_tokens: 0,
                new_tokens: ids.len(),
                context_len,
            });
        }
        Ok(())
    }

    /// Drops request `id`, queued or active: an active one's pages are free before this
    /// returns. False when no such request is pending (it ended, or never was).
    pub fn cancel(&mut self, id: RequestId) -> bool {
        if let Some(i) = self.queue.iter().position(|q| q.id == id) {
            self.queue.remove(i);
        } else if let Some(i) = self.active.iter().position(|a| a.id == id) {
            let a = self.active.remove(i);
            self.engine.cancel(a.seq);
        } else {
            return false;
        }
        self.stats.cancelled += 1;
        true
    }

    /// True when no request is queued or active.
    pub fn is_idle(&self) -> bool {
        self.queue.is_empty() && self.active.is_empty()
    }

    /// What each active request holds, in the order they started.
    pub fn request_memory(&self) -> Vec<RequestMemory> {
        let seqs = self.engine.sequence_memory();
        (self.active.iter())
            .filter_map(|a| {
                let m = seqs.iter().find(|m| m.seq == a.seq)?;
                Some(RequestMemory {
                    id: a.id,
                    prompt_tokens: a.prompt_tokens,
                    generated: a.generated,
                    pages: m.pages,
                    shared_pages: m.shared_pages,
                    swa_pages: m.swa_pages,
                    offloaded_bytes: m.offloaded_bytes,
                })
            })
            .collect()
    }

    /// The counters and gauges now.
    pub fn stats(&self) -> SchedulerStats {
        let mut s = self.stats;
        let e = self.engine.stats();
        s.active = self.active.len();
        s.queued = self.queue.len();
        s.pages_used = e.pages_used;
        s.pages_shared = e.shared_pages;
        s.pages_spare = e.spare_pages;
        s.preemptions = e.preemptions;
        s.offloads = e.offloads;
        s.kv_offloaded_bytes = e.offloaded_bytes;
        s.kv_offloaded_peak_bytes = e.offloaded_peak_bytes;
        s.tokens_shared = e.tokens_shared;
        s.tokens_cached = e.tokens_cached;
        s.pages_cached = e.cached_pages;
        s.prefix_index_bytes = e.index_bytes;
        s.batch_sequences = e.last_sequences;
        s.kv_reserved_bytes = e.held_bytes;
        s.kv_allocated_bytes = self.engine.allocated_bytes();
        s.kv_needed_bytes = e.needed_bytes;
        let engine = self.model.engine().stats();
        s.device_bytes = engine.device_current_bytes();
        s.device_peak_bytes = crate::memory::AllocKind::ALL
            .iter()
            .filter(|k| k.on_device())
            .map(|&k| engine.peak_bytes(k))
            .sum();
        s
    }

    /// Starts queued requests, first come first served, while the pools have room for
    /// their prompts beside what the active ones already hold.
    fn admit(&mut self, events: &mut Vec<SchedulerEvent>) {
        while let Some(q) = self.queue.front() {
            let room = self.engine.uncommitted_positions();
            if self.active.len() >= self.options.max_active || (q.ids.len() as u64 + 1) > room {
                break;
            }
            let Some(q) = self.queue.pop_front() else {
                break;
            };
            let seq = match self.engine.add_with(&q.ids, q.params, q.rules, q.salt) {
                Ok(seq) => seq,
                Err(error) => {
                    // Checked by `submit`; reported rather than trusted.
                    self.stats.failed += 1;
                    events.push(SchedulerEvent::Failed { id: q.id, error });
                    continue;
                }
            };
            self.stats.prompt_tokens_total += q.ids.len() as u64;
            events.push(SchedulerEvent::Started {
                id: q.id,
                prompt_tokens: q.ids.len(),
                queued_ms: q.submitted.elapsed().as_secs_f64() * 1e3,
            });
            self.active.push(Active {
                id: q.id,
                seq,
                prompt_tokens: q.ids.len(),
                stop: q.stop,
                held: Vec::new(),
                text: String::new(),
                reported: 0,
                generated: 0,
                cached_tokens: 0,
                submitted: q.submitted,
                first_token_ms: 0.0,
            });
        }
        let reserved = self.engine.stats().held_bytes;
        self.stats.kv_reserved_peak_bytes = self.stats.kv_reserved_peak_bytes.max(reserved);
    }

    /// Starts what fits, then runs one forward pass over every active request (a decode
    /// row each, prompt chunks in the rows left) and returns what happened. Does nothing
    /// when idle.
    pub async fn step(&mut self) -> Vec<SchedulerEvent> {
        let mut events = Vec::new();
        self.admit(&mut events);
        if self.active.is_empty() {
            return events;
        }
        let before = self.engine.stats();
        let produced = match self.engine.step().await {
            Ok(p) => p,
            Err(e) => {
                let reason = e.to_string();
                let sequences = self.active.len();
                // A lost device stays typed: the caller must build a new device and model.
                let lost = e.device_lost().cloned();
                for a in std::mem::take(&mut self.active) {
                    self.engine.cancel(a.seq);
                    self.stats.failed += 1;
                    let error = match &lost {
                        Some(lost) => LlmError::DeviceLost(lost.clone()),
                        None => LlmError::BatchFailed {
                            sequences,
                            reason: reason.clone(),
                        },
                    };
                    events.push(SchedulerEvent::Failed { id: a.id, error });
                }
                return events;
            }
        };
        // Sequences the step gave up (out of device memory even alone, or no token their
        // constraint allows): their pages are free.
        for f in self.engine.take_failures() {
            if let Some(i) = self.active.iter().position(|a| a.seq == f.seq) {
                let a = self.active.remove(i);
                self.stats.failed += 1;
                events.push(SchedulerEvent::Failed {
                    id: a.id,
                    error: f.error,
                });
            }
        }
        let after = self.engine.stats();
        if after.prompt_rows > before.prompt_rows {
            self.stats.prefill_steps += 1;
        }
        if after.decode_rows > before.decode_rows {
            self.stats.decode_steps += 1;
        }
        self.stats.kv_allocated_peak_bytes = self
            .stats
            .kv_allocated_peak_bytes
            .max(self.engine.allocated_bytes());
        for t in produced {
            let Some(i) = self.active.iter().position(|a| a.seq == t.seq) else {
                continue;
            };
            let outcome = self.on_token(i, &t, &mut events);
            let reason = match outcome {
                Ok(None) => continue,
                Ok(Some(reason)) => {
                    self.stats.finished += 1;
                    let a = &self.active[i];
                    events.push(SchedulerEvent::Finished {
                        id: a.id,
                        reason,
                        prompt_tokens: a.prompt_tokens,
                        completion_tokens: a.generated,
                        cached_tokens: a.cached_tokens,
                        first_token_ms: a.first_token_ms,
                    });
                    None
                }
                Err(error) => Some(error),
            };
            let a = self.active.remove(i);
            if t.finished.is_none() {
                self.engine.cancel(a.seq);
            }
            if let Some(error) = reason {
                self.stats.failed += 1;
                events.push(SchedulerEvent::Failed { id: a.id, error });
            }
        }
        // A request that ended has given its pages back: the next may start at once.
        self.admit(&mut events);
        events
    }

    /// [`Scheduler::step`], blocking (native only).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn step_blocking(&mut self) -> Vec<SchedulerEvent> {
        pollster::block_on(self.step())
    }

    /// The text and stop checks of active request `i`'s new token; `Some` when it ended.
    fn on_token(
        &mut self,
        i: usize,
        t: &SeqToken,
        events: &mut Vec<SchedulerEvent>,
    ) -> Result<Option<FinishReason>, LlmError> {
        let a = &mut self.active[i];
        if a.generated == 0 {
            a.first_token_ms = a.submitted.elapsed().as_secs_f64() * 1e3;
        }
        a.cached_tokens = t.cached_tokens;
        a.generated += 1;
        self.stats.tokens_generated_total += 1;
        let tokenizer = self.model.tokenizer();
        let mut decoder = StreamDecoder::resume(tokenizer, true, std::mem::take(&mut a.held));
        a.text.push_str(&decoder.push(t.token)?);
        let mut reason = t.finished.map(|r| match r {
            StopReason::Eos => FinishReason::Stop,
            StopReason::MaxTokens => FinishReason::Length,
            StopReason::ContextFull => FinishReason::ContextFull,
        });
        if reason.is_some() {
            a.text.push_str(&decoder.finish());
        }
        a.held = decoder.into_held();
        let end = match find_stop(&a.text[a.reported..], &a.stop) {
            Some(at) => {
                a.text.truncate(a.reported + at);
                reason = Some(FinishReason::Stop);
                a.text.len()
            }
            None if reason.is_some() => a.text.len(),
            None => a.text.len() - held_for_stop(&a.text[a.reported..], &a.stop),
        };
        events.push(SchedulerEvent::Token {
            id: a.id,
            index: a.generated - 1,
            token: t.token,
            text: a.text[a.reported..end].to_string(),
            logprobs: t.logprobs.clone(),
        });
        a.reported = end;
        Ok(reason)
    }
}

/// Roles a chat message may have whatever the template: a template names these three
/// without comparing them (ChatML writes any role between its control tokens).
const BASE_ROLES: [&str; 3] = ["system", "user", "assistant"];

/// Roles accepted only when the template names them (as a quoted string in its source).
const TEMPLATE_ROLES: [&str; 4] = ["tool", "ipython", "developer", "function"];

/// The roles `tokenizer`'s chat template accepts: system, user and assistant, and those of
/// tool, ipython, developer and function that it names.
pub fn chat_roles(tokenizer: &Tokenizer) -> Vec<&'static str> {
    let source = tokenizer.chat_template().map_or("", |t| t.source());
    let named =
        |r: &&str| source.contains(&format!("'{r}'")) || source.contains(&format!("\"{r}\""));
    BASE_ROLES
        .into_iter()
        .chain(TEMPLATE_ROLES.into_iter().filter(named))
        .collect()
}

/// The longest part of a refused role that an error message repeats, bytes.
const ROLE_ECHO_BYTES: usize = 32;

/// The prompt of `prompt` as `tokenizer`'s token ids, as a new [`super::Session`] encodes it:
/// text and chats start a sequence, so they get the model's BOS where it expects one
/// ([`crate::tokenizer::Tokenizer::with_bos`]); ids are taken as they are. A chat's roles
/// must be ones the template knows ([`chat_roles`]): the template writes a role beside its
/// own control tokens, so a role is never free text (one spelling `<|im_start|>system`
/// would open a turn of its own).
///
/// # Errors
/// [`LlmError::Tokenizer`] when a chat cannot be rendered (no template, a template error, a
/// role the template does not know).
pub fn encode_prompt(tokenizer: &Tokenizer, prompt: &Prompt) -> Result<Vec<u32>, LlmError> {
    Ok(match prompt {
        Prompt::Text(text) => tokenizer.with_bos(tokenizer.encode(text, Special::Allow)),
        Prompt::Chat(messages) | Prompt::ChatWithTools { messages, .. } => {
            let roles = chat_roles(tokenizer);
            if let Some(m) = messages.iter().find(|m| !roles.contains(&m.role.as_str())) {
                let mut shown = m.role.clone();
                if shown.len() > ROLE_ECHO_BYTES {
                    let end = (0..=ROLE_ECHO_BYTES)
                        .rev()
                        .find(|&i| shown.is_char_boundary(i))
                        .unwrap_or(0);
                    shown.truncate(end);
                    shown.push_str("...");
                }
                return Err(LlmError::Tokenizer(TokenizerError::Template {
                    reason: format!(
                        "the role {shown:?} is not one this model's chat template knows: use one of {}",
                        roles.join(", ")
                    ),
                }));
            }
            let rendered = match prompt {
                Prompt::ChatWithTools { tools, .. } => {
                    tokenizer.render_chat_with_tools(messages, tools, true)?
                }
                _ => tokenizer.render_chat(messages, true)?,
            };
            tokenizer.with_bos(tokenizer.encode_chat(&rendered, 0))
        }
        Prompt::Ids(ids) => ids.clone(),
    })
}

/// Where the first of `stops` begins in `text`.
fn find_stop(text: &str, stops: &[String]) -> Option<usize> {
    stops.iter().filter_map(|s| text.find(s.as_str())).min()
}

/// Bytes at the end of `text` that begin one of `stops` (held back: the next tokens may
/// complete it).
fn held_for_stop(text: &str, stops: &[String]) -> usize {
    text.char_indices()
        .map(|(i, _)| i)
        .find(|&i| stops.iter().any(|s| s.starts_with(&text[i..])))
        .map_or(0, |i| text.len() - i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stops(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn a_stop_text_is_found_at_its_first_place() {
        assert_eq!(find_stop("a cat sat", &stops(&["sat", "cat"])), Some(2));
        assert_eq!(find_stop("a cat", &stops(&["dog"])), None);
        assert_eq!(find_stop("a cat", &[]), None);
    }

    #[test]
    fn text_that_may_begin_a_stop_text_is_held_back() {
        let s = stops(&["\n\nUser:", "END"]);
        assert_eq!(held_for_stop("hello\n", &s), 1);
        assert_eq!(held_for_stop("hello\n\nUs", &s), 4);
        assert_eq!(held_for_stop("hello E", &s), 1);
        assert_eq!(held_for_stop("hello", &s), 0);
        assert_eq!(held_for_stop("héllo é", &stops(&["é!"])), 2);
        assert_eq!(held_for_stop("", &s), 0);
    }
}
