//! Running a step: the plan's rows as the paged graph's inputs, one forward pass, and each
//! finished row's token (chosen on the device, or sampled on the host from its logits).

use super::plan::{rows_of, smaller_plan};
use super::{BatchEngine, FailedSeq, SeqToken};
use crate::graph::ops::SampleRow;
use crate::llm::graph::labels;
use crate::llm::session::{sample_params, StopReason};
use crate::llm::LlmError;
use crate::shape::Shape;
use crate::tensor::HostTensor;

impl BatchEngine {
    /// One forward pass over the running sequences (see the module docs). Returns the token
    /// each sequence that reached the end of its prompt or decoded produced; finished
    /// sequences are removed and their pages freed. Empty when no sequence is waiting.
    ///
    /// When the device memory cannot hold the step's activations (the budget, or the
    /// driver), the step is tried again with fewer rows: prompt chunks are halved first,
    /// then the sequences admitted last sit the step out, one at a time. A sequence whose
    /// one row does not fit even alone is given up: it leaves the engine with its pages
    /// freed and its typed error goes to [`BatchEngine::take_failures`]; the step returns
    /// without tokens and the others run at the next one
    /// ([`BatchStats::steps_shrunk`](super::BatchStats::steps_shrunk),
    /// [`BatchStats::out_of_memory_failures`](super::BatchStats::out_of_memory_failures)).
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
