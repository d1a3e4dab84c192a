//! The allocation-kind table: which wgpu buffer usages each [`AllocKind`] gets, and whether a
//! device supports it. docs/design.md ("Allocation kinds") prints the same table.
//!
//! | kind | wgpu usages | host access | supported |
//! |---|---|---|---|
//! | `usm_device` | `STORAGE \| COPY_SRC \| COPY_DST` | none: [`Engine::write`](super::Engine::write) / [`Engine::read`](super::Engine::read) copy through `usm_host` staging | everywhere |
//! | `usm_host` | `MAP_WRITE \| COPY_SRC` | map for writing; reads copy into a `MAP_READ \| COPY_DST` readback buffer (also `usm_host`) | everywhere; never bindable |
//! | `usm_shared` | `STORAGE \| MAP_READ \| MAP_WRITE \| COPY_SRC \| COPY_DST` | map the buffer itself | only with `MAPPABLE_PRIMARY_BUFFERS` on unified memory ([`AdapterClass::Unified`]: lavapipe, integrated and Apple GPUs). On a discrete GPU, GL and the web: [`AllocError::Unsupported`](super::AllocError::Unsupported), like the reference plugin on devices without USM; [`Engine::preferred_kind`](super::Engine::preferred_kind) then answers `usm_host` |
//! | `cl_mem` | `STORAGE \| UNIFORM \| COPY_SRC \| COPY_DST` | contents at creation (`mapped_at_creation`), later by staged copies | everywhere |
//!
//! `usm_shared` also needs an adapter whose memory the host shares ([`AdapterClass::Unified`]):
//! on a discrete GPU a mapped storage buffer is device memory behind the PCIe window, which the
//! CPU reads uncached (wgpu warns that `MAPPABLE_PRIMARY_BUFFERS` there is "a massive
//! performance footgun"), so dynrt neither requests the feature there nor offers `usm_shared`:
//! it is **unsupported on a discrete GPU**, not emulated, like the reference plugin on a device
//! without USM. An emulation by a device buffer with a staging mirror would promise host
//! access without copies that it cannot give. Inputs then reach the device by queue writes and
//! outputs come back by GPU copies into `usm_host` readback buffers ([`preferred_kind`]).
//!
//! Why `usm_host` is write-mapped: WebGPU lets `MAP_WRITE` combine only with `COPY_SRC` and
//! `MAP_READ` only with `COPY_DST` unless `MAPPABLE_PRIMARY_BUFFERS` is on, so one host buffer
//! cannot go both ways portably. Uploads are what user code stages; readback buffers are made
//! by the engine itself for [`Engine::read`](super::Engine::read).

use crate::memory::AllocKind;
use wgpu::BufferUsages as U;

/// Whether an adapter's memory is the host's: the rule that decides if the CPU may ever map a
/// buffer kernels use (`MAPPABLE_PRIMARY_BUFFERS`, `usm_shared`). `dynrt info` prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdapterClass {
    /// Host and device share one memory: software adapters (lavapipe, llvmpipe, SwiftShader:
    /// `DeviceType::Cpu`), integrated GPUs, Apple GPUs. Mapping a storage buffer reads and
    /// writes ordinary memory, so `usm_shared` is offered where the feature is.
    Unified,
    /// Device memory behind a bus: discrete GPUs, and virtual or unknown devices (nothing
    /// says their memory is the host's). The CPU touches only `usm_host` staging and readback
    /// buffers; `usm_shared` is unsupported.
    Discrete,
}

/// PCI vendor id of Apple: its GPUs share the system's memory whatever type the driver reports.
const APPLE_VENDOR: u32 = 0x106b;

impl AdapterClass {
    /// The class of the adapter `info` describes.
    pub fn of(info: &wgpu::AdapterInfo) -> AdapterClass {
        match info.device_type {
            wgpu::DeviceType::Cpu | wgpu::DeviceType::IntegratedGpu => AdapterClass::Unified,
            _ if info.vendor == APPLE_VENDOR => AdapterClass::Unified,
            wgpu::DeviceType::DiscreteGpu
            | wgpu::DeviceType::VirtualGpu
            | wgpu::DeviceType::Other => AdapterClass::Discrete,
        }
    }

