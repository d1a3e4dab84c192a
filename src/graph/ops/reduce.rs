//! Reductions over any set of axes (ONNX `ReduceSum` / `ReduceMean` / `ReduceMax` /
//! `ReduceMin`, `GlobalAveragePool`, and the inverse standard deviation a layer norm reports)
//! and the cumulative sum along an axis.

use super::{axes_indices, axis_index, checked, DTypeError, InferError, OpDef};
use crate::graph::reference::{index, wrap, RefError, RefTensor, Values};
use crate::graph::shape_data;
use crate::shape::{DType, Shape};

/// What a [`Reduce`] computes over its axes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ReduceKind {
    /// Sum (0 over nothing).
    Sum,
    /// Arithmetic mean (NaN over nothing).
    Mean,
    /// Maximum (-inf over nothing, or the type's minimum for integers).
    Max,
    /// Minimum (+inf over nothing, or the type's maximum for integers).
    Min,
    /// `1 / sqrt(biased variance + eps)`: what ONNX `LayerNormalization` reports as its third
    /// output.
    InvStdDev {
        /// Added to the variance.
        eps: f32,
    },
}

impl ReduceKind {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            ReduceKind::Sum => "reduce_sum",
            ReduceKind::Mean => "reduce_mean",
            ReduceKind::Max => "reduce_max",
            ReduceKind::Min => "reduce_min",
            ReduceKind::InvStdDev { .. } => "reduce_inv_std_dev",
        }
    }

    /// The code the WGSL kernel switches on (`shaders/reduce.wgsl`, override `REDUCE_OP`).
    pub fn code(self) -> u32 {
        match self {
            ReduceKind::Sum => 0,
            ReduceKind::Mean => 1,
            ReduceKind::Max => 2,
            ReduceKind::Min => 3,
            ReduceKind::InvStdDev { .. } => 4,
        }
    }
}

/// Which axes a [`Reduce`] runs over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReduceAxes {
    /// Every axis (ONNX's default when no axes are given).
    All,
    /// These axes (negative count from the end; none listed reduces nothing: the importer maps
    /// ONNX's `noop_with_empty_axes` to an identity before it gets here).
    List(Vec<i64>),
    /// Every axis from this one to the last (global pooling: `From(2)`; a layer norm's
    /// statistics: `From(axis)`).
    From(i64),
    /// The axes held in the op's second input, a 1-D integer tensor known on the host (ONNX
    /// opset 18's `axes` input, fed or computed); the kernel reads them from its buffer. None
    /// listed reduces every axis, or nothing with `noop_with_empty_axes`.
    Input {
        /// An empty list means no reduction (the output is the input).
        noop_with_empty_axes: bool,
    },
}

/// A reduction over `axes`, keeping them as dimensions of 1 when `keepdims`. Inputs: x (f32;
/// i32 and i64 too for sum, max and min of shape data on the host), and the axes tensor for
/// [`ReduceAxes::Input`].
#[derive(Debug, Clone, PartialEq)]
pub struct Reduce {
    /// What is computed.
    pub kind: ReduceKind,
    /// Over which axes.
    pub axes: ReduceAxes,
    /// Keep reduced axes as dimensions of 1.
    pub keepdims: bool,
}

/// Cumulative sum along `axis` (ONNX `CumSum`; the axis comes from its constant second input
/// in the importer): `exclusive` leaves out the element itself, `reverse` sums from the end.
/// Inputs: x (f32, i32 or i64).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CumSum {
    /// The axis (negative counts from the end).
    pub axis: i64,
    /// Sum of the elements before (after, when reversed) each one, without it.
    pub exclusive: bool,
    /// Sum from the last element backwards.
    pub reverse: bool,
}

