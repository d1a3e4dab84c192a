//! Converters of the data-movement ops: `Reshape` (with `allowzero`), `Transpose`, `Concat`,
//! `Slice` (constant parameters become a static slice, run-time ones a `slice_to`), `Split`
//! (one `split_part` node per output), `Gather` (any axis), `Squeeze` / `Unsqueeze` (axes as
//! an attribute before opset 13, as a constant input from 13), `Flatten`, `Expand`.
//! Negative axes are kept as they are: dynrt ops resolve them against the rank of each run.

use super::{Ctx, ImportError};
use crate::graph::ops::{
    Concat, Expand, Flatten, Gather, ReshapeTo, Slice, SliceTo, SplitPart, Squeeze, Transpose,
    Unsqueeze,
};
use crate::graph::NodeId;
use crate::onnx::OnnxNode;

/// `Reshape(data, shape)` (opset 5+): the target is shape data computed on the host (a
/// constant, an input, or a shape chain); `allowzero = 1` makes a 0 an empty dimension.
pub(super) fn reshape(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let x = ctx.input(node, 0)?;
    let shape = ctx.input(node, 1)?;
    let allow_zero = ctx.attr_int(node, "allowzero", 0)? != 0;
    ctx.emit(node, ReshapeTo { allow_zero }, &[x, shape])?;
    Ok(())
}

/// `Transpose` (`perm`; without it the dimensions are reversed, whatever the rank).
pub(super) fn transpose(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let x = ctx.input(node, 0)?;
    let perm: Vec<usize> = match ctx.attr_ints(node, "perm")? {
        Some(p) => p
            .iter()
            .map(|&a| usize::try_from(a).map_err(|_| ctx.err(node, format!("perm has {a}"))))
            .collect::<Result<_, _>>()?,
        None => Vec::new(),
    };
    ctx.emit(node, Transpose { perm }, &[x])?;
    Ok(())
}

/// `Concat` along `axis` (required; negative counts from the end).
pub(super) fn concat(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let xs = ctx.inputs(node)?;
    if node.attribute("axis").is_none() {
        return Err(ctx.err(node, "attribute `axis` is required"));
    }
    let axis = ctx.attr_int(node, "axis", 0)?;
    ctx.emit(node, Concat { axis }, &xs)?;
    Ok(())
}

/// `Slice(data, starts, ends, axes?, steps?)` (opset 10+). Parameters known at import give a
/// static slice; starts, ends, axes or steps known only at run time (computed, or fed) give a
/// `slice_to`, which reads them from their tensors (a missing steps tensor then becomes ones,
/// whose length must be known at import when the axes are a run-time tensor too).
pub(super) fn slice(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let x = ctx.input(node, 0)?;
    let starts = ctx.input(node, 1)?;
    let ends = ctx.input(node, 2)?;
    let axes = ctx.optional_input(node, 3)?;
    let steps = ctx.optional_input(node, 4)?;
    let known = |ctx: &Ctx<'_>, id: Option<NodeId>| match id {
        Some(id) => ctx.const_ints(id).map(|v| Some(v.to_vec())),
        None => Some(None),
    };
    let (s, e) = (known(ctx, Some(starts)), known(ctx, Some(ends)));
    let (a, t) = (known(ctx, axes), known(ctx, steps));
    if let (Some(Some(starts)), Some(Some(ends)), Some(axes), Some(steps)) = (s, e, &a, t) {
        let op = Slice {
            axes: axes
                .clone()
                .unwrap_or_else(|| (0..starts.len() as i64).collect()),
            steps: steps.unwrap_or_else(|| vec![1; starts.len()]),
            starts,
            ends,
        };
        ctx.emit(node, op, &[x])?;
        return Ok(());
    }
    let mut ins = vec![x, starts, ends];
    if let (None, Some(axes)) = (&a, axes) {
        // Axes known at run time only: the kernel reads them, after the steps.
        let steps = match steps {
            Some(t) => t,
            None => {
                let n = ctx
                    .dims(starts)
                    .and_then(|d| d.first().copied().flatten())
                    .ok_or_else(|| ctx.err(node, "run-time axes and starts of unknown length"))?;
                let dtype = ctx.dtype(starts);
                let bytes = crate::tensor::encode_i64(dtype, &vec![1; n as usize])
                    .map_err(|e| ctx.err(node, e.to_string()))?;
                let op = crate::graph::ops::Constant {
                    shape: crate::shape::Shape::new(vec![n]),
                    dtype,
                    data: crate::tensor::ConstData::from_vec(bytes),
                };
                ctx.helper(node, "steps", op, &[])?
            }
        };
        ins.extend([steps, axes]);
        ctx.emit(node, SliceTo { axes: None }, &ins)?;
        return Ok(());
    }
    // Axes known at import (or absent) go into the op.
    ins.extend(steps);
    ctx.emit(node, SliceTo { axes: a.flatten() }, &ins)?;
    Ok(())
}

