//! Many conversations of one model under one memory budget: a queue, admission by KV bytes,
//! and one step at a time, round-robin over the active requests.
//!
//! A [`Scheduler`] holds a [`Model`] and the requests given to it ([`Scheduler::submit`]).
//! A request waits in a FIFO queue until the KV bytes it may need (its prompt plus
//! `max_tokens`, capped at the context, times [`Model::kv_bytes_per_token`]) fit in the
//! budget next to what the active requests hold, and until fewer than
//! [`SchedulerOptions::max_active`] are active; then it gets a [`Session`] of its own.
//! [`Scheduler::step`] runs one forward pass of one active request, taking them in turn: a
//! chunk of its prompt ([`SchedulerOptions::prefill_chunk`] tokens, so that a long prompt
//! holds the others back for one chunk at most) or one decode step, and reports what came
//! out as [`SchedulerEvent`]s. [`Scheduler::cancel`] drops a request at any time: its
//! session and KV buffers are freed at once. A request is never started where it could run
//! the budget out, so a full server makes requests wait rather than fail.
//!
//! Every step runs one session's forward pass alone: the sessions share the weights but not
//! their passes, and each holds its own contiguous KV cache. A paged cache and one forward
//! pass with a batch dimension would take the place of the [`Session`] calls in
//! `Scheduler::advance` without changing this interface.

use super::sample::Sampler;
use super::session::{GenerateParams, Session};
use super::{LlmError, Model};
use crate::runtime::RunOptions;
use crate::tokenizer::{ChatMessage, Special, StreamDecoder};
use std::collections::VecDeque;
use web_time::Instant;

/// What a request continues.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Raw text (control tokens written in it are matched, as [`Session::generate`] does).
    Text(String),
    /// A chat, rendered with the model's template; message text stays plain text
    /// ([`crate::tokenizer::Tokenizer::encode_chat`]), as in [`Session::chat`].
    Chat(Vec<ChatMessage>),
    /// Token ids as they are.
    Ids(Vec<u32>),
}

/// One generation asked of a [`Scheduler`].
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// What to continue.
    pub prompt: Prompt,
    /// Tokens at most, sampling, stopping at the model's stop tokens.
    pub params: GenerateParams,
    /// Texts that end the generation when they appear in it; they are not part of the
    /// answer (OpenAI's `stop`).
    pub stop: Vec<String>,
}

