//! Converters of ONNX Runtime's contrib ops (domain `com.microsoft`): `MatMulNBits`, the
//! block-quantized matrix product that `onnxruntime.quantization`'s `MatMulNBitsQuantizer`
//! writes in place of a `MatMul` with a constant weight.
//!
//! `Y = A · dequant(B)ᵀ (+ bias)`: A f32 `[..., K]`; B uint8 `[N, k_blocks, blob]`, each of
//! the N output rows K weights in blocks of `block_size` (`k_blocks = ceil(K / block_size)`,
//! `blob = block_size * bits / 8`), two 4-bit codes a byte, the lower index in the low
//! nibble; `scales` `[N * k_blocks]` (or `[N, k_blocks]`) floats; `zero_points` either uint8
//! `[N * ceil(k_blocks / 2)]` packed two a byte the same way, or floats `[N * k_blocks]`,
//! 8 when absent; weight = `scale * (code - zero_point)`. The weight becomes one constant
//! `[N, K]` in dynrt's `q4_nb` format (24 bytes per 32 weights: the block's f32 scale and
//! zero point beside its 16 bytes of codes, in the file's order; a block of 64, 128, ...
//! repeats its scale in each of its 32-weight chunks), read by the `linear` kernels as it is
//! (never widened to f32); A's product with it is one `linear` node, the bias an `Add`.
//!
//! Refused with [`ImportError::Node`] before anything is allocated: `bits` other than 4, a
//! `block_size` that is not a power of two from 16 (the operator's rule) or not a multiple of
//! 32 (a `q4_nb` block), K not a multiple of 32, a `g_idx` input, weights, scales or zero
//! points that are not constants of the right type and element count. Every buffer made is
//! at most 1.5 times the size of the file's B.

use super::ctx::initializer_tensor;
use super::{Ctx, ImportError};
use crate::formats::push_q4_nb_block;
use crate::graph::ops::{BinaryOp, Constant, Linear, Op};
use crate::onnx::OnnxNode;
use crate::shape::{DType, Shape};
use crate::tensor::ConstData;
use bytes::Bytes;

/// Weights per `q4_nb` block.
const CHUNK: u64 = 32;

/// A constant input's element type, dims and bytes.
struct ConstInput {
    dtype: DType,
    dims: Vec<u64>,
    bytes: Bytes,
}

impl ConstInput {
    fn elements(&self) -> Option<u64> {
        self.dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d))
    }
}

/// Input `i` of `node` when it is a constant known at import time (an initializer or a
/// `Constant` value), without adding a node for it; `None` when the input is absent.
fn const_input(
    ctx: &Ctx<'_>,
    node: &OnnxNode,
    i: usize,
    what: &str,
) -> Result<Option<ConstInput>, ImportError> {
    let Some(name) = node.inputs.get(i).filter(|n| !n.is_empty()) else {
        return Ok(None);
    };
    if let Some(&id) = ctx.values.get(name.as_str()) {
        return match &ctx.nodes[id.index()].op {
            Op::Constant(c) => Ok(Some(ConstInput {
                dtype: c.dtype,
                dims: c.shape.dims().to_vec(),
                bytes: Bytes::copy_from_slice(c.data.bytes()),
            })),
            _ => Err(ctx.err(
                node,
                format!("{what} (input {i}, `{name}`) must be a constant (an initializer)"),
            )),
        };
    }
    let Some(init) = ctx.initializers.get(name.as_str()).copied() else {
        return Err(ctx.err(
            node,
            format!("input {i} (`{name}`) is not a value the importer knows"),
        ));
    };
    let (dtype, t) = initializer_tensor(init)?;
    let bytes = t.bytes().ok_or_else(|| ImportError::UnsupportedDType {
        value: init.name.clone(),
        dtype: init.dtype,
    })?;
    Ok(Some(ConstInput {
        dtype,
        dims: t.dims().to_vec(),
        bytes: bytes.clone(),
    }))
}

/// A required positive integer attribute.
fn positive_attr(ctx: &Ctx<'_>, node: &OnnxNode, name: &str) -> Result<u64, ImportError> {
    match ctx.attr_int(node, name, 0)? {
        v if v > 0 => Ok(v as u64),
        _ if node.attribute(name).is_none() => {
            Err(ctx.err(node, format!("attribute `{name}` is required")))
        }
        v => Err(ctx.err(node, format!("attribute `{name}` is {v}, not positive"))),
    }
}

