//! The engine's data paths: uploads (staged in chunks, or mapped), copies between buffers and
//! readbacks.

use super::{
    check_range, round_up, AllocError, Buffer, BufferDesc, Engine, MapAccess, COPY_ALIGN_BYTES,
    UPLOAD_CHUNK_BYTES,
};
use crate::gpu::usage::{kind_usages, readback_usages};
#[cfg(not(target_arch = "wasm32"))]
use crate::gpu::Polled;
use crate::memory::AllocKind;
use futures::FutureExt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};

/// wgpu's map alignment: a mapped range starts at a multiple of 8 bytes.
const MAP_ALIGN_BYTES: u64 = wgpu::MAP_ALIGNMENT;

impl Engine {
    /// Writes `data` at `offset_bytes`. For `usm_device`, `usm_shared` and `cl_mem` the bytes
    /// go into `usm_host` staging buffers created `mapped_at_creation` (at most
    /// [`UPLOAD_CHUNK_BYTES`] each; one Allocate/Free pair per chunk in the history) and copies
    /// are submitted; the write is visible to work submitted after
    /// this call. For `usm_host` the buffer itself is mapped for writing (native: blocks).
    ///
    /// # Errors
    /// [`AllocError::Misaligned`] (offset and length must be multiples of 4),
    /// [`AllocError::OutOfBounds`], allocation errors of the staging buffer, and on wasm32
    /// [`AllocError::Unsupported`] for `usm_host` (use [`Engine::write_mapped`]).
    pub fn write(&self, buf: &Buffer, offset_bytes: u64, data: &[u8]) -> Result<(), AllocError> {
        let len = data.len() as u64;
        check_copy_aligned(offset_bytes, len)?;
        check_range(buf, offset_bytes, len)?;
        if len == 0 {
            return Ok(());
        }
        if !buf.usages().contains(wgpu::BufferUsages::COPY_DST) {
            #[cfg(not(target_arch = "wasm32"))]
            return pollster::block_on(self.write_mapped(buf, offset_bytes, data));
            #[cfg(target_arch = "wasm32")]
            return Err(AllocError::Unsupported {
                kind: buf.kind,
                reason: "a usm_host buffer is written by mapping, which is asynchronous on the web: use Engine::write_mapped",
            });
        }
        // Large uploads go through staging chunks so the host side never holds a second copy
        // of a whole weight tensor; each chunk is one Allocate/Free pair in the history.
        for (i, chunk) in data.chunks(UPLOAD_CHUNK_BYTES as usize).enumerate() {
            let chunk_offset = offset_bytes + i as u64 * UPLOAD_CHUNK_BYTES;
            let chunk_len = chunk.len() as u64;
            // Bound the staging alive (wgpu frees a dropped staging buffer at a poll after its
            // copy has run): uploading 542 MB of weights left tens of MB of staging to wgpu's
            // next poll before.
            self.wait_for_uploads((2 * UPLOAD_CHUNK_BYTES).saturating_sub(chunk_len));
            let staging = self.allocate_inner(
                &BufferDesc {
                    label: "dynrt upload staging",
                    size_bytes: chunk_len,
                    kind: AllocKind::UsmHost,
                },
                kind_usages(AllocKind::UsmHost),
                false,
                Some(chunk),
            )?;
            let index = submit_checked(self, "dynrt upload", |enc| {
                enc.copy_buffer_to_buffer(staging.raw(), 0, buf.raw(), chunk_offset, chunk_len)
            })?;
            // Dropping the staging buffer destroys it once the copy has executed (wgpu defers
            // the destruction of buffers used by pending submissions, until a poll).
            drop(staging);
            self.in_flight().push_back((index, chunk_len));
        }
        Ok(())
    }

    fn in_flight(
        &self,
    ) -> MutexGuard<'_, std::collections::VecDeque<(wgpu::SubmissionIndex, u64)>> {
        self.inner
            .uploads_in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for the oldest staging copies of [`Engine::write`] until at most `bytes` of
    /// staging are in flight (each wait's poll frees what it waited for).
    fn wait_for_uploads(&self, bytes: u64) {
        loop {
            let oldest = {
                let mut q = self.in_flight();
                if q.iter().map(|&(_, b)| b).sum::<u64>() <= bytes {
                    return;
                }
                q.pop_front()
            };
            match oldest {
                Some((index, _)) => self.inner.gpu.wait_for(index),
                None => return,
            }
        }
    }

