//! `dynrt info [--json]`: the adapters found on every backend, the one dynrt picks (honouring
//! `WGPU_BACKEND` / `WGPU_ADAPTER_NAME`), its backend and limits, the memory budget, and the
//! allocation-kind table with what this adapter supports.

use anyhow::Context;
use dynrt::gpu::kernels::quant::QuantLayout;
use dynrt::gpu::{enumerate_all_adapters, AdapterInfo, Engine, Gpu, GpuOptions};
use dynrt::memory::AllocKind;
use serde_json::json;
use std::process::ExitCode;

/// Arguments of `dynrt info`.
#[derive(clap::Args)]
pub struct Args {
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

fn adapter_json(i: &AdapterInfo) -> serde_json::Value {
    json!({
        "name": i.name,
        "backend": format!("{:?}", i.backend),
        "device_type": format!("{:?}", i.device_type),
        "driver": i.driver,
        "driver_info": i.driver_info,
        "vendor": i.vendor,
        "device": i.device,
    })
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let adapters = enumerate_all_adapters();
    let opts = GpuOptions::from_env()?;
    let budget_source = if opts.memory_budget_bytes.is_some() {
        "DYNRT_MEMORY_BUDGET"
    } else {
        "default (wgpu reports no adapter memory size)"
    };
    let chosen = Gpu::new_blocking(opts);
    let gpu = match chosen {
        Ok(g) => g,
        Err(e) => {
            if args.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&json!({
                        "adapters": adapters.iter().map(adapter_json).collect::<Vec<_>>(),
                        "chosen": null,
                        "error": e.to_string(),
                    }))?
                );
            } else {
                println!("adapters found: {}", adapters.len());
                for a in &adapters {
                    println!("  {} ({:?}, {:?})", a.name, a.backend, a.device_type);
                }
            }
            return Err(e).context("no usable adapter");
        }
    };
    let engine = Engine::new(gpu.clone());
    let info = gpu.adapter_info();
    let l = gpu.limits();
    // The limits dynrt checks, then the alignments and the uniform binding size (fixed by
    // WebGPU's rules, not checked).
    let mut limits: Vec<(&str, u64)> = dynrt::gpu::checked_limits(l).to_vec();
    limits.extend([
        (
            "max_uniform_buffer_binding_size",
            l.max_uniform_buffer_binding_size,
        ),
        (
            "min_storage_buffer_offset_alignment",
            l.min_storage_buffer_offset_alignment.into(),
        ),
        (
            "min_uniform_buffer_offset_alignment",
            l.min_uniform_buffer_offset_alignment.into(),
        ),
    ]);
    let kinds: Vec<_> = AllocKind::ALL
        .iter()
        .map(|k| gpu.kind_support(*k))
        .collect();

    if args.json {
        let v = json!({
            "adapters": adapters.iter().map(adapter_json).collect::<Vec<_>>(),
            "chosen": adapter_json(info),
            "adapter_class": gpu.adapter_class().name(),
            "io_rule": gpu.adapter_class().io_rule(),
            "features": {
                "mappable_primary_buffers": gpu.supports_shared(),
                "shader_f16": gpu.has_shader_f16(),
                "subgroup": gpu.has_subgroups(),
                "subgroup_min_size": info.subgroup_min_size,
                "subgroup_max_size": info.subgroup_max_size,
            },
            "kernel_class": format!("{:?}", QuantLayout::of(&gpu)),
            "limits": limits.iter().map(|(n, v)| (n.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
            "memory_budget_bytes": engine.memory_budget_bytes(),
            "memory_budget_source": budget_source,
            "kinds": kinds.iter().map(|k| json!({
                "kind": k.kind.name(),
                "usages": k.usage_names(),
                "host_access": k.host_access,
                "bindable": k.kind.bindable(),
                "supported": k.supported,
                "reason": k.reason,
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(ExitCode::SUCCESS);
    }

    println!("adapters found: {}", adapters.len());
    for a in &adapters {
        let mark = if a.name == info.name && a.backend == info.backend {
            "*"
        } else {
            " "
        };
        println!(
            " {mark} {} ({:?}, {:?}, driver {} {})",
            a.name, a.backend, a.device_type, a.driver, a.driver_info
        );
    }
    println!(
        "chosen: {} on {:?} ({:?})",
        info.name, info.backend, info.device_type
    );
    println!(
        "memory: {} ({})",
        gpu.adapter_class().name(),
        gpu.adapter_class().io_rule()
    );
    println!(
        "features: MAPPABLE_PRIMARY_BUFFERS={} SHADER_F16={} SUBGROUP={} (subgroup size {}..={})",
        gpu.supports_shared(),
        gpu.has_shader_f16(),
        gpu.has_subgroups(),
        info.subgroup_min_size,
        info.subgroup_max_size
    );
    println!("kernel class: {:?}", QuantLayout::of(&gpu));
    println!("limits:");
    for (n, v) in &limits {
        println!("  {n:<40} {v}");
    }
    println!(
        "memory budget: {} bytes ({budget_source})",
        engine.memory_budget_bytes()
    );
    println!("allocation kinds:");
    println!(
        "  {:<11} {:<10} {:<62} {:<36} bindable",
        "kind", "supported", "wgpu usages", "host access"
    );
    for k in &kinds {
        println!(
            "  {:<11} {:<10} {:<62} {:<36} {}",
            k.kind.name(),
            if k.supported { "yes" } else { "no" },
            k.usage_names(),
            k.host_access,
            if k.kind.bindable() { "yes" } else { "no" }
        );
        if !k.supported {
            println!("              why not: {}", k.reason);
        }
    }
    Ok(ExitCode::SUCCESS)
}
