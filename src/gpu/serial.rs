//! One GL device, one thread at a time: the lock dynrt takes around every call that reaches
//! a GL device's context (docs/design.md, "Threads and the GL context").
//!
//! wgpu's GL backend keeps one EGL context per adapter behind a mutex that it waits for at
//! most 6 seconds before it panics ("Could not lock adapter context. This is most-likely a
//! deadlock."). Creating and destroying buffers, mapping and unmapping, compiling and
//! destroying pipelines, submitting and waiting all take that mutex, and some hold it for a
//! long time: on llvmpipe a submit runs its compute work before it returns, so a forward pass
//! keeps the context for as long as it computes (seconds on a busy machine), and a fence wait
//! holds it for up to 2 seconds. Another thread that needs the context meanwhile, even for
//! an unmap, panics once 6 seconds have passed. [`DeviceLock`] is taken first, with no
//! deadline: dynrt's threads queue on it in order (a ticket lock) and reach wgpu's mutex only
//! when no other dynrt thread holds the context. It is reentrant, so a call that nests
//! another (a drop inside a locked region, a callback run by a poll) does not wait on itself.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::thread::ThreadId;

#[derive(Debug, Default)]
struct State {
    /// The thread that holds the lock and how many times it took it.
    owner: Option<(ThreadId, usize)>,
    /// The next ticket to hand out, and the ticket whose holder may take the lock.
    next_ticket: u64,
    serving: u64,
}

/// A reentrant, first-come-first-served lock without a deadline (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct DeviceLock {
    state: Mutex<State>,
    turn: Condvar,
}

impl DeviceLock {
    fn state(&self) -> MutexGuard<'_, State> {
        // The state is two counters and an owner, consistent between statements: a thread
        // that panicked while holding the inner mutex left it usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits (without a deadline) until this thread holds the lock.
    pub(crate) fn lock(&self) -> DeviceGuard<'_> {
        let me = std::thread::current().id();
        let mut s = self.state();
        if let Some((owner, depth)) = &mut s.owner {
            if *owner == me {
                *depth += 1;
                return DeviceGuard { lock: Some(self) };
            }
        }
        let ticket = s.next_ticket;
        s.next_ticket += 1;
        while s.serving != ticket || s.owner.is_some() {
            s = self.turn.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        s.owner = Some((me, 1));
        DeviceGuard { lock: Some(self) }
    }

    fn unlock(&self) {
        let mut s = self.state();
        let last = match &mut s.owner {
            Some((_, depth)) if *depth > 1 => {
                *depth -= 1;
                false
            }
            _ => true,
        };
        if last {
            s.owner = None;
            s.serving += 1;
            drop(s);
            self.turn.notify_all();
        }
    }
}

/// Held while this thread uses a GL device ([`super::Gpu::lock_device`]); releases the device
/// when dropped. On other backends it holds nothing.
#[must_use = "the device is released as soon as the guard is dropped"]
pub struct DeviceGuard<'a> {
    lock: Option<&'a DeviceLock>,
}

impl DeviceGuard<'_> {
    /// A guard that holds nothing (backends whose device calls need no serialising).
    pub(crate) fn none() -> DeviceGuard<'static> {
        DeviceGuard { lock: None }
    }
}

impl std::fmt::Debug for DeviceGuard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceGuard")
            .field("held", &self.lock.is_some())
            .finish()
    }
}

impl Drop for DeviceGuard<'_> {
    fn drop(&mut self) {
        if let Some(lock) = self.lock {
            lock.unlock();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn the_holder_may_take_it_again_and_others_wait_their_turn() {
        let lock = Arc::new(DeviceLock::default());
        let inside = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let outer = lock.lock();
        // Reentrant: the same thread takes it again without waiting.
        let inner = lock.lock();
        drop(inner);
        let started = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (lock, inside, most, started) =
                    (lock.clone(), inside.clone(), most.clone(), started.clone());
                std::thread::spawn(move || {
                    started.store(true, Ordering::SeqCst);
                    for _ in 0..200 {
                        let _g = lock.lock();
                        let _again = lock.lock();
                        let n = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(n, Ordering::SeqCst);
                        std::thread::yield_now();
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        while !started.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        // Nobody got in while the outer guard was held.
        assert_eq!(inside.load(Ordering::SeqCst), 0);
        drop(outer);
        for t in threads {
            t.join().expect("a locking thread panicked");
        }
        assert_eq!(
            most.load(Ordering::SeqCst),
            1,
            "two threads held the lock at once"
        );
        let s = lock.state();
        assert!(s.owner.is_none());
        assert_eq!(s.serving, s.next_ticket);
    }
}
