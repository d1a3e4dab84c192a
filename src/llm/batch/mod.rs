//! Many sequences in one forward pass over a **paged KV cache** ([`BatchEngine`]).
//!
//! The engine compiles the model's paged graph ([`super::build_paged_graph`]) over the
//! weights its [`Model`] already holds on the device ([`Network::compile_sharing`]: nothing
//! is uploaded twice). Keys and values of every sequence live in one pool per layer, cut into
//! pages of [`BatchOptions::page_size`] positions; the pools are sized once, from
//! [`BatchOptions::pool_tokens`], and are the only KV memory the engine holds. A sequence owns
//! a list of pages (its page table); growing takes a free page and never moves a row.
//!
//! Each [`BatchEngine::step`] is one forward pass: one row for every sequence that is
//! decoding, then the prompts of the others in chunks, up to [`BatchOptions::step_tokens`]
//! rows in all (a long prompt never holds the decoding sequences back for more than one
//! chunk). The prompts share the rows left, shortest first and none taking more than an
//! even share of what is left, so a short prompt behind a long one is read in the next step;
//! a prompt that starts with the full pages another prompt is computing waits for them
//! instead of computing them twice. The rows' logits come back in one readback and each sequence samples its next
//! token with its own [`Sampler`]. A sequence whose prompt starts with the full pages of
//! another's (a shared system prompt) reads those pages instead of computing them again
//! ([`BatchStats::shared_pages`]): pages are shared only once full, so a shared page is never
//! written again.
//!
//! Sliding-window layers (Gemma 3's local layers) have pools of their own, sized for
//! [`BatchOptions::max_batch`] sequences of a window and a step each: a sequence gives such a
//! page back once every position in it is older than the window. Prefix sharing is off for
//! those models.
//!
//! A decoding sequence may hold pages ahead of its next token: the request's preallocation
//! policy ([`RunOptions::policy`], the shape predictor of the single-sequence KV cache)
//! decides how many from the growth of its positions, taken only from pages no other
//! sequence is owed, and given back as soon as another sequence needs them (*spare* pages,
//! [`BatchStats::spare_pages`]). Under [`Policy::None`](crate::memory::predictor::Policy)
//! a sequence holds exactly the pages its tokens fill.
//!
//! When the pool has no free page for a sequence the engine waits: sequences that cannot get
//! their pages sit the step out. If no sequence could run, the one scheduled least recently
//! (of those, the one admitted last) gives its pages back: with [`BatchOptions::offload`]
//! their rows are copied to host memory (a `usm_host` buffer, outside the device budget) and
//! written into fresh pages when the sequence runs again (*offload*); without it, or when
//! the host memory cannot be had, the sequence computes its tokens again later (*recompute*).
//! A request never fails for lack of KV memory as long as one sequence fits in the pool.
//! When the device memory cannot hold a step's activations, the step runs smaller instead
//! (see [`BatchEngine::step`]; docs/design.md, "Out of memory in a batched step").
//!
//! The code, by responsibility: `engine` (building the engine, adding and cancelling
//! sequences, what it holds), `pages` (the pools' pages, the prefix index and the prompt
//! cache; each sequence's page tables), `plan` (which rows a step runs, and smaller plans when
//! one does not fit), `offload` (rows to host memory and back) and `step` (running a plan:
//! the inputs, the forward pass, the tokens).

mod engine;
mod offload;
mod pages;
mod plan;
mod step;

use super::sample::{Sampler, TokenLogprobs};
use super::session::{GenerateParams, StopReason};
use super::{LlmError, Model};
use crate::memory::predictor::ShapePredictor;
use crate::runtime::{InferRequest, Network, RunOptions};
use offload::Offloaded;
use pages::Pages;