impl Reduce {
    /// The reduced axes of `x` (sorted, each once); `axes` holds the second input's values
    /// for [`ReduceAxes::Input`].
    ///
    /// # Errors
    /// [`InferError::Axes`] for axes out of range or repeated; [`InferError::MissingShapeData`]
    /// when the axes input's values are not known.
    pub fn axes_of(&self, x: &Shape, axes: Option<&[i64]>) -> Result<Vec<usize>, InferError> {
        let rank = x.rank();
        let mut axes = match &self.axes {
            ReduceAxes::All => (0..rank).collect(),
            ReduceAxes::List(a) => axes_indices(a, x, rank)?,
            ReduceAxes::From(a) => {
                let r = rank as i64;
                let from = if *a < 0 { a + r } else { *a };
                if !(0..=r).contains(&from) {
                    return Err(InferError::Axis { axis: *a, rank });
                }
                (from as usize..rank).collect()
            }
            ReduceAxes::Input {
                noop_with_empty_axes,
            } => match axes.ok_or(InferError::MissingShapeData { input: 1 })? {
                [] if *noop_with_empty_axes => Vec::new(),
                [] => (0..rank).collect(),
                a => axes_indices(a, x, rank)?,
            },
        };
        axes.sort_unstable();
        Ok(axes)
    }
}

impl OpDef for Reduce {
    fn name(&self) -> &'static str {
        self.kind.name()
    }
    fn arity(&self) -> (usize, usize) {
        match self.axes {
            ReduceAxes::Input { .. } => (2, 2),
            _ => (1, 1),
        }
    }
    fn shape_data_inputs(&self) -> &'static [usize] {
        match self.axes {
            ReduceAxes::Input { .. } => &[1],
            _ => &[],
        }
    }
    fn reads_input(&self, _: usize) -> bool {
        true
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        if inputs.len() > 1 && !matches!(inputs[1], DType::I32 | DType::I64) {
            return Err(DTypeError::at(1, "i32 or i64 (axes)"));
        }
        let int_ok = matches!(
            self.kind,
            ReduceKind::Sum | ReduceKind::Max | ReduceKind::Min
        );
        match inputs[0] {
            DType::F32 => Ok(DType::F32),
            DType::I32 | DType::I64 if int_ok => Ok(inputs[0]),
            _ if int_ok => Err(DTypeError::at(0, "f32, i32 or i64")),
            _ => Err(DTypeError::at(0, "f32")),
        }
    }
    fn infer(&self, inputs: &[&Shape], data: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        let x = inputs[0];
        let axes = self.axes_of(x, data.get(1).copied().flatten())?;
        let out = x
            .dims()
            .iter()
            .enumerate()
            .filter_map(|(i, &d)| match (axes.contains(&i), self.keepdims) {
                (false, _) => Some(d),
                (true, true) => Some(1),
                (true, false) => None,
            })
            .collect();
        checked(Shape(out))
    }
    /// Every input element added into its output element (f64 for floats), then the kind's
    /// finish; the inverse standard deviation takes a second pass for the variance.
    fn reference(
        &self,
        inputs: &[&RefTensor],
        out: &Shape,
        dtype: DType,
    ) -> Result<Values, RefError> {
        let x = inputs[0];
        let listed = match inputs.get(1) {
            Some(t) => Some(t.ints(self.kind.name())?),
            None => None,
        };
        let Ok(axes) = self.axes_of(&x.shape, listed) else {
            return Ok(Values::F32(Vec::new()));
        };
        // The output in keepdims form: where each input element lands.
        let kept = Shape(
            x.shape
                .dims()
                .iter()
                .enumerate()
                .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
                .collect(),
        );
        let n = out.checked_num_elements().unwrap_or(0) as usize;
        let mut dest = Vec::new();
        index::for_each(&x.shape, |_, idx| {
            let o: Vec<u64> = idx
                .iter()
                .enumerate()
                .map(|(i, &v)| if axes.contains(&i) { 0 } else { v })
                .collect();
            dest.push(index::linear(&o, &kept));
        });
        let mut count = vec![0u64; n];
        for &o in &dest {
            count[o] += 1;
        }
        Ok(match &x.values {
            Values::F32(v) => {
                let init = match self.kind {
                    ReduceKind::Max => f64::NEG_INFINITY,
                    ReduceKind::Min => f64::INFINITY,
                    _ => 0.0,
                };
                let mut acc = vec![init; n];
                for (&o, &val) in dest.iter().zip(v) {
                    let val = f64::from(val);
                    acc[o] = match self.kind {
                        ReduceKind::Max => acc[o].max(val),
                        ReduceKind::Min => acc[o].min(val),
                        _ => acc[o] + val,
                    };
                }
                if let ReduceKind::InvStdDev { eps } = self.kind {
                    let mean: Vec<f64> =
                        acc.iter().zip(&count).map(|(s, &c)| s / c as f64).collect();
                    let mut var = vec![0f64; n];
                    for (&o, &val) in dest.iter().zip(v) {
                        var[o] += (f64::from(val) - mean[o]).powi(2);
                    }
                    for ((a, s), &c) in acc.iter_mut().zip(&var).zip(&count) {
                        *a = 1.0 / (s / c as f64 + f64::from(eps)).sqrt();
                    }
                } else if self.kind == ReduceKind::Mean {
                    for (a, &c) in acc.iter_mut().zip(&count) {
                        *a /= c as f64;
                    }
                }
                Values::F32(acc.into_iter().map(|a| a as f32).collect())
            }
            Values::Int(v) => {
                let (lo, hi) = int_bounds(dtype);
                let init = match self.kind {
                    ReduceKind::Max => lo,
                    ReduceKind::Min => hi,
                    _ => 0,
                };
                let mut acc = vec![init; n];
                for (&o, &val) in dest.iter().zip(v) {
                    acc[o] = match self.kind {
                        ReduceKind::Max => acc[o].max(val),
                        ReduceKind::Min => acc[o].min(val),
                        _ => wrap(dtype, acc[o].wrapping_add(val)),
                    };
                }
                Values::Int(acc)
            }
        })
    }
    fn host_evaluable(&self) -> bool {
        matches!(
            self.kind,
            ReduceKind::Sum | ReduceKind::Max | ReduceKind::Min
        )
    }
    fn host_value(&self, shapes: &[&Shape], values: &[&[i64]], out: &Shape) -> Option<Vec<i64>> {
        let axes = self.axes_of(shapes[0], values.get(1).copied()).ok()?;
        // An empty maximum or minimum has no host value (the type's bound is the reference's).
        let empty = (self.kind == ReduceKind::Sum).then_some(0);
        shape_data::reduce(values[0], shapes[0], &axes, out, empty, |a, v| {
            match self.kind {
                ReduceKind::Max => a.max(v),
                ReduceKind::Min => a.min(v),
                _ => a.wrapping_add(v),
            }
        })
    }
}

