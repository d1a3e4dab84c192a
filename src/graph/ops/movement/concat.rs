//! Concat along an axis, and its inverse: split, one node per part.

use super::{shape_vector, AxisRange};
use crate::graph::ops::{axis_index, checked, same_plain_type, DTypeError, InferError, OpDef};
use crate::graph::reference::{index, RefError, RefTensor, Values};
use crate::graph::shape_data;
use crate::shape::{DType, Shape};

/// Concatenate along `axis` (negative counts from the end); all other dimensions equal.
/// Inputs: one or more tensors of one type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Concat {
    /// The axis.
    pub axis: i64,
}

/// Part `index` of `x` split along `axis` (ONNX `Split`, one node per output): by `sizes`
/// (non-negative, summing to the dimension) or the values of an optional second input (a
/// 1-D integer tensor, known on the host for the shape and read on the device for the
/// start), or else into `parts` chunks of `ceil(dim / parts)` with a smaller last one (opset
/// 18's `num_outputs` rule, equal parts when the dimension divides). Inputs: x, optional
/// sizes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitPart {
    /// The split axis (negative counts from the end).
    pub axis: i64,
    /// Explicit part sizes, or `None` for `parts` equal chunks.
    pub sizes: Option<Vec<i64>>,
    /// Number of parts (the length of `sizes` when given).
    pub parts: usize,
    /// Which part this node is.
    pub index: usize,
}

impl SplitPart {
    /// `(axis, start, len)` of this part along the resolved axis of `x`.
    ///
    /// # Errors
    /// [`InferError::Axis`]; [`InferError::Param`] for sizes that do not add up to the
    /// dimension, a negative size, no parts, or an index beyond them.
    pub fn range(&self, x: &Shape) -> Result<(usize, u64, u64), InferError> {
        self.range_with(x, self.sizes.as_deref())
    }

    /// [`SplitPart::range`] with the sizes given (`None`: equal parts).
    ///
    /// # Errors
    /// As [`SplitPart::range`].
    pub fn range_with(
        &self,
        x: &Shape,
        sizes: Option<&[i64]>,
    ) -> Result<(usize, u64, u64), InferError> {
        let axis = axis_index(self.axis, x.rank())?;
        let d = x.0[axis];
        let bad = |detail: String| InferError::Param {
            what: "split sizes do not fit the input",
            detail,
        };
        match sizes {
            Some(sizes) => {
                if sizes.iter().any(|&v| v < 0) || self.index >= sizes.len() {
                    return Err(bad(format!(
                        "part {} of sizes {sizes:?} (non-negative sizes, one per part)",
                        self.index
                    )));
                }
                let total = sizes.iter().map(|&v| v as u128).sum::<u128>();
                if total != u128::from(d) {
                    return Err(bad(format!(
                        "sizes {sizes:?} add up to {total}, dimension {axis} of {x} is {d}"
                    )));
                }
                let start = sizes[..self.index].iter().map(|&v| v as u64).sum();
                Ok((axis, start, sizes[self.index] as u64))
            }
            None => {
                if self.parts == 0 || self.index >= self.parts {
                    return Err(bad(format!("part {} of {}", self.index, self.parts)));
                }
                let chunk = d.div_ceil(self.parts as u64);
                let start = (self.index as u64).saturating_mul(chunk).min(d);
                Ok((axis, start, chunk.min(d - start)))
            }
        }
    }
}

impl OpDef for Concat {
    fn name(&self) -> &'static str {
        "concat"
    }
    fn arity(&self) -> (usize, usize) {
        (1, usize::MAX)
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        same_plain_type(inputs)
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        infer_concat(inputs, self.axis)
    }
    /// Output index `o` reads input `j` (whose slab along the axis holds `o[axis]`) at
    /// `o[axis]` minus the extents of the inputs before it.
    fn reference(&self, inputs: &[&RefTensor], out: &Shape, _: DType) -> Result<Values, RefError> {
        let axis = (self.axis + if self.axis < 0 { out.rank() as i64 } else { 0 }) as usize;
        // One (input, position) pick per output element, then the values by kind.
        let mut which = Vec::new();
        index::for_each(out, |_, o| {
            let mut at = o[axis];
            for (j, t) in inputs.iter().enumerate() {
                let extent = t.shape.dims()[axis];
                if at < extent {
                    let mut src = o.to_vec();
                    src[axis] = at;
                    which.push((j, index::linear(&src, &t.shape)));
                    return;
                }
                at -= extent;
            }
        });
        Ok(match &inputs[0].values {
            Values::F32(_) => {
                let mut v = Vec::with_capacity(which.len());
                for &(j, i) in &which {
                    v.push(inputs[j].floats("concat")?[i]);
                }
                Values::F32(v)
            }
            Values::Int(_) => {
                let mut v = Vec::with_capacity(which.len());
                for &(j, i) in &which {
                    v.push(inputs[j].ints("concat")?[i]);
                }
                Values::Int(v)
            }
        })
    }
    fn host_evaluable(&self) -> bool {
        true
    }
    fn host_value(&self, shapes: &[&Shape], values: &[&[i64]], _: &Shape) -> Option<Vec<i64>> {
        let axis = axis_index(self.axis, shapes.first()?.rank()).ok()?;
        shape_data::concat(values, shapes, axis)
    }
}

