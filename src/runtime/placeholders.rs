//! The placeholders of a network family: buffers for network inputs and outputs, per
//! inference, pooled per network (the placeholders region of docs/design.md, with a pool of slots
//! per network).
//!
//! Every request is one inference in flight: it holds its placeholder slots while it lives
//! (its outputs stay readable until its next iteration) and gives them back to its network's
//! pool when it is dropped or needs a larger slot; the next request of the network reuses
//! them. Several requests running at once hold several copies; the pool keeps up to
//! `keep_free` free copies of each placeholder for the next ones and frees the rest.
//!
//! Where it fits, slots come from the high end of the network family's data region (the
//! device buffer whose low end holds the constants, [`BidirectionalAllocator`]); a slot that
//! would collide with the constants ([`RegionError::Collision`]) or cannot live there gets a
//! buffer of its own. Device-free: generic over [`Storage`].

use crate::memory::pool::{NetworkId, Storage};
use crate::memory::regions::{BidirectionalAllocator, End, Region, RegionError};
use crate::memory::AllocKind;
use std::collections::BTreeMap;
use std::sync::Arc;

enum PMem<B> {
    /// A range of the data region's high end.
    Region(u64),
    /// A buffer of its own.
    Own(Arc<B>),
}

struct PSlot<B> {
    network: NetworkId,
    /// The placeholder it was made for (the pool keeps copies per placeholder).
    label: String,
    kind: AllocKind,
    size_bytes: u64,
    mem: PMem<B>,
    /// The inference holding the slot.
    holder: Option<u32>,
}

/// A placeholder slot held by an inference: a range of a buffer.
pub(crate) struct Lease<B> {
    slot: u64,
    /// The buffer (the data region, or the slot's own).
    pub buffer: Arc<B>,
    /// Start of the slot in `buffer`.
    pub offset_bytes: u64,
    /// Bytes of the slot.
    pub size_bytes: u64,
}

/// The data region's buffer and its allocator (constants at the low end), when placeholders
/// may take slots from its high end.
pub(crate) type RegionHighEnd<B> = Option<(Arc<B>, BidirectionalAllocator)>;

/// Counters of a placeholder pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PlaceholderCounts {
    /// Slots created (a region range or a buffer).
    pub created: u64,
    /// Acquisitions served by a free slot.
    pub reused: u64,
    /// Slots that would have collided with the constants and got a buffer of their own.
    pub collisions: u64,
}

/// See the module docs.
pub(crate) struct PlaceholderPool<B> {
    /// The data region's buffer and its allocator (constants at the low end), when
    /// placeholders may share it.
    region: RegionHighEnd<B>,
    /// Kind of the region's buffer: only slots of this kind may live there.
    region_kind: AllocKind,
    align_bytes: u64,
    slots: BTreeMap<u64, PSlot<B>>,
    next_slot: u64,
    next_inference: u32,
    keep_free: usize,
    counts: PlaceholderCounts,
}

impl<B> PlaceholderPool<B> {
    /// A pool keeping up to `keep_free` free copies of each placeholder; with `region`, slots of
    /// `region_kind` come from its high end first.
    pub fn new(
        region: RegionHighEnd<B>,
        region_kind: AllocKind,
        align_bytes: u64,
        keep_free: usize,
    ) -> Self {
        PlaceholderPool {
            region,
            region_kind,
            align_bytes: align_bytes.max(1),
            slots: BTreeMap::new(),
            next_slot: 0,
            next_inference: 0,
            keep_free,
            counts: PlaceholderCounts::default(),
        }
    }

    /// A new inference (a request): its slots are its own until it ends.
    pub fn begin_inference(&mut self) -> u32 {
        self.next_inference = self.next_inference.wrapping_add(1);
        self.next_inference
    }

    /// Counters.
    pub fn counts(&self) -> PlaceholderCounts {
        self.counts
    }

    /// A slot of at least `size_bytes` of `kind` for placeholder `label` of `inference` of
    /// `network`: the smallest free slot of the network no more than twice the size (a small
    /// request must not pin a large slot; one made for `label` first), else a new range of the
    /// data region, else a buffer of its own from `storage`.
    ///
    /// # Errors
    /// The storage's error, as text.
    pub fn acquire<S: Storage<Buffer = B>>(
        &mut self,
        storage: &mut S,
        network: NetworkId,
        inference: u32,
        size_bytes: u64,
        kind: AllocKind,
        label: &str,
    ) -> Result<Lease<B>, String> {
        let best = self
            .slots
            .iter()
            .filter(|(_, s)| {
                s.holder.is_none()
                    && s.network == network
                    && s.kind == kind
                    && s.size_bytes >= size_bytes
                    && s.size_bytes <= size_bytes.saturating_mul(2).max(256)
            })
            .min_by_key(|(_, s)| (s.label != label, s.size_bytes))
            .map(|(&id, _)| id);
        if let Some(id) = best {
            self.counts.reused += 1;
            return self.lease(id, inference);
        }
        let size = size_bytes.div_ceil(4).max(1) * 4;
        let mut mem = None;
        if let (Some((_, alloc)), true) = (&mut self.region, kind == self.region_kind) {
            match alloc.allocate(End::High, size, self.align_bytes) {
                Ok(offset) => {
                    storage.note_region(Region::Placeholders, size, true);
                    mem = Some(PMem::Region(offset));
                }
                Err(RegionError::Collision { .. }) => self.counts.collisions += 1,
                Err(e) => return Err(e.to_string()),
            }
        }
        let (mem, size) = match mem {
            Some(m) => (m, size),
            None => {
                let b = storage
                    .allocate(size, kind, label)
                    .map_err(|e| e.to_string())?;
                let real = S::size_bytes(&b);
                (PMem::Own(Arc::new(b)), real)
            }
        };
        let id = self.next_slot;
        self.next_slot += 1;
        self.counts.created += 1;
        self.slots.insert(
            id,
            PSlot {
                network,
                label: label.to_string(),
                kind,
                size_bytes: size,
                mem,
                holder: None,
            },
        );
        self.lease(id, inference)
    }

