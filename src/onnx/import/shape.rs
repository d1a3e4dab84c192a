//! Converters of the value-plumbing ops: `Constant`, `Identity`, and the ops that make
//! tensors from shape data: `Shape` and `Size` (the heads of the integer shape chains the
//! host evaluates), `ConstantOfShape`, `Range`.

use super::{dtype_of, Ctx, ImportError};
use crate::graph::ops::{ConstantOfShape, Range, ShapeOf, SizeOf};
use crate::onnx::{AttributeValue, OnnxNode};
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

/// `Shape` (with `start`/`end` since opset 15) as an i64 `shape_of`; its values are computed
/// on the host from shapes at every `update_shape`.
pub(super) fn shape(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let x = ctx.input(node, 0)?;
    let start = ctx.attr_int(node, "start", 0)?;
    let end = match node.attribute("end") {
        Some(_) => Some(ctx.attr_int(node, "end", 0)?),
        None => None,
    };
    let op = ShapeOf {
        start,
        end,
        dtype: DType::I64,
    };
    ctx.emit(node, op, &[x])?;
    Ok(())
}

/// `Size`: the element count, an i64 scalar computed on the host from the shape.
pub(super) fn size(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let x = ctx.input(node, 0)?;
    ctx.emit(node, SizeOf, &[x])?;
    Ok(())
}

/// `ConstantOfShape(shape)`: the `value` attribute (a one-element tensor; f32 0 without it)
/// repeated over the shape held in the input.
pub(super) fn constant_of_shape(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let shape = ctx.input(node, 0)?;
    let op = match node.attribute("value") {
        None => ConstantOfShape::f32(0.0),
        Some(AttributeValue::Tensor(t)) => {
            let dtype = dtype_of(t.dtype()).ok_or_else(|| ImportError::UnsupportedDType {
                value: format!("{} value", node.label()),
                dtype: t.dtype(),
            })?;
            let bytes = t
                .bytes()
                .ok_or_else(|| ctx.err(node, "the value tensor has no bytes"))?;
            ConstantOfShape::from_le_bytes(dtype, bytes)
                .ok_or_else(|| ctx.err(node, "the value must hold exactly one element"))?
        }
        Some(_) => return Err(ctx.err(node, "attribute `value` must be a tensor")),
    };
    ctx.emit(node, op, &[shape])?;
    Ok(())
}

/// `Range(start, limit, delta)`: its length needs integer values known on the host (from
/// constants, inputs or shape chains); the device reads start and delta itself.
pub(super) fn range(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let ins = [
        ctx.input(node, 0)?,
        ctx.input(node, 1)?,
        ctx.input(node, 2)?,
    ];
    ctx.emit(node, Range, &ins)?;
    Ok(())
}
