//! Device loss: the typed error every layer returns once a [`super::Gpu`]'s device is gone,
//! and the flag the device-lost callback sets (docs/design.md, "Device loss").

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// The device of a [`super::Gpu`] is lost (a driver reset, the GPU taken away, an
/// unrecoverable driver error, or [`super::Gpu::destroy`]): nothing on it can be used again.
/// Every later call on that `Gpu`, its engines, models and sessions fails fast with this
/// error. To go on, create a new [`super::Gpu`], then load the model again on it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the GPU device `{adapter}` was lost ({reason}): everything on it is gone; create a new device and load the model again")]
pub struct DeviceLost {
    /// The adapter's name.
    pub adapter: String,
    /// What wgpu or the driver said, or `destroyed` when the device was destroyed.
    pub reason: String,
}

/// Whether the device is lost, and why (set once, by the device-lost callback or by dynrt
/// when it learns of the loss otherwise).
#[derive(Debug, Default)]
pub(crate) struct LostFlag {
    lost: AtomicBool,
    reason: Mutex<Option<String>>,
}

impl LostFlag {
    /// Records the loss (the first reason given is kept).
    pub(crate) fn set(&self, reason: String) {
        let mut r = self.reason.lock().unwrap_or_else(|e| e.into_inner());
        if r.is_none() {
            *r = Some(reason);
        }
        self.lost.store(true, Ordering::Release);
    }

    pub(crate) fn is_set(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// The reason, when lost.
    pub(crate) fn reason(&self) -> Option<String> {
        if !self.is_set() {
            return None;
        }
        let r = self.reason.lock().unwrap_or_else(|e| e.into_inner());
        Some(r.clone().unwrap_or_else(|| "unknown reason".into()))
    }
}

/// The words a device-lost callback gives for `reason` and `message`.
pub(crate) fn describe(reason: wgpu::DeviceLostReason, message: &str) -> String {
    let what = match reason {
        wgpu::DeviceLostReason::Destroyed => "destroyed",
        wgpu::DeviceLostReason::Unknown => "lost by the driver",
    };
    if message.trim().is_empty() {
        what.to_string()
    } else {
        format!("{what}: {}", message.trim())
    }
}
