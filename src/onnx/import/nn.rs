//! Converters of the network ops: `MatMul` (any ranks, 1-D operands), `Gemm`, `Softmax` and
//! `LogSoftmax` (any axis; before opset 13 over the flattened trailing dimensions),
//! `LayerNormalization` (any axis, optional bias, the `Mean` / `InvStdDev` outputs),
//! `RMSNormalization`, `ReduceSum` / `ReduceMean` / `ReduceMax` / `ReduceMin` (axes as an
//! attribute or a constant input, `keepdims`, `noop_with_empty_axes`), `CumSum`, `Trilu`.

use super::{Ctx, ImportError};
use crate::graph::ops::{
    CumSum, Flatten, Gemm, LayerNorm, MatMul, Reduce, ReduceAxes, ReduceKind, ReshapeTo, RmsNorm,
    ShapeOf, Softmax, Trilu,
};
use crate::onnx::OnnxNode;
use crate::shape::DType;

/// `MatMul` with NumPy rules: batch dimensions broadcast, 1-D operands are vectors.
pub(super) fn matmul(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let a = ctx.input(node, 0)?;
    let b = ctx.input(node, 1)?;
    ctx.emit(node, MatMul { transpose_b: false }, &[a, b])?;
    Ok(())
}

/// `Gemm` (`alpha`, `beta`, `transA`, `transB`, optional `C` broadcast to `[M, N]`).
pub(super) fn gemm(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let ins = ctx.inputs(node)?;
    let op = Gemm {
        alpha: ctx.attr_float(node, "alpha", 1.0)?,
        beta: ctx.attr_float(node, "beta", 1.0)?,
        trans_a: ctx.attr_int(node, "transA", 0)? != 0,
        trans_b: ctx.attr_int(node, "transB", 0)? != 0,
    };
    ctx.emit(node, op, &ins)?;
    Ok(())
}

/// `Softmax` / `LogSoftmax`. From opset 13 along `axis` (default -1); before, over the
/// dimensions from `axis` (default 1) flattened into one: flatten, softmax along the last
/// axis, reshape back to x's shape.
fn softmax_of(ctx: &mut Ctx<'_>, node: &OnnxNode, log: bool) -> Result<(), ImportError> {
    let x = ctx.input(node, 0)?;
    if ctx.version() >= 13 {
        let axis = ctx.attr_int(node, "axis", -1)?;
        ctx.emit(node, Softmax { axis, log }, &[x])?;
        return Ok(());
    }
    let axis = ctx.attr_int(node, "axis", 1)?;
    let flat = ctx.helper(node, "flat", Flatten { axis }, &[x])?;
    let sm = ctx.helper(node, "flat_softmax", Softmax { axis: -1, log }, &[flat])?;
    let shape = ctx.helper(
        node,
        "shape",
        ShapeOf {
            dtype: DType::I64,
            ..ShapeOf::default()
        },
        &[x],
    )?;
    ctx.emit(node, ReshapeTo::default(), &[sm, shape])?;
    Ok(())
}

/// `Softmax`.
pub(super) fn softmax(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    softmax_of(ctx, node, false)
}

/// `LogSoftmax`.
pub(super) fn log_softmax(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    softmax_of(ctx, node, true)
}

/// Whether output `k` of `node` is asked for.
fn wants_output(node: &OnnxNode, k: usize) -> bool {
    node.outputs.get(k).is_some_and(|o| !o.is_empty())
}

/// `LayerNormalization` over the dimensions from `axis` (default -1) with `Scale` and an
/// optional `B`; the optional `Mean` and `InvStdDev` outputs (reduced dimensions kept as 1)
/// are reductions of x beside it.
pub(super) fn layer_norm(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let x = ctx.input(node, 0)?;
    let scale = ctx.input(node, 1)?;
    let axis = ctx.attr_int(node, "axis", -1)?;
    let eps = ctx.attr_float(node, "epsilon", 1e-5)?;
    let mut ins = vec![x, scale];
    ins.extend(ctx.optional_input(node, 2)?);
    ctx.emit(node, LayerNorm { eps, axis }, &ins)?;
    let stats = [(1, ReduceKind::Mean), (2, ReduceKind::InvStdDev { eps })];
    for (k, kind) in stats {
        if wants_output(node, k) {
            let op = Reduce {
                kind,
                axes: ReduceAxes::From(axis),
                keepdims: true,
            };
            ctx.emit_output(node, k, op, &[x])?;
        }
    }
    Ok(())
}