/// How a [`BatchEngine`] is laid out.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchOptions {
    /// Positions per page.
    pub page_size: u32,
    /// Positions the pools hold in all (rounded up to whole pages): the KV memory of the
    /// engine, `pool_tokens * kv_bytes_per_token` bytes ([`Model::kv_bytes_per_token`]).
    pub pool_tokens: u32,
    /// Most rows (tokens) one forward pass computes: decode rows first, prompt chunks in
    /// what is left.
    pub step_tokens: u32,
    /// Most sequences running at once (the others wait in the queue).
    pub max_batch: usize,
    /// Whether a sequence that must give its pages back has their rows copied to host
    /// memory and restored (`true`) rather than computed again (`false`).
    pub offload: bool,
    /// Options of the engine's inference request.
    pub run: RunOptions,
}

impl Default for BatchOptions {
    /// Pages of 16 positions, 4096 positions in the pools, 128 rows per step, 16 sequences,
    /// offload on.
    fn default() -> Self {
        BatchOptions {
            page_size: 16,
            pool_tokens: 4096,
            step_tokens: 128,
            max_batch: 16,
            offload: true,
            run: RunOptions::new(crate::memory::predictor::Policy::Adaptive),
        }
    }
}

/// A sequence's handle in a [`BatchEngine`].
pub type SeqId = u64;

/// A token a step produced for a sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct SeqToken {
    /// The sequence.
    pub seq: SeqId,
    /// The token.
    pub token: u32,
    /// Set when this is the sequence's last token (the sequence is then gone from the
    /// engine and its pages are free).
    pub finished: Option<StopReason>,
    /// The logits the token was chosen from, when the sequence's
    /// [`GenerateParams::keep_logits`] asks for them (else empty).
    pub logits: Vec<f32>,
    /// The token's log-probabilities, when the sequence's sampling asks for them
    /// ([`super::SamplingParams::logprobs`]).
    pub logprobs: Option<TokenLogprobs>,
    /// Prompt tokens the sequence read from shared or cached pages instead of computing
    /// them.
    pub cached_tokens: usize,
}

/// What an engine holds and has done.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// Pages of each pool.
    pub pages_total: u32,
    /// Pages held by sequences (a shared page once).
    pub pages_used: u32,
    /// Pages held by more than one sequence.
    pub shared_pages: u32,
    /// Positions the used pages hold (a shared page's once): `pages_used * page_size` minus
    /// this is the memory reserved and not yet written.
    pub positions_held: u64,
    /// Bytes of the pages the sequences hold (a shared page once; all layers).
    pub held_bytes: u64,
    /// Bytes the tokens the sequences hold fill: `held_bytes` less the unwritten ends of
    /// their pages (a sliding-window layer holds at most the window).
    pub needed_bytes: u64,
    /// Sequences running and waiting.
    pub running: usize,
    /// Forward passes run.
    pub steps: u64,
    /// Rows computed (decode rows and prompt tokens).
    pub rows: u64,
    /// Largest number of sequences one step computed rows for.
    pub max_batch_seen: usize,
    /// Pages of each sliding-window layer's pool (0 for a model without such layers).
    pub swa_pages_total: u32,
    /// Pages of the sliding-window layers' pools held now.
    pub swa_pages_used: u32,
    /// Sequences that gave their pages back to let others run (recomputed later).
    pub preemptions: u64,
    /// Prompt tokens not computed because their pages were shared with a running sequence.
    pub tokens_shared: u64,
    /// Prompt tokens not computed because their pages were in the prompt cache (idle pages
    /// of sequences that ended).
    pub tokens_cached: u64,
    /// Idle pages in the prompt cache (indexed, held by no sequence; taken back when a free
    /// page is needed). Not part of `pages_used`.
    pub cached_pages: u32,
    /// Bytes of host memory the prefix index holds.
    pub index_bytes: u64,
    /// Rows of prompts (prefill chunks and recomputation) computed.
    pub prompt_rows: u64,
    /// Decode rows computed.
    pub decode_rows: u64,
    /// Tokens chosen on the device (only their ids came back); the others were sampled on
    /// the host from their logits (penalties, log-probabilities, a bias, a constraint, or
    /// logits asked for).
    pub tokens_chosen_on_device: u64,
    /// Sequences the last step computed rows for.
    pub last_sequences: usize,
    /// Pages held ahead of the sequences' next rows by the preallocation policy (given
    /// back whenever another sequence needs them); part of `pages_used`.
    pub spare_pages: u32,
    /// Spare pages given back because another sequence needed them.
    pub spare_pages_reclaimed: u64,
    /// Sequences whose pages went to host memory (restored later).
    pub offloads: u64,
    /// Sequences whose rows came back from host memory.
    pub restores: u64,
    /// Sequences whose rows are in host memory now.
    pub offloaded_sequences: usize,
    /// Bytes of rows in host memory now.
    pub offloaded_bytes: u64,
    /// Largest `offloaded_bytes` seen.
    pub offloaded_peak_bytes: u64,
    /// Forward passes tried again with fewer rows because the device memory could not hold
    /// the step's activations ([`BatchEngine::step`]).
    pub steps_shrunk: u64,
    /// Sequences failed because even one row of theirs alone did not fit in the device
    /// memory ([`BatchEngine::take_failures`]).
    pub out_of_memory_failures: u64,
}

