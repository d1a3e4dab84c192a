//! A memory pool that shares buffers between nodes without memory dependencies.
//!
//! Follows the OpenVINO GPU plugin's memory pool (docs/design.md): the pool keeps records
//! `{buffer, kind, network, users}`. A request takes the smallest record at least as large as
//! asked, of the same network and kind, whose users are all outside the requester's restriction
//! set (its memory dependencies, from [`crate::graph::deps`]), adds the requester as a user and
//! returns a view; otherwise it allocates a new record. Releasing removes a user; a record left
//! without users is freed by dropping its buffer.
//!
//! The pool is generic over [`Storage`] so it runs on the host in tests ([`HostStorage`]) and
//! on the GPU engine in the runtime.

use crate::graph::ids::Position;
use crate::memory::kind::AllocKind;
use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::rc::Rc;

/// Where pooled buffers come from. Freeing is dropping the buffer: the GPU engine's handles
/// free themselves on drop, and so do [`HostBuffer`]s.
pub trait Storage {
    /// An owned allocation.
    type Buffer;
    /// Why an allocation failed.
    type Error: std::error::Error + 'static;
    /// Allocates `size_bytes` of `kind`; `label` names the buffer in debug tools.
    ///
    /// # Errors
    /// Whatever the storage reports (out of memory, over a device limit).
    fn allocate(
        &mut self,
        size_bytes: u64,
        kind: AllocKind,
        label: &str,
    ) -> Result<Self::Buffer, Self::Error>;
    /// The size of `buffer` in bytes.
    fn size_bytes(buffer: &Self::Buffer) -> u64;
    /// An identity of `buffer`, unique among the storage's live and past buffers (callers
    /// key caches by it and forget entries when the buffer is freed).
    fn id(buffer: &Self::Buffer) -> u64;
    /// What the storage has room for, for the can-preallocate rule
    /// ([`crate::memory::predictor::can_preallocate`]); unlimited by default.
    fn limits(&self) -> StorageLimits {
        StorageLimits::unlimited()
    }
    /// Counts `size_bytes` placed in (`placed`) or taken out of `region` as a range of a
    /// buffer several regions share (nothing by default).
    fn note_region(&self, region: crate::memory::regions::Region, size_bytes: u64, placed: bool) {
        let _ = (region, size_bytes, placed);
    }
    /// Copies `ranges` (`(source offset, destination offset, bytes)`) from `src` into `dst`
    /// now, in order after everything submitted before, and waits until they are done so
    /// `src` may be freed at once. `Ok(false)` (the default) when the storage does not copy:
    /// the caller then copies in its own work.
    ///
    /// # Errors
    /// Whatever the storage reports; nothing was copied then.
    fn copy_now(
        &mut self,
        src: &Self::Buffer,
        dst: &mut Self::Buffer,
        ranges: &[(u64, u64, u64)],
    ) -> Result<bool, Self::Error> {
        let _ = (src, dst, ranges);
        Ok(false)
    }
}

/// Limits of a [`Storage`]: its largest buffer, its budget and the bytes in use now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StorageLimits {
    /// Largest single buffer, bytes.
    pub max_buffer_bytes: u64,
    /// Budget, bytes.
    pub budget_bytes: u64,
    /// Bytes in use now (against the budget).
    pub in_use_bytes: u64,
}

impl StorageLimits {
    /// No limit, nothing in use.
    pub fn unlimited() -> Self {
        StorageLimits {
            max_buffer_bytes: u64::MAX,
            budget_bytes: u64::MAX,
            in_use_bytes: 0,
        }
    }
}

/// A network (a loaded graph); each has its own records, as each `cldnn::network` has its own
/// pool in the reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NetworkId(pub u32);

impl fmt::Display for NetworkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "net{}", self.0)
    }
}

/// Identifies one record of a pool for as long as the record lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecordId(pub u64);

/// One request for memory.
#[derive(Debug, Clone, Copy)]
pub struct PoolRequest<'a> {
    /// Bytes the requester needs.
    pub size_bytes: u64,
    /// Allocation kind; records are only shared within a kind.
    pub kind: AllocKind,
    /// Network the requester belongs to.
    pub network: NetworkId,
    /// The node whose output needs the memory; becomes a user of the record.
    pub requester: Position,
    /// Nodes whose memory the requester must not share (its memory dependencies).
    pub restrictions: &'a BTreeSet<Position>,
    /// A node with dynamic shapes: reuse a record only when the request fills more than the
    /// pool's utilisation threshold of it, so a small request does not pin a huge buffer.
    pub dynamic: bool,
}