impl Request {
    /// A request for `prompt` with `params` and no stop texts.
    pub fn new(prompt: Prompt, params: GenerateParams) -> Request {
        Request {
            prompt,
            params,
            stop: Vec::new(),
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
    /// Bytes of KV cache the active requests may hold together.
    pub budget_bytes: u64,
    /// Requests active at once at most (the others wait in the queue).
    pub max_active: usize,
    /// Prompt tokens fed in one step: the longest another request waits for a prompt.
    pub prefill_chunk: usize,
    /// The run options of every session.
    pub run: RunOptions,
}

impl SchedulerOptions {
    /// `budget_bytes` of KV cache, 8 requests at once, prompts in chunks of 128 tokens.
    pub fn new(budget_bytes: u64, run: RunOptions) -> SchedulerOptions {
        SchedulerOptions {
            budget_bytes,
            max_active: 8,
            prefill_chunk: 128,
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
    /// Requests with a session.
    pub active: usize,
    /// Requests waiting in the queue.
    pub queued: usize,
    /// The budget ([`SchedulerOptions::budget_bytes`]).
    pub budget_bytes: u64,
    /// KV bytes set aside for the active requests: the sum of their needs, never above the
    /// budget.
    pub kv_reserved_bytes: u64,
    /// KV bytes the active sessions' caches hold now ([`Session::kv_reserved_bytes`]): the
    /// rows so far plus the room the shape predictor reserved ahead, which can take a
    /// session past its need (admission counts the larger of the two).
    pub kv_allocated_bytes: u64,
    /// Largest sum, over the active requests, of the larger of need and allocation (what
    /// admission counted).
    pub kv_reserved_peak_bytes: u64,
    /// KV bytes the active sessions need for the tokens they hold
    /// ([`Session::kv_needed_bytes`]); `kv_allocated_bytes` minus this is room not used yet.
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
}

/// A request in the queue.
struct Queued {
    id: RequestId,
    ids: Vec<u32>,
    params: GenerateParams,
    stop: Vec<String>,
    need_bytes: u64,
    submitted: Instant,
}

/// A request with a session.
struct Active {
    id: RequestId,
    session: Session,
    ids: Vec<u32>,
    /// Prompt tokens fed so far.
    fed: usize,
    params: GenerateParams,
    stop: Vec<String>,
    sampler: Sampler,
    /// Bytes of an incomplete character, between two tokens.
    held: Vec<u8>,
    /// The answer's text so far, and how much of it was reported.
    text: String,
    reported: usize,
    generated: usize,
    /// The last token, fed at its next step.
    last: u32,
    need_bytes: u64,
    submitted: Instant,
    first_token_ms: f64,
}

impl Active {
    /// What admission counts for this request: its need, or its cache where that is more.
    fn held_bytes(&self) -> u64 {
        self.need_bytes.max(self.session.kv_reserved_bytes())
    }
}

/// Many requests of one model under a KV budget: a FIFO queue, admission by KV bytes, one
/// forward pass per [`Scheduler::step`], round-robin over the active requests.
pub struct Scheduler {
    model: Model,
    options: SchedulerOptions,
    queue: VecDeque<Queued>,
    active: VecDeque<Active>,
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
    /// as 1).
    pub fn new(model: Model, options: SchedulerOptions) -> Scheduler {
        let options = SchedulerOptions {
            max_active: options.max_active.max(1),
            prefill_chunk: options.prefill_chunk.max(1),
            ..options
        };
        Scheduler {
            model,
            options,
            queue: VecDeque::new(),
            active: VecDeque::new(),
            next_id: RequestId(1),
            stats: SchedulerStats {
                budget_bytes: options.budget_bytes,
                ..SchedulerStats::default()
            },
        }
    }

    /// The model.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The options.
    pub fn options(&self) -> &SchedulerOptions {
        &self.options
    }

    /// The prompt of `prompt` as the model's token ids, as a new [`Session`] encodes it:
    /// text and chats start a sequence, so they get the model's BOS where it expects one
    /// ([`crate::tokenizer::Tokenizer::with_bos`]); ids are taken as they are.
    ///
    /// # Errors
    /// [`LlmError::Tokenizer`] when a chat cannot be rendered (no template, a template
    /// error).
    pub fn encode(&self, prompt: &Prompt) -> Result<Vec<u32>, LlmError> {
        let tokenizer = self.model.tokenizer();
        Ok(match prompt {
            Prompt::Text(text) => tokenizer.with_bos(tokenizer.encode(text, Special::Allow)),
            Prompt::Chat(messages) => {
                let rendered = tokenizer.render_chat(messages, true)?;
                tokenizer.with_bos(tokenizer.encode_chat(&rendered, 0))
            }
            Prompt::Ids(ids) => ids.clone(),
        })
    }

    /// KV bytes a request with `prompt_tokens` and `max_tokens` may need: both together,
    /// capped at the context.
    pub fn need_bytes(&self, prompt_tokens: usize, max_tokens: usize) -> (usize, u64) {
        let tokens = prompt_tokens
            .saturating_add(max_tokens)
            .min(self.model.context_len() as usize);
        (tokens, tokens as u64 * self.model.kv_bytes_per_token())
    }

    /// Queues `request` and returns its number; it starts when the budget allows
    /// ([`Scheduler::step`] reports it).
    ///
    /// # Errors
    /// [`ScheduleError::Invalid`] for an empty prompt, a token outside the vocabulary, a
    /// prompt longer than the context, `max_tokens` 0 or bad sampling parameters;
    /// [`ScheduleError::OverBudget`] when the request could never be admitted.
    pub fn submit(&mut self, request: Request) -> Result<RequestId, ScheduleError> {
        let Request {
            prompt,
            params,
            stop,
        } = request;
        let ids = self.encode(&prompt)?;
        self.check(&ids, &params)?;
        let (tokens, need_bytes) = self.need_bytes(ids.len(), params.max_tokens);
        if need_bytes > self.options.budget_bytes {
            return Err(ScheduleError::OverBudget {
                tokens,
                need_bytes,
                budget_bytes: self.options.budget_bytes,
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
            need_bytes,
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

    /// Drops request `id`, queued or active: an active one's session and KV buffers are
    /// freed before this returns. False when no such request is pending (it ended, or never
    /// was).
    pub fn cancel(&mut self, id: RequestId) -> bool {
        if let Some(i) = self.queue.iter().position(|q| q.id == id) {
            self.queue.remove(i);
        } else if let Some(i) = self.active.iter().position(|a| a.id == id) {
            self.active.remove(i);
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

    /// The counters and gauges now.
    pub fn stats(&self) -> SchedulerStats {
        let mut s = self.stats;
        s.active = self.active.len();
        s.queued = self.queue.len();
        s.kv_reserved_bytes = self.active.iter().map(|a| a.need_bytes).sum();
        s.kv_allocated_bytes = self
            .active
            .iter()
            .map(|a| a.session.kv_reserved_bytes())
            .sum();
        s.kv_needed_bytes = self
            .active
            .iter()
            .map(|a| a.session.kv_needed_bytes())
            .sum();
        let engine = self.model.engine().stats();
        s.device_bytes = engine.device_current_bytes();
        s.device_peak_bytes = crate::memory::AllocKind::ALL
            .iter()
            .filter(|k| k.on_device())
            .map(|&k| engine.peak_bytes(k))
            .sum();
        s
    }

    fn reserved_bytes(&self) -> u64 {
        self.active.iter().map(Active::held_bytes).sum()
    }

    /// Starts queued requests, first come first served, while they fit.
    fn admit(&mut self, events: &mut Vec<SchedulerEvent>) {
        let mut reserved = self.reserved_bytes();
        while let Some(q) = self.queue.front() {
            if self.active.len() >= self.options.max_active
                || reserved.saturating_add(q.need_bytes) > self.options.budget_bytes
            {
                break;
            }
            let Some(q) = self.queue.pop_front() else {
                break;
            };
            reserved += q.need_bytes;
            let sampler = match Sampler::new(q.params.sampling) {
                Ok(s) => s,
                Err(error) => {
                    // Checked by `submit`; reported rather than trusted.
                    self.stats.failed += 1;
                    events.push(SchedulerEvent::Failed { id: q.id, error });
                    continue;
                }
            };
            events.push(SchedulerEvent::Started {
                id: q.id,
                prompt_tokens: q.ids.len(),
                queued_ms: q.submitted.elapsed().as_secs_f64() * 1e3,
            });
            self.active.push_back(Active {
                id: q.id,
                session: self.model.session(self.options.run),
                ids: q.ids,
                fed: 0,
                params: q.params,
                stop: q.stop,
                sampler,
                held: Vec::new(),
                text: String::new(),
                reported: 0,
                generated: 0,
                last: 0,
                need_bytes: q.need_bytes,
                submitted: q.submitted,
                first_token_ms: 0.0,
            });
        }
        self.stats.kv_reserved_peak_bytes = self.stats.kv_reserved_peak_bytes.max(reserved);
    }

    /// Starts what fits, then runs one forward pass of the next active request (a prompt
    /// chunk or a decode step) and returns what happened. Does nothing when idle.
    pub async fn step(&mut self) -> Vec<SchedulerEvent> {
        let mut events = Vec::new();
        self.admit(&mut events);
        let Some(mut a) = self.active.pop_front() else {
            return events;
        };
        let outcome = self.advance(&mut a, &mut events).await;
        let allocated = a.session.kv_reserved_bytes()
            + self
                .active
                .iter()
                .map(|o| o.session.kv_reserved_bytes())
                .sum::<u64>();
        self.stats.kv_allocated_peak_bytes = self.stats.kv_allocated_peak_bytes.max(allocated);
        match outcome {
            Ok(None) => self.active.push_back(a),
            Ok(Some(reason)) => {
                self.stats.finished += 1;
                events.push(SchedulerEvent::Finished {
                    id: a.id,
                    reason,
                    prompt_tokens: a.ids.len(),
                    completion_tokens: a.generated,
                    first_token_ms: a.first_token_ms,
                });
            }
            Err(error) => {
                self.stats.failed += 1;
                events.push(SchedulerEvent::Failed { id: a.id, error });
            }
        }
        // A request that ended has given its bytes back: the next may start at once.
        self.admit(&mut events);
        events
    }

    /// [`Scheduler::step`], blocking (native only).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn step_blocking(&mut self) -> Vec<SchedulerEvent> {
        pollster::block_on(self.step())
    }

    /// One forward pass of `a`; `Some` when it ended.
    async fn advance(
        &mut self,
        a: &mut Active,
        events: &mut Vec<SchedulerEvent>,
    ) -> Result<Option<FinishReason>, LlmError> {
        let logits = if a.fed < a.ids.len() {
            let end = (a.fed + self.options.prefill_chunk).min(a.ids.len());
            let logits = a.session.forward(&a.ids[a.fed..end]).await?;
            self.stats.prefill_steps += 1;
            self.stats.prompt_tokens_total += (end - a.fed) as u64;
            a.fed = end;
            if end < a.ids.len() {
                return Ok(None);
            }
            logits
        } else {
            self.stats.decode_steps += 1;
            a.session.forward(&[a.last]).await?
        };
        let token = a.sampler.sample(&logits);
        if a.generated == 0 {
            a.first_token_ms = a.submitted.elapsed().as_secs_f64() * 1e3;
        }
        a.generated += 1;
        a.last = token;
        self.stats.tokens_generated_total += 1;
        let tokenizer = self.model.tokenizer();
        let mut decoder = StreamDecoder::resume(tokenizer, true, std::mem::take(&mut a.held));
        a.text.push_str(&decoder.push(token)?);
        let context = self.model.context_len() as usize;
        let mut reason = if a.params.stop_at_eos && self.model.stop_ids().contains(&token) {
            Some(FinishReason::Stop)
        } else if a.generated >= a.params.max_tokens {
            Some(FinishReason::Length)
        } else if a.session.cached_tokens().len() >= context {
            Some(FinishReason::ContextFull)
        } else {
            None
        };
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
            token,
            text: a.text[a.reported..end].to_string(),
        });
        a.reported = end;
        Ok(reason)
    }
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
