//! The decode demo as a library: a GPT-2 style decoder with seeded weights prefills a prompt
//! and decodes greedily with a growing KV cache, checking its logits against the CPU reference.
//!
//! The graph is compiled twice from one upload of the weights ([`Network::specialize`]): a
//! prefill network with `seq = prompt length, past = 0` (every shape static: the whole
//! activation set is one planned arena) and a decode network with `seq = 1` (the projections
//! and the MLP static and planned; attention, whose shapes grow with the cache, goes through
//! the predictor and the pool). After the prefill the KV cache moves to the decode request
//! without a copy and the prefill request, with its arena, is freed.
//!
//! [`Demo::step`] runs one iteration (step 0 is the prefill) and reports what happened, so the
//! command line, the example and the browser page all drive the same loop:
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use dynrt::gpu::{Engine, Gpu, GpuOptions};
//! use dynrt::demo::{Demo, DemoConfig};
//! let engine = Engine::new(Gpu::new_blocking(GpuOptions::from_env()?)?);
//! let mut demo = Demo::new(&engine, DemoConfig::default())?;
//! while !demo.done() {
//!     let r = demo.step_blocking()?;
//!     println!("step {} token {} err {:?}", r.step, r.token, r.max_abs_err);
//! }
//! println!("{}", serde_json::to_string(&demo.summary())?);
//! # Ok(()) }
//! ```

pub mod decoder;

use self::decoder::{build_graph, labels, DecoderConfig, DecoderWeights};
use crate::gpu::Engine;
use crate::graph::Bindings;
use crate::graph::{reference, Graph};
use crate::memory::predictor::Policy;
use crate::memory::AllocKind;
use crate::rng::SplitMix64;
use crate::runtime::report::{
    BytesPerKind, CacheCounts, DemoSummary, MemoryTrace, PeakBytes, RegionReport, SizingCounts,
    TraceSample,
};
use crate::runtime::{
    HostTensor, InferRequest, Network, NetworkOptions, RunError, RunOptions, RunStats,
};
use crate::shape::Shape;
use web_time::Instant;

/// What to run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DemoConfig {
    /// The decoder (its `max_positions` is raised to `prompt_len + steps` when smaller).
    pub model: DecoderConfig,
    /// Prompt tokens (seeded from the model seed).
    pub prompt_len: u32,
    /// Tokens generated: the prefill produces the first, each decode step one more.
    pub steps: u32,
    /// Memory options of the request (policy, pool, poison).
    pub run: RunOptions,
    /// Pack static outputs with the planner (off: they come from the pool, largest first).
    pub planner: bool,
    /// Compare with the CPU reference every `check_every` steps (0: never; the reference
    /// still runs every step while checking is on, to keep its own KV cache).
    pub check_every: u32,
}

impl Default for DemoConfig {
    /// 2 layers, 4 heads, width 64, vocabulary 256, an 8-token prompt, 32 tokens, adaptive
    /// policy, checked every step.
    fn default() -> Self {
        DemoConfig {
            model: DecoderConfig::default(),
            prompt_len: 8,
            steps: 32,
            run: RunOptions::new(Policy::Adaptive),
            planner: true,
            check_every: 1,
        }
    }
}

/// What one step did.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StepReport {
    /// Step number (0 is the prefill).
    pub step: u32,
    /// The token chosen (greedy argmax of the last logits row).
    pub token: u32,
    /// Largest |GPU - CPU| over this step's logits, when checked.
    pub max_abs_err: Option<f32>,
    /// Bytes in use per kind after the step (indexed by [`AllocKind::index`]).
    pub bytes_in_use: BytesPerKind,
    /// Real allocations the request made this step (the prefill also counts the request's
    /// first ones: its arena and static buffers).
    pub reallocations: u32,
    /// Milliseconds this step took, readback and argmax included, the CPU check excluded.
    pub millis: f64,
}