/// What [`MemoryPool::acquire`] hands out: a byte range of one record's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolView {
    /// The record holding the buffer.
    pub record: RecordId,
    /// Offset of the view inside the buffer (always 0: a record is shared whole).
    pub offset_bytes: u64,
    /// Bytes requested (at most the record's size).
    pub size_bytes: u64,
    /// Whether the view reused an existing record.
    pub reused: bool,
}

/// Errors of the pool.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError<E: std::error::Error + 'static> {
    /// The storage failed to allocate a new record.
    #[error("allocating {size_bytes} bytes of {kind} for {requester} failed")]
    Allocate {
        /// Bytes asked for.
        size_bytes: u64,
        /// Kind asked for.
        kind: AllocKind,
        /// The requesting node.
        requester: Position,
        /// The storage's error.
        #[source]
        source: E,
    },
    /// A view names a record the pool no longer holds.
    #[error("record {0:?} is not in the pool (released already?)")]
    UnknownRecord(RecordId),
    /// The threshold is not in `[0, 1]`.
    #[error("utilisation threshold {0} is outside [0, 1]")]
    BadThreshold(f64),
}

struct Record<B> {
    buffer: B,
    size_bytes: u64,
    kind: AllocKind,
    network: NetworkId,
    users: BTreeMap<Position, u64>,
}

/// Counters of a pool, for reports and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolReport {
    /// Records held now.
    pub records: usize,
    /// Sum of the sizes of the records held now.
    pub bytes_reserved: u64,
    /// Sum of the sizes of the views handed out and not released.
    pub bytes_in_use: u64,
    /// Requests served by an existing record.
    pub reuse_hits: u64,
    /// Requests that allocated a new record.
    pub allocations: u64,
    /// Records freed (dropped) so far.
    pub frees: u64,
    /// Largest `bytes_reserved` seen.
    pub peak_bytes_reserved: u64,
}

/// The pool. Owns its records' buffers: dropping the pool frees them all.
pub struct MemoryPool<S: Storage> {
    storage: S,
    records: BTreeMap<RecordId, Record<S::Buffer>>,
    next_id: u64,
    threshold: f64,
    report: PoolReport,
}

impl<S: Storage> MemoryPool<S> {
    /// Default utilisation threshold for dynamic requests (docs/design.md).
    pub const DEFAULT_THRESHOLD: f64 = 0.5;

    /// An empty pool over `storage` with the default threshold.
    pub fn new(storage: S) -> Self {
        MemoryPool {
            storage,
            records: BTreeMap::new(),
            next_id: 0,
            threshold: Self::DEFAULT_THRESHOLD,
            report: PoolReport::default(),
        }
    }

    /// Sets the utilisation threshold for dynamic requests.
    ///
    /// # Errors
    /// [`PoolError::BadThreshold`] outside `[0, 1]` (or NaN).
    pub fn set_threshold(&mut self, threshold: f64) -> Result<(), PoolError<S::Error>> {
        if !(0.0..=1.0).contains(&threshold) {
            return Err(PoolError::BadThreshold(threshold));
        }
        self.threshold = threshold;
        Ok(())
    }

    /// The storage (for example to read its counters).
    pub fn storage(&self) -> &S {
        &self.storage
    }

