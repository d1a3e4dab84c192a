//! Per-dispatch uniforms for one command buffer.
//!
//! The runtime encodes every dispatch of an iteration into one command buffer, and
//! `queue.write_buffer` lands before the whole submit runs, so one shared uniform written once
//! per dispatch would leave every dispatch reading the last value. Each dispatch therefore
//! gets its own 256-byte slot (`min_uniform_buffer_offset_alignment`) in a chunked uniform
//! buffer, selected by a dynamic offset; only the changed bytes of each chunk are written
//! before the submit. Each `write_buffer` makes wgpu create a staging buffer, so the chunks
//! grow geometrically (an iteration of `n` slots spans O(log n) chunks) and
//! [`crate::gpu::Frame`] packs the changed ranges of all chunks, with the iteration's other
//! host writes, into one write to the arena's upload buffer, copied to their places at the
//! head of the submit ([`UniformArena::flush`] writes them directly instead). Cost: one slot
//! (256 bytes) and one bind group per dispatch; chunks are kept and reused by later iterations
//! (queue order makes a rewrite visible only to later submits).
//!
//! Chunks are engine buffers (`cl_mem`: the kind with `UNIFORM` usage, in the internal
//! region), so they appear in the accounting, the history and the budget like every other
//! buffer.
//!
//! The uniform structs that more than one kernel family fills live here too
//! ([`BroadcastParams`], the prelude's), so that no family imports another's file for them
//! (docs/modules.md: no import cycles between files).

use crate::gpu::{AllocError, Buffer, BufferDesc, Engine};
use crate::memory::regions::Region;
use crate::memory::AllocKind;
use bytemuck::{Pod, Zeroable};

/// `BroadcastParams` of `shaders/common/prelude.wgsl`, the uniform of the broadcasting entry
/// points (`elementwise_binary`, `mask_where`, `logic_main`): up to three inputs read through
/// per-input strides over the output shape (160 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct BroadcastParams {
    /// Output elements.
    pub numel: u32,
    /// Output rank (<= [`super::layout::MAX_RANK`]).
    pub rank: u32,
    /// Output element offset in its binding.
    pub out_offset: u32,
    /// Bit 0: the condition of `where` is f32.
    pub flags: u32,
    /// Element offsets of inputs 0, 1, 2 in their bindings.
    pub offsets: [u32; 4],
    /// Output shape.
    pub shape: [[u32; 4]; 2],
    /// Input 0 strides over the output shape (0 on broadcast dimensions).
    pub strides0: [[u32; 4]; 2],
    /// Input 1 strides.
    pub strides1: [[u32; 4]; 2],
    /// Input 2 strides.
    pub strides2: [[u32; 4]; 2],
}

/// Bytes of the first uniform chunk: a binding only spans one slot, so the chunk size is free.
/// 16 KiB (64 slots) holds a decode step of a small model in one chunk while an idle request,
/// whose chunks count against the device budget like every buffer, holds little.
const CHUNK_BYTES: u64 = 16 * 1024;

/// Largest chunk. Each later chunk is as large as all the chunks before it together (up to
/// this), so an iteration of `n` slots spans O(log n) chunks: each changed chunk costs one
/// `write_buffer`, i.e. one staging buffer created by wgpu per iteration (1546 dispatches of
/// a 30-layer decoder took 25 chunks of 16 KiB, 24-25 staging buffers per decode step; now 6).
const MAX_CHUNK_BYTES: u64 = 4 << 20;

struct Chunk {
    buffer: Buffer,
    data: Vec<u8>,
    /// What the last [`UniformArena::flush`] wrote to `buffer` (nothing else writes it).
    written: Vec<u8>,
}

