//! The page's first check, [`adapter_info`]: the adapter, its limits, and one real round trip
//! per allocation kind through the engine.

use wasm_bindgen::prelude::*;

/// Elements per self-check buffer: 4096 f32 = 16 KiB, more than one 64-wide workgroup row.
const SELF_CHECK_ELEMENTS: u32 = 4096;

/// What [`adapter_info`] returns (serialised to JSON for the page).
#[derive(serde::Serialize)]
struct AdapterReport {
    name: String,
    backend: String,
    device_type: String,
    driver: String,
    driver_info: String,
    max_buffer_size: u64,
    max_storage_buffer_binding_size: u64,
    supports_usm_shared: bool,
    self_check: SelfCheck,
}

/// One real round trip per allocation kind through the [`crate::gpu::Engine`].
#[derive(serde::Serialize)]
struct SelfCheck {
    passed: bool,
    detail: String,
    kinds: Vec<KindCheck>,
}

#[derive(serde::Serialize)]
struct KindCheck {
    kind: &'static str,
    /// How the data got there: `fill_affine` kernel or a host mapping.
    path: &'static str,
    size_bytes: u64,
    /// Bytes of this kind in use while the buffer was alive, from the engine's accounting.
    bytes_in_use: u64,
    mismatches: u32,
}

/// Opens a WebGPU device through [`crate::gpu::Gpu::new`] and runs a self-check: for every
/// allocation kind the device supports, allocates a 16 KiB buffer through the engine, fills
/// it (with the `fill_affine` kernel where the kind is bindable, by mapping where it is
/// host-only), reads it back and compares; then checks that freeing returned every byte.
/// Resolves to a JSON string: adapter name, backend, device type, limits, and `self_check`
/// (`passed`, `detail`, per-kind results).
///
/// # Errors
/// Rejects with the message of [`crate::gpu::GpuError`] when no adapter or device can be had,
/// or of [`crate::gpu::AllocError`] when an allocation or readback fails.
#[wasm_bindgen]
pub async fn adapter_info() -> Result<String, JsError> {
    let gpu = crate::gpu::Gpu::new(crate::gpu::GpuOptions::default())
        .await
        .map_err(|e| JsError::new(&e.to_string()))?;
    let info = gpu.adapter_info().clone();
    let limits = gpu.limits().clone();
    let supports_usm_shared = gpu.supports_shared();
    let engine = crate::gpu::Engine::new(gpu);
    let self_check = self_check(&engine)
        .await
        .map_err(|e| JsError::new(&e.to_string()))?;
    let report = AdapterReport {
        name: info.name,
        backend: format!("{:?}", info.backend),
        device_type: format!("{:?}", info.device_type),
        driver: info.driver,
        driver_info: info.driver_info,
        max_buffer_size: limits.max_buffer_size,
        max_storage_buffer_binding_size: limits.max_storage_buffer_binding_size,
        supports_usm_shared,
        self_check,
    };
    serde_json::to_string(&report).map_err(|e| JsError::new(&e.to_string()))
}

async fn self_check(engine: &crate::gpu::Engine) -> Result<SelfCheck, crate::gpu::AllocError> {
    use crate::memory::AllocKind;
    let fill = crate::gpu::FillPipeline::new(engine.gpu())
        .map_err(|e| crate::gpu::AllocError::Validation(e.to_string()))?;
    let n = SELF_CHECK_ELEMENTS;
    let size_bytes = u64::from(n) * 4;
    let mut kinds = Vec::new();
    for (i, kind) in AllocKind::ALL.into_iter().enumerate() {
        if !engine.gpu().supports_kind(kind) {
            continue;
        }
        // A different ramp per kind, so a buffer mix-up would show as mismatches.
        let (scale, bias) = (0.5 + i as f32, -3.0 * i as f32);
        let buf = engine
            .allocate_async(&crate::gpu::BufferDesc {
                label: "dynrt web self-check",
                size_bytes,
                kind,
            })
            .await?;
        let path = if kind.bindable() {
            fill.dispatch(engine, &buf, n, scale, bias)?;
            "fill_affine kernel"
        } else {
            let data: Vec<u8> = (0..n)
                .flat_map(|j| (scale * j as f32 + bias).to_le_bytes())
                .collect();
            engine.write_mapped(&buf, 0, &data).await?;
            "mapped write"
        };
        let bytes_in_use = engine.stats().current_bytes(kind);
        let bytes = engine.read(&buf, 0, size_bytes).await?;
        let mismatches = bytes
            .chunks_exact(4)
            .enumerate()
            .filter(|(j, c)| {
                let got = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                got != scale * *j as f32 + bias
            })
            .count() as u32;
        drop(buf);
        kinds.push(KindCheck {
            kind: kind.name(),
            path,
            size_bytes,
            bytes_in_use,
            mismatches,
        });
    }
    let leaked_bytes = engine.stats().total_current_bytes();
    let bad: Vec<String> = kinds
        .iter()
        .filter(|k| k.mismatches > 0 || k.bytes_in_use < k.size_bytes)
        .map(|k| format!("{}: {} wrong values", k.kind, k.mismatches))
        .collect();
    let passed = !kinds.is_empty() && bad.is_empty() && leaked_bytes == 0;
    let detail = if passed {
        format!(
            "wrote and read back {} KiB per kind: {}; all bytes freed",
            size_bytes / 1024,
            kinds
                .iter()
                .map(|k| format!("{} by {}", k.kind, k.path))
                .collect::<Vec<_>>()
                .join(", ")
        )
    } else if kinds.is_empty() {
        "no allocation kind is supported on this device".to_string()
    } else {
        format!(
            "{}; {} bytes still in use after freeing",
            if bad.is_empty() {
                "values correct".to_string()
            } else {
                bad.join(", ")
            },
            leaked_bytes
        )
    };
    log::info!("self-check: {detail}");
    Ok(SelfCheck {
        passed,
        detail,
        kinds,
    })
}
