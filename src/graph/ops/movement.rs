//! Data movement: reshape, transpose, concat, slice, gather, and `shape_of`.

use super::{checked, is_index, same_plain_type, DTypeError, InferError, OpDef};
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

/// Reshape to the shape held in the values of a 1-D integer tensor (same `0`/`-1` rules).
/// Inputs: x, shape (an integer tensor whose values are a shape-inference dependency).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReshapeTo;

/// Permute dimensions: output dimension `i` is input dimension `perm[i]`. Inputs: x.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transpose {
    /// The permutation.
    pub perm: Vec<usize>,
}

/// Concatenate along `axis`; all other dimensions equal. Inputs: one or more tensors of one
/// type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Concat {
    /// The axis.
    pub axis: usize,
}

/// Slice listed axes with `start:end:step` (ONNX rules: negative indices count from the end,
/// out-of-range indices clamp, steps positive). Inputs: x.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slice {
    /// The axes sliced.
    pub axes: Vec<usize>,
    /// Start per listed axis.
    pub starts: Vec<i64>,
    /// End (exclusive) per listed axis; `i64::MAX` means to the end.
    pub ends: Vec<i64>,
    /// Step per listed axis, at least 1.
    pub steps: Vec<i64>,
}

/// Embedding lookup along axis 0: `out[i.., d..] = table[ids[i..], d..]`. Ids out of range
/// (negative included) give zeros. Inputs: table, ids (i32, u32 or i64). An f16, q4_1 or
/// q8_0 table (a model's embedding kept in its file format) gives f32 rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gather;

/// The shape of its input as a 1-D i32 tensor. Its values are known on the host once shapes
/// are, so they feed shape inference of later nodes without a GPU round trip. Inputs: x.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShapeOf;

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
        infer_reshape(inputs[0], &self.target)
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
        let values = data
            .get(1)
            .copied()
            .flatten()
            .ok_or(InferError::MissingShapeData { input: 1 })?;
        if inputs[1].rank() != 1 {
            return Err(InferError::Rank {
                input: 1,
                shape: inputs[1].clone(),
                expected: "a 1-D shape tensor",
            });
        }
        infer_reshape(inputs[0], values)
    }
    fn shape_data_inputs(&self) -> &'static [usize] {
        &[1]
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
        infer_transpose(inputs[0], &self.perm)
    }
    /// Output index `o` reads input index `i` with `i[perm[k]] = o[k]`.
    fn reference(&self, inputs: &[&RefTensor], out: &Shape, _: DType) -> Result<Values, RefError> {
        let x = inputs[0];
        let mut picks = Vec::new();
        let mut src = vec![0u64; x.shape.rank()];
        index::for_each(out, |_, o| {
            for (k, &p) in self.perm.iter().enumerate() {
                src[p] = o[k];
            }
            picks.push(Some(index::linear(&src, &x.shape)));
        });
        Ok(x.values.pick(&picks))
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
        // Flatten every input into one list of (input, position) picks, then gather per kind.
        let mut which = Vec::new();
        index::for_each(out, |_, o| {
            let mut at = o[self.axis];
            for (j, t) in inputs.iter().enumerate() {
                let extent = t.shape.dims()[self.axis];
                if at < extent {
                    let mut src = o.to_vec();
                    src[self.axis] = at;
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
        shape_data::concat(values, shapes, self.axis)
    }
}

impl OpDef for Slice {
    fn name(&self) -> &'static str {
        "slice"
    }
    fn arity(&self) -> (usize, usize) {
        (1, 1)
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        same_plain_type(inputs)
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        slice_ranges(inputs[0], &self.axes, &self.starts, &self.ends, &self.steps)
            .map(|r| Shape(r.iter().map(|r| r.len).collect()))
    }
    /// Output index `o` reads `start + o * step` on listed axes, with the ONNX start rule
    /// (negative counts from the end, then clamp to `[0, dim]`) computed here again.
    fn reference(&self, inputs: &[&RefTensor], out: &Shape, _: DType) -> Result<Values, RefError> {
        let x = inputs[0];
        let rank = x.shape.rank();
        let mut start = vec![0u64; rank];
        let mut step = vec![1u64; rank];
        for (k, &axis) in self.axes.iter().enumerate() {
            let d = x.shape.dims()[axis] as i128;
            let s = i128::from(self.starts[k]);
            let s = if s < 0 { s + d } else { s };
            start[axis] = s.clamp(0, d) as u64;
            step[axis] = self.steps[k].max(1) as u64;
        }
        let mut picks = Vec::new();
        let mut src = vec![0u64; rank];
        index::for_each(out, |_, o| {
            for a in 0..rank {
                src[a] = start[a] + o[a] * step[a];
            }
            picks.push(Some(index::linear(&src, &x.shape)));
        });
        Ok(x.values.pick(&picks))
    }
    fn host_evaluable(&self) -> bool {
        true
    }
    fn host_value(&self, shapes: &[&Shape], values: &[&[i64]], _: &Shape) -> Option<Vec<i64>> {
        let r = slice_ranges(shapes[0], &self.axes, &self.starts, &self.ends, &self.steps).ok()?;
        shape_data::slice(values[0], shapes[0], &r)
    }
}

impl OpDef for Gather {
    fn name(&self) -> &'static str {
        "gather"
    }
    fn arity(&self) -> (usize, usize) {
        (2, 2)
    }
    /// Any table type, integer ids. f16 and block-quantized (q4_1, q8_0) tables give f32
    /// rows, dequantized by the kernel; other tables keep their type.
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        if !is_index(inputs[1]) {
            return Err(DTypeError::at(1, "i32, u32 or i64 (ids)"));
        }
        Ok(match inputs[0] {
            DType::F16 | DType::Q4_1 | DType::Q8_0 => DType::F32,
            d => d,
        })
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        infer_gather(inputs[0], inputs[1])
    }
    /// Output index `(i.., d..)` reads table row `ids[i..]` at `d..`, zeros when out of range.
    fn reference(&self, inputs: &[&RefTensor], out: &Shape, _: DType) -> Result<Values, RefError> {
        let (table, ids) = (inputs[0], inputs[1]);
        let id_values = ids.ints("gather")?;
        let id_rank = ids.shape.rank();
        let rows = table.shape.dims().first().copied().unwrap_or(0);
        let mut picks = Vec::new();
        let mut src = vec![0u64; table.shape.rank()];
        index::for_each(out, |_, o| {
            let id = id_values[index::linear(&o[..id_rank], &ids.shape)];
            picks.push(u64::try_from(id).ok().filter(|&r| r < rows).map(|r| {
                src[0] = r;
                src[1..].copy_from_slice(&o[id_rank..]);
                index::linear(&src, &table.shape)
            }));
        });
        Ok(table.values.pick(&picks))
    }
    fn host_evaluable(&self) -> bool {
        true
    }
    fn host_value(&self, shapes: &[&Shape], values: &[&[i64]], _: &Shape) -> Option<Vec<i64>> {
        shape_data::gather(values[0], shapes[0], values[1])
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
        Ok(DType::I32)
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        Ok(Shape(vec![inputs[0].rank() as u64]))
    }
    fn reads_values(&self) -> bool {
        false
    }
    fn reference(&self, inputs: &[&RefTensor], _: &Shape, _: DType) -> Result<Values, RefError> {
        Ok(Values::Int(
            inputs[0].shape.dims().iter().map(|&d| d as i64).collect(),
        ))
    }
    fn host_evaluable(&self) -> bool {
        true
    }
    fn host_value(&self, shapes: &[&Shape], _: &[&[i64]], _: &Shape) -> Option<Vec<i64>> {
        Some(shapes[0].dims().iter().map(|&d| d as i64).collect())
    }
}

