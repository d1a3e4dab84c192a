//! The parser on good files and on every kind of bad one: each a typed error, no panic.

use super::*;

fn header(version: u32, tensors: u64, kvs: u64) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(version.to_le_bytes());
    b.extend(tensors.to_le_bytes());
    b.extend(kvs.to_le_bytes());
    b
}

fn put_str(b: &mut Vec<u8>, s: &[u8]) {
    b.extend((s.len() as u64).to_le_bytes());
    b.extend(s);
}

/// A file without metadata whose tensor infos are written as given, then padding to 32
/// and `data_bytes` zero bytes.
fn raw(infos: &[(&str, &[u64], u32, u64)], data_bytes: usize) -> Vec<u8> {
    let mut b = header(3, infos.len() as u64, 0);
    for (name, dims, ty, offset) in infos {
        put_str(&mut b, name.as_bytes());
        b.extend((dims.len() as u32).to_le_bytes());
        dims.iter().for_each(|d| b.extend(d.to_le_bytes()));
        b.extend(ty.to_le_bytes());
        b.extend(offset.to_le_bytes());
    }
    b.resize(
        (b.len() as u64).next_multiple_of(32) as usize + data_bytes,
        0,
    );
    b
}

/// A file with one key of type `ty` whose value bytes are given.
fn one_kv(key: &str, ty: u32, value: &[u8]) -> Vec<u8> {
    let mut b = header(3, 0, 1);
    put_str(&mut b, key.as_bytes());
    b.extend(ty.to_le_bytes());
    b.extend(value);
    b
}

fn every_type() -> GgufBuilder {
    GgufBuilder::new()
        .alignment(64)
        .metadata("u8", MetaValue::U8(200))
        .metadata("i8", MetaValue::I8(-100))
        .metadata("u16", MetaValue::U16(60_000))
        .metadata("i16", MetaValue::I16(-30_000))
        .metadata("u32", MetaValue::U32(4_000_000_000))
        .metadata("i32", MetaValue::I32(-2_000_000_000))
        .metadata("f32", MetaValue::F32(1e-5))
        .metadata("bool", MetaValue::Bool(true))
        .metadata("str", MetaValue::Str("héllo 😀".into()))
        .metadata("u64", MetaValue::U64(u64::MAX))
        .metadata("i64", MetaValue::I64(i64::MIN))
        .metadata("f64", MetaValue::F64(-0.5))
        .metadata("empty", MetaValue::Array(MetaArray::U32(vec![])))
        .metadata(
            "strs",
            MetaValue::Array(MetaArray::Str(vec!["a".into(), "".into()])),
        )
        .metadata(
            "bools",
            MetaValue::Array(MetaArray::Bool(vec![true, false])),
        )
        .metadata(
            "nested",
            MetaValue::Array(MetaArray::Array(vec![
                MetaArray::I32(vec![1, 2]),
                MetaArray::Array(vec![MetaArray::F64(vec![0.25])]),
                MetaArray::Str(vec![]),
            ])),
        )
        .tensor("a", GgmlType::F32, &[3, 2], (0..24).collect())
        .tensor("b", GgmlType::Q4_1, &[32], vec![7; 20])
        .tensor("c", GgmlType::IQ2_XXS, &[256], vec![1; 66])
}

