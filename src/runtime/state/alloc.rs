//! Memory for the nodes' outputs: `realloc_if_needed` (the sizer decides, the storage
//! provides) and where a buffer comes from: the placeholder pool for network inputs and
//! outputs, the memory pool, or a buffer of the node's own.

use std::sync::Arc;

use super::{lock, Mem, RequestState};
use crate::graph::Position;
use crate::memory::pool::{PoolRequest, Storage};
use crate::memory::predictor::{Decision, MemoryLimits};
use crate::memory::AllocKind;
use crate::runtime::compile::{padded_bytes, Role};
use crate::runtime::RunError;
use crate::shape::{DType, Shape};

/// What one try of [`RequestState::obtain`] got: the memory, its capacity, and the bytes of a
/// fresh allocation (none when a pool record was reused).
type Attempt<B> = Result<(Mem<B>, u64, Option<u64>), String>;

impl<S: Storage + Clone> RequestState<S> {
    /// What the sizer may assume about memory: the storage's limits, with what this
    /// the state's own sized buffers hold counted once (the ledger adds its own).
    pub(super) fn limits(&self) -> MemoryLimits {
        let l = self.storage.limits();
        MemoryLimits {
            max_buffer_bytes: l.max_buffer_bytes,
            budget_bytes: l.budget_bytes,
            other_in_use_bytes: l
                .in_use_bytes
                .saturating_sub(self.sizer.ledger().total_reserved_bytes()),
        }
    }

    pub(super) fn count_allocation(&mut self, size_bytes: u64) {
        self.stats.allocations += 1;
        self.stats.bytes_allocated_total += size_bytes;
        if !self.first_iteration {
            self.stats.reallocations += 1;
        }
    }

    /// Network inputs and outputs are host-reachable (`io_kind`); the rest is `usm_device`.
    pub(super) fn kind_of(&self, k: usize) -> AllocKind {
        let node = &self.compiled.nodes[k];
        if node.is_output || matches!(node.role, Role::Input { state: None }) {
            self.compiled.io_kind
        } else {
            AllocKind::UsmDevice
        }
    }

    /// Gives node `k` a buffer of `size_bytes` (at least `needed_bytes`): from the pool or the
    /// storage. A preallocation that fails falls back to `needed_bytes`; when that fails too,
    /// the node is left without memory and the error names it.
    pub(super) fn obtain(
        &mut self,
        k: usize,
        size_bytes: u64,
        needed_bytes: u64,
        kind: AllocKind,
        dynamic: bool,
    ) -> Result<(), RunError> {
        let c = Arc::clone(&self.compiled);
        let node = &c.nodes[k];
        let label = &c.graph.node(node.id).label;
        // The old buffer is dead (this node recomputes its output), so it is released first:
        // the pool may then hand its record to someone else, and peak memory stays lower.
        self.release_slot(k);
        // Network inputs and outputs are placeholders: slots of the network's placeholder
        // pool, never shared with another node of the same inference. Host values are written
        // by the host before the submit (their writes land before every command of it), so
        // they must never share memory with a node that runs earlier in the same submit: they
        // own their buffers.
        let io = node.is_output || matches!(node.role, Role::Input { .. });
        let pooled = self.options.pool && !io && node.role != Role::HostValue;
        let placeholders = Arc::clone(&self.placeholders);
        let inference = self.inference;
        let mut attempt = |size: u64| -> Attempt<S::Buffer> {
            if io {
                let lease = lock(&placeholders).acquire(
                    &mut self.io_storage,
                    c.network_id,
                    inference,
                    size,
                    kind,
                    label,
                )?;
                let cap = lease.size_bytes;
                // A slot taken from the pool's free copies is no new allocation.
                Ok((Mem::Placeholder(lease), cap, Some(cap)))
            } else if pooled {
                let req = PoolRequest {
                    size_bytes: size,
                    kind,
                    network: c.network_id,
                    requester: Position(k as u32),
                    restrictions: &node.restrictions,
                    dynamic,
                };
                let view = self.pool.acquire(&req).map_err(|e| match e {
                    crate::memory::pool::PoolError::Allocate { source, .. } => source.to_string(),
                    other => other.to_string(),
                })?;
                let rec = self
                    .pool
                    .buffer(&view)
                    .map(|b| S::size_bytes(b))
                    .unwrap_or(size);
                let fresh = (!view.reused).then_some(rec);
                Ok((Mem::Pool(view), rec, fresh))
            } else {
                let buf = self
                    .storage
                    .allocate(size, kind, label)
                    .map_err(|e| e.to_string())?;
                let s = S::size_bytes(&buf);
                Ok((Mem::Own(buf), s, Some(s)))
            }
        };
        let result = match attempt(size_bytes) {
            Ok(r) => {
                if size_bytes > needed_bytes {
                    self.stats.preallocations += 1;
                }
                Ok(r)
            }
            Err(_) if size_bytes > needed_bytes => {
                self.stats.preallocation_fallbacks += 1;
                attempt(needed_bytes)
            }
            Err(e) => Err(e),
        };
        match result {
            Ok((mem, capacity, fresh)) => {
                if let Some(bytes) = fresh {
                    self.count_allocation(bytes);
                }
                let slot = &mut self.slots[k];
                slot.mem = mem;
                slot.capacity_bytes = capacity;
                slot.poison = true;
                Ok(())
            }
            Err(reason) => Err(RunError::OutOfMemory {
                node: label.clone(),
                requested_bytes: needed_bytes,
                reason,
            }),
        }
    }

