//! Normalisations over one axis or the trailing axes: softmax and log-softmax on any axis,
//! layer norm and RMS norm over the dimensions from `axis` on.

use super::{all_f32, axis_index, DTypeError, InferError, OpDef};
use crate::graph::reference::{index, RefError, RefTensor, Values};
use crate::shape::{DType, Shape};

/// Softmax (or log-softmax) along one axis, numerically stable (max subtracted): ONNX opset
/// 13 `Softmax` / `LogSoftmax`. Inputs: x (f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Softmax {
    /// The axis (negative counts from the end).
    pub axis: i64,
    /// `x - max - log(sum(exp(x - max)))` instead of the probabilities.
    pub log: bool,
}

impl Softmax {
    /// Softmax over the last axis.
    pub const LAST: Softmax = Softmax {
        axis: -1,
        log: false,
    };
}

/// Layer normalisation over the dimensions from `axis` on, with scale and optional shift
/// (ONNX `LayerNormalization`; the builder's is `axis = -1`). Inputs: x, gamma, optional
/// beta (f32), each parameter of `prod(x.dims[axis..])` elements laid out as x's trailing
/// dimensions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerNorm {
    /// Added to the variance.
    pub eps: f32,
    /// First normalised dimension (negative counts from the end).
    pub axis: i64,
}

/// RMS normalisation over the dimensions from `axis` on, with scale (ONNX opset 23
/// `RMSNormalization`; the builder's is `axis = -1`). Inputs: x, gamma (f32), gamma laid out
/// as x's trailing dimensions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RmsNorm {
    /// Added to the mean square.
    pub eps: f32,
    /// First normalised dimension (negative counts from the end).
    pub axis: i64,
}

/// The rows of the normalisations: `x` cut into runs of `d` (none when `d` is 0).
fn rows_of(x: &[f32], d: usize) -> impl Iterator<Item = &[f32]> {
    x.chunks(d.max(1)).filter(move |_| d > 0)
}

impl OpDef for Softmax {
    fn name(&self) -> &'static str {
        if self.log {
            "log_softmax"
        } else {
            "softmax"
        }
    }
    fn arity(&self) -> (usize, usize) {
        (1, 1)
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        all_f32(inputs)
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        axis_index(self.axis, inputs[0].rank())?;
        Ok(inputs[0].clone())
    }
    fn preserves_shape(&self) -> bool {
        true
    }
    /// Per line along the axis (positions found with the reference's index helpers):
    /// `exp(x - max) / sum`, or its log, in f64.
    fn reference(&self, inputs: &[&RefTensor], out: &Shape, _: DType) -> Result<Values, RefError> {
        let x = inputs[0].floats(self.name())?;
        let Ok(axis) = axis_index(self.axis, out.rank()) else {
            return Ok(Values::F32(Vec::new()));
        };
        let d = out.dims()[axis];
        let mut heads = out.clone();
        heads.0[axis] = 1;
        let mut v = vec![0f32; x.len()];
        let mut at = vec![0u64; out.rank()];
        index::for_each(&heads, |_, idx| {
            at.copy_from_slice(idx);
            let line: Vec<usize> = (0..d)
                .map(|j| {
                    at[axis] = j;
                    index::linear(&at, out)
                })
                .collect();
            let max = line
                .iter()
                .fold(f64::NEG_INFINITY, |m, &i| m.max(f64::from(x[i])));
            let sum: f64 = line.iter().map(|&i| (f64::from(x[i]) - max).exp()).sum();
            for &i in &line {
                let c = f64::from(x[i]) - max;
                v[i] = if self.log {
                    (c - sum.ln()) as f32
                } else {
                    (c.exp() / sum) as f32
                };
            }
        });
        Ok(Values::F32(v))
    }
}

impl OpDef for LayerNorm {
    fn name(&self) -> &'static str {
        "layer_norm"
    }
    fn arity(&self) -> (usize, usize) {
        (2, 3)
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        all_f32(inputs)
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        infer_norm(inputs, self.axis).map(|(s, _)| s)
    }
    fn preserves_shape(&self) -> bool {
        true
    }
    /// Biased variance, in f64; no beta is a zero shift.
    fn reference(&self, inputs: &[&RefTensor], _: &Shape, _: DType) -> Result<Values, RefError> {
        let x = inputs[0].floats("layer_norm")?;
        let gamma = inputs[1].floats("layer_norm")?;
        let zeros = vec![0f32; gamma.len()];
        let beta = match inputs.get(2) {
            Some(b) => b.floats("layer_norm")?,
            None => &zeros,
        };
        let shapes: Vec<&Shape> = inputs.iter().map(|t| &t.shape).collect();
        let d = infer_norm(&shapes, self.axis).map_or(0, |(_, d)| d);
        let mut out = Vec::with_capacity(x.len());
        for row in rows_of(x, d) {
            let d = row.len() as f64;
            let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / d;
            let var = row
                .iter()
                .map(|&v| (f64::from(v) - mean).powi(2))
                .sum::<f64>()
                / d;
            let inv = 1.0 / (var + f64::from(self.eps)).sqrt();
            out.extend(row.iter().enumerate().map(|(i, &v)| {
                ((f64::from(v) - mean) * inv * f64::from(gamma[i]) + f64::from(beta[i])) as f32
            }));
        }
        Ok(Values::F32(out))
    }
}

