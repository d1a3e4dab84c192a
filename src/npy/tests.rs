//! Reading and writing `.npy` files: round trips, every header form, hostile headers and
//! sizes as typed errors.

use super::*;

#[test]
fn round_trip_every_writable_type_and_shape() {
    let shapes: [&[u64]; 5] = [&[], &[3], &[2, 3], &[1, 3, 0, 4], &[2, 1, 2]];
    for dtype in DTYPES {
        for dims in shapes {
            let n: u64 = dims.iter().product();
            let width = dtype.bits().unwrap() as usize / 8;
            let bytes: Vec<u8> = (0..n as usize * width)
                .map(|i| {
                    if dtype == TensorDType::Bool {
                        (i % 2) as u8
                    } else {
                        (i * 37 % 251) as u8
                    }
                })
                .map(|v| {
                    if matches!(
                        dtype,
                        TensorDType::F16 | TensorDType::F32 | TensorDType::F64
                    ) {
                        v & 0x3f
                    } else {
                        v
                    }
                })
                .collect();
            let t = HostTensor::from_bytes(dtype, dims.to_vec(), Bytes::from(bytes)).unwrap();
            let file = write_npy(&t).unwrap();
            let back = read_npy(&file).unwrap();
            assert_eq!(back, t, "{dtype} {dims:?}");
        }
    }
}

#[test]
fn fortran_order_becomes_c_order() {
    // A 2x3 f32 array [[0,1,2],[3,4,5]] stored column-major: 0 3 1 4 2 5.
    let header = "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }";
    let mut file = b"\x93NUMPY\x01\x00".to_vec();
    let pad = 64 - (10 + header.len() + 1) % 64;
    let text = format!("{header}{}\n", " ".repeat(pad));
    file.extend_from_slice(&(text.len() as u16).to_le_bytes());
    file.extend_from_slice(text.as_bytes());
    for v in [0f32, 3., 1., 4., 2., 5.] {
        file.extend_from_slice(&v.to_le_bytes());
    }
    let t = read_npy(&file).unwrap();
    assert_eq!(t.dims(), &[2, 3]);
    assert_eq!(t.to_f64_vec().unwrap(), vec![0., 1., 2., 3., 4., 5.]);
}

/// A file of format `version` with header text `header` (padded) and `data`.
fn file(version: u8, header: &str, data: &[u8]) -> Vec<u8> {
    let mut f = b"\x93NUMPY".to_vec();
    f.extend_from_slice(&[version, 0]);
    let text = format!("{header}\n");
    if version == 1 {
        f.extend_from_slice(&(text.len() as u16).to_le_bytes());
    } else {
        f.extend_from_slice(&(text.len() as u32).to_le_bytes());
    }
    f.extend_from_slice(text.as_bytes());
    f.extend_from_slice(data);
    f
}

#[test]
fn headers_in_every_form_numpy_and_others_write() {
    let one_two: Vec<u8> = [1i32, 2].iter().flat_map(|v| v.to_le_bytes()).collect();
    for (version, header) in [
        (
            1,
            "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }",
        ),
        (2, "{'descr': '<i4', 'fortran_order': False, 'shape': (2,)}"),
        (
            3,
            "  {\"shape\":(2L,),\"fortran_order\":False,\"descr\":\"<i4\"}   ",
        ),
        (1, "{'fortran_order':False,'shape':(2),'descr':'i4',}"),
        (
            1,
            "{'descr': '<i4', 'fortran_order': True, 'shape': (1, 2, 1), }",
        ),
    ] {
        let t = read_npy(&file(version, header, &one_two)).unwrap();
        assert_eq!(t.to_i64_vec().unwrap(), vec![1, 2], "{header}");
    }
    let big: Vec<u8> = [1i32, 2].iter().flat_map(|v| v.to_be_bytes()).collect();
    let t = read_npy(&file(
        1,
        "{'descr': '>i4', 'fortran_order': False, 'shape': (2,), }",
        &big,
    ))
    .unwrap();
    assert_eq!(t.to_i64_vec().unwrap(), vec![1, 2]);
    // Bytes after the data are ignored, as NumPy ignores them.
    let mut longer = one_two.clone();
    longer.extend_from_slice(&[9; 3]);
    let t = read_npy(&file(
        1,
        "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }",
        &longer,
    ))
    .unwrap();
    assert_eq!(t.dims(), &[2]);
}

