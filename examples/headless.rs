//! Allocates every kind, runs `shaders/fill.wgsl` into a preallocated usm_device output,
//! reads it back, checks it, and prints the allocation history.
//!
//! `DYNRT_VERBOSE=2 cargo run --release --example headless` also prints each history line as
//! it happens; `WGPU_BACKEND=gl` runs it on llvmpipe.

use anyhow::{bail, Context};
use dynrt::gpu::{BufferDesc, Engine, FillPipeline, Gpu, GpuOptions, KindRequest};
use dynrt::memory::accounting::check_history;
use dynrt::memory::AllocKind;

const LEN: u32 = 100_000;
const SCALE: f32 = 0.5;
const BIAS: f32 = -3.0;

fn main() -> anyhow::Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let gpu = Gpu::new_blocking(GpuOptions::from_env()?)?;
    let info = gpu.adapter_info();
    println!(
        "adapter: {} ({:?}, {:?}); usm_shared {}",
        info.name,
        info.backend,
        info.device_type,
        if gpu.supports_shared() {
            "supported"
        } else {
            "unsupported (no MAPPABLE_PRIMARY_BUFFERS)"
        }
    );
    let engine = Engine::new(gpu.clone());
    // Keep the events for the printout below (the counters are kept anyway).
    engine.record_history(4096);
    let bytes = u64::from(LEN) * 4;

    // The output the kernel writes: preallocated usm_device.
    let out = engine.allocate(&BufferDesc {
        label: "fill output",
        size_bytes: bytes,
        kind: AllocKind::UsmDevice,
    })?;

    // Every other kind, each checked by a round trip.
    let pattern: Vec<u8> = (0..256u32).map(|i| (i * 7 + 1) as u8).collect();
    let cl = engine.allocate_init(
        &BufferDesc {
            label: "cl_mem constants",
            size_bytes: 256,
            kind: AllocKind::ClMem,
        },
        &pattern,
    )?;
    let host = engine.allocate(&BufferDesc {
        label: "usm_host upload",
        size_bytes: 256,
        kind: AllocKind::UsmHost,
    })?;
    engine.write(&host, 0, &pattern)?;
    let mut kinds_checked = vec![
        ("cl_mem", engine.read_blocking(&cl, 0, 256)?),
        ("usm_host", engine.read_blocking(&host, 0, 256)?),
    ];
    let shared = if gpu.supports_shared() {
        let s = engine.allocate(&BufferDesc {
            label: "usm_shared io",
            size_bytes: bytes,
            kind: AllocKind::UsmShared,
        })?;
        // Direct mapping: no staging buffer for usm_shared.
        pollster::block_on(engine.write_mapped(&s, 0, &pattern))?;
        kinds_checked.push(("usm_shared", engine.read_blocking(&s, 0, 256)?));
        Some(s)
    } else {
        let e = engine
            .allocate(&BufferDesc {
                label: "usm_shared io",
                size_bytes: bytes,
                kind: AllocKind::UsmShared,
            })
            .err()
            .context("usm_shared allocated on a device without MAPPABLE_PRIMARY_BUFFERS")?;
        println!("usm_shared: {e}");
        None
    };
    for (name, got) in &kinds_checked {
        if got != &pattern {
            bail!("{name} round trip returned different bytes");
        }
        println!("{name}: 256-byte round trip ok");
    }

    // The kernel.
    let fill = FillPipeline::new(&gpu)?;
    fill.dispatch(&engine, &out, LEN, SCALE, BIAS)?;
    let got = engine.read_blocking(&out, 0, bytes)?;
    let got: Vec<f32> = bytemuck::pod_collect_to_vec(&got);
    let mut max_err = 0f32;
    for (i, v) in got.iter().enumerate() {
        let want = SCALE * i as f32 + BIAS;
        max_err = max_err.max((v - want).abs());
    }
    if max_err != 0.0 {
        bail!("fill_affine: max abs error {max_err} (expected exact)");
    }
    println!("fill_affine: {LEN} f32 values into usm_device verified (max abs error {max_err})");

    // On a shared-memory device, copy the result into usm_shared and read it by direct mapping.
    if let Some(s) = &shared {
        let mut enc = gpu.device().create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(out.raw(), 0, s.raw(), 0, bytes);
        gpu.queue().submit([enc.finish()]);
        let direct: Vec<f32> =
            bytemuck::pod_collect_to_vec(&pollster::block_on(engine.read_mapped(s, 0, bytes))?);
        if direct != got {
            bail!("usm_shared direct map differs from the usm_device readback");
        }
        println!("usm_shared: result read by mapping the buffer itself");
    }
    let pick = engine.preferred_kind(&KindRequest {
        host_access: true,
        kernel_access: false,
        kernel_io_bytes: 0,
    });
    println!("preferred kind for host-locked memory here: {pick}");

    drop((out, cl, host, shared));
    let stats = engine.stats();
    for k in AllocKind::ALL {
        let s = stats.kind(k);
        println!(
            "{k:>10}: now {} bytes, peak {} bytes, {} allocations, {} frees",
            s.current_bytes, s.peak_bytes, s.allocations, s.frees
        );
        if s.current_bytes != 0 {
            bail!(
                "{k}: {} bytes still in use after every buffer was dropped",
                s.current_bytes
            );
        }
    }
    let history = engine.history();
    println!("allocation history ({} events):", history.len());
    for e in &history {
        println!("  {e}");
    }
    check_history(&history)?;
    println!("history arithmetic holds; result verified");
    Ok(())
}
