//! Device memory regions and their allocators, after
//! `reference/device-runtime-memory-management.rst` (DESIGN.md §6).
//!
//! Device memory is split into regions with different lifetimes and permissions:
//! [`Region::Code`] (compiled pipelines; read-only, allocated at model load),
//! [`Region::Constants`] (weights, biases, scales; once per loaded network, read-only),
//! [`Region::Placeholders`] (inputs, outputs, in-outs; per inference, several copies when
//! inferences are pipelined), [`Region::Internal`] (the activation arena of a network, sized by
//! the static planner) and [`Region::Logging`] (a fixed carve-out).
//!
//! Allocators (all device-free: they hand out byte offsets, the GPU layer maps them onto
//! buffers):
//! - [`LinearAllocator`]: first fit over a free list that coalesces neighbours on free;
//! - [`BidirectionalAllocator`]: one address range, constants (and internal arenas) growing
//!   from the low end, placeholders from the high end, a typed [`RegionError::Collision`]
//!   when they would meet;
//! - [`PoolAllocator`]: per-network reuse of placeholder slots across inferences, a distinct
//!   set of slots for every inference in flight (pipelining);
//! - [`MemoryManager`]: code and logging regions with linear allocators, the data region with
//!   the bidirectional allocator under the pool, and per-buffer metadata with a readable dump.

use crate::memory::kind::AllocKind;
use crate::memory::pool::NetworkId;
use std::collections::BTreeMap;
use std::fmt;

/// A region of device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Region {
    /// Compiled kernels: written at load, read-only after.
    Code,
    /// Weights, biases, scales: allocated once per loaded network, read-only.
    Constants,
    /// Network inputs, outputs and in-outs: per inference.
    Placeholders,
    /// A network's activation arena (sized by the static planner).
    Internal,
    /// Log carve-out.
    Logging,
}

impl Region {
    /// Lower-case name used in dumps.
    pub fn name(self) -> &'static str {
        match self {
            Region::Code => "code",
            Region::Constants => "constants",
            Region::Placeholders => "placeholders",
            Region::Internal => "internal",
            Region::Logging => "logging",
        }
    }
}

impl fmt::Display for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Errors of the region allocators.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegionError {
    /// No free range of a linear allocator holds the request.
    #[error("{region}: no free range holds {requested_bytes} bytes (largest free range {largest_free_bytes} bytes)")]
    OutOfSpace {
        /// The region.
        region: Region,
        /// Bytes asked for.
        requested_bytes: u64,
        /// Largest free range.
        largest_free_bytes: u64,
    },
    /// The low and high ends of the data region would overlap.
    #[error("data region: {requested_bytes} bytes for {region} would collide (constants end at {low_end}, placeholders start at {high_start})")]
    Collision {
        /// The side that asked.
        region: Region,
        /// Bytes asked for.
        requested_bytes: u64,
        /// End of the low (constants) side.
        low_end: u64,
        /// Start of the high (placeholders) side.
        high_start: u64,
    },
    /// An alignment of zero.
    #[error("alignment must be at least 1")]
    ZeroAlignment,
    /// Freeing an offset that is not allocated.
    #[error("{region}: offset {offset_bytes} is not allocated")]
    NotAllocated {
        /// The region.
        region: Region,
        /// The offset.
        offset_bytes: u64,
    },
    /// A buffer id the manager does not know.
    #[error("buffer {0} is not allocated")]
    UnknownBuffer(BufferId),
    /// An inference id the pool does not know.
    #[error("{network}: inference {inference} is not running")]
    UnknownInference {
        /// The network.
        network: NetworkId,
        /// The inference.
        inference: u32,
    },
}

fn align_up(x: u64, align: u64) -> Option<u64> {
    let r = x % align;
    if r == 0 {
        Some(x)
    } else {
        x.checked_add(align - r)
    }
}

/// Free ranges `offset -> size`, coalesced.
#[derive(Debug, Clone, Default)]
struct FreeList {
    free: BTreeMap<u64, u64>,
}

