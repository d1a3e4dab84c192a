//! `update_weights` (docs/design.md): the layout each weight of a network family is in on
//! the device, and the reordered-weights cache that gives a kernel the layout it reads best.
//!
//! Every quantized kernel declares the layout of the weight it reads
//! ([`crate::gpu::kernels::quant::LinearKernel::weight_layout`]): on a GPU the decode kernel
//! and the prefill GEMM may want different ones. When the runtime picks an implementation
//! for a node's shapes (`update_impl`) it asks [`WeightCache::lookup`] for (weight, layout):
//!
//! * **hit** — the weight is in that layout already, or in one that reads the same (a format
//!   or a size with no second layout: reinterpreted, no copy), or a copy in that layout is
//!   held: nothing is recorded;
//! * **miss, within the budget** — the reorder kernel
//!   ([`crate::gpu::kernels::quant::encode_regroup`]) writes a copy in that layout on the
//!   device, recorded into the iteration's frame before the node's dispatch; copies no
//!   iteration has read for longest are released first to make room (never one the current
//!   iteration reads);
//! * **miss, beyond the budget** — the weight is converted in place (through a scratch piece
//!   of at most `SCRATCH_BYTES`), so the device keeps one layout of it and converts on
//!   demand. Only weights that no other kernel reads are converted (the others keep their
//!   layout and are read as they are).
//!
//! The three weights of a KV split (a `fused_linear` writing the KV cache) are bound as one
//! range of the data region, so they are read where they lie, in their resident layout: no
//! lookup (a copy of one would leave the three apart).
//!
//! The budget is the bytes the copies may take beside the file's weights (by default a tenth
//! of them: device weight bytes stay within 1.10x of the file's). Copies are constants-region
//! buffers ([`crate::memory::regions::Region::Constants`]), counted there and in the charts.
//! The cache is shared by every network of a family (specialised and sharing networks read
//! the same weights), keyed by where a weight lies in the data region.

use crate::gpu::kernels::{Operand, TensorRef, WeightLayout};
use crate::gpu::{Buffer, BufferDesc, Engine, Frame};
use crate::memory::regions::Region;
use crate::memory::AllocKind;
use crate::runtime::RunError;
use crate::shape::{DType, Shape};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Where a weight lies in the data region: its segment and byte offset (the same constant in
/// every network of a family).
pub(crate) type WeightKey = (usize, u64);

/// Largest piece of a weight reordered at once in place: the scratch buffer (transient device
/// memory) is at most this, whatever the weight's size.
pub(crate) const SCRATCH_BYTES: u64 = 4 << 20;

/// Counters of a network family's reordered-weights cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct WeightCacheStats {
    /// Lookups served without work: the weight was in the layout asked for (or one that
    /// reads the same), or a copy in it was held.
    pub hits: u64,
    /// Copies the reorder kernel made (misses within the budget).
    pub copies_made: u64,
    /// Weights converted in place (misses the budget could not hold a copy for).
    pub conversions: u64,
    /// Copies released to make room for others.
    pub releases: u64,
    /// Bytes the copies hold now (beside the weights in the data region).
    pub copy_bytes: u64,
    /// The most bytes the copies held.
    pub peak_copy_bytes: u64,
    /// Bytes the copies may hold.
    pub budget_bytes: u64,
}

/// A copy of a weight in another layout.
struct Held {
    buffer: Arc<Buffer>,
    /// The cache's epoch when an iteration last read it.
    used: u64,
}

/// A weight as a kernel reads it: a buffer range and the layout of its blocks there.
pub(crate) struct WeightRef {
    pub buffer: Arc<Buffer>,
    pub offset_bytes: u64,
    pub size_bytes: u64,
    pub layout: WeightLayout,
}

/// The layouts of a family's weights and the copies held (module docs).
pub(crate) struct WeightCache {
    /// Layout of each weight's bytes in the data region (absent: the file's).
    resident: HashMap<WeightKey, WeightLayout>,
    /// Weights only the quantized kernels read, which may be converted in place.
    convertible: HashSet<WeightKey>,
    copies: HashMap<(WeightKey, WeightLayout), Held>,
    scratch: Option<Buffer>,
    /// Scratch buffers outgrown while a frame not yet submitted, or a cached bind group, may
    /// still use them: kept with the family like the scratch (each at most half the next).
    retired: Vec<Buffer>,
    /// Bumped when an iteration starts: copies read since are not released.
    epoch: u64,
    stats: WeightCacheStats,
}

impl WeightCache {
    /// An empty cache whose copies may hold `budget_bytes`.
    pub fn new(budget_bytes: u64) -> WeightCache {
        WeightCache {
            resident: HashMap::new(),
            convertible: HashSet::new(),
            copies: HashMap::new(),
            scratch: None,
            retired: Vec::new(),
            epoch: 0,
            stats: WeightCacheStats {
                budget_bytes,
                ..WeightCacheStats::default()
            },
        }
    }

