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
//! chunk). The rows' logits come back in one readback and each sequence samples its next
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

use super::graph::labels;
use super::sample::Sampler;
use super::session::{GenerateParams, StopReason};
use super::{build_paged_graph, LlmError, Model};
use crate::gguf::Gguf;
use crate::graph::Bindings;
use crate::memory::predictor::ShapePredictor;
use crate::runtime::{HostRows, InferRequest, Network, NetworkOptions, RunOptions, StateRows};
use crate::shape::Shape;
use crate::tensor::HostTensor;
use std::collections::HashMap;

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
    /// Prompt tokens not computed because their pages were shared.
    pub tokens_shared: u64,
    /// Rows of prompts (prefill chunks and recomputation) computed.
    pub prompt_rows: u64,
    /// Decode rows computed.
    pub decode_rows: u64,
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

/// Pages of the pools: who holds each page, and the full pages a prompt prefix can share.
struct Pages {
    page_size: usize,
    free: Vec<u32>,
    holders: Vec<u32>,
    /// Full pages by the tokens from the sequence's start to the page's end.
    by_prefix: HashMap<Vec<u32>, u32>,
    /// The prefix key of each page registered in `by_prefix`.
    key_of: HashMap<u32, Vec<u32>>,
}

impl Pages {
    fn new(total: u32, page_size: usize) -> Pages {
        Pages {
            page_size,
            free: (0..total).rev().collect(),
            holders: vec![0; total as usize],
            by_prefix: HashMap::new(),
            key_of: HashMap::new(),
        }
    }

    fn take(&mut self) -> Option<u32> {
        let p = self.free.pop()?;
        self.holders[p as usize] = 1;
        Some(p)
    }

    fn release(&mut self, p: u32) {
        let h = &mut self.holders[p as usize];
        *h = h.saturating_sub(1);
        if *h == 0 {
            if let Some(key) = self.key_of.remove(&p) {
                self.by_prefix.remove(&key);
            }
            self.free.push(p);
        }
    }

    /// Full pages holding the start of `tokens` that another sequence computed, leaving at
    /// least the last token to compute (its logits are needed).
    fn share(&mut self, tokens: &[u32]) -> Vec<u32> {
        let mut pages = Vec::new();
        let ps = self.page_size;
        while (pages.len() + 1) * ps < tokens.len() {
            let Some(&p) = self.by_prefix.get(&tokens[..(pages.len() + 1) * ps]) else {
                break;
            };
            self.holders[p as usize] += 1;
            pages.push(p);
        }
        pages
    }

    /// Registers the pages of `tokens[..done]` that are full as shareable.
    fn publish(&mut self, tokens: &[u32], pages: &[u32], done: usize) {
        for (i, &p) in pages.iter().enumerate().take(done / self.page_size) {
            if self.key_of.contains_key(&p) {
                continue;
            }
            let key = tokens[..(i + 1) * self.page_size].to_vec();
            if !self.by_prefix.contains_key(&key) {
                self.by_prefix.insert(key.clone(), p);
                self.key_of.insert(p, key);
            }
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
            pages: Pages::new(total, ps),
            swa: swa_total.map(|n| (Pages::new(n, ps), window)),
            seqs: Vec::new(),
            predictor: ShapePredictor::new(options.run.policy, options.run.predictor),
            next_id: 1,
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
        let free = (self.pages.free.len() + spare) as u64 * ps;
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
        let sampler = Sampler::new(params.sampling)?;
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
        for p in pages {
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
        if need > self.pages.free.len() || swa_short {
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
                if self.swa.is_none() && self.seqs[i].done == 0 && self.seqs[i].pages.is_empty() {
                    let shared = self.pages.share(&self.seqs[i].tokens);
                    let n = shared.len() * self.options.page_size as usize;
                    self.stats.tokens_shared += n as u64;
                    self.seqs[i].done = n;
                    self.seqs[i].pages = shared;
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
            for i in (0..running).filter(runs) {
                let q = &self.seqs[i];
                let todo = q.tokens.len() - q.done;
                if todo > 1 && left > 0 {
                    let (at, n) = (q.done, todo.min(left));
                    if self.reserve_or_trim(i, at + n, &plan) {
                        plan.push((i, at, n));
                        left -= n;
                    }
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
    /// # Errors
    /// [`LlmError::Run`] from the device; a sequence in the pool cannot otherwise fail.
    pub async fn step(&mut self) -> Result<Vec<SeqToken>, LlmError> {
        let plan = self.plan();
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
        let given: Vec<(&str, &HostTensor)> = inputs.iter().map(|(l, t)| (*l, t)).collect();
        let out = self.request.infer(&given, &[labels::LOGITS]).await?;
        let logits = out
            .into_iter()
            .next()
            .map(|t| t.to_f32())
            .unwrap_or_default();
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
                self.pages
                    .publish(&q.tokens, &q.pages, q.done.min(q.prompt));
            }
            self.release_out_of_window(i);
        }
        let vocab = self.model.config().vocab_size as usize;
        let stop_ids = self.model.stop_ids().to_vec();
        let context = self.model.context_len() as usize;
        let mut produced = Vec::with_capacity(wants.len());
        let mut finished = Vec::new();
        for (r, &i) in wants.iter().enumerate() {
            let row = logits.get(r * vocab..(r + 1) * vocab).unwrap_or_default();
            let q = &mut self.seqs[i];
            let token = q.sampler.sample(row);
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

#[cfg(test)]
mod tests {
    use super::Pages;

    #[test]
    fn full_pages_are_shared_and_freed_with_their_last_holder() {
        let mut pages = Pages::new(8, 4);
        let a: Vec<u32> = (0..10).collect();
        let pa: Vec<u32> = (0..3).map(|_| pages.take().unwrap()).collect();
        // Only the two full pages of the 10 computed tokens are shareable.
        pages.publish(&a, &pa, 10);
        assert_eq!(pages.by_prefix.len(), 2);
        let mut b = a[..9].to_vec();
        b.push(99);
        let shared = pages.share(&b);
        assert_eq!(shared, pa[..2]);
        // A prompt of exactly two pages shares one: its last token is computed.
        assert_eq!(pages.share(&a[..8]), pa[..1]);
        for p in pa.iter().chain(&shared).chain(&pa[..1]) {
            pages.release(*p);
        }
        assert_eq!(pages.free.len(), 8);
        assert!(pages.by_prefix.is_empty());
        // A different first token shares nothing.
        let c: Vec<u32> = (1..11).collect();
        assert!(pages.share(&c).is_empty());
    }
}
