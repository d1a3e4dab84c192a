//! naga validates every WGSL file in `shaders/`, and each file follows the house layout:
//! a header comment, and compute entry points named `<family>_<variant>` after the file.

use std::path::Path;

#[test]
fn every_shader_validates() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("shaders");
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
        let src = std::fs::read_to_string(&path).unwrap();
        let module = dynrt::gpu::validate_wgsl(&src)
            .unwrap_or_else(|e| panic!("{} does not validate:\n{e}", path.display()));
        let family = path.file_stem().unwrap().to_str().unwrap();
        assert!(
            src.trim_start().starts_with("//"),
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
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("shaders");
    let mut literals = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("wgsl") {
            continue;
        }
        let src = std::fs::read_to_string(&path).unwrap();
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
