//! Converters of the value-plumbing ops: `Constant`, `Identity` and `Shape` (the head of the
//! integer shape chains the host evaluates).

use super::{Ctx, ImportError};
use crate::graph::ops::{Cast, ShapeOf, Slice};
use crate::onnx::OnnxNode;
use crate::shape::DType;

/// `Constant`: its value (any of the `value*` attributes) as a constant node named after the
/// output; integer constants that only feed shapes stay on the host.
pub(super) fn constant(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let value = node
        .constant_value()
        .map_err(|e| ctx.err(node, e.to_string()))?;
    let name = node
        .outputs
        .first()
        .cloned()
        .unwrap_or_else(|| node.label());
    let id = ctx.tensor_constant(&name, &value)?;
    ctx.bind(node, 0, id)
}

/// `Identity`: the output is the input's node (no copy; a graph output gets its own copy
/// when the importer finishes).
pub(super) fn identity(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let x = ctx.input(node, 0)?;
    ctx.bind(node, 0, x)
}

/// `Shape` (with `start`/`end` since opset 15): `shape_of`, sliced when asked, as i64. The
/// values are computed on the host from shapes at every `update_shape`.
pub(super) fn shape(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let x = ctx.input(node, 0)?;
    let start = ctx.attr_int(node, "start", 0)?;
    let end = ctx.attr_int(node, "end", i64::MAX)?;
    let mut s = ctx.add(node, "shape_of", ShapeOf, &[x])?;
    if start != 0 || end != i64::MAX {
        let slice = Slice {
            axes: vec![0],
            starts: vec![start],
            ends: vec![end],
            steps: vec![1],
        };
        s = ctx.add(node, "range", slice, &[s])?;
    }
    ctx.emit(node, Cast { to: DType::I64 }, &[s])?;
    Ok(())
}