/// The demo: a network, one request, the CPU reference and the report.
pub struct Demo {
    engine: Engine,
    config: DemoConfig,
    graph: Graph,
    decode_net: Network,
    /// The prefill request, until the prefill has run.
    prefill: Option<InferRequest>,
    /// The decode request, from the first decode step on.
    decode: Option<InferRequest>,
    /// Counters of the prefill request once it is gone.
    prefill_stats: RunStats,
    prompt: Vec<u32>,
    generated: Vec<u32>,
    /// CPU reference KV cache per state (row-major values) and rows.
    cpu_states: Vec<Vec<f32>>,
    state_labels: Vec<(String, String)>,
    trace: MemoryTrace,
    max_abs_err: f32,
    decode_millis: f64,
    prefill_millis: f64,
    last_allocs: u64,
    step: u32,
}

impl std::fmt::Debug for Demo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Demo")
            .field("config", &self.config)
            .field("step", &self.step)
            .finish()
    }
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// The prompt for a seed: `len` token ids below `vocab`.
pub fn prompt_tokens(seed: u64, len: u32, vocab: u32) -> Vec<u32> {
    let mut rng = SplitMix64::new(seed ^ 0x9E0D_7C0D_E000_0001);
    (0..len)
        .map(|_| rng.range(0, vocab.max(1) as u64) as u32)
        .collect()
}

impl Demo {
    /// Builds the decoder, compiles it for `engine` and creates the request.
    ///
    /// # Errors
    /// [`RunError::BadInput`] for an invalid configuration (zero prompt or steps, bad model
    /// sizes); compile and allocation errors of the runtime.
    pub fn new(engine: &Engine, config: DemoConfig) -> Result<Demo, RunError> {
        let mut config = config;
        let bad = |reason: String| RunError::BadInput {
            input: "demo configuration".into(),
            reason,
        };
        if config.prompt_len == 0 || config.steps == 0 {
            return Err(bad("prompt length and steps must be at least 1".into()));
        }
        let needed = config.prompt_len as u64 + config.steps as u64;
        if needed > u32::MAX as u64 {
            return Err(bad(format!(
                "prompt length + steps = {needed} is too large"
            )));
        }
        config.model.max_positions = config.model.max_positions.max(needed as u32);
        config.model.validate().map_err(|e| bad(e.to_string()))?;
        let weights = DecoderWeights::generate(&config.model);
        let dg = build_graph(&config.model, &weights)?;
        let graph = dg.graph.clone();
        let states = dg.state_bindings();
        let fixed = |pairs: &[(&str, u64)]| -> Bindings {
            pairs.iter().map(|&(k, v)| (k.to_string(), v)).collect()
        };
        let decode_net = Network::compile(
            engine,
            dg.graph,
            NetworkOptions {
                planner: config.planner,
                fixed: fixed(&[("seq", 1)]),
                states: states.clone(),
                ..NetworkOptions::default()
            },
        )?;
        let prefill_net = decode_net.specialize(NetworkOptions {
            planner: config.planner,
            fixed: fixed(&[("seq", config.prompt_len as u64), ("past", 0)]),
            states,
            ..NetworkOptions::default()
        })?;
        let prefill = InferRequest::new(&prefill_net, config.run)?;
        Ok(Demo {
            engine: engine.clone(),
            prompt: prompt_tokens(config.model.seed, config.prompt_len, config.model.vocab),
            cpu_states: vec![Vec::new(); dg.states.len()],
            state_labels: dg.states,
            config,
            graph,
            decode_net,
            prefill: Some(prefill),
            decode: None,
            prefill_stats: RunStats::default(),
            generated: Vec::new(),
            trace: MemoryTrace::default(),
            max_abs_err: 0.0,
            decode_millis: 0.0,
            prefill_millis: 0.0,
            last_allocs: 0,
            step: 0,
        })
    }

    /// Counters of the requests so far (prefill and decode together).
    pub fn stats(&self) -> RunStats {
        let live = self
            .prefill
            .iter()
            .chain(self.decode.iter())
            .fold(RunStats::default(), |acc, r| acc.merged(&r.stats()));
        live.merged(&self.prefill_stats)
    }

    /// Whether every token has been generated.
    pub fn done(&self) -> bool {
        self.generated.len() as u32 >= self.config.steps
    }

    /// The configuration (with `max_positions` as used).
    pub fn config(&self) -> &DemoConfig {
        &self.config
    }

    /// The prompt tokens.
    pub fn prompt(&self) -> &[u32] {
        &self.prompt
    }