#[test]
fn round_trips_every_value_type_and_tensor() {
    let builder = every_type();
    let bytes = builder.build().unwrap();
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.alignment_bytes(), 64);
    assert_eq!(g.data_offset_bytes() % 64, 0);
    let keys: Vec<&str> = g.metadata().map(|(k, _)| k).collect();
    assert_eq!(keys.len(), 17);
    assert_eq!(keys[0], "general.alignment");
    assert_eq!(g.get("u8"), Some(&MetaValue::U8(200)));
    assert_eq!(g.get("str"), Some(&MetaValue::Str("héllo 😀".into())));
    assert_eq!(g.get_u64("u64").unwrap(), u64::MAX);
    assert_eq!(g.get_i64("i64").unwrap(), i64::MIN);
    assert_eq!(g.get_f32("f64").unwrap(), -0.5);
    assert!(g.get_bool("bool").unwrap());
    assert_eq!(g.get_str_array("strs").unwrap(), ["a", ""]);
    assert!(g.get_array("empty").unwrap().is_empty());
    match g.get_array("nested").unwrap() {
        MetaArray::Array(v) => {
            assert_eq!(v[0], MetaArray::I32(vec![1, 2]));
            assert_eq!(v[1], MetaArray::Array(vec![MetaArray::F64(vec![0.25])]));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(g.tensors().len(), 3);
    let a = g.tensor("a").unwrap();
    assert_eq!(
        (a.dims(), a.row_len(), a.num_rows(), a.size_bytes()),
        (&[3u64, 2][..], 3, 2, 24)
    );
    assert_eq!(a.offset_bytes(), g.data_offset_bytes());
    assert_eq!(
        g.tensor_bytes(&bytes, "a").unwrap(),
        (0..24).collect::<Vec<u8>>()
    );
    assert_eq!(g.tensor("b").unwrap().offset_bytes() % 64, 0);
    assert_eq!(g.tensor_bytes(&bytes, "c").unwrap(), vec![1; 66]);
    // A known type that dequantize does not handle parses, and says so when dequantized.
    assert!(matches!(
        g.dequantize_tensor(&bytes, "c"),
        Err(GgufError::UnsupportedTensorType { ref tensor, ty: GgmlType::IQ2_XXS, .. }) if tensor == "c"
    ));
    assert!(matches!(
        g.tensor_bytes(&bytes[1..], "a"),
        Err(GgufError::LengthMismatch { .. })
    ));
    assert!(matches!(
        g.require_tensor("zz"),
        Err(GgufError::MissingTensor { .. })
    ));
}

#[test]
fn typed_accessors_check_types_and_ranges() {
    let bytes = every_type().build().unwrap();
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.get_u32("u8").unwrap(), 200);
    assert_eq!(g.get_i64("i8").unwrap(), -100);
    assert!(matches!(
        g.get_u32("i8"),
        Err(GgufError::ValueOutOfRange { .. })
    ));
    assert!(matches!(
        g.get_u32("u64"),
        Err(GgufError::ValueOutOfRange { .. })
    ));
    assert!(matches!(
        g.get_u32("str"),
        Err(GgufError::WrongType {
            expected: "u32",
            found: "string",
            ..
        })
    ));
    assert!(matches!(
        g.get_str("nope"),
        Err(GgufError::MissingKey { .. })
    ));
    assert!(matches!(g.opt_str("nope"), Ok(None)));
    assert!(matches!(g.opt_u32("str"), Err(GgufError::WrongType { .. })));
    assert!(matches!(
        g.get_str_array("bools"),
        Err(GgufError::WrongType { .. })
    ));
    assert!(matches!(
        g.get_i32_array("u8"),
        Err(GgufError::WrongType { .. })
    ));
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = every_type().build().unwrap();
    let g = Gguf::parse(&bytes).unwrap();
    let data_end = g
        .tensors()
        .iter()
        .map(|t| t.byte_range().end)
        .max()
        .unwrap() as usize;
    for len in 0..data_end {
        match Gguf::parse(&bytes[..len]) {
            Err(GgufError::Truncated { .. } | GgufError::TensorOutOfBounds { .. }) => {}
            // A count checked against what is left fails before the bytes run out.
            Err(GgufError::CountTooLarge { .. }) => {}
            other => panic!("prefix of {len} bytes: {other:?}"),
        }
    }
    // Cut inside the last tensor: the error names it.
    assert!(matches!(
        Gguf::parse(&bytes[..data_end - 1]),
        Err(GgufError::TensorOutOfBounds { ref tensor, .. }) if tensor == "c"
    ));
}

#[test]
fn wrong_magic_and_versions() {
    let mut b = header(3, 0, 0);
    b[0] = b'F';
    assert!(matches!(
        Gguf::parse(&b),
        Err(GgufError::BadMagic { found }) if &found == b"FGUF"
    ));
    for v in [0, 1, 4, 0x0300_0000] {
        assert!(matches!(
            Gguf::parse(&header(v, 0, 0)),
            Err(GgufError::UnsupportedVersion { version }) if version == v
        ));
    }
    assert!(Gguf::parse(&header(2, 0, 0)).is_ok());
    assert!(matches!(
        Gguf::parse(b"GGU"),
        Err(GgufError::Truncated { .. })
    ));
}

#[test]
fn tensors_past_the_end_misaligned_or_overlapping() {
    let ok = raw(&[("t", &[8], 0, 0)], 32);
    assert!(Gguf::parse(&ok).is_ok());
    assert!(matches!(
        Gguf::parse(&raw(&[("t", &[8], 0, 32)], 32)),
        Err(GgufError::TensorOutOfBounds { ref tensor, .. }) if tensor == "t"
    ));
    assert!(matches!(
        Gguf::parse(&raw(&[("t", &[8], 0, u64::MAX - 31)], 32)),
        Err(GgufError::TensorOutOfBounds { end: u64::MAX, .. })
    ));
    assert!(matches!(
        Gguf::parse(&raw(&[("t", &[8], 0, 4)], 64)),
        Err(GgufError::MisalignedTensor {
            offset: 4,
            alignment: 32,
            ..
        })
    ));
    assert!(matches!(
        Gguf::parse(&raw(&[("a", &[16], 0, 0), ("b", &[8], 0, 32)], 96)),
        Err(GgufError::TensorsOverlap { ref first, ref second }) if first == "a" && second == "b"
    ));
    assert!(matches!(
        Gguf::parse(&raw(&[("a", &[8], 0, 0), ("a", &[8], 0, 32)], 64)),
        Err(GgufError::DuplicateTensor { .. })
    ));
    // Zero-sized tensors overlap nothing.
    assert!(Gguf::parse(&raw(&[("a", &[0], 0, 0), ("b", &[8], 0, 0)], 32)).is_ok());
}

