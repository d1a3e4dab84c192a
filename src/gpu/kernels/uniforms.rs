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
    /// The binding of storage slots an entry point declares but a dispatch does not use
    /// (see [`UniformArena::pad`]).
    pad: Option<Buffer>,
    /// Where operands that overlap another binding of their dispatch are copied first (see
    /// [`UniformArena::scratch`]).
    scratch: Option<Buffer>,
    /// Scratch buffers outgrown while a recorded dispatch plan or a cached bind group may
    /// still bind them; kept until the arena is dropped (each at most half the next).
    retired: Vec<Buffer>,
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
            retired: Vec::new(),
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
        let buffer = match self.scratch.take() {
            Some(b) if b.size_bytes() >= bytes => b,
            old => {
                let have = old.as_ref().map_or(0, Buffer::size_bytes);
                let made = self.engine.allocate_in(
                    Region::Internal,
                    &BufferDesc {
                        label: "dynrt aliased operand copies",
                        size_bytes: bytes.max(2 * have),
                        kind: AllocKind::UsmDevice,
                    },
                );
                match made {
                    Ok(b) => {
                        self.retired.extend(old);
                        b
                    }
                    Err(e) => {
                        self.scratch = old;
                        return Err(e);
                    }
                }
            }
        };
        Ok(self.scratch.insert(buffer))
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

    /// Device bytes held by the arena: its uniform chunks, the pad and the scratch buffers
    /// of aliased operands.
    pub fn allocated_bytes(&self) -> u64 {
        self.chunks.len() as u64 * CHUNK_BYTES
            + self
                .pad
                .iter()
                .chain(&self.scratch)
                .chain(&self.retired)
                .map(Buffer::size_bytes)
                .sum::<u64>()
    }
}
