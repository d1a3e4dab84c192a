//! The kernel families' sources as their pipelines get them ([`crate::gpu::shader_sources`]:
//! the prelude, then the family's file): naga validates each, entry points are named after
//! their family, and every uniform struct matches the Rust struct that fills it.

use super::*;

#[test]
fn every_family_validates_with_naga_and_names_its_entries() {
    let mut entries = 0;
    for f in FAMILIES {
        let m =
            crate::gpu::validate_wgsl((f.source)()).unwrap_or_else(|e| panic!("{}: {e}", f.name));
        for ep in &m.entry_points {
            assert!(
                ep.name.starts_with(&format!("{}_", f.name)),
                "entry {} in {}",
                ep.name,
                f.name
            );
            assert!(!(f.bindings)(&ep.name).is_empty(), "{}", ep.name);
            entries += 1;
        }
    }
    assert!(entries >= 10, "found {entries} entry points");
}

/// Every uniform struct of every shader (`struct *Params`), in the source its pipelines get,
/// with the Rust struct that fills it: the size naga's layouter gives the WGSL struct must be
/// the Rust struct's, and a WGSL uniform struct missing from this list fails the test.
#[test]
fn every_uniform_struct_matches_its_wgsl_layout() {
    use std::mem::size_of;
    let rust: &[(&str, &str, usize)] = &[
        // The prelude's, found in every source.
        (
            "prelude",
            "BroadcastParams",
            size_of::<uniforms::BroadcastParams>(),
        ),
        (
            "attention",
            "RopeParams",
            size_of::<attention::RopeParams>(),
        ),
        ("attention", "GqaParams", size_of::<attention::GqaParams>()),
        ("gqa", "GqaParams", size_of::<attention::GqaParams>()),
        (
            "attention",
            "ScatterParams",
            size_of::<attention::ScatterParams>(),
        ),
        ("cnn", "PoolParams", size_of::<cnn::PoolParams>()),
        ("cnn", "BnParams", size_of::<cnn::BnParams>()),
        (
            "elementwise",
            "FlatParams",
            size_of::<elementwise::FlatParams>(),
        ),
        (
            "generate",
            "RangeParams",
            size_of::<generate::RangeParams>(),
        ),
        (
            "generate",
            "TriluParams",
            size_of::<generate::TriluParams>(),
        ),
        ("mask", "CausalParams", size_of::<mask::CausalParams>()),
        ("matmul", "MatMulParams", size_of::<matmul::MatMulParams>()),
        ("matmul", "ConvParams", size_of::<matmul::ConvParams>()),
        (
            "matmul",
            "EpilogueParams",
            size_of::<matmul::EpilogueParams>(),
        ),
        ("movement", "CopyParams", size_of::<movement::CopyParams>()),
        (
            "movement",
            "GatherParams",
            size_of::<movement::GatherParams>(),
        ),
        (
            "movement",
            "CheckIdsParams",
            size_of::<movement::CheckIdsParams>(),
        ),
        ("movement", "FillParams", size_of::<movement::FillParams>()),
        (
            "movement",
            "SplatParams",
            size_of::<movement::SplatParams>(),
        ),
        (
            "movement",
            "SliceParams",
            size_of::<movement::SliceParams>(),
        ),
        ("quant", "LinearParams", size_of::<quant::LinearParams>()),
        ("quant", "GatherParams", size_of::<quant::GatherParams>()),
        ("quantx4", "LinearParams", size_of::<quant::LinearParams>()),
        ("quantx4", "GatherParams", size_of::<quant::GatherParams>()),
        ("quantsg", "LinearParams", size_of::<quant::LinearParams>()),
        ("quantsg", "GatherParams", size_of::<quant::GatherParams>()),
        ("reduce", "RowParams", size_of::<reduce::RowParams>()),
        ("reduce", "AxesParams", size_of::<reduce::AxesParams>()),
        ("reduce", "CumParams", size_of::<reduce::CumParams>()),
        ("rotary", "RotaryParams", size_of::<rotary::RotaryParams>()),
        ("sample", "SampleParams", size_of::<sample::SampleParams>()),
        ("fill", "FillParams", size_of::<fill::FillParams>()),
    ];
    let mut seen = vec![false; rust.len()];
    for (family, source) in crate::gpu::shader_sources() {
        let module = crate::gpu::validate_wgsl(source).unwrap();
        let mut layouter = naga::proc::Layouter::default();
        layouter.update(module.to_ctx()).unwrap();
        for (handle, ty) in module.types.iter() {
            let naga::TypeInner::Struct { span, .. } = ty.inner else {
                continue;
            };
            let Some(name) = ty.name.as_deref().filter(|n| n.ends_with("Params")) else {
                continue;
            };
            let at = rust
                .iter()
                .position(|&(f, n, _)| (f == family || f == "prelude") && n == name)
                .unwrap_or_else(|| {
                    panic!("{family}: WGSL struct {name} has no Rust struct in this list")
                });
            let bytes = rust[at].2;
            assert_eq!(layouter[handle].size, span, "{family}: {name}");
            assert_eq!(
                span as usize, bytes,
                "{family}: WGSL struct {name} is {span} bytes, its Rust struct {bytes}"
            );
            // A uniform's size must be a multiple of 16 bytes.
            assert_eq!(bytes % 16, 0, "{family}: {name}");
            seen[at] = true;
        }
    }
    for (&(family, name, _), seen) in rust.iter().zip(seen) {
        assert!(seen, "{family}: struct {name} is not in its shader");
    }
}