#[test]
fn unknown_types_overflowing_dims_and_partial_blocks() {
    for id in [4, 5, 31, 1000] {
        assert!(matches!(
            Gguf::parse(&raw(&[("w", &[32], id, 0)], 64)),
            Err(GgufError::UnknownTensorType { ref tensor, type_id }) if tensor == "w" && type_id == id
        ));
    }
    for dims in [
        &[1u64 << 32, 1 << 32, 1 << 32][..],
        &[u64::MAX][..],
        &[1 << 62][..],
    ] {
        assert!(matches!(
            Gguf::parse(&raw(&[("w", dims, 0, 0)], 64)),
            Err(GgufError::DimsOverflow { ref tensor, .. }) if tensor == "w"
        ));
    }
    assert!(matches!(
        Gguf::parse(&raw(&[("w", &[1, 1, 1, 1, 1], 0, 0)], 64)),
        Err(GgufError::BadDimCount { n_dims: 5, .. })
    ));
    assert!(matches!(
        Gguf::parse(&raw(&[("w", &[33, 2], 3, 0)], 64)),
        Err(GgufError::PartialBlock {
            row_len: 33,
            block_len: 32,
            ..
        })
    ));
    // No dims: a scalar.
    let g = Gguf::parse(&raw(&[("s", &[], 0, 0)], 32)).unwrap();
    assert_eq!(g.tensor("s").map(|t| t.num_elements()), Some(1));
}

#[test]
fn huge_counts_are_refused_before_allocating() {
    assert!(matches!(
        Gguf::parse(&header(3, 0, u64::MAX)),
        Err(GgufError::CountTooLarge {
            count: u64::MAX,
            ..
        })
    ));
    assert!(matches!(
        Gguf::parse(&header(3, u64::MAX, 0)),
        Err(GgufError::CountTooLarge {
            count: u64::MAX,
            ..
        })
    ));
    let mut arr = 10u32.to_le_bytes().to_vec(); // u64 elements
    arr.extend((u64::MAX / 4).to_le_bytes());
    assert!(matches!(
        Gguf::parse(&one_kv("k", 9, &arr)),
        Err(GgufError::CountTooLarge { .. })
    ));
    let mut s = Vec::new();
    s.extend(u64::MAX.to_le_bytes());
    assert!(matches!(
        Gguf::parse(&one_kv("k", 8, &s)),
        Err(GgufError::Truncated { .. })
    ));
    let mut name = header(3, 1, 0);
    name.extend((1u64 << 40).to_le_bytes());
    name.resize(name.len() + 64, 0);
    assert!(matches!(
        Gguf::parse(&name),
        Err(GgufError::Truncated { .. })
    ));
}

#[test]
fn bad_metadata_values() {
    assert!(matches!(
        Gguf::parse(&one_kv("k", 13, &[0; 8])),
        Err(GgufError::UnknownValueType { type_id: 13, .. })
    ));
    assert!(matches!(
        Gguf::parse(&one_kv("k", 7, &[2])),
        Err(GgufError::InvalidBool { value: 2, .. })
    ));
    let mut bad_utf8 = Vec::new();
    put_str(&mut bad_utf8, &[0xFF, 0xFE]);
    assert!(matches!(
        Gguf::parse(&one_kv("k", 8, &bad_utf8)),
        Err(GgufError::InvalidUtf8 { .. })
    ));
    let mut bad_key = header(3, 0, 1);
    put_str(&mut bad_key, &[0xC3]);
    bad_key.extend(0u32.to_le_bytes());
    bad_key.push(0);
    assert!(matches!(
        Gguf::parse(&bad_key),
        Err(GgufError::InvalidUtf8 { .. })
    ));
    // Arrays nested one deeper than allowed.
    let mut deep = Vec::new();
    for _ in 0..=MAX_ARRAY_NESTING {
        deep.extend(9u32.to_le_bytes());
        deep.extend(1u64.to_le_bytes());
    }
    deep.extend(0u32.to_le_bytes());
    deep.extend(0u64.to_le_bytes());
    assert!(matches!(
        Gguf::parse(&one_kv("k", 9, &deep)),
        Err(GgufError::NestingTooDeep { .. })
    ));
    let dup = GgufBuilder::new()
        .metadata("k", MetaValue::U8(1))
        .metadata("k", MetaValue::U8(2))
        .build()
        .unwrap();
    assert!(matches!(
        Gguf::parse(&dup),
        Err(GgufError::DuplicateKey { .. })
    ));
    for a in [0u32, 3, 48] {
        let b = GgufBuilder::new().alignment(a).build().unwrap();
        assert!(
            matches!(Gguf::parse(&b), Err(GgufError::BadAlignment { .. })),
            "{a}"
        );
    }
    let b = GgufBuilder::new()
        .metadata("general.alignment", MetaValue::Str("32".into()))
        .build()
        .unwrap();
    assert!(matches!(Gguf::parse(&b), Err(GgufError::WrongType { .. })));
}

#[test]
fn builder_refuses_wrong_tensor_sizes() {
    assert!(matches!(
        GgufBuilder::new()
            .tensor("t", GgmlType::Q8_0, &[32], vec![0; 33])
            .build(),
        Err(GgufError::LengthMismatch {
            expected_bytes: 34,
            ..
        })
    ));
}
