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

use super::graph::labels;
use super::sample::{LogitRules, Sampler, TokenLogprobs};
use super::session::sample_params;
use super::session::{GenerateParams, StopReason};
use super::{build_paged_graph, LlmError, Model};
use crate::gguf::Gguf;
use crate::graph::ops::SampleRow;
use crate::graph::Bindings;
use crate::memory::predictor::ShapePredictor;
use crate::runtime::{HostRows, InferRequest, Network, NetworkOptions, RunOptions, StateRows};
use crate::shape::Shape;
use crate::tensor::HostTensor;
use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher;

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

/// A sequence's rows in host memory: the pages they came from by index in its page
/// tables, each with its rows written, and the rows packed layer by layer.
struct Offloaded {
    pages: Vec<PageRows>,
    host: HostRows,
}

/// Rows `0..rows` of page `index` of a sequence's page table (`local`: the sliding-window
/// layers' table).
#[derive(Clone, Copy)]
struct PageRows {
    index: usize,
    local: bool,
    rows: u64,
}

impl Seq {
    fn generated(&self) -> usize {
        self.tokens.len() - self.prompt
    }
}

/// The entry of a full page in the prefix index: what it holds, and where it sits in the
/// chain of pages from a sequence's start.
struct Indexed {
    /// Chained hash: of the partition for the first page, else of the previous page's hash;
    /// and of this page's tokens.
    hash: u64,
    /// The previous page's chained hash (the partition's for the first page).
    parent: u64,
    /// The partition ([`Request::cache_salt`](super::Request::cache_salt)).
    salt: u64,
    /// The page's tokens (`page_size` of them): a hash match is checked against them, so a
    /// collision never shares a page.
    tokens: Box<[u32]>,
}

/// Pages of the pools: who holds each page, and the **prefix index** of full pages, keyed by
/// chained per-page hashes (a page's key covers the whole prefix up to it through its
/// parent's hash, so the index holds each page's tokens once: host memory linear in the
/// tokens indexed). With `keep` (the prompt cache), a page whose last holder lets it go stays
/// in the index, *idle*, and is given to the next sequence whose prefix it continues; idle
/// pages are taken back, least recently used first, whenever a free page is needed.
struct Pages {
    page_size: usize,
    free: Vec<u32>,
    holders: Vec<u32>,
    /// Each page's entry in the index.
    index: Vec<Option<Indexed>>,
    /// Indexed pages by chained hash.
    by_hash: HashMap<u64, u32>,
    /// Idle pages by the time they became idle (oldest first), and each idle page's time.
    idle: BTreeMap<u64, u32>,
    idle_at: HashMap<u32, u64>,
    clock: u64,
    keep: bool,
    /// A random key per engine: hashes an attacker cannot precompute collisions for.
    hasher: RandomState,
}

impl Pages {
    fn new(total: u32, page_size: usize, keep: bool) -> Pages {
        Pages {
            page_size,
            free: (0..total).rev().collect(),
            holders: vec![0; total as usize],
            index: (0..total).map(|_| None).collect(),
            by_hash: HashMap::new(),
            idle: BTreeMap::new(),
            idle_at: HashMap::new(),
            clock: 0,
            keep,
            hasher: RandomState::new(),
        }
    }

    /// The chained hash of a page holding `tokens` after a page whose hash is `parent`.
    fn chain(&self, parent: u64, tokens: &[u32]) -> u64 {
        self.hasher.hash_one((parent, tokens))
    }

    /// The chain's start for partition `salt`.
    fn root(&self, salt: u64) -> u64 {
        self.hasher.hash_one(("dynrt prefix", salt))
    }

    /// Pages that can be had now: free, or idle in the cache.
    fn available(&self) -> usize {
        self.free.len() + self.idle.len()
    }

    /// Idle pages (in the cache, held by no sequence).
    fn cached(&self) -> usize {
        self.idle.len()
    }

    /// Bytes of host memory the index holds: its slots, the tokens its entries hold, the hash
    /// map and the idle lists.
    fn index_bytes(&self) -> usize {
        let tokens: usize = (self.index.iter().flatten())
            .map(|e| std::mem::size_of_val(&*e.tokens))
            .sum();
        self.index.len() * std::mem::size_of::<Option<Indexed>>()
            + tokens
            + self.by_hash.capacity() * 16
            + (self.idle.len() + self.idle_at.capacity()) * 24
    }

    /// A free page, held once; an idle page leaves the cache for it when none is free.
    fn take(&mut self) -> Option<u32> {
        let p = match self.free.pop() {
            Some(p) => p,
            None => {
                let (_, p) = self.idle.pop_first()?;
                self.idle_at.remove(&p);
                self.unindex(p);
                p
            }
        };
        self.holders[p as usize] = 1;
        Some(p)
    }

    fn unindex(&mut self, p: u32) {
        if let Some(e) = self.index[p as usize].take() {
            if self.by_hash.get(&e.hash) == Some(&p) {
                self.by_hash.remove(&e.hash);
            }
        }
    }

    /// Lets one holder of page `p` go: with no holder left it becomes idle (indexed, with the
    /// cache) or free.
    fn release(&mut self, p: u32) {
        let h = &mut self.holders[p as usize];
        *h = h.saturating_sub(1);
        if *h > 0 {
            return;
        }
        if self.keep && self.index[p as usize].is_some() {
            self.clock += 1;
            self.idle.insert(self.clock, p);
            self.idle_at.insert(p, self.clock);
        } else {
            self.unindex(p);
            self.free.push(p);
        }
    }

    /// The indexed pages that hold the start of `tokens` in partition `salt`, each held once
    /// more, leaving at least the last token to compute (its logits are needed); with their
    /// chained hashes and how many of them were idle.
    fn share(&mut self, tokens: &[u32], salt: u64) -> (Vec<u32>, Vec<u64>, usize) {
        let ps = self.page_size;
        let (mut pages, mut hashes, mut idle) = (Vec::new(), Vec::new(), 0);
        let mut parent = self.root(salt);
        while (pages.len() + 1) * ps < tokens.len() {
            let page = &tokens[pages.len() * ps..(pages.len() + 1) * ps];
            let hash = self.chain(parent, page);
            let Some(&p) = self.by_hash.get(&hash) else {
                break;
            };
            let same = self.index[p as usize]
                .as_ref()
                .is_some_and(|e| e.parent == parent && e.salt == salt && *e.tokens == *page);
            if !same {
                break;
            }
            if self.holders[p as usize] == 0 {
                if let Some(at) = self.idle_at.remove(&p) {
                    self.idle.remove(&at);
                }
                idle += 1;
            }
            self.holders[p as usize] += 1;
            pages.push(p);
            hashes.push(hash);
            parent = hash;
        }
        (pages, hashes, idle)
    }

