//! Converters of the arithmetic elementwise ops: `Add`, `Sub`, `Mul`, `Div`, `Pow`, `Min`,
//! `Max`, `Sum`, `Mean` (n-ary), `Clip`, and the unary activations and roundings.

use super::{Ctx, ImportError};
use crate::graph::ops::{BinaryOp, Cast, Identity, Op, UnaryOp};
use crate::graph::NodeId;
use crate::onnx::OnnxNode;
use crate::shape::DType;

/// The op of a graph output that needs a buffer of its own.
pub(super) fn identity_op() -> Op {
    Op::Identity(Identity)
}

/// `Add`, `Sub`, `Mul`, `Div`, `Pow` (NumPy broadcasting since opset 7). `Pow` may take an
/// exponent of another type than its base (ONNX's T and T1): the exponent is cast to the
/// base's type when the base is f32; an integer base with a float exponent computes in f32
/// and casts back (truncating, as the ONNX reference does).
pub(super) fn binary(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let op = match node.op_type.as_str() {
        "Add" => BinaryOp::Add,
        "Sub" => BinaryOp::Sub,
        "Mul" => BinaryOp::Mul,
        "Div" => BinaryOp::Div,
        "Pow" => BinaryOp::Pow,
        other => return Err(ctx.err(node, format!("not a binary op: {other}"))),
    };
    let a = ctx.input(node, 0)?;
    let b = ctx.input(node, 1)?;
    let (ta, tb) = (ctx.dtype(a), ctx.dtype(b));
    if op != BinaryOp::Pow || ta == tb {
        ctx.emit(node, op, &[a, b])?;
        return Ok(());
    }
    if ta == DType::F32 {
        let b32 = ctx.helper(node, "exponent", Cast { to: DType::F32 }, &[b])?;
        ctx.emit(node, op, &[a, b32])?;
    } else {
        let a32 = ctx.helper(node, "base", Cast { to: DType::F32 }, &[a])?;
        let b32 = if tb == DType::F32 {
            b
        } else {
            ctx.helper(node, "exponent", Cast { to: DType::F32 }, &[b])?
        };
        let p = ctx.helper(node, "pow", op, &[a32, b32])?;
        ctx.emit(node, Cast { to: ta }, &[p])?;
    }
    Ok(())
}

/// The unary activations: one op each.
pub(super) fn unary(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let op = match node.op_type.as_str() {
        "Relu" => UnaryOp::Relu,
        "Exp" => UnaryOp::Exp,
        "Sqrt" => UnaryOp::Sqrt,
        "Reciprocal" => UnaryOp::Reciprocal,
        "Neg" => UnaryOp::Neg,
        "Log" => UnaryOp::Log,
        "Tanh" => UnaryOp::Tanh,
        "Erf" => UnaryOp::Erf,
        "Sigmoid" => UnaryOp::Sigmoid,
        "Abs" => UnaryOp::Abs,
        "Floor" => UnaryOp::Floor,
        "Ceil" => UnaryOp::Ceil,
        "Round" => UnaryOp::Round,
        "Sin" => UnaryOp::Sin,
        "Cos" => UnaryOp::Cos,
        "Sign" => UnaryOp::Sign,
        other => return Err(ctx.err(node, format!("not a unary op: {other}"))),
    };
    let x = ctx.input(node, 0)?;
    ctx.emit(node, op, &[x])?;
    Ok(())
}

/// `Gelu` (opset 20): `approximate` `none` (exact, erf) or `tanh`.
pub(super) fn gelu(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let op = match ctx.attr_string(node, "approximate", "none")?.as_str() {
        "none" => UnaryOp::GeluErf,
        "tanh" => UnaryOp::Gelu,
        other => {
            return Err(ctx.err(
                node,
                format!("approximate must be `none` or `tanh`, is `{other}`"),
            ))
        }
    };
    let x = ctx.input(node, 0)?;
    ctx.emit(node, op, &[x])?;
    Ok(())
}