impl FreeList {
    fn insert(&mut self, mut offset: u64, mut size: u64) {
        if size == 0 {
            return;
        }
        if let Some((&o, &s)) = self.free.range(..offset).next_back() {
            if o + s == offset {
                self.free.remove(&o);
                offset = o;
                size += s;
            }
        }
        if let Some(&s) = self.free.get(&(offset + size)) {
            self.free.remove(&(offset + size));
            size += s;
        }
        self.free.insert(offset, size);
    }

    /// Lowest aligned placement (first fit); removes it from the list.
    fn take_first(&mut self, size: u64, align: u64) -> Option<u64> {
        let (o, s, start) = self.free.iter().find_map(|(&o, &s)| {
            let start = align_up(o, align)?;
            (start.checked_add(size)? <= o + s).then_some((o, s, start))
        })?;
        self.carve(o, s, start, size);
        Some(start)
    }

    /// Highest aligned placement (last fit); removes it from the list.
    fn take_last(&mut self, size: u64, align: u64) -> Option<u64> {
        let (o, s, start) = self.free.iter().rev().find_map(|(&o, &s)| {
            let end = o + s;
            let start = end.checked_sub(size)?;
            let start = start - start % align;
            (start >= o).then_some((o, s, start))
        })?;
        self.carve(o, s, start, size);
        Some(start)
    }

    fn carve(&mut self, o: u64, s: u64, start: u64, size: u64) {
        self.free.remove(&o);
        if start > o {
            self.free.insert(o, start - o);
        }
        if start + size < o + s {
            self.free.insert(start + size, o + s - start - size);
        }
    }

    fn largest(&self) -> u64 {
        self.free.values().copied().max().unwrap_or(0)
    }

    fn remove_range_at(&mut self, offset: u64) -> Option<u64> {
        self.free.remove(&offset)
    }
}

/// First-fit allocator over `[0, size_bytes)` of one region.
#[derive(Debug, Clone)]
pub struct LinearAllocator {
    region: Region,
    size_bytes: u64,
    free: FreeList,
    used: BTreeMap<u64, u64>,
}

impl LinearAllocator {
    /// An empty allocator of `size_bytes` for `region`.
    pub fn new(region: Region, size_bytes: u64) -> Self {
        let mut free = FreeList::default();
        free.insert(0, size_bytes);
        LinearAllocator {
            region,
            size_bytes,
            free,
            used: BTreeMap::new(),
        }
    }

    /// Offset of a new range of `size_bytes` at the lowest aligned address that fits.
    ///
    /// # Errors
    /// [`RegionError::OutOfSpace`], [`RegionError::ZeroAlignment`].
    pub fn allocate(&mut self, size_bytes: u64, align_bytes: u64) -> Result<u64, RegionError> {
        if align_bytes == 0 {
            return Err(RegionError::ZeroAlignment);
        }
        // A zero-byte request still gets a distinct offset so it can be freed by offset.
        let size = size_bytes.max(1);
        let offset = self
            .free
            .take_first(size, align_bytes)
            .ok_or(RegionError::OutOfSpace {
                region: self.region,
                requested_bytes: size_bytes,
                largest_free_bytes: self.free.largest(),
            })?;
        self.used.insert(offset, size);
        Ok(offset)
    }

    /// Frees the range at `offset_bytes`, merging it with free neighbours.
    ///
    /// # Errors
    /// [`RegionError::NotAllocated`].
    pub fn free(&mut self, offset_bytes: u64) -> Result<(), RegionError> {
        let size = self
            .used
            .remove(&offset_bytes)
            .ok_or(RegionError::NotAllocated {
                region: self.region,
                offset_bytes,
            })?;
        self.free.insert(offset_bytes, size);
        Ok(())
    }

    /// Bytes allocated now.
    pub fn used_bytes(&self) -> u64 {
        self.used.values().sum()
    }

