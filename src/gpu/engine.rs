//! The engine: every real allocation and its accounting; the data paths (uploads, copies,
//! readbacks) are in `transfer`.

use super::usage::kind_usages;
use super::{Gpu, DEFAULT_MEMORY_BUDGET_BYTES};
use crate::memory::accounting::{Accounting, AllocEvent, MemoryStats};
use crate::memory::regions::Region;
use crate::memory::AllocKind;
use futures::FutureExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

mod transfer;

/// Identifies one [`Buffer`] for the life of the process (never reused), so caches can key
/// by buffer without holding it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufferUid(pub u64);

static NEXT_BUFFER: AtomicU64 = AtomicU64::new(1);

/// wgpu's copy alignment: copy offsets and sizes are multiples of 4 bytes, and buffers created
/// `mapped_at_creation` must have a size that is a multiple of 4.
const COPY_ALIGN_BYTES: u64 = wgpu::COPY_BUFFER_ALIGNMENT;
/// Largest staging buffer [`Engine::write`] creates (a multiple of the copy alignment).
pub const UPLOAD_CHUNK_BYTES: u64 = 4 << 20;

/// What to allocate: a label (shown in graphics debuggers and errors), a size and a kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferDesc<'a> {
    /// Debug label of the buffer.
    pub label: &'a str,
    /// Requested size in bytes. The buffer gets `max(4, size rounded up to 4)` bytes (wgpu's
    /// copy alignment); [`Buffer::size_bytes`] and the accounting report that real size.
    pub size_bytes: u64,
    /// Allocation kind (decides the wgpu usages: see [`super::kind_usages`]).
    pub kind: AllocKind,
}

/// Which way a host mapping goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapAccess {
    /// Map for reading.
    Read,
    /// Map for writing.
    Write,
}

/// Allocation and data-path errors. After any of them the engine stays usable and its
/// counters are unchanged (nothing was allocated).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AllocError {
    /// One buffer larger than the device's `max_buffer_size`.
    #[error("allocation of {requested_bytes} bytes exceeds the device's max buffer size of {max_bytes} bytes: split the tensor or use a device with larger buffers")]
    TooLarge {
        /// Requested size.
        requested_bytes: u64,
        /// The device limit.
        max_bytes: u64,
    },
    /// The device-memory budget would be exceeded.
    #[error("allocation of {requested_bytes} bytes would exceed the device memory budget ({in_use_bytes} of {budget_bytes} bytes in use): free buffers or raise DYNRT_MEMORY_BUDGET")]
    OverBudget {
        /// Requested size.
        requested_bytes: u64,
        /// Device bytes in use before the request.
        in_use_bytes: u64,
        /// The budget.
        budget_bytes: u64,
    },
    /// The driver ran out of memory (reported through a wgpu error scope).
    #[error("the driver is out of memory allocating {requested_bytes} bytes")]
    OutOfMemory {
        /// Requested size.
        requested_bytes: u64,
    },
    /// wgpu rejected the operation (validation error caught by an error scope).
    #[error("wgpu validation error: {0}")]
    Validation(String),
    /// The buffer's kind may not be bound to a kernel (`usm_host`).
    #[error("a {kind} buffer cannot be bound to a kernel: allocate usm_device, usm_shared or cl_mem and copy into it")]
    NotBindable {
        /// The buffer's kind.
        kind: AllocKind,
    },
    /// The buffer's kind may not be mapped that way.
    #[error("a {kind} buffer cannot be mapped for {access:?}: use Engine::read / Engine::write, which stage through usm_host")]
    NotMappable {
        /// The buffer's kind.
        kind: AllocKind,
        /// The access asked for.
        access: MapAccess,
    },
    /// The kind (or this use of it) is not available on this device.
    #[error("{kind} is not supported here: {reason}")]
    Unsupported {
        /// The kind.
        kind: AllocKind,
        /// Why.
        reason: &'static str,
    },
    /// An offset or size is not a multiple of wgpu's copy alignment.
    #[error(
        "offset {offset_bytes} and size {size_bytes} must be multiples of {align_bytes} bytes"
    )]
    Misaligned {
        /// Offset asked for.
        offset_bytes: u64,
        /// Size asked for.
        size_bytes: u64,
        /// Required alignment.
        align_bytes: u64,
    },
    /// A range reaches past the end of the buffer.
    #[error("range of {size_bytes} bytes at offset {offset_bytes} is outside the {buffer_bytes}-byte buffer")]
    OutOfBounds {
        /// Offset asked for.
        offset_bytes: u64,
        /// Size asked for.
        size_bytes: u64,
        /// The buffer's size.
        buffer_bytes: u64,
    },
    /// More initial contents than the buffer holds.
    #[error("{data_bytes} bytes of contents do not fit a {size_bytes}-byte buffer")]
    ContentsTooLarge {
        /// Length of the contents.
        data_bytes: u64,
        /// The buffer's size.
        size_bytes: u64,
    },
    /// One binding larger than the device's `max_storage_buffer_binding_size`.
    #[error("a binding of {size_bytes} bytes exceeds the device's max storage binding size of {max_bytes} bytes: split the dispatch")]
    BindingTooLarge {
        /// Size of the binding asked for.
        size_bytes: u64,
        /// The device limit.
        max_bytes: u64,
    },
    /// A copy from a buffer into itself (WebGPU forbids it, even for disjoint ranges).
    #[error("copy from `{label}` into itself: WebGPU forbids copies within one buffer; go through a second buffer")]
    SameBufferCopy {
        /// The buffer's label.
        label: String,
    },
    /// Mapping failed (the buffer was already mapped, or wgpu refused the map).
    #[error("buffer mapping failed: {0}")]
    Map(String),
    /// The device is lost ([`Gpu::is_lost`]): nothing more can be done on it.
    #[error(transparent)]
    DeviceLost(#[from] super::DeviceLost),
}