    /// Schedules a write of `data` at `offset_bytes` through the queue: it lands at the start of
    /// the next submit, before every command of that submit (so never write a buffer that an
    /// unsubmitted command still reads). wgpu stages the bytes in its own belt; the engine
    /// counts them ([`MemoryStats::queue_write_bytes`]). Offset and length must be multiples
    /// of 4 and inside the buffer (checked by wgpu; the runtime only writes what it sized).
    ///
    /// [`MemoryStats::queue_write_bytes`]:
    ///     crate::memory::accounting::MemoryStats::queue_write_bytes
    pub fn queue_write(&self, buf: &Buffer, offset_bytes: u64, data: &[u8]) {
        self.queue_write_raw(&buf.raw, offset_bytes, data);
    }

    pub(crate) fn queue_write_raw(&self, raw: &wgpu::Buffer, offset_bytes: u64, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let gpu = &self.inner.gpu;
        if gpu.is_lost() {
            // Nothing reaches a lost device; the next call that returns a result says so.
            return;
        }
        self.inner
            .accounting()
            .record_queue_write(data.len() as u64);
        // wgpu stages the bytes in a buffer it creates and maps: both take the GL context.
        let _device = gpu.lock_device();
        gpu.queue().write_buffer(raw, offset_bytes, data);
    }

    /// Copies `size_bytes` from `src` at `src_offset_bytes` to `dst` at `dst_offset_bytes` on
    /// the GPU (submitted now, ordered after earlier submissions). Every kind is a copy source;
    /// `usm_host` is not a destination.
    ///
    /// # Errors
    /// [`AllocError::Misaligned`], [`AllocError::OutOfBounds`],
    /// [`AllocError::SameBufferCopy`], [`AllocError::Unsupported`] for a `usm_host`
    /// destination.
    pub fn copy(
        &self,
        src: &Buffer,
        src_offset_bytes: u64,
        dst: &Buffer,
        dst_offset_bytes: u64,
        size_bytes: u64,
    ) -> Result<(), AllocError> {
        self.submit_copies(
            src,
            dst,
            &[(src_offset_bytes, dst_offset_bytes, size_bytes)],
        )
        .map(drop)
    }

    /// Copies `ranges` (`(source offset, destination offset, bytes)`) from `src` to `dst` in
    /// one submit and waits until it has run (native; on the web the browser runs it in
    /// order), so `src` can be dropped and really freed next.
    ///
    /// # Errors
    /// As [`Engine::copy`], for any range; nothing is submitted then.
    pub fn copy_ranges_and_wait(
        &self,
        src: &Buffer,
        dst: &Buffer,
        ranges: &[(u64, u64, u64)],
    ) -> Result<(), AllocError> {
        if let Some(index) = self.submit_copies(src, dst, ranges)? {
            self.inner.gpu.wait_for(index);
        }
        Ok(())
    }

    /// Checks every range, then submits their copies in one command buffer (none when all
    /// are empty).
    fn submit_copies(
        &self,
        src: &Buffer,
        dst: &Buffer,
        ranges: &[(u64, u64, u64)],
    ) -> Result<Option<wgpu::SubmissionIndex>, AllocError> {
        for &(from, to, len) in ranges {
            check_copy_aligned(from, len)?;
            check_copy_aligned(to, len)?;
            check_range(src, from, len)?;
            check_range(dst, to, len)?;
        }
        if !dst.usages().contains(wgpu::BufferUsages::COPY_DST) || dst.readback {
            return Err(AllocError::Unsupported {
                kind: dst.kind,
                reason: "not a copy destination: write it with Engine::write_mapped",
            });
        }
        // Each `Buffer` owns its wgpu buffer alone, so identity of the handles is identity of
        // the buffers.
        if std::ptr::eq(src, dst) {
            return Err(AllocError::SameBufferCopy {
                label: src.label.clone(),
            });
        }
        if ranges.iter().all(|r| r.2 == 0) {
            return Ok(None);
        }
        let index = submit_checked(self, "dynrt copy", |enc| {
            for &(from, to, len) in ranges.iter().filter(|r| r.2 > 0) {
                enc.copy_buffer_to_buffer(src.raw(), from, dst.raw(), to, len);
            }
        })?;
        Ok(Some(index))
    }