    /// Size of the region.
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// Number of free ranges (1 when everything is free: frees coalesce).
    pub fn free_ranges(&self) -> usize {
        self.free.free.len()
    }
}

/// Which end of the data region an allocation comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Constants and internal arenas, growing upwards from 0.
    Low,
    /// Placeholders, growing downwards from the top.
    High,
}

/// One range `[0, size_bytes)` shared by two sides growing towards each other.
#[derive(Debug, Clone)]
pub struct BidirectionalAllocator {
    size_bytes: u64,
    low_end: u64,
    high_start: u64,
    low_free: FreeList,
    high_free: FreeList,
    used: BTreeMap<u64, (u64, End)>,
}

impl BidirectionalAllocator {
    /// An empty data region of `size_bytes`.
    pub fn new(size_bytes: u64) -> Self {
        BidirectionalAllocator {
            size_bytes,
            low_end: 0,
            high_start: size_bytes,
            low_free: FreeList::default(),
            high_free: FreeList::default(),
            used: BTreeMap::new(),
        }
    }

    /// Allocates from `end`: first a freed range on that side, else by moving that side's
    /// frontier.
    ///
    /// # Errors
    /// [`RegionError::Collision`] when the frontier would cross the other side's;
    /// [`RegionError::ZeroAlignment`].
    pub fn allocate(
        &mut self,
        end: End,
        size_bytes: u64,
        align_bytes: u64,
    ) -> Result<u64, RegionError> {
        if align_bytes == 0 {
            return Err(RegionError::ZeroAlignment);
        }
        let size = size_bytes.max(1);
        let region = if end == End::Low {
            Region::Constants
        } else {
            Region::Placeholders
        };
        let collision = RegionError::Collision {
            region,
            requested_bytes: size_bytes,
            low_end: self.low_end,
            high_start: self.high_start,
        };
        let offset = match end {
            End::Low => match self.low_free.take_first(size, align_bytes) {
                Some(o) => o,
                None => {
                    let start = align_up(self.low_end, align_bytes).ok_or(collision.clone())?;
                    let new_end = start.checked_add(size).ok_or(collision.clone())?;
                    if new_end > self.high_start {
                        return Err(collision);
                    }
                    self.low_free.insert(self.low_end, start - self.low_end);
                    self.low_end = new_end;
                    start
                }
            },
            End::High => match self.high_free.take_last(size, align_bytes) {
                Some(o) => o,
                None => {
                    let start = self.high_start.checked_sub(size).ok_or(collision.clone())?;
                    let start = start - start % align_bytes;
                    if start < self.low_end {
                        return Err(collision);
                    }
                    self.high_free
                        .insert(start + size, self.high_start - start - size);
                    self.high_start = start;
                    start
                }
            },
        };
        self.used.insert(offset, (size, end));
        Ok(offset)
    }

    /// Frees the range at `offset_bytes`; a range at a frontier gives its space back to the
    /// middle so the other side can use it.
    ///
    /// # Errors
    /// [`RegionError::NotAllocated`].
    pub fn free(&mut self, offset_bytes: u64) -> Result<(), RegionError> {
        let (size, end) = self
            .used
            .remove(&offset_bytes)
            .ok_or(RegionError::NotAllocated {
                region: Region::Constants,
                offset_bytes,
            })?;
        match end {
            End::Low => {
                self.low_free.insert(offset_bytes, size);
                // Shrink the frontier while the top-most low range is free.
                while let Some((&o, &s)) = self.low_free.free.iter().next_back() {
                    if o + s != self.low_end {
                        break;
                    }
                    self.low_free.remove_range_at(o);
                    self.low_end = o;
                }
            }
            End::High => {
                self.high_free.insert(offset_bytes, size);
                while let Some((&o, &s)) = self.high_free.free.iter().next() {
                    if o != self.high_start {
                        break;
                    }
                    self.high_free.remove_range_at(o);
                    self.high_start = o + s;
                }
            }
        }
        Ok(())
    }

