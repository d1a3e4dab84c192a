//! The KV-cache states of a session: the rows each holds, the bytes valid in its buffer, the
//! growth of this iteration (a larger buffer the past is copied into), and their hand-over
//! between requests. Device-free like the rest of the session; a padded-axis layout (a
//! `[batch, heads, capacity, head_dim]` cache) would change this file, not the executor.

use super::{Session, Storage};
use crate::memory::predictor::Sizer;
use crate::memory::AllocKind;
use crate::runtime::compile::padded_bytes;
use crate::runtime::RunError;
use crate::shape::Shape;
use std::sync::Arc;

/// One KV-cache state of a request.
pub(crate) struct StateSlot<B> {
    /// Holds the past rows; `None` before the first append.
    pub buffer: Option<B>,
    /// Rows' bytes valid in `buffer` (the past).
    pub valid_bytes: u64,
    /// Shape of the past tensor.
    pub shape: Shape,
    /// A larger buffer allocated this iteration; the past is copied into it in order.
    pub grown: Option<B>,
    /// Bytes this iteration appends.
    pub append_bytes: u64,
    /// Shape after this iteration.
    pub next_shape: Shape,
}

impl<B> StateSlot<B> {
    /// The buffer the state is in after this iteration.
    pub fn current(&self) -> Option<&B> {
        self.grown.as_ref().or(self.buffer.as_ref())
    }
}

/// One KV-cache tensor moving between requests: its buffer and the rows it holds.
pub(crate) struct MovedState<B> {
    pub buffer: Option<B>,
    pub valid_bytes: u64,
    pub shape: Shape,
}

impl<S: Storage + Clone> Session<S> {
    /// Rows currently held by each state.
    pub fn state_shapes(&self) -> Vec<Shape> {
        self.states.iter().map(|s| s.shape.clone()).collect()
    }

    /// Bytes reserved by the states' buffers (each at least its valid rows).
    pub fn state_reserved_bytes(&self) -> u64 {
        self.states
            .iter()
            .filter_map(|s| s.buffer.as_ref().map(S::size_bytes))
            .sum()
    }

    /// Takes the KV cache out with the sizer that sized it (the session then starts a new
    /// sequence, with a fresh sizer).
    pub fn take_states(&mut self) -> (Vec<MovedState<S::Buffer>>, Sizer) {
        let sizer = std::mem::replace(&mut self.sizer, Self::fresh_sizer(&self.options));
        let leaving: Vec<u64> = self
            .states
            .iter()
            .filter_map(|s| s.buffer.as_ref().map(S::id))
            .collect();
        self.freed.extend(leaving);
        let states = self
            .states
            .iter_mut()
            .map(|s| {
                let shape = s.shape.clone();
                if let Some(d) = s.shape.0.first_mut() {
                    *d = 0;
                }
                s.next_shape = s.shape.clone();
                MovedState {
                    buffer: s.buffer.take(),
                    valid_bytes: std::mem::take(&mut s.valid_bytes),
                    shape,
                }
            })
            .collect();
        (states, sizer)
    }