/// A sequence a [`BatchEngine::step`] had to give up: it is gone from the engine and its
/// pages are free ([`BatchEngine::take_failures`]).
#[derive(Debug)]
pub struct FailedSeq {
    /// The sequence.
    pub seq: SeqId,
    /// Why: [`LlmError::Run`] with the runtime's out-of-memory error naming what could not
    /// be allocated.
    pub error: LlmError,
}

/// What one sequence of a [`BatchEngine`] holds ([`BatchEngine::sequence_memory`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SeqMemory {
    /// The sequence.
    pub seq: SeqId,
    /// Tokens it has (prompt and generated).
    pub tokens: usize,
    /// Of those, tokens whose keys and values are computed (in its pages or offloaded).
    pub computed: usize,
    /// Pages it holds in the pools of the layers without a window.
    pub pages: usize,
    /// Of those, pages other sequences hold too.
    pub shared_pages: usize,
    /// Pages it holds in the sliding-window layers' pools.
    pub swa_pages: usize,
    /// Bytes of its rows in host memory (0 unless offloaded).
    pub offloaded_bytes: u64,
}

struct Seq {
    id: SeqId,
    /// Prompt and generated tokens.
    tokens: Vec<u32>,
    /// Tokens whose keys and values are in the pool (positions `0..done`).
    done: usize,
    /// Prompt length.
    prompt: usize,
    /// The page table.
    pages: Vec<u32>,
    /// The sliding-window layers' page table, by the same page index: `None` for pages
    /// given back once out of the window.
    swa_pages: Vec<Option<u32>>,
    params: GenerateParams,
    sampler: Sampler,
    /// The prompt cache's partition: pages are shared only within one.
    salt: u64,
    /// Chained hashes of its full pages ([`Pages::publish`]).
    hashes: Vec<u64>,
    /// Prompt tokens its first pages brought from other sequences or the cache.
    reused: usize,
    /// The step after which the sequence last computed rows (0: never).
    last_run: u64,
    /// Its rows in host memory while it holds no pages.
    offloaded: Option<Offloaded>,
}

impl Seq {
    fn generated(&self) -> usize {
        self.tokens.len() - self.prompt
    }
}

/// See the module docs.
pub struct BatchEngine {
    model: Model,
    network: Network,
    request: InferRequest,
    options: BatchOptions,
    pages: Pages,
    /// The sliding-window layers' pages and their window, for a model that has such layers.
    swa: Option<(Pages, usize)>,
    /// Running sequences in admission order, then the queue.
    seqs: Vec<Seq>,
    /// Predicts each decoding sequence's positions from their growth (ids: sequence ids).
    predictor: ShapePredictor,
    next_id: SeqId,
    stats: BatchStats,
    /// Sequences given up since the last [`BatchEngine::take_failures`].
    failed: Vec<FailedSeq>,
}

impl std::fmt::Debug for BatchEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchEngine")
            .field("options", &self.options)
            .field("stats", &self.stats())
            .finish()
    }
}
