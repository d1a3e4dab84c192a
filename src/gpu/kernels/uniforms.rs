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

/// Bytes of one uniform chunk: the WebGPU minimum of `max_uniform_buffer_binding_size` is 64
/// KiB, but a binding only spans one slot, so the chunk size is free; 64 KiB keeps chunks few.
const CHUNK_BYTES: u64 = 64 * 1024;

struct Chunk {
    buffer: wgpu::Buffer,
    data: Vec<u8>,
    /// What the last [`UniformArena::flush`] wrote to `buffer` (nothing else writes it).
    written: Vec<u8>,
}

/// Uniform slots for the dispatches of one submit. Create once, [`UniformArena::reset`] per
/// iteration, [`UniformArena::flush`] before each submit.
pub struct UniformArena {
    device: wgpu::Device,
    slot_bytes: u64,
    chunks: Vec<Chunk>,
    used_chunks: usize,
    used_in_last: u64,
}

impl UniformArena {
    /// An empty arena on `device`.
    pub fn new(device: &wgpu::Device) -> Self {
        let align = device.limits().min_uniform_buffer_offset_alignment as u64;
        UniformArena {
            device: device.clone(),
            slot_bytes: align.max(256),
            chunks: Vec::new(),
            used_chunks: 0,
            used_in_last: 0,
        }
    }

    /// Reserves a slot holding `value`; returns the chunk buffer and the dynamic offset.
    pub(crate) fn push<T: bytemuck::Pod>(&mut self, value: &T) -> (wgpu::Buffer, u32) {
        let (buffer, offset) = self.push_bytes(bytemuck::bytes_of(value));
        (buffer.clone(), offset)
    }

    /// Reserves a slot holding `bytes` (at most one slot long); returns the chunk buffer and
    /// the dynamic offset.
    pub(crate) fn push_bytes(&mut self, bytes: &[u8]) -> (&wgpu::Buffer, u32) {
        debug_assert!(bytes.len() as u64 <= self.slot_bytes);
        if self.used_chunks == 0 || self.used_in_last + self.slot_bytes > CHUNK_BYTES {
            if self.used_chunks == self.chunks.len() {
                let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("dynrt kernel uniforms"),
                    size: CHUNK_BYTES,
                    usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
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
        (&chunk.buffer, offset as u32)
    }

    /// Writes every slot pushed since the last [`UniformArena::reset`] to the device. Call
    /// before submitting the command buffer that uses them.
    ///
    /// A chunk whose slots are byte for byte what the previous flush wrote is not written
    /// again: the device copy already holds them (queue order: the earlier write landed before
    /// any later submit). Decode with unchanged shapes re-records identical uniforms, and each
    /// `write_buffer` costs a staging allocation and a copy.
    pub fn flush(&mut self, queue: &wgpu::Queue) {
        for chunk in &mut self.chunks[..self.used_chunks] {
            if !chunk.data.is_empty() && chunk.data != chunk.written {
                queue.write_buffer(&chunk.buffer, 0, &chunk.data);
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
