//! Data movement: reshape, transpose, concat, slice, split, gather, expand, and `shape_of`.
//!
//! Files: `reshape` (reshape, transpose, expand: the same elements in a new shape or order),
//! `concat` (concat and its inverse, split), `slice` (static and fed slices, and the
//! per-axis ranges both resolve to: [`slice_ranges`]), `gather` (gather and ONNX's index
//! rule), `shape` (`shape_of`, `size_of`: values computed from shapes). Each op's type is
//! re-exported here.

mod concat;
mod gather;
mod reshape;
mod shape;
mod slice;
#[cfg(test)]
mod tests;

pub use concat::{infer_concat, Concat, SplitPart};
pub use gather::{first_out_of_range, gather_index, infer_gather, Gather};
pub use reshape::{infer_reshape, infer_transpose, Expand, Reshape, ReshapeTo, Transpose};
pub use shape::{ShapeOf, SizeOf};
pub use slice::{slice_ranges, AxisRange, Slice, SliceTo};

use super::{checked, InferError};
use crate::shape::Shape;

/// The values of shape-data input `input`, which must be a 1-D tensor.
///
/// # Errors
/// [`InferError::MissingShapeData`] when they are not known on the host, [`InferError::Rank`]
/// when the tensor is not 1-D.
pub(crate) fn shape_vector<'a>(
    inputs: &[&Shape],
    data: &[Option<&'a [i64]>],
    input: usize,
) -> Result<&'a [i64], InferError> {
    let values = data
        .get(input)
        .copied()
        .flatten()
        .ok_or(InferError::MissingShapeData { input })?;
    if inputs[input].rank() != 1 {
        return Err(InferError::Rank {
            input,
            shape: inputs[input].clone(),
            expected: "a 1-D shape tensor",
        });
    }
    Ok(values)
}

/// A shape from the values of shape-data input `input` (every value non-negative).
///
/// # Errors
/// [`InferError::ShapeData`] for a negative value.
pub(crate) fn shape_from_values(values: &[i64], input: usize) -> Result<Shape, InferError> {
    if values.iter().any(|&v| v < 0) {
        return Err(InferError::ShapeData {
            input,
            values: values.to_vec(),
            reason: "a dimension is negative",
        });
    }
    checked(Shape(values.iter().map(|&v| v as u64).collect()))
}