    /// Whether dynrt asks for `MAPPABLE_PRIMARY_BUFFERS` (and offers `usm_shared`) here.
    pub fn maps_device_memory(self) -> bool {
        self == AdapterClass::Unified
    }

    /// `unified` or `discrete`.
    pub fn name(self) -> &'static str {
        match self {
            AdapterClass::Unified => "unified",
            AdapterClass::Discrete => "discrete",
        }
    }

    /// How inputs and outputs of a network reach the host on this class, in words.
    pub fn io_rule(self) -> &'static str {
        match self {
            AdapterClass::Unified => {
                "inputs and outputs in usm_shared where MAPPABLE_PRIMARY_BUFFERS is offered \
                 (written through the queue, read back through a readback ring), else usm_device"
            }
            AdapterClass::Discrete => {
                "no CPU access to device memory: inputs by queue writes, outputs by GPU copies \
                 into a ring of usm_host readback buffers; usm_shared unsupported"
            }
        }
    }
}

/// What a request for memory needs, for [`preferred_kind`] (and [`super::Engine::preferred_kind`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KindRequest {
    /// The host must lock (map) this memory: network inputs and outputs the user touches.
    pub host_access: bool,
    /// A kernel binds this memory. On wgpu `usm_host` is not bindable (unlike the reference's
    /// USM host memory), so bindable memory the host reaches is `usm_shared` or, where that
    /// is unsupported, `usm_device` with staging.
    pub kernel_access: bool,
    /// Bytes of all inputs and outputs of the kernel that uses this memory (0 when not known);
    /// the reference puts the memory on the host when they would not fit in what the device
    /// has left.
    pub kernel_io_bytes: u64,
}

/// The kind rule, in one place: the reference's choice (memory the host must lock goes to
/// `usm_shared`, or `usm_host` where shared is unsupported; memory for a kernel whose inputs
/// and outputs would not fit in the `device_bytes_left` goes to host-reachable memory the same
/// way; everything else to `usm_device`), plus one wgpu rule: memory a kernel binds
/// ([`KindRequest::kernel_access`]) cannot be `usm_host`, so there the fallback is
/// `usm_device`, reached by staged copies. `shared_supported` is false on a discrete GPU
/// ([`AdapterClass::Discrete`]), on GL and on the web.
pub fn preferred_kind(
    req: &KindRequest,
    shared_supported: bool,
    device_bytes_left: u64,
) -> AllocKind {
    let host_kind = if shared_supported {
        AllocKind::UsmShared
    } else if req.kernel_access {
        AllocKind::UsmDevice
    } else {
        AllocKind::UsmHost
    };
    if req.host_access || req.kernel_io_bytes > device_bytes_left {
        return host_kind;
    }
    AllocKind::UsmDevice
}

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

impl KindSupport {
    /// wgpu's names of [`KindSupport::usages`] joined by ` | ` (`STORAGE | COPY_SRC`), as
    /// `dynrt info` prints them.
    pub fn usage_names(&self) -> String {
        self.usages
            .iter_names()
            .map(|(n, _)| n)
            .collect::<Vec<_>>()
            .join(" | ")
    }
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

/// Reason printed when `usm_shared` is refused on a discrete GPU.
pub(crate) const SHARED_DISCRETE: &str =
    "a discrete GPU: a mapped storage buffer would be device memory read uncached over the bus; \
     inputs go through the queue and outputs through usm_host readback buffers";

/// Support for `kind` on an adapter of `class` whose device has (or lacks)
/// `MAPPABLE_PRIMARY_BUFFERS`: `usm_shared` needs both the feature and unified memory.
pub fn kind_support_on(kind: AllocKind, class: AdapterClass, mappable: bool) -> KindSupport {
    let mut s = kind_support(kind, mappable && class.maps_device_memory());
    if !s.supported && mappable {
        s.reason = SHARED_DISCRETE;
    }
    s
}

/// Support for `kind` on a device that has (or lacks) `MAPPABLE_PRIMARY_BUFFERS` on unified
/// memory ([`kind_support_on`] for the adapter class too).
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

