//! Converters of the data-movement ops dynrt had before the importer: `Reshape`, `Transpose`,
//! `Concat`, `Slice` (constant parameters) and `Gather` (axis 0). The movement work of issue 13
//! (Gather on any axis, Slice with input tensors, Squeeze/Unsqueeze, Expand, ...) extends or
//! replaces these lines.

use super::{Ctx, ImportError};
use crate::graph::ops::{Concat, Gather, ReshapeTo, Slice, Transpose};
use crate::onnx::OnnxNode;
use crate::shape::Shape;

/// `Reshape(data, shape)` (opset 5+): the target is shape data computed on the host (a
/// constant, or a shape chain). `allowzero = 1` is taken only when the target is known and
/// has no 0 (then it means the same as 0).
pub(super) fn reshape(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let x = ctx.input(node, 0)?;
    let shape = ctx.input(node, 1)?;
    if ctx.attr_int(node, "allowzero", 0)? != 0 {
        let zero_free = ctx.const_ints(shape).is_some_and(|v| !v.contains(&0));
        if !zero_free {
            return Err(ctx.err(
                node,
                "allowzero = 1 is mapped only for a target known at import without a 0",
            ));
        }
    }
    ctx.emit(node, ReshapeTo, &[x, shape])?;
    Ok(())
}

/// `Transpose` (`perm`, default reversed).
pub(super) fn transpose(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let x = ctx.input(node, 0)?;
    let perm: Vec<usize> = match ctx.attr_ints(node, "perm")? {
        Some(p) => p
            .iter()
            .map(|&a| usize::try_from(a).map_err(|_| ctx.err(node, format!("perm has {a}"))))
            .collect::<Result<_, _>>()?,
        None => (0..ctx.need_rank(node, x)?).rev().collect(),
    };
    ctx.emit(node, Transpose { perm }, &[x])?;
    Ok(())
}

/// `Concat` along `axis` (negative counts from the end).
pub(super) fn concat(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let xs = ctx.inputs(node)?;
    let first = *xs.first().ok_or_else(|| ctx.err(node, "needs an input"))?;
    let axis = match node.attribute("axis") {
        Some(_) => ctx.attr_int(node, "axis", 0)?,
        None => return Err(ctx.err(node, "attribute `axis` is required")),
    };
    let axis = if axis < 0 {
        ctx.axis(node, axis, ctx.need_rank(node, first)?)?
    } else {
        axis as usize
    };
    ctx.emit(node, Concat { axis }, &xs)?;
    Ok(())
}

/// `Slice(data, starts, ends, axes?, steps?)` (opset 10+) with parameters known at import;
/// positive steps.
pub(super) fn slice(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let x = ctx.input(node, 0)?;
    let starts = ctx
        .const_input_ints(node, 1, "starts")?
        .ok_or_else(|| ctx.err(node, "starts are required"))?;
    let ends = ctx
        .const_input_ints(node, 2, "ends")?
        .ok_or_else(|| ctx.err(node, "ends are required"))?;
    let axes = match ctx.const_input_ints(node, 3, "axes")? {
        Some(a) => {
            let rank = if a.iter().any(|&v| v < 0) {
                ctx.need_rank(node, x)?
            } else {
                usize::MAX
            };
            a.iter()
                .map(|&v| {
                    if v < 0 {
                        ctx.axis(node, v, rank)
                    } else {
                        Ok(v as usize)
                    }
                })
                .collect::<Result<Vec<_>, _>>()?
        }
        None => (0..starts.len()).collect(),
    };
    let steps = ctx
        .const_input_ints(node, 4, "steps")?
        .unwrap_or_else(|| vec![1; starts.len()]);
    if steps.iter().any(|&s| s < 1) {
        return Err(ctx.err(node, "only positive steps are mapped"));
    }
    let op = Slice {
        axes,
        starts,
        ends,
        steps,
    };
    ctx.emit(node, op, &[x])?;
    Ok(())
}

/// `Gather` along axis 0. Negative indices known at import are counted from the end of a
/// fixed axis 0; a negative index computed at run time selects zeros.
pub(super) fn gather(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let data = ctx.input(node, 0)?;
    let mut ids = ctx.input(node, 1)?;
    let axis = ctx.attr_int(node, "axis", 0)?;
    let axis = if axis < 0 {
        ctx.axis(node, axis, ctx.need_rank(node, data)?)?
    } else {
        axis as usize
    };
    if axis != 0 {
        return Err(ctx.err(node, format!("only axis 0 is mapped, not {axis}")));
    }
    if let Some(v) = ctx.const_ints(ids).filter(|v| v.iter().any(|&i| i < 0)) {
        let v = v.to_vec();
        let rows = ctx
            .dims(data)
            .and_then(|d| d.first().copied().flatten())
            .ok_or_else(|| ctx.err(node, "negative indices into an axis of unknown extent"))?;
        let fixed: Vec<i64> = v
            .iter()
            .map(|&i| {
                if i < 0 {
                    i.saturating_add(rows as i64)
                } else {
                    i
                }
            })
            .collect();
        let shape = ctx
            .dims(ids)
            .and_then(|d| d.into_iter().collect::<Option<Vec<u64>>>())
            .map(Shape::new)
            .ok_or_else(|| ctx.err(node, "indices of unknown shape"))?;
        ids = ctx.constant_i64(node, "indices", shape, &fixed)?;
    }
    ctx.emit(node, Gather, &[data, ids])?;
    Ok(())
}