    /// Tokens generated so far.
    pub fn tokens(&self) -> &[u32] {
        &self.generated
    }

    /// The request running the sequence now (decode once it started, else prefill).
    fn current(&self) -> Option<&InferRequest> {
        self.decode.as_ref().or(self.prefill.as_ref())
    }

    /// The sizer's decisions over the run (the decode request continues the prefill's).
    pub fn sizing(&self) -> SizingCounts {
        let s = self.current().map(|r| r.sizing()).unwrap_or_default();
        SizingCounts {
            rows: s.rows as u64,
            reallocations: s.reallocations,
            reclaims: s.reclaims,
            peak_reserved_bytes: s.peak_reserved_bytes,
            peak_needed_bytes: s.peak_needed_bytes,
        }
    }

    /// The run's shape trace (`id,dtype,shape` CSV of every sizing decision), when the
    /// configuration's [`RunOptions::trace`] is on: `dynrt-bench predict` replays it to the same
    /// [`Demo::sizing`] numbers.
    pub fn sizing_trace(&self) -> Option<&str> {
        self.current().and_then(|r| r.sizing_trace())
    }

    /// The memory trace so far, one sample per step.
    pub fn trace(&self) -> &MemoryTrace {
        &self.trace
    }

    /// Runs the next step: the prefill first, then one decode step per call.
    ///
    /// # Errors
    /// Runtime errors of the iteration; [`RunError::BadInput`] when called after
    /// [`Demo::done`].
    pub async fn step(&mut self) -> Result<StepReport, RunError> {
        if self.done() {
            return Err(RunError::BadInput {
                input: "demo".into(),
                reason: "all steps have run".into(),
            });
        }
        let step = self.step;
        let (tokens, start_pos): (Vec<u32>, u32) = if step == 0 {
            (self.prompt.clone(), 0)
        } else {
            let last = *self.generated.last().unwrap_or(&0);
            (vec![last], self.config.prompt_len + step - 1)
        };
        let seq = tokens.len() as u64;
        let tok_i: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let pos_i: Vec<i32> = (0..seq as u32).map(|i| (start_pos + i) as i32).collect();
        let tok_t = HostTensor::i32(Shape::new(vec![seq]), &tok_i);
        let pos_t = HostTensor::i32(Shape::new(vec![seq]), &pos_i);
        let t0 = Instant::now();
        if step > 0 && self.decode.is_none() {
            // The cache moves from the prefill request; its arena is freed with it.
            let mut decode = InferRequest::new(&self.decode_net, self.config.run)?;
            if let Some(mut prefill) = self.prefill.take() {
                decode.put_states(prefill.take_states())?;
                self.prefill_stats = prefill.stats();
            }
            self.decode = Some(decode);
        }
        let request = match (self.decode.as_mut(), self.prefill.as_mut()) {
            (Some(r), _) | (None, Some(r)) => r,
            (None, None) => {
                return Err(RunError::BadInput {
                    input: "demo".into(),
                    reason: "no request".into(),
                })
            }
        };
        let out = request
            .infer(
                &[(labels::TOKENS, &tok_t), (labels::POSITIONS, &pos_t)],
                &[labels::LOGITS],
            )
            .await?;
        let logits = out
            .into_iter()
            .next()
            .map(|t| t.to_f32())
            .unwrap_or_default();
        let vocab = self.config.model.vocab as usize;
        let last_row = logits
            .get(logits.len().saturating_sub(vocab)..)
            .unwrap_or(&[]);
        let token = argmax(last_row);
        let millis = t0.elapsed().as_secs_f64() * 1e3;
        if step == 0 {
            self.prefill_millis = millis;
        } else {
            self.decode_millis += millis;
        }
        self.generated.push(token);

        let max_abs_err = if self.config.check_every > 0 {
            let reference = self.cpu_step(&tok_i, &pos_i)?;
            let check = step % self.config.check_every == 0 || self.done();
            check.then(|| {
                reference
                    .iter()
                    .zip(&logits)
                    .map(|(a, b)| (a - b).abs())
                    .fold(
                        if reference.len() == logits.len() {
                            0.0
                        } else {
                            f32::INFINITY
                        },
                        f32::max,
                    )
            })
        } else {
            None
        };
        if let Some(e) = max_abs_err {
            // NaN must not hide behind max(): a NaN error is reported as such.
            self.max_abs_err = if e.is_nan() || self.max_abs_err.is_nan() {
                f32::NAN
            } else {
                self.max_abs_err.max(e)
            };
        }
        let stats = self.engine.stats();
        let mut bytes_in_use = [0u64; 4];
        for k in AllocKind::ALL {
            bytes_in_use[k.index()] = stats.current_bytes(k);
        }
        let allocs = self.stats().allocations;
        let reallocations = allocs.saturating_sub(self.last_allocs) as u32;
        self.last_allocs = allocs;
        let mut region_bytes = [0u64; 3];
        for (r, s) in region_bytes.iter_mut().zip(&stats.regions) {
            *r = s.current_bytes;
        }
        self.trace.samples.push(TraceSample {
            step,
            bytes_in_use,
            region_bytes,
            reallocations,
        });
        self.step += 1;
        Ok(StepReport {
            step,
            token,
            max_abs_err,
            bytes_in_use,
            reallocations,
            millis,
        })
    }