/// Uniform slots for the dispatches of one submit. Create once, [`UniformArena::reset`] per
/// iteration, [`UniformArena::flush`] before each submit.
pub struct UniformArena {
    engine: Engine,
    slot_bytes: u64,
    chunks: Vec<Chunk>,
    used_chunks: usize,
    used_in_last: u64,
    /// The binding of storage slots an entry point declares but a dispatch does not use
    /// (see [`UniformArena::pad`]).
    pad: Option<Buffer>,
    /// Where operands that overlap another binding of their dispatch are copied first (see
    /// [`UniformArena::scratch`]).
    scratch: Option<Buffer>,
    /// Where multi-dispatch kernels pass data between their dispatches (see
    /// [`UniformArena::workspace`]).
    workspace: Option<Buffer>,
    /// Scratch and workspace buffers outgrown while a recorded dispatch plan or a cached bind group may
    /// still bind them; kept until the arena is dropped (each at most half the next).
    retired: Vec<Buffer>,
    /// Where a submit's host writes are packed ([`UniformArena::upload`]).
    upload: Option<Buffer>,
}

/// The bytes of `data` that differ from `written` (what the device holds), widened to whole
/// 4-byte words (`write_buffer`'s alignment): `None` when nothing differs. Bytes of `data`
/// past the end of `written` differ.
fn changed_range(data: &[u8], written: &[u8]) -> Option<(usize, usize)> {
    let common = data.len().min(written.len());
    let first = data
        .iter()
        .zip(written)
        .position(|(a, b)| a != b)
        .or((data.len() > common).then_some(common))?;
    let last = if data.len() > common {
        data.len()
    } else {
        data[..common]
            .iter()
            .zip(&written[..common])
            .rposition(|(a, b)| a != b)
            .map_or(first + 1, |i| i + 1)
    };
    let start = first / 4 * 4;
    let end = last.div_ceil(4).saturating_mul(4).min(data.len());
    Some((start, end))
}

impl UniformArena {
    /// An empty arena allocating from `engine` (nothing is allocated before the first push).
    pub fn new(engine: &Engine) -> Self {
        let align = u64::from(engine.gpu().limits().min_uniform_buffer_offset_alignment);
        UniformArena {
            engine: engine.clone(),
            slot_bytes: align.max(256),
            chunks: Vec::new(),
            used_chunks: 0,
            used_in_last: 0,
            pad: None,
            scratch: None,
            workspace: None,
            retired: Vec::new(),
            upload: None,
        }
    }

    /// A small storage buffer (`bytes` on first use: one offset-alignment unit per storage
    /// slot, so the unused slots of one dispatch get distinct ranges) bound in the slots an
    /// entry point declares and a dispatch leaves unused (a `logic` op with fewer than three
    /// inputs), so that no slot repeats a real operand: all storage bindings are `read_write`,
    /// and WebGPU (Dawn) rejects two writable bindings of one dispatch whose ranges overlap.
    /// Allocated once per arena (`usm_device`, internal region, counted like every engine
    /// buffer); kernels never read it. Freed when the arena is dropped.
    ///
    /// # Errors
    /// The engine's error when it cannot be allocated.
    pub(crate) fn pad(&mut self, bytes: u64) -> Result<&Buffer, AllocError> {
        let pad = match self.pad.take() {
            Some(pad) => pad,
            None => self.engine.allocate_in(
                Region::Internal,
                &BufferDesc {
                    label: "dynrt unused binding pad",
                    size_bytes: bytes,
                    kind: AllocKind::UsmDevice,
                },
            )?,
        };
        Ok(self.pad.insert(pad))
    }

    /// A storage buffer of at least `bytes` into which a dispatch copies the operands that
    /// overlap another of its bindings (the same tensor given twice, `Mul(x, x)`), so that
    /// the dispatch binds no range twice. One buffer reused by every such dispatch: the copy
    /// and its consumer are consecutive dispatches of one pass, which WebGPU orders. When a
    /// dispatch needs more, a buffer of at least twice the size replaces it and the old one
    /// is kept (recorded plans and cached bind groups may bind it) until the arena is dropped.
    ///
    /// # Errors
    /// The engine's error when it cannot be allocated.
    pub(crate) fn scratch(&mut self, bytes: u64) -> Result<&Buffer, AllocError> {
        grow(
            &self.engine,
            &mut self.scratch,
            &mut self.retired,
            "dynrt aliased operand copies",
            bytes,
        )
    }

