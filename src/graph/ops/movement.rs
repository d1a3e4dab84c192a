//! Data movement: reshape, transpose, concat, slice, split, gather, expand, and `shape_of`.

use super::elementwise::broadcast;
use super::{
    axes_indices, axis_index, checked, is_index, same_plain_type, DTypeError, InferError, OpDef,
};
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

/// Concatenate along `axis` (negative counts from the end); all other dimensions equal.
/// Inputs: one or more tensors of one type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Concat {
    /// The axis.
    pub axis: i64,
}

/// Slice listed axes with `start:end:step` (ONNX rules: negative indices count from the end,
/// out-of-range indices clamp, a negative step walks backwards from `start` down to
/// `end`, exclusive). Inputs: x.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slice {
    /// The axes sliced (negative count from the end).
    pub axes: Vec<i64>,
    /// Start per listed axis.
    pub starts: Vec<i64>,
    /// End (exclusive) per listed axis; `i64::MAX` means to the end (`i64::MIN` to the
    /// beginning, for a negative step).
    pub ends: Vec<i64>,
    /// Step per listed axis, not 0.
    pub steps: Vec<i64>,
}

/// A slice whose starts, ends, and optional steps and axes are 1-D integer tensors (ONNX
/// `Slice` with parameters computed at run time, or fed): the same rules as [`Slice`]. The
/// shape rule reads their values on the host; the kernel reads starts, steps and axes from
/// their buffers, so a recorded dispatch stays right when they change. Inputs: x, starts,
/// ends, optional steps, optional axes (all parameters of one type, i32 or i64; axes as an
/// input only with steps, and only when `axes` is `None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceTo {
    /// The axes the parameters apply to (negative count from the end); `None`: the fifth
    /// input's values, or `0..n` for `n` starts without it.
    pub axes: Option<Vec<i64>>,
}

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
    /// (negative counts from the end, then clamp to `[0, dim]`, or to `[0, dim - 1]` for a
    /// negative step) computed here again.
    fn reference(&self, inputs: &[&RefTensor], out: &Shape, _: DType) -> Result<Values, RefError> {
        let x = inputs[0];
        let rank = x.shape.rank();
        let mut start = vec![0i128; rank];
        let mut step = vec![1i128; rank];
        for (k, &axis) in self.axes.iter().enumerate() {
            let a = (axis + if axis < 0 { rank as i64 } else { 0 }) as usize;
            let d = x.shape.dims()[a] as i128;
            let s = i128::from(self.starts[k]);
            let s = if s < 0 { s + d } else { s };
            let top = if self.steps[k] < 0 { d - 1 } else { d };
            start[a] = s.min(top).max(0);
            step[a] = i128::from(self.steps[k]);
        }
        let mut picks = Vec::new();
        let mut src = vec![0u64; rank];
        index::for_each(out, |_, o| {
            for a in 0..rank {
                src[a] = (start[a] + i128::from(o[a]) * step[a]) as u64;
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

impl SliceTo {
    /// The per-axis ranges for these inputs and host values.
    ///
    /// # Errors
    /// [`InferError::MissingShapeData`] when starts, ends or steps are not known on the host;
    /// as [`slice_ranges`] otherwise.
    pub fn ranges(
        &self,
        inputs: &[&Shape],
        data: &[Option<&[i64]>],
    ) -> Result<Vec<AxisRange>, InferError> {
        let starts = shape_vector(inputs, data, 1)?;
        let ends = shape_vector(inputs, data, 2)?;
        let ones;
        let steps = if inputs.len() > 3 {
            shape_vector(inputs, data, 3)?
        } else {
            ones = vec![1; starts.len()];
            &ones
        };
        let default_axes;
        let axes = match (&self.axes, inputs.len() > 4) {
            (Some(a), false) => a.as_slice(),
            (None, true) => shape_vector(inputs, data, 4)?,
            (None, false) => {
                default_axes = (0..starts.len() as i64).collect::<Vec<_>>();
                &default_axes
            }
            (Some(_), true) => {
                return Err(InferError::Slice {
                    reason: "axes are given both by the op and as an input",
                })
            }
        };
        slice_ranges(inputs[0], axes, starts, ends, steps)
    }
}

impl OpDef for SliceTo {
    fn name(&self) -> &'static str {
        "slice_to"
    }
    fn arity(&self) -> (usize, usize) {
        (3, 5)
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        if let Some(i) = (1..inputs.len()).find(|&i| !matches!(inputs[i], DType::I32 | DType::I64))
        {
            return Err(DTypeError::at(i, "i32 or i64 (slice parameters)"));
        }
        if let Some(i) = (2..inputs.len()).find(|&i| inputs[i] != inputs[1]) {
            return Err(DTypeError::at(i, "the type of the starts"));
        }
        same_plain_type(&inputs[..1])
    }
    fn infer(&self, inputs: &[&Shape], data: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        self.ranges(inputs, data)
            .map(|r| Shape(r.iter().map(|r| r.len).collect()))
    }
    fn shape_data_inputs(&self) -> &'static [usize] {
        &[1, 2, 3, 4]
    }
    fn reads_input(&self, pos: usize) -> bool {
        pos != 2
    }
    /// As [`Slice`]'s, with the parameters taken from the inputs' values.
    fn reference(
        &self,
        inputs: &[&RefTensor],
        out: &Shape,
        dtype: DType,
    ) -> Result<Values, RefError> {
        let ints = |i: usize| -> Result<Vec<i64>, RefError> {
            match inputs.get(i) {
                Some(t) => t.ints("slice_to").map(<[i64]>::to_vec),
                None => Ok(vec![1; inputs[1].values.len()]),
            }
        };
        let starts = ints(1)?;
        let axes = match (&self.axes, inputs.get(4)) {
            (_, Some(a)) => a.ints("slice_to")?.to_vec(),
            (Some(a), None) => a.clone(),
            (None, None) => (0..starts.len() as i64).collect(),
        };
        let op = Slice {
            axes,
            starts,
            ends: ints(2)?,
            steps: ints(3)?,
        };
        op.reference(&inputs[..1], out, dtype)
    }
    fn host_evaluable(&self) -> bool {
        true
    }
    fn host_value(&self, shapes: &[&Shape], values: &[&[i64]], _: &Shape) -> Option<Vec<i64>> {
        let data: Vec<Option<&[i64]>> = values.iter().map(|v| Some(*v)).collect();
        let r = self.ranges(shapes, &data).ok()?;
        shape_data::slice(values[0], shapes[0], &r)
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

/// The elements a slice keeps along one axis: `start, start + step, ...`, `len` of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AxisRange {
    /// First index kept.
    pub start: u64,
    /// Signed distance between kept indices, not 0 (negative: backwards).
    pub step: i64,
    /// Number of indices kept.
    pub len: u64,
}

/// Per-axis ranges of a slice (every axis of `x`; unlisted axes are kept whole). ONNX rules:
/// negative start/end count from the end; with a positive step both clamp to `[0, dim]`, with
/// a negative step start clamps to `[0, dim - 1]` and end to `[-1, dim - 1]`.
///
/// # Errors
/// [`InferError::Slice`] for lists of different lengths or a zero step, [`InferError::Axes`]
/// for an axis out of range or listed twice.
pub fn slice_ranges(
    x: &Shape,
    axes: &[i64],
    starts: &[i64],
    ends: &[i64],
    steps: &[i64],
) -> Result<Vec<AxisRange>, InferError> {
    if axes.len() != starts.len() || axes.len() != ends.len() || axes.len() != steps.len() {
        return Err(InferError::Slice {
            reason: "axes, starts, ends and steps must have the same length",
        });
    }
    let resolved = axes_indices(axes, x, x.rank())?;
    let mut out: Vec<AxisRange> =
        x.0.iter()
            .map(|&d| AxisRange {
                start: 0,
                step: 1,
                len: d,
            })
            .collect();
    for (((&axis, &start), &end), &step) in resolved.iter().zip(starts).zip(ends).zip(steps) {
        if step == 0 {
            return Err(InferError::Slice {
                reason: "steps must not be 0",
            });
        }
        let d = i128::from(x.0[axis].min(i64::MAX as u64) as i64);
        let from_end = |v: i64| {
            let v = i128::from(v);
            if v < 0 {
                v + d
            } else {
                v
            }
        };
        let (s, e) = (from_end(start), from_end(end));
        let step = i128::from(step);
        let (s, len) = if step > 0 {
            let (s, e) = (s.clamp(0, d), e.clamp(0, d));
            (s, if e > s { (e - s + step - 1) / step } else { 0 })
        } else if d == 0 {
            (0, 0)
        } else {
            let (s, e) = (s.clamp(0, d - 1), e.clamp(-1, d - 1));
            (s, if s > e { (s - e - step - 1) / -step } else { 0 })
        };
        out[axis] = AxisRange {
            start: s as u64,
            step: step as i64,
            len: len as u64,
        };
    }
    Ok(out)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn s(d: &[u64]) -> Shape {
        Shape(d.to_vec())
    }

    #[test]
    fn reshape_rules() {
        let r = |x: &[u64], t: &[i64]| infer_reshape(&s(x), t, false);
        assert_eq!(r(&[2, 3, 4], &[0, -1]).unwrap(), s(&[2, 12]));
        assert_eq!(r(&[2, 3, 4], &[4, 6]).unwrap(), s(&[4, 6]));
        assert!(r(&[2, 3], &[-1, -1]).is_err());
        assert!(r(&[2, 3], &[4, 2]).is_err());
        assert!(r(&[2, 3], &[-2, 3]).is_err());
        assert!(r(&[2, 3], &[0, 0, 0]).is_err());
        assert_eq!(r(&[0, 3], &[3, -1]).unwrap(), s(&[3, 0]));
        // allowzero: 0 is a zero extent, so a -1 beside it cannot be inferred.
        assert_eq!(
            infer_reshape(&s(&[0, 3, 4]), &[3, 4, 0], true).unwrap(),
            s(&[3, 4, 0])
        );
        assert!(infer_reshape(&s(&[0, 3]), &[0, -1], true).is_err());
        assert!(infer_reshape(&s(&[2, 3]), &[0, 6], true).is_err());
    }

    #[test]
    fn transpose_concat_gather_split() {
        assert_eq!(
            infer_transpose(&s(&[2, 3, 4]), &[2, 0, 1]).unwrap(),
            s(&[4, 2, 3])
        );
        assert!(infer_transpose(&s(&[2, 3]), &[0, 0]).is_err());
        assert!(infer_transpose(&s(&[2, 3]), &[0]).is_err());
        let rev = Transpose { perm: vec![] };
        assert_eq!(rev.infer(&[&s(&[2, 3, 4])], &[]).unwrap(), s(&[4, 3, 2]));
        assert_eq!(
            infer_concat(&[&s(&[1, 2, 4]), &s(&[1, 3, 4])], 1).unwrap(),
            s(&[1, 5, 4])
        );
        assert_eq!(
            infer_concat(&[&s(&[1, 2, 4]), &s(&[1, 2, 5])], -1).unwrap(),
            s(&[1, 2, 9])
        );
        let e = infer_concat(&[&s(&[1, 2, 4]), &s(&[1, 3, 5])], 1).unwrap_err();
        assert!(e.to_string().contains("1x2x4 vs 1x3x5"), "{e}");
        assert!(infer_concat(&[&s(&[2])], 1).is_err());
        assert!(infer_concat(&[&s(&[2])], -2).is_err());
        assert_eq!(
            infer_gather(&s(&[50, 8]), &s(&[2, 3]), 0).unwrap(),
            s(&[2, 3, 8])
        );
        assert_eq!(
            infer_gather(&s(&[5, 6, 7]), &s(&[2]), -2).unwrap(),
            s(&[5, 2, 7])
        );
        assert_eq!(infer_gather(&s(&[5, 6]), &s(&[]), 1).unwrap(), s(&[5]));
        assert!(infer_gather(&s(&[]), &s(&[2]), 0).is_err());
        assert!(infer_gather(&s(&[4]), &s(&[2]), 1).is_err());
        let part = |sizes: Option<Vec<i64>>, parts, index| SplitPart {
            axis: -1,
            sizes,
            parts,
            index,
        };
        let x = s(&[2, 7]);
        let shapes: Vec<u64> = (0..4)
            .map(|i| part(None, 4, i).infer(&[&x], &[]).unwrap().0[1])
            .collect();
        assert_eq!(shapes, vec![2, 2, 2, 1], "ceil chunks, smaller last");
        assert_eq!(
            part(Some(vec![3, 0, 4]), 3, 2).range(&x).unwrap(),
            (1, 3, 4)
        );
        assert!(
            part(Some(vec![3, 3]), 2, 0).range(&x).is_err(),
            "sum 6 != 7"
        );
        assert!(part(Some(vec![8, -1]), 2, 0).range(&x).is_err());
        assert!(part(None, 2, 2).range(&x).is_err());
        let sh = |start, end| ShapeOf {
            start,
            end,
            dtype: DType::I64,
        };
        assert_eq!(sh(0, None).bounds(3), (0, 3));
        assert_eq!(sh(-1, None).bounds(3), (2, 3));
        assert_eq!(sh(1, Some(-1)).bounds(3), (1, 2));
        assert_eq!(sh(-10, Some(10)).bounds(3), (0, 3));
        assert_eq!(sh(2, Some(1)).bounds(3), (2, 2), "start past end is empty");
    }

    #[test]
    fn slice_rules() {
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
        // Negative steps: 9, 7, 5, 3, 1 (start clamps to dim - 1, end to -1).
        let r = slice_ranges(&s(&[10]), &[-1], &[i64::MAX], &[i64::MIN], &[-2]).unwrap();
        assert_eq!(
            r[0],
            AxisRange {
                start: 9,
                step: -2,
                len: 5
            }
        );
        let r = slice_ranges(&s(&[10]), &[0], &[-2], &[2], &[-3]).unwrap();
        assert_eq!((r[0].start, r[0].len), (8, 2), "8, 5");
        assert_eq!(
            slice_ranges(&s(&[0]), &[0], &[0], &[-1], &[-1]).unwrap()[0].len,
            0
        );
        assert!(slice_ranges(&s(&[10]), &[0], &[0], &[2], &[0]).is_err());
        assert!(slice_ranges(&s(&[10]), &[1], &[0], &[2], &[1]).is_err());
        assert!(slice_ranges(&s(&[10, 2]), &[0, -2], &[0, 0], &[2, 2], &[1, 1]).is_err());
    }
}