    /// The layout weight `key` is in on the device.
    pub fn resident(&self, key: WeightKey) -> WeightLayout {
        self.resident.get(&key).copied().unwrap_or_default()
    }

    /// Records that weight `key` is now in `layout` in the data region.
    pub fn set_resident(&mut self, key: WeightKey, layout: WeightLayout) {
        if layout == WeightLayout::File {
            self.resident.remove(&key);
        } else {
            self.resident.insert(key, layout);
        }
    }

    /// Allows weight `key` to be converted in place (only the quantized kernels read it).
    pub fn allow_conversion(&mut self, key: WeightKey) {
        self.convertible.insert(key);
    }

    /// Counters.
    pub fn stats(&self) -> WeightCacheStats {
        self.stats
    }

    /// Starts an iteration: the copies it reads are kept until the next one starts.
    pub fn begin_iteration(&mut self) {
        self.epoch += 1;
    }

    /// Weight `key` (`size_bytes` at `segment`'s `key.1`, of `dtype`) in layout `want` or one
    /// that reads the same, recording into `frame` the reorder that makes it when it is not
    /// there yet (module docs).
    ///
    /// # Errors
    /// [`RunError::Kernel`] when the reorder cannot be recorded (the weight then stays as it
    /// was).
    #[allow(clippy::too_many_arguments)]
    pub fn lookup(
        &mut self,
        engine: &Engine,
        segment: &Arc<Buffer>,
        key: WeightKey,
        size_bytes: u64,
        dtype: DType,
        want: WeightLayout,
        frame: &mut Frame<'_>,
    ) -> Result<WeightRef, RunError> {
        let resident = self.resident(key);
        let here = |layout| in_place(segment, key, size_bytes, layout);
        let reorderable = crate::gpu::kernels::quant::can_group(dtype, size_bytes);
        if resident == want || !reorderable {
            self.stats.hits += 1;
            return Ok(here(resident));
        }
        if let Some(h) = self.copies.get_mut(&(key, want)) {
            h.used = self.epoch;
            self.stats.hits += 1;
            return Ok(WeightRef {
                buffer: Arc::clone(&h.buffer),
                offset_bytes: 0,
                size_bytes,
                layout: want,
            });
        }
        let err = |reason: String| reorder_error(key, reason);
        if let Some(copy) = self.make_room(engine, size_bytes, frame) {
            let shape = elements(dtype, size_bytes);
            frame
                .regroup(
                    &operand(segment, key.1, size_bytes, &shape, dtype, resident),
                    &operand(&copy, 0, size_bytes, &shape, dtype, want),
                )
                .map_err(|e| err(e.to_string()))?;
            let buffer = Arc::new(copy);
            self.copies.insert(
                (key, want),
                Held {
                    buffer: Arc::clone(&buffer),
                    used: self.epoch,
                },
            );
            self.stats.copies_made += 1;
            self.stats.copy_bytes += size_bytes;
            self.stats.peak_copy_bytes = self.stats.peak_copy_bytes.max(self.stats.copy_bytes);
            return Ok(WeightRef {
                buffer,
                offset_bytes: 0,
                size_bytes,
                layout: want,
            });
        }
        if !self.convertible.contains(&key) {
            self.stats.hits += 1;
            return Ok(here(resident));
        }
        self.convert(engine, segment, key, size_bytes, dtype, want, frame)
            .map_err(err)?;
        self.stats.conversions += 1;
        Ok(here(want))
    }

    /// Weight `key` converted in place to `want` now, recorded into `frame`: the
    /// compile-time `update_weights`, after which the device holds that one layout of it (no
    /// copy, whatever the copy budget). As it is when it is in `want` already, has no second
    /// layout, or may not be converted ([`WeightCache::allow_conversion`]).
    ///
    /// # Errors
    /// [`RunError::Kernel`] when the reorder cannot be recorded (the weight then stays as it
    /// was).
    #[cfg(not(target_arch = "wasm32"))]
    #[allow(clippy::too_many_arguments)]
    pub fn convert_in_place(
        &mut self,
        engine: &Engine,
        segment: &Arc<Buffer>,
        key: WeightKey,
        size_bytes: u64,
        dtype: DType,
        want: WeightLayout,
        frame: &mut Frame<'_>,
    ) -> Result<WeightRef, RunError> {
        let resident = self.resident(key);
        let layout = if resident == want
            || !crate::gpu::kernels::quant::can_group(dtype, size_bytes)
            || !self.convertible.contains(&key)
        {
            resident
        } else {
            self.convert(engine, segment, key, size_bytes, dtype, want, frame)
                .map_err(|reason| reorder_error(key, reason))?;
            self.stats.conversions += 1;
            want
        };
        Ok(in_place(segment, key, size_bytes, layout))
    }

