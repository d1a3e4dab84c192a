//! The four allocation kinds of the reference plugin and what each permits.
//!
//! Device-free: the mapping onto wgpu buffer usages lives in [`crate::gpu`]; this module says
//! what a kind allows (binding to kernels, host mapping) so misuse is a typed error before
//! wgpu sees it. See docs/design.md, "Allocation kinds".

use std::fmt;

/// An allocation kind (`cl_mem`, `usm_host`, `usm_shared`, `usm_device`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum AllocKind {
    /// Device memory only kernels touch; data moves by copies through staging.
    #[serde(rename = "usm_device")]
    UsmDevice,
    /// Host memory the device reaches by copies: staging for uploads and readbacks.
    #[serde(rename = "usm_host")]
    UsmHost,
    /// Memory both host (by mapping) and kernels (by binding) touch.
    #[serde(rename = "usm_shared")]
    UsmShared,
    /// The portable default buffer object: bindable, contents given at creation.
    #[serde(rename = "cl_mem")]
    ClMem,
}

impl AllocKind {
    /// All kinds, in the order reports list them.
    pub const ALL: [AllocKind; 4] = [
        AllocKind::UsmDevice,
        AllocKind::UsmHost,
        AllocKind::UsmShared,
        AllocKind::ClMem,
    ];

    /// The reference name (`usm_device`, ...), as printed in the allocation history.
    pub fn name(self) -> &'static str {
        match self {
            AllocKind::UsmDevice => "usm_device",
            AllocKind::UsmHost => "usm_host",
            AllocKind::UsmShared => "usm_shared",
            AllocKind::ClMem => "cl_mem",
        }
    }

    /// Index into per-kind arrays (same order as [`AllocKind::ALL`]).
    pub fn index(self) -> usize {
        match self {
            AllocKind::UsmDevice => 0,
            AllocKind::UsmHost => 1,
            AllocKind::UsmShared => 2,
            AllocKind::ClMem => 3,
        }
    }

    /// Whether a buffer of this kind may be bound to a compute kernel.
    pub fn bindable(self) -> bool {
        !matches!(self, AllocKind::UsmHost)
    }

    /// Whether the host may map a buffer of this kind after creation.
    pub fn host_mappable(self) -> bool {
        matches!(self, AllocKind::UsmHost | AllocKind::UsmShared)
    }

    /// Whether the memory counts against the device budget (everything but `usm_host`).
    pub fn on_device(self) -> bool {
        !matches!(self, AllocKind::UsmHost)
    }
}

impl fmt::Display for AllocKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for AllocKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        AllocKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| format!("unknown allocation kind `{s}`: expected usm_device, usm_host, usm_shared or cl_mem"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_permissions_differ() {
        for k in AllocKind::ALL {
            assert_eq!(k.name().parse::<AllocKind>().unwrap(), k);
            assert_eq!(AllocKind::ALL[k.index()], k);
        }
        assert!(!AllocKind::UsmHost.bindable());
        assert!(!AllocKind::UsmDevice.host_mappable());
        assert!(AllocKind::UsmShared.bindable() && AllocKind::UsmShared.host_mappable());
    }
}