    /// Indexes the pages of `tokens[..done]` that are full (in partition `salt`); `hashes`
    /// holds the chained hashes of the sequence's pages so far and grows with them.
    fn publish(
        &mut self,
        tokens: &[u32],
        pages: &[u32],
        done: usize,
        salt: u64,
        hashes: &mut Vec<u64>,
    ) {
        let ps = self.page_size;
        let full = (done / ps).min(pages.len());
        while hashes.len() < full {
            let i = hashes.len();
            let parent = match i {
                0 => self.root(salt),
                _ => hashes[i - 1],
            };
            hashes.push(self.chain(parent, &tokens[i * ps..(i + 1) * ps]));
        }
        for (i, &p) in pages.iter().enumerate().take(full) {
            let hash = hashes[i];
            if self.index[p as usize].is_some() || self.by_hash.contains_key(&hash) {
                continue;
            }
            let parent = match i {
                0 => self.root(salt),
                _ => hashes[i - 1],
            };
            self.by_hash.insert(hash, p);
            self.index[p as usize] = Some(Indexed {
                hash,
                parent,
                salt,
                tokens: tokens[i * ps..(i + 1) * ps].into(),
            });
        }
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

impl BatchEngine {
    /// An engine over `model`'s weights with pools of `options.pool_tokens` positions.
    ///
    /// # Errors
    /// [`LlmError::BadParameter`] for a page size of 0, pools of no page, a step of no row or
    /// a batch of 0; [`LlmError::Run`] when the paged network does not compile or its pools
    /// do not fit the device.
    pub fn new(model: &Model, options: BatchOptions) -> Result<BatchEngine, LlmError> {
        let bad = |name: &'static str, value: u64, reason: &'static str| LlmError::BadParameter {
            name,
            value: value.to_string(),
            reason,
        };
        if options.page_size == 0 {
            return Err(bad("page_size", 0, "a page holds at least one position"));
        }
        if options.pool_tokens == 0 {
            return Err(bad("pool_tokens", 0, "the pools hold at least one page"));
        }
        if options.step_tokens == 0 || options.max_batch == 0 {
            return Err(bad(
                "step_tokens",
                u64::from(options.step_tokens),
                "a step needs at least one row and max_batch at least one sequence",
            ));
        }
        if options.max_batch > options.step_tokens as usize {
            return Err(bad(
                "max_batch",
                options.max_batch as u64,
                "at most step_tokens: every running sequence needs a row",
            ));
        }
        let inner = &model.inner;
        let total = options.pool_tokens.div_ceil(options.page_size);
        let pool_rows = u64::from(total) * u64::from(options.page_size);
        let kv_row = u64::from(inner.config.kv_len()) * model.kv_elem_bytes();
        if pool_rows.saturating_mul(kv_row) > inner.max_binding {
            return Err(bad(
                "pool_tokens",
                pool_rows,
                "one layer's pool would exceed the device's largest storage binding",
            ));
        }
        let gguf = Gguf::parse((*inner.backing).as_ref())?;
        let lg = build_paged_graph(
            &gguf,
            &inner.backing,
            &inner.config,
            inner.options.format,
            inner.context,
            inner.max_binding,
            inner.kv_dtype,
            options.page_size,
        )?;
        // Sliding-window layers hold at most the window and a step's rows per sequence:
        // their pools are sized for max_batch such sequences.
        let window = inner.config.sliding_window as usize;
        let ps = options.page_size as usize;
        let swa_total = (inner.config.local_layers().next().is_some()).then(|| {
            let per_seq = (window + options.step_tokens as usize).div_ceil(ps) + 1;
            (per_seq * options.max_batch).min(total as usize) as u32
        });
        let mut fixed: Bindings = [(labels::POOL_ROWS.to_string(), pool_rows)]
            .into_iter()
            .collect();
        if let Some(n) = swa_total {
            fixed.insert(
                labels::POOL_ROWS_SWA.to_string(),
                u64::from(n) * u64::from(options.page_size),
            );
        }
        let network = inner.decode.compile_sharing(
            lg.graph,
            NetworkOptions {
                planner: false,
                fixed,
                states: lg.states,
                // The same rewrites as the donor's graph: their constants are the shared ones.
                fuse: inner.options.fuse,
                ..NetworkOptions::default()
            },
        )?;
        let request = InferRequest::new(&network, options.run)?;
        Ok(BatchEngine {
            model: model.clone(),
            network,
            request,
            options,
            // Prefix sharing, and so the prompt cache, is off for sliding-window models.
            pages: Pages::new(total, ps, swa_total.is_none()),
            swa: swa_total.map(|n| (Pages::new(n, ps, false), window)),
            seqs: Vec::new(),
            predictor: ShapePredictor::new(options.run.policy, options.run.predictor),
            next_id: 1,
            failed: Vec::new(),
            stats: BatchStats {
                pages_total: total,
                swa_pages_total: swa_total.unwrap_or(0),
                ..BatchStats::default()
            },
        })
    }

    /// The model.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The options.
    pub fn options(&self) -> &BatchOptions {
        &self.options
    }

    /// The compiled paged network.
    pub fn network(&self) -> &Network {
        &self.network
    }

    /// Bytes of KV memory the pools hold (all layers, keys and values; the sliding-window
    /// layers' pools are smaller).
    pub fn pool_bytes(&self) -> u64 {
        let [global, local] = self.page_bytes();
        global * u64::from(self.stats.pages_total) + local * u64::from(self.stats.swa_pages_total)
    }

    /// Bytes the pools hold once the first step allocated them (0 before).
    pub fn allocated_bytes(&self) -> u64 {
        if self.stats.steps > 0 {
            self.pool_bytes()
        } else {
            0
        }
    }

    /// Positions the pools hold per layer without a window: the longest a sequence may grow.
    pub fn pool_positions(&self) -> u64 {
        u64::from(self.stats.pages_total) * u64::from(self.options.page_size)
    }

    /// Bytes of one page: in the pools of all layers without a window (every layer of most
    /// models), and in those of all sliding-window layers.
    pub fn page_bytes(&self) -> [u64; 2] {
        let c = self.model.config();
        let per_layer = u64::from(self.options.page_size)
            * 2
            * u64::from(c.kv_len())
            * self.model.kv_elem_bytes();
        let local = c.local_layers().count() as u64;
        [
            per_layer * (u64::from(c.num_layers) - local),
            per_layer * local,
        ]
    }

    /// Counters and the pages in use now.
    pub fn stats(&self) -> BatchStats {
        let mut s = self.stats;
        let holders = &self.pages.holders;
        s.pages_used = holders.iter().filter(|&&h| h > 0).count() as u32;
        s.swa_pages_used = self.swa.as_ref().map_or(0, |(p, _)| {
            p.holders.iter().filter(|&&h| h > 0).count() as u32
        });
        s.shared_pages = holders.iter().filter(|&&h| h > 1).count() as u32;
        s.cached_pages = self.pages.cached() as u32;
        s.index_bytes = self.pages.index_bytes() as u64;
        s.running = self.seqs.len();
        // Positions written: each sequence's pages of its own, and every shared page once
        // (pages are shared only once full).
        let ps = self.options.page_size as u64;
        let own: u64 = (self.seqs.iter())
            .flat_map(|q| {
                (q.pages.iter().enumerate())
                    .filter(|(_, &p)| holders[p as usize] == 1)
                    .map(|(k, _)| (q.done as u64).saturating_sub(k as u64 * ps).min(ps))
            })
            .sum();
        s.positions_held = own + u64::from(s.shared_pages) * ps;
        let [global, local] = self.page_bytes();
        s.held_bytes = global * u64::from(s.pages_used) + local * u64::from(s.swa_pages_used);
        let window = self.swa.as_ref().map_or(0, |(_, w)| *w as u64);
        let in_window: u64 = (self.seqs.iter())
            .filter(|q| q.offloaded.is_none() && !q.pages.is_empty())
            .map(|q| (q.done as u64).min(window))
            .sum();
        s.needed_bytes = (s.positions_held * global + in_window * local) / ps;
        s.spare_pages = self.seqs.iter().map(|q| self.spare(q) as u32).sum();
        let offloaded = self.seqs.iter().filter_map(|q| q.offloaded.as_ref());
        (s.offloaded_sequences, s.offloaded_bytes) =
            offloaded.fold((0, 0), |(n, b), o| (n + 1, b + o.host.size_bytes()));
        s
    }

    /// Positions the pools can still give to new sequences: the free pages' positions less
    /// what the sequences held now will need for the tokens they already have (a prompt
    /// not computed yet, a token to append).
    pub fn uncommitted_positions(&self) -> u64 {
        let ps = self.options.page_size as u64;
        let spare: usize = self.seqs.iter().map(|q| self.spare(q)).sum();
        let free = (self.pages.available() + spare) as u64 * ps;
        let owed: u64 = self
            .seqs
            .iter()
            .map(|q| {
                let held = q.pages.len() as u64 * ps;
                (q.tokens.len() as u64 + 1).saturating_sub(held)
            })
            .sum();
        free.saturating_sub(owed)
    }

    /// Pages sequence `q` holds past those its tokens and the next one fill.
    fn spare(&self, q: &Seq) -> usize {
        let ps = self.options.page_size as usize;
        let need = (q.tokens.len() + 1).max(q.done + 1).div_ceil(ps);
        q.pages.len().saturating_sub(need)
    }

    /// What each sequence holds, in admission order.
    pub fn sequence_memory(&self) -> Vec<SeqMemory> {
        let holders = &self.pages.holders;
        (self.seqs.iter())
            .map(|q| SeqMemory {
                seq: q.id,
                tokens: q.tokens.len(),
                computed: q.done,
                pages: q.pages.len(),
                shared_pages: (q.pages.iter())
                    .filter(|&&p| holders[p as usize] > 1)
                    .count(),
                swa_pages: q.swa_pages.iter().flatten().count(),
                offloaded_bytes: q.offloaded.as_ref().map_or(0, |o| o.host.size_bytes()),
            })
            .collect()
    }

    /// Whether no sequence is running or waiting.
    pub fn is_idle(&self) -> bool {
        self.seqs.is_empty()
    }

    /// The sequences running or waiting, in admission order.
    pub fn sequences(&self) -> Vec<SeqId> {
        self.seqs.iter().map(|q| q.id).collect()
    }

    /// Adds a sequence that generates after `prompt` (token ids) with `params`. It starts at
    /// the next step that has room for it.
    ///
    /// # Errors
    /// [`LlmError::EmptyPrompt`], [`LlmError::UnknownToken`]; [`LlmError::ContextFull`] when
    /// the prompt and `max_tokens` exceed the context or the whole pool; the sampler's
    /// parameter errors.
    pub fn add(&mut self, prompt: &[u32], params: GenerateParams) -> Result<SeqId, LlmError> {
        self.add_with(prompt, params, LogitRules::default(), 0)
    }

    /// [`BatchEngine::add`] with `rules` on the logits (a bias, a structured-output
    /// constraint) and the prompt cache's partition `salt`: the sequence shares pages only
    /// with sequences of the same partition.
    ///
    /// # Errors
    /// As [`BatchEngine::add`].
    pub fn add_with(
        &mut self,
        prompt: &[u32],
        params: GenerateParams,
        rules: LogitRules,
        salt: u64,
    ) -> Result<SeqId, LlmError> {
        self.model.engine().gpu().check_alive()?;
        let config = self.model.config();
        if prompt.is_empty() {
            return Err(LlmError::EmptyPrompt);
        }
        if let Some(&id) = prompt.iter().find(|&&t| t >= config.vocab_size) {
            return Err(LlmError::UnknownToken {
                id,
                vocab_size: config.vocab_size,
            });
        }
        let pool = self.stats.pages_total as usize * self.options.page_size as usize;
        let limit = (self.model.context_len() as usize).min(pool);
        if prompt.len() + params.max_tokens.max(1) > limit {
            return Err(LlmError::ContextFull {
                past_tokens: 0,
                new_tokens: prompt.len() + params.max_tokens,
                context_len: limit as u32,
            });
        }
        let mut sampler = Sampler::with_rules(params.sampling, rules)?;
        sampler.observe(prompt);
        let id = self.next_id;
        self.next_id += 1;
        self.seqs.push(Seq {
            id,
            tokens: prompt.to_vec(),
            done: 0,
            prompt: prompt.len(),
            pages: Vec::new(),
            swa_pages: Vec::new(),
            params,
            sampler,
            salt,
            hashes: Vec::new(),
            reused: 0,
            last_run: 0,
            offloaded: None,
        });
        Ok(id)
    }

    /// Removes sequence `id` (running or waiting) and frees its pages at once. Returns
    /// whether it was there.
    pub fn cancel(&mut self, id: SeqId) -> bool {
        match self.seqs.iter().position(|q| q.id == id) {
            Some(i) => {
                let q = self.seqs.remove(i);
                self.predictor.forget(&q.id.to_string());
                self.free_pages(q.pages, q.swa_pages);
                true
            }
            None => false,
        }
    }

    /// Sequence `i` gives every page it holds back.
    fn give_back_pages(&mut self, i: usize) {
        let q = &mut self.seqs[i];
        let (pages, swa_pages) = (
            std::mem::take(&mut q.pages),
            std::mem::take(&mut q.swa_pages),
        );
        self.free_pages(pages, swa_pages);
    }

    /// Gives pages back: `pages` to the pools, `swa_pages` to the sliding-window pools.
    fn free_pages(&mut self, pages: Vec<u32>, swa_pages: Vec<Option<u32>>) {
        // Last page first: in the cache a page's successors then count as older than it and
        // are taken back before it (a page is reached only through its predecessors).
        for p in pages.into_iter().rev() {
            self.pages.release(p);
        }
        if let Some((swa, _)) = &mut self.swa {
            for p in swa_pages.into_iter().flatten() {
                swa.release(p);
            }
        }
    }

    /// Gives back sequence `i`'s sliding-window pages that no query from position `done` on
    /// sees (all their positions are older than the window).
    fn release_out_of_window(&mut self, i: usize) {
        let Some((swa, window)) = &mut self.swa else {
            return;
        };
        let ps = self.options.page_size as usize;
        let q = &mut self.seqs[i];
        let lowest = (q.done + 1).saturating_sub(*window);
        for (k, slot) in q.swa_pages.iter_mut().enumerate() {
            if (k + 1) * ps > lowest {
                break;
            }
            if let Some(p) = slot.take() {
                swa.release(p);
            }
        }
    }

    /// Gives sequence `i` the pages for positions `0..upto` (its sliding-window layers only
    /// those a query from position `done` on sees); `false` (nothing taken) when the pool
    /// has too few free pages.
    fn reserve(&mut self, i: usize, upto: usize) -> bool {
        self.reserve_in(i, upto, true)
    }

    /// [`BatchEngine::reserve`], in the pools of the layers without a window only unless
    /// `with_window`.
    fn reserve_in(&mut self, i: usize, upto: usize, with_window: bool) -> bool {
        let ps = self.options.page_size as usize;
        let q = &mut self.seqs[i];
        let need = upto.div_ceil(ps).saturating_sub(q.pages.len());
        let swa_from = q.swa_pages.len();
        let upto_swa = if with_window { upto } else { 0 };
        let lowest = self
            .swa
            .as_ref()
            .map_or(0, |(_, window)| (q.done + 1).saturating_sub(*window));
        let in_window = |k: usize| (k + 1) * ps > lowest;
        let need_swa = (swa_from..upto_swa.div_ceil(ps))
            .filter(|&k| in_window(k))
            .count();
        let swa_short = self
            .swa
            .as_ref()
            .is_some_and(|(swa, _)| need_swa > swa.free.len());
        if need > self.pages.available() || swa_short {
            return false;
        }
        for _ in 0..need {
            if let Some(p) = self.pages.take() {
                q.pages.push(p);
            }
        }
        if let Some((swa, _)) = &mut self.swa {
            for k in swa_from..upto_swa.div_ceil(ps) {
                q.swa_pages
                    .push(if in_window(k) { swa.take() } else { None });
            }
        }
        true
    }

    /// Like [`BatchEngine::reserve`]; when the pools are short, the spare pages of the
    /// sequences not in `plan` are given back first and the reservation tried again.
    fn reserve_or_trim(&mut self, i: usize, upto: usize, plan: &[(usize, usize, usize)]) -> bool {
        if self.reserve(i, upto) {
            return true;
        }
        let mut trimmed = false;
        for j in 0..self.seqs.len() {
            if j != i && !plan.iter().any(|&(k, _, _)| k == j) && self.spare(&self.seqs[j]) > 0 {
                let keep = self.seqs[j].pages.len() - self.spare(&self.seqs[j]);
                let q = &mut self.seqs[j];
                let swa_keep = keep.min(q.swa_pages.len());
                let (pages, swa) = (q.pages.split_off(keep), q.swa_pages.split_off(swa_keep));
                self.stats.spare_pages_reclaimed += pages.len() as u64;
                self.free_pages(pages, swa);
                trimmed = true;
            }
        }
        trimmed && self.reserve(i, upto)
    }

    /// Positions decoding sequence `i` should hold pages for when its next row needs
    /// `need`: what the preallocation policy predicts from the growth of its positions
    /// (recorded here, one shape per decode row, as the single-sequence cache records its
    /// rows), at most the tokens it may still reach; `need` when nothing is predicted.
    fn look_ahead(&mut self, i: usize, need: usize) -> usize {
        let ps = self.options.page_size as usize;
        let q = &self.seqs[i];
        let kv = u64::from(self.model.config().kv_len());
        let shape = Shape::new(vec![need as u64, kv]);
        let fits = need <= q.pages.len() * ps;
        let id = q.id.to_string();
        let most = (q.prompt + q.params.max_tokens)
            .min(self.model.context_len() as usize)
            .min(self.stats.pages_total as usize * ps);
        match self.predictor.predict_preallocation_shape(
            &id,
            &shape,
            8 * self.model.kv_elem_bytes() as u32,
            fits,
        ) {
            Ok((true, predicted)) => {
                let ahead = predicted.dims().first().copied().unwrap_or(0) as usize;
                ahead.min(most).max(need)
            }
            _ => need,
        }
    }

    /// The rows of `pages` of sequence `q`, in every layer's key and value states: the
    /// ranges its rows are copied from to the host and written back to (into the pages the
    /// sequence holds then). `None` when a page is not in its tables.
    fn row_ranges(&self, q: &Seq, pages: &[PageRows]) -> Option<Vec<StateRows>> {
        let ps = u64::from(self.options.page_size);
        let c = self.model.config();
        let mut ranges = Vec::new();
        for l in 0..c.num_layers {
            let local = c.is_local(l);
            for state in labels::states_of(l) {
                for r in pages.iter().filter(|r| r.local == local) {
                    let page = if local {
                        q.swa_pages.get(r.index).copied().flatten()?
                    } else {
                        *q.pages.get(r.index)?
                    };
                    ranges.push(StateRows {
                        state,
                        first: u64::from(page) * ps,
                        rows: r.rows,
                    });
                }
            }
        }
        Some(ranges)
    }

    /// Copies the rows sequence `i` wrote to host memory and gives its pages back; `false`
    /// (nothing changed) when the host memory cannot be had. A sequence whose rows are in
    /// host memory already (its restore failed) only gives its pages back.
    fn offload(&mut self, i: usize) -> bool {
        let ps = self.options.page_size as usize;
        let q = &self.seqs[i];
        if q.offloaded.is_some() {
            self.give_back_pages(i);
            return true;
        }
        let written = |k: usize| q.done.saturating_sub(k * ps).min(ps) as u64;
        let global = (0..q.pages.len()).map(|k| (k, false));
        let local = (q.swa_pages.iter().enumerate())
            .filter(|(_, p)| p.is_some())
            .map(|(k, _)| (k, true));
        let pages: Vec<PageRows> = global
            .chain(local)
            .map(|(index, local)| PageRows {
                index,
                local,
                rows: written(index),
            })
            .filter(|r| r.rows > 0)
            .collect();
        let Some(ranges) = self.row_ranges(q, &pages) else {
            return false;
        };
        let Ok(host) = self.request.rows_to_host(&ranges) else {
            return false;
        };
        self.seqs[i].offloaded = Some(Offloaded { pages, host });
        self.give_back_pages(i);
        self.stats.offloads += 1;
        let bytes = self.stats().offloaded_bytes;
        self.stats.offloaded_peak_bytes = self.stats.offloaded_peak_bytes.max(bytes);
        true
    }

    /// Writes the rows of sequence `i` that are in host memory into the pages it holds now.
    async fn restore(&mut self, i: usize) -> Result<(), LlmError> {
        let q = &self.seqs[i];
        let Some(off) = &q.offloaded else {
            return Ok(());
        };
        let ranges = self
            .row_ranges(q, &off.pages)
            .ok_or(LlmError::BadParameter {
                name: "pages",
                value: q.pages.len().to_string(),
                reason: "a restored sequence lacks a page it had offloaded",
            })?;
        self.request.rows_from_host(&off.host, &ranges).await?;
        self.seqs[i].offloaded = None;
        self.stats.restores += 1;
        Ok(())
    }

    /// Whether sequence `i`, whose prompt has not started, should wait for the full pages
    /// of its prompt's start that a sequence added before it computes (it then reads them
    /// instead of computing them too): one step for a shared system prompt, a whole prompt
    /// for a copy of it. Never with sliding-window layers (their pages are not shared).
    fn waits_for_shared_pages(&self, i: usize, running: usize) -> bool {
        let q = &self.seqs[i];
        if self.swa.is_some() || q.done > 0 || !q.pages.is_empty() {
            return false;
        }
        let ps = self.options.page_size as usize;
        // The one that came first computes (started or not); each later one waits.
        (0..i.min(running)).any(|j| {
            let o = &self.seqs[j];
            if o.done >= o.prompt {
                return false;
            }
            let common = (q.tokens.iter().zip(&o.tokens[..o.prompt]))
                .take_while(|(a, b)| a == b)
                .count();
            // Full pages both prompts start with, leaving `q` its last token to compute.
            let pages = common.min(q.tokens.len() - 1) / ps;
            pages > 0 && o.done < pages * ps
        })
    }

    /// Picks this step's rows: `(sequence index, first position, rows)` for each sequence
    /// that runs, decode rows first, then prompt chunks while rows are left. Sequences that
    /// cannot get their pages wait (taking other sequences' spare pages first); if none
    /// could run, the one run least recently gives its pages back (offloaded, or to be
    /// recomputed) and the choice is made again.
    fn plan(&mut self) -> Vec<(usize, usize, usize)> {
        // Sequences that gave their pages back in this call sit this step out.
        let mut given_back: Vec<usize> = Vec::new();
        // The pages ahead each decoding sequence's policy asks for (recorded once a step).
        let running = self.seqs.len().min(self.options.max_batch);
        let ahead: Vec<usize> = (0..running)
            .map(|i| {
                let q = &self.seqs[i];
                match q.tokens.len() - q.done {
                    1 => self.look_ahead(i, q.done + 1),
                    _ => 0,
                }
            })
            .collect();
        for _ in 0..=self.seqs.len() {
            let mut left = self.options.step_tokens as usize;
            let mut plan = Vec::new();
            let runs = |i: &usize| !given_back.contains(i);
            // Prompts not started take the full pages another sequence already computed.
            for i in 0..running {
                // Not with sliding-window layers: their pages of a shared start may be gone.
                // Not a sequence that gave its pages back in this call either: it would take
                // them back from the cache at once.
                if self.swa.is_none()
                    && !given_back.contains(&i)
                    && self.seqs[i].done == 0
                    && self.seqs[i].pages.is_empty()
                {
                    let q = &self.seqs[i];
                    let (shared, hashes, idle) = self.pages.share(&q.tokens, q.salt);
                    let ps = self.options.page_size as usize;
                    let n = shared.len() * ps;
                    self.stats.tokens_cached += (idle * ps) as u64;
                    self.stats.tokens_shared += ((shared.len() - idle) * ps) as u64;
                    let q = &mut self.seqs[i];
                    q.done = n;
                    q.pages = shared;
                    q.hashes = hashes;
                    q.reused = q.reused.max(n);
                }
            }
            for i in (0..running).filter(runs) {
                let q = &self.seqs[i];
                if q.tokens.len() - q.done == 1 && left > 0 {
                    let (at, ahead) = (q.done, ahead[i]);
                    if self.reserve_or_trim(i, at + 1, &plan) {
                        // Pages ahead only from those nobody else is owed, and only in the
                        // pools without a window (sized for the window, not for spares).
                        let ps = self.options.page_size as usize;
                        let extra = ahead.div_ceil(ps).saturating_sub(self.seqs[i].pages.len());
                        if extra > 0 && (extra * ps) as u64 <= self.uncommitted_positions() {
                            self.reserve_in(i, ahead, false);
                        }
                        plan.push((i, at, 1));
                        left -= 1;
                    }
                }
            }
            // The rows left are shared among the prompts, shortest first, each taking at
            // most an even share of what is left: a short prompt is read in the next step
            // whatever long prompts came before it, and a long one still gets every row the
            // others leave.
            let todo = |q: &Seq| q.tokens.len() - q.done;
            let mut prompts: Vec<usize> = (0..running)
                .filter(runs)
                .filter(|&i| todo(&self.seqs[i]) > 1 && !self.waits_for_shared_pages(i, running))
                .collect();
            prompts.sort_by_key(|&i| (todo(&self.seqs[i]), i));
            for (k, &i) in prompts.iter().enumerate() {
                if left == 0 {
                    break;
                }
                let share = (left / (prompts.len() - k)).max(1);
                let (at, n) = (self.seqs[i].done, todo(&self.seqs[i]).min(share));
                if self.reserve_or_trim(i, at + n, &plan) {
                    plan.push((i, at, n));
                    left -= n;
                }
            }
            if !plan.is_empty() || running == 0 {
                plan.sort_unstable();
                return plan;
            }
            // Nothing fits: the sequence run least recently (the last admitted of those) gives
            // its pages back, to the host when it can.
            let victim = (0..running)
                .filter(|i| !self.seqs[*i].pages.is_empty())
                .min_by_key(|&i| (self.seqs[i].last_run, std::cmp::Reverse(i)));
            let Some(last) = victim else {
                return plan;
            };
            given_back.push(last);
            if self.options.offload && self.offload(last) {
                continue;
            }
            let q = &mut self.seqs[last];
            q.done = 0;
            q.offloaded = None;
            self.give_back_pages(last);
            self.stats.preemptions += 1;
        }
        Vec::new()
    }

    /// One forward pass over the running sequences (see the module docs). Returns the token
    /// each sequence that reached the end of its prompt or decoded produced; finished
    /// sequences are removed and their pages freed. Empty when no sequence is waiting.
    ///
    /// When the device memory cannot hold the step's activations (the budget, or the
    /// driver), the step is tried again with fewer rows: prompt chunks are halved first,
    /// then the sequences admitted last sit the step out, one at a time. A sequence whose
    /// one row does not fit even alone is given up: it leaves the engine with its pages
    /// freed and its typed error goes to [`BatchEngine::take_failures`]; the step returns
    /// without tokens and the others run at the next one ([`BatchStats::steps_shrunk`],
    /// [`BatchStats::out_of_memory_failures`]).
    ///
    /// # Errors
    /// [`LlmError::Run`] from the device for anything but a lack of memory;
    /// [`LlmError::DeviceLost`] (or [`LlmError::Run`] carrying it) once the device is lost,
    /// at once on every later call.
    pub async fn step(&mut self) -> Result<Vec<SeqToken>, LlmError> {
        self.model.engine().gpu().check_alive()?;
        let mut plan = self.plan();
        loop {
            match self.run_plan(plan.clone()).await {
                Err(e) if is_out_of_memory(&e) => match smaller_plan(&plan) {
                    Some(fewer) => {
                        // The buffers sized for the rows that did not fit go first.
                        self.request.release_outputs();
                        log::info!(
                            "dynrt: a batched step of {} rows did not fit in device memory; trying {} ({e})",
                            rows_of(&plan),
                            rows_of(&fewer)
                        );
                        self.stats.steps_shrunk += 1;
                        plan = fewer;
                    }
                    None => {
                        self.request.release_outputs();
                        self.give_up(&plan, e);
                        return Ok(Vec::new());
                    }
                },
                result => return result,
            }
        }
    }

    /// The sequences given up since the last call, oldest first: each is gone from the
    /// engine, its pages free, with the error that made the step give it up (see
    /// [`BatchEngine::step`]; or a structured-output constraint that allowed no token of
    /// the row). A caller serving requests fails theirs with it.
    pub fn take_failures(&mut self) -> Vec<FailedSeq> {
        std::mem::take(&mut self.failed)
    }

    /// Gives up the one sequence of `plan` (one row that did not fit alone), with `error`.
    fn give_up(&mut self, plan: &[(usize, usize, usize)], error: LlmError) {
        let Some(&(i, _, _)) = plan.first() else {
            return;
        };
        let seq = self.seqs[i].id;
        log::warn!("dynrt: sequence {seq} cannot run in the device memory left: {error}");
        self.cancel(seq);
        self.stats.out_of_memory_failures += 1;
        self.failed.push(FailedSeq { seq, error });
    }

    /// Runs `plan` (from [`BatchEngine::plan`]) as one forward pass: see
    /// [`BatchEngine::step`].
    async fn run_plan(
        &mut self,
        plan: Vec<(usize, usize, usize)>,
    ) -> Result<Vec<SeqToken>, LlmError> {
        if plan.is_empty() {
            return Ok(Vec::new());
        }
        for &(i, _, _) in &plan {
            self.restore(i).await?;
        }
        let ps = self.options.page_size as usize;
        let per_seq = plan
            .iter()
            .map(|&(i, _, _)| self.seqs[i].pages.len())
            .max()
            .unwrap_or(1)
            .max(1);
        let (mut tokens, mut positions, mut slots, mut rows) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut pages = vec![0i32; plan.len() * per_seq];
        let mut pages_swa = vec![0i32; plan.len() * per_seq];
        let mut slots_swa = Vec::new();
        let mut logit_rows = Vec::new();
        let mut wants = Vec::new();
        for (n, &(i, at, count)) in plan.iter().enumerate() {
            let q = &self.seqs[i];
            for (k, &p) in q.pages.iter().enumerate() {
                pages[n * per_seq + k] = p as i32;
            }
            for (k, p) in q.swa_pages.iter().enumerate() {
                pages_swa[n * per_seq + k] = p.map_or(0, |p| p as i32);
            }
            for pos in at..at + count {
                tokens.push(q.tokens[pos] as i32);
                positions.push(pos as i32);
                slots.push((q.pages[pos / ps] as usize * ps + pos % ps) as i32);
                let swa_page = q.swa_pages.get(pos / ps).copied().flatten();
                slots_swa.push(swa_page.map_or(-1, |p| (p as usize * ps + pos % ps) as i32));
                rows.extend([n as i32, pos as i32]);
            }
            if at + count == q.tokens.len() {
                logit_rows.push(tokens.len() as i32 - 1);
                wants.push(i);
            }
        }
        if logit_rows.is_empty() {
            // Only prompt chunks that do not finish: one row's logits, unused.
            logit_rows.push(0);
        }
        // Each wanted row's token is chosen on the device unless its sequence needs the
        // logits on the host (penalties, log-probabilities, a bias, a constraint, or asked
        // for): then only token ids come back, unless a row needs its logits.
        let mut params = vec![SampleRow::greedy(); logit_rows.len()];
        let mut on_device = vec![false; wants.len()];
        for (r, &i) in wants.iter().enumerate() {
            let q = &self.seqs[i];
            if q.params.keep_logits || q.sampler.needs_logits() {
                continue;
            }
            // The draw's counter is the new token's position, as a session's.
            let step = u32::try_from(q.tokens.len()).unwrap_or(u32::MAX);
            if let Some(row) = q.params.sampling.device_row(step) {
                params[r] = row;
                on_device[r] = true;
            }
        }
        let host_rows = on_device.iter().any(|d| !d);
        let t = tokens.len() as u64;
        let shape = |d: &[u64]| Shape::new(d.to_vec());
        let table = shape(&[plan.len() as u64, per_seq as u64]);
        let mut inputs = vec![
            (labels::TOKENS, HostTensor::i32(shape(&[t]), &tokens)),
            (labels::POSITIONS, HostTensor::i32(shape(&[t]), &positions)),
            (labels::SLOTS, HostTensor::i32(shape(&[t]), &slots)),
            (labels::ROWS, HostTensor::i32(shape(&[t, 2]), &rows)),
            (labels::PAGES, HostTensor::i32(table.clone(), &pages)),
            (
                labels::LOGIT_ROWS,
                HostTensor::i32(shape(&[logit_rows.len() as u64]), &logit_rows),
            ),
        ];
        if self.swa.is_some() {
            inputs.push((labels::SLOTS_SWA, HostTensor::i32(shape(&[t]), &slots_swa)));
            inputs.push((labels::PAGES_SWA, HostTensor::i32(table, &pages_swa)));
        }
        inputs.push((labels::SAMPLE_PARAMS, sample_params(&params)));
        let given: Vec<(&str, &HostTensor)> = inputs.iter().map(|(l, t)| (*l, t)).collect();
        let wanted: &[&str] = match (host_rows, on_device.iter().any(|&d| d)) {
            (true, true) => &[labels::LOGITS, labels::NEXT_TOKEN],
            (true, false) => &[labels::LOGITS],
            (false, _) => &[labels::NEXT_TOKEN],
        };
        let mut out = self.request.infer(&given, wanted).await?.into_iter();
        let logits = if host_rows {
            out.next().map(|t| t.to_f32()).unwrap_or_default()
        } else {
            Vec::new()
        };
        let device_tokens: Vec<u32> = out
            .next()
            .map(|t| {
                t.bytes
                    .chunks_exact(4)
                    .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u32)
                    .collect()
            })
            .unwrap_or_default();
        let vocab = self.model.config().vocab_size as usize;
        if host_rows && logits.len() < wants.len() * vocab {
            return Err(LlmError::NoToken {
                reason: "the readback of the step's logits is shorter than its rows",
            });
        }
        if on_device.iter().any(|&d| d) && device_tokens.len() < wants.len() {
            return Err(LlmError::NoToken {
                reason: "the readback of the step's tokens is shorter than its rows",
            });
        }
        self.stats.steps += 1;
        self.stats.rows += t;
        self.stats.max_batch_seen = self.stats.max_batch_seen.max(plan.len());
        self.stats.last_sequences = plan.len();
        for &(i, at, count) in &plan {
            let decode =
                count == 1 && at + 1 == self.seqs[i].tokens.len() && at >= self.seqs[i].prompt;
            if decode {
                self.stats.decode_rows += 1;
            } else {
                self.stats.prompt_rows += count as u64;
            }
        }
        for &(i, at, count) in &plan {
            let q = &mut self.seqs[i];
            q.done = at + count;
            q.last_run = self.stats.steps;
            if self.swa.is_none() {
                // Generated tokens too: the next turn of a chat starts with them.
                self.pages
                    .publish(&q.tokens, &q.pages, q.done, q.salt, &mut q.hashes);
            }
            self.release_out_of_window(i);
        }
        let stop_ids = self.model.stop_ids().to_vec();
        let context = self.model.context_len() as usize;
        let mut produced = Vec::with_capacity(wants.len());
        let mut finished = Vec::new();
        for (r, &i) in wants.iter().enumerate() {
            let row = if on_device[r] {
                &[][..]
            } else {
                &logits[r * vocab..(r + 1) * vocab]
            };
            let q = &mut self.seqs[i];
            let chosen = if on_device[r] {
                self.stats.tokens_chosen_on_device += 1;
                Ok((device_tokens[r], None))
            } else {
                q.sampler.next(row).map(|s| (s.token, s.logprobs))
            };
            let (token, logprobs) = match chosen {
                Ok(s) => s,
                Err(e) => {
                    // This sequence alone fails: the others go on.
                    self.failed.push(FailedSeq {
                        seq: q.id,
                        error: e,
                    });
                    finished.push(q.id);
                    continue;
                }
            };
            q.tokens.push(token);
            let reason = if q.params.stop_at_eos && stop_ids.contains(&token) {
                Some(StopReason::Eos)
            } else if q.generated() >= q.params.max_tokens {
                Some(StopReason::MaxTokens)
            } else if q.tokens.len() >= context {
                Some(StopReason::ContextFull)
            } else {
                None
            };
            if reason.is_some() {
                finished.push(q.id);
            }
            produced.push(SeqToken {
                seq: q.id,
                token,
                finished: reason,
                logits: if q.params.keep_logits {
                    row.to_vec()
                } else {
                    Vec::new()
                },
                logprobs,
                cached_tokens: q.reused.min(q.prompt),
            });
        }
        for id in finished {
            self.cancel(id);
        }
        Ok(produced)
    }

    /// [`BatchEngine::step`], blocking (native).
    ///
    /// # Errors
    /// As [`BatchEngine::step`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn step_blocking(&mut self) -> Result<Vec<SeqToken>, LlmError> {
        pollster::block_on(self.step())
    }
}