impl AllocError {
    /// Whether this is [`AllocError::DeviceLost`].
    pub fn is_device_lost(&self) -> bool {
        matches!(self, AllocError::DeviceLost(_))
    }
}

pub use super::usage::KindRequest;

pub(crate) struct EngineInner {
    gpu: Gpu,
    accounting: Mutex<Accounting>,
    budget_bytes: u64,
    /// The staging copies of [`Engine::write`] not yet waited for (submission, bytes), oldest
    /// first: a new chunk waits for the oldest until they and it hold at most two chunks'
    /// worth, so small writes (most weights of a model) rarely wait.
    uploads_in_flight: Mutex<std::collections::VecDeque<(wgpu::SubmissionIndex, u64)>>,
}

impl EngineInner {
    fn accounting(&self) -> MutexGuard<'_, Accounting> {
        // A poisoned lock only means another thread panicked while holding it; the counters
        // are plain integers that are always consistent between statements.
        self.accounting.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The allocation entry point. Cloning is cheap (an `Arc`); clones share counters and history.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<EngineInner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("gpu", &self.inner.gpu)
            .field("budget_bytes", &self.inner.budget_bytes)
            .finish()
    }
}

/// A real wgpu buffer with its kind. Dropping it destroys the buffer (wgpu defers the actual
/// release until submitted work that uses it has finished) and records the free.
pub struct Buffer {
    raw: wgpu::Buffer,
    uid: BufferUid,
    kind: AllocKind,
    size_bytes: u64,
    label: String,
    readback: bool,
    region: Option<Region>,
    engine: Arc<EngineInner>,
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("label", &self.label)
            .field("kind", &self.kind)
            .field("size_bytes", &self.size_bytes)
            .finish()
    }
}

