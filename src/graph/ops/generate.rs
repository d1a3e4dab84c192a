//! Tensors generated from shape data: `constant_of_shape` (one value repeated) and `range`.
//! Their output *shapes* come from input values known on the host; their integer outputs are
//! also computed on the host when they only feed shapes.

use super::movement::{shape_from_values, shape_vector};
use super::{is_index, DTypeError, InferError, OpDef};
use crate::graph::reference::{wrap, RefError, RefTensor, Values};
use crate::shape::{DType, Shape};
use crate::tensor::{decode_f32, decode_i64};

/// A tensor whose shape is the values of a 1-D integer tensor, every element `value`
/// (ONNX `ConstantOfShape`). Inputs: shape (shape data, never read on the device).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConstantOfShape {
    /// Element type of the output (any plain type).
    pub dtype: DType,
    /// The value's little-endian bytes, the first `dtype.bits() / 8` of them used.
    pub value: [u8; 8],
}

/// `start, start + delta, ...` while below `limit` (above, for a negative `delta`): ONNX
/// `Range`, `max(ceil((limit - start) / delta), 0)` elements. The length needs the values on
/// the host (integer inputs); the device reads `start` and `delta` from their buffers, so a
/// recorded dispatch stays right when they change. Inputs: start, limit, delta (scalars of
/// one type: f32, i32 or i64).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range;

impl ConstantOfShape {
    /// An f32 fill.
    pub fn f32(value: f32) -> ConstantOfShape {
        Self::from_le_bytes(DType::F32, &value.to_le_bytes()).unwrap_or(ConstantOfShape {
            dtype: DType::F32,
            value: [0; 8],
        })
    }

    /// A fill of `dtype` from the element's little-endian bytes (ONNX's one-element `value`
    /// tensor); `None` for a block-quantized type or a byte count that is not one element.
    pub fn from_le_bytes(dtype: DType, bytes: &[u8]) -> Option<ConstantOfShape> {
        let n = (dtype.bits()? / 8) as usize;
        if bytes.len() != n {
            return None;
        }
        let mut value = [0u8; 8];
        value[..n].copy_from_slice(bytes);
        Some(ConstantOfShape { dtype, value })
    }

    /// The element's bytes.
    pub fn element(&self) -> &[u8] {
        let n = self.dtype.bits().map_or(0, |b| (b / 8) as usize);
        &self.value[..n.min(8)]
    }
}

impl OpDef for ConstantOfShape {
    fn name(&self) -> &'static str {
        "constant_of_shape"
    }
    fn arity(&self) -> (usize, usize) {
        (1, 1)
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        if !is_index(inputs[0]) {
            return Err(DTypeError::at(0, "i32, u32 or i64 (a shape tensor)"));
        }
        if self.dtype.bits().is_none() {
            return Err(DTypeError::at(0, "a fill value of a plain type"));
        }
        Ok(self.dtype)
    }
    fn infer(&self, inputs: &[&Shape], data: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        shape_from_values(shape_vector(inputs, data, 0)?, 0)
    }
    fn shape_data_inputs(&self) -> &'static [usize] {
        &[0]
    }
    fn reference(&self, _: &[&RefTensor], out: &Shape, _: DType) -> Result<Values, RefError> {
        let n = out.checked_num_elements().unwrap_or(0) as usize;
        Ok(if self.dtype.is_int() {
            let v = decode_i64(self.dtype, self.element())?;
            Values::Int(vec![v.first().copied().unwrap_or(0); n])
        } else {
            let v = decode_f32(self.dtype, self.element())?;
            Values::F32(vec![v.first().copied().unwrap_or(0.0); n])
        })
    }
    fn host_evaluable(&self) -> bool {
        true
    }
    fn host_value(&self, _: &[&Shape], _: &[&[i64]], out: &Shape) -> Option<Vec<i64>> {
        let v = *decode_i64(self.dtype, self.element()).ok()?.first()?;
        Some(vec![v; out.checked_num_elements()? as usize])
    }
}

/// The length of an integer range, `max(ceil((limit - start) / delta), 0)`.
///
/// # Errors
/// [`InferError::ShapeData`] for a zero `delta`.
pub fn range_len(start: i64, limit: i64, delta: i64) -> Result<u64, InferError> {
    if delta == 0 {
        return Err(InferError::ShapeData {
            input: 2,
            values: vec![delta],
            reason: "a range's delta must not be 0",
        });
    }
    let (span, step) = (i128::from(limit) - i128::from(start), i128::from(delta));
    let n = if (span > 0) == (step > 0) && span != 0 {
        (span.abs() + step.abs() - 1) / step.abs()
    } else {
        0
    };
    Ok(n.min(i128::from(u64::MAX)) as u64)
}

/// The scalar value of shape-data input `input` (a scalar or a one-element tensor).
fn scalar(inputs: &[&Shape], data: &[Option<&[i64]>], input: usize) -> Result<i64, InferError> {
    let values = data
        .get(input)
        .copied()
        .flatten()
        .ok_or(InferError::MissingShapeData { input })?;
    match values {
        [v] if inputs[input].checked_num_elements() == Some(1) => Ok(*v),
        _ => Err(InferError::Rank {
            input,
            shape: inputs[input].clone(),
            expected: "a scalar",
        }),
    }
}

