//! Converters of the comparisons, boolean logic, `Where` and `Cast`.

use super::{dtype_of, Ctx, ImportError};
use crate::graph::ops::{Cast, CompareOp, LogicOp, Not, Where};
use crate::onnx::{OnnxNode, TensorDType};
use crate::shape::DType;

/// `Equal`, `Less`, `LessOrEqual`, `Greater`, `GreaterOrEqual` (bool results).
pub(super) fn compare(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let op = match node.op_type.as_str() {
        "Equal" => CompareOp::Equal,
        "Less" => CompareOp::Less,
        "LessOrEqual" => CompareOp::LessOrEqual,
        "Greater" => CompareOp::Greater,
        "GreaterOrEqual" => CompareOp::GreaterOrEqual,
        other => return Err(ctx.err(node, format!("not a comparison: {other}"))),
    };
    let a = ctx.input(node, 0)?;
    let b = ctx.input(node, 1)?;
    ctx.emit(node, op, &[a, b])?;
    Ok(())
}

/// `And`, `Or`, `Xor` on bools.
pub(super) fn logic(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let op = match node.op_type.as_str() {
        "And" => LogicOp::And,
        "Or" => LogicOp::Or,
        "Xor" => LogicOp::Xor,
        other => return Err(ctx.err(node, format!("not a logic op: {other}"))),
    };
    let a = ctx.input(node, 0)?;
    let b = ctx.input(node, 1)?;
    ctx.emit(node, op, &[a, b])?;
    Ok(())
}

/// `Not` on bools.
pub(super) fn not(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let x = ctx.input(node, 0)?;
    ctx.emit(node, Not, &[x])?;
    Ok(())
}

/// `Where(cond, a, b)`.
pub(super) fn where_(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let c = ctx.input(node, 0)?;
    let a = ctx.input(node, 1)?;
    let b = ctx.input(node, 2)?;
    ctx.emit(node, Where, &[c, a, b])?;
    Ok(())
}

/// The dynrt type of an ONNX type code, or the error naming the node's output.
fn target(ctx: &Ctx<'_>, node: &OnnxNode, code: i64) -> Result<DType, ImportError> {
    let t = i32::try_from(code)
        .ok()
        .and_then(|c| TensorDType::from_onnx(c).ok())
        .ok_or_else(|| ctx.err(node, format!("`to` = {code} is not an ONNX element type")))?;
    dtype_of(t).ok_or_else(|| ImportError::UnsupportedDType {
        value: node
            .outputs
            .first()
            .cloned()
            .unwrap_or_else(|| node.label()),
        dtype: t,
    })
}

/// `x` as `to`: the same node when it already is.
fn cast_to(
    ctx: &mut Ctx<'_>,
    node: &OnnxNode,
    x: crate::graph::NodeId,
    to: DType,
) -> Result<(), ImportError> {
    if ctx.dtype(x) == to {
        ctx.bind(node, 0, x)
    } else {
        ctx.emit(node, Cast { to }, &[x]).map(|_| ())
    }
}

/// `Cast` (`to` an element type code since opset 6).
pub(super) fn cast(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let code = match node.attribute("to") {
        Some(_) => ctx.attr_int(node, "to", 0)?,
        None => return Err(ctx.err(node, "attribute `to` is required")),
    };
    let to = target(ctx, node, code)?;
    let x = ctx.input(node, 0)?;
    cast_to(ctx, node, x, to)
}

/// `CastLike(x, like)`: `x` as `like`'s element type.
pub(super) fn cast_like(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let x = ctx.input(node, 0)?;
    let like = ctx.input(node, 1)?;
    let to = ctx.dtype(like);
    cast_to(ctx, node, x, to)
}