/// Rows of a plan.
fn rows_of(plan: &[(usize, usize, usize)]) -> usize {
    plan.iter().map(|p| p.2).sum()
}

/// Whether `e` says the device memory (the engine's budget or the driver) could not hold an
/// allocation: the failures a smaller step may avoid.
fn is_out_of_memory(e: &LlmError) -> bool {
    use crate::gpu::AllocError;
    use crate::runtime::RunError;
    match e {
        LlmError::Run(RunError::OutOfMemory { .. }) => true,
        LlmError::Run(RunError::Alloc { cause, .. }) => matches!(
            cause,
            AllocError::OverBudget { .. } | AllocError::OutOfMemory { .. }
        ),
        _ => false,
    }
}

/// A plan of fewer rows than `plan`: the rows of prompt chunks beyond one per sequence
/// halved, or when every sequence has one row, without the one admitted last (plans are in
/// admission order). `None` for one sequence with one row.
fn smaller_plan(plan: &[(usize, usize, usize)]) -> Option<Vec<(usize, usize, usize)>> {
    let rows = rows_of(plan);
    if rows > plan.len() {
        let mut extra = (rows - plan.len()) / 2;
        let fewer = plan
            .iter()
            .map(|&(i, at, n)| {
                let keep = (n - 1).min(extra);
                extra -= keep;
                (i, at, 1 + keep)
            })
            .collect();
        return Some(fewer);
    }
    (plan.len() > 1).then(|| plan[..plan.len() - 1].to_vec())
}