    /// Maps a host-mappable buffer (`usm_host`, `usm_shared`) for writing and copies `data` in.
    ///
    /// # Errors
    /// [`AllocError::NotMappable`] for `usm_device` and `cl_mem`; alignment and bounds errors
    /// as [`Engine::write`]; [`AllocError::Map`].
    pub async fn write_mapped(
        &self,
        buf: &Buffer,
        offset_bytes: u64,
        data: &[u8],
    ) -> Result<(), AllocError> {
        let len = data.len() as u64;
        if !buf.usages().contains(wgpu::BufferUsages::MAP_WRITE) {
            return Err(AllocError::NotMappable {
                kind: buf.kind,
                access: MapAccess::Write,
            });
        }
        check_copy_aligned(offset_bytes, len)?;
        check_range(buf, offset_bytes, len)?;
        if len == 0 {
            return Ok(());
        }
        // Mapped ranges start at multiples of 8: map a little more and write inside it.
        let start = offset_bytes / MAP_ALIGN_BYTES * MAP_ALIGN_BYTES;
        let end = offset_bytes + len;
        let slice = buf.raw.slice(start..end);
        map_slice(self, &slice, wgpu::MapMode::Write).await?;
        let _device = self.inner.gpu.lock_device();
        let written = slice.get_mapped_range_mut().map(|mut view| {
            let from = (offset_bytes - start) as usize;
            view.slice(from..from + data.len()).copy_from_slice(data);
        });
        buf.raw.unmap();
        written.map_err(|e| self.lost_or(AllocError::Map(e.to_string())))
    }

    /// Reads `size_bytes` at `offset_bytes`. `usm_shared` is mapped directly; every other kind
    /// is copied into a `MAP_READ` readback buffer (counted as `usm_host`, freed before
    /// returning) that is then mapped. Any offset and size inside the buffer work.
    ///
    /// # Errors
    /// [`AllocError::OutOfBounds`], allocation errors of the readback buffer, [`AllocError::Map`].
    pub async fn read(
        &self,
        buf: &Buffer,
        offset_bytes: u64,
        size_bytes: u64,
    ) -> Result<Vec<u8>, AllocError> {
        check_range(buf, offset_bytes, size_bytes)?;
        if size_bytes == 0 {
            return Ok(Vec::new());
        }
        if buf.usages().contains(wgpu::BufferUsages::MAP_READ) {
            return self.read_mapped(buf, offset_bytes, size_bytes).await;
        }
        // Copies need 4-aligned offsets and sizes; the buffer's size is a multiple of 4, so the
        // widened range stays inside it.
        let start = offset_bytes / COPY_ALIGN_BYTES * COPY_ALIGN_BYTES;
        let end = round_up(offset_bytes + size_bytes, COPY_ALIGN_BYTES).unwrap_or(u64::MAX);
        let len = end - start;
        let readback = self.allocate_inner(
            &BufferDesc {
                label: "dynrt readback",
                size_bytes: len,
                kind: AllocKind::UsmHost,
            },
            readback_usages(),
            true,
            None,
        )?;
        submit_checked(self, "dynrt readback", |enc| {
            enc.copy_buffer_to_buffer(buf.raw(), start, readback.raw(), 0, len)
        })?;
        let slice = readback.raw.slice(..);
        map_slice(self, &slice, wgpu::MapMode::Read).await?;
        let from = (offset_bytes - start) as usize;
        self.take_mapped(&readback.raw, &slice, from..from + size_bytes as usize)
    }

    /// Reads by mapping the buffer itself (`usm_shared` only): no copy, no extra allocation.
    ///
    /// # Errors
    /// [`AllocError::NotMappable`] for kinds without `MAP_READ`; [`AllocError::OutOfBounds`];
    /// [`AllocError::Map`].
    pub async fn read_mapped(
        &self,
        buf: &Buffer,
        offset_bytes: u64,
        size_bytes: u64,
    ) -> Result<Vec<u8>, AllocError> {
        if !buf.usages().contains(wgpu::BufferUsages::MAP_READ) || buf.readback {
            return Err(AllocError::NotMappable {
                kind: buf.kind,
                access: MapAccess::Read,
            });
        }
        check_range(buf, offset_bytes, size_bytes)?;
        if size_bytes == 0 {
            return Ok(Vec::new());
        }
        let start = offset_bytes / MAP_ALIGN_BYTES * MAP_ALIGN_BYTES;
        let end = round_up(offset_bytes + size_bytes, COPY_ALIGN_BYTES).unwrap_or(u64::MAX);
        let slice = buf.raw.slice(start..end);
        map_slice(self, &slice, wgpu::MapMode::Read).await?;
        let from = (offset_bytes - start) as usize;
        self.take_mapped(&buf.raw, &slice, from..from + size_bytes as usize)
    }