    /// End of the low side and start of the high side.
    pub fn frontiers(&self) -> (u64, u64) {
        (self.low_end, self.high_start)
    }

    /// Size of the region.
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
}

#[derive(Debug, Clone)]
struct Slot {
    offset_bytes: u64,
    size_bytes: u64,
    /// The inference holding the slot, if any.
    holder: Option<u32>,
}

/// Per-network reuse of placeholder slots across inferences; each inference in flight holds
/// its own slots, so pipelined inferences get separate copies.
#[derive(Debug, Clone, Default)]
pub struct PoolAllocator {
    slots: BTreeMap<NetworkId, Vec<Slot>>,
    next_inference: u32,
    running: BTreeMap<u32, NetworkId>,
    /// Slots created (allocated from the backing allocator).
    pub slots_created: u64,
    /// Requests served by an existing slot.
    pub slot_reuses: u64,
}

impl PoolAllocator {
    /// Starts an inference of `network`; its placeholder requests name the returned id.
    pub fn begin_inference(&mut self, network: NetworkId) -> u32 {
        let id = self.next_inference;
        self.next_inference += 1;
        self.running.insert(id, network);
        id
    }

    /// A slot of at least `size_bytes` for `inference`: the smallest free slot of the network,
    /// else a new one from `backing` (the high end of the data region).
    ///
    /// # Errors
    /// [`RegionError::UnknownInference`], or the backing allocator's error.
    pub fn acquire(
        &mut self,
        backing: &mut BidirectionalAllocator,
        inference: u32,
        size_bytes: u64,
        align_bytes: u64,
    ) -> Result<u64, RegionError> {
        let network = *self
            .running
            .get(&inference)
            .ok_or(RegionError::UnknownInference {
                network: NetworkId(u32::MAX),
                inference,
            })?;
        let slots = self.slots.entry(network).or_default();
        let best = slots
            .iter_mut()
            .filter(|s| {
                s.holder.is_none()
                    && s.size_bytes >= size_bytes
                    && align_bytes > 0
                    && s.offset_bytes % align_bytes == 0
            })
            .min_by_key(|s| s.size_bytes);
        if let Some(slot) = best {
            slot.holder = Some(inference);
            self.slot_reuses += 1;
            return Ok(slot.offset_bytes);
        }
        let offset_bytes = backing.allocate(End::High, size_bytes, align_bytes)?;
        slots.push(Slot {
            offset_bytes,
            size_bytes,
            holder: Some(inference),
        });
        self.slots_created += 1;
        Ok(offset_bytes)
    }

    /// Ends `inference`: its slots become free for the network's later inferences.
    ///
    /// # Errors
    /// [`RegionError::UnknownInference`].
    pub fn end_inference(&mut self, inference: u32) -> Result<(), RegionError> {
        let network = self
            .running
            .remove(&inference)
            .ok_or(RegionError::UnknownInference {
                network: NetworkId(u32::MAX),
                inference,
            })?;
        for s in self.slots.entry(network).or_default() {
            if s.holder == Some(inference) {
                s.holder = None;
            }
        }
        Ok(())
    }

    /// Frees every slot of `network` back to `backing` (network unloaded).
    ///
    /// # Errors
    /// The backing allocator's error.
    pub fn clear_network(
        &mut self,
        backing: &mut BidirectionalAllocator,
        network: NetworkId,
    ) -> Result<(), RegionError> {
        for s in self.slots.remove(&network).unwrap_or_default() {
            backing.free(s.offset_bytes)?;
        }
        self.running.retain(|_, n| *n != network);
        Ok(())
    }

    /// Slots the network holds (free or in use).
    pub fn slot_count(&self, network: NetworkId) -> usize {
        self.slots.get(&network).map_or(0, Vec::len)
    }
}

/// Identifies a buffer of a [`MemoryManager`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufferId(pub u64);

impl fmt::Display for BufferId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "b{}", self.0)
    }
}

/// How long a buffer lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifetime {
    /// From model load to unload (code, constants, internal arena).
    Model,
    /// For one inference.
    Inference(u32),
    /// For as long as the device runs (logging).
    Device,
}

