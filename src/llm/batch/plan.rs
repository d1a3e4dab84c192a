//! Step planning: which rows a step runs (decode rows first, then prompt chunks; pages shared
//! or taken, or given back when nothing fits), and the smaller plans a step falls back to
//! when the device memory cannot hold its activations.

use super::{BatchEngine, Seq};
use crate::shape::Shape;

impl BatchEngine {
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
    pub(super) fn plan(&mut self) -> Vec<(usize, usize, usize)> {
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
}

/// Rows of a plan.
pub(super) fn rows_of(plan: &[(usize, usize, usize)]) -> usize {
    plan.iter().map(|p| p.2).sum()
}

/// A plan of fewer rows than `plan`: the rows of prompt chunks beyond one per sequence
/// halved, or when every sequence has one row, without the one admitted last (plans are in
/// admission order). `None` for one sequence with one row.
pub(super) fn smaller_plan(plan: &[(usize, usize, usize)]) -> Option<Vec<(usize, usize, usize)>> {
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
    use super::smaller_plan;

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
}