#[cfg(test)]
mod tests {
    use super::{smaller_plan, Pages};

    #[test]
    fn smaller_plans_halve_prompt_chunks_then_leave_the_last_admitted_out() {
        // Two decode rows and a 30-row chunk: 29 rows beyond one each, 14 kept.
        let plan = vec![(0, 40, 1), (1, 9, 1), (2, 0, 30)];
        let p = smaller_plan(&plan).unwrap();
        assert_eq!(p, vec![(0, 40, 1), (1, 9, 1), (2, 0, 15)]);
        let mut p = p;
        let mut rows = vec![super::rows_of(&p)];
        while let Some(q) = smaller_plan(&p) {
            p = q;
            rows.push(super::rows_of(&p));
        }
        // 17 -> 10 -> 6 -> 4 -> 3 rows (one each), then the last admitted leaves, then the next.
        assert_eq!(rows, [17, 10, 6, 4, 3, 2, 1]);
        assert_eq!(p, vec![(0, 40, 1)]);
        // Every plan keeps each chunk's start: rows are cut from the end of a chunk.
        assert_eq!(smaller_plan(&[(3, 5, 1)]), None);
    }

    fn take(pages: &mut Pages, n: usize) -> Vec<u32> {
        (0..n).map(|_| pages.take().unwrap()).collect()
    }