    /// Continues the sequence held in `states` (from [`Session::take_states`]). A session
    /// that has not sized anything yet adopts the sequence's `sizer` (its predictor history,
    /// ledger, summary and trace continue); one that has keeps its own and records the
    /// states' buffers in its ledger.
    ///
    /// # Errors
    /// [`RunError::BadState`] when the number of states or their row shapes differ; the
    /// session is unchanged then.
    pub fn put_states(
        &mut self,
        states: Vec<MovedState<S::Buffer>>,
        sizer: Sizer,
    ) -> Result<(), RunError> {
        let c = &self.compiled;
        let bad = |i: usize, reason: String| {
            let s = &c.states[i.min(c.states.len().saturating_sub(1))];
            RunError::BadState {
                past: c.graph.node(s.past).label.clone(),
                present: c.graph.node(s.present).label.clone(),
                reason,
            }
        };
        if states.len() != self.states.len() || self.states.is_empty() {
            return Err(bad(
                0,
                format!(
                    "{} states given, the network has {}",
                    states.len(),
                    self.states.len()
                ),
            ));
        }
        for (i, (given, mine)) in states.iter().zip(&self.states).enumerate() {
            if given.shape.dims().get(1..) != mine.shape.dims().get(1..) {
                return Err(bad(
                    i,
                    format!("rows of shape {} do not fit {}", given.shape, mine.shape),
                ));
            }
        }
        let replaced: Vec<u64> = self
            .states
            .iter()
            .filter_map(|s| s.buffer.as_ref().map(S::id))
            .collect();
        self.freed.extend(replaced);
        let adopt = self.sizer.summary().rows == 0;
        for (si, (given, mine)) in states.into_iter().zip(&mut self.states).enumerate() {
            if !adopt {
                let present = &c.graph.node(c.states[si].present).label;
                let capacity = given.buffer.as_ref().map_or(0, |b| S::size_bytes(b));
                self.sizer
                    .correct(present, &given.shape, given.valid_bytes, capacity)?;
            }
            mine.buffer = given.buffer;
            mine.valid_bytes = given.valid_bytes;
            mine.shape = given.shape;
            mine.next_shape = mine.shape.clone();
        }
        if adopt {
            self.sizer = sizer;
        }
        Ok(())
    }

    /// Forgets the states (a new sequence starts); their buffers are kept for reuse.
    pub fn reset_states(&mut self) {
        for s in &mut self.states {
            s.valid_bytes = 0;
            if let Some(d) = s.shape.0.first_mut() {
                *d = 0;
            }
            s.next_shape = s.shape.clone();
        }
    }

    /// `realloc_if_needed` for a state's in-place concat: room for `new_shape`, keeping the
    /// past. A larger buffer is taken from the storage; the past is copied into it in order.
    pub(super) fn realloc_state(
        &mut self,
        k: usize,
        s: usize,
        new_shape: &Shape,
    ) -> Result<(), RunError> {
        let c = Arc::clone(&self.compiled);
        let node = &c.nodes[k];
        let label = &c.graph.node(node.id).label;
        let needed = padded_bytes(new_shape, node.dtype)?.max(4);
        let st = &self.states[s];
        let capacity = st.buffer.as_ref().map_or(0, |b| S::size_bytes(b));
        let past_bytes = st.valid_bytes;
        self.states[s].append_bytes = needed.saturating_sub(past_bytes);
        self.states[s].next_shape = new_shape.clone();
        let limits = self.limits();
        let d = self
            .sizer
            .realloc_if_needed(label, new_shape, node.dtype, &limits)?;
        self.count_prediction(&d, node.dtype)?;
        if !d.reallocated && capacity >= needed {
            self.stats.reuses += 1;
            return Ok(());
        }
        let size = if d.reallocated {
            self.stats.reclaims += u64::from(d.reclaimed);
            d.reserved_bytes.div_ceil(4).saturating_mul(4).max(needed)
        } else {
            needed
        };
        let oom = |reason: String| RunError::OutOfMemory {
            node: label.clone(),
            requested_bytes: needed,
            reason,
        };
        let buf = match self.io_storage.allocate(size, AllocKind::UsmDevice, label) {
            Ok(b) => {
                if size > needed {
                    self.stats.preallocations += 1;
                }
                b
            }
            Err(_) if size > needed => {
                self.stats.preallocation_fallbacks += 1;
                let b = self
                    .io_storage
                    .allocate(needed, AllocKind::UsmDevice, label)
                    .map_err(|e| oom(e.to_string()))?;
                self.sizer
                    .correct(label, new_shape, d.needed_bytes, S::size_bytes(&b))?;
                b
            }
            Err(e) => return Err(oom(e.to_string())),
        };
        self.count_allocation(S::size_bytes(&buf));
        if self.states[s].buffer.is_some() {
            self.stats.state_growths += 1;
        }
        self.states[s].grown = Some(buf);
        Ok(())
    }
}