/// `Split` along `axis`: sizes from the `split` input (opset 13+, constant) or attribute
/// (before 13), else equal parts, `num_outputs` of them (opset 18) or one per output. Each
/// output is its own `split_part` node.
pub(super) fn split(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let x = ctx.input(node, 0)?;
    let axis = ctx.attr_int(node, "axis", 0)?;
    // Sizes known at import go into the op; a tensor known only at run time is an input.
    let (sizes, sizes_input) = if ctx.version() >= 13 {
        match ctx.optional_input(node, 1)? {
            None => (None, None),
            Some(id) => match ctx.const_ints(id) {
                Some(v) => (Some(v.to_vec()), None),
                None => (None, Some(id)),
            },
        }
    } else {
        (ctx.attr_ints(node, "split")?, None)
    };
    let parts = match (&sizes, ctx.attr_int(node, "num_outputs", 0)?) {
        (Some(s), _) => s.len(),
        (None, n) if n > 0 => n as usize,
        (None, _) => node.outputs.len(),
    };
    if parts < node.outputs.len() {
        return Err(ctx.err(
            node,
            format!("{} outputs for {parts} parts", node.outputs.len()),
        ));
    }
    let mut ins = vec![x];
    ins.extend(sizes_input);
    for (index, out) in node.outputs.iter().enumerate() {
        if out.is_empty() {
            continue;
        }
        let op = SplitPart {
            axis,
            sizes: sizes.clone(),
            parts,
            index,
        };
        ctx.emit_output(node, index, op, &ins)?;
    }
    Ok(())
}

/// `Gather` along `axis` (negative indices count from the end, in the kernels too).
pub(super) fn gather(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let data = ctx.input(node, 0)?;
    let ids = ctx.input(node, 1)?;
    let axis = ctx.attr_int(node, "axis", 0)?;
    ctx.emit(node, Gather { axis }, &[data, ids])?;
    Ok(())
}

/// `Squeeze` / `Unsqueeze`: axes from the attribute before opset 13, from input 1 after (a
/// constant goes into the op; a tensor known only at run time stays an input, shape data).
fn squeeze_like(
    ctx: &mut Ctx<'_>,
    node: &OnnxNode,
    op: impl Fn(Option<Vec<i64>>) -> crate::graph::Op,
) -> Result<(), ImportError> {
    let x = ctx.input(node, 0)?;
    if ctx.version() < 13 {
        let axes = ctx.attr_ints(node, "axes")?;
        ctx.emit(node, op(axes), &[x])?;
        return Ok(());
    }
    match ctx.optional_input(node, 1)? {
        None => ctx.emit(node, op(None), &[x])?,
        Some(id) => match ctx.const_ints(id).map(<[i64]>::to_vec) {
            Some(axes) => ctx.emit(node, op(Some(axes)), &[x])?,
            None => ctx.emit(node, op(None), &[x, id])?,
        },
    };
    Ok(())
}

/// `Squeeze`: the listed axes, or every dimension of 1.
pub(super) fn squeeze(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    squeeze_like(ctx, node, |axes| Squeeze { axes }.into())
}

/// `Unsqueeze` (axes required).
pub(super) fn unsqueeze(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    if ctx.version() < 13 && node.attribute("axes").is_none()
        || node.inputs.len() < 2 && ctx.version() >= 13
    {
        return Err(ctx.err(node, "axes are required"));
    }
    squeeze_like(ctx, node, |axes| {
        Unsqueeze {
            axes: axes.unwrap_or_default(),
        }
        .into()
    })
}

/// `Flatten` around `axis` (default 1).
pub(super) fn flatten(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let x = ctx.input(node, 0)?;
    let axis = ctx.attr_int(node, "axis", 1)?;
    ctx.emit(node, Flatten { axis }, &[x])?;
    Ok(())
}

/// `Expand(input, shape)`: the shape is shape data (a constant, an input or a shape chain).
pub(super) fn expand(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let x = ctx.input(node, 0)?;
    let shape = ctx.input(node, 1)?;
    ctx.emit(node, Expand, &[x, shape])?;
    Ok(())
}