/// Output shape of a reshape. `0` copies the input dimension at the same position, `-1` is
/// inferred from the element count (at most one).
///
/// # Errors
/// [`InferError::Reshape`] when the target is malformed or the element counts differ.
pub fn infer_reshape(x: &Shape, target: &[i64]) -> Result<Shape, InferError> {
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

/// Output shape of a concat along `axis`.
///
/// # Errors
/// [`InferError::NoInputs`], [`InferError::Axis`], or [`InferError::Mismatch`] naming the first
/// input and the one that differs.
pub fn infer_concat(inputs: &[&Shape], axis: usize) -> Result<Shape, InferError> {
    let first = *inputs.first().ok_or(InferError::NoInputs)?;
    if axis >= first.rank() {
        return Err(InferError::Axis {
            axis: axis as i64,
            rank: first.rank(),
        });
    }
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

/// The elements a slice keeps along one axis: `start, start + step, ...`, `len` of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AxisRange {
    /// First index kept.
    pub start: u64,
    /// Stride between kept indices, at least 1.
    pub step: u64,
    /// Number of indices kept.
    pub len: u64,
}

/// Per-axis ranges of a slice (every axis of `x`; unlisted axes are kept whole). ONNX rules:
/// negative start/end count from the end, then clamp to `[0, dim]`.
///
/// # Errors
/// [`InferError::Slice`] for lists of different lengths or a step < 1, [`InferError::Axis`] for
/// an axis out of range or listed twice.
pub fn slice_ranges(
    x: &Shape,
    axes: &[usize],
    starts: &[i64],
    ends: &[i64],
    steps: &[i64],
) -> Result<Vec<AxisRange>, InferError> {
    if axes.len() != starts.len() || axes.len() != ends.len() || axes.len() != steps.len() {
        return Err(InferError::Slice {
            reason: "axes, starts, ends and steps must have the same length",
        });
    }
    let mut out: Vec<AxisRange> =
        x.0.iter()
            .map(|&d| AxisRange {
                start: 0,
                step: 1,
                len: d,
            })
            .collect();
    let mut seen = vec![false; x.rank()];
    for (((&axis, &start), &end), &step) in axes.iter().zip(starts).zip(ends).zip(steps) {
        if axis >= x.rank() || std::mem::replace(&mut seen[axis], true) {
            return Err(InferError::Axis {
                axis: axis as i64,
                rank: x.rank(),
            });
        }
        if step < 1 {
            return Err(InferError::Slice {
                reason: "steps must be at least 1",
            });
        }
        let d = x.0[axis].min(i64::MAX as u64) as i64;
        let clamp = |v: i64| -> i64 {
            let v = if v < 0 { v.saturating_add(d) } else { v };
            v.clamp(0, d)
        };
        let (s, e) = (clamp(start), clamp(end));
        let len = if e > s { (e - s + step - 1) / step } else { 0 };
        out[axis] = AxisRange {
            start: s as u64,
            step: step as u64,
            len: len as u64,
        };
    }
    Ok(out)
}

/// Output shape of a gather along axis 0: `ids.shape ++ table.shape[1..]`.
///
/// # Errors
/// [`InferError::Rank`] for a scalar table.
pub fn infer_gather(table: &Shape, ids: &Shape) -> Result<Shape, InferError> {
    if table.rank() == 0 {
        return Err(InferError::Rank {
            input: 0,
            shape: table.clone(),
            expected: "rank >= 1 for the gathered table",
        });
    }
    let mut out = ids.0.clone();
    out.extend_from_slice(&table.0[1..]);
    checked(Shape(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(d: &[u64]) -> Shape {
        Shape(d.to_vec())
    }

    #[test]
    fn reshape_rules() {
        assert_eq!(
            infer_reshape(&s(&[2, 3, 4]), &[0, -1]).unwrap(),
            s(&[2, 12])
        );
        assert_eq!(infer_reshape(&s(&[2, 3, 4]), &[4, 6]).unwrap(), s(&[4, 6]));
        assert!(infer_reshape(&s(&[2, 3]), &[-1, -1]).is_err());
        assert!(infer_reshape(&s(&[2, 3]), &[4, 2]).is_err());
        assert!(infer_reshape(&s(&[2, 3]), &[-2, 3]).is_err());
        assert!(infer_reshape(&s(&[2, 3]), &[0, 0, 0]).is_err());
        assert_eq!(infer_reshape(&s(&[0, 3]), &[3, -1]).unwrap(), s(&[3, 0]));
    }

    #[test]
    fn transpose_concat_slice_gather() {
        assert_eq!(
            infer_transpose(&s(&[2, 3, 4]), &[2, 0, 1]).unwrap(),
            s(&[4, 2, 3])
        );
        assert!(infer_transpose(&s(&[2, 3]), &[0, 0]).is_err());
        assert!(infer_transpose(&s(&[2, 3]), &[0]).is_err());
        assert_eq!(
            infer_concat(&[&s(&[1, 2, 4]), &s(&[1, 3, 4])], 1).unwrap(),
            s(&[1, 5, 4])
        );
        let e = infer_concat(&[&s(&[1, 2, 4]), &s(&[1, 3, 5])], 1).unwrap_err();
        assert!(e.to_string().contains("1x2x4 vs 1x3x5"), "{e}");
        assert!(infer_concat(&[&s(&[2])], 1).is_err());
        let r = slice_ranges(&s(&[10, 4]), &[0], &[-3], &[i64::MAX], &[1]).unwrap();
        assert_eq!(
            r[0],
            AxisRange {
                start: 7,
                step: 1,
                len: 3
            }
        );
        assert_eq!(r[1].len, 4);
        let r = slice_ranges(&s(&[10]), &[0], &[1], &[8], &[3]).unwrap();
        assert_eq!(
            r[0],
            AxisRange {
                start: 1,
                step: 3,
                len: 3
            }
        );
        assert_eq!(
            slice_ranges(&s(&[10]), &[0], &[5], &[2], &[1]).unwrap()[0].len,
            0
        );
        assert!(slice_ranges(&s(&[10]), &[0], &[0], &[2], &[0]).is_err());
        assert!(slice_ranges(&s(&[10]), &[1], &[0], &[2], &[1]).is_err());
        assert_eq!(
            infer_gather(&s(&[50, 8]), &s(&[2, 3])).unwrap(),
            s(&[2, 3, 8])
        );
        assert!(infer_gather(&s(&[]), &s(&[2])).is_err());
    }
}