/// The float values of a scales or float zero-point input of `count` elements.
fn floats(
    ctx: &Ctx<'_>,
    node: &OnnxNode,
    t: &ConstInput,
    what: &str,
    count: u64,
) -> Result<Vec<f32>, ImportError> {
    if !matches!(t.dtype, DType::F32 | DType::F16 | DType::BF16) {
        return Err(ctx.err(
            node,
            format!("{what} is {}, expected a float type", t.dtype),
        ));
    }
    if t.elements() != Some(count) {
        return Err(ctx.err(
            node,
            format!(
                "{what} has shape {:?}, expected {count} elements (N * k_blocks)",
                t.dims
            ),
        ));
    }
    crate::tensor::decode_f32(t.dtype, &t.bytes).map_err(|e| ctx.err(node, format!("{what}: {e}")))
}

/// `MatMulNBits` (bits 4): one `linear` on a `q4_nb` constant, plus an `Add` for the bias.
pub(super) fn matmul_nbits(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let k = positive_attr(ctx, node, "K")?;
    let n = positive_attr(ctx, node, "N")?;
    let bits = ctx.attr_int(node, "bits", 4)?;
    let block = positive_attr(ctx, node, "block_size")?;
    ctx.attr_int(node, "accuracy_level", 0)?;
    if bits != 4 {
        return Err(ctx.err(node, format!("bits {bits}: dynrt maps 4-bit weights only")));
    }
    if !block.is_power_of_two() || block < 16 {
        return Err(ctx.err(
            node,
            format!("block_size {block} is not a power of two from 16"),
        ));
    }
    if block % CHUNK != 0 || k % CHUNK != 0 {
        return Err(ctx.err(
            node,
            format!(
                "block_size {block} and K {k} must be multiples of {CHUNK} (dynrt's q4_nb blocks)"
            ),
        ));
    }
    if node.inputs.get(4).is_some_and(|g| !g.is_empty()) {
        return Err(ctx.err(node, "g_idx (input 4) is not supported"));
    }
    let k_blocks = k.div_ceil(block);
    let blob = block / 2;
    let rows_blocks = n
        .checked_mul(k_blocks)
        .ok_or_else(|| ctx.err(node, format!("N {n} x {k_blocks} blocks overflows")))?;
    let b =
        const_input(ctx, node, 1, "B")?.ok_or_else(|| ctx.err(node, "input 1 (B) is required"))?;
    if b.dtype != DType::U8 || b.elements() != rows_blocks.checked_mul(blob) {
        return Err(ctx.err(
            node,
            format!(
                "B is {} {:?}, expected u8 [N, k_blocks, blob] = [{n}, {k_blocks}, {blob}]",
                b.dtype, b.dims
            ),
        ));
    }
    let scales = const_input(ctx, node, 2, "scales")?
        .ok_or_else(|| ctx.err(node, "input 2 (scales) is required"))?;
    let scales = floats(ctx, node, &scales, "scales", rows_blocks)?;
    let zp_row = k_blocks.div_ceil(2);
    let zero_points: Vec<f32> = match const_input(ctx, node, 3, "zero_points")? {
        None => vec![8.0; rows_blocks as usize],
        Some(z) if z.dtype == DType::U8 => {
            if z.elements() != Some(n * zp_row) {
                return Err(ctx.err(
                    node,
                    format!(
                        "zero_points is u8 {:?}, expected {} bytes (N * ceil(k_blocks / 2))",
                        z.dims,
                        n * zp_row
                    ),
                ));
            }
            (0..rows_blocks)
                .map(|i| {
                    let (row, blk) = (i / k_blocks, i % k_blocks);
                    let byte = z.bytes[(row * zp_row + blk / 2) as usize];
                    f32::from((byte >> (4 * (blk % 2))) & 15)
                })
                .collect()
        }
        Some(z) => floats(ctx, node, &z, "zero_points", rows_blocks)?,
    };
    let chunks_per_row = k / CHUNK;
    let chunks_per_block = block / CHUNK;
    let mut w = Vec::with_capacity((n * chunks_per_row * 24) as usize);
    for row in 0..n {
        for c in 0..chunks_per_row {
            let blk = row * k_blocks + c / chunks_per_block;
            let at = (blk * blob + (c % chunks_per_block) * 16) as usize;
            let nibbles: &[u8; 16] = b.bytes[at..at + 16]
                .try_into()
                .map_err(|_| ctx.err(node, "B is shorter than its shape"))?;
            push_q4_nb_block(
                scales[blk as usize],
                zero_points[blk as usize],
                nibbles,
                &mut w,
            );
        }
    }
    let weight = Constant {
        shape: Shape::new(vec![n, k]),
        dtype: DType::Q4_NB,
        data: ConstData::from_vec(w),
    };
    let a = ctx.input(node, 0)?;
    let w = ctx.helper(node, "weight", weight, &[])?;
    match ctx.optional_input(node, 5)? {
        None => {
            ctx.emit(node, Linear, &[a, w])?;
        }
        Some(bias) => {
            let y = ctx.helper(node, "linear", Linear, &[a, w])?;
            ctx.emit(node, BinaryOp::Add, &[y, bias])?;
        }
    }
    Ok(())
}