    /// Serves `req`: reuses the smallest compatible record or allocates a new one.
    ///
    /// # Errors
    /// [`PoolError::Allocate`] when the storage fails.
    pub fn acquire(&mut self, req: &PoolRequest<'_>) -> Result<PoolView, PoolError<S::Error>> {
        let mut best: Option<(u64, RecordId)> = None;
        for (&id, r) in &self.records {
            if r.network != req.network || r.kind != req.kind || r.size_bytes < req.size_bytes {
                continue;
            }
            if r.users.contains_key(&req.requester) {
                continue;
            }
            if req.dynamic
                && r.size_bytes > 0
                && (req.size_bytes as f64 / r.size_bytes as f64) <= self.threshold
            {
                continue;
            }
            if r.users.keys().any(|u| req.restrictions.contains(u)) {
                continue;
            }
            if best.is_none_or(|(s, _)| r.size_bytes < s) {
                best = Some((r.size_bytes, id));
            }
        }
        if let Some((_, id)) = best {
            if let Some(r) = self.records.get_mut(&id) {
                r.users.insert(req.requester, req.size_bytes);
                self.report.reuse_hits += 1;
                self.report.bytes_in_use += req.size_bytes;
                return Ok(PoolView {
                    record: id,
                    offset_bytes: 0,
                    size_bytes: req.size_bytes,
                    reused: true,
                });
            }
        }
        let label = format!("{}:{}", req.network, req.requester);
        let buffer = self
            .storage
            .allocate(req.size_bytes, req.kind, &label)
            .map_err(|source| PoolError::Allocate {
                size_bytes: req.size_bytes,
                kind: req.kind,
                requester: req.requester,
                source,
            })?;
        let size_bytes = S::size_bytes(&buffer);
        let id = RecordId(self.next_id);
        self.next_id += 1;
        let mut users = BTreeMap::new();
        users.insert(req.requester, req.size_bytes);
        self.records.insert(
            id,
            Record {
                buffer,
                size_bytes,
                kind: req.kind,
                network: req.network,
                users,
            },
        );
        self.report.allocations += 1;
        self.report.bytes_in_use += req.size_bytes;
        self.report.bytes_reserved += size_bytes;
        self.report.peak_bytes_reserved = self
            .report
            .peak_bytes_reserved
            .max(self.report.bytes_reserved);
        Ok(PoolView {
            record: id,
            offset_bytes: 0,
            size_bytes: req.size_bytes,
            reused: false,
        })
    }

    /// Removes `requester` (of `network`) from every record it uses; records left without
    /// users are freed. Returns the bytes freed.
    pub fn release(&mut self, network: NetworkId, requester: Position) -> u64 {
        let mut freed = Vec::new();
        for (&id, r) in self.records.iter_mut() {
            if r.network != network {
                continue;
            }
            if let Some(sz) = r.users.remove(&requester) {
                self.report.bytes_in_use -= sz;
                if r.users.is_empty() {
                    freed.push(id);
                }
            }
        }
        self.free_records(&freed)
    }

    /// Drops every record of `network` (its users are forgotten). Returns the bytes freed.
    pub fn clear_network(&mut self, network: NetworkId) -> u64 {
        let ids: Vec<RecordId> = self
            .records
            .iter()
            .filter(|(_, r)| r.network == network)
            .map(|(&id, _)| id)
            .collect();
        for id in &ids {
            if let Some(r) = self.records.get(id) {
                self.report.bytes_in_use -= r.users.values().sum::<u64>();
            }
        }
        self.free_records(&ids)
    }

    fn free_records(&mut self, ids: &[RecordId]) -> u64 {
        let mut bytes = 0;
        for id in ids {
            if let Some(r) = self.records.remove(id) {
                bytes += r.size_bytes;
                self.report.bytes_reserved -= r.size_bytes;
                self.report.frees += 1;
                drop(r.buffer);
            }
        }
        bytes
    }

    /// The buffer behind `view`.
    ///
    /// # Errors
    /// [`PoolError::UnknownRecord`] when the record was freed.
    pub fn buffer(&self, view: &PoolView) -> Result<&S::Buffer, PoolError<S::Error>> {
        self.records
            .get(&view.record)
            .map(|r| &r.buffer)
            .ok_or(PoolError::UnknownRecord(view.record))
    }

    /// The users of a record, ascending (empty when the record is gone).
    pub fn users(&self, record: RecordId) -> Vec<Position> {
        self.records
            .get(&record)
            .map(|r| r.users.keys().copied().collect())
            .unwrap_or_default()
    }

    /// Current counters.
    pub fn report(&self) -> PoolReport {
        PoolReport {
            records: self.records.len(),
            ..self.report
        }
    }

    /// One line per record: id, network, kind, size, users (for debugging dumps).
    pub fn dump(&self) -> String {
        let mut s = String::new();
        for (id, r) in &self.records {
            let users: Vec<String> = r.users.keys().map(|u| u.to_string()).collect();
            s.push_str(&format!(
                "record {} {} {} {} bytes users [{}]\n",
                id.0,
                r.network,
                r.kind,
                r.size_bytes,
                users.join(" ")
            ));
        }
        s
    }
}