    pub(super) fn release_slot(&mut self, k: usize) {
        let slot = &mut self.slots[k];
        match std::mem::replace(&mut slot.mem, Mem::None) {
            Mem::Pool(view) => {
                if let Ok(b) = self.pool.buffer(&view) {
                    self.freed.push(S::id(b));
                }
                self.pool
                    .release(self.compiled.network_id, Position(k as u32));
            }
            Mem::Own(b) => {
                self.freed.push(S::id(&b));
                drop(b);
            }
            Mem::Placeholder(lease) => {
                let freed = lock(&self.placeholders).release(&self.io_storage, lease);
                self.freed.extend(freed);
            }
            other => slot.mem = other,
        }
        if matches!(self.slots[k].mem, Mem::None) {
            self.slots[k].capacity_bytes = 0;
        }
    }

    /// `realloc_if_needed` for an ordinary node (step 3, docs/design.md): the sizer decides
    /// (reuse, predicted growth, reclaim), the storage provides.
    pub(super) fn realloc_if_needed(&mut self, k: usize, shape: &Shape) -> Result<(), RunError> {
        let c = Arc::clone(&self.compiled);
        let node = &c.nodes[k];
        if node.static_shape.is_some() && !matches!(self.slots[k].mem, Mem::None) {
            return Ok(()); // allocated at creation with its final size
        }
        let label = &c.graph.node(node.id).label;
        let needed = padded_bytes(shape, node.dtype)?.max(4);
        let limits = self.limits();
        let (d, size) = self.decide(label, shape, node.dtype, needed, &limits)?;
        let slot = &self.slots[k];
        if !d.reallocated && !matches!(slot.mem, Mem::None) && slot.capacity_bytes >= needed {
            self.stats.reuses += 1;
            if self.options.poison {
                self.slots[k].poison = true;
            }
            return Ok(());
        }
        // A reallocation as decided; or no buffer yet for a shape the ledger already holds
        // room for (a size-0 output, a sequence adopted from another request): exactly.
        let kind = self.kind_of(k);
        self.obtain(k, size, needed, kind, true)?;
        if d.reallocated && self.slots[k].capacity_bytes < d.reserved_bytes {
            // The decided size could not be had: the exact size was taken.
            self.sizer
                .correct(label, shape, d.needed_bytes, self.slots[k].capacity_bytes)?;
        }
        Ok(())
    }

    /// The sizer's `realloc_if_needed` for output `label` of `shape` under `limits`, and the
    /// bytes a new buffer for it takes: what the sizer reserved (whole 4-byte words, at least
    /// `needed_bytes`) when it decided to reallocate, else `needed_bytes`. Counts a reclaim
    /// and a prediction `can_preallocate` refused (the decision fell back to the need).
    ///
    /// # Errors
    /// [`RunError::Predictor`] from the sizer; [`RunError::Shape`] when the prediction's size
    /// overflows.
    pub(super) fn decide(
        &mut self,
        label: &str,
        shape: &Shape,
        dtype: DType,
        needed_bytes: u64,
        limits: &MemoryLimits,
    ) -> Result<(Decision, u64), RunError> {
        let d = self.sizer.realloc_if_needed(label, shape, dtype, limits)?;
        if d.reallocated
            && d.predicted
            && d.reserved_bytes == d.needed_bytes
            && d.prediction.size_bytes(dtype)? > d.needed_bytes
        {
            self.stats.preallocations_refused += 1;
        }
        let size = if d.reallocated {
            self.stats.reclaims += u64::from(d.reclaimed);
            d.reserved_bytes
                .div_ceil(4)
                .saturating_mul(4)
                .max(needed_bytes)
        } else {
            needed_bytes
        };
        Ok((d, size))
    }
}