    /// One step of the CPU reference with its own KV cache; returns its logits.
    fn cpu_step(&mut self, tokens: &[i32], positions: &[i32]) -> Result<Vec<f32>, RunError> {
        let seq = tokens.len() as u64;
        let d = self.config.model.dim as u64;
        let mut inputs: Vec<(&str, Shape, Vec<f32>)> = vec![
            (
                labels::TOKENS,
                Shape::new(vec![seq]),
                tokens.iter().map(|&t| t as f32).collect(),
            ),
            (
                labels::POSITIONS,
                Shape::new(vec![seq]),
                positions.iter().map(|&t| t as f32).collect(),
            ),
        ];
        for (i, (past, _)) in self.state_labels.iter().enumerate() {
            let rows = self.cpu_states[i].len() as u64 / d.max(1);
            inputs.push((
                past.as_str(),
                Shape::new(vec![rows, d]),
                self.cpu_states[i].clone(),
            ));
        }
        let outs = reference::evaluate(&self.graph, &inputs)?;
        // Outputs: logits, then the presents in state order (as build_graph marks them).
        let mut it = outs.into_iter();
        let logits = it.next().map(|t| t.1).unwrap_or_default();
        for (i, t) in it.enumerate() {
            if let Some(s) = self.cpu_states.get_mut(i) {
                *s = t.1;
            }
        }
        Ok(logits)
    }

    /// The summary object of `dynrt demo --json`.
    pub fn summary(&self) -> DemoSummary {
        let info = self.engine.gpu().adapter_info();
        let stats = self.engine.stats();
        let mut peak = [0u64; 4];
        for k in AllocKind::ALL {
            peak[k.index()] = stats.peak_bytes(k);
        }
        let (hits, misses) = self.decode_net.pipeline_cache_counts();
        let rs = self.stats();
        let decode_steps = self.step.saturating_sub(1);
        let ms_per_step = if decode_steps > 0 {
            self.decode_millis / decode_steps as f64
        } else {
            self.prefill_millis
        };
        DemoSummary {
            adapter: info.name.clone(),
            backend: format!("{:?}", info.backend).to_lowercase(),
            policy: self.config.run.policy.name().to_string(),
            steps: self.generated.len() as u32,
            tokens: self.generated.clone(),
            max_abs_err: self.max_abs_err,
            allocations: stats.allocations_total(),
            reallocations: rs.reallocations,
            bytes_allocated_total: stats.bytes_allocated_total(),
            peak_bytes: PeakBytes::from_array(peak),
            pipeline_cache: CacheCounts { hits, misses },
            shape_updates_skipped: rs.shape_updates_skipped,
            ms_per_step,
            sizing: self.sizing(),
            regions: RegionReport::from_stats(&stats),
        }
    }

    /// [`Demo::step`], blocking (native only).
    ///
    /// # Errors
    /// As [`Demo::step`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn step_blocking(&mut self) -> Result<StepReport, RunError> {
        pollster::block_on(self.step())
    }
}