impl Buffer {
    /// The allocation kind.
    pub fn kind(&self) -> AllocKind {
        self.kind
    }
    /// Real size in bytes (the request rounded up to 4, at least 4).
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    /// The label given at allocation.
    pub fn label(&self) -> &str {
        &self.label
    }
    /// The buffer's process-wide identity.
    pub fn uid(&self) -> BufferUid {
        self.uid
    }
    /// The region the buffer was allocated in ([`Engine::allocate_in`]), if any.
    pub fn region(&self) -> Option<Region> {
        self.region
    }
    /// The wgpu usages the buffer was created with.
    pub fn usages(&self) -> wgpu::BufferUsages {
        self.raw.usage()
    }
    /// The buffer for a bind group entry.
    ///
    /// # Errors
    /// [`AllocError::NotBindable`] for `usm_host` (and the engine's readback buffers): wgpu
    /// would reject the bind group, and dynrt says so before it does.
    pub fn binding(&self) -> Result<&wgpu::Buffer, AllocError> {
        if self.kind.bindable() && !self.readback {
            Ok(&self.raw)
        } else {
            Err(AllocError::NotBindable { kind: self.kind })
        }
    }
    /// A sub-range for a storage-buffer bind group entry (a view: nothing is allocated or
    /// counted). `offset_bytes` must be a multiple of the device's
    /// `min_storage_buffer_offset_alignment` (a wgpu rule).
    ///
    /// # Errors
    /// [`AllocError::NotBindable`], [`AllocError::Misaligned`], [`AllocError::OutOfBounds`],
    /// [`AllocError::BindingTooLarge`]; a zero size is [`AllocError::OutOfBounds`] (wgpu has
    /// no empty bindings).
    pub fn binding_range(
        &self,
        offset_bytes: u64,
        size_bytes: u64,
    ) -> Result<wgpu::BufferBinding<'_>, AllocError> {
        let raw = self.binding()?;
        let limits = self.engine.gpu.limits();
        let align = u64::from(limits.min_storage_buffer_offset_alignment);
        if offset_bytes % align != 0 {
            return Err(AllocError::Misaligned {
                offset_bytes,
                size_bytes,
                align_bytes: align,
            });
        }
        check_range(self, offset_bytes, size_bytes)?;
        let size = std::num::NonZeroU64::new(size_bytes).ok_or(AllocError::OutOfBounds {
            offset_bytes,
            size_bytes,
            buffer_bytes: self.size_bytes,
        })?;
        let max_bytes = limits.max_storage_buffer_binding_size;
        if size_bytes > max_bytes {
            return Err(AllocError::BindingTooLarge {
                size_bytes,
                max_bytes,
            });
        }
        Ok(wgpu::BufferBinding {
            buffer: raw,
            offset: offset_bytes,
            size: Some(size),
        })
    }
    /// The wgpu buffer, for copies (every kind has `COPY_SRC`).
    pub fn raw(&self) -> &wgpu::Buffer {
        &self.raw
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        {
            // Destroying takes the GL context; the wgpu handle dropped after this holds no
            // device memory any more, so its own drop does not.
            let _device = self.engine.gpu.lock_device();
            self.raw.destroy();
        }
        let mut acc = self.engine.accounting();
        acc.record_free(self.kind, self.size_bytes);
        if let Some(r) = self.region {
            acc.record_region(r, self.size_bytes, false);
        }
    }
}

fn round_up(x: u64, align: u64) -> Option<u64> {
    x.checked_add(align - 1).map(|v| v / align * align)
}

fn check_range(buf: &Buffer, offset_bytes: u64, size_bytes: u64) -> Result<(), AllocError> {
    match offset_bytes.checked_add(size_bytes) {
        Some(end) if end <= buf.size_bytes => Ok(()),
        _ => Err(AllocError::OutOfBounds {
            offset_bytes,
            size_bytes,
            buffer_bytes: buf.size_bytes,
        }),
    }
}

fn scope_error(e: wgpu::Error, requested_bytes: u64) -> AllocError {
    match e {
        wgpu::Error::OutOfMemory { .. } => AllocError::OutOfMemory { requested_bytes },
        other => AllocError::Validation(other.to_string()),
    }
}

impl Engine {
    /// An engine on `gpu` with the budget from its options ([`super::GpuOptions`]), or
    /// [`DEFAULT_MEMORY_BUDGET_BYTES`].
    pub fn new(gpu: Gpu) -> Engine {
        let budget = gpu
            .options()
            .memory_budget_bytes
            .unwrap_or(DEFAULT_MEMORY_BUDGET_BYTES);
        Engine::with_memory_budget(gpu, budget)
    }