    fn adapter(device_type: wgpu::DeviceType, vendor: u32) -> wgpu::AdapterInfo {
        wgpu::AdapterInfo {
            name: "fake".into(),
            vendor,
            device: 0,
            device_type,
            device_pci_bus_id: String::new(),
            driver: String::new(),
            driver_info: String::new(),
            backend: wgpu::Backend::Vulkan,
            subgroup_min_size: 32,
            subgroup_max_size: 32,
            transient_saves_memory: Some(false),
            limit_bucket: None,
        }
    }

    #[test]
    fn a_discrete_gpu_never_maps_device_memory() {
        use wgpu::DeviceType as D;
        let nvidia = adapter(D::DiscreteGpu, 0x10de);
        let class = AdapterClass::of(&nvidia);
        assert_eq!(class, AdapterClass::Discrete);
        assert!(!class.maps_device_memory());
        // Even a device that has the feature (an application's, say) gets no usm_shared.
        let shared = kind_support_on(AllocKind::UsmShared, class, true);
        assert!(!shared.supported);
        assert_eq!(shared.reason, SHARED_DISCRETE);
        for k in [AllocKind::UsmDevice, AllocKind::UsmHost, AllocKind::ClMem] {
            assert!(kind_support_on(k, class, true).supported, "{k}");
        }
        // Network inputs and outputs: device memory reached by copies, never mapped.
        let io = KindRequest {
            host_access: true,
            kernel_access: true,
            kernel_io_bytes: 0,
        };
        assert_eq!(preferred_kind(&io, false, 1 << 30), AllocKind::UsmDevice);
        let host_only = KindRequest {
            host_access: true,
            kernel_access: false,
            kernel_io_bytes: 0,
        };
        assert_eq!(
            preferred_kind(&host_only, false, 1 << 30),
            AllocKind::UsmHost
        );
        // Virtual and unknown devices are treated as discrete: nothing says they share memory.
        for t in [D::VirtualGpu, D::Other] {
            assert_eq!(
                AdapterClass::of(&adapter(t, 0x1234)),
                AdapterClass::Discrete,
                "{t:?}"
            );
        }
    }

    #[test]
    fn unified_adapters_map_shared_memory() {
        use wgpu::DeviceType as D;
        for info in [
            adapter(D::Cpu, 0x10005),          // lavapipe, llvmpipe
            adapter(D::IntegratedGpu, 0x8086), // an integrated Intel GPU
            adapter(D::Other, APPLE_VENDOR),   // an Apple GPU, whatever type it reports
        ] {
            let class = AdapterClass::of(&info);
            assert_eq!(class, AdapterClass::Unified, "{:?}", info.device_type);
            assert!(class.maps_device_memory());
            assert!(kind_support_on(AllocKind::UsmShared, class, true).supported);
            // Without the feature (GL, the web) it stays unsupported, with the old reason.
            let no = kind_support_on(AllocKind::UsmShared, class, false);
            assert!(!no.supported);
            assert_eq!(no.reason, SHARED_UNSUPPORTED);
        }
        let io = KindRequest {
            host_access: true,
            kernel_access: true,
            kernel_io_bytes: 0,
        };
        assert_eq!(preferred_kind(&io, true, 1 << 30), AllocKind::UsmShared);
        let act = KindRequest {
            host_access: false,
            kernel_access: true,
            kernel_io_bytes: 100,
        };
        assert_eq!(preferred_kind(&act, true, 1 << 30), AllocKind::UsmDevice);
        // A kernel whose operands do not fit what the device has left: host-reachable memory.
        assert_eq!(preferred_kind(&act, true, 99), AllocKind::UsmShared);
        assert_eq!(preferred_kind(&act, false, 99), AllocKind::UsmDevice);
    }
}