    #[test]
    fn full_pages_are_shared_and_freed_with_their_last_holder() {
        let mut pages = Pages::new(8, 4, false);
        let a: Vec<u32> = (0..10).collect();
        let pa = take(&mut pages, 3);
        // Only the two full pages of the 10 computed tokens are shareable.
        let mut hashes = Vec::new();
        pages.publish(&a, &pa, 10, 0, &mut hashes);
        assert_eq!(pages.by_hash.len(), 2);
        assert_eq!(hashes.len(), 2);
        let mut b = a[..9].to_vec();
        b.push(99);
        let (shared, shared_hashes, idle) = pages.share(&b, 0);
        assert_eq!(shared, pa[..2]);
        assert_eq!(shared_hashes, hashes);
        assert_eq!(idle, 0);
        // A prompt of exactly two pages shares one: its last token is computed.
        assert_eq!(pages.share(&a[..8], 0).0, pa[..1]);
        // Another partition shares nothing.
        assert!(pages.share(&b, 1).0.is_empty());
        for p in pa.iter().chain(&shared).chain(&pa[..1]) {
            pages.release(*p);
        }
        // Without the cache, a page leaves the index with its last holder.
        assert_eq!(pages.free.len(), 8);
        assert!(pages.by_hash.is_empty());
        // A different first token shares nothing.
        let c: Vec<u32> = (1..11).collect();
        assert!(pages.share(&c, 0).0.is_empty());
    }

