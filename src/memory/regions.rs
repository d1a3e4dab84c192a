//! Device memory regions and their allocator.
//!
//! Device memory is split into regions with different lifetimes and permissions:
//! [`Region::Code`] (compiled pipelines; read-only, allocated at model load),
//! [`Region::Constants`] (weights, biases, scales; once per loaded network, read-only),
//! [`Region::Placeholders`] (inputs, outputs, in-outs; per inference, several copies when
//! inferences are pipelined), [`Region::Internal`] (the activation arena of a network, sized by
//! the static planner) and [`Region::Logging`] (a fixed carve-out).
//!
//! The allocator is device-free: [`BidirectionalAllocator`] hands out byte offsets of one
//! address range, constants (and internal arenas) growing from the low end, placeholders from
//! the high end, with a typed [`RegionError::Collision`] when they would meet; the runtime
//! maps them onto buffers (`runtime::network` places each network's constants,
//! `runtime::placeholders` reuses placeholder slots per network and inference in flight).

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

    fn remove_range_at(&mut self, offset: u64) -> Option<u64> {
        self.free.remove(&offset)
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
