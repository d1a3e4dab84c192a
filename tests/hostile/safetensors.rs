//! safetensors files built to mislead the reader: header lengths past the file or in the
//! exabytes, JSON that is no object, unknown and unsupported dtypes, shapes whose byte size
//! overflows, offsets outside the file or not matching the shape, overlapping tensors.
//! Each must be a typed error naming what is wrong, at once and without allocating what the
//! file promises.

use dynrt::safetensors::{write, SafeTensors, SafetensorsError, MAX_HEADER_BYTES};

/// A file whose header is `header` (no check of its JSON) followed by `data`.
fn file(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

fn err(bytes: &[u8]) -> SafetensorsError {
    match SafeTensors::parse(bytes) {
        Ok(st) => panic!("parsed {} tensors from a hostile file", st.len()),
        Err(e) => e,
    }
}

#[test]
fn header_lengths_past_the_file_or_the_bound_are_refused_before_reading() {
    assert!(matches!(err(&[1, 2, 3]), SafetensorsError::TooShort { .. }));
    for len in [u64::MAX, u64::MAX - 7, MAX_HEADER_BYTES + 1, 1 << 40, 9] {
        let mut bytes = len.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"{}");
        let e = err(&bytes);
        assert!(
            matches!(e, SafetensorsError::HeaderLength { header_bytes, .. } if header_bytes == len),
            "{len}: {e}"
        );
    }
}

#[test]
fn headers_that_are_not_json_objects_are_refused() {
    for header in [
        "",
        "[]",
        "\"x\"",
        "{",
        "{\"a\":",
        "\u{0}",
        "{\"__metadata__\":[]}",
    ] {
        let e = err(&file(header, &[]));
        assert!(
            matches!(e, SafetensorsError::Header { .. }),
            "{header:?}: {e}"
        );
    }
    let mut bytes = file("xx", &[]);
    bytes[8] = 0xff;
    assert!(matches!(err(&bytes), SafetensorsError::Header { .. }));
    // Nesting deeper than the JSON parser's recursion limit is an error, not a stack overflow.
    let deep = format!("{{\"a\":{}{}}}", "[".repeat(100_000), "]".repeat(100_000));
    assert!(matches!(
        err(&file(&deep, &[])),
        SafetensorsError::Header { .. }
    ));
}

#[test]
fn entries_without_their_fields_are_named() {
    for (header, what) in [
        (r#"{"w":1}"#, "not a JSON object"),
        (r#"{"w":{"shape":[1],"data_offsets":[0,4]}}"#, "dtype"),
        (r#"{"w":{"dtype":"F32","data_offsets":[0,4]}}"#, "shape"),
        (
            r#"{"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#,
            "dimension",
        ),
        (
            r#"{"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}}"#,
            "dimension",
        ),
        (r#"{"w":{"dtype":"F32","shape":[1]}}"#, "data_offsets"),
        (
            r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}}"#,
            "data_offsets",
        ),
        (
            r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}}"#,
            "offset",
        ),
        (
            r#"{"w":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}}"#,
            "dimensions",
        ),
    ] {
        let e = err(&file(header, &[0; 4]));
        let msg = e.to_string();
        assert!(
            matches!(e, SafetensorsError::Entry { ref name, .. } if name == "w")
                && msg.contains(what),
            "{header}: {msg}"
        );
    }
}

#[test]
fn dtypes_are_known_by_name() {
    let e = err(&file(
        r#"{"w":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}}"#,
        &[0; 4],
    ));
    assert!(
        matches!(e, SafetensorsError::UnknownDType { ref dtype, .. } if dtype == "F33"),
        "{e}"
    );
    let e = err(&file(
        r#"{"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}}"#,
        &[0; 8],
    ));
    assert!(
        matches!(e, SafetensorsError::UnsupportedDType { ref dtype, .. } if dtype == "F64"),
        "{e}"
    );
}

#[test]
fn sizes_that_overflow_or_lie_are_refused_before_allocation() {
    // 2^62 x 2^62 f32 elements: the byte size overflows u64.
    let e = err(&file(
        r#"{"w":{"dtype":"F32","shape":[4611686018427387904,4611686018427387904],"data_offsets":[0,4]}}"#,
        &[0; 4],
    ));
    assert!(matches!(e, SafetensorsError::Shape { .. }), "{e}");
    for (offsets, data) in [
        ("[0,8]", 4usize),                                  // past the file
        ("[4,0]", 8),                                       // reversed
        ("[0,4]", 8),                                       // fewer bytes than the shape
        ("[0,12]", 12),                                     // more bytes than the shape
        ("[18446744073709551608,18446744073709551615]", 8), // far past the file
    ] {
        let header = format!(r#"{{"w":{{"dtype":"F32","shape":[2],"data_offsets":{offsets}}}}}"#);
        let e = err(&file(&header, &vec![0; data]));
        assert!(
            matches!(e, SafetensorsError::Offsets { .. }),
            "{offsets}: {e}"
        );
    }
    // A terabyte tensor announced in a tiny file.
    let e = err(&file(
        r#"{"w":{"dtype":"U8","shape":[1099511627776],"data_offsets":[0,1099511627776]}}"#,
        &[0; 16],
    ));
    assert!(matches!(e, SafetensorsError::Offsets { .. }), "{e}");
}

#[test]
fn overlapping_tensors_are_refused() {
    let e = err(&file(
        r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
        &[0; 12],
    ));
    assert!(matches!(e, SafetensorsError::Overlap { .. }), "{e}");
    // The same bytes twice.
    let e = err(&file(
        r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}}"#,
        &[0; 4],
    ));
    assert!(matches!(e, SafetensorsError::Overlap { .. }), "{e}");
    // Adjacent tensors are fine.
    let ok = write(&[("a", "F32", &[1], &[0; 4]), ("b", "F32", &[1], &[0; 4])]);
    assert_eq!(SafeTensors::parse(&ok).unwrap().len(), 2);
}

#[test]
fn every_truncation_of_a_valid_file_is_an_error() {
    let ok = write(&[("a", "F32", &[2, 2], &[0; 16]), ("b", "I64", &[1], &[0; 8])]);
    assert!(SafeTensors::parse(&ok).is_ok());
    for cut in 0..ok.len() {
        assert!(SafeTensors::parse(&ok[..cut]).is_err(), "cut at {cut}");
    }
}