    /// Copies `ranges` (`(buffer, offset, bytes)`, each a multiple of 4) of device buffers,
    /// packed one after the other in order, into a new `usm_host` buffer: one submit, no
    /// wait. The result holds host memory (counted as `usm_host`, never against the device
    /// budget) until it is dropped; [`Engine::write_from_host`] puts its bytes back on the
    /// device. This is how device memory is offloaded to the host.
    ///
    /// # Errors
    /// [`AllocError::Misaligned`], [`AllocError::OutOfBounds`], allocation errors of the
    /// host buffer (nothing is copied then).
    pub fn copy_to_host(
        &self,
        label: &str,
        ranges: &[(&Buffer, u64, u64)],
    ) -> Result<Buffer, AllocError> {
        let mut total = 0u64;
        for &(buf, offset, len) in ranges {
            check_copy_aligned(offset, len)?;
            check_range(buf, offset, len)?;
            total = total.checked_add(len).ok_or(AllocError::OutOfBounds {
                offset_bytes: total,
                size_bytes: len,
                buffer_bytes: u64::MAX,
            })?;
        }
        let host = self.allocate_inner(
            &BufferDesc {
                label,
                size_bytes: total.max(COPY_ALIGN_BYTES),
                kind: AllocKind::UsmHost,
            },
            readback_usages(),
            true,
            None,
        )?;
        submit_checked(self, "dynrt copy to host", |enc| {
            let mut at = 0;
            for &(buf, offset, len) in ranges {
                if len > 0 {
                    enc.copy_buffer_to_buffer(buf.raw(), offset, host.raw(), at, len);
                }
                at += len;
            }
        })?;
        Ok(host)
    }

    /// Writes ranges of a host buffer from [`Engine::copy_to_host`] into device buffers:
    /// `(host offset, destination, destination offset, bytes)`. The host buffer is mapped
    /// (waiting for its copies) and each range goes through the queue, landing before the
    /// next submit's commands ([`Engine::queue_write`]).
    ///
    /// # Errors
    /// [`AllocError::NotMappable`] for a buffer that is not a host copy;
    /// [`AllocError::Misaligned`] and [`AllocError::OutOfBounds`] for a range outside either
    /// buffer (nothing is written then); [`AllocError::Map`].
    pub async fn write_from_host(
        &self,
        host: &Buffer,
        writes: &[(u64, &Buffer, u64, u64)],
    ) -> Result<(), AllocError> {
        if !(host.readback && host.usages().contains(wgpu::BufferUsages::MAP_READ)) {
            return Err(AllocError::NotMappable {
                kind: host.kind,
                access: MapAccess::Read,
            });
        }
        for &(from, dst, offset, len) in writes {
            check_copy_aligned(offset, len)?;
            check_range(host, from, len)?;
            check_range(dst, offset, len)?;
        }
        let slice = host.raw.slice(..);
        map_slice(self, &slice, wgpu::MapMode::Read).await?;
        let _device = self.inner.gpu.lock_device();
        let written = slice.get_mapped_range().map(|view| {
            for &(from, dst, offset, len) in writes {
                let from = from as usize;
                self.queue_write(dst, offset, &view[from..from + len as usize]);
            }
        });
        host.raw.unmap();
        written.map_err(|e| self.lost_or(AllocError::Map(e.to_string())))
    }

    /// [`Engine::read`], blocking (native only).
    ///
    /// # Errors
    /// As [`Engine::read`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read_blocking(
        &self,
        buf: &Buffer,
        offset_bytes: u64,
        size_bytes: u64,
    ) -> Result<Vec<u8>, AllocError> {
        pollster::block_on(self.read(buf, offset_bytes, size_bytes))
    }

    /// Copies `range` of the mapped `slice` of `raw` out and unmaps it.
    fn take_mapped(
        &self,
        raw: &wgpu::Buffer,
        slice: &wgpu::BufferSlice<'_>,
        range: std::ops::Range<usize>,
    ) -> Result<Vec<u8>, AllocError> {
        let _device = self.inner.gpu.lock_device();
        let out = slice.get_mapped_range().map(|view| view[range].to_vec());
        raw.unmap();
        out.map_err(|e| self.lost_or(AllocError::Map(e.to_string())))
    }
}

