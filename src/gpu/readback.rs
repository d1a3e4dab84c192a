//! A ring of `usm_host` readback buffers: how results come back to the host without the CPU
//! ever mapping a buffer that kernels use, and without waiting for later work.
//!
//! A [`Frame`] records GPU copies of the ranges the host wants into the next free buffer of
//! the ring ([`ReadbackRing::record`]); after the frame's submit the [`ReadTicket`] is
//! [`sealed`](ReadbackRing::seal) with that submission, and [`ReadbackRing::read`] maps the
//! buffer once *that* submission has run. Work submitted after it (the next decode step)
//! keeps running: natively the host polls without blocking until the map resolves, never
//! waiting for the queue to drain; in the browser the map resolves when the copy is done. A buffer is reused once its
//! ticket was read or released, so the ring holds as many buffers as tickets are
//! outstanding at once (two for a pipelined decode loop), each sized to the largest read it
//! served (grown, never shrunk). They count as `usm_host` and never against the device budget.

use super::engine::{AllocError, Buffer, BufferDesc, Engine};
use super::frame::{Frame, Submitted};
use crate::memory::AllocKind;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The ring (see the module docs). One per stream of iterations (an inference request).
pub struct ReadbackRing {
    engine: Engine,
    /// The buffers and whether a ticket holds each.
    slots: Vec<(Option<Buffer>, bool)>,
}

impl std::fmt::Debug for ReadbackRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadbackRing")
            .field("buffers", &self.slots.len())
            .finish()
    }
}

/// Copies recorded into one buffer of a [`ReadbackRing`], to be read after their submit.
#[derive(Debug)]
pub struct ReadTicket {
    slot: usize,
    /// `(offset in the ring buffer, bytes)` of each range, in the order recorded.
    ranges: Vec<(u64, u64)>,
    submission: Option<wgpu::SubmissionIndex>,
}

impl ReadTicket {
    /// Ranges the ticket holds.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// Whether it holds no range.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
}

impl ReadbackRing {
    /// An empty ring on `engine` (buffers are allocated by the first reads).
    pub fn new(engine: &Engine) -> ReadbackRing {
        ReadbackRing {
            engine: engine.clone(),
            slots: Vec::new(),
        }
    }

    /// Bytes the ring's buffers hold.
    pub fn size_bytes(&self) -> u64 {
        self.slots
            .iter()
            .filter_map(|(b, _)| b.as_ref().map(Buffer::size_bytes))
            .sum()
    }

    /// Records into `frame` the copies of `ranges` (`(buffer, offset, bytes)`, offsets and
    /// sizes multiples of 4), packed one after the other into a free buffer of the ring
    /// (grown, or a buffer added, when none fits).
    ///
    /// # Errors
    /// [`AllocError::Misaligned`] for a range off wgpu's copy alignment; allocation errors
    /// of the ring buffer. Nothing is recorded then.
    pub fn record(
        &mut self,
        frame: &mut Frame<'_>,
        ranges: &[(&Buffer, u64, u64)],
    ) -> Result<ReadTicket, AllocError> {
        let mut total = 0u64;
        let mut placed = Vec::with_capacity(ranges.len());
        for &(_, offset, len) in ranges {
            if offset % 4 != 0 || len % 4 != 0 {
                return Err(AllocError::Misaligned {
                    offset_bytes: offset,
                    size_bytes: len,
                    align_bytes: 4,
                });
            }
            placed.push((total, len));
            total += len;
        }
        let slot = match self.slots.iter().position(|(_, busy)| !busy) {
            Some(s) => s,
            None => {
                self.slots.push((None, false));
                self.slots.len() - 1
            }
        };
        let fits = self.slots[slot]
            .0
            .as_ref()
            .is_some_and(|b| b.size_bytes() >= total);
        if !fits {
            // The old buffer (if any) is dropped: nothing uses it, its ticket was read.
            self.slots[slot].0 = None;
            self.slots[slot].0 = Some(self.engine.allocate_readback(&BufferDesc {
                label: "dynrt readback ring",
                size_bytes: total.max(4),
                kind: AllocKind::UsmHost,
            })?);
        }
        let Some(dst) = self.slots[slot].0.as_ref() else {
            return Err(AllocError::Map("readback ring buffer missing".into()));
        };
        for (&(src, offset, len), &(at, _)) in ranges.iter().zip(&placed) {
            if len > 0 {
                frame.copy(src, offset, dst, at, len);
            }
        }
        self.slots[slot].1 = true;
        Ok(ReadTicket {
            slot,
            ranges: placed,
            submission: None,
        })
    }