impl OpDef for Range {
    fn name(&self) -> &'static str {
        "range"
    }
    fn arity(&self) -> (usize, usize) {
        (3, 3)
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        if !matches!(inputs[0], DType::F32 | DType::I32 | DType::I64) {
            return Err(DTypeError::at(0, "f32, i32 or i64"));
        }
        match inputs.iter().position(|&d| d != inputs[0]) {
            Some(i) => Err(DTypeError::at(i, "the same type as input 0")),
            None => Ok(inputs[0]),
        }
    }
    /// Integer inputs only: float values are not carried on the host, so a float range's
    /// length is not known before it runs.
    fn infer(&self, inputs: &[&Shape], data: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        let start = scalar(inputs, data, 0)?;
        let limit = scalar(inputs, data, 1)?;
        let delta = scalar(inputs, data, 2)?;
        Ok(Shape(vec![range_len(start, limit, delta)?]))
    }
    fn shape_data_inputs(&self) -> &'static [usize] {
        &[0, 1, 2]
    }
    fn reads_input(&self, pos: usize) -> bool {
        pos == 0 || pos == 2
    }
    /// `start + i * delta` (integers wrapped to the type, floats in f64 then rounded).
    fn reference(
        &self,
        inputs: &[&RefTensor],
        out: &Shape,
        dtype: DType,
    ) -> Result<Values, RefError> {
        let n = out.checked_num_elements().unwrap_or(0) as i64;
        Ok(match (&inputs[0].values, &inputs[2].values) {
            (Values::Int(s), Values::Int(d)) => {
                let (s, d) = (
                    s.first().copied().unwrap_or(0),
                    d.first().copied().unwrap_or(0),
                );
                Values::Int(
                    (0..n)
                        .map(|i| wrap(dtype, s.wrapping_add(i.wrapping_mul(d))))
                        .collect(),
                )
            }
            (Values::F32(s), Values::F32(d)) => {
                let s = f64::from(s.first().copied().unwrap_or(0.0));
                let d = f64::from(d.first().copied().unwrap_or(0.0));
                Values::F32((0..n).map(|i| (s + i as f64 * d) as f32).collect())
            }
            _ => {
                return Err(RefError::Unsupported {
                    op: "range",
                    dtype: inputs[2].dtype,
                })
            }
        })
    }
    fn host_evaluable(&self) -> bool {
        true
    }
    fn host_value(&self, _: &[&Shape], values: &[&[i64]], out: &Shape) -> Option<Vec<i64>> {
        let (s, d) = (*values[0].first()?, *values[2].first()?);
        let n = out.checked_num_elements()? as i64;
        Some((0..n).map(|i| s.wrapping_add(i.wrapping_mul(d))).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(d: &[u64]) -> Shape {
        Shape(d.to_vec())
    }

    #[test]
    fn range_lengths_follow_onnx() {
        assert_eq!(range_len(0, 5, 1).unwrap(), 5);
        assert_eq!(range_len(0, 5, 2).unwrap(), 3);
        assert_eq!(range_len(10, 4, -3).unwrap(), 2, "10, 7");
        assert_eq!(range_len(5, 0, 1).unwrap(), 0);
        assert_eq!(range_len(3, 3, 1).unwrap(), 0);
        assert!(range_len(0, 5, 0).is_err());
        let r = Range.infer(
            &[&s(&[]), &s(&[]), &s(&[1])],
            &[Some(&[1]), Some(&[7]), Some(&[2])],
        );
        assert_eq!(r.unwrap(), s(&[3]));
        let missing = Range.infer(
            &[&s(&[]), &s(&[]), &s(&[])],
            &[None, Some(&[7]), Some(&[2])],
        );
        assert!(matches!(
            missing,
            Err(InferError::MissingShapeData { input: 0 })
        ));
        assert!(Range.reads_input(0) && !Range.reads_input(1) && Range.reads_input(2));
    }

    #[test]
    fn constant_of_shape_rules() {
        let c = ConstantOfShape::from_le_bytes(DType::I64, &(-3i64).to_le_bytes()).unwrap();
        assert_eq!(c.element().len(), 8);
        let out = c.infer(&[&s(&[2])], &[Some(&[2, 3])]).unwrap();
        assert_eq!(out, s(&[2, 3]));
        assert_eq!(c.host_value(&[], &[], &out), Some(vec![-3; 6]));
        assert_eq!(
            c.infer(&[&s(&[0])], &[Some(&[])]).unwrap(),
            s(&[]),
            "scalar"
        );
        assert!(c.infer(&[&s(&[1])], &[Some(&[-1])]).is_err());
        assert!(ConstantOfShape::from_le_bytes(DType::F32, &[0; 8]).is_none());
        assert!(ConstantOfShape::from_le_bytes(DType::Q8_0, &[]).is_none());
        assert!(!c.reads_input(0), "the shape is never read on the device");
    }
}
