//! Hostile `MatMulNBits` nodes (ONNX Runtime's 4-bit weights, `com.microsoft`): attributes
//! and constants that contradict each other, sizes built to overflow or to make the importer
//! allocate what the file does not hold, inputs the operator allows and dynrt does not map.
//! Each is an [`ImportError`] naming the node and what is wrong, before anything is allocated
//! (an N or K of 2^40 against a B of 512 bytes is refused by the element count check: were
//! it allocated first, the test would abort on a capacity overflow or run out of memory).

use crate::onnx::models::{self, NBits, FLOAT, INT64, UINT8};
use bytes::Bytes;
use dynrt::graph::Op;
use dynrt::onnx::external::NoExternalData;
use dynrt::onnx::{import, ImportError, LoadOptions, OnnxFile};
use dynrt::shape::DType;

fn load(m: &NBits) -> OnnxFile {
    OnnxFile::from_bytes(
        Bytes::from(models::matmul_nbits(m)),
        &NoExternalData,
        &LoadOptions::default(),
    )
    .expect("the generated model loads")
}

/// The import of `m` fails with a node error on `mnb` whose reason contains `why`.
fn refused(m: &NBits, why: &str) {
    let err = import(&load(m)).expect_err(why);
    assert!(
        matches!(&err, ImportError::Node { node, op_type, reason }
            if node == "mnb" && op_type == "MatMulNBits" && reason.contains(why)),
        "expected `{why}`: {err:?}"
    );
}

#[test]
fn a_well_formed_node_becomes_one_compact_linear() {
    let g = import(&load(&NBits::valid())).unwrap().graph;
    let w: Vec<_> = g
        .order()
        .iter()
        .filter_map(|&id| match &g.node(id).op {
            Op::Constant(c) if c.dtype == DType::Q4_NB => Some(c.data.bytes().len()),
            _ => None,
        })
        .collect();
    // 8 rows x 2 blocks of 24 bytes.
    assert_eq!(w, vec![8 * 2 * 24]);
    assert!(g
        .order()
        .iter()
        .any(|&id| matches!(g.node(id).op, Op::Linear(_))));
}

#[test]
fn attributes_dynrt_does_not_map_are_refused() {
    refused(
        &NBits {
            bits: 8,
            ..NBits::valid()
        },
        "bits 8",
    );
    refused(
        &NBits {
            bits: 2,
            ..NBits::valid()
        },
        "bits 2",
    );
    refused(
        &NBits {
            block_size: 48,
            ..NBits::valid()
        },
        "block_size 48 is not a power of two",
    );
    refused(
        &NBits {
            block_size: 8,
            ..NBits::valid()
        },
        "block_size 8 is not a power of two from 16",
    );
    refused(
        &NBits {
            block_size: 16,
            b: (UINT8, vec![8, 4, 8]),
            scales: 32,
            ..NBits::valid()
        },
        "must be multiples of 32",
    );
    refused(
        &NBits {
            block_size: 0,
            ..NBits::valid()
        },
        "`block_size` is 0",
    );
    refused(
        &NBits {
            k: -64,
            ..NBits::valid()
        },
        "`K` is -64",
    );
    refused(
        &NBits {
            k: 48,
            x_k: 48,
            ..NBits::valid()
        },
        "K 48 must be multiples of 32",
    );
    refused(
        &NBits {
            g_idx: true,
            ..NBits::valid()
        },
        "g_idx",
    );
}

#[test]
fn sizes_that_contradict_the_constants_are_refused_before_allocating() {
    // N and K of 2^40 with a B of 512 bytes: the element count check, not an allocation.
    refused(
        &NBits {
            n: 1 << 40,
            ..NBits::valid()
        },
        "expected u8 [N, k_blocks, blob]",
    );
    refused(
        &NBits {
            n: 1 << 40,
            k: 1 << 40,
            ..NBits::valid()
        },
        "overflows",
    );
    refused(
        &NBits {
            k: 1 << 40,
            x_k: 1 << 40,
            ..NBits::valid()
        },
        "expected u8 [N, k_blocks, blob]",
    );
    refused(
        &NBits {
            b: (UINT8, vec![8, 2, 15]),
            ..NBits::valid()
        },
        "B is u8",
    );
    refused(
        &NBits {
            b: (FLOAT, vec![8, 2, 16]),
            ..NBits::valid()
        },
        "B is f32",
    );
    refused(
        &NBits {
            scales: 15,
            ..NBits::valid()
        },
        "scales has shape [15]",
    );
    refused(
        &NBits {
            zero_points: Some((UINT8, 9)),
            ..NBits::valid()
        },
        "zero_points is u8 [9]",
    );
    refused(
        &NBits {
            zero_points: Some((INT64, 16)),
            ..NBits::valid()
        },
        "zero_points is i64, expected a float type",
    );
    refused(
        &NBits {
            b_fed: true,
            ..NBits::valid()
        },
        "must be a constant",
    );
}

#[test]
fn an_x_of_another_k_is_a_shape_error_naming_the_node() {
    let err = import(&load(&NBits {
        x_k: 96,
        ..NBits::valid()
    }))
    .unwrap_err();
    assert!(
        matches!(&err, ImportError::Infer { node, .. } if node == "mnb"),
        "{err:?}"
    );
}
