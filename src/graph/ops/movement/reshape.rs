//! Reshape (static and fed targets), transpose and expand: the same elements in a new shape
//! or order.

use super::{shape_from_values, shape_vector};
use crate::graph::ops::elementwise::broadcast;
use crate::graph::ops::{is_index, same_plain_type, DTypeError, InferError, OpDef};
use crate::graph::reference::{index, RefError, RefTensor, Values};
use crate::graph::shape_data;
use crate::shape::{DType, Shape};

/// Reshape to a static target: `0` copies the input dimension at that position, `-1` is
/// inferred (at most one). Inputs: x (any type but block formats).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reshape {
    /// Target dimensions.
    pub target: Vec<i64>,
}

/// Reshape to the shape held in the values of a 1-D integer tensor: `-1` is inferred, `0`
/// copies the input dimension unless `allow_zero` (ONNX `allowzero = 1`: a 0 is a zero
/// extent). Inputs: x, shape (an integer tensor whose values are a shape-inference
/// dependency).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReshapeTo {
    /// `0` in the target means an extent of zero instead of "copy the input dimension".
    pub allow_zero: bool,
}

/// Permute dimensions: output dimension `i` is input dimension `perm[i]`; an empty `perm`
/// reverses the dimensions (ONNX's default). Inputs: x.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transpose {
    /// The permutation, or empty for the reversal.
    pub perm: Vec<usize>,
}

/// Broadcast `x` to a shape held in a 1-D integer tensor (ONNX `Expand`: the two shapes
/// broadcast both ways, so a target dimension of 1 keeps x's). Inputs: x, shape (shape
/// data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expand;

impl Transpose {
    /// The permutation for a rank: `perm`, or the reversal when `perm` is empty.
    pub fn perm_for(&self, rank: usize) -> Vec<usize> {
        if self.perm.is_empty() {
            (0..rank).rev().collect()
        } else {
            self.perm.clone()
        }
    }
}

impl OpDef for Reshape {
    fn name(&self) -> &'static str {
        "reshape"
    }
    fn arity(&self) -> (usize, usize) {
        (1, 1)
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        same_plain_type(inputs)
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        infer_reshape(inputs[0], &self.target, false)
    }
    fn is_view(&self) -> bool {
        true
    }
    fn reference(&self, inputs: &[&RefTensor], _: &Shape, _: DType) -> Result<Values, RefError> {
        Ok(inputs[0].values.clone())
    }
    fn host_evaluable(&self) -> bool {
        true
    }
    fn host_value(&self, _: &[&Shape], values: &[&[i64]], _: &Shape) -> Option<Vec<i64>> {
        Some(values[0].to_vec())
    }
}

impl OpDef for ReshapeTo {
    fn name(&self) -> &'static str {
        "reshape_to"
    }
    fn arity(&self) -> (usize, usize) {
        (2, 2)
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        if !is_index(inputs[1]) {
            return Err(DTypeError::at(1, "i32, u32 or i64 (a shape tensor)"));
        }
        same_plain_type(&inputs[..1])
    }
    fn infer(&self, inputs: &[&Shape], data: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        let values = shape_vector(inputs, data, 1)?;
        infer_reshape(inputs[0], values, self.allow_zero)
    }
    fn shape_data_inputs(&self) -> &'static [usize] {
        &[1]
    }
    fn is_view(&self) -> bool {
        true
    }
    fn reference(&self, inputs: &[&RefTensor], _: &Shape, _: DType) -> Result<Values, RefError> {
        Ok(inputs[0].values.clone())
    }
    fn host_evaluable(&self) -> bool {
        true
    }
    fn host_value(&self, _: &[&Shape], values: &[&[i64]], _: &Shape) -> Option<Vec<i64>> {
        Some(values[0].to_vec())
    }
}