    /// A storage buffer of at least `bytes` where a kernel of more than one dispatch keeps
    /// what its first dispatches write for its last (split-key attention's partial softmaxes,
    /// `super::attention`). One buffer reused by every such kernel: its dispatches are
    /// consecutive in one pass, which WebGPU orders, and the next kernel's first dispatch
    /// comes after them. Grows like [`UniformArena::scratch`], the outgrown one kept until the
    /// arena is dropped.
    ///
    /// # Errors
    /// The engine's error when it cannot be allocated.
    pub(crate) fn workspace(&mut self, bytes: u64) -> Result<&Buffer, AllocError> {
        grow(
            &self.engine,
            &mut self.workspace,
            &mut self.retired,
            "dynrt kernel workspace",
            bytes,
        )
    }

    /// Reserves a slot holding `bytes` (at most one slot long); returns the chunk buffer and
    /// the dynamic offset.
    ///
    /// # Errors
    /// The engine's error when a new chunk cannot be allocated.
    pub(crate) fn push_bytes(&mut self, bytes: &[u8]) -> Result<(&Buffer, u32), AllocError> {
        debug_assert!(bytes.len() as u64 <= self.slot_bytes);
        let last_bytes = match self.used_chunks {
            0 => 0,
            n => self.chunks[n - 1].buffer.size_bytes(),
        };
        if self.used_chunks == 0 || self.used_in_last + self.slot_bytes > last_bytes {
            if self.used_chunks == self.chunks.len() {
                let upload = self.upload.as_ref().map_or(0, Buffer::size_bytes);
                let size_bytes = (self.allocated_bytes() - upload)
                    .clamp(CHUNK_BYTES, MAX_CHUNK_BYTES.max(CHUNK_BYTES));
                let buffer = self.engine.allocate_in(
                    Region::Internal,
                    &BufferDesc {
                        label: "dynrt kernel uniforms",
                        size_bytes,
                        kind: AllocKind::ClMem,
                    },
                )?;
                self.chunks.push(Chunk {
                    buffer,
                    data: Vec::with_capacity(size_bytes as usize),
                    written: Vec::with_capacity(size_bytes as usize),
                });
            }
            self.chunks[self.used_chunks].data.clear();
            self.used_chunks += 1;
            self.used_in_last = 0;
        }
        let chunk = &mut self.chunks[self.used_chunks - 1];
        let offset = self.used_in_last;
        chunk.data.resize(offset as usize, 0);
        chunk.data.extend_from_slice(bytes);
        self.used_in_last += self.slot_bytes;
        Ok((&chunk.buffer, offset as u32))
    }

    /// Writes every slot pushed since the last [`UniformArena::reset`] to the device. Call
    /// before submitting the command buffer that uses them.
    ///
    /// A chunk whose slots are byte for byte what the previous flush wrote is not written
    /// again: the device copy already holds them (queue order: the earlier write landed before
    /// any later submit). Decode with unchanged shapes re-records identical uniforms, and each
    /// `write_buffer` costs a staging allocation and a copy.
    pub fn flush(&mut self) {
        let engine = self.engine.clone();
        self.take_changes(|buf, offset, bytes| engine.queue_write_raw(buf, offset, bytes));
    }

    /// What [`UniformArena::flush`] would write, given to `write` instead (the chunk's buffer,
    /// the offset and the changed bytes); the arena then counts them as written, so the caller
    /// must get them onto the device before the submit that reads them.
    pub(crate) fn take_changes(&mut self, mut write: impl FnMut(&wgpu::Buffer, u64, &[u8])) {
        for chunk in &mut self.chunks[..self.used_chunks] {
            if let Some((start, end)) = changed_range(&chunk.data, &chunk.written) {
                write(chunk.buffer.raw(), start as u64, &chunk.data[start..end]);
                chunk.written.clone_from(&chunk.data);
            }
        }
    }

