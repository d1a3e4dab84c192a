//! The memory pool's storage on the GPU: every record is a real [`Buffer`] from the
//! [`Engine`], so the pool's allocations appear in the engine's accounting and history.

use super::{AllocError, Buffer, BufferDesc, Engine};
use crate::memory::pool::{Storage, StorageLimits};
use crate::memory::regions::Region;
use crate::memory::AllocKind;

/// [`Storage`] over an [`Engine`]. Cloning the engine is cheap; the storage owns nothing else.
#[derive(Debug, Clone)]
pub struct EngineStorage {
    engine: Engine,
    region: Option<Region>,
}

impl EngineStorage {
    /// Storage that allocates from `engine`, in no region.
    pub fn new(engine: Engine) -> Self {
        EngineStorage {
            engine,
            region: None,
        }
    }

    /// The same storage allocating in `region` (its buffers count there too).
    pub fn in_region(mut self, region: Region) -> Self {
        self.region = Some(region);
        self
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }
}

impl Storage for EngineStorage {
    type Buffer = Buffer;
    type Error = AllocError;

    fn allocate(
        &mut self,
        size_bytes: u64,
        kind: AllocKind,
        label: &str,
    ) -> Result<Buffer, AllocError> {
        let desc = BufferDesc {
            label,
            size_bytes,
            kind,
        };
        match self.region {
            Some(r) => self.engine.allocate_in(r, &desc),
            None => self.engine.allocate(&desc),
        }
    }

    fn size_bytes(buffer: &Buffer) -> u64 {
        buffer.size_bytes()
    }

    fn id(buffer: &Buffer) -> u64 {
        buffer.uid().0
    }

    /// The device's largest buffer, the engine's budget and its device bytes in use (the
    /// numbers [`Engine::can_preallocate`] uses).
    fn note_region(&self, region: Region, size_bytes: u64, placed: bool) {
        self.engine.note_region(region, size_bytes, placed);
    }

    /// One submit of the copies, then a wait for it (native; the browser frees `src` once
    /// the copies ran).
    fn copy_now(
        &mut self,
        src: &Buffer,
        dst: &mut Buffer,
        ranges: &[(u64, u64, u64)],
    ) -> Result<bool, AllocError> {
        self.engine.copy_ranges_and_wait(src, dst, ranges)?;
        Ok(true)
    }

    fn limits(&self) -> StorageLimits {
        StorageLimits {
            max_buffer_bytes: self.engine.max_buffer_size(),
            budget_bytes: self.engine.memory_budget_bytes(),
            in_use_bytes: self.engine.device_bytes_in_use(),
        }
    }
}