fn check_copy_aligned(offset_bytes: u64, size_bytes: u64) -> Result<(), AllocError> {
    if offset_bytes % COPY_ALIGN_BYTES != 0 || size_bytes % COPY_ALIGN_BYTES != 0 {
        return Err(AllocError::Misaligned {
            offset_bytes,
            size_bytes,
            align_bytes: COPY_ALIGN_BYTES,
        });
    }
    Ok(())
}

/// Records commands, submits them inside a validation error scope, and turns a captured error
/// into [`AllocError::Validation`] (native; on the web errors reach the uncaptured handler).
///
/// # Errors
/// [`AllocError::DeviceLost`] (nothing is submitted), [`AllocError::Validation`].
fn submit_checked(
    engine: &Engine,
    label: &str,
    record: impl FnOnce(&mut wgpu::CommandEncoder),
) -> Result<wgpu::SubmissionIndex, AllocError> {
    let gpu = engine.gpu();
    gpu.check_alive()?;
    let device = gpu.device();
    let _device = gpu.lock_device();
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let mut enc =
        device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(label) });
    record(&mut enc);
    let index = gpu.queue().submit([enc.finish()]);
    match scope.pop().now_or_never().flatten() {
        Some(e) => Err(engine.lost_or(AllocError::Validation(e.to_string()))),
        None => Ok(index),
    }
}

/// How long a map may stay pending after the device said it was idle. wgpu resolves every
/// pending map in the poll that finds the queue empty, but when several threads poll one
/// device the callback runs in whichever thread's poll collected it, after that poll has let
/// go of the device: on a loaded machine that thread may be descheduled for a while between
/// the two, so the wait is a time, not a count of polls (a count of 3 failed tests at load
/// 6). A map still pending past it means a bug, reported rather than waited on.
#[cfg(not(target_arch = "wasm32"))]
const IDLE_WAIT_FOR_A_MAP: std::time::Duration = std::time::Duration::from_secs(30);

/// Maps `slice` and waits for the callback. Native: polls the device until the map resolves;
/// web: the browser resolves it.
///
/// # Errors
/// [`AllocError::DeviceLost`] when the device is or becomes lost, [`AllocError::Map`] when
/// wgpu refuses the map.
async fn map_slice(
    engine: &Engine,
    slice: &wgpu::BufferSlice<'_>,
    mode: wgpu::MapMode,
) -> Result<(), AllocError> {
    let gpu = engine.gpu();
    gpu.check_alive()?;
    let (tx, rx) = futures::channel::oneshot::channel();
    let mapped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = mapped.clone();
    {
        // Scheduling the map may submit the buffer's pending queue writes first.
        let _device = gpu.lock_device();
        slice.map_async(mode, move |r| {
            flag.store(true, Ordering::Release);
            // The receiver only disappears if the caller's future was dropped.
            let _ = tx.send(r);
        });
    }
    // On a shared device other work (the app's frames) may follow ours in the queue: stop
    // polling once our map has resolved. Natively nothing else resolves the map, so the
    // await below must not start before it has (or the device is gone).
    #[cfg(not(target_arch = "wasm32"))]
    {
        let mut idle_since: Option<std::time::Instant> = None;
        while !mapped.load(Ordering::Acquire) {
            match gpu.poll_until(|| mapped.load(Ordering::Acquire)) {
                Polled::Done => {}
                Polled::Lost => return Err(engine.lost_or(AllocError::Map("lost".into()))),
                Polled::Idle | Polled::Failed => {
                    if mapped.load(Ordering::Acquire) {
                        break;
                    }
                    let since = *idle_since.get_or_insert_with(std::time::Instant::now);
                    if since.elapsed() > IDLE_WAIT_FOR_A_MAP {
                        return Err(engine.lost_or(AllocError::Map(format!(
                            "the device is idle and the map did not resolve within {} s",
                            IDLE_WAIT_FOR_A_MAP.as_secs()
                        ))));
                    }
                    // Another thread's poll may hold the callback: let it run.
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
            }
        }
    }
    match rx.await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(engine.lost_or(AllocError::Map(e.to_string()))),
        Err(_) => Err(engine.lost_or(AllocError::Map("map callback dropped".into()))),
    }
}
