//! Slices: static parameters ([`Slice`]) or fed ones ([`SliceTo`]), both resolved to
//! per-axis ranges by [`slice_ranges`].

use super::shape_vector;
use crate::graph::ops::{axes_indices, same_plain_type, DTypeError, InferError, OpDef};
use crate::graph::reference::{index, RefError, RefTensor, Values};
use crate::graph::shape_data;
use crate::shape::{DType, Shape};

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
