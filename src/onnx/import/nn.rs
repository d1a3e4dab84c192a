//! Converters of the network ops dynrt had before the importer: `MatMul` (operands of rank 2
//! and more), `Softmax` and `LayerNormalization` over the last axis. The issue-13 work on
//! these ops (any axis, 1-D matmul operands, Gemm, ...) extends or replaces these lines.

use super::{Ctx, ImportError};
use crate::graph::ops::{LayerNorm, MatMul, Softmax};
use crate::onnx::OnnxNode;
use crate::shape::{DType, Shape};

/// `MatMul` with both operands of rank 2 or more (batch dimensions broadcast).
pub(super) fn matmul(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let a = ctx.input(node, 0)?;
    let b = ctx.input(node, 1)?;
    for x in [a, b] {
        if ctx.need_rank(node, x)? < 2 {
            return Err(ctx.err(node, "1-D operands are not mapped"));
        }
    }
    ctx.emit(node, MatMul { transpose_b: false }, &[a, b])?;
    Ok(())
}

/// `Softmax` over the last axis (opset 13 semantics; before 13 the op flattened from `axis`,
/// which is the same when `axis` is the last one).
pub(super) fn softmax(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let x = ctx.input(node, 0)?;
    let default = if ctx.version() < 13 { 1 } else { -1 };
    let axis = ctx.attr_int(node, "axis", default)?;
    let rank = ctx.need_rank(node, x)?;
    if ctx.axis(node, axis, rank)? + 1 != rank {
        return Err(ctx.err(node, format!("only the last axis is mapped, not {axis}")));
    }
    ctx.emit(node, Softmax, &[x])?;
    Ok(())
}

/// `LayerNormalization` over the last axis, with `Scale` and an optional `B` (zeros when
/// absent); the optional `Mean` and `InvStdDev` outputs are not mapped.
pub(super) fn layer_norm(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let x = ctx.input(node, 0)?;
    let scale = ctx.input(node, 1)?;
    let rank = ctx.need_rank(node, x)?;
    let axis = ctx.attr_int(node, "axis", -1)?;
    if ctx.axis(node, axis, rank)? + 1 != rank {
        return Err(ctx.err(node, format!("only the last axis is mapped, not {axis}")));
    }
    if node.outputs.iter().skip(1).any(|o| !o.is_empty()) {
        return Err(ctx.err(node, "the Mean and InvStdDev outputs are not mapped"));
    }
    let eps = ctx.attr_float(node, "epsilon", 1e-5)?;
    let bias = match ctx.optional_input(node, 2)? {
        Some(b) => b,
        None => {
            let d = ctx
                .dims(x)
                .and_then(|d| d.last().copied().flatten())
                .ok_or_else(|| ctx.err(node, "no B and a last axis of unknown extent"))?;
            let zeros = crate::graph::ops::Constant {
                shape: Shape::new(vec![d]),
                dtype: DType::F32,
                data: crate::tensor::ConstData::from_f32(&vec![0.0; d as usize]),
            };
            ctx.add(node, "zero_bias", zeros, &[])?
        }
    };
    ctx.emit(node, LayerNorm { eps }, &[x, scale, bias])?;
    Ok(())
}
