//! Converters of the CNN set: `Conv` (1 to 3 spatial dimensions; a missing bias becomes zeros
//! when the weights' output channels are known at import), `MaxPool` and `AveragePool`
//! (`auto_pad`, `pads`, `strides`, `dilations`, `ceil_mode`, `count_include_pad`),
//! `GlobalAveragePool` / `GlobalMaxPool` (reductions over the spatial axes),
//! `BatchNormalization` (inference form).

use super::{Ctx, ImportError};
use crate::graph::ops::conv::{AutoPad, Window};
use crate::graph::ops::{BatchNorm, Conv, Pool, PoolKind, Reduce, ReduceAxes, ReduceKind};
use crate::onnx::OnnxNode;
use crate::shape::{DType, Shape};

/// A list attribute of non-negative integers (empty when absent).
fn uints(ctx: &Ctx<'_>, node: &OnnxNode, name: &str) -> Result<Vec<u64>, ImportError> {
    ctx.attr_ints(node, name)?
        .unwrap_or_default()
        .into_iter()
        .map(|v| u64::try_from(v).map_err(|_| ctx.err(node, format!("`{name}` holds {v}"))))
        .collect()
}

/// The window attributes shared by convolution and pooling.
fn window(ctx: &Ctx<'_>, node: &OnnxNode) -> Result<Window, ImportError> {
    let auto_pad = match ctx.attr_string(node, "auto_pad", "NOTSET")?.as_str() {
        "NOTSET" => AutoPad::NotSet,
        "SAME_UPPER" => AutoPad::SameUpper,
        "SAME_LOWER" => AutoPad::SameLower,
        "VALID" => AutoPad::Valid,
        other => return Err(ctx.err(node, format!("auto_pad `{other}` is not one of ONNX's"))),
    };
    Ok(Window {
        strides: uints(ctx, node, "strides")?,
        pads: uints(ctx, node, "pads")?,
        dilations: uints(ctx, node, "dilations")?,
        auto_pad,
        ceil_mode: ctx.attr_int(node, "ceil_mode", 0)? != 0,
    })
}

/// `Conv(X, W, B?)` (`group`, `kernel_shape` checked against W by the shape rule).
pub(super) fn conv(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let x = ctx.input(node, 0)?;
    let w = ctx.input(node, 1)?;
    let bias = match ctx.optional_input(node, 2)? {
        Some(b) => b,
        None => {
            let oc = ctx
                .dims(w)
                .and_then(|d| d.first().copied().flatten())
                .ok_or_else(|| ctx.err(node, "no bias and weights of unknown output channels"))?;
            let zeros = crate::graph::ops::Constant {
                shape: Shape::new(vec![oc]),
                dtype: DType::F32,
                data: crate::tensor::ConstData::from_f32(&vec![0.0; oc as usize]),
            };
            ctx.helper(node, "zero_bias", zeros, &[])?
        }
    };
    let group = u64::try_from(ctx.attr_int(node, "group", 1)?)
        .map_err(|_| ctx.err(node, "group must be positive"))?;
    let op = Conv {
        window: window(ctx, node)?,
        group,
    };
    ctx.emit(node, op, &[x, w, bias])?;
    Ok(())
}

/// `MaxPool` / `AveragePool` (`kernel_shape` required; MaxPool's `Indices` output and
/// `storage_order` are not mapped).
fn pool(ctx: &mut Ctx<'_>, node: &OnnxNode, kind: PoolKind) -> Result<(), ImportError> {
    let x = ctx.input(node, 0)?;
    if node.outputs.get(1).is_some_and(|o| !o.is_empty()) {
        return Err(ctx.err(node, "the Indices output is not mapped"));
    }
    let kernel = uints(ctx, node, "kernel_shape")?;
    if kernel.is_empty() {
        return Err(ctx.err(node, "kernel_shape is required"));
    }
    let op = Pool {
        kind,
        kernel,
        window: window(ctx, node)?,
    };
    ctx.emit(node, op, &[x])?;
    Ok(())
}

/// `MaxPool`.
pub(super) fn max_pool(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    pool(ctx, node, PoolKind::Max)
}

/// `AveragePool`.
pub(super) fn average_pool(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let count_include_pad = ctx.attr_int(node, "count_include_pad", 0)? != 0;
    pool(ctx, node, PoolKind::Avg { count_include_pad })
}

/// `GlobalAveragePool` / `GlobalMaxPool`: a reduction over the spatial axes, kept as 1s.
fn global(ctx: &mut Ctx<'_>, node: &OnnxNode, kind: ReduceKind) -> Result<(), ImportError> {
    let x = ctx.input(node, 0)?;
    let op = Reduce {
        kind,
        axes: ReduceAxes::From(2),
        keepdims: true,
    };
    ctx.emit(node, op, &[x])?;
    Ok(())
}

/// `GlobalAveragePool`.
pub(super) fn global_average_pool(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    global(ctx, node, ReduceKind::Mean)
}

/// `GlobalMaxPool`.
pub(super) fn global_max_pool(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    global(ctx, node, ReduceKind::Max)
}

/// `BatchNormalization` with running statistics (`training_mode = 1` and the running-mean
/// outputs are not mapped).
pub(super) fn batch_norm(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    if ctx.attr_int(node, "training_mode", 0)? != 0 || node.outputs.len() > 1 {
        return Err(ctx.err(node, "training mode (batch statistics) is not mapped"));
    }
    let ins = [
        ctx.input(node, 0)?,
        ctx.input(node, 1)?,
        ctx.input(node, 2)?,
        ctx.input(node, 3)?,
        ctx.input(node, 4)?,
    ];
    let eps = ctx.attr_float(node, "epsilon", 1e-5)?;
    ctx.emit(node, BatchNorm { eps }, &ins)?;
    Ok(())
}
