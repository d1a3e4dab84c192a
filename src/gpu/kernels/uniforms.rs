//! Per-dispatch uniforms for one command buffer.
//!
//! The runtime encodes every dispatch of an iteration into one command buffer, and
//! `queue.write_buffer` lands before the whole submit runs, so one shared uniform written once
//! per dispatch would leave every dispatch reading the last value. Each dispatch therefore
//! gets its own 256-byte slot (`min_uniform_buffer_offset_alignment`) in a chunked uniform
//! buffer, selected by a dynamic offset; the host copies of all slots are written with one
//! `write_buffer` per chunk in [`UniformArena::flush`] before the submit. Cost: one slot
//! (256 bytes) and one bind group per dispatch; chunks are kept and reused by later
//! iterations (queue order makes a rewrite visible only to later submits).
//!
//! Chunks are engine buffers (`cl_mem`: the kind with `UNIFORM` usage, in the internal
//! region), so they appear in the accounting, the history and the budget like every other
//! buffer.

use crate::gpu::{AllocError, Buffer, BufferDesc, Engine};
use crate::memory::regions::Region;
use crate::memory::AllocKind;

/// Bytes of one uniform chunk: a binding only spans one slot, so the chunk size is free. 16 KiB
/// (64 slots) holds a decode step of a small model in one chunk while an idle request, whose
/// chunks count against the device budget like every buffer, holds little.
const CHUNK_BYTES: u64 = 16 * 1024;

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
        }
    }

    /// Reserves a slot holding `value`; returns the chunk buffer and the dynamic offset.
    ///
    /// # Errors
    /// The engine's error when a new chunk cannot be allocated.
    pub(crate) fn push<T: bytemuck::Pod>(
        &mut self,
        value: &T,
    ) -> Result<(&Buffer, u32), AllocError> {
        self.push_bytes(bytemuck::bytes_of(value))
    }

    /// Reserves a slot holding `bytes` (at most one slot long); returns the chunk buffer and
    /// the dynamic offset.
    ///
    /// # Errors
    /// The engine's error when a new chunk cannot be allocated.
    pub(crate) fn push_bytes(&mut self, bytes: &[u8]) -> Result<(&Buffer, u32), AllocError> {
        debug_assert!(bytes.len() as u64 <= self.slot_bytes);
        if self.used_chunks == 0 || self.used_in_last + self.slot_bytes > CHUNK_BYTES {
            if self.used_chunks == self.chunks.len() {
                let buffer = self.engine.allocate_in(
                    Region::Internal,
                    &BufferDesc {
                        label: "dynrt kernel uniforms",
                        size_bytes: CHUNK_BYTES,
                        kind: AllocKind::ClMem,
                    },
                )?;
                self.chunks.push(Chunk {
                    buffer,
                    data: Vec::with_capacity(CHUNK_BYTES as usize),
                    written: Vec::with_capacity(CHUNK_BYTES as usize),
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
        for chunk in &mut self.chunks[..self.used_chunks] {
            if !chunk.data.is_empty() && chunk.data != chunk.written {
                self.engine.queue_write(&chunk.buffer, 0, &chunk.data);
                chunk.written.clone_from(&chunk.data);
            }
        }
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
        (self.used_chunks as u64 - 1) * (CHUNK_BYTES / self.slot_bytes)
            + self.used_in_last / self.slot_bytes
    }

    /// Device bytes held by the arena's chunks.
    pub fn allocated_bytes(&self) -> u64 {
        self.chunks.len() as u64 * CHUNK_BYTES
    }
}