impl SplitPart {
    /// The sizes: the op's own, or the second input's values.
    fn sizes_of<'a>(
        &'a self,
        inputs: &[&Shape],
        data: &[Option<&'a [i64]>],
    ) -> Result<Option<&'a [i64]>, InferError> {
        if inputs.len() < 2 {
            return Ok(self.sizes.as_deref());
        }
        shape_vector(inputs, data, 1).map(Some)
    }
}

impl OpDef for SplitPart {
    fn name(&self) -> &'static str {
        "split_part"
    }
    fn arity(&self) -> (usize, usize) {
        (1, 2)
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        if inputs.len() > 1 && !matches!(inputs[1], DType::I32 | DType::I64) {
            return Err(DTypeError::at(1, "i32 or i64 (split sizes)"));
        }
        same_plain_type(&inputs[..1])
    }
    fn shape_data_inputs(&self) -> &'static [usize] {
        &[1]
    }
    fn reads_input(&self, _: usize) -> bool {
        true
    }
    fn infer(&self, inputs: &[&Shape], data: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        let sizes = self.sizes_of(inputs, data)?;
        let (axis, _, len) = self.range_with(inputs[0], sizes)?;
        let mut out = inputs[0].clone();
        out.0[axis] = len;
        Ok(out)
    }
    /// Output index `o` reads `o` shifted by the part's start along the axis.
    fn reference(&self, inputs: &[&RefTensor], out: &Shape, _: DType) -> Result<Values, RefError> {
        let x = inputs[0];
        let sizes = match inputs.get(1) {
            Some(t) => Some(t.ints("split_part")?),
            None => self.sizes.as_deref(),
        };
        let Ok((axis, start, _)) = self.range_with(&x.shape, sizes) else {
            return Ok(Values::F32(Vec::new()));
        };
        let mut picks = Vec::new();
        index::for_each(out, |_, o| {
            let mut src = o.to_vec();
            src[axis] += start;
            picks.push(Some(index::linear(&src, &x.shape)));
        });
        Ok(x.values.pick(&picks))
    }
    fn host_evaluable(&self) -> bool {
        true
    }
    fn host_value(&self, shapes: &[&Shape], values: &[&[i64]], _: &Shape) -> Option<Vec<i64>> {
        let sizes = values.get(1).copied().or(self.sizes.as_deref());
        let (axis, start, len) = self.range_with(shapes[0], sizes).ok()?;
        let ranges: Vec<AxisRange> = shapes[0]
            .dims()
            .iter()
            .enumerate()
            .map(|(a, &d)| {
                if a == axis {
                    AxisRange {
                        start,
                        step: 1,
                        len,
                    }
                } else {
                    AxisRange {
                        start: 0,
                        step: 1,
                        len: d,
                    }
                }
            })
            .collect();
        shape_data::slice(values[0], shapes[0], &ranges)
    }
}

/// Output shape of a concat along `axis` (negative counts from the end).
///
/// # Errors
/// [`InferError::NoInputs`], [`InferError::Axis`], or [`InferError::Mismatch`] naming the first
/// input and the one that differs.
pub fn infer_concat(inputs: &[&Shape], axis: i64) -> Result<Shape, InferError> {
    let first = *inputs.first().ok_or(InferError::NoInputs)?;
    let axis = axis_index(axis, first.rank())?;
    let mut out = first.clone();
    for s in &inputs[1..] {
        let same_elsewhere = s.rank() == first.rank()
            && (0..first.rank()).all(|i| i == axis || s.0[i] == first.0[i]);
        if !same_elsewhere {
            return Err(InferError::Mismatch {
                what: "concat inputs differ outside the concat axis",
                left: first.clone(),
                right: (*s).clone(),
            });
        }
        out.0[axis] = out.0[axis]
            .checked_add(s.0[axis])
            .ok_or(InferError::Overflow {
                shape: out.to_string(),
            })?;
    }
    checked(out)
}