/// Build-time allocation: serves `requests` in descending order of size (as the reference
/// creates `primitive_inst`s, for better reuse), returning the views in the order of
/// `requests`.
///
/// # Errors
/// The first [`PoolError`] met; views acquired before it stay in the pool.
pub fn acquire_descending<S: Storage>(
    pool: &mut MemoryPool<S>,
    requests: &[PoolRequest<'_>],
) -> Result<Vec<PoolView>, PoolError<S::Error>> {
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by(|&a, &b| {
        requests[b]
            .size_bytes
            .cmp(&requests[a].size_bytes)
            .then(a.cmp(&b))
    });
    let mut views = vec![None; requests.len()];
    for i in order {
        views[i] = Some(pool.acquire(&requests[i])?);
    }
    Ok(views.into_iter().flatten().collect())
}

/// Host storage error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HostStorageError {
    /// The allocation would exceed the budget.
    #[error("allocating {requested_bytes} bytes would exceed the host budget of {budget_bytes} bytes ({in_use_bytes} in use)")]
    OverBudget {
        /// Bytes asked for.
        requested_bytes: u64,
        /// The budget.
        budget_bytes: u64,
        /// Bytes allocated now.
        in_use_bytes: u64,
    },
    /// A copy range lies outside a buffer.
    #[error("a copy of {size_bytes} bytes at offset {offset_bytes} lies outside its buffer")]
    OutOfRange {
        /// The larger of the range's offsets.
        offset_bytes: u64,
        /// Its size.
        size_bytes: u64,
    },
}

/// `Vec<u8>`-backed storage for tests and host runs; counts the bytes its live buffers hold.
#[derive(Debug, Clone, Default)]
pub struct HostStorage {
    in_use: Rc<Cell<u64>>,
    budget_bytes: Option<u64>,
}

/// A host allocation; gives its bytes back to the [`HostStorage`] counter when dropped.
#[derive(Debug)]
pub struct HostBuffer {
    /// The bytes.
    pub data: Vec<u8>,
    id: u64,
    in_use: Rc<Cell<u64>>,
}

static NEXT_HOST_BUFFER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl Drop for HostBuffer {
    fn drop(&mut self) {
        self.in_use.set(self.in_use.get() - self.data.len() as u64);
    }
}

impl HostStorage {
    /// Unlimited host storage.
    pub fn new() -> Self {
        Self::default()
    }

    /// Host storage that refuses to hold more than `budget_bytes` at once.
    pub fn with_budget(budget_bytes: u64) -> Self {
        HostStorage {
            budget_bytes: Some(budget_bytes),
            ..Self::default()
        }
    }

    /// Bytes held by live buffers.
    pub fn bytes_in_use(&self) -> u64 {
        self.in_use.get()
    }
}

impl Storage for HostStorage {
    type Buffer = HostBuffer;
    type Error = HostStorageError;

    fn allocate(
        &mut self,
        size_bytes: u64,
        _kind: AllocKind,
        _label: &str,
    ) -> Result<HostBuffer, HostStorageError> {
        let in_use = self.in_use.get();
        let budget = self.budget_bytes.unwrap_or(u64::MAX).min(usize::MAX as u64);
        if in_use.checked_add(size_bytes).is_none_or(|t| t > budget) {
            return Err(HostStorageError::OverBudget {
                requested_bytes: size_bytes,
                budget_bytes: budget,
                in_use_bytes: in_use,
            });
        }
        self.in_use.set(in_use + size_bytes);
        Ok(HostBuffer {
            data: vec![0u8; size_bytes as usize],
            id: NEXT_HOST_BUFFER.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            in_use: self.in_use.clone(),
        })
    }

    fn size_bytes(buffer: &HostBuffer) -> u64 {
        buffer.data.len() as u64
    }

    fn copy_now(
        &mut self,
        src: &HostBuffer,
        dst: &mut HostBuffer,
        ranges: &[(u64, u64, u64)],
    ) -> Result<bool, HostStorageError> {
        let inside =
            |len: usize, at: u64, n: u64| at.checked_add(n).is_some_and(|e| e <= len as u64);
        for &(from, to, n) in ranges {
            if !inside(src.data.len(), from, n) || !inside(dst.data.len(), to, n) {
                return Err(HostStorageError::OutOfRange {
                    offset_bytes: from.max(to),
                    size_bytes: n,
                });
            }
        }
        for &(from, to, n) in ranges {
            let (from, to, n) = (from as usize, to as usize, n as usize);
            dst.data[to..to + n].copy_from_slice(&src.data[from..from + n]);
        }
        Ok(true)
    }