impl OpDef for Transpose {
    fn name(&self) -> &'static str {
        "transpose"
    }
    fn arity(&self) -> (usize, usize) {
        (1, 1)
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        same_plain_type(inputs)
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        infer_transpose(inputs[0], &self.perm_for(inputs[0].rank()))
    }
    /// Output index `o` reads input index `i` with `i[perm[k]] = o[k]`.
    fn reference(&self, inputs: &[&RefTensor], out: &Shape, _: DType) -> Result<Values, RefError> {
        let x = inputs[0];
        let perm = self.perm_for(x.shape.rank());
        let mut picks = Vec::new();
        let mut src = vec![0u64; x.shape.rank()];
        index::for_each(out, |_, o| {
            for (k, &p) in perm.iter().enumerate() {
                src[p] = o[k];
            }
            picks.push(Some(index::linear(&src, &x.shape)));
        });
        Ok(x.values.pick(&picks))
    }
    fn host_evaluable(&self) -> bool {
        true
    }
    fn host_value(&self, shapes: &[&Shape], values: &[&[i64]], out: &Shape) -> Option<Vec<i64>> {
        shape_data::transpose(values[0], shapes[0], &self.perm_for(shapes[0].rank()), out)
    }
}

impl OpDef for Expand {
    fn name(&self) -> &'static str {
        "expand"
    }
    fn arity(&self) -> (usize, usize) {
        (2, 2)
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        if !is_index(inputs[1]) {
            return Err(DTypeError::at(1, "i32, u32 or i64 (a shape tensor)"));
        }
        same_plain_type(&inputs[..1])
    }
    fn infer(&self, inputs: &[&Shape], data: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        let target = shape_from_values(shape_vector(inputs, data, 1)?, 1)?;
        broadcast(inputs[0], &target)
    }
    fn shape_data_inputs(&self) -> &'static [usize] {
        &[1]
    }
    /// Output index `o` reads x at `o` broadcast to x's shape.
    fn reference(&self, inputs: &[&RefTensor], out: &Shape, _: DType) -> Result<Values, RefError> {
        let x = inputs[0];
        let mut picks = Vec::new();
        index::for_each(out, |_, o| {
            picks.push(Some(index::broadcast(o, &x.shape)));
        });
        Ok(x.values.pick(&picks))
    }
    fn host_evaluable(&self) -> bool {
        true
    }
    fn host_value(&self, shapes: &[&Shape], values: &[&[i64]], out: &Shape) -> Option<Vec<i64>> {
        shape_data::broadcast_zip(values[0], shapes[0], values[0], shapes[0], out, |a, _| a)
    }
}

/// Output shape of a reshape. `-1` is inferred from the element count (at most one); `0`
/// copies the input dimension at the same position, or is a zero extent when `allow_zero`
/// (then a `-1` beside a 0 is an error, as in ONNX).
///
/// # Errors
/// [`InferError::Reshape`] when the target is malformed or the element counts differ.
pub fn infer_reshape(x: &Shape, target: &[i64], allow_zero: bool) -> Result<Shape, InferError> {
    let err = |reason| InferError::Reshape {
        from: x.clone(),
        target: target.to_vec(),
        reason,
    };
    let total = x
        .checked_num_elements()
        .ok_or_else(|| err("input overflows"))?;
    let mut out = Vec::with_capacity(target.len());
    let mut infer_at = None;
    for (i, &t) in target.iter().enumerate() {
        match t {
            -1 => {
                if infer_at.replace(i).is_some() {
                    return Err(err("more than one -1"));
                }
                out.push(1);
            }
            0 if allow_zero => out.push(0),
            0 => out.push(*x.0.get(i).ok_or_else(|| err("0 beyond the input rank"))?),
            t if t > 0 => out.push(t as u64),
            _ => return Err(err("negative dimension other than -1")),
        }
    }
    let known = out
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .ok_or_else(|| err("target overflows"))?;
    if let Some(i) = infer_at {
        if known == 0 || total % known != 0 {
            return Err(err("element count not divisible by the known dimensions"));
        }
        out[i] = total / known;
    } else if known != total {
        return Err(err("element counts differ"));
    }
    Ok(Shape(out))
}

/// Output shape of a transpose: output dimension `i` is input dimension `perm[i]`.
///
/// # Errors
/// [`InferError::Permutation`] when `perm` is not a permutation of `0..rank`.
pub fn infer_transpose(x: &Shape, perm: &[usize]) -> Result<Shape, InferError> {
    let mut seen = vec![false; x.rank()];
    if perm.len() != x.rank() {
        return Err(InferError::Permutation {
            perm: perm.to_vec(),
            rank: x.rank(),
        });
    }
    for &p in perm {
        if p >= x.rank() || std::mem::replace(&mut seen[p], true) {
            return Err(InferError::Permutation {
                perm: perm.to_vec(),
                rank: x.rank(),
            });
        }
    }
    Ok(Shape(perm.iter().map(|&p| x.0[p]).collect()))
}