impl OpDef for RmsNorm {
    fn name(&self) -> &'static str {
        "rms_norm"
    }
    fn arity(&self) -> (usize, usize) {
        (2, 2)
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        all_f32(inputs)
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        infer_norm(inputs, self.axis).map(|(s, _)| s)
    }
    fn preserves_shape(&self) -> bool {
        true
    }
    /// In f64.
    fn reference(&self, inputs: &[&RefTensor], _: &Shape, _: DType) -> Result<Values, RefError> {
        let x = inputs[0].floats("rms_norm")?;
        let gamma = inputs[1].floats("rms_norm")?;
        let shapes: Vec<&Shape> = inputs.iter().map(|t| &t.shape).collect();
        let d = infer_norm(&shapes, self.axis).map_or(0, |(_, d)| d);
        let mut out = Vec::with_capacity(x.len());
        for row in rows_of(x, d) {
            let ms = row.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / row.len() as f64;
            let inv = 1.0 / (ms + f64::from(self.eps)).sqrt();
            out.extend(
                row.iter()
                    .enumerate()
                    .map(|(i, &v)| (f64::from(v) * inv * f64::from(gamma[i])) as f32),
            );
        }
        Ok(Values::F32(out))
    }
}

/// Shape rule of layer norm (`x, gamma[, beta]`) and RMS norm (`x, gamma`) over the
/// dimensions from `axis` on: the output has x's shape; every parameter has `d =
/// prod(x.dims[axis..])` elements and its dimensions are x's last ones (so `[D]` fits any
/// axis whose normalised dimensions are `[1, ..., D]`). Returns the shape and `d`.
///
/// # Errors
/// [`InferError::Axis`] for an axis out of range (a scalar x has none),
/// [`InferError::Mismatch`] for a parameter of the wrong shape.
pub fn infer_norm(inputs: &[&Shape], axis: i64) -> Result<(Shape, usize), InferError> {
    let x = inputs[0];
    let a = axis_index(axis, x.rank())?;
    let d: u64 = x.0[a..].iter().product();
    for p in &inputs[1..] {
        let fits = p.rank() <= x.rank() - a
            && p.0 == x.0[x.rank() - p.rank()..]
            && p.checked_num_elements() == Some(d);
        if !fits {
            return Err(InferError::Mismatch {
                what: "norm parameter must have the shape of x's normalised dimensions",
                left: x.clone(),
                right: (*p).clone(),
            });
        }
    }
    Ok((x.clone(), d as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(d: &[u64]) -> Shape {
        Shape(d.to_vec())
    }

    #[test]
    fn norm_parameters_must_match_the_normalised_dims() {
        let n = |shapes: &[&Shape], axis| infer_norm(shapes, axis);
        assert_eq!(
            n(&[&s(&[2, 8]), &s(&[8]), &s(&[8])], -1).unwrap(),
            (s(&[2, 8]), 8)
        );
        let e = n(&[&s(&[2, 8]), &s(&[4])], -1).unwrap_err();
        assert!(e.to_string().contains("2x8 vs 4"), "{e}");
        assert!(n(&[&s(&[]), &s(&[1])], -1).is_err());
        assert_eq!(n(&[&s(&[2, 3, 4]), &s(&[3, 4])], 1).unwrap().1, 12);
        assert_eq!(n(&[&s(&[2, 1, 4]), &s(&[4])], 1).unwrap().1, 4);
        assert!(n(&[&s(&[2, 3, 4]), &s(&[4])], 1).is_err());
        assert!(n(&[&s(&[2, 3, 4]), &s(&[12])], 1).is_err());
        assert_eq!(n(&[&s(&[2, 3]), &s(&[2, 3])], 0).unwrap().1, 6);
        assert!(Softmax::LAST.infer(&[&s(&[])], &[]).is_err());
        let sm = Softmax { axis: 1, log: true };
        assert_eq!(sm.infer(&[&s(&[2, 3, 4])], &[]).unwrap(), s(&[2, 3, 4]));
        assert!(sm.infer(&[&s(&[2])], &[]).is_err());
    }
}
