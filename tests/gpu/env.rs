//! Options from the environment. The test sets the variables that every GPU test reads
//! (`WGPU_BACKEND`, `WGPU_ADAPTER_NAME`, `DYNRT_MEMORY_BUDGET`, `DYNRT_VERBOSE`), so it runs in
//! a child process of its own ([`common::run_alone`]), where setting them cannot race with
//! another test thread or change what another test sees.

use crate::common;
use dynrt::gpu::{testing, AllocError, BufferDesc, Engine, Gpu, GpuError, GpuOptions};
use dynrt::memory::AllocKind;

fn set(name: &str, value: Option<&str>) {
    match value {
        Some(v) => std::env::set_var(name, v),
        None => std::env::remove_var(name),
    }
}

#[test]
fn environment_selects_budget_backend_and_adapter() {
    const TEST: &str = "environment_selects_budget_backend_and_adapter";
    if !common::in_child(module_path!(), TEST) {
        let out = common::run_alone(module_path!(), TEST, &[]);
        eprint!("{}", String::from_utf8_lossy(&out.stderr)); // its SKIP lines
        assert!(
            out.status.success(),
            "{TEST} failed in its child process:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    set("WGPU_ADAPTER_NAME", None);

    // DYNRT_MEMORY_BUDGET: bytes, positive.
    set("DYNRT_MEMORY_BUDGET", Some("12345"));
    assert_eq!(
        GpuOptions::from_env().unwrap().memory_budget_bytes,
        Some(12345)
    );
    for bad in ["-1", "0", "1GB", "1.5"] {
        set("DYNRT_MEMORY_BUDGET", Some(bad));
        let e = GpuOptions::from_env().unwrap_err();
        assert!(
            matches!(
                e,
                GpuError::BadEnv {
                    name: "DYNRT_MEMORY_BUDGET",
                    ..
                }
            ),
            "{bad}: {e}"
        );
    }
    set("DYNRT_MEMORY_BUDGET", None);
    assert_eq!(GpuOptions::from_env().unwrap().memory_budget_bytes, None);

    // WGPU_BACKEND.
    set("WGPU_BACKEND", Some("vulkan, gl"));
    let b = GpuOptions::from_env().unwrap().backends;
    assert_eq!(
        b,
        dynrt::gpu::wgpu::Backends::VULKAN | dynrt::gpu::wgpu::Backends::GL
    );
    set("WGPU_BACKEND", Some("cuda"));
    assert!(matches!(
        GpuOptions::from_env(),
        Err(GpuError::BadEnv {
            name: "WGPU_BACKEND",
            ..
        })
    ));
    set("WGPU_BACKEND", None);

    // DYNRT_VERBOSE=2 turns the stderr history on; 1 does not.
    set("DYNRT_VERBOSE", Some("2"));
    assert!(GpuOptions::from_env().unwrap().verbose);
    set("DYNRT_VERBOSE", Some("1"));
    assert!(!GpuOptions::from_env().unwrap().verbose);
    set("DYNRT_VERBOSE", None);

    // The rest needs an adapter.
    let Some(_) = testing::gpu_or_skip(TEST) else {
        return;
    };
    // A budget from the environment reaches the engine and is enforced.
    set("DYNRT_MEMORY_BUDGET", Some("8192"));
    let opts = GpuOptions::from_env().unwrap();
    set("DYNRT_MEMORY_BUDGET", None);
    let gpu = Gpu::new_blocking(opts).unwrap();
    let engine = Engine::new(gpu.clone());
    assert_eq!(engine.memory_budget_bytes(), 8192);
    let a = engine
        .allocate(&BufferDesc {
            label: "a",
            size_bytes: 8192,
            kind: AllocKind::UsmDevice,
        })
        .unwrap();
    let e = engine
        .allocate(&BufferDesc {
            label: "b",
            size_bytes: 4,
            kind: AllocKind::ClMem,
        })
        .unwrap_err();
    assert!(matches!(
        e,
        AllocError::OverBudget {
            budget_bytes: 8192,
            in_use_bytes: 8192,
            ..
        }
    ));
    drop(a);
    assert_eq!(engine.device_bytes_in_use(), 0);

    // WGPU_ADAPTER_NAME: a substring of the chosen adapter's name selects it; a wrong one is a
    // typed error listing what exists.
    let real = gpu.adapter_info().name.clone();
    set(
        "WGPU_ADAPTER_NAME",
        Some(&real[..real.len().min(6)].to_uppercase()),
    );
    let g = Gpu::new_blocking(GpuOptions::from_env().unwrap()).unwrap();
    assert!(g
        .adapter_info()
        .name
        .to_lowercase()
        .contains(&real[..real.len().min(6)].to_lowercase()));
    set("WGPU_ADAPTER_NAME", Some("no such adapter 42"));
    match Gpu::new_blocking(GpuOptions::from_env().unwrap()) {
        Err(GpuError::NoMatchingAdapter { filter, found }) => {
            assert_eq!(filter, "no such adapter 42");
            assert!(!found.is_empty());
        }
        other => panic!("expected NoMatchingAdapter, got {other:?}"),
    }
    set("WGPU_ADAPTER_NAME", None);

    // Turning MAPPABLE_PRIMARY_BUFFERS off gives the GL/web fallback on any backend.
    let opts = GpuOptions {
        mappable_primary_buffers: false,
        ..GpuOptions::default()
    };
    let g = Gpu::new_blocking(opts).unwrap();
    assert!(!g.supports_shared());
    let e = Engine::new(g)
        .allocate(&BufferDesc {
            label: "s",
            size_bytes: 4,
            kind: AllocKind::UsmShared,
        })
        .unwrap_err();
    assert!(matches!(
        e,
        AllocError::Unsupported {
            kind: AllocKind::UsmShared,
            ..
        }
    ));

    // Raw wgpu misuse outside the engine's scopes is logged and recorded, never a panic.
    let g = Gpu::new_blocking(GpuOptions::default()).unwrap();
    let engine = Engine::new(g.clone());
    let b = engine
        .allocate(&BufferDesc {
            label: "raw",
            size_bytes: 64,
            kind: AllocKind::UsmDevice,
        })
        .unwrap();
    assert!(g.uncaptured_errors().is_empty());
    let mut enc = g.device().create_command_encoder(&Default::default());
    enc.copy_buffer_to_buffer(b.raw(), 0, b.raw(), 32, 32); // same buffer: invalid in WebGPU
    g.queue().submit([enc.finish()]);
    g.poll_wait();
    let logged = g.uncaptured_errors();
    assert!(
        !logged.is_empty() && logged[0].contains("same buffer"),
        "{logged:?}"
    );
    // The engine's own path reports the same mistake as a typed error instead.
    let e = engine.copy(&b, 0, &b, 32, 32).unwrap_err();
    assert!(matches!(e, AllocError::SameBufferCopy { .. }));
    assert_eq!(g.uncaptured_errors().len(), logged.len());
}