    #[test]
    fn the_cache_keeps_idle_pages_for_the_next_request_and_gives_the_oldest_back_first() {
        let mut pages = Pages::new(6, 4, true);
        // A chat turn of 12 tokens fills three pages; it ends and lets them go.
        let turn: Vec<u32> = (100..112).collect();
        let held = take(&mut pages, 3);
        pages.publish(&turn, &held, turn.len(), 7, &mut Vec::new());
        for &p in held.iter().rev() {
            pages.release(p);
        }
        assert_eq!(
            (pages.free.len(), pages.cached(), pages.available()),
            (3, 3, 6)
        );
        // The next turn starts with the whole first turn: it gets its three pages back.
        let mut next = turn.clone();
        next.extend([1, 2, 3]);
        let (got, _, idle) = pages.share(&next, 7);
        assert_eq!((got.as_slice(), idle), (held.as_slice(), 3));
        assert_eq!(pages.cached(), 0);
        // Another partition with the same tokens gets nothing.
        assert!(pages.share(&next, 8).0.is_empty());
        for &p in got.iter().rev() {
            pages.release(p);
        }
        // Short of free pages, idle ones are taken, the last page of the chain first (the
        // chain's start stays reachable).
        let fresh = take(&mut pages, 4);
        assert_eq!(fresh[3], held[2]);
        assert_eq!(pages.cached(), 2);
        let (got, _, _) = pages.share(&next, 7);
        assert_eq!(got, held[..2]);
        for &p in got.iter().chain(&fresh) {
            pages.release(p);
        }
        let all = take(&mut pages, 6);
        assert_eq!(all.len(), 6);
        assert!(pages.take().is_none());
        assert!(pages.by_hash.is_empty(), "a page taken leaves the index");
    }

