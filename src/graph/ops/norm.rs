//! Reductions over the last axis: softmax, layer norm, RMS norm.

use super::{all_f32, DTypeError, InferError, OpDef};
use crate::graph::reference::{RefError, RefTensor, Values};
use crate::shape::{DType, Shape};

/// Softmax over the last axis, numerically stable (max subtracted). Inputs: x (f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Softmax;

/// Layer normalisation over the last axis with scale and shift. Inputs: x `[..., D]`,
/// gamma `[D]`, beta `[D]` (f32).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerNorm {
    /// Added to the variance.
    pub eps: f32,
}

/// RMS normalisation over the last axis with scale. Inputs: x `[..., D]`, gamma `[D]` (f32).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RmsNorm {
    /// Added to the mean square.
    pub eps: f32,
}

/// The rows of the reference: `x` cut into rows of the last dimension (none when it is 0).
fn rows_of<'a>(x: &'a [f32], shape: &Shape) -> impl Iterator<Item = &'a [f32]> {
    let d = shape.dims().last().copied().unwrap_or(1) as usize;
    x.chunks(d.max(1)).filter(move |_| d > 0)
}

impl OpDef for Softmax {
    fn name(&self) -> &'static str {
        "softmax"
    }
    fn arity(&self) -> (usize, usize) {
        (1, 1)
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        all_f32(inputs)
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        if inputs[0].rank() == 0 {
            return Err(InferError::Rank {
                input: 0,
                shape: inputs[0].clone(),
                expected: "rank >= 1 (softmax runs over the last axis)",
            });
        }
        Ok(inputs[0].clone())
    }
    fn preserves_shape(&self) -> bool {
        true
    }
    /// `exp(x - max) / sum` per row, in f64.
    fn reference(&self, inputs: &[&RefTensor], _: &Shape, _: DType) -> Result<Values, RefError> {
        let x = inputs[0].floats("softmax")?;
        let mut out = Vec::with_capacity(x.len());
        for row in rows_of(x, &inputs[0].shape) {
            let max = row
                .iter()
                .fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
            let sum: f64 = row.iter().map(|&v| (f64::from(v) - max).exp()).sum();
            out.extend(
                row.iter()
                    .map(|&v| ((f64::from(v) - max).exp() / sum) as f32),
            );
        }
        Ok(Values::F32(out))
    }
}

impl OpDef for LayerNorm {
    fn name(&self) -> &'static str {
        "layer_norm"
    }
    fn arity(&self) -> (usize, usize) {
        (3, 3)
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        all_f32(inputs)
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        infer_norm(inputs)
    }
    fn preserves_shape(&self) -> bool {
        true
    }
    /// Biased variance, in f64.
    fn reference(&self, inputs: &[&RefTensor], _: &Shape, _: DType) -> Result<Values, RefError> {
        let x = inputs[0].floats("layer_norm")?;
        let gamma = inputs[1].floats("layer_norm")?;
        let beta = inputs[2].floats("layer_norm")?;
        let mut out = Vec::with_capacity(x.len());
        for row in rows_of(x, &inputs[0].shape) {
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
        infer_norm(inputs)
    }
    fn preserves_shape(&self) -> bool {
        true
    }
    /// In f64.
    fn reference(&self, inputs: &[&RefTensor], _: &Shape, _: DType) -> Result<Values, RefError> {
        let x = inputs[0].floats("rms_norm")?;
        let gamma = inputs[1].floats("rms_norm")?;
        let mut out = Vec::with_capacity(x.len());
        for row in rows_of(x, &inputs[0].shape) {
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

/// Shape rule of layer norm (`x, gamma, beta`) and RMS norm (`x, gamma`): the output has x's
/// shape; every parameter must be `[D]` with `D` the last dimension of x.
///
/// # Errors
/// [`InferError::Rank`] for a scalar x, [`InferError::Mismatch`] for a parameter of the wrong
/// shape.
pub fn infer_norm(inputs: &[&Shape]) -> Result<Shape, InferError> {
    let x = inputs[0];
    let Some(&d) = x.0.last() else {
        return Err(InferError::Rank {
            input: 0,
            shape: x.clone(),
            expected: "rank >= 1 (normalisation runs over the last axis)",
        });
    };
    for p in &inputs[1..] {
        if p.0 != [d] {
            return Err(InferError::Mismatch {
                what: "norm parameter must be [D] with D the last dimension of x",
                left: x.clone(),
                right: (*p).clone(),
            });
        }
    }
    Ok(x.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(d: &[u64]) -> Shape {
        Shape(d.to_vec())
    }

    #[test]
    fn norm_parameters_must_match_last_dim() {
        assert_eq!(
            infer_norm(&[&s(&[2, 8]), &s(&[8]), &s(&[8])]).unwrap(),
            s(&[2, 8])
        );
        let e = infer_norm(&[&s(&[2, 8]), &s(&[4])]).unwrap_err();
        assert!(e.to_string().contains("2x8 vs 4"), "{e}");
        assert!(infer_norm(&[&s(&[]), &s(&[1])]).is_err());
        assert!(Softmax.infer(&[&s(&[])], &[]).is_err());
    }
}