/// Metadata kept per buffer for debugging dumps (the reference's `BufferCommonMD`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferInfo {
    /// Human-readable name.
    pub name: String,
    /// Owning network.
    pub network: NetworkId,
    /// Region.
    pub region: Region,
    /// Allocation kind.
    pub kind: AllocKind,
    /// Lifetime.
    pub lifetime: Lifetime,
    /// Offset inside its region.
    pub offset_bytes: u64,
    /// Size.
    pub size_bytes: u64,
}

/// Sizes of a [`MemoryManager`]'s regions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionSizes {
    /// Code region.
    pub code_bytes: u64,
    /// Logging carve-out.
    pub logging_bytes: u64,
    /// Data region (constants, internal arenas and placeholders).
    pub data_bytes: u64,
}

/// Code and logging regions with linear allocators, the data region with constants and
/// internal arenas from the low end and pooled placeholders from the high end.
#[derive(Debug, Clone)]
pub struct MemoryManager {
    code: LinearAllocator,
    logging: LinearAllocator,
    data: BidirectionalAllocator,
    pool: PoolAllocator,
    buffers: BTreeMap<BufferId, BufferInfo>,
    next_id: u64,
}

impl MemoryManager {
    /// A manager with the given region sizes.
    pub fn new(sizes: RegionSizes) -> Self {
        MemoryManager {
            code: LinearAllocator::new(Region::Code, sizes.code_bytes),
            logging: LinearAllocator::new(Region::Logging, sizes.logging_bytes),
            data: BidirectionalAllocator::new(sizes.data_bytes),
            pool: PoolAllocator::default(),
            buffers: BTreeMap::new(),
            next_id: 0,
        }
    }

    fn record(&mut self, info: BufferInfo) -> BufferId {
        let id = BufferId(self.next_id);
        self.next_id += 1;
        self.buffers.insert(id, info);
        id
    }

    /// Allocates a model-lifetime buffer in `region` (code, constants, internal, logging).
    /// Placeholders go through [`MemoryManager::allocate_placeholder`].
    ///
    /// # Errors
    /// The region allocator's error.
    pub fn allocate(
        &mut self,
        name: &str,
        network: NetworkId,
        region: Region,
        kind: AllocKind,
        size_bytes: u64,
        align_bytes: u64,
    ) -> Result<BufferId, RegionError> {
        let (offset_bytes, lifetime) = match region {
            Region::Code => (
                self.code.allocate(size_bytes, align_bytes)?,
                Lifetime::Model,
            ),
            Region::Logging => (
                self.logging.allocate(size_bytes, align_bytes)?,
                Lifetime::Device,
            ),
            Region::Constants | Region::Internal => (
                self.data.allocate(End::Low, size_bytes, align_bytes)?,
                Lifetime::Model,
            ),
            Region::Placeholders => (
                self.data.allocate(End::High, size_bytes, align_bytes)?,
                Lifetime::Model,
            ),
        };
        Ok(self.record(BufferInfo {
            name: name.to_string(),
            network,
            region,
            kind,
            lifetime,
            offset_bytes,
            size_bytes,
        }))
    }

    /// Starts an inference of `network` (placeholders are requested for it).
    pub fn begin_inference(&mut self, network: NetworkId) -> u32 {
        self.pool.begin_inference(network)
    }

    /// A placeholder for `inference`, reusing a slot the network's earlier inferences freed.
    ///
    /// # Errors
    /// [`RegionError::UnknownInference`] or [`RegionError::Collision`].
    pub fn allocate_placeholder(
        &mut self,
        name: &str,
        network: NetworkId,
        inference: u32,
        kind: AllocKind,
        size_bytes: u64,
        align_bytes: u64,
    ) -> Result<BufferId, RegionError> {
        let offset_bytes = self
            .pool
            .acquire(&mut self.data, inference, size_bytes, align_bytes)?;
        Ok(self.record(BufferInfo {
            name: name.to_string(),
            network,
            region: Region::Placeholders,
            kind,
            lifetime: Lifetime::Inference(inference),
            offset_bytes,
            size_bytes,
        }))
    }

