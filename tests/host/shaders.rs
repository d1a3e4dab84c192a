//! naga validates every WGSL file in `shaders/`, and each file follows the house layout:
//! a header comment, and compute entry points named `<family>_<variant>` after the file.

use crate::common;

#[test]
fn every_shader_validates() {
    let dir = crate::common::repo().join("shaders");
    let mut found = 0;
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.extension().and_then(|e| e.to_str()) != Some("wgsl") {
            continue;
        }
        found += 1;
        let src = common::shader_source(&path);
        let module = dynrt::gpu::validate_wgsl(&src)
            .unwrap_or_else(|e| panic!("{} does not validate:\n{e}", path.display()));
        let family = path.file_stem().unwrap().to_str().unwrap();
        assert!(
            std::fs::read_to_string(&path)
                .unwrap()
                .trim_start()
                .starts_with("//"),
            "{}: no header comment",
            path.display()
        );
        let computes: Vec<_> = module
            .entry_points
            .iter()
            .filter(|e| e.stage == naga::ShaderStage::Compute)
            .collect();
        assert!(
            !computes.is_empty(),
            "{}: no compute entry point",
            path.display()
        );
        for e in computes {
            assert!(
                e.name.starts_with(&format!("{family}_")),
                "{}: entry point `{}` is not named {family}_<variant>",
                path.display(),
                e.name
            );
        }
    }
    assert!(found >= 1, "no .wgsl files found in {}", dir.display());
    println!("validated {found} shader files");
}

/// Chromium's WGSL compiler (Tint) rejects an f32 literal whose value is not representable
/// (`-3.40282347e38` rounds above `f32::MAX`), while naga accepts it; the browser test found
/// this. Every decimal float literal in `shaders/` must lie within the f32 range.
#[test]
fn every_float_literal_fits_in_f32() {
    let dir = crate::common::repo().join("shaders");
    let mut literals = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("wgsl") {
            continue;
        }
        let src = common::shader_source(&path);
        for (line_no, line) in src.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for token in code
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '+'))
            {
                let t = token.trim_end_matches('f');
                let is_float = t.contains('.') || t.contains('e') || t.contains('E');
                if !is_float || !t.starts_with(|c: char| c.is_ascii_digit() || c == '-' || c == '.')
                {
                    continue;
                }
                let Ok(v) = t.parse::<f64>() else { continue };
                literals += 1;
                assert!(
                    v.abs() <= f32::MAX as f64,
                    "{}:{}: literal {token} is outside the f32 range (Tint rejects it)",
                    path.display(),
                    line_no + 1
                );
            }
        }
    }
    assert!(literals > 0, "found no float literals in {}", dir.display());
}

/// What every compute entry point of `shaders/` asks of a device (workgroup size and memory,
/// storage and uniform buffers, bind groups) is within `dynrt::gpu::required_limits()`, the
/// limits an application's device is checked against when dynrt shares it.
#[test]
fn every_kernel_fits_the_limits_dynrt_requires() {
    let need = dynrt::gpu::required_limits();
    let dir = crate::common::repo().join("shaders");
    let mut checked = 0;
    let (mut most_storage, mut most_wg_bytes) = (0u32, 0u32);
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("wgsl") {
            continue;
        }
        let src = common::shader_source(&path);
        let module = naga::front::wgsl::parse_str(&src).unwrap();
        let info = naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::all(),
        )
        .validate(&module)
        .unwrap();
        for (i, ep) in module.entry_points.iter().enumerate() {
            if ep.stage != naga::ShaderStage::Compute {
                continue;
            }
            checked += 1;
            let uses = info.get_entry_point(i);
            let (mut storage, mut uniform, mut wg_bytes, mut groups) = (0u32, 0u32, 0u32, 0u32);
            for (h, var) in module.global_variables.iter() {
                if uses[h].is_empty() {
                    continue;
                }
                match var.space {
                    naga::AddressSpace::Storage { .. } => storage += 1,
                    naga::AddressSpace::Uniform => uniform += 1,
                    naga::AddressSpace::WorkGroup => {
                        wg_bytes += module.types[var.ty].inner.size(module.to_ctx())
                    }
                    _ => {}
                }
                if let Some(b) = &var.binding {
                    groups = groups.max(b.group + 1);
                }
            }
            let [x, y, z] = ep.workgroup_size;
            let at = format!("{}: {}", path.display(), ep.name);
            assert!(x <= need.max_compute_workgroup_size_x, "{at}: x = {x}");
            assert!(y <= need.max_compute_workgroup_size_y, "{at}: y = {y}");
            assert!(z <= need.max_compute_workgroup_size_z, "{at}: z = {z}");
            let inv = x * y * z;
            assert!(
                inv <= need.max_compute_invocations_per_workgroup,
                "{at}: {inv} invocations"
            );
            assert!(
                wg_bytes <= need.max_compute_workgroup_storage_size,
                "{at}: {wg_bytes} B"
            );
            assert!(
                storage <= need.max_storage_buffers_per_shader_stage,
                "{at}: {storage}"
            );
            assert!(
                uniform <= need.max_uniform_buffers_per_shader_stage,
                "{at}: {uniform}"
            );
            assert!(groups <= need.max_bind_groups, "{at}: {groups} groups");
            most_storage = most_storage.max(storage);
            most_wg_bytes = most_wg_bytes.max(wg_bytes);
        }
    }
    assert!(
        checked >= 10,
        "only {checked} compute entry points found in {}",
        dir.display()
    );
    // The check sees real use: the quantized tiled matmul fills all 16 KiB of workgroup
    // memory (above GLES 3.1's 16352 bytes, so dynrt refuses such a device).
    assert_eq!(most_wg_bytes, 16384);
    println!("{checked} kernels: at most {most_storage} storage buffers, {most_wg_bytes} B of workgroup memory");
}