    fn id(buffer: &HostBuffer) -> u64 {
        buffer.id
    }

    fn limits(&self) -> StorageLimits {
        StorageLimits {
            max_buffer_bytes: u64::MAX,
            budget_bytes: self.budget_bytes.unwrap_or(u64::MAX),
            in_use_bytes: self.in_use.get(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(
        size_bytes: u64,
        requester: u32,
        restrictions: &BTreeSet<Position>,
        dynamic: bool,
    ) -> PoolRequest<'_> {
        PoolRequest {
            size_bytes,
            kind: AllocKind::UsmDevice,
            network: NetworkId(0),
            requester: Position(requester),
            restrictions,
            dynamic,
        }
    }

    #[test]
    fn reuses_smallest_compatible_record_and_frees_when_unused() {
        let mut pool = MemoryPool::new(HostStorage::new());
        let none = BTreeSet::new();
        let big = pool.acquire(&req(1000, 0, &none, false)).unwrap();
        let small = pool
            .acquire(&req(100, 1, &[Position(0)].into(), false))
            .unwrap();
        assert_ne!(big.record, small.record);
        // Node 2 conflicts with neither: takes the smallest record that fits (100 bytes).
        let v = pool.acquire(&req(80, 2, &none, false)).unwrap();
        assert_eq!(v.record, small.record);
        assert!(v.reused);
        // Node 3 conflicts with 1 and 2: must take the big one.
        let v3 = pool
            .acquire(&req(50, 3, &[Position(1), Position(2)].into(), false))
            .unwrap();
        assert_eq!(v3.record, big.record);
        assert_eq!(pool.storage().bytes_in_use(), 1100);
        assert_eq!(pool.release(NetworkId(0), Position(1)), 0);
        assert_eq!(pool.release(NetworkId(0), Position(2)), 100);
        assert_eq!(pool.storage().bytes_in_use(), 1000);
        pool.release(NetworkId(0), Position(0));
        pool.release(NetworkId(0), Position(3));
        let r = pool.report();
        assert_eq!(
            (
                r.records,
                r.bytes_reserved,
                r.bytes_in_use,
                r.reuse_hits,
                r.allocations
            ),
            (0, 0, 0, 2, 2)
        );
        assert_eq!(pool.storage().bytes_in_use(), 0);
    }

    #[test]
    fn dynamic_requests_respect_threshold_and_networks_are_separate() {
        let mut pool = MemoryPool::new(HostStorage::new());
        let none = BTreeSet::new();
        let a = pool.acquire(&req(1000, 0, &none, false)).unwrap();
        let d = pool.acquire(&req(400, 1, &none, true)).unwrap();
        assert_ne!(
            a.record, d.record,
            "40% utilisation is below the 0.5 threshold"
        );
        let d2 = pool.acquire(&req(600, 2, &none, true)).unwrap();
        assert_eq!(d2.record, a.record);
        let other = PoolRequest {
            network: NetworkId(1),
            ..req(10, 3, &none, false)
        };
        assert!(!pool.acquire(&other).unwrap().reused);
        assert_eq!(pool.clear_network(NetworkId(0)), 1400);
        assert_eq!(pool.report().records, 1);
        assert!(pool.set_threshold(1.5).is_err());
    }

    #[test]
    fn descending_build_time_allocation_and_budget_errors() {
        let mut pool = MemoryPool::new(HostStorage::with_budget(1000));
        let none = BTreeSet::new();
        let r0: BTreeSet<Position> = [Position(1)].into();
        let r1: BTreeSet<Position> = [Position(0)].into();
        let reqs = [
            req(10, 0, &r0, false),
            req(900, 1, &r1, false),
            req(20, 2, &none, false),
        ];
        let views = acquire_descending(&mut pool, &reqs).unwrap();
        // Largest first: 1 allocates 900, 2 reuses it, 0 conflicts with 1 and allocates.
        assert_eq!(views[2].record, views[1].record);
        assert_ne!(views[0].record, views[1].record);
        let e = pool
            .acquire(&req(500, 9, &[Position(0), Position(1)].into(), false))
            .unwrap_err();
        assert!(matches!(
            e,
            PoolError::Allocate {
                source: HostStorageError::OverBudget { .. },
                ..
            }
        ));
    }
}