/// `Min`, `Max`, `Sum`, `Mean`: n-ary with broadcasting, a balanced tree of binary ops (one
/// input: itself); `Mean` divides the sum by the input count.
pub(super) fn variadic(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let xs = ctx.inputs(node)?;
    match node.op_type.as_str() {
        "Min" => fold(ctx, node, BinaryOp::Min, &xs),
        "Max" => fold(ctx, node, BinaryOp::Max, &xs),
        "Sum" => fold(ctx, node, BinaryOp::Add, &xs),
        "Mean" => {
            let first = *xs.first().ok_or_else(|| ctx.err(node, "needs an input"))?;
            let sum = tree(ctx, node, BinaryOp::Add, &xs, &mut 0)?;
            let n = ctx.constant_scalar(node, "count", ctx.dtype(first), xs.len() as f64)?;
            ctx.emit(node, BinaryOp::Div, &[sum, n])?;
            Ok(())
        }
        other => Err(ctx.err(node, format!("not a variadic op: {other}"))),
    }
}

/// `op` over `xs` as a balanced tree, the root labelled with the output.
fn fold(
    ctx: &mut Ctx<'_>,
    node: &OnnxNode,
    op: BinaryOp,
    xs: &[NodeId],
) -> Result<(), ImportError> {
    match xs {
        [] => Err(ctx.err(node, "needs at least one input")),
        [x] => ctx.bind(node, 0, *x),
        _ => {
            let mid = xs.len().div_ceil(2);
            let mut k = 0;
            let left = tree(ctx, node, op, &xs[..mid], &mut k)?;
            let right = tree(ctx, node, op, &xs[mid..], &mut k)?;
            ctx.emit(node, op, &[left, right])?;
            Ok(())
        }
    }
}

/// `op` over `xs` (not empty) as a balanced tree of helper nodes `<op>0`, `<op>1`, ...
/// (counted by `k`), returning its root. A chain of `n - 1` ops was `n` nodes deep; the tree
/// is `ceil(log2 n)`. The nodes are added in post-order, so the processing order (by node
/// id among the ready nodes) finishes each subtree before it starts the next, and only
/// `O(log n)` partial results are live at a time. Float sums round differently from the
/// chain's (pairwise summation, the more accurate order); min and max are the same.
fn tree(
    ctx: &mut Ctx<'_>,
    node: &OnnxNode,
    op: BinaryOp,
    xs: &[NodeId],
    k: &mut usize,
) -> Result<NodeId, ImportError> {
    match xs {
        [] => Err(ctx.err(node, "needs at least one input")),
        [x] => Ok(*x),
        _ => {
            let mid = xs.len().div_ceil(2);
            let left = tree(ctx, node, op, &xs[..mid], k)?;
            let right = tree(ctx, node, op, &xs[mid..], k)?;
            let id = ctx.helper(node, &format!("{}{k}", op.name()), op, &[left, right])?;
            *k += 1;
            Ok(id)
        }
    }
}

/// `Clip`: `min(max(x, lo), hi)` (NumPy's order, so `lo > hi` gives `hi`). Bounds are
/// attributes before opset 11, optional inputs since; an absent bound is no bound.
pub(super) fn clip(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let x = ctx.input(node, 0)?;
    let dtype = ctx.dtype(x);
    let (lo, hi) = if ctx.version() < 11 {
        let lo = match node.attribute("min") {
            Some(_) => Some(ctx.attr_float(node, "min", f32::MIN)?),
            None => None,
        };
        let hi = match node.attribute("max") {
            Some(_) => Some(ctx.attr_float(node, "max", f32::MAX)?),
            None => None,
        };
        let lo = match lo {
            Some(v) => Some(ctx.constant_scalar(node, "min", dtype, f64::from(v))?),
            None => None,
        };
        let hi = match hi {
            Some(v) => Some(ctx.constant_scalar(node, "max", dtype, f64::from(v))?),
            None => None,
        };
        (lo, hi)
    } else {
        (ctx.optional_input(node, 1)?, ctx.optional_input(node, 2)?)
    };
    match (lo, hi) {
        (None, None) => {
            ctx.bind(node, 0, x)?;
        }
        (Some(lo), None) => {
            ctx.emit(node, BinaryOp::Max, &[x, lo])?;
        }
        (None, Some(hi)) => {
            ctx.emit(node, BinaryOp::Min, &[x, hi])?;
        }
        (Some(lo), Some(hi)) => {
            let m = ctx.helper(node, "max", BinaryOp::Max, &[x, lo])?;
            ctx.emit(node, BinaryOp::Min, &[m, hi])?;
        }
    }
    Ok(())
}