    #[test]
    fn a_hash_match_with_other_tokens_is_not_shared() {
        let mut pages = Pages::new(4, 2, true);
        let a = [1, 2, 3, 4, 5];
        let held = take(&mut pages, 2);
        let mut hashes = Vec::new();
        pages.publish(&a, &held, 4, 0, &mut hashes);
        // Forge an entry: the hash of `a`'s first page pointing at a page with other tokens.
        if let Some(e) = pages.index[held[0] as usize].as_mut() {
            e.tokens = vec![9, 9].into();
        }
        assert!(pages.share(&a, 0).0.is_empty());
    }

    #[test]
    fn the_prefix_index_holds_each_token_once() {
        // A 32k-token prompt in pages of 16: the index grows linearly with the prompt (each
        // page's 16 tokens and a fixed entry), not with the square of it.
        let bytes_for = |tokens: usize| {
            let ps = 16;
            let n = tokens / ps;
            let mut pages = Pages::new(n as u32, ps, true);
            let prompt: Vec<u32> = (0..tokens as u32)
                .map(|t| t.wrapping_mul(2654435761) % 49152)
                .collect();
            let held = take(&mut pages, n);
            let mut hashes = Vec::new();
            // As the engine publishes: after every chunk of 128 tokens.
            for done in (128..=tokens).step_by(128) {
                pages.publish(&prompt, &held, done, 0, &mut hashes);
            }
            assert_eq!(pages.by_hash.len(), n);
            let (shared, _, _) = pages.share(&prompt, 0);
            assert_eq!(shared.len(), n - 1);
            pages.index_bytes()
        };
        let (small, large) = (bytes_for(8192), bytes_for(32768));
        let per_token = large as f64 / 32768.0;
        assert!(per_token < 16.0, "{large} bytes for 32768 tokens");
        let ratio = large as f64 / small as f64;
        assert!(
            (3.5..4.6).contains(&ratio),
            "4x the tokens, {ratio}x the bytes"
        );
    }
}
