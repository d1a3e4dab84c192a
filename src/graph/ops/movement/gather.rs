//! Gather along an axis, with ONNX's rule for negative and out-of-range indices.

use crate::graph::ops::{axis_index, checked, is_index, DTypeError, InferError, OpDef};
use crate::graph::reference::{index, RefError, RefTensor, Values};
use crate::graph::shape_data;
use crate::shape::{DType, Shape};

/// Gather along `axis`: `out[p.., i.., q..] = data[p.., indices[i..], q..]` (ONNX `Gather`).
/// Indices in `[-dim, dim)` count negative ones from the end; others are an error, as in ONNX
/// ([`InferError::IndexOutOfRange`] where the shape rule sees their values, the runtime's
/// `IndexOutOfRange` for fed and device-computed ones: see [`crate::runtime`]). The kernel
/// itself writes zeros for them, so no dispatch reads outside its table. Inputs: data,
/// indices (i32, u32 or i64).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Gather {
    /// The gathered axis (negative counts from the end).
    pub axis: i64,
}

impl OpDef for Gather {
    fn name(&self) -> &'static str {
        "gather"
    }
    fn arity(&self) -> (usize, usize) {
        (2, 2)
    }
    /// Any table type, integer ids. Tables of a weight format other than f32 (f16, bf16, the
    /// block formats of [`crate::formats`]) give f32 rows, dequantized by the kernel; other
    /// tables keep their type.
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        if !is_index(inputs[1]) {
            return Err(DTypeError::at(1, "i32, u32 or i64 (indices)"));
        }
        Ok(match inputs[0] {
            d if crate::formats::of_dtype(d).is_some() => DType::F32,
            d => d,
        })
    }
    /// The shape; when the indices' values are known (constants, shape data), also that each
    /// lies in `[-dim, dim)`.
    fn infer(&self, inputs: &[&Shape], data: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        let out = infer_gather(inputs[0], inputs[1], self.axis)?;
        if let Some(ids) = data.get(1).copied().flatten() {
            let axis = axis_index(self.axis, inputs[0].rank())?;
            let bound = inputs[0].dims()[axis];
            if let Some((position, index)) = first_out_of_range(ids, bound) {
                return Err(InferError::IndexOutOfRange {
                    input: 1,
                    position,
                    index,
                    bound,
                });
            }
        }
        Ok(out)
    }
    /// Output index `(p.., i.., q..)` reads data at `(p.., indices[i..], q..)`; negative
    /// indices count from the end, others are [`RefError::IndexOutOfRange`].
    fn reference(&self, inputs: &[&RefTensor], out: &Shape, _: DType) -> Result<Values, RefError> {
        let (data, ids) = (inputs[0], inputs[1]);
        let id_values = ids.ints("gather")?;
        let rank = data.shape.rank();
        let Ok(axis) = axis_index(self.axis, rank) else {
            return Ok(Values::F32(Vec::new()));
        };
        let bound = data.shape.dims()[axis];
        if let Some((position, index)) = first_out_of_range(id_values, bound) {
            return Err(RefError::IndexOutOfRange {
                position,
                index,
                bound,
            });
        }
        let id_rank = ids.shape.rank();
        let mut picks = Vec::new();
        let mut src = vec![0u64; rank];
        index::for_each(out, |_, o| {
            let id = id_values[index::linear(&o[axis..axis + id_rank], &ids.shape)];
            picks.push(gather_index(id, bound).map(|id| {
                src[..axis].copy_from_slice(&o[..axis]);
                src[axis] = id;
                src[axis + 1..].copy_from_slice(&o[axis + id_rank..]);
                index::linear(&src, &data.shape)
            }));
        });
        Ok(data.values.pick(&picks))
    }
    fn host_evaluable(&self) -> bool {
        true
    }
    fn host_value(&self, shapes: &[&Shape], values: &[&[i64]], _: &Shape) -> Option<Vec<i64>> {
        let axis = axis_index(self.axis, shapes[0].rank()).ok()?;
        shape_data::gather(values[0], shapes[0], values[1], axis)
    }
}

/// A gather index as a position along an axis of `bound` entries: `[0, bound)` as is,
/// `[-bound, 0)` from the end; `None` outside (ONNX's rule for `Gather`).
pub fn gather_index(index: i64, bound: u64) -> Option<u64> {
    let b = i64::try_from(bound).ok()?;
    let at = if index < 0 {
        index.checked_add(b)?
    } else {
        index
    };
    (0..b).contains(&at).then_some(at as u64)
}

/// The first index of `ids` (its position and value) that [`gather_index`] refuses.
pub fn first_out_of_range(ids: &[i64], bound: u64) -> Option<(u64, i64)> {
    ids.iter()
        .position(|&i| gather_index(i, bound).is_none())
        .map(|p| (p as u64, ids[p]))
}

/// Output shape of a gather along `axis`: `data[..axis] ++ indices ++ data[axis + 1..]`.
///
/// # Errors
/// [`InferError::Rank`] for scalar data, [`InferError::Axis`] for an axis out of range.
pub fn infer_gather(data: &Shape, ids: &Shape, axis: i64) -> Result<Shape, InferError> {
    if data.rank() == 0 {
        return Err(InferError::Rank {
            input: 0,
            shape: data.clone(),
            expected: "rank >= 1 for the gathered data",
        });
    }
    let axis = axis_index(axis, data.rank())?;
    let mut out = data.0[..axis].to_vec();
    out.extend_from_slice(&ids.0);
    out.extend_from_slice(&data.0[axis + 1..]);
    checked(Shape(out))
}