#[test]
fn hostile_headers_are_typed_errors_that_quote_little() {
    let malformed = |header: &str| match read_npy(&file(1, header, &[0; 8])) {
        Err(NpyError::Malformed { reason }) => reason,
        other => panic!("{header:?}: {other:?}"),
    };
    for depth in [16, 64, 10_000] {
        let header = "{".repeat(depth);
        let reason = malformed(&header);
        assert!(reason.contains("expected a quoted key"), "{reason}");
        assert!(reason.chars().count() < 200, "{reason}");
    }
    for header in [
        "{'descr': '<f4', 'fortran_order': False}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}",
        "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': ()}",
        "{'descr': '<f4', 'fortran_order': 0, 'shape': ()}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': ((2,),)}",
        "{'descr': '<f\\x34', 'fortran_order': False, 'shape': ()}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': ()} x",
        "{'descr': '<f4' 'fortran_order': False, 'shape': ()}",
        "['descr', '<f4']",
        "",
    ] {
        malformed(header);
    }
    let long_key = format!("{{'{}': 1}}", "k".repeat(10_000));
    let reason = malformed(&long_key);
    assert!(
        reason.chars().count() < 200 && reason.ends_with("…`"),
        "{reason}"
    );
    let long_descr = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': ()}}",
        "x".repeat(10_000)
    );
    match read_npy(&file(1, &long_descr, &[])) {
        Err(NpyError::UnsupportedDType { descr }) => {
            assert_eq!(descr.chars().count(), QUOTE_CHARS + 1)
        }
        other => panic!("{other:?}"),
    }
    let structured = "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': ()}";
    assert!(matches!(
        read_npy(&file(1, structured, &[0; 4])),
        Err(NpyError::UnsupportedDType { .. })
    ));
}

#[test]
fn sizes_are_checked_before_anything_is_allocated() {
    let mut huge = b"\x93NUMPY\x02\x00".to_vec();
    huge.extend_from_slice(&0xFFFF_FFF0u32.to_le_bytes());
    huge.extend_from_slice(b"{}");
    assert!(matches!(
        read_npy(&huge),
        Err(NpyError::HeaderTooLong {
            header_bytes: 0xFFFF_FFF0,
            ..
        })
    ));
    let overflow =
        "{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296, 16), }";
    assert!(matches!(
        read_npy(&file(1, overflow, &[])),
        Err(NpyError::Tensor {
            cause: TensorError::Overflow { .. }
        })
    ));
    let short = "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000,), }";
    assert!(matches!(
        read_npy(&file(1, short, &[0; 16])),
        Err(NpyError::Truncated {
            expected_bytes: 4_000_000_000_000,
            actual_bytes: 16
        })
    ));
    let rank = |n: usize| {
        format!(
            "{{'descr': '<f4', 'fortran_order': True, 'shape': ({}), }}",
            "1, ".repeat(n)
        )
    };
    assert!(read_npy(&file(1, &rank(MAX_DIMS), &[0; 4])).is_ok());
    assert!(matches!(
        read_npy(&file(1, &rank(MAX_DIMS + 1), &[0; 4])),
        Err(NpyError::TooManyDims { max_dims: MAX_DIMS })
    ));
    assert!(matches!(
        read_npy(&file(4, "{}", &[])),
        Err(NpyError::UnsupportedVersion { major: 4, minor: 0 })
    ));
}

#[test]
fn bad_files_are_typed_errors() {
    assert!(matches!(
        read_npy(b"not numpy"),
        Err(NpyError::Malformed { .. })
    ));
    let t = HostTensor::from_f32(vec![4], &[1., 2., 3., 4.]).unwrap();
    let file = write_npy(&t).unwrap();
    for cut in [0, 5, 20, file.len() - 1] {
        assert!(read_npy(&file[..cut]).is_err(), "cut at {cut}");
    }
    let complex = "{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }";
    let mut f = b"\x93NUMPY\x01\x00".to_vec();
    let text = format!(
        "{complex}{}\n",
        " ".repeat(64 - (10 + complex.len() + 1) % 64)
    );
    f.extend_from_slice(&(text.len() as u16).to_le_bytes());
    f.extend_from_slice(text.as_bytes());
    f.extend_from_slice(&[0; 8]);
    assert!(matches!(
        read_npy(&f),
        Err(NpyError::UnsupportedDType { .. })
    ));
    let s = HostTensor::from_strings(vec![1], vec![Bytes::from_static(b"x")]).unwrap();
    assert!(matches!(
        write_npy(&s),
        Err(NpyError::UnwritableDType { .. })
    ));
}