/// The smallest and largest values of an integer type.
fn int_bounds(dtype: DType) -> (i64, i64) {
    match dtype {
        DType::I32 => (i64::from(i32::MIN), i64::from(i32::MAX)),
        DType::U32 => (0, i64::from(u32::MAX)),
        DType::I8 => (i64::from(i8::MIN), i64::from(i8::MAX)),
        DType::U8 | DType::Bool => (0, 255),
        _ => (i64::MIN, i64::MAX),
    }
}

impl OpDef for CumSum {
    fn name(&self) -> &'static str {
        "cumsum"
    }
    fn arity(&self) -> (usize, usize) {
        (1, 1)
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        match inputs[0] {
            DType::F32 | DType::I32 | DType::I64 => Ok(inputs[0]),
            _ => Err(DTypeError::at(0, "f32, i32 or i64")),
        }
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        axis_index(self.axis, inputs[0].rank())?;
        Ok(inputs[0].clone())
    }
    fn preserves_shape(&self) -> bool {
        true
    }
    /// For each element, the sum over the positions before (or after, reversed) it along the
    /// axis, itself included unless exclusive; floats in f64.
    fn reference(
        &self,
        inputs: &[&RefTensor],
        out: &Shape,
        dtype: DType,
    ) -> Result<Values, RefError> {
        let x = inputs[0];
        let Ok(axis) = axis_index(self.axis, out.rank()) else {
            return Ok(Values::F32(Vec::new()));
        };
        let d = out.dims()[axis];
        let mut sources: Vec<Vec<usize>> = Vec::new();
        let mut src = vec![0u64; out.rank()];
        index::for_each(out, |_, idx| {
            let i = idx[axis];
            let take = |j: u64| {
                if self.reverse {
                    j > i || (j == i && !self.exclusive)
                } else {
                    j < i || (j == i && !self.exclusive)
                }
            };
            src.copy_from_slice(idx);
            sources.push(
                (0..d)
                    .filter(|&j| take(j))
                    .map(|j| {
                        src[axis] = j;
                        index::linear(&src, out)
                    })
                    .collect(),
            );
        });
        Ok(match &x.values {
            Values::F32(v) => Values::F32(
                sources
                    .iter()
                    .map(|s| s.iter().map(|&j| f64::from(v[j])).sum::<f64>() as f32)
                    .collect(),
            ),
            Values::Int(v) => Values::Int(
                sources
                    .iter()
                    .map(|s| wrap(dtype, s.iter().fold(0i64, |a, &j| a.wrapping_add(v[j]))))
                    .collect(),
            ),
        })
    }
    fn host_evaluable(&self) -> bool {
        true
    }
    fn host_value(&self, shapes: &[&Shape], values: &[&[i64]], _: &Shape) -> Option<Vec<i64>> {
        let axis = axis_index(self.axis, shapes[0].rank()).ok()?;
        shape_data::cumsum(values[0], shapes[0], axis, self.exclusive, self.reverse)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(d: &[u64]) -> Shape {
        Shape(d.to_vec())
    }

    #[test]
    fn reduce_shapes() {
        let r = |axes, keepdims| Reduce {
            kind: ReduceKind::Sum,
            axes,
            keepdims,
        };
        let x = s(&[2, 3, 4]);
        let infer = |op: Reduce| op.infer(&[&x], &[]);
        assert_eq!(infer(r(ReduceAxes::All, true)).unwrap(), s(&[1, 1, 1]));
        assert_eq!(infer(r(ReduceAxes::All, false)).unwrap(), s(&[]));
        assert_eq!(
            infer(r(ReduceAxes::List(vec![-1, 0]), false)).unwrap(),
            s(&[3])
        );
        assert_eq!(
            infer(r(ReduceAxes::List(vec![1]), true)).unwrap(),
            s(&[2, 1, 4])
        );
        assert_eq!(infer(r(ReduceAxes::From(1), true)).unwrap(), s(&[2, 1, 1]));
        assert_eq!(infer(r(ReduceAxes::From(3), true)).unwrap(), x, "nothing");
        assert!(infer(r(ReduceAxes::List(vec![3]), true)).is_err());
        assert!(infer(r(ReduceAxes::List(vec![1, -2]), true)).is_err());
        assert!(infer(r(ReduceAxes::From(4), true)).is_err());
        let fed = |noop| {
            r(
                ReduceAxes::Input {
                    noop_with_empty_axes: noop,
                },
                false,
            )
        };
        let with = |op: Reduce, axes: &[i64]| {
            op.infer(&[&x, &s(&[axes.len() as u64])], &[None, Some(axes)])
        };
        assert_eq!(with(fed(false), &[-2]).unwrap(), s(&[2, 4]));
        assert_eq!(
            with(fed(false), &[]).unwrap(),
            s(&[]),
            "none listed: every axis"
        );
        assert_eq!(with(fed(true), &[]).unwrap(), x, "noop");
        assert!(matches!(
            fed(false).infer(&[&x, &s(&[1])], &[None, None]),
            Err(InferError::MissingShapeData { input: 1 })
        ));
        let mean = Reduce {
            kind: ReduceKind::Mean,
            axes: ReduceAxes::All,
            keepdims: true,
        };
        assert!(mean.output_dtype(&[DType::I64]).is_err());
        assert_eq!(
            r(ReduceAxes::All, true).output_dtype(&[DType::I64]),
            Ok(DType::I64)
        );
    }
}
