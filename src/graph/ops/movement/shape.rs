//! `shape_of` and `size_of`: values computed on the host from an input's shape.

use crate::graph::ops::{checked, DTypeError, InferError, OpDef};
use crate::graph::reference::{index, RefError, RefTensor, Values};
use crate::shape::{DType, Shape};

/// The shape of its input as a 1-D integer tensor, dimensions `start..end` (ONNX `Shape`:
/// negative bounds count from the end, both clamp to `[0, rank]`). Its values are known on
/// the host once shapes are, so they feed shape inference of later nodes without a GPU round
/// trip. Inputs: x.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShapeOf {
    /// First dimension reported.
    pub start: i64,
    /// One past the last dimension reported; `None` for the rank.
    pub end: Option<i64>,
    /// Output element type: `I32` (the builder's) or `I64` (ONNX's).
    pub dtype: DType,
}

impl Default for ShapeOf {
    /// Every dimension, as i32.
    fn default() -> Self {
        ShapeOf {
            start: 0,
            end: None,
            dtype: DType::I32,
        }
    }
}

/// The number of elements of its input as an i64 scalar (ONNX `Size`), computed on the host
/// from the shape like [`ShapeOf`]. Inputs: x.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SizeOf;

impl ShapeOf {
    /// The reported dimensions `(start, end)` for a rank, clamped (ONNX `Shape`).
    pub fn bounds(&self, rank: usize) -> (usize, usize) {
        let r = rank as i64;
        let clamp = |v: i64| (if v < 0 { v.saturating_add(r) } else { v }).clamp(0, r) as usize;
        let start = clamp(self.start);
        let end = clamp(self.end.unwrap_or(r));
        (start, end.max(start))
    }
}

impl OpDef for ShapeOf {
    fn name(&self) -> &'static str {
        "shape_of"
    }
    fn arity(&self) -> (usize, usize) {
        (1, 1)
    }
    fn output_dtype(&self, _: &[DType]) -> Result<DType, DTypeError> {
        Ok(self.dtype)
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        let (start, end) = self.bounds(inputs[0].rank());
        Ok(Shape(vec![(end - start) as u64]))
    }
    fn reads_values(&self) -> bool {
        false
    }
    fn reference(&self, inputs: &[&RefTensor], _: &Shape, _: DType) -> Result<Values, RefError> {
        let dims = inputs[0].shape.dims();
        let (start, end) = self.bounds(dims.len());
        Ok(Values::Int(
            dims[start..end].iter().map(|&d| d as i64).collect(),
        ))
    }
    fn host_evaluable(&self) -> bool {
        true
    }
    fn host_value(&self, shapes: &[&Shape], _: &[&[i64]], _: &Shape) -> Option<Vec<i64>> {
        let (start, end) = self.bounds(shapes[0].rank());
        Some(
            shapes[0].dims()[start..end]
                .iter()
                .map(|&d| d as i64)
                .collect(),
        )
    }
}

impl OpDef for SizeOf {
    fn name(&self) -> &'static str {
        "size_of"
    }
    fn arity(&self) -> (usize, usize) {
        (1, 1)
    }
    fn output_dtype(&self, _: &[DType]) -> Result<DType, DTypeError> {
        Ok(DType::I64)
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        checked(inputs[0].clone())?;
        Ok(Shape(vec![]))
    }
    fn reads_values(&self) -> bool {
        false
    }
    /// The product of the dimensions, counted one element at a time by the reference's
    /// walk.
    fn reference(&self, inputs: &[&RefTensor], _: &Shape, _: DType) -> Result<Values, RefError> {
        let mut n = 0i64;
        index::for_each(&inputs[0].shape, |_, _| n += 1);
        Ok(Values::Int(vec![n]))
    }
    fn host_evaluable(&self) -> bool {
        true
    }
    fn host_value(&self, shapes: &[&Shape], _: &[&[i64]], _: &Shape) -> Option<Vec<i64>> {
        Some(vec![shapes[0].checked_num_elements()? as i64])
    }
}