/// `RMSNormalization` (opset 23) over the dimensions from `axis` (default -1) with `scale`.
pub(super) fn rms_norm(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let x = ctx.input(node, 0)?;
    let scale = ctx.input(node, 1)?;
    let axis = ctx.attr_int(node, "axis", -1)?;
    let eps = ctx.attr_float(node, "epsilon", 1e-5)?;
    ctx.emit(node, RmsNorm { eps, axis }, &[x, scale])?;
    Ok(())
}

/// The reductions: axes from the attribute (`ReduceSum` before 13, the others before 18) or
/// from the second input (a constant, or a tensor known at run time: the kernel reads it);
/// none given reduces every axis, unless `noop_with_empty_axes`, which makes the node an
/// identity.
fn reduce(ctx: &mut Ctx<'_>, node: &OnnxNode, kind: ReduceKind) -> Result<(), ImportError> {
    let x = ctx.input(node, 0)?;
    let input_axes = match node.op_type.as_str() {
        "ReduceSum" => ctx.version() >= 13,
        _ => ctx.version() >= 18,
    };
    let keepdims = ctx.attr_int(node, "keepdims", 1)? != 0;
    let noop = ctx.attr_int(node, "noop_with_empty_axes", 0)? != 0;
    let axes = if input_axes {
        match ctx.optional_input(node, 1)? {
            None => None,
            Some(id) => match ctx.const_ints(id) {
                Some(v) => Some(v.to_vec()),
                None => {
                    let op = Reduce {
                        kind,
                        axes: ReduceAxes::Input {
                            noop_with_empty_axes: noop,
                        },
                        keepdims,
                    };
                    ctx.emit(node, op, &[x, id])?;
                    return Ok(());
                }
            },
        }
    } else {
        ctx.attr_ints(node, "axes")?
    };
    let axes = match axes {
        Some(a) if !a.is_empty() => ReduceAxes::List(a),
        _ if noop => return ctx.bind(node, 0, x),
        _ => ReduceAxes::All,
    };
    let op = Reduce {
        kind,
        axes,
        keepdims,
    };
    ctx.emit(node, op, &[x])?;
    Ok(())
}

/// `ReduceSum`.
pub(super) fn reduce_sum(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    reduce(ctx, node, ReduceKind::Sum)
}

/// `ReduceMean`.
pub(super) fn reduce_mean(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    reduce(ctx, node, ReduceKind::Mean)
}

/// `ReduceMax`.
pub(super) fn reduce_max(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    reduce(ctx, node, ReduceKind::Max)
}

/// `ReduceMin`.
pub(super) fn reduce_min(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    reduce(ctx, node, ReduceKind::Min)
}

/// `CumSum(x, axis)` with the axis a constant; `exclusive`, `reverse`.
pub(super) fn cumsum(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let x = ctx.input(node, 0)?;
    let axis = match ctx.const_input_ints(node, 1, "axis")?.as_deref() {
        Some([a]) => *a,
        _ => return Err(ctx.err(node, "the axis must be one value")),
    };
    let op = CumSum {
        axis,
        exclusive: ctx.attr_int(node, "exclusive", 0)? != 0,
        reverse: ctx.attr_int(node, "reverse", 0)? != 0,
    };
    ctx.emit(node, op, &[x])?;
    Ok(())
}

/// `Trilu(x, k?)` (`upper`, default 1); k is read on the device.
pub(super) fn trilu(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let mut ins = vec![ctx.input(node, 0)?];
    ins.extend(ctx.optional_input(node, 1)?);
    let upper = ctx.attr_int(node, "upper", 1)? != 0;
    ctx.emit(node, Trilu { upper }, &ins)?;
    Ok(())
}
