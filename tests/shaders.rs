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