    /// A buffer of at least `bytes` that [`crate::gpu::Frame`] packs a submit's host writes
    /// into (one `write_buffer`, then one copy per destination at the head of the submit:
    /// wgpu creates a staging buffer per `write_buffer`, so this makes one per submit instead
    /// of one per write). Grows to the next power of two; the outgrown one is freed (queue
    /// order: the submits that copied from it are before any later write). Kept by the arena.
    ///
    /// # Errors
    /// The engine's error when it cannot be allocated (the caller then writes directly).
    pub(crate) fn upload(&mut self, bytes: u64) -> Result<&Buffer, AllocError> {
        let upload = match self.upload.take() {
            Some(b) if b.size_bytes() >= bytes => b,
            outgrown => {
                drop(outgrown);
                self.engine.allocate_in(
                    Region::Internal,
                    &BufferDesc {
                        label: "dynrt upload",
                        size_bytes: bytes.next_power_of_two().max(4096),
                        kind: AllocKind::UsmDevice,
                    },
                )?
            }
        };
        Ok(self.upload.insert(upload))
    }

    /// Frees the upload buffer ([`UniformArena::upload`]): a buffer the arena may go without
    /// (a submit then writes directly), given back when device memory is short; a later
    /// submit makes it again where it fits.
    pub(crate) fn release_upload(&mut self) {
        self.upload = None;
    }

    /// Starts a new command buffer's worth of slots (after flushing and submitting the last).
    pub fn reset(&mut self) {
        self.used_chunks = 0;
        self.used_in_last = 0;
    }

    /// Slots pushed since the last reset.
    pub fn slots_used(&self) -> u64 {
        if self.used_chunks == 0 {
            return 0;
        }
        let full: u64 = self.chunks[..self.used_chunks - 1]
            .iter()
            .map(|c| c.buffer.size_bytes() / self.slot_bytes)
            .sum();
        full + self.used_in_last / self.slot_bytes
    }

    /// Device bytes held by the arena: its uniform chunks, the pad, the scratch buffers of
    /// aliased operands, the kernel workspace and the upload buffer.
    pub fn allocated_bytes(&self) -> u64 {
        self.chunks
            .iter()
            .map(|c| c.buffer.size_bytes())
            .sum::<u64>()
            + self
                .pad
                .iter()
                .chain(&self.scratch)
                .chain(&self.workspace)
                .chain(&self.retired)
                .chain(&self.upload)
                .map(Buffer::size_bytes)
                .sum::<u64>()
    }
}

/// The buffer in `slot`, replaced first by one of at least `bytes` (and at least twice the
/// old size) when it is smaller; the outgrown one goes to `retired`. On an allocation error
/// the old buffer stays in `slot`.
fn grow<'a>(
    engine: &Engine,
    slot: &'a mut Option<Buffer>,
    retired: &mut Vec<Buffer>,
    label: &'static str,
    bytes: u64,
) -> Result<&'a Buffer, AllocError> {
    let buffer = match slot.take() {
        Some(b) if b.size_bytes() >= bytes => b,
        old => {
            let have = old.as_ref().map_or(0, Buffer::size_bytes);
            let made = engine.allocate_in(
                Region::Internal,
                &BufferDesc {
                    label,
                    size_bytes: bytes.max(2 * have),
                    kind: AllocKind::UsmDevice,
                },
            );
            match made {
                Ok(b) => {
                    retired.extend(old);
                    b
                }
                Err(e) => {
                    *slot = old;
                    return Err(e);
                }
            }
        }
    };
    Ok(slot.insert(buffer))
}

#[cfg(test)]
mod tests {
    use super::changed_range;

    #[test]
    fn changed_range_covers_the_differing_words_only() {
        let old = [0u8; 16];
        assert_eq!(changed_range(&old, &old), None);
        let mut new = old;
        new[5] = 1;
        new[9] = 2;
        assert_eq!(changed_range(&new, &old), Some((4, 12)));
        // Bytes past what the device holds are new.
        assert_eq!(changed_range(&[0u8; 24], &old), Some((16, 24)));
        assert_eq!(changed_range(&old, &[]), Some((0, 16)));
        let mut longer = [0u8; 24];
        longer[1] = 7;
        assert_eq!(changed_range(&longer, &old), Some((0, 24)));
    }
}
