//! The allocation-kind table: which wgpu buffer usages each [`AllocKind`] gets, and whether a
//! device supports it. docs/design.md ("Allocation kinds") prints the same table.
//!
//! | kind | wgpu usages | host access | supported |
//! |---|---|---|---|
//! | `usm_device` | `STORAGE \| COPY_SRC \| COPY_DST` | none: [`Engine::write`](super::Engine::write) / [`Engine::read`](super::Engine::read) copy through `usm_host` staging | everywhere |
//! | `usm_host` | `MAP_WRITE \| COPY_SRC` | map for writing; reads copy into a `MAP_READ \| COPY_DST` readback buffer (also `usm_host`) | everywhere; never bindable |
//! | `usm_shared` | `STORAGE \| MAP_READ \| MAP_WRITE \| COPY_SRC \| COPY_DST` | map the buffer itself | only with `MAPPABLE_PRIMARY_BUFFERS` (Vulkan, Metal, DX12 natively; lavapipe has it). On GL and the web: [`AllocError::Unsupported`](super::AllocError::Unsupported), like the reference plugin on devices without USM; [`Engine::preferred_kind`](super::Engine::preferred_kind) then answers `usm_host` |
//! | `cl_mem` | `STORAGE \| UNIFORM \| COPY_SRC \| COPY_DST` | contents at creation (`mapped_at_creation`), later by staged copies | everywhere |
//!
//! Why `usm_host` is write-mapped: WebGPU lets `MAP_WRITE` combine only with `COPY_SRC` and
//! `MAP_READ` only with `COPY_DST` unless `MAPPABLE_PRIMARY_BUFFERS` is on, so one host buffer
//! cannot go both ways portably. Uploads are what user code stages; readback buffers are made
//! by the engine itself for [`Engine::read`](super::Engine::read).

use crate::memory::AllocKind;
use wgpu::BufferUsages as U;

/// Whether a kind can be allocated on a device, and why not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KindSupport {
    /// The kind.
    pub kind: AllocKind,
    /// True when [`super::Engine::allocate`] accepts it on this device.
    pub supported: bool,
    /// The buffer usages it gets (those it would get, when unsupported).
    pub usages: U,
    /// How the host reaches its bytes.
    pub host_access: &'static str,
    /// Why it is unsupported (empty when supported).
    pub reason: &'static str,
}

/// Reason printed when `usm_shared` is not available.
pub(crate) const SHARED_UNSUPPORTED: &str =
    "the device lacks MAPPABLE_PRIMARY_BUFFERS (GL, the web, or it was turned off): a buffer \
     cannot be both bound to kernels and mapped; use usm_host for host access";

/// The wgpu usages of `kind` (table in the module docs).
pub fn kind_usages(kind: AllocKind) -> U {
    match kind {
        AllocKind::UsmDevice => U::STORAGE | U::COPY_SRC | U::COPY_DST,
        AllocKind::UsmHost => U::MAP_WRITE | U::COPY_SRC,
        AllocKind::UsmShared => U::STORAGE | U::MAP_READ | U::MAP_WRITE | U::COPY_SRC | U::COPY_DST,
        AllocKind::ClMem => U::STORAGE | U::UNIFORM | U::COPY_SRC | U::COPY_DST,
    }
}

/// Usages of the readback buffers the engine makes for [`super::Engine::read`] (counted as
/// `usm_host`).
pub(crate) fn readback_usages() -> U {
    U::MAP_READ | U::COPY_DST
}

/// Support for `kind` on a device that has (or lacks) `MAPPABLE_PRIMARY_BUFFERS`.
pub fn kind_support(kind: AllocKind, shared_supported: bool) -> KindSupport {
    let host_access = match kind {
        AllocKind::UsmDevice => "none (staged copies)",
        AllocKind::UsmHost => "map write; read via readback copy",
        AllocKind::UsmShared => "map read/write of the buffer itself",
        AllocKind::ClMem => "at creation; later staged copies",
    };
    let supported = kind != AllocKind::UsmShared || shared_supported;
    KindSupport {
        kind,
        supported,
        usages: kind_usages(kind),
        host_access,
        reason: if supported { "" } else { SHARED_UNSUPPORTED },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usages_follow_what_each_kind_permits() {
        for k in AllocKind::ALL {
            let u = kind_usages(k);
            assert_eq!(u.contains(U::STORAGE), k.bindable(), "{k}");
            assert_eq!(
                u.intersects(U::MAP_READ | U::MAP_WRITE),
                k.host_mappable(),
                "{k}"
            );
        }
        // Portable WebGPU rule: without MAPPABLE_PRIMARY_BUFFERS, MAP_WRITE only with COPY_SRC.
        assert_eq!(kind_usages(AllocKind::UsmHost), U::MAP_WRITE | U::COPY_SRC);
        assert_eq!(readback_usages(), U::MAP_READ | U::COPY_DST);
        assert!(!kind_support(AllocKind::UsmShared, false).supported);
        assert!(kind_support(AllocKind::UsmShared, true).supported);
        assert!(AllocKind::ALL
            .iter()
            .filter(|k| **k != AllocKind::UsmShared)
            .all(|k| kind_support(*k, false).supported));
    }
}