    /// An engine with an explicit device-memory budget in bytes.
    pub fn with_memory_budget(gpu: Gpu, budget_bytes: u64) -> Engine {
        let verbose = gpu.options().verbose;
        Engine {
            inner: Arc::new(EngineInner {
                gpu,
                accounting: Mutex::new(Accounting::with_verbose(verbose)),
                budget_bytes,
                uploads_in_flight: Mutex::default(),
            }),
        }
    }

    /// The GPU the engine allocates on.
    pub fn gpu(&self) -> &Gpu {
        &self.inner.gpu
    }

    /// Allocates a buffer of `desc.kind`. Contents are zero (WebGPU zero-initialises).
    /// The returned [`Buffer`] frees itself on drop.
    ///
    /// # Errors
    /// [`AllocError::Unsupported`] (`usm_shared` without `MAPPABLE_PRIMARY_BUFFERS`),
    /// [`AllocError::TooLarge`], [`AllocError::OverBudget`] (kinds that count against the
    /// device: all but `usm_host`), [`AllocError::OutOfMemory`] / [`AllocError::Validation`]
    /// from the driver. On the web, driver errors surface only through
    /// [`Engine::allocate_async`] (error scopes resolve asynchronously there).
    pub fn allocate(&self, desc: &BufferDesc) -> Result<Buffer, AllocError> {
        self.allocate_inner(desc, kind_usages(desc.kind), false, None)
    }

    /// [`Engine::allocate`] in a device region (docs/design.md): the buffer also counts in that
    /// region's bytes, buffers and peak ([`MemoryStats::regions`]) until it is dropped.
    ///
    /// # Errors
    /// As [`Engine::allocate`].
    pub fn allocate_in(&self, region: Region, desc: &BufferDesc) -> Result<Buffer, AllocError> {
        let mut b = self.allocate(desc)?;
        b.region = Some(region);
        self.inner
            .accounting()
            .record_region(region, b.size_bytes, true);
        Ok(b)
    }

    /// Counts `size_bytes` placed in (`placed`) or taken out of `region` as a range of a
    /// buffer shared by several regions (the data region of a network: constants from one
    /// end, placeholders from the other). The buffer itself counts by kind only.
    pub fn note_region(&self, region: Region, size_bytes: u64, placed: bool) {
        self.inner
            .accounting()
            .record_region(region, size_bytes, placed);
    }

    /// A `usm_host` buffer the host maps for reading (`MAP_READ | COPY_DST`), a copy
    /// destination only: the buffers of [`super::ReadbackRing`].
    ///
    /// # Errors
    /// As [`Engine::allocate`].
    pub(crate) fn allocate_readback(&self, desc: &BufferDesc) -> Result<Buffer, AllocError> {
        self.allocate_inner(desc, super::usage::readback_usages(), true, None)
    }

    /// Allocates and fills the first `contents.len()` bytes through `mapped_at_creation` (no
    /// staging buffer, no queue write). The rest is zero.
    ///
    /// # Errors
    /// As [`Engine::allocate`], and [`AllocError::ContentsTooLarge`].
    pub fn allocate_init(&self, desc: &BufferDesc, contents: &[u8]) -> Result<Buffer, AllocError> {
        self.allocate_inner(desc, kind_usages(desc.kind), false, Some(contents))
    }