    /// A buffer for a copy of `bytes`, when the budget holds it once copies no iteration read
    /// since the current one started are released (the least recently read first).
    fn make_room(&mut self, engine: &Engine, bytes: u64, frame: &mut Frame<'_>) -> Option<Buffer> {
        if bytes > self.stats.budget_bytes {
            return None;
        }
        while self.stats.copy_bytes + bytes > self.stats.budget_bytes {
            let oldest = self
                .copies
                .iter()
                .filter(|(_, h)| h.used < self.epoch)
                .min_by_key(|(_, h)| h.used)
                .map(|(k, _)| *k)?;
            if let Some(h) = self.copies.remove(&oldest) {
                frame
                    .kernels()
                    .forget_bind_groups_binding(&[h.buffer.uid()]);
                self.stats.copy_bytes -= h.buffer.size_bytes();
                self.stats.releases += 1;
            }
        }
        engine
            .allocate_in(
                Region::Constants,
                &BufferDesc {
                    label: "dynrt reordered weight",
                    size_bytes: bytes.div_ceil(4) * 4,
                    kind: AllocKind::UsmDevice,
                },
            )
            .ok()
    }

    /// Converts weight `key` in place from its resident layout to `want`, piece by piece
    /// through the scratch buffer (each piece reordered into it, then copied back).
    #[allow(clippy::too_many_arguments)]
    fn convert(
        &mut self,
        engine: &Engine,
        segment: &Arc<Buffer>,
        key: WeightKey,
        size_bytes: u64,
        dtype: DType,
        want: WeightLayout,
        frame: &mut Frame<'_>,
    ) -> Result<(), String> {
        let format = crate::formats::of_dtype(dtype).ok_or("no weight format")?;
        let group = crate::formats::GROUP_BLOCKS as u64 * u64::from(format.block_bytes);
        let piece = ((SCRATCH_BYTES / group).max(1) * group).min(size_bytes);
        let have = self.scratch.as_ref().map_or(0, Buffer::size_bytes);
        if have < piece {
            // At least twice the outgrown one (which the frame may have used already: kept),
            // so the retired ones stay under the current one's size.
            let bytes = piece.max((2 * have).min(SCRATCH_BYTES)).div_ceil(4) * 4;
            let grown = engine
                .allocate_in(
                    Region::Internal,
                    &BufferDesc {
                        label: "dynrt weight reorder",
                        size_bytes: bytes,
                        kind: AllocKind::UsmDevice,
                    },
                )
                .map_err(|e| e.to_string())?;
            self.retired.extend(self.scratch.replace(grown));
        }
        let Some(scratch) = self.scratch.as_ref() else {
            return Err("no scratch buffer".into());
        };
        let from = self.resident(key);
        let mut at = 0;
        while at < size_bytes {
            let len = piece.min(size_bytes - at);
            let shape = elements(dtype, len);
            frame
                .regroup(
                    &operand(segment, key.1 + at, len, &shape, dtype, from),
                    &operand(scratch, 0, len, &shape, dtype, want),
                )
                .map_err(|e| e.to_string())?;
            frame.copy(scratch, 0, segment, key.1 + at, len.div_ceil(4) * 4);
            at += len;
        }
        self.set_resident(key, want);
        Ok(())
    }
}

/// Weight `key` where it is in the data region, in `layout`.
fn in_place(
    segment: &Arc<Buffer>,
    key: WeightKey,
    size_bytes: u64,
    layout: WeightLayout,
) -> WeightRef {
    WeightRef {
        buffer: Arc::clone(segment),
        offset_bytes: key.1,
        size_bytes,
        layout,
    }
}

/// The error of a reorder of weight `key` that could not be recorded.
fn reorder_error(key: WeightKey, reason: String) -> RunError {
    RunError::Kernel {
        node: format!("weight at {}:{}", key.0, key.1),
        op: "update_weights",
        reason,
    }
}

/// A weight's bytes as a 1-D tensor of its elements (the reorder only needs its bytes).
fn elements(dtype: DType, bytes: u64) -> Shape {
    let (elements, block) = dtype
        .block()
        .map_or((1, 4), |b| (u64::from(b.elements), u64::from(b.bytes)));
    Shape::new(vec![bytes / block * elements])
}

fn operand<'a>(
    buffer: &'a Buffer,
    offset_bytes: u64,
    size_bytes: u64,
    shape: &'a Shape,
    dtype: DType,
    layout: WeightLayout,
) -> Operand<'a> {
    Operand {
        tensor: TensorRef {
            buffer,
            offset_bytes,
            size_bytes,
        },
        shape,
        dtype,
        strides: None,
        layout,
    }
}
