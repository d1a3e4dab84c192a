//! Converters of `GatherND` and `IsNaN`, built from ops the graph already has (so each runs
//! on the kernels and CPU references of those ops).

use super::{Ctx, ImportError};
use crate::graph::ops::{
    BinaryOp, Cast, CompareOp, Gather, Not, ReshapeTo, ShapeOf, Slice, Squeeze, Where,
};
use crate::graph::NodeId;
use crate::onnx::OnnxNode;
use crate::shape::{DType, Shape};

/// `IsNaN(x) = not(x == x)`: NaN is the one value unequal to itself (the `logic` kernels
/// compare floats as IEEE does).
pub(super) fn is_nan(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let x = ctx.input(node, 0)?;
    if !ctx.dtype(x).is_float() {
        return Err(ctx.err(node, format!("input is {}, not a float type", ctx.dtype(x))));
    }
    let eq = ctx.helper(node, "self_equal", CompareOp::Equal, &[x, x])?;
    ctx.emit(node, Not, &[eq])?;
    Ok(())
}

/// `GatherND(data, indices)` with `batch_dims = 0`: the last axis of `indices` (of fixed
/// length `K`) holds positions in `data`'s first `K` axes. Converted as a `Gather` on axis 0
/// of `data` with its first `K` axes merged, at the row `((i_0 d_1 + i_1) d_2 + i_2) ...`,
/// each `i_k` taken modulo-style from the end when negative (`i_k + d_k`); the extents come
/// from `data`'s shape on the host. Tables of 1- and 2-byte types are gathered as i32 or f32
/// and cast back (the gather kernel moves 32-bit words).
pub(super) fn gather_nd(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let data = ctx.input(node, 0)?;
    let indices = ctx.input(node, 1)?;
    if ctx.attr_int(node, "batch_dims", 0)? != 0 {
        return Err(ctx.err(node, "batch_dims other than 0 is not supported"));
    }
    let rank = ctx.need_rank(node, data)?;
    let k = ctx
        .dims(indices)
        .and_then(|d| d.last().copied().flatten())
        .ok_or_else(|| ctx.err(node, "the last dimension of the indices must be fixed"))?
        as usize;
    if k == 0 || k > rank {
        return Err(ctx.err(
            node,
            format!("indices address {k} axes of a rank-{rank} tensor"),
        ));
    }
    let it = ctx.dtype(indices);
    if !matches!(it, DType::I64 | DType::I32) {
        return Err(ctx.err(node, format!("indices are {it}, not i64 or i32")));
    }
    let shape = ctx.helper(
        node,
        "data_shape",
        ShapeOf {
            start: 0,
            end: None,
            dtype: it,
        },
        &[data],
    )?;
    let zero = ctx.constant_scalar(node, "zero", it, 0.0)?;
    let mut linear: Option<NodeId> = None;
    for axis in 0..k {
        let a = axis as i64;
        let pick = Slice {
            axes: vec![-1],
            starts: vec![a],
            ends: vec![a + 1],
            steps: vec![1],
        };
        let i = ctx.helper(node, &format!("index{axis}"), pick, &[indices])?;
        let dim = Slice {
            axes: vec![0],
            starts: vec![a],
            ends: vec![a + 1],
            steps: vec![1],
        };
        let d = ctx.helper(node, &format!("extent{axis}"), dim, &[shape])?;
        let negative = ctx.helper(
            node,
            &format!("negative{axis}"),
            CompareOp::Less,
            &[i, zero],
        )?;
        let wrapped = ctx.helper(node, &format!("wrapped{axis}"), BinaryOp::Add, &[i, d])?;
        let i = ctx.helper(
            node,
            &format!("position{axis}"),
            Where,
            &[negative, wrapped, i],
        )?;
        linear = Some(match linear {
            None => i,
            Some(l) => {
                let scaled = ctx.helper(node, &format!("scaled{axis}"), BinaryOp::Mul, &[l, d])?;
                ctx.helper(node, &format!("row{axis}"), BinaryOp::Add, &[scaled, i])?
            }
        });
    }
    let linear = linear.ok_or_else(|| ctx.err(node, "no index axis"))?;
    let rows = ctx.helper(
        node,
        "rows",
        Squeeze {
            axes: Some(vec![-1]),
        },
        &[linear],
    )?;
    // data as [d_0 * ... * d_{K-1}, d_K, ...]: the target is [-1] then the kept extents.
    let minus_one = ctx.constant_i64(node, "merged", Shape::new(vec![1]), &[-1])?;
    let minus_one = if it == DType::I64 {
        minus_one
    } else {
        ctx.helper(node, "merged_cast", Cast { to: it }, &[minus_one])?
    };
    let target = if k == rank {
        minus_one
    } else {
        let kept = ctx.helper(
            node,
            "kept_extents",
            Slice {
                axes: vec![0],
                starts: vec![k as i64],
                ends: vec![i64::MAX],
                steps: vec![1],
            },
            &[shape],
        )?;
        ctx.helper(
            node,
            "target",
            crate::graph::ops::Concat { axis: 0 },
            &[minus_one, kept],
        )?
    };
    let table = ctx.helper(node, "table", ReshapeTo::default(), &[data, target])?;
    let dt = ctx.dtype(data);
    let wide = match dt {
        DType::Bool | DType::I8 | DType::U8 => Some(DType::I32),
        DType::F16 | DType::BF16 => Some(DType::F32),
        _ => None,
    };
    match wide {
        None => {
            ctx.emit(node, Gather { axis: 0 }, &[table, rows])?;
        }
        Some(w) => {
            let table = ctx.helper(node, "table_wide", Cast { to: w }, &[table])?;
            let picked = ctx.helper(node, "picked", Gather { axis: 0 }, &[table, rows])?;
            ctx.emit(node, Cast { to: dt }, &[picked])?;
        }
    }
    Ok(())
}