    /// Ends `inference`: its placeholder slots stay with the network for reuse.
    ///
    /// # Errors
    /// [`RegionError::UnknownInference`].
    pub fn end_inference(&mut self, inference: u32) -> Result<(), RegionError> {
        self.pool.end_inference(inference)?;
        self.buffers
            .retain(|_, b| b.lifetime != Lifetime::Inference(inference));
        Ok(())
    }

    /// Frees one model-lifetime buffer.
    ///
    /// # Errors
    /// [`RegionError::UnknownBuffer`]; placeholders of an inference are freed by
    /// [`MemoryManager::end_inference`].
    pub fn free(&mut self, id: BufferId) -> Result<(), RegionError> {
        let info = self
            .buffers
            .get(&id)
            .ok_or(RegionError::UnknownBuffer(id))?;
        if matches!(info.lifetime, Lifetime::Inference(_)) {
            return Err(RegionError::UnknownBuffer(id));
        }
        match info.region {
            Region::Code => self.code.free(info.offset_bytes)?,
            Region::Logging => self.logging.free(info.offset_bytes)?,
            _ => self.data.free(info.offset_bytes)?,
        }
        self.buffers.remove(&id);
        Ok(())
    }

    /// Unloads `network`: frees its buffers and its placeholder slots.
    ///
    /// # Errors
    /// An allocator's error (only on internal inconsistency).
    pub fn unload(&mut self, network: NetworkId) -> Result<(), RegionError> {
        let ids: Vec<BufferId> = self
            .buffers
            .iter()
            .filter(|(_, b)| b.network == network && !matches!(b.lifetime, Lifetime::Inference(_)))
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            self.free(id)?;
        }
        self.buffers.retain(|_, b| b.network != network);
        self.pool.clear_network(&mut self.data, network)
    }

    /// Metadata of a live buffer.
    pub fn info(&self, id: BufferId) -> Option<&BufferInfo> {
        self.buffers.get(&id)
    }

    /// The placeholder pool (for its counters).
    pub fn pool(&self) -> &PoolAllocator {
        &self.pool
    }

    /// The data region's frontiers `(low end, high start)`.
    pub fn data_frontiers(&self) -> (u64, u64) {
        self.data.frontiers()
    }

    /// A table of live buffers, one per line, plus region usage.
    pub fn dump(&self) -> String {
        let (low, high) = self.data.frontiers();
        let mut s = format!(
            "code {}/{} bytes, logging {}/{} bytes, data {} bytes (constants+internal up to {low}, placeholders from {high})\n",
            self.code.used_bytes(),
            self.code.size_bytes(),
            self.logging.used_bytes(),
            self.logging.size_bytes(),
            self.data.size_bytes()
        );
        s.push_str(&format!(
            "{:<6} {:<24} {:<8} {:<13} {:<11} {:<14} {:>12} {:>12}\n",
            "id", "name", "network", "region", "kind", "lifetime", "offset", "size"
        ));
        for (id, b) in &self.buffers {
            let lifetime = match b.lifetime {
                Lifetime::Model => "model".to_string(),
                Lifetime::Device => "device".to_string(),
                Lifetime::Inference(i) => format!("inference {i}"),
            };
            s.push_str(&format!(
                "{:<6} {:<24} {:<8} {:<13} {:<11} {:<14} {:>12} {:>12}\n",
                id.to_string(),
                b.name,
                b.network.to_string(),
                b.region.name(),
                b.kind.name(),
                lifetime,
                b.offset_bytes,
                b.size_bytes
            ));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_first_fit_and_coalescing() {
        let mut a = LinearAllocator::new(Region::Code, 100);
        let x = a.allocate(30, 1).unwrap();
        let y = a.allocate(30, 1).unwrap();
        let z = a.allocate(30, 1).unwrap();
        assert_eq!((x, y, z), (0, 30, 60));
        a.free(y).unwrap();
        // First fit: the hole at 30 is the lowest that holds 20.
        assert_eq!(a.allocate(20, 1).unwrap(), 30);
        assert!(matches!(
            a.allocate(40, 1),
            Err(RegionError::OutOfSpace {
                largest_free_bytes: 10,
                ..
            })
        ));
        a.free(30).unwrap();
        a.free(x).unwrap();
        a.free(z).unwrap();
        assert_eq!(a.free_ranges(), 1, "frees coalesce back into one range");
        assert_eq!(a.used_bytes(), 0);
        assert!(a.free(z).is_err());
        assert_eq!(a.allocate(10, 64).unwrap(), 0);
        assert_eq!(a.allocate(10, 64).unwrap(), 64);
    }

    #[test]
    fn bidirectional_sides_collide_with_a_typed_error() {
        let mut d = BidirectionalAllocator::new(1000);
        let c = d.allocate(End::Low, 400, 1).unwrap();
        let p = d.allocate(End::High, 400, 1).unwrap();
        assert_eq!((c, p), (0, 600));
        let e = d.allocate(End::Low, 300, 1).unwrap_err();
        assert_eq!(
            e,
            RegionError::Collision {
                region: Region::Constants,
                requested_bytes: 300,
                low_end: 400,
                high_start: 600
            }
        );
        d.free(p).unwrap();
        assert_eq!(d.frontiers(), (400, 1000));
        assert_eq!(d.allocate(End::Low, 300, 1).unwrap(), 400);
        // 256-aligned would land at 512, inside the constants: refused.
        assert!(matches!(
            d.allocate(End::High, 256, 256),
            Err(RegionError::Collision { .. })
        ));
        assert_eq!(d.allocate(End::High, 200, 100).unwrap(), 800);
    }

    #[test]
    fn manager_reuses_placeholders_and_pipelines_copies() {
        let mut m = MemoryManager::new(RegionSizes {
            code_bytes: 1 << 20,
            logging_bytes: 4096,
            data_bytes: 1 << 20,
        });
        let net = NetworkId(7);
        m.allocate("kernels", net, Region::Code, AllocKind::ClMem, 5000, 256)
            .unwrap();
        m.allocate(
            "w0",
            net,
            Region::Constants,
            AllocKind::UsmDevice,
            10_000,
            256,
        )
        .unwrap();
        m.allocate(
            "arena",
            net,
            Region::Internal,
            AllocKind::UsmDevice,
            20_000,
            256,
        )
        .unwrap();
        m.allocate("log", net, Region::Logging, AllocKind::UsmHost, 1024, 1)
            .unwrap();
        // Two inferences in flight: two copies of the input.
        let i1 = m.begin_inference(net);
        let i2 = m.begin_inference(net);
        let a = m
            .allocate_placeholder("input", net, i1, AllocKind::UsmDevice, 1000, 256)
            .unwrap();
        let b = m
            .allocate_placeholder("input", net, i2, AllocKind::UsmDevice, 1000, 256)
            .unwrap();
        assert_ne!(
            m.info(a).unwrap().offset_bytes,
            m.info(b).unwrap().offset_bytes
        );
        m.end_inference(i1).unwrap();
        let i3 = m.begin_inference(net);
        let c = m
            .allocate_placeholder("input", net, i3, AllocKind::UsmDevice, 900, 256)
            .unwrap();
        assert_eq!(m.pool().slot_reuses, 1);
        assert_eq!(m.pool().slot_count(net), 2);
        let dump = m.dump();
        assert!(
            dump.contains("arena") && dump.contains("inference") && dump.contains("placeholders"),
            "{dump}"
        );
        assert!(m.info(c).is_some());
        m.unload(net).unwrap();
        assert_eq!(m.data_frontiers(), (0, 1 << 20));
        assert!(m.end_inference(99).is_err());
    }
}