    /// Ties `ticket` to the submit of the frame its copies were recorded in.
    pub fn seal(&self, ticket: &mut ReadTicket, submitted: &Submitted) {
        ticket.submission = Some(submitted.index());
    }

    /// Frees the ticket's buffer for later reads without reading it (its submission may
    /// still run: the next copies into the buffer are ordered after it).
    pub fn release(&mut self, ticket: ReadTicket) {
        if let Some(s) = self.slots.get_mut(ticket.slot) {
            s.1 = false;
        }
    }

    /// The bytes of each range of `ticket`, once its submission has run (waiting for that
    /// submission only). The buffer is free for later reads afterwards.
    ///
    /// # Errors
    /// [`AllocError::Map`] when mapping fails (device lost) or the ticket was never sealed.
    pub async fn read(&mut self, ticket: ReadTicket) -> Result<Vec<Vec<u8>>, AllocError> {
        let result = self.read_inner(&ticket).await;
        self.release(ticket);
        result
    }

    async fn read_inner(&self, ticket: &ReadTicket) -> Result<Vec<Vec<u8>>, AllocError> {
        let total: u64 = ticket.ranges.iter().map(|r| r.1).sum();
        if total == 0 {
            return Ok(ticket.ranges.iter().map(|_| Vec::new()).collect());
        }
        let buffer = self
            .slots
            .get(ticket.slot)
            .and_then(|s| s.0.as_ref())
            .ok_or_else(|| AllocError::Map("readback ring buffer missing".into()))?;
        let submission = ticket
            .submission
            .clone()
            .ok_or_else(|| AllocError::Map("a readback ticket read before its submit".into()))?;
        let slice = buffer.raw().slice(0..total);
        let (tx, rx) = futures::channel::oneshot::channel();
        let mapped = Arc::new(AtomicBool::new(false));
        let flag = mapped.clone();
        let gpu = self.engine.gpu();
        gpu.check_alive()?;
        {
            // On GL every call that reaches the context holds the device lock
            // (`Gpu::lock_device`).
            let _device = gpu.lock_device();
            slice.map_async(wgpu::MapMode::Read, move |r| {
                flag.store(true, Ordering::Release);
                let _ = tx.send(r);
            });
        }
        // Natively: poll until this map resolves (its callback runs in the poll that sees
        // the copy's submission done), without waiting for what was submitted after it. A
        // blocking wait for one submission index trips an assertion of wgpu-core when other
        // threads submit to the same device meanwhile, so the wait is short non-blocking
        // polls with a growing pause (at most 0.5 ms late).
        let _ = submission;
        #[cfg(not(target_arch = "wasm32"))]
        {
            let mut pause = std::time::Duration::from_micros(20);
            while !mapped.load(Ordering::Acquire) {
                if gpu.is_lost() {
                    break;
                }
                let polled = {
                    let _device = gpu.lock_device();
                    gpu.device().poll(wgpu::PollType::Poll)
                };
                if let Err(e) = polled {
                    log::warn!("device poll failed: {e}");
                    break;
                }
                if mapped.load(Ordering::Acquire) {
                    break;
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(std::time::Duration::from_micros(500));
            }
        }
        match rx.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                return Err(gpu
                    .lost()
                    .map_or(AllocError::Map(e.to_string()), Into::into))
            }
            Err(_) => {
                return Err(gpu.lost().map_or(
                    AllocError::Map("map callback dropped (device lost?)".into()),
                    Into::into,
                ))
            }
        }
        let _device = gpu.lock_device();
        let out = {
            let view = slice
                .get_mapped_range()
                .map_err(|e| AllocError::Map(e.to_string()))?;
            ticket
                .ranges
                .iter()
                .map(|&(at, len)| view[at as usize..(at + len) as usize].to_vec())
                .collect()
        };
        buffer.raw().unmap();
        Ok(out)
    }
}
