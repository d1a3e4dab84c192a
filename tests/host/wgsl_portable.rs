//! Every WGSL source must compile on Tint (Chromium, Dawn) as well as on naga. Tint refuses
//! constant expressions that evaluate to NaN or infinity ("value nan cannot be represented
//! as 'f32'") where naga accepts them, so a `bitcast<f32>` of a literal whose exponent bits
//! are all ones passes every native test and fails only in the browser. This test reads the
//! shaders as text and names each such literal; load the bits from a `var<private>` instead.

use crate::common;

/// `bitcast<f32>(0x...u)` literals with an all-ones exponent, as `file:line: text`.
fn non_finite_literals(name: &str, src: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (i, line) in src.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("bitcast<f32>(") {
            rest = &rest[at + "bitcast<f32>(".len()..];
            let arg = rest.trim_start();
            let hex = arg
                .strip_prefix("0x")
                .or_else(|| arg.strip_prefix("0X"))
                .map(|h| {
                    h.chars()
                        .take_while(|c| c.is_ascii_hexdigit())
                        .collect::<String>()
                });
            if let Some(bits) = hex.and_then(|h| u32::from_str_radix(&h, 16).ok()) {
                if bits & 0x7f80_0000 == 0x7f80_0000 {
                    found.push(format!("{name}:{}: {}", i + 1, line.trim()));
                }
            }
        }
    }
    found
}

#[test]
fn no_shader_has_a_non_finite_constant() {
    let dir = crate::common::repo().join("shaders");
    let mut found = Vec::new();
    let mut files = 0;
    for entry in std::fs::read_dir(&dir).expect("shaders/ is readable") {
        let path = entry.expect("a directory entry").path();
        if path.extension().is_some_and(|e| e == "wgsl") {
            files += 1;
            let src = common::shader_source(&path);
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            found.extend(non_finite_literals(&name, &src));
        }
    }
    assert!(
        files >= 5,
        "only {files} WGSL files under {}",
        dir.display()
    );
    assert!(
        found.is_empty(),
        "constant NaN/infinity that Tint refuses (load the bits from a var<private>):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_scan_finds_what_tint_refuses() {
    let src = "fn f() -> f32 {\n    return bitcast<f32>(0x7fc00000u);\n}\n\
               fn g() -> f32 { return bitcast<f32>(0xFF800000u); }\n\
               fn h() -> f32 { return bitcast<f32>(0x5effffffu); } // bitcast<f32>(0x7f800000u)\n";
    let found = non_finite_literals("t.wgsl", src);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].starts_with("t.wgsl:2:"));
    assert!(found[1].starts_with("t.wgsl:4:"));
}