    fn lease(&mut self, id: u64, inference: u32) -> Result<Lease<B>, String> {
        let region = self.region.as_ref().map(|(b, _)| Arc::clone(b));
        let slot = self
            .slots
            .get_mut(&id)
            .ok_or_else(|| format!("placeholder slot {id} is gone"))?;
        slot.holder = Some(inference);
        let (buffer, offset_bytes) = match &slot.mem {
            PMem::Region(off) => (
                region.ok_or_else(|| "the data region is gone".to_string())?,
                *off,
            ),
            PMem::Own(b) => (Arc::clone(b), 0),
        };
        Ok(Lease {
            slot: id,
            buffer,
            offset_bytes,
            size_bytes: slot.size_bytes,
        })
    }

    /// Gives `lease` back: the slot becomes free for the network's next inferences; beyond
    /// `keep_free` free slots of the same placeholder the largest are freed. Returns the
    /// storage ids of buffers freed (their cached bindings must go).
    pub fn release<S: Storage<Buffer = B>>(&mut self, storage: &S, lease: Lease<B>) -> Vec<u64> {
        let (network, label) = match self.slots.get_mut(&lease.slot) {
            Some(s) => {
                s.holder = None;
                (s.network, s.label.clone())
            }
            None => return Vec::new(),
        };
        drop(lease);
        self.trim(storage, network, &label)
    }

    fn trim<S: Storage<Buffer = B>>(
        &mut self,
        storage: &S,
        network: NetworkId,
        label: &str,
    ) -> Vec<u64> {
        let mut free: Vec<(u64, u64)> = self
            .slots
            .iter()
            .filter(|(_, s)| s.network == network && s.label == label && s.holder.is_none())
            .map(|(&id, s)| (s.size_bytes, id))
            .collect();
        let mut freed = Vec::new();
        if free.len() <= self.keep_free {
            return freed;
        }
        free.sort();
        let extra = free.len() - self.keep_free;
        for &(_, id) in free.iter().rev().take(extra) {
            let Some(slot) = self.slots.remove(&id) else {
                continue;
            };
            match slot.mem {
                PMem::Region(off) => {
                    if let Some((_, alloc)) = &mut self.region {
                        if alloc.free(off).is_ok() {
                            storage.note_region(Region::Placeholders, slot.size_bytes, false);
                        }
                    }
                }
                PMem::Own(b) => {
                    freed.push(S::id(&b));
                }
            }
        }
        freed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::pool::HostStorage;

    #[test]
    // Host storage counts through an Rc (single-threaded); production pools hold engine
    // buffers, which are Send and Sync on native targets.
    #[allow(clippy::arc_with_non_send_sync)]
    fn slots_come_from_the_region_until_it_collides_and_are_reused_per_network() {
        let mut storage = HostStorage::new();
        let region_buf = Arc::new(storage.allocate(4096, AllocKind::UsmDevice, "r").unwrap());
        let mut alloc = BidirectionalAllocator::new(4096);
        alloc.allocate(End::Low, 3100, 256).unwrap(); // the constants
        let mut pool =
            PlaceholderPool::new(Some((region_buf, alloc)), AllocKind::UsmDevice, 256, 1);
        let net = NetworkId(1);
        let i1 = pool.begin_inference();
        let a = pool
            .acquire(&mut storage, net, i1, 512, AllocKind::UsmDevice, "a")
            .unwrap();
        assert_eq!(a.offset_bytes, 3584, "from the high end, aligned");
        // No room left above the constants: a buffer of its own, counted as a collision.
        let b = pool
            .acquire(&mut storage, net, i1, 512, AllocKind::UsmDevice, "b")
            .unwrap();
        assert_eq!((b.offset_bytes, pool.counts().collisions), (0, 1));
        // A second inference cannot take i1's slots; after i1 gives them back it can.
        let i2 = pool.begin_inference();
        let freed = pool.release(&storage, a);
        assert!(freed.is_empty(), "one free copy is kept");
        let c = pool
            .acquire(&mut storage, net, i2, 500, AllocKind::UsmDevice, "c")
            .unwrap();
        assert_eq!(c.offset_bytes, 3584);
        assert_eq!(pool.counts().reused, 1);
        // Another network never gets this network's slots.
        let d = pool
            .acquire(
                &mut storage,
                NetworkId(2),
                i2,
                100,
                AllocKind::UsmDevice,
                "d",
            )
            .unwrap();
        assert_ne!(d.offset_bytes, 3584);
        // Beyond keep_free free copies of a placeholder, the extra ones are freed.
        let i3 = pool.begin_inference();
        let b2 = pool
            .acquire(&mut storage, net, i3, 512, AllocKind::UsmDevice, "b")
            .unwrap();
        let before = storage.bytes_in_use();
        assert!(pool.release(&storage, b).is_empty());
        let freed = pool.release(&storage, b2);
        assert_eq!(freed.len(), 1);
        assert!(storage.bytes_in_use() < before);
        drop(c);
    }
}
