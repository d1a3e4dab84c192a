//! The engine's life: building it over a model's weights, what it holds
//! ([`BatchEngine::stats`], [`BatchEngine::sequence_memory`]), and adding and cancelling
//! sequences.

use super::pages::Pages;
use super::{BatchEngine, BatchOptions, BatchStats, Seq, SeqId, SeqMemory};
use crate::gguf::Gguf;
use crate::graph::Bindings;
use crate::llm::graph::labels;
use crate::llm::sample::{LogitRules, Sampler};
use crate::llm::session::GenerateParams;
use crate::llm::{build_paged_graph, LlmError, Model};
use crate::memory::predictor::ShapePredictor;
use crate::runtime::{InferRequest, Network, NetworkOptions};

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
}