    /// [`Engine::allocate`] that awaits wgpu's error scopes, so driver out-of-memory is a
    /// `Result` on the web too.
    ///
    /// # Errors
    /// As [`Engine::allocate`].
    pub async fn allocate_async(&self, desc: &BufferDesc<'_>) -> Result<Buffer, AllocError> {
        let (size, usage) = self.admit(desc, kind_usages(desc.kind))?;
        // The budget check is not atomic with the allocation here (a lock cannot be held
        // across the await); concurrent allocations may overshoot the budget by one buffer.
        self.check_budget(&self.inner.accounting(), desc, size, false)?;
        let gpu = &self.inner.gpu;
        let device = gpu.device();
        let (v, o, raw) = {
            let _device = gpu.lock_device();
            let oom = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
            let val = device.push_error_scope(wgpu::ErrorFilter::Validation);
            let raw = device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(desc.label),
                size,
                usage,
                mapped_at_creation: false,
            });
            (val.pop(), oom.pop(), raw)
        };
        if let Some(e) = v.await.or(o.await) {
            let _device = gpu.lock_device();
            raw.destroy();
            return Err(self.lost_or(scope_error(e, desc.size_bytes)));
        }
        self.inner.accounting().record_allocate(desc.kind, size);
        Ok(self.wrap(raw, desc, size, false))
    }

    /// Size after rounding, and the checks that need no device call.
    fn admit(
        &self,
        desc: &BufferDesc,
        usage: wgpu::BufferUsages,
    ) -> Result<(u64, wgpu::BufferUsages), AllocError> {
        self.inner.gpu.check_alive()?;
        let support = self.inner.gpu.kind_support(desc.kind);
        if !support.supported {
            return Err(AllocError::Unsupported {
                kind: desc.kind,
                reason: support.reason,
            });
        }
        let max_bytes = self.max_buffer_size();
        let size =
            round_up(desc.size_bytes.max(1), COPY_ALIGN_BYTES).ok_or(AllocError::TooLarge {
                requested_bytes: desc.size_bytes,
                max_bytes,
            })?;
        if size > max_bytes {
            return Err(AllocError::TooLarge {
                requested_bytes: desc.size_bytes,
                max_bytes,
            });
        }
        Ok((size, usage))
    }

    /// The budget check, against counters the caller has locked (so that the check and the
    /// allocation it admits are atomic with respect to other threads).
    fn check_budget(
        &self,
        acc: &Accounting,
        desc: &BufferDesc,
        size: u64,
        readback: bool,
    ) -> Result<(), AllocError> {
        if desc.kind.on_device() && !readback {
            let in_use_bytes = acc.stats().device_current_bytes();
            if in_use_bytes.saturating_add(size) > self.inner.budget_bytes {
                return Err(AllocError::OverBudget {
                    requested_bytes: desc.size_bytes,
                    in_use_bytes,
                    budget_bytes: self.inner.budget_bytes,
                });
            }
        }
        Ok(())
    }

    /// Wraps a created buffer whose allocation has been recorded.
    fn wrap(&self, raw: wgpu::Buffer, desc: &BufferDesc, size: u64, readback: bool) -> Buffer {
        Buffer {
            raw,
            uid: BufferUid(NEXT_BUFFER.fetch_add(1, Ordering::Relaxed)),
            kind: desc.kind,
            size_bytes: size,
            label: desc.label.to_string(),
            readback,
            region: None,
            engine: self.inner.clone(),
        }
    }

    fn allocate_inner(
        &self,
        desc: &BufferDesc,
        usage: wgpu::BufferUsages,
        readback: bool,
        contents: Option<&[u8]>,
    ) -> Result<Buffer, AllocError> {
        let (size, usage) = self.admit(desc, usage)?;
        if let Some(c) = contents {
            if c.len() as u64 > size {
                return Err(AllocError::ContentsTooLarge {
                    data_bytes: c.len() as u64,
                    size_bytes: size,
                });
            }
        }
        let gpu = &self.inner.gpu;
        // The device lock is taken before the accounting lock, here as everywhere: a buffer
        // dropped while its thread holds the device records its free under both.
        let _device = gpu.lock_device();
        let raw = {
            let mut acc = self.inner.accounting();
            self.check_budget(&acc, desc, size, readback)?;
            let raw = create_buffer_checked(
                gpu,
                &wgpu::BufferDescriptor {
                    label: Some(desc.label),
                    size,
                    usage,
                    mapped_at_creation: contents.is_some(),
                },
            )
            .map_err(|e| self.lost_or(scope_error(e, desc.size_bytes)))?;
            acc.record_allocate(desc.kind, size);
            raw
        };
        // From here the Buffer owns the accounting: an error below drops it and records the
        // free of what was really allocated.
        let buffer = self.wrap(raw, desc, size, readback);
        if let Some(c) = contents {
            let filled = buffer
                .raw
                .slice(..)
                .get_mapped_range_mut()
                .map(|mut view| view.slice(..c.len()).copy_from_slice(c));
            if filled.is_ok() {
                buffer.raw.unmap();
            }
            filled.map_err(|e| self.lost_or(AllocError::Map(e.to_string())))?;
        }
        Ok(buffer)
    }

    /// `e`, or [`AllocError::DeviceLost`] when the device is lost (wgpu reports the errors
    /// of calls on a lost device only through the device-lost callback, and dynrt's own
    /// checks then fail in their own words).
    pub(crate) fn lost_or(&self, e: AllocError) -> AllocError {
        match self.inner.gpu.lost() {
            Some(lost) => AllocError::DeviceLost(lost),
            None => e,
        }
    }

    /// Per-kind bytes in use, peak bytes, allocation and free counts.
    pub fn stats(&self) -> MemoryStats {
        self.inner.accounting().stats()
    }

    /// The recorded Allocate/Free events, oldest first: empty unless
    /// [`Engine::record_history`] is on (the counters of [`Engine::stats`] are always kept).
    pub fn history(&self) -> Vec<AllocEvent> {
        self.inner.accounting().history()
    }

    /// Keeps the last `capacity` Allocate/Free events from now on (0 stops): a bounded
    /// recorder, so a long-running process does not grow a history.
    pub fn record_history(&self, capacity: usize) {
        self.inner.accounting().record_history(capacity);
    }

    /// Events the recorder dropped because it was full.
    pub fn history_dropped(&self) -> u64 {
        self.inner.accounting().history_dropped()
    }

    /// Heap bytes the recorded events take (0 without a recorder).
    pub fn history_heap_bytes(&self) -> usize {
        self.inner.accounting().history_heap_bytes()
    }

    /// Bytes in use of the kinds that count against the budget (all but `usm_host`).
    pub fn device_bytes_in_use(&self) -> u64 {
        self.stats().device_current_bytes()
    }

    /// The device-memory budget in bytes.
    pub fn memory_budget_bytes(&self) -> u64 {
        self.inner.budget_bytes
    }

    /// Largest single buffer the device allows, in bytes.
    pub fn max_buffer_size(&self) -> u64 {
        self.inner.gpu.limits().max_buffer_size
    }

    /// The OpenVINO GPU plugin's rule (docs/design.md, "Shape predictor"): false if
    /// `size_bytes` exceeds the largest buffer; otherwise true iff device bytes in use plus
    /// `size_bytes` stay below 90% of the budget.
    pub fn can_preallocate(&self, size_bytes: u64) -> bool {
        // One rule, kept with the predictor (memory::predictor::can_preallocate).
        crate::memory::predictor::can_preallocate(
            size_bytes,
            self.max_buffer_size(),
            self.device_bytes_in_use(),
            self.inner.budget_bytes,
        )
    }

    /// The kind the reference would choose for `req` on this device
    /// ([`super::usage::preferred_kind`], the one home of the rule): `usm_shared` only where
    /// the adapter's memory is the host's and the device maps storage buffers.
    pub fn preferred_kind(&self, req: &KindRequest) -> AllocKind {
        let left = self
            .inner
            .budget_bytes
            .saturating_sub(self.device_bytes_in_use());
        super::usage::preferred_kind(req, self.inner.gpu.supports_shared(), left)
    }
}

/// Creates a buffer inside OutOfMemory and Validation error scopes. On native (wgpu-core) the
/// scopes resolve immediately; on the web they resolve later, so the check is skipped there
/// and errors reach the uncaptured-error handler (use [`Engine::allocate_async`]).
fn create_buffer_checked(
    gpu: &Gpu,
    desc: &wgpu::BufferDescriptor,
) -> Result<wgpu::Buffer, wgpu::Error> {
    let device = gpu.device();
    // Reentrant: the caller holds it already, so that the budget check and the allocation
    // are one step for other threads too.
    let _device = gpu.lock_device();
    let oom = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
    let val = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let raw = device.create_buffer(desc);
    // Scopes pop in reverse order of their pushes.
    let v = val.pop().now_or_never().flatten();
    let o = oom.pop().now_or_never().flatten();
    match v.or(o) {
        Some(e) => {
            raw.destroy();
            Err(e)
        }
        None => Ok(raw),
    }
}
